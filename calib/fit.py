"""`calib fit`: measurement bundles -> Calibration (kernel, network, power models with held-out errors).

Cross-validation:
  kernel   k-fold over distinct shapes (a fold never holds a shape its training part saw), plus an
           extrapolation check: fit on the smaller 80% of shapes by work, predict the largest 20%.
  network  k-fold over message sizes within each (domain, kind, group size) series; the headline
           error is over held-out sizes >= 1 MiB. The ASTRA-sim simplification's error is in-sample
           (two parameters per domain cannot overfit) and says so.
  power    leave-one-configuration-out (RunSpec.key(): telemetry twins leave together) on the energy
           per step; with one configuration only, in-sample and labelled as such.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from calib.bundle.io import Bundle, check_bundle
from calib.bundle.schema import EVENT_TIMING_METHODS, KERNEL_BENCH_METHODS, KERNEL_TIMING_METHODS
from calib.calibration import Calibration
from calib.errors import CalibError
from calib.models.clock import CLOCK_EXPONENT, ClockModel, at_reference_clock, clock_points
from calib.models.common import (
    BENCH_SOURCES,
    EVENT_BENCH,
    KERNEL_BENCH,
    NO_MODEL,
    ErrorStat,
    cross_validate,
    error_stat,
    group_folds,
    kfold_indices,
)
from calib.models.kernel import (
    BYTES_NOT_TRAFFIC,
    OP_CLASSES,
    KernelModel,
    op_family,
    op_instances,
    shape_folds,
    shape_keys,
    shape_table,
)
from calib.models.memory import MemoryModel, MemoryPoint, memory_errors
from calib.models.network import (
    ASTRA_KINDS,
    MIN_SERIES_POINTS,
    CollectiveModel,
    Series,
    astra_collective_time_s,
    fit_astra,
    normalize_kind,
)
from calib.models.network_points import INSTANCE_KEY, host_repeats, merge_instances
from calib.models.peaks import GpuPeaks, peaks_for_gpu
from calib.models.power import PowerModel, PowerPoint, power_points
from calib.ops import (
    EMBEDDING_BWD,
    FLOP_CLASSES,
    INT32_SPAN_BYTES,
    is_split_k_reduce,
    kernel_layout,
    piece_counts,
    split_k_bytes,
)
from calib.stack import measured_stack
from calib.units import MIB
from calib.validation.measured import profiled_clock_hz

GOAL_PCT = {"kernel": 5.0, "network": 5.0, "power.energy_per_step": 5.0}
ASTRA_ENDPOINT_SOURCE = "configured: ASTRA-sim default endpoint delay (10 ns; smaller groups always use 10 ns)"


@dataclass
class FitOptions:
    folds: int = 5
    allow_mixed_gpus: bool = False
    gpu: str | None = None
    peaks: GpuPeaks | None = None
    min_kernel_points: int = 8
    replay_host: bool = False  # also fit the host launch cost of replays (minutes: replays every run)
    # False: fit the models only, without their error estimates (`calib validate`'s held-out fits,
    # which score the left-out runs themselves and would discard them); the parameters are the same.
    cross_validate: bool = True


def gpu_family(name: str) -> str:
    low = (name or "").lower()
    for fam in ("h200", "h100", "a100", "mi250", "mi300"):
        if fam in low:
            return fam
    return low.replace("nvidia", "").strip().replace(" ", "-") or "unknown"


def _ids(bundles: Sequence[Bundle]) -> str:
    return _short([b.id for b in bundles])


def _short(ids: Sequence[str], most: int = 4, noun: str = "bundles") -> str:
    """Bundle ids for a provenance line: all when few, else the first ones and a count (the
    calibration's `bundles` list has every id)."""
    ids = list(ids)
    if len(ids) <= most:
        return ", ".join(ids)
    return f"{', '.join(ids[:most])} and {len(ids) - most} more ({len(ids)} {noun})"


def select_bundles(bundles: Sequence[Bundle], opts: FitOptions) -> list[Bundle]:
    """Refuse failed/incomplete/unusable bundles and unannounced GPU mixes; apply --gpu."""
    if not bundles:
        raise CalibError("no bundles to fit (give bundle folders or folders that hold them)")
    for b in bundles:
        if b.manifest.status != "complete":
            raise CalibError(f"bundle {b.path} is a failed run: {b.manifest.failure or 'no reason recorded'}")
        problems = check_bundle(b)
        if problems:
            raise CalibError(f"bundle {b.path}: {problems[0]}")
    chosen = list(bundles)
    if opts.gpu:
        want = opts.gpu.lower()
        chosen = [b for b in chosen if want in b.manifest.gpu.name.lower() or want == gpu_family(b.manifest.gpu.name)]
        if not chosen:
            have = sorted({b.manifest.gpu.name for b in bundles})
            raise CalibError(f"no bundle was measured on GPU {opts.gpu!r} (the bundles have {', '.join(have)})")
    fams = sorted({gpu_family(b.manifest.gpu.name) for b in chosen})
    if len(fams) > 1 and not opts.allow_mixed_gpus:
        by = {f: next(b.id for b in chosen if gpu_family(b.manifest.gpu.name) == f) for f in fams}
        raise CalibError(
            "bundles from different GPU models (" + ", ".join(f"{f} e.g. {i}" for f, i in by.items())
            + "): fit one GPU at a time (--gpu NAME) or pass --allow-mixed-gpus"
        )
    return chosen


# ---- kernels ---------------------------------------------------------------------------------


def superseded_kernel_benches(bundles: Sequence[Bundle]) -> list[Bundle]:
    """Kernel microbenchmarks timed by CUDA events where a kernel-timed kernels bundle of the same GPU model is
    there too: the latter times the same shapes as the steps' kernels are timed, where an event pair around one
    call also times the host's dispatch of small kernels and ten calls back to back hold the GPU at its power cap
    (measure/kernels.py, IDLE_GAP_S). Not fitted."""
    timed = {gpu_family(b.manifest.gpu.name) for b in bundles if b.manifest.kind == "kernels" and b.manifest.timing_method == "kernel"}
    return [b for b in bundles if b.manifest.kind == "kernels" and b.manifest.timing_method == "events"
            and gpu_family(b.manifest.gpu.name) in timed]


def kernel_rows(bundles: Sequence[Bundle], peaks: GpuPeaks | None = None,
                instances: bool = False) -> tuple[pd.DataFrame, list[Bundle]]:
    """Compute-kernel rows (not communication) of kernel-microbenchmark and profiled training bundles, less the
    superseded microbenchmarks (`superseded_kernel_benches`); training steps' GEMM and attention rows at the top
    clock of `peaks` (`reference_clock_hz`: each bundle's configured peaks' without). `instances`: one row per
    op instance instead (calib.models.kernel.op_instances), found per bundle and kept with it (an instance
    never spans two bundles, and `calib validate` refits on nearly the same bundles again and again)."""
    frames, used = [], []
    superseded = {b.id for b in superseded_kernel_benches(bundles)}
    for b in bundles:
        if b.id in superseded:
            continue
        top = _top_clock_hz(peaks) if peaks is not None else reference_clock_hz(b.manifest.gpu.name)
        df = b.derived(("kernel_rows", top), lambda b=b, top=top: _kernel_frame(b, top))
        if df is not None and instances:
            df = b.derived(("kernel_instances", top), lambda df=df: op_instances(df))
        if df is not None:
            frames.append(df)
            used.append(b)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), used


def _kernel_frame(b: Bundle, top_clock_hz: float | None = None) -> pd.DataFrame | None:
    """One bundle's rows of `kernel_rows`, or None where it has none; steps' GEMM and attention rows at
    `top_clock_hz` (left at their runs' clocks without one)."""
    if b.manifest.kind not in ("kernels", "training") or not b.has("kernels"):
        return None
    df = b.table("kernels")
    if df.empty:
        return None
    keep = df["op_class"].astype(str).isin(OP_CLASSES) & ~df["name"].astype(str).str.startswith("nccl")
    keep &= pd.to_numeric(df["time_s"], errors="coerce") > 0
    df = df[keep]
    if df.empty:
        return None
    # Event-timed microbenchmarks carry the CUDA-event floor of a single launch, fitted apart from the
    # profiled steps' (back-to-back kernels); kernel-timed ones are rows of a converted profile, as the
    # steps' are: kernel names, split-K reductions and op instances are read as theirs.
    if b.manifest.kind == "kernels":
        method = b.manifest.timing_method
        if method not in KERNEL_BENCH_METHODS:
            raise CalibError(f"bundle {b.id}: kernels timed by {method!r}, which calib fit does not read "
                             f"(known: {', '.join(KERNEL_BENCH_METHODS)})")
        if method == "events":
            return df.assign(bundle=b.id, source=EVENT_BENCH, layout=memory_layouts(df, True))
        df = split_k_reductions(df)
        return df.assign(bundle=b.id, source=KERNEL_BENCH, layout=memory_layouts(df, False))
    df = embedding_shapes(reduction_shapes(split_k_reductions(df), b), b)
    df = shared_pieces(df).assign(bundle=b.id, source="trace", layout=memory_layouts(df, False))
    # The kernel model learns the steps' GEMM and attention kernels at the GPU's top clock: each run's profiled
    # step held its own clock under the power cap (calib.models.clock, reference `top`).
    return at_reference_clock(df, profiled_clock_hz(b), top_clock_hz)


def reference_clock_hz(gpu_name: str) -> float | None:
    """The top SM clock the kernel model's GEMM and attention times are at: the configured peaks' (None for a GPU
    calib has no peaks for, whose rows are then left at their runs' clocks)."""
    return _top_clock_hz(_maybe_peaks(gpu_name))


def _top_clock_hz(peaks: GpuPeaks | None) -> float | None:
    return peaks.max_sm_clock_hz if peaks is not None and peaks.max_sm_clock_hz > 0 else None


def split_k_reductions(kernels: pd.DataFrame) -> pd.DataFrame:
    """A profiled kernel table with cuBLAS's split-K reduction kernels recorded as the converter now
    records them (calib.ops.split_k_reduce_record: memory-bound over the GEMM's output), not with their
    GEMM's shape and FLOPs as tables converted before it have them (a 7 us reduction filed as a copy of
    the 160 us GEMM it finishes)."""
    if kernels.empty or not {"name", "op_class", "m", "n"} <= set(kernels.columns):
        return kernels
    mask = (kernels["op_class"].astype(str) == "gemm") & kernels["name"].map(is_split_k_reduce).astype(bool)
    if not mask.any():
        return kernels
    out = kernels.copy()
    m, n, batch = (pd.to_numeric(out.loc[mask, c], errors="coerce").to_numpy(float) if c in out.columns else np.nan
                   for c in ("m", "n", "batch"))
    out.loc[mask, "op_class"] = "memory"
    out.loc[mask, "bytes"] = split_k_bytes(m, n, batch)
    out.loc[mask, "flops"] = 0.0
    out.loc[mask, [c for c in ("m", "n", "k", "batch") if c in out.columns]] = np.nan
    return out


def reduction_shapes(kernels: pd.DataFrame, bundle: Bundle) -> pd.DataFrame:
    """A profiled kernel table with the reductions' shapes (m output elements, k reduced into each:
    calib.ops.reduction_shape) filled in where the converter did not record them (tables converted
    before it did) and the bundle's configuration says which they are: a memory-bound row of the aten
    op and dtype of one of the generated step's reductions (calib.workload.ops.reduction) whose bytes
    are that reduction's, or, for an expert's reduction (its rows follow the routing, which the
    generator balances), a whole number of its rows. A row that fits two reductions is left as it is."""
    spec = bundle.manifest.spec
    if spec is None or kernels.empty or not {"op_class", "aten_op", "dtype", "bytes", "m", "k"} <= set(kernels.columns):
        return kernels
    m, k, by = (pd.to_numeric(kernels[c], errors="coerce").to_numpy(float, copy=True) for c in ("m", "k", "bytes"))
    todo = (kernels["op_class"].astype(str).to_numpy() == "memory") & ~np.isfinite(m) & ~np.isfinite(k) & (by > 0)
    if not todo.any():
        return kernels  # converted since the converter records them: no step to generate
    known = _generated_reductions(spec)
    if not known:
        return kernels
    key = kernels["aten_op"].astype(str) + "|" + kernels["dtype"].astype(str)
    for (name, b), idx in pd.Series(np.flatnonzero(todo)).groupby([key.to_numpy()[todo], by[todo]]):
        found = {shape for op in known.get(name, ()) if (shape := op.rows_of(b)) is not None}
        if len(found) == 1:
            m[idx.to_numpy()], k[idx.to_numpy()] = next(iter(found))
    return kernels.assign(m=m, k=k)


def embedding_shapes(kernels: pd.DataFrame, bundle: Bundle) -> pd.DataFrame:
    """A profiled kernel table with the embedding backward's shape filled in from the bundle's
    configuration: m the indices it sums (a micro-batch's tokens), k the features of each (the hidden
    size), which its time follows (calib.models.kernel); the converter records only its bytes."""
    spec = bundle.manifest.spec
    if spec is None or kernels.empty or not {"aten_op", "m", "k"} <= set(kernels.columns):
        return kernels
    m, k = (pd.to_numeric(kernels[c], errors="coerce").to_numpy(float, copy=True) for c in ("m", "k"))
    rows = (kernels["aten_op"].astype(str).to_numpy() == EMBEDDING_BWD) & ~np.isfinite(m)
    if not rows.any():
        return kernels
    from calib.validation.engine import model_of

    model = model_of(spec)
    m[rows], k[rows] = spec.micro_batch * model.seq_length, model.hidden
    return kernels.assign(m=m, k=k)


def _generated_reductions(spec: object) -> dict[str, set]:
    """The generated step's reductions with a shape, by 'aten op|dtype' as the converter spells them."""
    from calib.validation.engine import model_of, parallel_of
    from calib.workload.generate import generate
    from calib.workload.ops import KnownReduction

    try:
        gen = generate(model_of(spec), parallel_of(spec), lambda t: np.zeros(len(t)))  # type: ignore[arg-type]
    except CalibError:
        return {}  # a configuration the generator refuses: its rows keep what the converter recorded
    out: dict[str, set] = {}
    for items in gen.templates.values():
        for r in filter(None, map(KnownReduction.of, items)):
            out.setdefault(r.key, set()).add(r)
    return out


PIECE_KEY = ("rank", "step", "stream", "name", "aten_op", "bytes")  # equal along one split op's pieces


def shared_pieces(kernels: pd.DataFrame) -> pd.DataFrame:
    """A profiled kernel table with every piece of a split op given its share of the op's bytes and
    FLOPs (index_piece_runs; unchanged for a table converted since the converter shares them)."""
    pieces = index_piece_runs(kernels)
    if (pieces == 1).all():
        return kernels
    return kernels.assign(**{c: pd.to_numeric(kernels[c], errors="coerce") / pieces
                             for c in ("bytes", "flops") if c in kernels.columns})


def index_piece_runs(kernels: pd.DataFrame) -> np.ndarray:
    """Per kernel row, how many pieces its op's bytes were split among (calib.ops.index_pieces):
    1, except in tables converted before the converter shared an op's bytes among its pieces, where
    a piece carries the whole op's. There the pieces are read off the table: back-to-back kernels of
    one name, op and size on one stream, as many (or a multiple: ops repeated back to back) as
    calib.ops.piece_counts allows for their bytes, the largest that fits the run. A table converted
    since gives every piece a share, and a share never splits again, so this finds nothing there."""
    out = np.ones(len(kernels))
    if kernels.empty or not set(PIECE_KEY) | {"op_class", "start_s"} <= set(kernels.columns):
        return out  # a table without kernel names and times (synthetic test bundles) has no pieces to find
    df = kernels.reset_index(drop=True)
    by = pd.to_numeric(df["bytes"], errors="coerce").fillna(0.0).to_numpy(float)
    ok = (by / 2 > INT32_SPAN_BYTES) & (df["op_class"].astype(str).to_numpy() == "memory")  # piece_counts[0] > 1
    ok[ok] = [not op_family(a).startswith("foreach_") for a in df["aten_op"].astype(str).to_numpy()[ok]]
    if not ok.any():
        return out
    pos = np.empty(len(df), dtype=np.int64)
    pos[df.sort_values(["rank", "step", "stream", "start_s"], kind="stable").index.to_numpy()] = np.arange(len(df))
    cand = np.flatnonzero(ok)
    cand = cand[np.argsort(pos[cand], kind="stable")]
    sub = df.loc[cand, list(PIECE_KEY)].astype(str)
    key = sub.agg("|".join, axis=1).to_numpy()
    i = 0
    while i < len(cand):
        j = i + 1
        while j < len(cand) and key[j] == key[i] and pos[cand[j]] == pos[cand[j - 1]] + 1:
            j += 1
        # The largest count that divides the run (ops repeated back to back make it a multiple).
        k = next((k for k in piece_counts(by[cand[i]]) if k > 1 and (j - i) % k == 0), 1)
        out[cand[i:j]] = k
        i = j
    return out


def memory_layouts(kernels: pd.DataFrame, bench: bool) -> np.ndarray:
    """Per kernel row, its memory-bound operand layout (calib.ops.kernel_layout of its kernel name),
    "" for other classes and for microbenchmark rows (named by their case, not by a kernel)."""
    if bench:
        return np.full(len(kernels), "", dtype=object)
    memory = kernels["op_class"].astype(str).to_numpy() == "memory"
    return np.where(memory, kernels["name"].map(kernel_layout).to_numpy(dtype=object), "")


def roofline_scored(shapes: pd.DataFrame) -> np.ndarray:
    """Shapes the roofline curves predict (with FLOPs or bytes, not _foreach_ chunks or indexing
    ops); the others are timed by measured medians and scored apart (kernel.no_work_ops)."""
    fl = np.nan_to_num(pd.to_numeric(shapes["flops"], errors="coerce").to_numpy(float), nan=0.0)
    by = np.nan_to_num(pd.to_numeric(shapes["bytes"], errors="coerce").to_numpy(float), nan=0.0)
    fam = [op_family(a) for a in shapes["aten_op"].astype(str)]
    multi = np.array([f.startswith("foreach_") or f in BYTES_NOT_TRAFFIC for f in fam], dtype=bool)
    return ((fl > 0) | (by > 0)) & ~multi


def fit_kernels(rows: pd.DataFrame, peaks: GpuPeaks, opts: FitOptions,
                instances: bool = False) -> tuple[KernelModel, dict[str, ErrorStat]]:
    """The kernel model on `rows` (`kernel_rows`; `instances`: its op-instance rows) and its cross-validated errors."""
    shapes, t, counts = shape_table(rows, instances)
    make = lambda: KernelModel(peaks=peaks, min_points=opts.min_kernel_points)  # noqa: E731
    model = make().fit(shapes, t)
    errors: dict[str, ErrorStat] = {}
    if not opts.cross_validate:
        return model, errors
    n = len(shapes)
    folds = shape_folds(shapes, opts.folds)  # a shape's bench and trace rows are held out together

    def fp(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        return make().fit(shapes.iloc[train], t[train]).predict(shapes.iloc[test])

    pred = cross_validate(n, folds, fp)
    # Shapes with FLOPs or bytes are what the roofline model predicts; ops without either (no data
    # movement the classifier could name) are predicted by a measured median and reported apart.
    has_work = roofline_scored(shapes)
    ok = np.isfinite(pred) & has_work
    method = f"{len(folds)}-fold over distinct shapes"
    errors["kernel"] = error_stat(pred[ok], t[ok], method)
    w = (counts * t)[ok]
    rel = np.abs(pred[ok] - t[ok]) / t[ok]
    if rel.size:
        errors["kernel.time_weighted"] = ErrorStat(
            float(100 * np.average(rel, weights=w)), float(100 * rel.max()), int(rel.size),
            method + ", each shape weighted by its share of the measured kernel time",
        )
    classes = shapes["op_class"].astype(str).to_numpy()
    for c in OP_CLASSES:
        sel = ok & (classes == c)
        if sel.any():
            errors[f"kernel.{c}"] = error_stat(pred[sel], t[sel], method)
    src = shapes["source"].astype(str).to_numpy() if "source" in shapes.columns else np.full(n, "trace")
    for name, what, sources in (("trace", "profiled training steps", ("trace",)),
                                 ("bench", "kernel microbenchmarks", BENCH_SOURCES)):
        sel = ok & np.isin(src, sources)
        if sel.any() and not sel.all():
            errors[f"kernel.{name}"] = error_stat(pred[sel], t[sel], f"{method}, {what} only")
    nowork = np.isfinite(pred) & ~has_work
    if nowork.any():
        errors["kernel.no_work_ops"] = error_stat(
            pred[nowork], t[nowork], method + ", ops without a roofline (no FLOPs/bytes, _foreach_ chunks, indexing): saturating curve or median")
    # Extrapolation: per class, the largest 20% of shapes by work predicted from the rest.
    work = np.where(np.isin(classes, FLOP_CLASSES), pd.to_numeric(shapes["flops"], errors="coerce"),
                    pd.to_numeric(shapes["bytes"], errors="coerce"))
    work = np.nan_to_num(np.asarray(work, dtype=float), nan=0.0)
    big = np.zeros(n, dtype=bool)
    for c in OP_CLASSES:
        sel = (classes == c) & (work > 0)
        if sel.sum() >= 2 * opts.min_kernel_points:
            big |= sel & (work >= np.quantile(work[sel], 0.8))
    if big.any():
        try:
            ext = make().fit(shapes[~big], t[~big]).predict(shapes[big])
            # Scored on the roofline shapes, as `kernel` is: an indexing op's median says nothing of extrapolation.
            sc = has_work[big]
            errors["kernel.extrapolation"] = error_stat(
                ext[sc], t[big][sc], "fit on the smaller 80% of shapes by work per class, predict the largest 20% "
                "(roofline shapes scored)"
            )
        except CalibError:
            pass
    errors.update(_label_holdouts(rows, shapes, t, make))
    return model, errors


_TP_LABEL = re.compile(r"(?:^|/)tp(\d+)(?:/|$)")


def _label_holdouts(rows: pd.DataFrame, shapes: pd.DataFrame, t: np.ndarray, make: object) -> dict[str, ErrorStat]:
    """Extrapolation checks from the microbenchmark labels ("<model>/tp<N>/tokens<T>/<role>/<pass>"):
    predict the TP=1 shapes (the largest per model) from the TP>1 ones, and the largest model's
    shapes from the other models'. A shape that also occurs in the training part is not scored."""
    out: dict[str, ErrorStat] = {}
    # A kernel-timed microbenchmark's rows are named by their kernels; its `case` column holds the label.
    label = rows["name"].astype(str)
    if "case" in rows.columns:
        label = rows["case"].where(rows["case"].notna(), label).astype(str)
    has = label.str.contains("/tp", regex=False)
    labelled, label = rows[has], label[has]
    if labelled.empty:
        return out
    pairs = pd.DataFrame({"key": shape_keys(labelled).to_numpy(), "name": label.to_numpy()})
    pairs = pairs.drop_duplicates()
    order = {k: i for i, k in enumerate(shape_keys(shapes).to_numpy())}
    tps: dict[int, set[int]] = {}
    models: dict[int, set[str]] = {}
    for key, name in zip(pairs["key"], pairs["name"], strict=True):
        i = order[key]
        m = _TP_LABEL.search(name)
        if m:
            tps.setdefault(i, set()).add(int(m.group(1)))
            models.setdefault(i, set()).add(name.split("/")[0])
    n = len(shapes)

    classes = shapes["op_class"].astype(str).to_numpy()

    def check(test: np.ndarray, train: np.ndarray, label: str, method: str) -> None:
        # Only classes the labelled training shapes have: a kernel-timed case's split-K reduction or fill is
        # labelled by its case too, and nothing labelled of its class may be there to extrapolate from.
        test = test & np.isin(classes, np.unique(classes[train]))
        if test.sum() < 3 or train.sum() < 8:
            return
        try:
            pred = make().fit(shapes[train], t[train]).predict(shapes[test])  # type: ignore[operator]
        except CalibError:
            return
        out[label] = error_stat(pred, t[test], method)

    only1 = np.array([tps.get(i) == {1} for i in range(n)])
    no1 = np.array([bool(tps.get(i)) and 1 not in tps[i] for i in range(n)])
    check(only1, no1, "kernel.tp1_from_other_tp", "fit on TP 2/4/8 microbenchmark shapes, predict the TP 1 shapes")
    sizes = labelled.groupby(label.str.split("/").str[0].to_numpy())["flops"].max()
    if len(sizes) >= 2:
        biggest = str(sizes.idxmax())
        test = np.array([models.get(i) == {biggest} for i in range(n)])
        train = np.array([bool(models.get(i)) and biggest not in models[i] for i in range(n)])
        check(test, train, "kernel.largest_model", f"fit on the other models' shapes, predict {biggest}'s")
    return out


# ---- collectives -----------------------------------------------------------------------------


def _domain(b: Bundle, n: int) -> str:
    nodes = int((b.manifest.notes or {}).get("nodes", 1) or 1)
    per_node = b.manifest.gpu.count or n
    return "intra" if nodes <= 1 or n <= per_node else "inter"


def _kind_or_none(kind: object) -> str | None:
    try:
        return normalize_kind(str(kind))
    except CalibError:
        return None


def timed_by_events(b: Bundle) -> bool:
    """Whether a collectives bundle timed its calls with CUDA events rather than by their NCCL kernels; a method
    calib does not know is an error, not a guess at the latency its points carry."""
    method = b.manifest.timing_method
    if method not in KERNEL_TIMING_METHODS + EVENT_TIMING_METHODS:
        raise CalibError(f"{b.id}: collectives timed by an unknown method {method!r} "
                         f"(known: {', '.join(KERNEL_TIMING_METHODS + EVENT_TIMING_METHODS)})")
    return method not in KERNEL_TIMING_METHODS


def timed_in_loop(b: Bundle) -> bool:
    """Whether an event-timed collectives bundle timed a loop of back-to-back calls (notes.iters > 1),
    whose per-call time is the longer of the host's launch interval and the kernel (Series)."""
    try:
        return int((b.manifest.notes or {}).get("iters") or 1) > 1
    except (TypeError, ValueError):
        return False


def collective_points(bundles: Sequence[Bundle]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(microbenchmark points, training transfer points): domain, kind, group_size, bytes, time_s, bundle
    and events (timed by CUDA events around the call, so with a launch floor: see timed_by_events).

    time_s is the transfer part (transfer_s) where the bundle has it, else the whole time_s; a
    training call's member ranks make one point (calib.models.network_points)."""
    micro, train = [], []
    for b in bundles:
        out = b.derived("collective_points", lambda b=b: _collective_frame(b))
        if out is not None:
            (micro if b.manifest.kind == "collectives" else train).append(out)
    cat = lambda xs: pd.concat(xs, ignore_index=True) if xs else pd.DataFrame()  # noqa: E731
    return cat(micro), cat(train)


def _collective_frame(b: Bundle) -> pd.DataFrame | None:
    """One bundle's points of `collective_points`, or None where it has none."""
    if not b.has("collectives"):
        return None
    df = b.table("collectives")
    if df.empty:
        return None
    # The transfer part (the member that arrived last, so waited least) is what the simulator
    # needs: waiting for late peers comes out of its dependencies. time_s where it is missing.
    t = pd.to_numeric(df["time_s"], errors="coerce")
    if "transfer_s" in df.columns:
        tr = pd.to_numeric(df["transfer_s"], errors="coerce")
        t = tr.where(tr > 0, t)
    ok = (t > 0) & (pd.to_numeric(df["group_size"], errors="coerce") > 1) & (pd.to_numeric(df["bytes"], errors="coerce") > 0)
    kinds = [_kind_or_none(k) for k in df["kind"]]
    ok &= pd.Series([k is not None for k in kinds], index=df.index)  # barriers etc. carry no data
    df = df[ok]
    if df.empty:
        return None
    out = pd.DataFrame({
        "kind": [k for k, keep in zip(kinds, ok, strict=True) if keep],
        "group_size": df["group_size"].astype(int).to_numpy(),
        "bytes": df["bytes"].astype(float).to_numpy(),
        "time_s": t[ok].astype(float).to_numpy(),
        "bundle": b.id,
        "events": b.manifest.kind == "collectives" and timed_by_events(b),
        "loop": b.manifest.kind == "collectives" and timed_by_events(b) and timed_in_loop(b),
    })
    out["domain"] = [_domain(b, int(n)) for n in out["group_size"]]
    if b.manifest.kind != "collectives":  # one point per NCCL call, not per member rank
        for col in INSTANCE_KEY:
            if col in df.columns:
                out[col] = df[col].to_numpy()
        out = merge_instances(out)
    return out


def _series_points(micro: pd.DataFrame, train: pd.DataFrame) -> dict[tuple[str, str, int], pd.DataFrame]:
    """Median time per (domain, kind, group size, bytes, source, timing), grouped by series: `bench`
    says microbenchmark or training, `events` which latency the point carries and `loop` whether it
    is a call of an event-timed loop (Series.fit)."""
    parts = [d.assign(bench=flag) for d, flag in ((micro, True), (train, False)) if not d.empty]
    pts = pd.concat(parts, ignore_index=True)
    pts["loop"] = pts["loop"].fillna(False).astype(bool) if "loop" in pts.columns else False
    agg = pts.groupby(["domain", "kind", "group_size", "bytes", "bench", "events", "loop"], as_index=False)["time_s"].median()
    return {(d, k, int(n)): g.sort_values("bytes").reset_index(drop=True)
            for (d, k, n), g in agg.groupby(["domain", "kind", "group_size"])}


def network_fold_predictions(fits: dict[tuple[str, str, int], pd.DataFrame], model: CollectiveModel,
                             folds: int) -> pd.DataFrame:
    """Out-of-fold predictions of the collective series (`fits`: their points by (domain, kind, group
    size); `model`: fitted on all of them, for the training-step latencies): k-fold over each series'
    distinct sizes, a held-out size left out of both sources. Columns series, bench, bytes, pred, meas."""
    rows = []
    for (dom, kind, n), g in fits.items():
        sizes = np.unique(g["bytes"].to_numpy(float))
        if len(sizes) < MIN_SERIES_POINTS + 1:
            continue
        for fold in kfold_indices(len(sizes), folds):
            test = g["bytes"].isin(sizes[fold]).to_numpy()
            tr = g[~test]
            try:
                ser = Series.fit(dom, kind, n, tr["bytes"].to_numpy(float), tr["time_s"].to_numpy(float),
                                 bench=tr["events"].to_numpy(bool), loop=tr["loop"].to_numpy(bool),
                                 micro=tr["bench"].to_numpy(bool))
            except CalibError:
                continue
            te = g[test]
            for (bench, events, loop), part in te.groupby(["bench", "events", "loop"]):
                alpha = None if events and not (loop and np.isfinite(ser.alpha_loop_s)) else model.alpha_for(ser)
                p = ser.predict(part["bytes"].to_numpy(float), bench=bool(events), alpha_s=alpha, loop=bool(loop))
                rows.append(pd.DataFrame({"series": f"{dom}/{kind}/{n}", "bench": bool(bench),
                                          "bytes": part["bytes"].to_numpy(float), "pred": p,
                                          "meas": part["time_s"].to_numpy(float)}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def fit_network(micro: pd.DataFrame, train: pd.DataFrame, gpus_per_node: int, opts: FitOptions
                ) -> tuple[CollectiveModel, dict[str, ErrorStat], list[str]]:
    """Series per (domain, kind, group size) from microbenchmarks and training collectives together
    (each source with its own latency, see calib.models.network.Series); k-fold over message sizes
    (a held-out size is held out from both sources); the ASTRA-sim fit per domain."""
    series_pts = _series_points(micro, train)
    model = CollectiveModel(gpus_per_node=gpus_per_node)
    skipped: list[str] = []
    fits: dict[tuple[str, str, int], pd.DataFrame] = {}
    for (dom, kind, n), g in series_pts.items():
        try:
            model.series[model.key(dom, kind, n)] = Series.fit(
                dom, kind, n, g["bytes"].to_numpy(float), g["time_s"].to_numpy(float), bench=g["events"].to_numpy(bool),
                loop=g["loop"].to_numpy(bool), micro=g["bench"].to_numpy(bool))
            fits[(dom, kind, n)] = g
        except CalibError:
            skipped.append(f"{dom}/{kind}/{n} ({g['bytes'].nunique()} size(s))")
    if not model.series:
        raise CalibError(
            f"network model: too few message sizes to fit any collective (need {MIN_SERIES_POINTS} per kind and "
            f"group size; have {', '.join(skipped) or 'none'})"
        )
    model.set_bench_floor()
    errors: dict[str, ErrorStat] = {}
    cv = network_fold_predictions(fits, model, opts.folds) if opts.cross_validate else pd.DataFrame()
    if not cv.empty:
        method = f"{opts.folds}-fold over message sizes within each kind and group size"
        big = cv["bytes"] >= MIB
        errors["network"] = error_stat(cv["pred"][big], cv["meas"][big], method + ", sizes >= 1 MiB")
        errors["network.all_sizes"] = error_stat(cv["pred"], cv["meas"], method + ", all sizes")
        for bench, name, what in ((False, "trace", "collectives in profiled training steps"),
                                  (True, "bench", "collective microbenchmarks")):
            sel = big & (cv["bench"] == bench)
            if sel.any():
                errors[f"network.{name}"] = error_stat(cv["pred"][sel], cv["meas"][sel], f"{method}, sizes >= 1 MiB, {what}")
    for dom in model.domains():
        # Fit ASTRA-sim's closed forms to the collective model's in-training times at the measured
        # sizes; judge them against the measured training transfers where there are some.
        pts = []
        for (d, k, n), g in fits.items():
            if d != dom:
                continue
            sizes = np.unique(g["bytes"].to_numpy(float))
            pts.append((k, n, sizes, np.asarray(model.predict(k, n, sizes, domain=d), dtype=float)))
        try:
            fit = fit_astra(dom, pts, target="the collective model at the measured sizes")
        except CalibError as exc:
            skipped.append(f"ASTRA-sim {dom}: {exc}")
            continue
        model.astra[dom] = fit
        errors[f"network.astra_sim.{dom}"] = ErrorStat.from_dict(fit.error_1mib)
        errors[f"network.astra_sim.{dom}.all_sizes"] = ErrorStat.from_dict(fit.error_all)
        measured = [(k, n, g[~g["bench"]]) for (d, k, n), g in fits.items() if d == dom]
        p_all, m_all, s_all = [], [], []
        for k, n, g in measured:
            if g.empty or k not in (*ASTRA_KINDS, "sendrecv"):
                continue
            s_ = g["bytes"].to_numpy(float)
            p_all.append(astra_collective_time_s(k, n, s_, fit.bandwidth_gbps, fit.latency_ns, fit.implementation.get(k, "ring"),
                                                 fit.endpoint_delay_ns))
            m_all.append(g["time_s"].to_numpy(float))
            s_all.append(s_)
        if p_all:
            p_, m_, s_ = np.concatenate(p_all), np.concatenate(m_all), np.concatenate(s_all)
            big = s_ >= MIB
            if big.any():
                errors[f"network.astra_sim.{dom}.vs_training"] = error_stat(
                    p_[big], m_[big], "ASTRA-sim parameters against measured training collectives, sizes >= 1 MiB")
    return model, errors, skipped


# ---- power -----------------------------------------------------------------------------------


def fit_power(bundles: Sequence[Bundle], peaks: GpuPeaks | None
              ) -> tuple[PowerModel | None, dict[str, ErrorStat], list[str], list[str], list[str]]:
    """(model or None, errors, bundle ids used, bundles skipped with why, ids of the used bundles whose
    profiled steps recorded GEMM or attention FLOPs: the only ones the FLOP term is fitted on)."""
    points: list[PowerPoint] = []
    idle: list[float] = []
    used: list[str] = []
    skipped: list[str] = []
    for b in bundles:
        p, i, why = power_points(b)
        if p:
            used.append(b.id)
        if why:
            skipped.append(why)
        points += p
        idle += i
    if not points:
        return None, {}, used, skipped, []
    with_flops = list(dict.fromkeys(p.bundle for p in points if p.flops_per_s > 0))
    max_clock = peaks.max_sm_clock_hz if peaks else float("nan")
    limits = [b.manifest.gpu.power_limit_w for b in bundles if b.id in used and b.manifest.gpu.power_limit_w > 0]
    limit = float(min(limits)) if limits else float("nan")
    model = PowerModel.fit(points, idle, max_clock, power_limit_w=limit)
    configs = [p.config for p in points]
    errors: dict[str, ErrorStat] = {}
    folds = group_folds(configs)
    uniq = list(dict.fromkeys(configs))
    meas = np.array([sum(p.energy_per_step_j for p in points if p.config == c) for c in uniq])
    if len(folds) >= 2:
        pred = []
        for c in uniq:
            train = [p for p in points if p.config != c]
            try:
                m = PowerModel.fit(train, idle, max_clock, min_points=min(4, len(train)), power_limit_w=limit)
            except CalibError:
                pred.append(np.nan)
                continue
            pred.append(_predicted_energy_j(m, [p for p in points if p.config == c]))
        pred_a = np.array(pred)
        ok = np.isfinite(pred_a)
        errors["power.energy_per_step"] = error_stat(pred_a[ok], meas[ok], "leave-one-configuration-out, all GPUs of a run")
    else:
        pred_a = np.array([_predicted_energy_j(model, points)])
        errors["power.energy_per_step"] = error_stat(pred_a, meas, "in-sample (only one configuration has telemetry)")
    return model, errors, used, skipped, with_flops


def _predicted_energy_j(model: PowerModel, points: Sequence[PowerPoint]) -> float:
    """The model's energy of one step summed over these GPU windows, each at its own shares and FLOP rate."""
    return sum(model.energy_j(p.step_time_s, p.shares, p.flops_per_s * p.step_time_s) for p in points)


# ---- everything ------------------------------------------------------------------------------


def fit_calibration(bundles: list[Bundle], opts: FitOptions | None = None, **kw: object) -> Calibration:
    """Fit every model the bundles have data for; raise CalibError (nothing written) on bad input."""
    opts = opts or FitOptions(**kw)  # type: ignore[arg-type]
    chosen = select_bundles(bundles, opts)
    gpu_name = chosen[0].manifest.gpu.name
    names = sorted({b.manifest.gpu.name for b in chosen})
    cal = Calibration(gpu=" + ".join(names) if len(names) > 1 else gpu_name, created_utc=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    try:
        from importlib.metadata import version

        cal.calib_version = version("calib")
    except Exception:  # noqa: BLE001 - not installed as a package: leave it empty
        cal.calib_version = ""
    cal.bundles = [
        {"id": b.id, "sha256": b.sha256(), "kind": b.manifest.kind, "gpu": b.manifest.gpu.name,
         "config": b.manifest.spec.key() if b.manifest.spec else ""}
        for b in chosen
    ]
    cal.software = measured_stack(chosen)
    prov = cal.provenance
    if len(names) > 1:
        prov["gpu"] = f"configured: mixed on request (--allow-mixed-gpus): {', '.join(names)}; roofline peaks of {gpu_name}"

    # One set of peaks for the roofline, the rows' and the clock model's top clock and the NVLink domain: the
    # user's (--peaks) or the configured ones of the GPU.
    peaks = opts.peaks or _maybe_peaks(gpu_name)
    rows, kb = kernel_rows(chosen, peaks, instances=True)
    if not rows.empty:
        peaks = peaks or peaks_for_gpu(gpu_name)
        kmodel, kerr = fit_kernels(rows, peaks, opts, instances=True)
        cal.kernel = kmodel.to_dict()
        cal.errors.update(kerr)
        prov["kernel.peaks"] = f"configured: {peaks.source}"
        prov["kernel.classes"] = f"calibrated: {len(kmodel.groups_)} curves ({_short(list(kmodel.groups_), 6, 'curves')}) from {_ids(kb)}"
        superseded = superseded_kernel_benches(chosen)
        if superseded:
            prov["kernel.superseded"] = (f"not fitted: {_ids(superseded)} (kernel microbenchmarks timed by CUDA events; a "
                                         "kernel-timed kernels bundle of the same GPU times the same shapes kernel by kernel)")
        if kmodel.constants_:
            prov["kernel.constants_s"] = f"calibrated: {len(kmodel.constants_)} measured medians from {_ids(kb)}"
        if kmodel.saturating_:
            prov["kernel.saturating"] = f"calibrated: {len(kmodel.saturating_)} per-op curves from {_ids(kb)}"
        for c in OP_CLASSES:
            if c not in kmodel.groups_ and not any(k.startswith(c) for k in kmodel.constants_):
                prov[f"kernel.classes.{c}"] = "not calibrated: predicted with a related class (no kernels of its own)"
    else:
        prov["kernel"] = "not calibrated: no kernel rows in the bundles"

    micro, train = collective_points(chosen)
    if not micro.empty or not train.empty:
        # The NVLink domain is the board's NVSwitch (8 GPUs on HGX/DGX H100/H200, configured),
        # not the GPUs one run happened to use.
        pk = peaks
        per_node = max([b.manifest.gpu.count for b in chosen] + [pk.gpus_per_node if pk else 0]) or 8
        nmodel, nerr, skipped = fit_network(micro, train, per_node, opts)
        cal.network = nmodel.to_dict()
        if skipped:
            cal.network["skipped"] = skipped
        cal.errors.update(nerr)
        rep = host_repeats(chosen)
        if not rep.empty:
            cal.errors["network.host_repeat"] = error_stat(
                rep["again"].to_numpy(float), rep["first"].to_numpy(float),
                f"{NO_MODEL}: a microbenchmark harness run again on another host against its first run, "
                f"sizes >= 1 MiB ({', '.join(sorted(set(rep['harness'])))}); the floor under `network` at those sizes")
        src = sorted(set(pd.concat([d for d in (micro, train) if not d.empty])["bundle"]))
        prov["network.series"] = f"calibrated: {len(nmodel.series)} series ({_short(list(nmodel.series), 6, 'series')}) from {_short(src)}"
        for dom in nmodel.astra:
            prov[f"network.astra_sim.{dom}"] = f"calibrated: {_short(src)}"
            prov[f"network.astra_sim.{dom}.endpoint_delay_ns"] = ASTRA_ENDPOINT_SOURCE
        prov["network.gpus_per_node"] = (f"configured: {pk.source}; HGX/DGX board of {pk.gpus_per_node} GPUs" if pk
                                         else "calibrated: largest GPU count of a bundle")
        if "inter" not in nmodel.astra:
            prov["network.astra_sim.inter"] = "not calibrated: no bundle measured collectives across nodes"
    else:
        prov["network"] = "not calibrated: no collectives in the bundles"

    pmodel, perr, pused, pskipped, pflops = fit_power(chosen, peaks)
    if pmodel is not None:
        cal.power = pmodel.to_dict()
        if pskipped:
            cal.power["skipped"] = pskipped
        cal.errors.update(perr)
        ids = _short(pused)
        prov["power.power_by_activity_w"] = f"calibrated: {ids}"
        prov["power.energy_per_flop_j"] = (
            f"calibrated: {_short(pflops)}" if pflops else
            "not calibrated: no profiled step recorded GEMM or attention FLOPs (the term is 0)")
        for act in pmodel.unmeasured:
            prov[f"power.power_by_activity_w.{act}"] = f"not calibrated: no run had {act} activity; the idle power is used"
        prov["power.peak_power_w"] = f"calibrated: {ids}"
        prov["power.throttle_factor"] = f"calibrated: {ids}"
        prov["power.max_sm_clock_hz"] = (f"configured: {peaks.source}" if peaks else
                                         f"calibrated: {ids} (largest clock seen)")
        _fit_clock_section(cal, chosen, peaks)
    else:
        prov["power"] = "not calibrated: no training bundle with telemetry and profiled kernels"

    _fit_host_section(cal, chosen, opts)
    _fit_memory_section(cal, chosen)

    if not (cal.kernel or cal.network or cal.power):
        raise CalibError(f"nothing to fit in {_ids(chosen)}: no kernels, collectives or telemetry")
    return cal


def _fit_clock_section(cal: Calibration, chosen: list[Bundle], peaks: GpuPeaks | None) -> None:
    """The SM clock's slowdown under the power cap (calib.models.clock), kept in the power section; fitted before
    the host model, which it moves (the host fit times each run at its own clock). With peaks: against the top clock
    (the kernel rows' reference) and the GEMM FLOP rate over the bf16 peak; without: the legacy ratio and share."""
    top = _top_clock_hz(peaks)
    try:
        if top and peaks is not None:
            peak_flops = peaks.flops_for("bf16")
            points = clock_points(chosen, top, CLOCK_EXPONENT, peak_flops)
            clock, err = ClockModel.fit(points, "top", CLOCK_EXPONENT, top, "gemm_flop_rate", peak_flops)
        else:
            points = clock_points(chosen)
            clock, err = ClockModel.fit(points)
    except CalibError as exc:
        cal.provenance["power.clock"] = f"not calibrated: {exc}"
        return
    cal.power["clock"] = clock.to_dict()
    cal.errors["power.clock_slowdown"] = err
    what = "calibrated" if clock.slows else "calibrated flat (no slowdown: the hinge did no better held out)"
    cal.provenance["power.clock"] = f"{what}: {_short([p.bundle for p in points])}"


def memory_points(bundles: Sequence[Bundle]) -> list[MemoryPoint]:
    """One point per complete GPU training bundle that recorded its ranks' memory."""
    from calib.validation.engine import model_of, parallel_of
    from calib.workload.memory import estimate

    points = []
    for b in bundles:
        mem, spec = b.manifest.memory, b.manifest.spec
        if b.manifest.kind != "training" or spec is None or not mem or b.manifest.gpu.vendor == "cpu":
            continue
        allocated = max(m.peak_allocated_bytes for m in mem)
        if allocated <= 0:
            continue
        outside = [m.outside_allocator_bytes for m in mem if m.device_used_bytes > 0]
        # What a process may use (the probes' cudaMemGetInfo total, since round 15) where recorded,
        # else the device's total memory, 0.5 GiB more on the H100.
        usable = [int(p.get("total_bytes") or 0) for m in mem for p in m.probes]
        capacity = min((t for t in usable if t > 0), default=int(b.manifest.gpu.memory_bytes or 0))
        est = estimate(model_of(spec), parallel_of(spec), float(capacity))
        points.append(MemoryPoint(b.id, spec.key(), est.total_bytes, float(allocated),
                                  float(max(m.peak_reserved_bytes for m in mem)),
                                  float(max(outside)) if outside else None, float(capacity),
                                  spec.tp * spec.pp * spec.dp))
    return points


def _fit_memory_section(cal: Calibration, chosen: list[Bundle]) -> None:
    """The allocator's reserve and the memory outside it (calib.models.memory), for the verdict."""
    points = memory_points(chosen)
    try:
        model = MemoryModel.fit(points)
    except CalibError as exc:
        cal.provenance["memory"] = f"not calibrated: {exc}"
        return
    errors, held = memory_errors(points)
    cal.memory = {**model.to_dict(), "held_out": held}
    cal.errors.update(errors)
    cal.provenance["memory.reserve_ratio"] = f"calibrated: {_short(model.bundles)}"
    if model.capacity_bytes > 0:
        cal.provenance["memory.capacity_bytes"] = f"calibrated: the device total CUDA reported in {_short(model.bundles)}"
    with_outside = [p.bundle for p in points if p.outside_bytes is not None]
    counts = ", ".join(f"{n} GPU(s) {v / 2**30:.2f} GiB" for n, v in model.outside_by_gpus.items())
    cal.provenance["memory.outside_allocator_bytes"] = (
        f"calibrated: the most of a run's ranks per GPU count ({counts}; a count between two measured ones takes "
        f"the lower's, one beyond the largest the largest's) from {_short(with_outside)}" if with_outside else
        "not calibrated: no bundle recorded the memory outside torch's allocator (measured from the "
        "twenty-fifth session on); counted as 0")


def _fit_host_section(cal: Calibration, chosen: list[Bundle], opts: FitOptions) -> None:
    """The host model (calib.models.host), fitted last: it simulates each training bundle's
    generated step with the kernel and network models fitted above."""
    from calib.models.host import fit_host, fit_replay_launch

    prov = cal.provenance
    if not cal.kernel or not any(b.manifest.kind == "training" for b in chosen):
        prov["host"] = "not calibrated: no training bundles (launches cost nothing: GPU-bound steps)"
        return
    try:
        host, err = fit_host(chosen, cal.kernel_model(), cal, cross_validate=opts.cross_validate)
        if opts.replay_host:
            host, rerr = fit_replay_launch(chosen, cal, host)
            cal.errors["host.replay"] = ErrorStat.from_dict(rerr)
    except CalibError as exc:
        prov["host"] = f"not calibrated: {exc}"
        return
    cal.host = host.to_dict()
    if err:
        cal.errors["host"] = ErrorStat.from_dict(err)
    prov.update(host.provenance)


def _maybe_peaks(name: str) -> GpuPeaks | None:
    try:
        return peaks_for_gpu(name)
    except CalibError:
        return None
