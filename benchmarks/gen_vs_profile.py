"""Generator fidelity: the generated step against the profiled one, kernel by kernel.

For every real training bundle (default traces/h200) and every pipeline stage's representative rank
(tp 0, dp 0), the profiled step's GPU kernels (the converted ET `et/rank.N.et.xz`: one node per
kernel with `op_class`, `aten_op`, `duration_ns`; the profiled step covers one optimizer step with
all its micro-batches) are set against the generated workload of the bundle's spec
(calib.validation.engine.model_of / parallel_of, calib.workload.generate.generate with the
calibration's kernel model, as calib.models.host.prepare_run builds it):
- launches: compute kernels plus collectives, send and receive (what the host model charges a launch
  for); generated compute ops count `repeat` times (a foreach op's chunks);
- GPU time of the compute kernels: measured (profiled), generated (kernel model on the generated ops),
  and the kernel model on the profiled kernels' own records (kernels.parquet), which separates the
  templates' share of the difference from the kernel model's;
- the same per op_class and per aten_op, sorted by the largest deviation;
- device-to-host copies: the profiled step's against the generated step's (GeneratedStep.device_to_host_copies;
  the host waits once per MoE routing's copies and once per scalar read, in both: docs/host.md).

    python benchmarks/gen_vs_profile.py [BUNDLE_DIRS...] [--calibration FILE] [--out DIR] [--top N]

Writes DIR/gen_vs_profile_runs.csv (one row per run and stage), DIR/gen_vs_profile_ops.csv (per run,
stage, op_class and aten_op) and DIR/gen_vs_profile.json (both), atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: this checkout's calib
    sys.path.insert(0, str(ROOT))

from calib.ops import GEMM_OPS  # noqa: E402 - after the path line above


@dataclass
class StageCompare:
    """One run's one pipeline stage: op table (per op_class, aten_op) and launch counts."""

    run: str
    stage: int
    rank: int
    ops: pd.DataFrame  # op_class, aten_op, prof_n, prof_s, gen_n, gen_s, model_prof_s
    prof_comm: int  # collectives, sends and receives in the profiled ET
    gen_comm: int
    prof_dtoh: int = 0  # device-to-host copies in the profiled ET
    gen_syncs: int = 0  # the generated step's device-to-host copies (calib.workload.host.SYNC_AFTER ops' kernels)

    def summary(self) -> dict:
        o = self.ops
        row = {"run": self.run, "stage": self.stage, "rank": self.rank,
               "prof_kernels": int(o.prof_n.sum()), "gen_kernels": int(o.gen_n.sum()),
               "prof_comm": self.prof_comm, "gen_comm": self.gen_comm,
               "prof_dtoh": self.prof_dtoh, "gen_syncs": self.gen_syncs}
        row["prof_launches"] = row["prof_kernels"] + self.prof_comm
        row["gen_launches"] = row["gen_kernels"] + self.gen_comm
        row["launch_dev_pct"] = 100.0 * (row["gen_launches"] - row["prof_launches"]) / max(row["prof_launches"], 1)
        # cuBLAS's own memsets before some GEMMs (recorded under the GEMM's aten op, memory class): which
        # GEMMs get one follows cuBLAS's kernel choice, which the templates do not know
        aux = int(o[(o.op_class == "memory") & o.aten_op.isin(GEMM_OPS)].prof_n.sum())
        row["prof_gemm_memsets"] = aux
        row["launch_dev_no_memset_pct"] = 100.0 * (row["gen_launches"] - row["prof_launches"] + aux) / max(
            row["prof_launches"] - aux, 1)
        for c in ("prof_s", "gen_s", "model_prof_s"):
            row[c] = float(o[c].sum())
        row["gpu_dev_pct"] = 100.0 * (row["gen_s"] - row["prof_s"]) / row["prof_s"] if row["prof_s"] else float("nan")
        for cls in ("gemm", "memory", "attention", "other"):
            part = o[o.op_class == cls]
            row[f"{cls}_prof_s"] = float(part.prof_s.sum())
            row[f"{cls}_gen_s"] = float(part.gen_s.sum())
        return row


def profiled_ops(bundle, rank: int) -> tuple[pd.DataFrame, int, int]:
    """(per aten_op: prof_n, prof_s, model-ready records of every kernel; communication node count;
    device-to-host copies) of `rank`'s converted ET."""
    from calib.chakra.codec import read_et
    from calib.chakra.model import NodeType
    from calib.errors import CalibError

    path = next((p for p in bundle.et_files() if p.name.startswith(f"rank.{rank}.")), None)
    if path is None:
        raise CalibError(f"{bundle.path}: et/ has no ET of rank {rank} (the profiled step)")
    rows, comm, dtoh = [], 0, 0
    for n in read_et(path).nodes:
        if n.is_cpu_op:
            continue
        dtoh += n.type == NodeType.COMP_NODE and "DtoH" in n.name
        if n.type == NodeType.COMP_NODE and n.name.startswith("nccl"):
            comm += 1  # a pipeline send/recv kernel the converter left as a compute node (PP bundles' missing P2P)
        elif n.type == NodeType.COMP_NODE:
            rows.append((str(n.attr("op_class", "other")), str(n.attr("aten_op", "")), int(n.attr("duration_ns", 0))))
        elif n.type in (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE):
            comm += 1
    df = pd.DataFrame(rows, columns=["op_class", "aten_op", "ns"])
    out = df.groupby(["op_class", "aten_op"]).agg(prof_n=("ns", "size"), prof_s=("ns", "sum")).reset_index()
    out["prof_s"] = out["prof_s"] * 1e-9
    return out, comm, dtoh


def model_on_profiled(bundle, rank: int, kernel_model) -> pd.DataFrame:
    """The kernel model's time for the profiled kernels' own records (kernels.parquet), per aten_op,
    one prediction per op instance as the model is fitted (calib.models.kernel.op_instances)."""
    from calib.fit import memory_layouts, shared_pieces
    from calib.models.kernel import op_instances

    k = shared_pieces(bundle.table("kernels"))  # as calib fit reads it
    k = k[(k["rank"] == rank) & ~k["name"].astype(str).str.startswith("nccl")]
    if "step" in k and k["step"].nunique() > 1:  # one profiled step per rank is the rule; keep the first
        k = k[k["step"] == k["step"].min()]
    k = k.assign(layout=memory_layouts(k, bench=False), source="trace")  # as calib fit labels them
    k = op_instances(k.reset_index(drop=True))
    pred = np.asarray(kernel_model.predict(k.reset_index(drop=True)), dtype=float)
    # A record the model cannot size (no bytes/flops) is charged as measured: it is not the templates' fault.
    pred = np.where(np.isfinite(pred), pred, k["time_s"].to_numpy(dtype=float))
    df = pd.DataFrame({"op_class": k["op_class"].to_numpy(), "aten_op": k["aten_op"].to_numpy(), "model_prof_s": pred})
    return df.groupby(["op_class", "aten_op"]).agg(model_prof_s=("model_prof_s", "sum")).reset_index()


def generated_ops(gen, stage: int, kernel_model) -> tuple[pd.DataFrame, int]:
    """(per aten_op: gen_n, gen_s, communication node count) of the generated step's `stage`."""
    from calib.chakra.model import NodeType

    counts = gen.op_counts(stage)
    ops = list(counts)
    table = pd.DataFrame([o.record() for o in ops])
    secs = np.asarray(kernel_model.predict(table), dtype=float)
    n = np.array([counts[o] for o in ops], dtype=float)
    kernels = np.array([o.kernels for o in ops], dtype=float)
    # a repeated op's record is one chunk, so its count already includes the repeats; an op of several
    # kernels (Op.kernels) is timed once for all of them
    df = pd.DataFrame({"op_class": table["op_class"], "aten_op": table["aten_op"], "gen_n": n * kernels,
                       "gen_s": n * secs})
    out = df.groupby(["op_class", "aten_op"]).agg(gen_n=("gen_n", "sum"), gen_s=("gen_s", "sum")).reset_index()
    comm = sum(1 for x in gen.workload.classes[stage].trace.nodes
               if x.type in (NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE))
    return out, comm


def compare_bundle(bundle, calibration) -> list[StageCompare]:
    from calib.validation import engine
    from calib.workload.generate import generate
    from calib.workload.parallel import rank_of

    spec = bundle.manifest.spec
    model, par = engine.model_of(spec), engine.parallel_of(spec)
    km = calibration.kernel_model()
    gen = generate(model, par, km.predict)
    out = []
    for stage in range(par.pp):
        rank = rank_of(0, 0, stage, par)
        prof, pcomm, dtoh = profiled_ops(bundle, rank)
        mp = model_on_profiled(bundle, rank, km)
        g, gcomm = generated_ops(gen, stage, km)
        ops = prof.merge(mp, on=["op_class", "aten_op"], how="outer").merge(g, on=["op_class", "aten_op"], how="outer")
        ops = ops.fillna(0.0)
        ops["dev_n"] = ops.gen_n - ops.prof_n
        ops["dev_s"] = ops.gen_s - ops.prof_s
        out.append(StageCompare(bundle.id, stage, rank, ops, pcomm, gcomm, dtoh, gen.device_to_host_copies(stage)))
    return out


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from calib.bundle.io import load_bundles
    from calib.calibration import Calibration
    from calib.errors import CalibError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="*", default=[str(ROOT / "traces" / "h200")])
    ap.add_argument("--calibration", default=str(ROOT / "calib" / "data" / "calibration-h200.yaml"))
    ap.add_argument("--out", default=None, help="folder for the CSV/JSON tables")
    ap.add_argument("--top", type=int, default=6, help="largest per-aten_op deviations printed per run")
    args = ap.parse_args(argv)
    console = Console()
    try:
        cal = Calibration.load(args.calibration)
        bundles = [b for b in load_bundles(args.bundles) if b.manifest.kind == "training"
                   and (b.manifest.gpu.vendor or "").lower() != "cpu"]
        if not bundles:
            raise CalibError(f"no real training bundle in {', '.join(args.bundles)}")
        stages = [s for b in sorted(bundles, key=lambda b: b.id) for s in compare_bundle(b, cal)]
    except CalibError as exc:
        console.print(f"error: {exc}")
        return 2
    runs = pd.DataFrame([s.summary() for s in stages])
    ops = pd.concat([s.ops.assign(run=s.run, stage=s.stage) for s in stages], ignore_index=True)
    t = Table(title="generated vs profiled step (per stage's rank; GPU ms of compute kernels)")
    for c in ("run", "stage", "launches prof", "gen", "dev %", "w/o memsets", "GPU ms prof", "gen", "model(prof)", "dev %",
              "gemm prof/gen", "memory prof/gen", "DtoH prof/gen"):
        t.add_column(c, justify="left" if c == "run" else "right")
    for r in runs.itertuples():
        t.add_row(r.run, str(r.stage), str(r.prof_launches), str(r.gen_launches), f"{r.launch_dev_pct:+.1f}", f"{r.launch_dev_no_memset_pct:+.1f}",
                  f"{1e3 * r.prof_s:.1f}", f"{1e3 * r.gen_s:.1f}", f"{1e3 * r.model_prof_s:.1f}", f"{r.gpu_dev_pct:+.1f}",
                  f"{1e3 * r.gemm_prof_s:.1f}/{1e3 * r.gemm_gen_s:.1f}",
                  f"{1e3 * r.memory_prof_s:.1f}/{1e3 * r.memory_gen_s:.1f}", f"{r.prof_dtoh}/{r.gen_syncs}")
    console.print(t)
    console.print(f"launches: mean |dev| {runs.launch_dev_pct.abs().mean():.1f}%, max {runs.launch_dev_pct.abs().max():.1f}% "
                  f"(without cuBLAS memsets: {runs.launch_dev_no_memset_pct.abs().mean():.1f}%, "
                  f"{runs.launch_dev_no_memset_pct.abs().max():.1f}%); "
                  f"GPU time: mean |dev| {runs.gpu_dev_pct.abs().mean():.1f}%, max {runs.gpu_dev_pct.abs().max():.1f}%; "
                  f"device-to-host copies equal to the profiled ones in {int((runs.prof_dtoh == runs.gen_syncs).sum())} of {len(runs)}")
    for s in stages:
        o = s.ops.reindex(s.ops.dev_s.abs().sort_values(ascending=False).index).head(args.top)
        parts = [f"{r.aten_op} {int(r.prof_n)}->{int(r.gen_n)} ({1e3 * r.prof_s:.2f}->{1e3 * r.gen_s:.2f} ms)"
                 for r in o.itertuples()]
        console.print(f"[bold]{s.run}[/] stage {s.stage}: " + "; ".join(parts), soft_wrap=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        _write_atomic(out / "gen_vs_profile_runs.csv", runs.to_csv(index=False))
        _write_atomic(out / "gen_vs_profile_ops.csv", ops.to_csv(index=False))
        _write_atomic(out / "gen_vs_profile.json", json.dumps(
            {"calibration": str(args.calibration), "runs": runs.to_dict("records"), "ops": ops.to_dict("records")},
            indent=1, default=float))
        console.print(f"wrote {out}/gen_vs_profile_runs.csv, gen_vs_profile_ops.csv, gen_vs_profile.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
