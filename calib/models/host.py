"""The host (CPU launch) model: what one kernel launch costs the host thread, and what a host sync adds.

Parameters (seconds):
- `launch_s`: host time per kernel launch (compute kernels, collectives, sends/receives alike):
  everything eager PyTorch and megatron-core do on the Python/autograd thread per kernel;
- `sync_s`: host time between a sync point's GPU work ending and the next launch (the device-to-
  host copy returning and the Python work before the next kernel), at the sync points of
  calib.workload.host.SYNC_AFTER other than its scalar reads (READ_SYNCS: waited for at no cost),
  one per MoE routing (its copies are waited for together: GROUPED_SYNCS);
- `expert_loop_launches` (configured, not fitted: calib.workload.host.EXPERT_LOOP_LAUNCHES): the launches of host
  time each forward launch of the MoE expert loop costs in a generated step; recorded with the costs fitted with it;
- `p2p_sync_s`: the same after a pipeline send/recv batch (megatron-core's batch_p2p_sync drains
  the device; the schedule's work between micro-batches follows before the next launch). Fitted
  on the pipeline-parallel runs only; a calibration without it uses `sync_s`.
- `pace_per_path`: the factor every one of them grows by per unit of the run's parallel code path,
  `path_exponent(tp, pp, ep)` (`PATH_WEIGHTS`: what pipeline and expert parallelism add to each
  launch's Python and autograd work; data and tensor parallelism add none, TP's own cost being the TP
  rendezvous below); the costs are kept at the one-GPU path (`HostModel.on_path(tp, pp, ep)` gives a
  run's, no further than the largest fitted path, `fitted_paths`). Fitted only where the runs took
  more than one path.
- `tp_rendezvous_s`: what a blocking collective of the TP group keeps the compute stream beyond its
  transfer (calib.workload.host, "the TP rendezvous"; not scaled by the pace), fitted on the runs with TP.
- `own_launch_ref_s`: the trainer's own launch pace (measure/own_pace.py: seconds per tiny launch, timed
  in the trainer's main thread after every measured step) at which the costs above hold: the median
  over the fitted runs that timed it. A run whose trainer timed its own pace has its launch and sync
  costs (not the TP rendezvous) scaled by `own_pace_factor`: its pace over this one. None: no fitted run
  timed it (no scaling). Projections are at this pace unless given another.
- `profiled_pace`: the own launch pace expected of a run from its profiled step's span per node
  (calib.models.profiled_pace), fitted over the timed runs; a run that did not time its pace is fitted and
  predicted at the pace it gives (`run_own_launch`). None: too few timed runs (such runs at the reference).
The generator (calib.workload.generate with `host=`) puts them into the ET as ASTRA-sim CPU ops.

Fit (`fit_host`): for every training bundle, the generated step of its configuration (kernel
times from the calibration's kernel model, network from its network fit, on the bundle's host
preset) is simulated for trial costs on a grid shared by all runs (`Curves`). The step never
decreases with a cost, so it is interpolated between simulated costs, and the cost chosen is the
one minimising the mean absolute percent error (MAPE) of the simulated against the measured steps
over all runs, refined where a lower bound of the MAPE says it could still improve. A run that is
already over-predicted at zero cost (GPU-bound) then constrains the cost only from where the cost
starts to lengthen its step; the median of per-run roots would count it as wanting 0. No cost is
chosen above what a fitted run's host can have spent: a rank that launched n kernels within a
measured step of T seconds spent at most T / n per launch (`_Run.cap`, T the slowest run of the
configuration: the costs stand for every host its runs came from; the same for each sync cost).
Without that bound the MAPE's two near-equal minima (~46 and ~60 us of launch on the H200 runs) let
the fit jump to the upper one, which the host-bound runs rule out, when one of them is held out. `launch_s` is
fitted at `sync_s` = 0, then `sync_s` at that launch cost (runs with device-to-host sync points),
then `p2p_sync_s` at both (runs with pipeline send/recv syncs), then the pace (`_PaceSearch`), then
all once more (three rounds with a pace), and last the TP rendezvous over the runs with TP (`best_rendezvous`:
each run's step at 0 and at RENDEZVOUS_TRIAL_S, linear between; calib.workload.host has what it is). While fitting, the costs are those of the code path most
runs took and the pace moves the others (the MAPE's valley lies along a constant cost there). Each run's root (the cost at which its own step equals the measured one) is kept in `runs`:
informative, not what the fit uses. A run that timed its own pace is fitted in the reference pace's costs:
its step is simulated at each trial cost times its `own_pace_factor` and its caps divided by it (docs/host.md,
"The trainer's own pace, as a factor on the host costs"). The error is leave-one-configuration-out: each configuration
(RunSpec.key(), telemetry twins together) is simulated at the costs minimising the MAPE over the
other configurations, found on the same simulated grid (no new simulation but the held-out step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calib.errors import CalibError
from calib.models.common import error_stat
from calib.models.profiled_pace import MIN_HOST_EXPOSURE as PROFILED_PACE_MIN_EXPOSURE
from calib.models.profiled_pace import MIN_RUNS as PROFILED_PACE_MIN_RUNS
from calib.models.profiled_pace import ProfiledPace, config_exposures, fit_profiled_pace, own_launch_of
from calib.workload.host import EXPERT_LOOP_LAUNCHES, SYNC_AFTER

LAUNCH_MAX_S = 1e-3  # search bracket: no eager launch costs a millisecond
SYNC_MAX_S = 50e-3
ROUNDS = 2  # alternations of the launch and sync fits
REL_TOL = 0.002  # root search: stop when the simulated step is within 0.2 % of the measured one
GRID_FIRST = 1 / 64  # the coarse grid: 0, then hi/64, hi/32, ... (LAUNCH_MAX_S/64 = 15.6 us)
PACE_MAX = 2.0  # search bracket for pace_per_path - 1: a host three times slower per unit of path is not seen
PACE_GRID = 9  # paces tried between the bounds (evenly in log), then
PACE_REFINE = 6  # golden-section steps around the best
REFINE = 12  # at most this many refinements per fit, each simulating every run at one more cost
F_TOL = 0.02  # percentage points of MAPE: a cost that could gain less is not simulated
DENSE = 4001  # costs at which the bound is evaluated, over [0, top]
SAME = 2.0**-14  # costs closer than this fraction of the bracket are one (61 ns of launch, 3 us of sync)
# What each parallel dimension adds to the host's work per launch, as exponents of the fitted pace
# (a dimension counts once when its degree is over 1: the code path is taken or not; the committed
# EP 4 runs needed about the cost per launch of the EP 2 ones). PP's and EP's taken from
# measure/probes/host_phases.py, not fitted: the backward's host per launch on two H200s against a
# data-parallel run of the same lease, rounds 3-4 (docs/host.md, "Host time per phase"): PP 2 (first
# stage) 1.61x, EP 2 1.79-2.02x, DP 2 as on one GPU; their log2 in units of TP's 1.26-1.55x, rounded:
# 1.42, 1.91. Rounds 6-7 counted the driver API's launches too and found smaller ratios (TP 1.11x,
# PP 1.02x, EP 1.09-1.43x); PP's weight taken down to match fitted the measured steps worse, so these
# stand (docs/host.md, "Code-path ratios counted in full"). TP's weight was 1 until the TP rendezvous
# (fitted per blocking TP collective) took up what TP adds: one pace then had to serve TP and EP, which
# pull it apart (the Mixtral runs with TP and sequence parallelism want less host time per launch than
# one GPU, those with EP more), and sat at its floor of 1; at 0 the H200's host fit is 4.94 -> 4.48 %
# held out (docs/host.md, "Tensor parallelism adds no pace"; benchmarks/host_path_weights.py).
PATH_WEIGHTS = {"tp": 0.0, "pp": 1.5, "ep": 2.0}
# The TP rendezvous (calib.workload.host) is fitted last, on the runs with TP, from each run's step at
# 0 and at this trial value: their difference over it is how much of a rendezvous the run's step shows
# (the blocking collectives on its critical path; under host slack, none), and the step is taken as
# linear in it, which the MAPE then has as a convex piecewise-linear function. The probe's steady
# state is 10-17 us a call and the errors' first-order sizing 50-80 us (docs/host.md, "The TP rendezvous").
# A host cost over the trainer's own launch pace, log against log: the per-run launch roots of the H200's
# host-paced runs of three leases follow their own pace with slopes 0.66-0.84 per configuration (r 0.88-0.93),
# 0.80-1.09 regressed the other way round; 0.75 fits no better than 1 (docs/host.md), so a host cost is taken
# as proportional to the pace.
OWN_PACE_SLOPE = 1.0
RENDEZVOUS_TRIAL_S = 60e-6
RENDEZVOUS_MAX_S = 1e-3


def path_exponent(tp: int, pp: int, ep: int, weights: Mapping[str, float] = PATH_WEIGHTS) -> float:
    """The parallel code path of a run as the exponent of the host pace (`weights`, calib's are
    `PATH_WEIGHTS`; 0: one GPU or DP only)."""
    degrees = {"tp": tp, "pp": pp, "ep": ep}
    return float(sum(w for d, w in weights.items() if int(degrees[d]) > 1))


@dataclass
class HostModel:
    launch_s: float = 0.0
    sync_s: float = 0.0
    replay_launch_s: float | None = None  # per measured kernel, for replays of converted ETs (fit_replay_launch)
    sync_points: dict[str, str] = field(default_factory=lambda: dict(SYNC_AFTER))
    runs: list[dict] = field(default_factory=list)  # per training bundle: id, config, measured_s, launch_s, sync_s
    provenance: dict[str, str] = field(default_factory=dict)
    replay_sync_s: float | None = None  # per sync point, for replays (fit_replay_launch); None: sync_s
    p2p_sync_s: float | None = None  # per pipeline send/recv sync; None: sync_s
    replay_p2p_sync_s: float | None = None  # the same for replays; None: replay_sync
    # Every host cost grows by this factor per unit of the run's code path (path_exponent); the costs
    # above are those of one GPU. None: not fitted (1).
    pace_per_path: float | None = None
    replay_pace_per_path: float | None = None
    fitted_paths: list[float] = field(default_factory=list)  # path exponents of the fitted runs; the pace stops at the most
    # What a blocking collective of the TP group keeps the compute stream beyond its transfer
    # (calib.workload.host: the TP rendezvous); None: not fitted (0). Not scaled by the pace.
    tp_rendezvous_s: float | None = None
    replay_tp_rendezvous_s: float | None = None  # the same for replays (fit_replay_launch)
    # The most micro-batches per step among the runs the rendezvous was fitted on: part of it stands for a
    # once-per-step race (docs/host.md, "The TP rendezvous"), which steps of more micro-batches over-count.
    tp_rendezvous_microbatches: int | None = None
    # The trainer's own launch pace (seconds per tiny launch) the costs hold at; None: no fitted run timed it.
    own_launch_ref_s: float | None = None
    # The own launch pace of a run that did not time it, from its profiled step; None: not fitted (reference pace).
    profiled_pace: ProfiledPace | None = None

    def pace(self, path: float, replay: bool = False) -> float:
        """The factor on every host cost of a run whose code path has exponent `path`, no further than
        the largest fitted path (beyond it nothing was measured)."""
        f = self.replay_pace_per_path if replay else self.pace_per_path
        if f is None or not self.fitted_paths:
            return 1.0
        return path_pace(f, min(max(float(path), 0.0), max(self.fitted_paths)))

    def beyond_fitted(self, tp: int, pp: int, ep: int) -> bool:
        """Whether a run of this parallelism takes a code path past every fitted one (its pace is held there)."""
        fitted = self.pace_per_path is not None and bool(self.fitted_paths)
        return fitted and path_exponent(tp, pp, ep) > max(self.fitted_paths)

    def on_path(self, tp: int, pp: int, ep: int) -> HostModel:
        """The costs a run of this tensor, pipeline and expert parallelism sees (pace applied; the copy has none of its own)."""
        path = path_exponent(tp, pp, ep)
        return self._scaled(self.pace(path), self.pace(path, replay=True), pace_per_path=None,
                            replay_pace_per_path=None)

    def at_own_pace(self, own_launch_s: float | None) -> HostModel:
        """The costs of a host whose trainer timed `own_launch_s` per tiny launch (measure/own_pace.py):
        launch and sync costs, generated and replayed, times own_pace_factor; the TP rendezvous as it is."""
        k = own_pace_factor(own_launch_s, self.own_launch_ref_s)
        return self if k == 1.0 else self._scaled(k, k)

    def _scaled(self, k: float, r: float, **fields: Any) -> HostModel:
        """A copy with the generated launch and sync costs times `k`, the replays' times `r` (the TP
        rendezvous as it is), and `fields` set."""

        def times(x: float | None, by: float) -> float | None:
            return None if x is None else x * by

        return dataclasses.replace(
            self, launch_s=self.launch_s * k, sync_s=self.sync_s * k, p2p_sync_s=times(self.p2p_sync_s, k),
            replay_launch_s=times(self.replay_launch_s, r), replay_sync_s=times(self.replay_sync_s, r),
            replay_p2p_sync_s=times(self.replay_p2p_sync_s, r), **fields)

    @property
    def replay_sync(self) -> float:
        """The sync cost replays use: their own fit where there is one, else the generated fit's."""
        return self.sync_s if self.replay_sync_s is None else self.replay_sync_s

    @property
    def p2p_sync(self) -> float:
        return self.sync_s if self.p2p_sync_s is None else self.p2p_sync_s

    @property
    def replay_p2p_sync(self) -> float:
        return self.replay_sync if self.replay_p2p_sync_s is None else self.replay_p2p_sync_s

    def to_dict(self) -> dict:
        return {
            "launch_s": float(self.launch_s), "sync_s": float(self.sync_s),
            "p2p_sync_s": None if self.p2p_sync_s is None else float(self.p2p_sync_s),
            "replay_launch_s": None if self.replay_launch_s is None else float(self.replay_launch_s),
            "replay_sync_s": None if self.replay_sync_s is None else float(self.replay_sync_s),
            "replay_p2p_sync_s": None if self.replay_p2p_sync_s is None else float(self.replay_p2p_sync_s),
            "pace_per_path": None if self.pace_per_path is None else float(self.pace_per_path),
            "replay_pace_per_path": None if self.replay_pace_per_path is None else float(self.replay_pace_per_path),
            "fitted_paths": [float(g) for g in self.fitted_paths],
            "tp_rendezvous_s": None if self.tp_rendezvous_s is None else float(self.tp_rendezvous_s),
            "replay_tp_rendezvous_s": None if self.replay_tp_rendezvous_s is None else float(self.replay_tp_rendezvous_s),
            "tp_rendezvous_microbatches": self.tp_rendezvous_microbatches,
            "own_launch_ref_s": None if self.own_launch_ref_s is None else float(self.own_launch_ref_s),
            "profiled_pace": None if self.profiled_pace is None else self.profiled_pace.to_dict(),
            "path_weights": dict(PATH_WEIGHTS),  # what the pace was fitted with (checked on reading)
            "expert_loop_launches": EXPERT_LOOP_LAUNCHES,  # what the costs were fitted with (checked on reading)
            "sync_points": dict(self.sync_points),
            "runs": [dict(r) for r in self.runs], "provenance": dict(self.provenance),
        }

    @classmethod
    def from_dict(cls, data: Any) -> HostModel:
        if not isinstance(data, dict) or "launch_s" not in data:
            raise CalibError("calibration host section: expected a mapping with launch_s (and sync_s)")
        try:
            launch, sync = float(data["launch_s"]), float(data.get("sync_s", 0.0))
            replay = data.get("replay_launch_s")
            replay = None if replay is None else float(replay)
        except (TypeError, ValueError):
            raise CalibError("calibration host section: launch_s and sync_s must be numbers (seconds)") from None
        if not (np.isfinite(launch) and np.isfinite(sync)) or launch < 0 or sync < 0:
            raise CalibError(f"calibration host section: launch_s {launch} / sync_s {sync} must be finite and >= 0")
        if replay is not None and not (np.isfinite(replay) and replay >= 0):
            raise CalibError(f"calibration host section: replay_launch_s {replay} must be finite and >= 0")
        rsync, p2p, rp2p = (_optional_cost(data, k) for k in ("replay_sync_s", "p2p_sync_s", "replay_p2p_sync_s"))
        for old in ("pace_per_doubling", "replay_pace_per_doubling"):
            if data.get(old) is not None:  # its costs are per GPUs on a host: read as per code path they would be wrong
                raise CalibError(f"calibration host section: {old} (host costs by GPUs per host) is from an older "
                                 "calib; this one scales them by the parallel code path (pace_per_path): refit with "
                                 "`calib fit`")
        pace, rpace = (_optional_pace(data, k) for k in ("pace_per_path", "replay_pace_per_path"))
        try:
            paths = [float(g) for g in data.get("fitted_paths") or []]
            weights = {str(d): float(w) for d, w in (data.get("path_weights") or PATH_WEIGHTS).items()}
        except (TypeError, ValueError, AttributeError):
            raise CalibError("calibration host section: fitted_paths must be a list of numbers and path_weights a "
                             "mapping of tp/pp/ep to numbers") from None
        if any(not np.isfinite(g) or g < 0 for g in paths):
            raise CalibError(f"calibration host section: fitted_paths {paths} must be finite and >= 0")
        if weights != PATH_WEIGHTS and (pace is not None or rpace is not None):
            # The weights are this calib's measured constants; a file fitted with others would be misread.
            raise CalibError(f"calibration host section: path_weights {weights} differ from this calib's "
                             f"{PATH_WEIGHTS}: refit with `calib fit`")
        loop = data.get("expert_loop_launches", EXPERT_LOOP_LAUNCHES)
        if loop != EXPERT_LOOP_LAUNCHES:
            # The generator's constant; costs fitted with another would be misread (more or less host time per routing).
            raise CalibError(f"calibration host section: expert_loop_launches {loop!r} differs from this calib's "
                             f"{EXPERT_LOOP_LAUNCHES}: refit with `calib fit`")
        rendezvous, rrendezvous = (_optional_cost(data, k) for k in ("tp_rendezvous_s", "replay_tp_rendezvous_s"))
        most = data.get("tp_rendezvous_microbatches")
        if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
            raise CalibError(f"calibration host section: tp_rendezvous_microbatches {most!r} must be a positive integer")
        ref = _optional_cost(data, "own_launch_ref_s")
        if ref is not None and ref <= 0:
            raise CalibError(f"calibration host section: own_launch_ref_s {ref} must be > 0 (seconds per launch)")
        line = None if data.get("profiled_pace") is None else ProfiledPace.from_dict(data["profiled_pace"])
        return cls(launch, sync, replay, dict(data.get("sync_points") or SYNC_AFTER), list(data.get("runs") or []),
                   dict(data.get("provenance") or {}), rsync, p2p, rp2p, pace, rpace, paths, rendezvous, rrendezvous,
                   most, ref, line)


def path_pace(per_path: float, path: float) -> float:
    """The factor on a host cost of a run whose code path has exponent `path` (1 at one GPU)."""
    return float(per_path) ** float(path)


def own_pace_factor(own_launch_s: float | None, ref_s: float | None) -> float:
    """The factor on the host costs of a run whose trainer timed `own_launch_s` per tiny launch, against the
    calibration's reference pace `ref_s` ((own / ref) ** OWN_PACE_SLOPE); 1 where either is unknown."""
    if own_launch_s is None or ref_s is None:
        return 1.0
    if not (math.isfinite(own_launch_s) and own_launch_s > 0):
        raise CalibError(f"own launch pace {own_launch_s!r} s must be a positive number")
    return float((own_launch_s / ref_s) ** OWN_PACE_SLOPE)


def run_own_launch(bundle: Any, host: HostModel | None) -> tuple[float | None, str | None]:
    """The own launch pace a training bundle's run is simulated at, and where it came from: its trainer's timing,
    else the pace `host.profiled_pace` gives its profiled step, else (None, None): the reference pace."""
    from calib.validation.measured import measured_own_launch_s, profiled_span_per_node_s

    timed = measured_own_launch_s(bundle)
    line = None if host is None else host.profiled_pace
    return own_launch_of(timed, None if timed is not None or line is None else profiled_span_per_node_s(bundle), line)


@dataclass(frozen=True)
class RunPaces:
    """The own launch paces of a fit's runs, in their order (`run_paces`)."""

    timed: list[float | None]  # each run's trainer-timed pace (measured_own_launch_s); None: not timed
    paces: list[float | None]  # the pace each run is fitted at: timed, else its profiled step's, else None
    reference: float | None  # `own_launch_ref_s`: the median timed pace
    line: ProfiledPace | None  # `profiled_pace`, fitted over the timed runs
    exposures: list[float]  # each run's configuration's host exposure (config_exposures): what the line selects on

    def factors(self) -> list[float]:
        """Each run's factor on the host costs (`own_pace_factor` of its pace against the reference)."""
        return [own_pace_factor(p, self.reference) for p in self.paces]


def run_paces(bundles: Sequence[Any], runs: Sequence[_Run]) -> RunPaces:
    """Each training bundle's own launch pace as `fit_host` fits it: its trainer's timing, else the pace the line
    over the timed runs without pipeline parallelism of the configurations their hosts paced (`runs`, each bundle's
    `prepare_run`: the configuration's median step at no host cost against its median measured one,
    calib.models.profiled_pace.config_exposures and MIN_HOST_EXPOSURE) gives its profiled step
    (`host.profiled_pace`), else the reference (None)."""
    from calib.validation.measured import measured_own_launch_s, profiled_span_per_node_s

    timed = [measured_own_launch_s(b) for b in bundles]  # read once: each reads the bundle's steps table
    spans = [profiled_span_per_node_s(b) for b in bundles]
    exposures = config_exposures([r.key for r in runs], [r.measured_s for r in runs],
                                 [r.step(0.0, 0.0, 0.0) for r in runs])
    line = fit_profiled_pace(spans, timed, exposures, [_pipelined(b) for b in bundles])
    paces = [own_launch_of(t, s, line)[0] for t, s in zip(timed, spans, strict=True)]
    return RunPaces(timed, paces, own_pace_reference(timed), line, exposures)


def _pipelined(bundle: Any) -> bool:
    """Whether a training bundle ran with pipeline parallelism (its profiled span waits for the other stages)."""
    spec = bundle.manifest.spec
    return spec is not None and spec.pp > 1


def own_pace_reference(paces: Iterable[float | None]) -> float | None:
    """The reference own launch pace of a fit: the median of the fitted runs' timed paces (None: none timed it)."""
    timed = [t for t in paces if t is not None]
    return float(np.median(timed)) if timed else None


def _relative_pace(per_path: float, path: float, ref: float) -> float:
    """The factor on a host cost fitted at code path `ref` for a run on code path `path`."""
    return path_pace(per_path, path - ref)


def _optional_pace(data: dict, key: str) -> float | None:
    value = _optional_cost(data, key)
    if value is not None and value < 1.0:
        raise CalibError(f"calibration host section: {key} {value} must be >= 1 (a parallel code path never speeds the host)")
    return value


def _optional_cost(data: dict, key: str) -> float | None:
    try:
        value = data.get(key)
        value = None if value is None else float(value)
    except (TypeError, ValueError):
        raise CalibError(f"calibration host section: {key} must be a number (seconds)") from None
    if value is not None and not (np.isfinite(value) and value >= 0):
        raise CalibError(f"calibration host section: {key} {value} must be finite and >= 0")
    return value


def _short(ids: Sequence[str], most: int = 4) -> str:
    """Bundle ids for a provenance line (the calibration's `bundles` list has them all)."""
    ids = list(ids)
    return ", ".join(ids) if len(ids) <= most else f"{', '.join(ids[:most])} and {len(ids) - most} more bundles"


# (launch_s, sync_s, p2p_sync_s[, tp_rendezvous_s]) -> simulated step seconds
StepOf = Callable[..., float]


@dataclass
class _Run:
    id: str
    key: str
    measured_s: float
    syncs: int  # device-to-host sync points
    step: StepOf
    p2p_syncs: int = 0  # pipeline send/recv sync points
    # Per rank class: (launches, device-to-host sync points, pipeline sync points) of one step.
    host_work: tuple[tuple[int, int, int], ...] = ()
    path: float = 0.0  # the run's parallel code path (path_exponent)
    # The slowest measured step of this run's configuration, each over its own_pace (fit_runs sets it; 0: this
    # run's own).
    bound_s: float = 0.0
    tp: int = 1  # tensor-parallel degree: a run over 1 has TP rendezvous
    microbatches: int = 1  # per step
    own_pace: float = 1.0  # own_pace_factor of the run: `step` takes reference-pace costs and scales them by it

    def cap(self, which: int) -> float:
        """The largest value of cost `which` (0 launch, 1 sync, 2 pipeline sync) that the hosts of this
        run's configuration can have had: every rank's host did that work (and more) within the measured
        step. The slowest run of the configuration sets it: the costs stand for every host the runs
        came from, and one fast host's repeat would bound them all at its own pace (docs/host.md, "One
        fast host's repeat pins the pace"). Each cost is bounded alone, not jointly: a joint bound would
        let whichever cost is fitted first take the whole step and leave the others none (inf: no bound)."""
        step = max(self.measured_s / self.own_pace, self.bound_s)  # in the reference pace's seconds
        return min((step / w[which] for w in self.host_work if w[which]), default=float("inf"))

    def at_own_pace(self, factor: float) -> _Run:
        """This run with its step taking reference-pace costs: launch and sync costs times `factor`."""
        if factor == 1.0:
            return self
        step = self.step

        def scaled(launch_s: float, sync_s: float, p2p_s: float, *rendezvous: float) -> float:
            return step(launch_s * factor, sync_s * factor, p2p_s * factor, *rendezvous)

        return dataclasses.replace(self, step=scaled, own_pace=factor)


def solve(step: Callable[[float], float], target: float, hi: float, lo: float = 0.0) -> float:
    """The smallest x in [lo, hi] with step(x) ~= target for a non-decreasing step; lo when step(lo) is
    already above target, hi when step(hi) is still below. Regula falsi (Illinois) on the bracket."""
    f_lo = step(lo) - target
    if f_lo >= 0:
        return lo
    f_hi = step(hi) - target
    if f_hi <= 0:
        return hi
    side = 0
    x = lo
    for _ in range(40):
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo) if f_hi != f_lo else 0.5 * (lo + hi)
        if not lo < x < hi:
            x = 0.5 * (lo + hi)
        f = step(x) - target
        if abs(f) <= REL_TOL * target or hi - lo < 1e-9:
            return x
        if f > 0:
            hi, f_hi = x, f
            if side == 1:
                f_lo *= 0.5
            side = 1
        else:
            lo, f_lo = x, f
            if side == -1:
                f_hi *= 0.5
            side = -1
    return x


class Curves:
    """The simulated steps of some runs as functions of one host cost (the other one fixed), known at
    the costs simulated so far.

    The step never decreases with the cost, so linear interpolation between simulated costs is a
    non-decreasing estimate of it everywhere in between, and the estimated mean absolute percent error
    (MAPE) over the runs is piecewise linear in the cost. `fit` picks the cost minimising it: a run
    that is GPU-bound at zero cost (over-predicted already) says nothing until the cost starts to
    lengthen its step, and from there on pulls the cost down as much as it is hurt.
    """

    def __init__(self, steps: Sequence[Callable[[float], float]], measured: Sequence[float], hi: float,
                 caps: Sequence[float] | None = None) -> None:
        self.steps = list(steps)
        self.measured = np.asarray(measured, dtype=float)
        self.hi = hi
        # Per run: the cost above which its host alone would outlast its measured step (_Run.cap).
        self.caps = np.full(len(self.steps), np.inf) if caps is None else np.asarray(caps, dtype=float)
        self.points: list[dict[float, float]] = [{} for _ in self.steps]
        self.shared: set[float] = set()  # costs at which every run has been simulated
        self.top = hi  # above it every run is over-predicted, so the MAPE only grows (set by `coarse`)
        self.roots: list[float] = []  # per run: the cost at which its step equals the measured one

    def at(self, i: int, x: float) -> float:
        pts = self.points[i]
        if x not in pts:
            pts[x] = float(self.steps[i](x))
        return pts[x]

    def simulate(self, x: float) -> None:
        for i in range(len(self.steps)):
            self.at(i, x)
        self.shared.add(x)

    def curve(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        xs = np.array(sorted(self.points[i]))
        # Running maximum: a simulator's rounding must not make the estimate decrease.
        return xs, np.maximum.accumulate(np.array([self.points[i][x] for x in xs]))

    def mape(self, xs: np.ndarray, idx: Sequence[int]) -> np.ndarray:
        """Estimated MAPE (percent) over runs `idx` at each cost of `xs` (interpolated, no simulation)."""
        est = np.array([np.interp(xs, *self.curve(i)) for i in idx])
        m = self.measured[list(idx)][:, None]
        return 100.0 * np.mean(np.abs(est - m) / m, axis=0)

    def limit(self, idx: Sequence[int]) -> float:
        """The highest cost worth considering for runs `idx`: `top`, or less where one of them bounds it."""
        return float(min(self.top, np.min(self.caps[list(idx)], initial=np.inf)))

    def best(self, idx: Sequence[int], only_shared: bool = False) -> float:
        """The cost in [0, limit] with the least estimated MAPE over runs `idx` (the smallest such cost;
        no simulation). The estimate is piecewise linear: its minimum lies at a simulated cost, where a
        run's estimate crosses its measured step, or at the limit."""
        top = self.limit(idx)
        cand = {x for x in self.shared if x <= top}
        if not cand or (not only_shared and top < self.top):
            cand.add(top)
        if not only_shared:
            for i in idx:
                xs, ys = self.curve(i)
                cand.update(xs.tolist())
                m = self.measured[i]
                k = int(np.searchsorted(ys, m))
                if 0 < k < len(ys) and ys[k] > ys[k - 1]:
                    cand.add(float(xs[k - 1] + (m - ys[k - 1]) * (xs[k] - xs[k - 1]) / (ys[k] - ys[k - 1])))
        c = np.array(sorted(x for x in cand if 0.0 <= x <= top))
        return float(c[int(np.argmin(self.mape(c, idx)))])

    def coarse(self) -> None:
        """Every run at 0 and at hi/64, hi/32, ... up to the first cost at which all are over-predicted:
        beyond it the MAPE only grows. Every run at every point, over-predicted ones too: where a
        GPU-bound run's step starts to grow is what constrains the cost."""
        self.simulate(0.0)
        x = self.hi * GRID_FIRST
        while True:
            self.simulate(x)
            if x >= self.hi or all(self.points[i][x] >= m for i, m in enumerate(self.measured)):
                break
            x = min(2.0 * x, self.hi)
        self.top = x

    def root(self, i: int) -> float:
        """Run i's root, searched inside the bracket its simulated costs already give."""
        xs, ys = self.curve(i)
        m = self.measured[i]
        below, above = xs[ys < m], xs[ys >= m]
        if not len(below):
            return 0.0
        if not len(above):
            return float(xs[-1])
        return solve(lambda x: self.at(i, x), m, float(above[0]), float(below[-1]))

    def bound(self, xs: np.ndarray, idx: Sequence[int]) -> np.ndarray:
        """A lower bound of the true MAPE over runs `idx` at each cost of `xs`, if every step is convex
        in the cost as well (the step is the longest path, a maximum of path lengths each linear in
        the cost): between two simulated costs the step lies under their chord and above the secants of
        the neighbouring intervals extended, and above the left end's value (it never decreases)."""
        total = np.zeros(len(xs))
        for i in idx:
            px, py = self.curve(i)
            upper = np.interp(xs, px, py)
            k = np.clip(np.searchsorted(px, xs, side="right") - 1, 0, len(px) - 1)
            lower = py[k].copy()
            slope = np.diff(py) / np.diff(px) if len(px) > 1 else np.zeros(0)
            left = k >= 1  # secant of the interval before, extended to the right
            kl = k[left]
            lower[left] = np.maximum(lower[left], py[kl] + slope[kl - 1] * (xs[left] - px[kl]))
            right = k + 2 < len(px)  # secant of the interval after, extended to the left
            kr = k[right]
            lower[right] = np.maximum(lower[right], py[kr + 1] - slope[kr + 1] * (px[kr + 1] - xs[right]))
            lower = np.minimum(lower, upper)
            m = self.measured[i]
            total += np.maximum(np.maximum(lower - m, m - upper), 0.0) / m
        return 100.0 * total / len(idx)

    def fit(self) -> float:
        """Coarse grid, per-run roots (informative, and points near every run's crossing), then
        refinement, each step simulating every run at one more cost: at the estimate's best cost if
        not simulated yet, else where the lower bound (`bound`) says the MAPE could be lowest, until
        nowhere could it be lower than the best simulated cost's by more than F_TOL. Returns that cost (every run simulated there: its MAPE is exact, not estimated)."""
        everyone = list(range(len(self.steps)))
        self.coarse()
        self.roots = [self.root(i) for i in everyone]
        for _ in range(REFINE):
            c = self.best(everyone)
            if min(abs(c - x) for x in self.shared) > SAME * self.hi:
                self.simulate(c)
                continue
            top = self.limit(everyone)
            shared = np.array(sorted(x for x in self.shared if x <= top))
            least = float(np.min(self.mape(shared, everyone)))
            xs = np.union1d(np.linspace(0.0, top, DENSE), shared)
            lb = self.bound(xs, everyone)
            c = float(xs[int(np.argmin(lb))])
            if lb.min() >= least - F_TOL or min(abs(c - x) for x in self.shared) <= SAME * self.hi:
                break
            self.simulate(c)
        return self.best(everyone, only_shared=True)

    def heldout(self, keys: Sequence[str]) -> dict[int, float]:
        """Leave-one-configuration-out: for each run, the best cost over the runs of other
        configurations, from what is simulated already (no simulation)."""
        out: dict[int, float] = {}
        for key in sorted(set(keys)):
            others = [i for i, k in enumerate(keys) if k != key]
            if others:
                c = self.best(others)
                out.update({i: c for i, k in enumerate(keys) if k == key})
        return out


def fit_runs(runs: Sequence[_Run], cross_validate: bool = True) -> tuple[HostModel, dict]:
    """Fit and cross-validate on prepared runs (see the module docstring); without `cross_validate`
    the same costs and no error ({})."""
    if not runs:
        raise CalibError("host model: no training bundles to fit on")
    slowest: dict[str, float] = {}
    for r in runs:
        slowest[r.key] = max(slowest.get(r.key, 0.0), r.measured_s / r.own_pace)
    runs = [dataclasses.replace(r, bound_s=slowest[r.key]) for r in runs]
    measured = [r.measured_s for r in runs]
    synced = [r for r in runs if r.syncs]
    piped = [r for r in runs if r.p2p_syncs]
    # The costs are fitted at the code path most runs took (`ref`) and the pace moves the others: the
    # MAPE's valley runs along a constant cost there, so that a launch cost fitted at one GPU would
    # trade off against the pace along a diagonal that alternating fits crawl along.
    paths = sorted({r.path for r in runs})
    ref = max(paths, key=lambda g: (sum(r.path == g for r in runs), -g))
    off = [r for r in runs if r.path != ref]
    launch_s = sync_s = p2p_s = 0.0
    per_path = 1.0
    sc: Curves | None = None
    pc: Curves | None = None
    ps: _PaceSearch | None = None

    def k(r: _Run, f: float | None = None) -> float:
        return _relative_pace(per_path if f is None else f, r.path, ref)

    for rnd in range(ROUNDS + (1 if off else 0)):  # each cost in turn at the others' current values
        # The first round starts each cost on the runs the costs not fitted yet cannot distort (runs
        # without syncs for the launch cost, without pipeline syncs for the sync cost), where there are any.
        some = [r for r in runs if not r.syncs and not r.p2p_syncs] if rnd == 0 else []
        # Each run's pace is bound when its curve is made: the costs not fitted, and the pace, as they are now.
        lc = Curves([lambda x, r=r, s=sync_s, p=p2p_s, kr=k(r): r.step(x * kr, s * kr, p * kr) for r in some or runs],
                    [r.measured_s for r in some] or measured, LAUNCH_MAX_S,
                    [r.cap(0) / k(r) for r in some or runs])
        launch_s = lc.fit()
        some = [r for r in synced if not r.p2p_syncs] if rnd == 0 else []
        if synced:
            sc = Curves([lambda x, r=r, c=launch_s, p=p2p_s, kr=k(r): r.step(c * kr, x * kr, p * kr)
                         for r in some or synced],
                        [r.measured_s for r in some or synced], SYNC_MAX_S,
                        [r.cap(1) / k(r) for r in some or synced])
            sync_s = sc.fit()
        if piped:
            pc = Curves([lambda x, r=r, c=launch_s, s=sync_s, kr=k(r): r.step(c * kr, s * kr, x * kr) for r in piped],
                        [r.measured_s for r in piped], SYNC_MAX_S,
                        [r.cap(2) / k(r) for r in piped])
            p2p_s = pc.fit()
        if off:
            ps = _PaceSearch(off, ref, (launch_s, sync_s, p2p_s))
            per_path = ps.fit()
    at_one = 1.0 / path_pace(per_path, ref)  # the costs of the one-GPU path, as the model keeps them
    tps = [r for r in runs if r.tp > 1]
    rendezvous, rdv_roots, held_rdv = 0.0, {}, {}
    if tps:
        base = np.array([r.step(launch_s * k(r), sync_s * k(r), p2p_s * k(r), 0.0) for r in tps])
        trial = np.array([r.step(launch_s * k(r), sync_s * k(r), p2p_s * k(r), RENDEZVOUS_TRIAL_S) for r in tps])
        slope = (trial - base) / RENDEZVOUS_TRIAL_S
        tp_measured = np.array([r.measured_s for r in tps])
        rendezvous = best_rendezvous(base, slope, tp_measured)
        rdv_roots = {r.id: (float((m - b) / g) if g > 0 else None) for r, b, g, m in zip(tps, base, slope, tp_measured, strict=True)}
        if cross_validate:
            for key in {r.key for r in tps}:
                keep = np.array([r.key != key for r in tps])
                held_rdv[key] = best_rendezvous(base[keep], slope[keep], tp_measured[keep]) if keep.any() else 0.0

    def at(r: _Run, launch: float, sync: float, p2p: float, rendezvous_s: float) -> float:
        # A run without TP has no rendezvous (and its step function need not take one).
        return r.step(launch, sync, p2p, rendezvous_s) if r.tp > 1 else r.step(launch, sync, p2p)

    keys = [r.key for r in runs]
    held_launch = lc.heldout(keys) if cross_validate else {}
    held_sync = sc.heldout([r.key for r in synced]) if sc and cross_validate else {}
    held_p2p = pc.heldout([r.key for r in piped]) if pc and cross_validate else {}
    held_pace = ps.heldout() if ps and cross_validate else {}
    sync_of = {r.id: j for j, r in enumerate(synced)}
    p2p_of = {r.id: j for j, r in enumerate(piped)}
    held_pred: list[float] = []
    held_meas: list[float] = []
    per_run: list[dict] = []
    for i, r in enumerate(runs):
        j, q = sync_of.get(r.id), p2p_of.get(r.id)
        heldout = None
        if i in held_launch:
            # A configuration whose runs all have sync points, but no other configuration has any: no sync cost.
            so = held_sync.get(j, 0.0) if j is not None else 0.0
            po = held_p2p.get(q, 0.0) if q is not None else 0.0
            ko = k(r, held_pace.get(r.key, per_path))
            heldout = at(r, held_launch[i] * ko, so * ko, po * ko, held_rdv.get(r.key, rendezvous))
            held_pred.append(heldout)
            held_meas.append(r.measured_s)
        per_run.append({
            # roots: the cost this run's own host needed (informative)
            "id": r.id, "config": r.key, "measured_s": r.measured_s, "path": r.path,
            "launch_s": lc.roots[i] * k(r) * r.own_pace,
            "sync_s": sc.roots[j] * k(r) * r.own_pace if sc is not None and j is not None else None, "syncs": r.syncs,
            "p2p_sync_s": pc.roots[q] * k(r) * r.own_pace if pc is not None and q is not None else None,
            "p2p_syncs": r.p2p_syncs, "own_pace": r.own_pace,
            "tp_rendezvous_s": rdv_roots.get(r.id),
            "heldout_step_s": heldout,
            "fitted_step_s": at(r, launch_s * k(r), sync_s * k(r), p2p_s * k(r), rendezvous),
        })
    err = {} if not cross_validate else error_stat(
        np.array(held_pred), np.array(held_meas),
        "leave-one-configuration-out: each configuration's simulated step at the launch and sync costs (and the pace "
        "per unit of parallel code path) that minimise the mean absolute percent error over the other configurations' "
        "runs (kernel and network models as given; from the last round's simulations, each cost at the others' values "
        "when it was fitted; the TP rendezvous from the other configurations' TP runs)").to_dict()
    src = _short([r.id for r in runs])
    model = HostModel(launch_s * at_one, sync_s * at_one, None, dict(SYNC_AFTER), per_run,
                      p2p_sync_s=p2p_s * at_one if piped else None,
                      pace_per_path=per_path if off else None, fitted_paths=paths,
                      tp_rendezvous_s=rendezvous if tps else None,
                      tp_rendezvous_microbatches=max(r.microbatches for r in tps) if tps else None,
                      provenance={
        "host.launch_s": "calibrated: the cost per launch minimising the mean absolute percent error of the "
                         f"simulated against the measured step over {src}" + (" (on the one-GPU path)" if off else ""),
        "host.sync_s": ("calibrated: the cost per sync point minimising the same error at host.launch_s over "
                        f"{_short([r.id for r in synced])}" if synced else
                        "not calibrated: no training bundle has a host sync point (0)"),
        "host.p2p_sync_s": ("calibrated: the cost per pipeline send/recv sync minimising the same error at "
                            f"host.launch_s and host.sync_s over {_short([r.id for r in piped])}" if piped else
                            "not calibrated: no pipeline-parallel training bundle (host.sync_s is used)"),
        "host.pace_per_path": (
            "calibrated: the factor on every host cost per unit of the parallel code path (exponents PP "
            f"{PATH_WEIGHTS['pp']:g} and EP {PATH_WEIGHTS['ep']:g}, measured by measure/probes/host_phases.py; "
            f"TP {PATH_WEIGHTS['tp']:g}, its cost the TP rendezvous; DP 0), minimising the same error over runs on paths "
            f"{', '.join(f'{g:g}' for g in paths)}; not extrapolated beyond {max(paths):g}" if off else
            f"not calibrated: every training bundle took code path {paths[0]:g} (no pace: costs as fitted)"),
        "host.tp_rendezvous_s": (
            "calibrated: the time a blocking collective of the TP group keeps the compute stream beyond its transfer, "
            "minimising the same error over the runs with TP at the costs above "
            f"({_short([r.id for r in tps])}; each run's step linear in it between 0 and "
            f"{RENDEZVOUS_TRIAL_S * 1e6:g} us)" if tps else "not calibrated: no training bundle with TP (0)"),
        "host.sync_points": "configured: megatron-core host synchronisations (calib.workload.host.SYNC_AFTER)",
    })
    return model, err


def best_rendezvous(base: np.ndarray, slope: np.ndarray, measured: np.ndarray) -> float:
    """The rendezvous r in [0, RENDEZVOUS_MAX_S] minimising the mean of |base + slope r - measured| / measured
    (seconds, one entry per run). The mean is convex and piecewise linear in r, so its minimum lies at 0 or
    at a run's own root; the smallest such r on a tie."""
    if len(base) == 0:
        return 0.0
    roots = [(m - b) / g for b, g, m in zip(base, slope, measured, strict=True) if g > 0]
    candidates = sorted({0.0, *(min(max(float(x), 0.0), RENDEZVOUS_MAX_S) for x in roots)})
    errs = [float(np.mean(np.abs(base + slope * c - measured) / measured)) for c in candidates]
    return candidates[int(np.argmin(errs))]


class _PaceSearch:
    """The pace per unit of code path, at given costs of the reference path: the MAPE over the runs on
    other paths (a reference-path run does not depend on it) is searched over a grid of paces and
    refined around its best by golden section. The step of a run on a longer path grows with the pace,
    one on a shorter path shrinks with it, so the pace cannot be fitted with `Curves` (which needs every
    step non-decreasing). Each run bounds the pace (_Run.cap) on the side its path is on."""

    def __init__(self, runs: Sequence[_Run], ref: float, costs: tuple[float, float, float]) -> None:
        self.runs, self.ref, self.costs = list(runs), ref, costs
        self.measured = np.array([r.measured_s for r in self.runs])
        self.tried: dict[float, np.ndarray] = {}
        lo, hi = 1.0, 1.0 + PACE_MAX
        for r in self.runs:
            e = r.path - ref
            room = min((r.cap(w) / c for w, c in enumerate(costs) if c > 0), default=float("inf"))
            if np.isfinite(room) and room > 0 and e != 0:  # the run's costs times pace**e stay within its bound
                if e > 0:
                    hi = min(hi, room ** (1.0 / e))
                else:
                    lo = max(lo, room ** (1.0 / e))
        self.lo, self.hi = lo, max(lo, hi)  # contradicting bounds: the least pace the shorter paths allow

    def steps(self, f: float) -> np.ndarray:
        if f not in self.tried:
            out = []
            for r in self.runs:
                kr = _relative_pace(f, r.path, self.ref)
                out.append(r.step(*(c * kr for c in self.costs)))
            self.tried[f] = np.array(out)
        return self.tried[f]

    def mape(self, f: float, idx: np.ndarray | None = None) -> float:
        sel = np.ones(len(self.runs), dtype=bool) if idx is None else idx
        return float(np.mean(np.abs(self.steps(f)[sel] - self.measured[sel]) / self.measured[sel]))

    def fit(self) -> float:
        if self.hi <= self.lo:
            self.steps(self.lo)  # the one pace the bounds leave, simulated for the held-out fits
            return self.lo
        grid = np.exp(np.linspace(math.log(self.lo), math.log(self.hi), PACE_GRID))
        errs = [self.mape(float(f)) for f in grid]
        i = int(np.argmin(errs))
        a, b = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, len(grid) - 1)])
        g = (math.sqrt(5.0) - 1.0) / 2.0
        c, d = b - g * (b - a), a + g * (b - a)
        for _ in range(PACE_REFINE):
            if self.mape(c) <= self.mape(d):
                b, d = d, c
                c = b - g * (b - a)
            else:
                a, c = c, d
                d = a + g * (b - a)
        return min(self.tried, key=lambda f: (self.mape(f), f))

    def heldout(self) -> dict[str, float]:
        """Per configuration key: the tried pace with the least MAPE over the other configurations' runs.
        Only paces within every run's bound were tried, the held-out configuration's own included (the
        costs' held-out fits leave it out): `calib validate`, which refits without the configuration,
        has no such leak."""
        keys = np.array([r.key for r in self.runs])
        out: dict[str, float] = {}
        for key in sorted(set(keys)):
            others = keys != key
            if others.any():
                out[key] = min(self.tried, key=lambda f: (self.mape(f, others), f))
        return out


def prepare_run(bundle: Any, kernel_model: Any, calibration: Any) -> _Run:
    """The step-time function of one training bundle's generated configuration (module docstring)."""
    from calib.models.clock import clock_of, run_slowdown, throttled
    from calib.sim import simulate
    from calib.validation import engine
    from calib.validation.measured import measured_step
    from calib.workload.generate import Relaunchable

    spec = bundle.manifest.spec
    if spec is None:
        raise CalibError(f"bundle {bundle.path}: a training bundle without a spec cannot fit the host model")
    model, par = engine.model_of(spec), engine.parallel_of(spec)
    network, system = engine.replay_network(bundle, calibration)
    cache: dict[tuple[float, float, float, float], float] = {}
    # Each run at the SM clock its measured steps ran at: the kernel model times kernels at the top clock (or,
    # in older files, at the profiled steps' clock, which power-capped runs held higher; calib.models.clock).
    clock = clock_of(calibration)
    # Generated once: each trial cost only re-adds the host launches (Relaunchable.at), in a quarter
    # of the time of generating the step again, or re-costs a workload it built before.
    step_of = Relaunchable(model, par, throttled(kernel_model.predict, run_slowdown(bundle, clock)))

    def step(launch_s: float, sync_s: float, p2p_s: float, rendezvous_s: float = 0.0) -> float:
        # A cost no launch of the step carries cannot change it: a run without such syncs is simulated
        # once per launch cost, whatever sync costs the fit's rounds try (most runs have none).
        sync_s = sync_s if syncs else 0.0
        p2p_s = p2p_s if p2p else 0.0
        key = (launch_s, sync_s, p2p_s, rendezvous_s)
        if key not in cache:
            workload = step_of.at(HostModel(launch_s, sync_s, p2p_sync_s=p2p_s, tp_rendezvous_s=rendezvous_s))
            cache[key] = simulate(workload, network, system, breakdown=False).step_time_s
        return cache[key]

    work = _host_work(step_of.at(HostModel(0.0, 0.0)))
    p2p = sum(w[2] for w in work)
    syncs = sum(w[1] for w in work)
    return _Run(bundle.id, spec.key(), measured_step(bundle).time_s, syncs, step, p2p, work, _path_of(bundle),
                tp=spec.tp, microbatches=engine.parallel_of(spec).num_microbatches)


def _path_of(bundle: Any) -> float:
    """The parallel code path the bundle's run took (path_exponent)."""
    spec = bundle.manifest.spec
    return path_exponent(spec.tp, spec.pp, spec.ep)


def _host_work(workload: Any) -> tuple[tuple[int, int, int], ...]:
    """Per rank class of a host-annotated workload: (launches, device-to-host syncs that cost `sync_s`,
    pipeline syncs). Scalar reads (calib.workload.host.READ_SYNCS) cost no sync time and are not counted."""
    from calib.workload.host import host_work

    work = []
    for c in workload.classes:
        w = host_work(c.trace)
        work.append((w.launches, w.syncs - w.p2p_syncs - w.reads, w.p2p_syncs))
    return tuple(work)


def fit_host(bundles: Sequence[Any], kernel_model: Any, calibration_without_host: Any,
             cross_validate: bool = True) -> tuple[HostModel, dict]:
    """Fit the host model on the training bundles among `bundles` (real GPU runs only); return it and
    its cross-validated step-time error {mape, max, count, method} (percent; {} without `cross_validate`)."""
    from calib.validation.measured import is_real_gpu

    chosen = [b for b in bundles if b.manifest.kind == "training" and is_real_gpu(b) and b.manifest.spec is not None]
    if not chosen:
        raise CalibError("host model: no real-GPU training bundles among the inputs")
    with collector_paused():
        prepared = [prepare_run(b, kernel_model, calibration_without_host) for b in chosen]
        rp = run_paces(chosen, prepared)
        runs = [r.at_own_pace(f) for r, f in zip(prepared, rp.factors(), strict=True)]
        model, err = fit_runs(runs, cross_validate)
        del prepared, runs  # their generated steps go now, before the collector looks for cycles
    ref, line = rp.reference, rp.line
    model.own_launch_ref_s, model.profiled_pace = ref, line
    model.provenance["host.expert_loop_launches"] = (
        f"configured: each forward launch of the MoE expert loop costs {EXPERT_LOOP_LAUNCHES:g} launches of the host "
        "(calib.workload.host.EXPERT_LOOP_LAUNCHES: the median over 22 H200 host-phase probe runs at sequence 256 of "
        "its host time per launch over the other launches'); generated steps only")
    timed = [b.id for b, t in zip(chosen, rp.timed, strict=True) if t is not None]
    model.provenance["host.own_launch_ref_s"] = (
        f"calibrated: the median own launch pace of the {len(timed)} fitted runs whose trainer timed it "
        f"({_short(timed)}); their launch and sync costs were fitted as these costs times (own pace / it)"
        f"^{OWN_PACE_SLOPE:g}" if ref is not None else
        "not calibrated: no fitted run timed its trainer's own pace (costs not scaled by it)")
    estimated = sum(t is None and p is not None for t, p in zip(rp.timed, rp.paces, strict=True))
    model.provenance["host.profiled_pace"] = (
        f"calibrated: log(own launch pace) against log(the profiled step's span per node), least squares over the "
        f"{line.runs} timed runs with converted ETs whose configuration the host paced (its median measured step at "
        f"least {100 * PROFILED_PACE_MIN_EXPOSURE:.0f}% over its median step at no host cost; slope {line.slope:.3f}, r "
        f"{line.r:+.2f}); the {estimated} fitted runs that did not time their pace were fitted at the pace it gives "
        "them" if line is not None else
        f"not calibrated: fewer than {PROFILED_PACE_MIN_RUNS} timed runs with converted ETs whose configuration the "
        "host paced (untimed runs at the reference pace)")
    return model, err



@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off while the host model is fitted: each run keeps its last generated
    step (prepare_run), and scanning those again and again took more time than the fit itself. What
    the fit leaves in cycles is collected once at the end, among the objects made during the fit alone:
    with the collector off none left its youngest generation, and a full collection would also scan
    every bundle read before (3 s of each of `calib validate`'s held-out fits)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.collect(0)


def replay_run(bundle: Any, calibration: Any, sync_s: float) -> _Run:
    """The replayed step-time function of one bundle's converted ETs with host launches at a trial
    launch cost (calib.validation.replay semantics: measured kernel durations, simulated network)."""
    from calib.models.clock import replay_exponent
    from calib.sim import simulate
    from calib.validation import engine
    from calib.validation.measured import measured_step
    from calib.validation.replay import check_replayable, read_run_traces, replay_workload
    from calib.workload.host import add_host_to_replay, host_recoster, rendezvous_setter

    spec = bundle.manifest.spec
    run = read_run_traces(bundle, replay_exponent(calibration))
    check_replayable(run, spec.pp, f"bundle {bundle.id}")
    network, system = engine.replay_network(bundle, calibration)
    base = replay_workload(run)
    cache: dict[tuple[float, float, float, float], float] = {}
    # Built once and re-costed in place for every trial (a converted ET's launches are one per kernel,
    # never split, so re-costing is the same as building anew, and ~50x cheaper than building).
    hosted = add_host_to_replay(base, 0.0, sync_s, tp=spec.tp)
    hosted.fixed_structure = True  # re-costed in place below, never reshaped
    recosts = [host_recoster(c.trace) for c in hosted.classes]  # launch nodes found once, not at every trial
    set_rendezvous = rendezvous_setter(hosted)
    work = _host_work(hosted)
    p2p = max(w[2] for w in work)
    syncs = max(w[1] for w in work)

    def step(launch_s: float, sync: float, p2p_s: float, rendezvous_s: float = 0.0) -> float:
        key = (launch_s, sync, p2p_s, rendezvous_s)
        if key not in cache:
            for recost in recosts:
                recost(launch_s, sync, p2p_s)
            set_rendezvous(rendezvous_s)
            cache[key] = simulate(hosted, network, system, breakdown=False).step_time_s
        return cache[key]

    step(0.0, sync_s, sync_s)  # a replay the simulator refuses (one clear CalibError) is refused here, not mid-fit
    return _Run(bundle.id, spec.key(), measured_step(bundle).time_s, syncs, step, p2p, work, _path_of(bundle),
                tp=spec.tp, microbatches=engine.parallel_of(spec).num_microbatches)


def fit_replay_launch(bundles: Sequence[Any], calibration: Any, host: HostModel) -> tuple[HostModel, dict]:
    """The launch cost per measured kernel for replays of converted ETs (`replay_launch_s`): the
    generator's templates leave out some of the small kernels a real step launches, so its
    `launch_s` (per generated launch) is not the cost of one real launch. Fitted with its own sync
    cost (`replay_sync_s`) exactly like `launch_s` and `sync_s` (fit_runs on the replays), with its
    leave-one-configuration-out error. Returns a copy of `host` with both set."""
    from calib.validation.measured import is_real_gpu

    runs = []
    skipped = []
    for b in bundles:
        if b.manifest.kind != "training" or not is_real_gpu(b) or b.manifest.spec is None or not b.et_files():
            continue
        try:
            pace = own_pace_factor(run_own_launch(b, host)[0], host.own_launch_ref_s)
            runs.append(replay_run(b, calibration, host.sync_s).at_own_pace(pace))
        except CalibError as exc:  # a run that cannot be replayed (PP without send/recv) has no say
            skipped.append(f"{b.id}: {exc}")
    if not runs:
        raise CalibError("host model: no training bundle with replayable ETs to fit the replay launch cost on")
    fitted, err = fit_runs(runs)  # launch and sync costs of the replays, as for generated steps
    out = HostModel.from_dict(host.to_dict())
    out.replay_launch_s, out.replay_sync_s, out.replay_p2p_sync_s = fitted.launch_s, fitted.sync_s, fitted.p2p_sync_s
    out.replay_pace_per_path = fitted.pace_per_path
    out.replay_tp_rendezvous_s = fitted.tp_rendezvous_s
    out.fitted_paths = sorted(set(out.fitted_paths) | set(fitted.fitted_paths))
    per = {r["id"]: r for r in fitted.runs}
    for r in out.runs:
        if r["id"] in per:
            r["replay_launch_s"], r["replay_step_s"] = per[r["id"]]["launch_s"], per[r["id"]]["fitted_step_s"]
            r["replay_tp_rendezvous_s"] = per[r["id"]].get("tp_rendezvous_s")
    src = _short([r.id for r in runs]) + (f" (not replayable: {len(skipped)})" if skipped else "")
    out.provenance["host.replay_launch_s"] = (
        "calibrated: the cost per measured kernel minimising the mean absolute percent error of the replayed "
        f"against the measured step over {src}")
    out.provenance["host.replay_sync_s"] = (
        "calibrated: the cost per device-to-host sync point of the replays minimising the same error at "
        f"host.replay_launch_s over {src}")
    out.provenance["host.replay_p2p_sync_s"] = (
        "calibrated: the cost per pipeline send/recv sync of the replays minimising the same error over the "
        "pipeline-parallel replays" if fitted.p2p_sync_s is not None else
        "not calibrated: no pipeline-parallel replay (host.replay_sync_s is used)")
    out.provenance["host.replay_tp_rendezvous_s"] = (
        "calibrated: the TP rendezvous of the replays (every collective of the TP group), minimising the same error "
        "over the replays with TP" if fitted.tp_rendezvous_s is not None else
        "not calibrated: no replay with TP (0)")
    out.provenance["host.replay_pace_per_path"] = (
        "calibrated: the factor on every replay host cost per unit of the parallel code path, minimising the "
        "same error over the replays" if fitted.pace_per_path is not None else
        "not calibrated: every replay took one code path (no pace)")
    err["method"] = ("leave-one-configuration-out on replays of the converted ETs: each configuration replayed at the "
                     "launch and sync costs minimising the mean absolute percent error over the other configurations' "
                     "replays")
    return out, err
