"""What a host sync costs by its kind: scalar reads against routing copies (docs/host.md, "Scalar reads
cost a launch", thirtieth session).

For each training bundle of a GPU folder (rank 0's converted ET): the device-to-host copies by the op
behind them (attr `aten_op`: `aten::_local_scalar_dense` is a `.item()`, the optimizer's gradient-norm
reads; `aten::copy_` the MoE routing counts), the median profiled gap before the kernel after each kind
(profiler included), and the measured step against the kernels it ran (the GPU's idle time, which bounds
what all its syncs cost together). With `--replay ID...`, those runs replayed at the calibration's replay
launch cost with every sync point costing 0, then the given sync cost on the routing copies and the scalar
reads alike (the model of before) and on the routing copies alone (the model of now):

    python benchmarks/scalar_reads.py [traces/h200] [--replay gpt1.3b-1gpu-mbs4-L24 mixtral-1gpu] [--sync-us 162]
        [--launch-us 34.04]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from calib.bundle.io import read_bundle
from calib.chakra.codec import read_et
from calib.chakra.model import NodeType

ROOT = Path(__file__).resolve().parent.parent


def _gaps_by_op(nodes: list) -> dict[str, list[float]]:
    """Per op behind a device-to-host copy: the gaps (us) before the GPU node that follows each copy."""
    out: dict[str, list[float]] = defaultdict(list)
    for n, nxt in zip(nodes, nodes[1:], strict=False):
        if n.type == NodeType.COMP_NODE and "DtoH" in n.name:
            out[str(n.attr("aten_op"))].append(float(nxt.attr("gap_ns", 0) or 0) / 1e3)
    return out


def survey(folder: Path) -> None:
    from calib.validation.measured import measured_step

    print(f"{'run':36s} {'reads':>5s} {'gap us':>7s} {'copies':>6s} {'gap us':>7s} {'step ms':>8s} {'idle ms':>8s}")
    print("(reads: scalar reads, copies: other device-to-host copies, each with the median profiled gap after it; "
          "idle: measured step less rank 0's GPU compute and copies)")
    for path in sorted(p for p in folder.iterdir() if (p / "manifest.json").is_file()):
        bundle = read_bundle(path)
        ets = bundle.et_files()
        if bundle.manifest.kind != "training" or not ets:
            continue
        nodes = sorted((n for n in read_et(ets[0]).nodes if not n.is_cpu_op), key=lambda n: n.id)
        gaps = _gaps_by_op(nodes)
        reads, copies = gaps.get("aten::_local_scalar_dense", []), gaps.get("aten::copy_", [])
        step = measured_step(bundle).time_s
        # Rank 0's kernels, copies and memsets (one GPU: what the GPU was busy with; with collectives
        # or several streams the idle column is only a rough bound).
        busy = sum(int(n.attr("duration_ns", 0) or 0) for n in nodes if n.type == NodeType.COMP_NODE) / 1e9
        med = lambda xs: f"{statistics.median(xs):7.1f}" if xs else f"{'-':>7s}"  # noqa: E731
        print(f"{path.name:36s} {len(reads):5d} {med(reads)} {len(copies):6d} {med(copies)} {step * 1e3:8.1f} "
              f"{(step - busy) * 1e3:8.1f}")


def replay(folder: Path, ids: list[str], sync_us: float, launch_us: float | None) -> None:
    from calib.calibration import Calibration
    from calib.project import default_calibration_path
    from calib.sim import simulate
    from calib.validation import engine
    from calib.validation.measured import measured_step
    from calib.validation.replay import read_run_traces, replay_workload
    from calib.workload.host import add_host_to_replay

    cal = Calibration.load(default_calibration_path(folder.name))
    launch = launch_us * 1e-6 if launch_us is not None else cal.host_model().replay_launch_s or 34e-6
    s = sync_us * 1e-6
    for rid in ids:
        bundle = read_bundle(folder / rid)
        network, system = engine.replay_network(bundle, cal)
        base = replay_workload(read_run_traces(bundle))
        # Before: every device-to-host copy a sync point of one cost (no scalar reads told apart).
        before = simulate(add_host_to_replay(base, launch, s, s, free_reads=False), network, system).step_time_s
        now = simulate(add_host_to_replay(base, launch, s, s), network, system).step_time_s
        free = simulate(add_host_to_replay(base, launch, 0.0, 0.0), network, system).step_time_s
        print(f"{rid}: measured {measured_step(bundle).time_s * 1e3:.1f} ms; replayed at launch {launch * 1e6:.1f} us: "
              f"syncs free {free * 1e3:.1f} ms, {sync_us:g} us at every copy {before * 1e3:.1f} ms, "
              f"at the copies other than scalar reads {now * 1e3:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path, default=ROOT / "traces" / "h200")
    ap.add_argument("--replay", nargs="*", default=[])
    ap.add_argument("--sync-us", type=float, default=162.0)
    ap.add_argument("--launch-us", type=float, default=None, help="launch cost (default: the calibration's replay cost)")
    args = ap.parse_args()
    if args.replay:
        replay(args.folder, args.replay, args.sync_us, args.launch_us)
    else:
        survey(args.folder)


if __name__ == "__main__":
    main()
