"""Measured step time per GPU node of each run, beside its validation errors (docs/host.md, twelfth session).

A host-bound step lasts about as long as its host takes to launch its kernels, so the measured step
over the number of GPU nodes in its profiled step (kernels, copies, collectives; rank 0's converted
ET) bounds the host's cost per launch from above, and meets it where the run is host-bound. Runs of
one code path and host size that need different costs per launch are what one launch cost per host
size (calib.models.host) cannot serve. Prints one line per training run of the report, sorted by
configuration:

    python benchmarks/host_per_node.py [REPORT_JSON]   (default: reports/validation.json)
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from calib.bundle.io import read_bundle
from calib.chakra.codec import read_et
from calib.workload.host import converted_sync_points

ROOT = Path(__file__).resolve().parent.parent


def node_counts(et_path: Path) -> tuple[int, int, int]:
    """(GPU nodes, collectives, device-to-host syncs and send/recv) of one converted ET."""
    et = read_et(et_path)
    kinds = Counter(n.type.name for n in et.nodes if not n.is_cpu_op)
    return sum(kinds.values()), kinds["COMM_COLL_NODE"], len(converted_sync_points(et))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def main(report: Path) -> None:
    data = json.loads(report.read_text())
    errors: dict[str, dict[str, float]] = {}
    measured: dict[str, float] = {}
    for r in data["runs"]:
        errors.setdefault(r["run"], {})[r["kind"]] = r["error_pct"]
        measured[r["run"]] = r["measured_step_s"]
    traces = ROOT / "traces"
    print(f"{'run':30s} {'gpus':>4s} {'ep':>3s} {'step ms':>8s} {'nodes':>6s} {'coll':>5s} {'syncs':>5s} "
          f"{'us/node':>8s} {'replay %':>9s} {'held-out %':>10s}")
    for run in sorted(measured):
        path = next(traces.glob(f"*/{run}"), None)
        bundle = read_bundle(path) if path is not None else None
        ets = bundle.et_files() if bundle is not None else []
        if bundle is None or not ets:
            continue
        spec = bundle.manifest.spec
        nodes, coll, syncs = node_counts(ets[0])
        rep, held = (_pct(errors[run].get(k)) for k in ("replay", "heldout"))
        print(f"{run:30s} {spec.tp * spec.pp * spec.dp:4d} {spec.ep:3d} {measured[run] * 1e3:8.1f} {nodes:6d} "
              f"{coll:5d} {syncs:5d} {measured[run] / nodes * 1e6:8.1f} {rep:>9s} {held:>10s}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "reports" / "validation.json")
