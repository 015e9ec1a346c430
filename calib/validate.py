"""`calib validate`: how far off the calibrated simulator is on runs it did not see.

For every real (GPU) training bundle:
  - replay: its own converted ETs simulated on the calibrated network (calib.validation.replay says
    exactly how), against its measured step time (calib.validation.measured says how that is taken);
  - held-out: leave its configuration out (every bundle with the same RunSpec.key() leaves together),
    fit on the rest (calib.fit), generate its step from the spec (calib.workload via calib.project),
    simulate, compare;
  - in-sample: the same with the calibration under validation (fitted on everything);
and per model the kernel, collective and energy-per-step errors on the held-out runs.
The reports (reports/validation.{json,md,html}) and the calibration file's `validation` section
say for each number which kind it is and how many runs it rests on.
"""

from __future__ import annotations

import datetime as _dt
import functools
import math
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from calib.bundle.io import Bundle, bundle_sha256, load_bundles, read_bundle
from calib.errors import CalibError
from calib.models.clock import replay_exponent
from calib.models.common import MODEL_FREE_METHODS
from calib.models.host import run_own_launch
from calib.validation import engine
from calib.validation.depth import depth_series, depth_summary
from calib.validation.measured import (
    et_breakdown_s,
    is_real_gpu,
    measured_energy_per_step_j,
    measured_host_work_s,
    measured_own_launch_s,
    measured_step,
    model_name,
    parallelism_type,
    profiled_span_per_node_s,
)
from calib.validation.prospective import committed_predictions
from calib.validation.replay import check_replayable, read_run_traces, simulate_replay
from calib.validation.thresholds import Thresholds, load_thresholds, violations
from calib.validation.types import (
    GPU_BOUND_KEY,
    HELDOUT,
    IN_SAMPLE,
    MODEL_FREE,
    PREDICTED,
    REPLAY,
    REPLAY_GPU_BOUND_KEY,
    ModelError,
    RunError,
    ValidationReport,
    error_stats,
    relative_error_pct,
    summarize,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = ROOT / "traces"
DATA = Path(__file__).resolve().parent / "data"

Progress = Callable[[str], None]


def default_calibration(gpu_family: str) -> Path:
    return DATA / f"calibration-{gpu_family}.yaml"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, CalibError) else f"{type(exc).__name__}: {text}"


def _run_error(b: Bundle, kind: str, measured: object, predicted: float | None, **kw: object) -> RunError:
    spec = b.manifest.spec
    return RunError(
        run=b.id, config=spec.key(), model=model_name(spec), gpus=spec.tp * spec.pp * spec.dp,
        tp=spec.tp, pp=spec.pp, dp=spec.dp, ep=spec.ep, parallelism=parallelism_type(spec), kind=kind,
        measured_step_s=measured.time_s, measured_steps=measured.steps, predicted_step_s=predicted,
        error_pct=relative_error_pct(predicted, measured.time_s),
        measured_spread=measured.spread, host_work_s=measured_host_work_s(b), own_launch_s=measured_own_launch_s(b),
        profiled_span_s=_profiled_span(b),
        **kw,  # type: ignore[arg-type]
    )


def _profiled_span(b: Bundle) -> float | None:
    """The run's profiled span per node for the report; None where its ETs cannot say (the replay's note has why)."""
    try:
        return profiled_span_per_node_s(b)
    except CalibError:
        return None


def _mean_busy_s(result: object) -> dict[str, float]:
    busy = getattr(result, "busy_ns", None) or []
    if not busy:
        return {}
    acc: dict[str, float] = {}
    for per_rank in busy:
        for cat, ns in per_rank.items():
            acc[cat] = acc.get(cat, 0.0) + ns * 1e-9
    return {k: v / len(busy) for k, v in sorted(acc.items())}


# --- held-out: one configuration left out, fitted on the rest (runs in worker processes) ----------


# The bundles a process has read for its held-out fits, by path: each fit takes nearly all of them, and a
# bundle read once keeps its tables and the points derived from them (Bundle.derived) for the next fit,
# which took a third of a held-out fit's time (benchmarks/heldout_fit.py). Emptied by run_validation.
_READ: dict[str, Bundle] = {}


def _read_once(path: str) -> Bundle:
    if path not in _READ:
        _READ[path] = read_bundle(path)
    return _READ[path]


def _heldout_group(key: str, group_paths: list[str], other_paths: list[str]) -> dict:
    """Fit on `other_paths`, rebuild the left-out configuration, and score the per-model errors."""
    group = [_read_once(p) for p in group_paths]
    others = [_read_once(p) for p in other_paths]
    out: dict = {"key": key, "fitted_on": [b.id for b in others], "predictions": {}, "note": "",
                 "kernel": [], "kernel_time_s": [0.0, 0.0], "collective": [], "energy": [], "model_notes": []}
    try:
        cal = engine.fit(others)
    except Exception as exc:  # noqa: BLE001 - reported per configuration, never a traceback
        out["note"] = f"fit without this configuration failed: {_one_line(exc)}"
        return out
    for b in group:
        try:
            pred = engine.predict(b, cal)
            out["predictions"][b.id] = {"step_s": pred.step_s, "breakdown_s": pred.breakdown_s,
                                        "energy_j": pred.energy_j}
        except Exception as exc:  # noqa: BLE001
            out["predictions"][b.id] = {"note": f"held-out prediction failed: {_one_line(exc)}"}
        for name, score in (("kernel", _kernel_errors), ("collective", _collective_errors)):
            try:
                errs = score(b, cal)
                if name == "kernel":  # (percent errors, |predicted - measured| summed, measured summed)
                    errs, abs_diff_s, measured_s = errs
                    out["kernel_time_s"][0] += abs_diff_s
                    out["kernel_time_s"][1] += measured_s
                out[name] += errs
            except Exception as exc:  # noqa: BLE001 - a per-model figure missing, said in the notes
                out["model_notes"].append(f"{b.id}: {name} errors not computed ({_one_line(exc)})")
        energy = out["predictions"][b.id].get("energy_j")
        measured_e = measured_energy_per_step_j(b)
        if energy is not None and measured_e:
            out["energy"].append(100.0 * (energy - measured_e) / measured_e)
    return out


def _kernel_errors(b: Bundle, cal: object) -> tuple[list[float], float, float]:
    """Relative errors (percent) of the held-out fit's kernel model on this run's measured ops (the
    rows `calib fit` would fit on: compute kernels, not communication, each op instance's kernels
    summed as the model is fitted and the generator times them: a flash backward's three kernels or a
    split-K GEMM and its reduction are one op), plus the summed absolute error and summed measured
    time (seconds) for a time-weighted figure."""
    from calib.fit import kernel_rows
    from calib.models.kernel import op_instances

    df, _ = kernel_rows([b])
    df = op_instances(df)
    if df.empty:
        return [], 0.0, 0.0
    try:
        pred = np.asarray(cal.kernel_model().predict(df), dtype=float)  # type: ignore[attr-defined]
    except CalibError:  # the held-out fit has no kernel model: no figure
        return [], 0.0, 0.0
    meas = df["time_s"].to_numpy(dtype=float)
    ok = np.isfinite(pred) & (pred > 0)
    errs = (100.0 * (pred[ok] - meas[ok]) / meas[ok]).tolist()
    return errs, float(np.abs(pred[ok] - meas[ok]).sum()), float(meas[ok].sum())


def _collective_errors(b: Bundle, cal: object) -> list[float]:
    """Relative errors (percent) of the held-out network model on this run's collectives (their
    transfer part, the points `calib fit` would take from a training bundle)."""
    from calib.fit import collective_points

    _, df = collective_points([b])
    if df.empty:
        return []
    try:
        model = cal.network_model()  # type: ignore[attr-defined]
    except CalibError:
        return []
    out = []
    for r in df.itertuples():
        try:
            pred = float(model.predict(str(r.kind), int(r.group_size), float(r.bytes), domain=str(r.domain)))
        except CalibError:  # no fitted series for this kind/group size: not a point of this model
            continue
        out.append(100.0 * (pred - float(r.time_s)) / float(r.time_s))
    return out


# --- the job ------------------------------------------------------------------------------------------


def preflight(bundle_paths: list[str | os.PathLike] | None, out_dir: str | os.PathLike | None,
              thresholds_path: str | os.PathLike | None, check: bool) -> None:
    """Refuse bad input in one line before minutes of work: the output folder, the thresholds file,
    no real GPU training bundle to validate, and ETs that cannot be read (corrupt or truncated)."""
    from calib.chakra.codec import read_et
    from calib.paths import check_output_folder

    if out_dir is not None:
        check_output_folder(out_dir, "--out")
    if check or thresholds_path is not None:
        load_thresholds(thresholds_path)
    paths = list(bundle_paths) if bundle_paths else ([DEFAULT_TRACES] if DEFAULT_TRACES.is_dir() else [])
    bundles = load_bundles(paths) if paths else []
    real = [b for b in bundles if b.manifest.kind == "training" and is_real_gpu(b)]
    if not real:
        where = ", ".join(str(p) for p in paths) or str(DEFAULT_TRACES)
        raise CalibError(f"nothing to validate: no real GPU training bundle in {where} (CPU bundles never count)")
    for b in real:
        for f in b.et_files():
            read_et(f)



def family_groups(bundle_paths: list[str | os.PathLike] | None) -> list[tuple[str, list[Path]]]:
    """The bundles split by GPU family (each validated against its own calibration), the family with
    the most training runs first; bundles of no known family (CPU test bundles) go with the first,
    where the report lists them as not counted."""
    paths = list(bundle_paths) if bundle_paths else ([DEFAULT_TRACES] if DEFAULT_TRACES.is_dir() else [])
    by_fam: dict[str, list[Bundle]] = {}
    loose: list[Bundle] = []
    for b in load_bundles(paths) if paths else []:
        fam = engine.gpu_family(b.manifest.gpu.name) if is_real_gpu(b) and b.manifest.gpu else None
        (by_fam.setdefault(fam, []) if fam else loose).append(b)
    if not by_fam:
        return [("", [b.path for b in loose])]

    def runs(fam: str) -> int:
        return sum(b.manifest.kind == "training" for b in by_fam[fam])

    order = sorted(by_fam, key=lambda f: (-runs(f), f))
    groups = [(f, [b.path for b in by_fam[f]]) for f in order]
    groups[0][1].extend(b.path for b in loose)
    return groups


def run_validation(
    bundle_paths: list[str | os.PathLike] | None = None,
    calibration_path: str | os.PathLike | None = None,
    out_dir: str | os.PathLike | None = "reports",
    *,
    replay: bool = True,
    heldout: bool = True,
    in_sample: bool = True,
    jobs: int = 1,
    write_calibration: bool = True,
    thresholds_path: str | os.PathLike | None = None,
    progress: Progress | None = None,
    cache: bool = True,
) -> ValidationReport:
    """Validate the calibration on the bundles; write the reports under `out_dir` (None: write nothing).
    `cache`: reuse and keep held-out results (calib.validation.cache; keyed by code and bundles)."""
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    _READ.clear()  # a bundle may have changed since an earlier validation in this process
    if bundle_paths:
        bundles = load_bundles(list(bundle_paths))
    else:  # the committed traces/; absent in an installed copy, which then has nothing to validate
        bundles = load_bundles([DEFAULT_TRACES]) if DEFAULT_TRACES.is_dir() else []
    notes: list[str] = []
    excluded: list[dict] = []

    real = [b for b in bundles if is_real_gpu(b)]
    training: list[Bundle] = []
    for b in bundles:
        if b.manifest.kind != "training":
            continue
        if not is_real_gpu(b):
            excluded.append({"run": b.id, "why": "CPU bundle (gpu.vendor cpu): never counts in an error figure"})
        elif b.manifest.spec is None:
            excluded.append({"run": b.id, "why": "training bundle without a spec"})
        else:
            training.append(b)

    cal, cal_info = _calibration(calibration_path, training, real, say)
    if cal is not None and cal_info.get("gpu_family"):
        fam = cal_info["gpu_family"]
        for b in training:
            if engine.gpu_family(b.manifest.gpu.name) != fam:
                excluded.append({"run": b.id, "why": f"GPU {b.manifest.gpu.name} differs from the calibration's {fam}"})
        training = [b for b in training if engine.gpu_family(b.manifest.gpu.name) == fam]

    measured = {}
    for b in training:
        try:
            measured[b.id] = measured_step(b)
        except CalibError as exc:
            excluded.append({"run": b.id, "why": _one_line(exc)})
    training = [b for b in training if b.id in measured]

    runs: list[RunError] = []
    breakdowns: dict[str, dict[str, float]] = {}
    tasks = [(str(b.path), cal, cal_info.get("bundles", []), replay, in_sample) for b in training]
    for i, (runs_b, bd) in enumerate(_map(_per_run, tasks, jobs), 1):
        runs += runs_b
        if bd:
            breakdowns[runs_b[0].run] = bd
        say(f"[{i}/{len(tasks)}] {Path(tasks[i - 1][0]).name}: replay and in-sample done")

    models: list[ModelError] = []
    if heldout and training:
        runs_h, models = _heldout(training, real, measured, breakdowns, jobs, cache, say, notes)
        runs += runs_h
    runs += _predicted_before(training, measured)
    models += _calibration_model_errors(cal)

    series = depth_series(runs)
    summary = summarize(runs, real_bundles=len(training)) | depth_summary(series)
    thresholds = _thresholds(thresholds_path, notes)
    if thresholds is not None:
        thresholds = thresholds.for_family(cal_info.get("gpu_family"))
    report = ValidationReport(
        runs=runs, models=models, summary=summary, calibration=cal_info, excluded=excluded, notes=notes,
        depth=[s.to_dict() for s in series],
        thresholds=thresholds.limits if thresholds else {}, goals=thresholds.goals if thresholds else {},
        created_utc=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    report.violations = violations(summary, thresholds)
    report.wall_s = time.perf_counter() - t0
    _READ.clear()
    if out_dir is not None:
        from calib.validation.report import write_reports

        write_reports(report, Path(out_dir))
    if write_calibration and cal_info.get("path") and cal_info.get("source") == "file" and training:
        write_validation_section(Path(cal_info["path"]), report)
    return report


def _one_thread() -> None:
    """Worker initializer: one BLAS/OpenMP thread per process. Without it every worker's numpy uses
    every core and N workers oversubscribe the machine (measured: 2 workers on 2 cores ran held-out
    fits 2.3x slower than with one thread each)."""
    try:
        from threadpoolctl import threadpool_limits  # a scikit-learn dependency
    except ImportError:
        return
    threadpool_limits(1)


def _map(fn: Callable, tasks: list[tuple], jobs: int) -> Iterator:
    """fn(*task) for every task, in order, each as soon as it and those before it are done; in `jobs`
    worker processes when there is more than one."""
    if jobs <= 1 or len(tasks) <= 1:
        yield from (fn(*t) for t in tasks)
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=_one_thread) as pool:
        yield from pool.map(fn, *zip(*tasks, strict=True))


def _per_run(path: str, cal: object, cal_bundles: list[str], replay: bool, in_sample: bool
             ) -> tuple[list[RunError], dict[str, float]]:
    """Replay and in-sample entries of one training bundle, and its measured ET breakdown."""
    b = read_bundle(path)
    ms = measured_step(b)
    breakdowns: dict[str, dict[str, float]] = {}
    runs: list[RunError] = []
    if replay:
        runs.append(_replay_one(b, cal, ms, breakdowns))
    if in_sample and cal is not None:
        try:
            pred = engine.predict(b, cal)
            runs.append(_run_error(b, IN_SAMPLE, ms, pred.step_s, breakdown_measured_s=breakdowns.get(b.id, {}),
                                   breakdown_predicted_s=pred.breakdown_s,
                                   measured_energy_j=measured_energy_per_step_j(b), predicted_energy_j=pred.energy_j,
                                   fitted_on=list(cal_bundles),
                                   note="" if b.id in cal_bundles else "the calibration's bundle list does not name this run"))
        except Exception as exc:  # noqa: BLE001 - one line in the report, never a traceback
            runs.append(_run_error(b, IN_SAMPLE, ms, None, note=_one_line(exc)))
    return runs, breakdowns.get(b.id, {})


def _replay_one(b: Bundle, cal: object, ms: object, breakdowns: dict[str, dict[str, float]]) -> RunError:
    if not b.et_files():
        return _run_error(b, REPLAY, ms, None, note="bundle has no converted ETs (no profiled step)")
    try:
        run = read_run_traces(b, replay_exponent(cal))
        breakdowns[b.id] = et_breakdown_s(run.traces)
        check_replayable(run, b.manifest.spec.pp, f"bundle {b.id}")
        if cal is None:
            raise CalibError("no calibration to replay on")
        network, system = engine.replay_network(b, cal)
        host = cal.host_model() if getattr(cal, "host", None) else None  # type: ignore[attr-defined]
        if host is not None:
            spec = b.manifest.spec
            host = host.on_path(spec.tp, spec.pp, spec.ep).at_own_pace(run_own_launch(b, host)[0])
        if host is not None and host.replay_launch_s is not None:  # launches at the calibrated cost
            from calib.sim import simulate
            from calib.validation.replay import replay_workload
            from calib.workload.host import add_host_to_replay

            result = simulate(add_host_to_replay(replay_workload(run), host.replay_launch_s, host.replay_sync,
                                                 host.replay_p2p_sync, tp=spec.tp,
                                                 rendezvous_s=host.replay_tp_rendezvous_s or 0.0),
                              network, system)
        else:
            result = simulate_replay(run, network, system)
    except Exception as exc:  # noqa: BLE001
        return _run_error(b, REPLAY, ms, None, note=_one_line(exc), breakdown_measured_s=breakdowns.get(b.id, {}))
    if not result.step_time_s > 0:
        return _run_error(b, REPLAY, ms, None, note="replay simulated a zero step: the ETs hold no GPU work",
                          breakdown_measured_s=breakdowns[b.id])
    note = (f"{run.uneven} variable-size collective(s) (MoE token exchange) replayed at the largest rank's size"
            if run.uneven else "")
    return _run_error(b, REPLAY, ms, result.step_time_s, breakdown_measured_s=breakdowns[b.id],
                      breakdown_predicted_s=_mean_busy_s(result), note=note)


def _heldout(training: list[Bundle], real: list[Bundle], measured: dict, breakdowns: dict,
             jobs: int, cache: bool, say: Progress, notes: list[str]) -> tuple[list[RunError], list[ModelError]]:
    groups: dict[str, list[Bundle]] = {}
    for b in training:
        groups.setdefault(b.manifest.spec.key(), []).append(b)
    tasks = []
    for key, group in groups.items():
        fam = engine.gpu_family(group[0].manifest.gpu.name)
        others = [x for x in real if engine.gpu_family(x.manifest.gpu.name) == fam
                  and (x.manifest.spec is None or x.manifest.spec.key() != key)]
        tasks.append((key, [str(b.path) for b in group], [str(x.path) for x in others]))
    results = _heldout_results(tasks, jobs, cache, say, notes)
    by_id = {b.id: b for b in training}
    runs: list[RunError] = []
    kernel: list[float] = []
    kernel_abs_s = kernel_meas_s = 0.0
    coll: list[float] = []
    energy: list[float] = []
    for res in results:
        kernel += res["kernel"]
        kernel_abs_s += res["kernel_time_s"][0]
        kernel_meas_s += res["kernel_time_s"][1]
        coll += res["collective"]
        energy += res["energy"]
        notes += res["model_notes"]
        for path in next(t[1] for t in tasks if t[0] == res["key"]):
            b = by_id[Path(path).name]
            pred = res["predictions"].get(b.id, {})
            note = res["note"] or pred.get("note", "")
            runs.append(_run_error(
                b, HELDOUT, measured[b.id], pred.get("step_s"), breakdown_measured_s=breakdowns.get(b.id, {}),
                breakdown_predicted_s=pred.get("breakdown_s", {}), measured_energy_j=measured_energy_per_step_j(b),
                predicted_energy_j=pred.get("energy_j"), fitted_on=res["fitted_on"], note=note,
            ))
    models = []
    for name, errs, what in (
        ("kernel", kernel, "each run's profiled kernels (kernels.parquet) vs the kernel model fitted without its configuration"),
        ("collective", coll, "each run's collectives (transfer part) vs the network model fitted without its configuration"),
        ("energy_per_step", energy, "telemetry energy counter over the measured steps vs the held-out projection's energy per step"),
    ):
        mape, mx = error_stats(errs)
        models.append(ModelError(name, mape, mx, len(errs), HELDOUT, what))
    if kernel_meas_s > 0:
        models.insert(1, ModelError(
            "kernel.time_weighted", 100.0 * kernel_abs_s / kernel_meas_s, None, len(kernel), HELDOUT,
            "sum over the held-out runs' kernels of |predicted - measured| / sum of measured (what a step sees)",
        ))
    return runs, models


def _heldout_results(tasks: list[tuple[str, list[str], list[str]]], jobs: int, cache: bool, say: Progress,
                     notes: list[str]) -> list[dict]:
    """`_heldout_group` of every task, in order; with `cache`, those computed before on the same code
    and bundles are read back (calib.validation.cache) and the new ones kept."""
    from calib.validation import cache as store

    sha = functools.cache(bundle_sha256)  # each bundle hashed once for all the keys
    keys = [store.heldout_key(group, others, sha) for _, group, others in tasks] if cache else []
    results: list[dict | None] = [store.load_heldout(k) for k in keys] if cache else [None] * len(tasks)
    todo = [i for i, r in enumerate(results) if r is None]
    reused = len(tasks) - len(todo)
    say(f"held-out: {len(tasks)} configuration(s), {reused} from the cache, one fit each for the other "
        f"{len(todo)} in {max(1, jobs)} process(es)")
    # each result is kept as it arrives: an interrupted validation keeps what it finished
    for n, (i, res) in enumerate(zip(todo, _map(_heldout_group, [tasks[i] for i in todo], jobs), strict=True), 1):
        results[i] = res
        if cache:
            store.store_heldout(keys[i], res)
        say(f"[{n}/{len(todo)}] held out {tasks[i][0]}: {res['note'] or 'done'}")
    if reused:
        notes.append(f"held-out: {reused} of {len(tasks)} configuration(s) read from the cache in "
                     f"{store.cache_dir()}, computed before by the same code on the same bundles "
                     "(calib.validation.cache; --no-cache recomputes)")
    return [r for r in results if r is not None]


def _predicted_before(training: list[Bundle], measured: dict) -> list[RunError]:
    """The runs' committed predictions (calib.validation.prospective), one record per prediction file
    that predicted the run; the file and its calibration are in the note."""
    found = committed_predictions([b.path for b in training])
    runs = []
    for b in training:
        for p in found.get(b.path, []):
            runs.append(_run_error(b, PREDICTED, measured[b.id], p.step_s,
                                   note=f"{p.source}; calibration {p.calibration or 'not named'}"))
    return runs


def _model_error_kind(method: str) -> str:
    """How a fit error was obtained, from its method's words: a comparison involving no fitted model
    (a harness against its repeat on another host, an estimate with no parameter) is neither
    cross-validated nor in-sample."""
    if method.startswith(MODEL_FREE_METHODS):
        return MODEL_FREE
    return IN_SAMPLE if "in-sample" in method else "cross-validated"


def _calibration_model_errors(cal: object) -> list[ModelError]:
    """The per-model errors the fit itself reported (cross-validated inside `calib fit`)."""
    errors = getattr(cal, "errors", None) or {}
    out = []
    for name, e in sorted(errors.items()):
        d = e.to_dict() if hasattr(e, "to_dict") else dict(e)
        mape, mx = d.get("mape"), d.get("max")
        out.append(ModelError(
            str(name), None if mape is None or not math.isfinite(float(mape)) else float(mape),
            None if mx is None or not math.isfinite(float(mx)) else float(mx), int(d.get("count", 0)),
            _model_error_kind(str(d.get("method", ""))),
            f"from the calibration file ({d.get('method', 'method not stated')})",
        ))
    return out


def _calibration(path: str | os.PathLike | None, training: list[Bundle], real: list[Bundle],
                 say: Progress) -> tuple[object | None, dict]:
    """The calibration under validation: the file given, else the bundled one, else fitted here."""
    fam = engine.gpu_family(training[0].manifest.gpu.name) if training else None
    candidate = Path(path) if path else (default_calibration(fam) if fam else None)
    if path and not Path(path).is_file():
        raise CalibError(f"calibration file {path} does not exist")
    if candidate is not None and candidate.is_file():
        cal = engine.load_calibration(str(candidate))
        bundles = [b.get("id", "") if isinstance(b, dict) else str(b) for b in getattr(cal, "bundles", []) or []]
        return cal, {"path": str(candidate), "source": "file", "gpu": str(getattr(cal, "gpu", "")),
                     "gpu_family": engine.gpu_family(str(getattr(cal, "gpu", ""))) or fam, "bundles": bundles,
                     "software": dict(getattr(cal, "software", None) or {})}
    if not training:
        return None, {"path": "", "source": "none", "bundles": []}
    same = [b for b in real if engine.gpu_family(b.manifest.gpu.name) == fam]
    say(f"no calibration file at {candidate}: fitting on all {len(same)} {fam} bundles")
    try:
        cal = engine.fit(same)
    except Exception as exc:  # noqa: BLE001
        return None, {"path": "", "source": f"fit failed: {_one_line(exc)}", "bundles": []}
    return cal, {"path": "", "source": "fitted here on all bundles", "gpu_family": fam,
                 "bundles": [b.id for b in same], "software": dict(getattr(cal, "software", None) or {})}


def _thresholds(path: str | os.PathLike | None, notes: list[str]) -> Thresholds | None:
    try:
        return load_thresholds(path)
    except CalibError as exc:
        if path is not None:
            raise
        notes.append(f"no thresholds: {exc}")
        return None


def write_validation_section(path: Path, report: ValidationReport) -> None:
    """Record the step-time errors in the calibration file's `validation` section (atomically).

    No timestamp: the same bundles and calibration give the same file, so CI leaves it unchanged."""
    s = report.summary
    section = {
        "units": "percent of the measured step time",
        "heldout_mape": s.get("heldout_mape"), "heldout_max": s.get("heldout_max"),
        "heldout_count": s.get("heldout_count"), "heldout_configs": s.get("heldout_configs"),
        "replay_mape": s.get("replay_mape"), "replay_max": s.get("replay_max"), "replay_count": s.get("replay_count"),
        "replay_configs": s.get("replay_configs"), "replay_missing": s.get("replay_missing"),
        "in_sample_mape": s.get("in_sample_mape"), "in_sample_max": s.get("in_sample_max"),
        "predicted_before_mape": s.get("predicted_before_mape"), "predicted_before_max": s.get("predicted_before_max"),
        "predicted_before_count": s.get("predicted_before_count"),
        **{f"{GPU_BOUND_KEY}_{k}": s.get(f"{GPU_BOUND_KEY}_{k}") for k in ("mape", "max", "count", "configs", "share")},
        **{f"{REPLAY_GPU_BOUND_KEY}_{k}": s.get(f"{REPLAY_GPU_BOUND_KEY}_{k}") for k in ("mape", "max", "count", "configs")},
        "method": "leave-one-configuration-out over the real GPU training bundles (calib validate)",
        # host_share: what calib.project.error_band compares a projection's own with (held-out runs only)
        "runs": [
            {"run": r.run, "kind": r.kind, "model": r.model, "measured_step_s": r.measured_step_s,
             "predicted_step_s": r.predicted_step_s, "error_pct": r.error_pct,
             **({"host_share": r.host_share} if r.kind == HELDOUT and r.host_share is not None else {})}
            for r in report.runs
        ],
    }
    section = _plain(section)
    cal = engine.load_calibration(str(path))
    cal.validation = section  # type: ignore[attr-defined]
    cal.save(str(path))  # type: ignore[attr-defined]


def _plain(value: object) -> object:
    """Round floats for a readable YAML; NaN/inf become None."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    return value
