"""Collective-time model per network domain, collective kind and group size, and its ASTRA-sim export.

Sizes follow the nccl-tests convention (the bundle's collectives.parquet): all-reduce and
broadcast by the buffer, all-gather by its total output (n x the per-rank input), reduce-scatter
by its total input, all-to-all by the per-rank send buffer, send/recv by the message.

Per series (domain, kind, group size) the time of one collective is

    t(S) = (alpha + S * bus_factor(kind, n) / busbw) * exp(r(log10 S))

alpha (latency) and busbw (asymptotic bus bandwidth, nccl-tests' busbw) are fitted by weighted
least squares on relative error; r is a piecewise-linear residual in log size, clamped to the
measured size range (beyond the largest size the bandwidth regime holds with the efficiency of
the largest size). A group size that was not measured borrows the nearest measured size's series
with busbw held constant (the premise of nccl-tests' bus bandwidth).

`astra_params()` gives the closest ASTRA-sim parameters per domain: one bandwidth (GB/s, 2^30) and
latency (ns) for the dimension, the endpoint delay and the implementation per collective, fitted
to the same measurements through the congestion-unaware analytical formulas of ASTRA-sim
(docs: reference/astra-sim.md, "Collective time"), with the error that simplification costs.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

import numpy as np

from calib.errors import CalibError
from calib.models.common import ClampedPiecewise, error_stat
from calib.units import MIB, bytes_per_s_to_astra_bw_gbps

KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv")
ASTRA_KINDS = ("allreduce", "allgather", "reducescatter", "alltoall")
ASTRA_IMPLS = ("ring", "direct")
DEFAULT_ENDPOINT_DELAY_NS = 10.0  # ASTRA-sim's default; groups smaller than the cluster always use 10 ns
SWITCH_HOPS = 2  # ASTRA-sim counts a Switch dimension as two hops (reference/astra-sim.md)
MIN_SERIES_POINTS = 3


def normalize_kind(kind: str) -> str:
    k = re.sub(r"[^a-z0-9]", "", str(kind).lower())
    k = k.replace("into", "").replace("tensor", "").replace("base", "").replace("single", "").replace("coalesced", "")
    aliases = {"send": "sendrecv", "recv": "sendrecv", "p2p": "sendrecv", "sendreceive": "sendrecv",
               "alltoallv": "alltoall"}
    k = aliases.get(k, k)
    if k not in KINDS:
        raise CalibError(f"collective kind {kind!r} is not one of {', '.join(KINDS)}")
    return k


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor."""
    k = normalize_kind(kind)
    if n <= 1:
        return 1.0
    if k == "allreduce":
        return 2.0 * (n - 1) / n
    if k in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


@dataclass
class Series:
    """One fitted (domain, kind, group size) curve; plain numbers.

    Two latencies: `alpha_s` is that of collectives inside profiled training steps (the NCCL
    kernel's own duration), `alpha_bench_s` that of the microbenchmarks, whose CUDA events around
    one collective on an idle GPU add a launch floor of tens of microseconds. Predictions use
    `alpha_s`; a series whose training collectives include no latency-bound size (<= 1 MiB)
    gets alpha_bench_s minus its domain's typical floor (CollectiveModel.bench_floor_s).
    """

    domain: str
    kind: str
    group_size: int
    alpha_s: float
    busbw_bytes_per_s: float
    residual: ClampedPiecewise
    count: int
    bytes_range: tuple[float, float]
    alpha_bench_s: float = float("nan")
    has_trace: bool = True

    def predict(self, nbytes: np.ndarray, group_size: int | None = None, bench: bool = False,
                alpha_s: float | None = None) -> np.ndarray:
        n = self.group_size if group_size is None else group_size
        s = np.asarray(nbytes, dtype=float)
        alpha = self.alpha_bench_s if bench else (self.alpha_s if alpha_s is None else alpha_s)
        base = alpha + s * bus_factor(self.kind, n) / self.busbw_bytes_per_s
        return base * np.exp(self.residual(np.log10(np.maximum(s, 1.0))))

    @classmethod
    def fit(cls, domain: str, kind: str, n: int, nbytes: np.ndarray, t: np.ndarray, max_segments: int = 4,
            bench: np.ndarray | None = None) -> Series:
        s = np.asarray(nbytes, dtype=float)
        t = np.asarray(t, dtype=float)
        b = np.zeros(len(s), dtype=bool) if bench is None else np.asarray(bench, dtype=bool)
        if len(np.unique(s)) < MIN_SERIES_POINTS:
            raise CalibError(f"collective {kind} over {n} GPUs ({domain}): {len(np.unique(s))} size(s), "
                             f"need {MIN_SERIES_POINTS}")
        sf = s * bus_factor(kind, n)
        alpha_t, alpha_b, beta = _fit_two_alphas(sf, t, b)
        base = np.where(b, alpha_b, alpha_t) + beta * sf
        segs = max(1, min(max_segments, len(np.unique(s)) // 3))
        resid = ClampedPiecewise.fit(np.log10(np.maximum(s, 1.0)), np.log(t) - np.log(base), max_segments=segs)
        # The in-training latency counts as measured only when training collectives include
        # latency-bound sizes (<= 1 MiB); otherwise it comes from the microbenchmark (see class doc).
        return cls(domain, kind, n, alpha_t, 1.0 / beta, resid, len(s), (float(s.min()), float(s.max())),
                   alpha_b, bool((~b & (s <= MIB)).any()))

    def to_dict(self) -> dict:
        return {
            "domain": self.domain, "kind": self.kind, "group_size": self.group_size, "alpha_s": self.alpha_s,
            "alpha_bench_s": self.alpha_bench_s, "has_trace": self.has_trace,
            "busbw_bytes_per_s": self.busbw_bytes_per_s, "residual": self.residual.to_dict(), "count": self.count,
            "bytes_range": [float(self.bytes_range[0]), float(self.bytes_range[1])],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Series:
        return cls(str(d["domain"]), str(d["kind"]), int(d["group_size"]), float(d["alpha_s"]),
                   float(d["busbw_bytes_per_s"]), ClampedPiecewise.from_dict(d["residual"]), int(d["count"]),
                   (float(d["bytes_range"][0]), float(d["bytes_range"][1])),
                   float(d.get("alpha_bench_s", d["alpha_s"])), bool(d.get("has_trace", True)))


def _fit_two_alphas(sf: np.ndarray, t: np.ndarray, bench: np.ndarray) -> tuple[float, float, float]:
    """(alpha_trace, alpha_bench, beta) of t = alpha_source + beta*sf by relative least squares.

    A source without points gets NaN as its alpha."""
    cols = []
    has_t, has_b = bool((~bench).any()), bool(bench.any())
    if has_t:
        cols.append((~bench).astype(float))
    if has_b:
        cols.append(bench.astype(float))
    a = np.column_stack([*cols, sf]) / t[:, None]
    coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    beta = float(coef[-1])
    alphas = [float(c) for c in coef[:-1]]
    if beta <= 0 or any(x < 0 for x in alphas):
        # Read the two regimes off directly: the largest sizes' slope, each source's fastest time.
        big = sf >= np.quantile(sf, 0.75)
        beta = float(np.median(t[big] / sf[big])) if beta <= 0 else beta
        alphas = [max(0.0, x) for x in alphas]
    it = iter(alphas)
    alpha_t = next(it) if has_t else float("nan")
    alpha_b = next(it) if has_b else float("nan")
    return alpha_t, alpha_b, beta


# ---- ASTRA-sim's analytical formulas (one dimension, one chunk, free reduction) ------------


def astra_collective_time_s(
    kind: str, n: int, nbytes: np.ndarray, bandwidth_gbps: float, latency_ns: float, impl: str,
    endpoint_delay_ns: float = DEFAULT_ENDPOINT_DELAY_NS, hops: int = SWITCH_HOPS,
) -> np.ndarray:
    """Time ASTRA-sim's congestion-unaware backend gives one collective on one dimension of n NPUs.

    `nbytes` is nccl-tests-sized; ASTRA-sim's all-gather comm_size is the per-rank shard (S/n).
    One chunk (preferred-dataset-splits 1) and no local-mem-bw (reduction free), as calib emits.
    """
    s = np.asarray(nbytes, dtype=float)
    bp = bandwidth_gbps * 2**30 / 1e9  # bytes per ns
    c = _astra_coeffs(kind, n, s, impl, endpoint_delay_ns, hops)
    return (c[:, 0] * latency_ns + c[:, 1] / bp + c[:, 2]) * 1e-9


_STEPS = {"ring": lambda n: {"allreduce": 2 * (n - 1), "reducescatter": n - 1, "allgather": n - 1,
                             "alltoall": n * (n - 1) // 2},
          "direct": lambda n: {"allreduce": 2, "reducescatter": 1, "allgather": 1, "alltoall": 1}}


def _astra_coeffs(kind: str, n: int, s: np.ndarray, impl: str, e: float, hops: int) -> np.ndarray:
    """Columns (c_lat, c_invbw, c_const) with t_ns = c_lat*latency + c_invbw/Bp + c_const.

    Per step a message of m bytes costs hops*latency + m/Bp plus the endpoint delay e; ring and
    direct move S/n per step (all-gather: its shard S/n as a whole chunk), halving-doubling
    all-reduce moves S/2^i in step i of log2(n), twice (reference/astra-sim.md).
    """
    k = normalize_kind(kind)
    s = np.asarray(s, dtype=float)
    if k == "sendrecv" or n <= 1:
        return np.column_stack([np.full_like(s, hops), s, np.zeros_like(s)])
    if impl == "halvingDoubling":
        lg = int(round(math.log2(n)))
        if k != "allreduce" or 2**lg != n:
            raise CalibError(f"ASTRA-sim halvingDoubling is modelled for all-reduce over a power of 2, not {kind} over {n}")
        return np.column_stack([np.full_like(s, 2 * lg * hops), 2 * s * (1 - 2.0**-lg), np.full_like(s, e + 2 * lg * e)])
    if impl not in _STEPS:
        raise CalibError(f"ASTRA-sim implementation {impl!r} is not modelled by calib's fit (ring, direct, halvingDoubling)")
    steps = _STEPS[impl](n)
    if k not in steps:
        raise CalibError(f"ASTRA-sim does not simulate {kind} as a collective")
    st = steps[k]
    return np.column_stack([np.full_like(s, st * hops), st * s / n, np.full_like(s, st * e + e)])


@dataclass
class AstraFit:
    domain: str
    bandwidth_gbps: float
    latency_ns: float
    endpoint_delay_ns: float
    implementation: dict[str, str]
    topology: str
    error_all: dict
    error_1mib: dict

    def to_dict(self) -> dict:
        return {
            "topology": self.topology, "bandwidth_gbps": self.bandwidth_gbps, "latency_ns": self.latency_ns,
            "endpoint_delay_ns": self.endpoint_delay_ns, "implementation": dict(self.implementation),
            "error_all_sizes": self.error_all, "error_ge_1mib": self.error_1mib,
        }


def fit_astra(domain: str, points: list[tuple[str, int, np.ndarray, np.ndarray]],
              endpoint_delay_ns: float = DEFAULT_ENDPOINT_DELAY_NS, target: str = "the measurements") -> AstraFit:
    """Closest (bandwidth, latency, implementation per kind) for one Switch dimension.

    Points are (kind, n, bytes, measured seconds) series. For each combination of implementations,
    (latency, 1/bandwidth) come from non-negative least squares on relative error (sizes below
    1 MiB weighted 0.1); the combination
    with the lowest mean relative error over sizes >= 1 MiB wins (large messages dominate step time),
    ties broken on all sizes.
    """
    from scipy.optimize import nnls

    pts = [(normalize_kind(k), n, np.asarray(s, float), np.asarray(t, float)) for k, n, s, t in points]
    pts = [p for p in pts if p[0] in (*ASTRA_KINDS, "sendrecv")]
    if not pts:
        raise CalibError(f"network domain {domain}: no collective ASTRA-sim simulates was measured")
    kinds = sorted({k for k, *_ in pts if k in ASTRA_KINDS})
    pow2 = all(n > 1 and n & (n - 1) == 0 for k, n, *_ in pts if k == "allreduce")
    choices = [(*ASTRA_IMPLS, "halvingDoubling") if k == "allreduce" and pow2 else ASTRA_IMPLS for k in kinds]
    best: tuple | None = None
    for combo in itertools.product(*choices):
        impl = dict(zip(kinds, combo, strict=True))
        rows, ts = [], []
        for k, n, s, t in pts:
            rows.append(_astra_coeffs(k, n, s, impl.get(k, "ring"), endpoint_delay_ns, SWITCH_HOPS))
            ts.append(t * 1e9)
        c = np.vstack(rows)
        tm = np.concatenate(ts)
        sizes = np.concatenate([s for _, _, s, _ in pts])
        # Relative least squares; sizes below 1 MiB count a tenth (they are a small part of a step).
        w = np.where(sizes >= MIB, 1.0, 0.1)[:, None] ** 0.5
        a = c[:, :2] / tm[:, None] * w
        b = (1.0 - c[:, 2] / tm) * w[:, 0]
        sol, _ = nnls(a, b)
        lat, inv_bp = float(sol[0]), float(max(sol[1], 1e-12))
        pred = c[:, 0] * lat + c[:, 1] * inv_bp + c[:, 2]
        rel = np.abs(pred - tm) / tm
        big = sizes >= MIB
        key = (float(rel[big].mean()) if big.any() else float(rel.mean()), float(rel.mean()))
        if best is None or key < best[0]:
            best = (key, impl, lat, inv_bp, pred, tm, big)
    assert best is not None
    _, impl, lat, inv_bp, pred, tm, big = best
    bw_gbps = bytes_per_s_to_astra_bw_gbps(1e9 / inv_bp)
    return AstraFit(
        domain, float(bw_gbps), lat, endpoint_delay_ns, {k: impl.get(k, "ring") for k in ASTRA_KINDS}, "Switch",
        error_stat(pred, tm, f"in-sample, 2 parameters, against {target}").to_dict(),
        error_stat(pred[big], tm[big], f"in-sample, 2 parameters, against {target}, sizes >= 1 MiB").to_dict(),
    )


@dataclass
class CollectiveModel:
    """Fitted collective times: predict(kind, group_size, bytes) -> seconds."""

    series: dict[str, Series] = field(default_factory=dict)  # key "domain/kind/n"
    astra: dict[str, AstraFit | dict] = field(default_factory=dict)  # by domain
    gpus_per_node: int = 8
    bench_floor_s: dict[str, float] = field(default_factory=dict)  # by domain: alpha_bench - alpha (median)

    def set_bench_floor(self) -> None:
        """The microbenchmarks' extra latency per domain, from series measured both ways."""
        for dom in self.domains():
            both = [s.alpha_bench_s - s.alpha_s for s in self.series.values()
                    if s.domain == dom and s.has_trace and np.isfinite(s.alpha_bench_s)]
            self.bench_floor_s[dom] = float(np.median(both)) if both else 0.0
        for s in self.series.values():  # series without small training collectives: their latency
            if not s.has_trace and np.isfinite(s.alpha_bench_s):
                s.alpha_s = max(0.0, s.alpha_bench_s - self.bench_floor_s.get(s.domain, 0.0))

    @staticmethod
    def key(domain: str, kind: str, n: int) -> str:
        return f"{domain}/{kind}/{n}"

    def domains(self) -> list[str]:
        return sorted({s.domain for s in self.series.values()})

    def domain_for(self, group_size: int) -> str:
        return "intra" if group_size <= self.gpus_per_node else "inter"

    def _series_for(self, kind: str, group_size: int, domain: str) -> Series:
        k = normalize_kind(kind)
        exact = self.series.get(self.key(domain, k, group_size))
        if exact is not None:
            return exact
        same = [s for s in self.series.values() if s.domain == domain and s.kind == k]
        if not same:
            # Broadcast/reduce behave like one pass over the buffer: borrow all-reduce's series.
            same = [s for s in self.series.values() if s.domain == domain and s.kind == "allreduce"]
        if not same:
            have = ", ".join(sorted(self.series)) or "nothing"
            raise CalibError(f"network model has no {k} measurement in the {domain} domain (it has {have})")
        return min(same, key=lambda s: (abs(np.log(s.group_size / group_size)), -s.group_size))

    def alpha_for(self, s: Series) -> float:
        """The in-training latency of a series (see Series)."""
        if s.has_trace and np.isfinite(s.alpha_s):
            return s.alpha_s
        return max(0.0, s.alpha_bench_s - self.bench_floor_s.get(s.domain, 0.0))

    def predict(self, kind: str, group_size: int, nbytes: float | np.ndarray, domain: str | None = None
                ) -> float | np.ndarray:
        """Seconds for one collective (a float for a scalar size, an array for an array of sizes);
        sizes in the nccl-tests convention (module docstring)."""
        dom = domain or self.domain_for(int(group_size))
        s = self._series_for(kind, int(group_size), dom)
        arr = np.asarray(nbytes, dtype=float)
        out = s.predict(np.atleast_1d(arr), int(group_size), alpha_s=self.alpha_for(s))
        return float(out[0]) if arr.ndim == 0 else out.reshape(arr.shape)

    def astra_params(self) -> dict[str, dict]:
        return {d: (a.to_dict() if isinstance(a, AstraFit) else dict(a)) for d, a in self.astra.items()}

    def to_dict(self) -> dict:
        return {
            "form": "(alpha + bytes * bus_factor / busbw) * exp(clamped piecewise residual in log10 bytes); alpha "
                    "from profiled training collectives, alpha_bench from microbenchmarks (launch floor included)",
            "size_convention": "nccl-tests (all-gather: total output; reduce-scatter: total input)",
            "gpus_per_node": self.gpus_per_node,
            "bench_floor_s": dict(self.bench_floor_s),
            "series": {k: s.to_dict() for k, s in sorted(self.series.items())},
            "astra_sim": self.astra_params(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> CollectiveModel:
        return cls(
            {str(k): Series.from_dict(v) for k, v in (data.get("series") or {}).items()},
            {str(k): dict(v) for k, v in (data.get("astra_sim") or {}).items()},
            int(data.get("gpus_per_node", 8)),
            {str(k): float(v) for k, v in (data.get("bench_floor_s") or {}).items()},
        )
