"""How long does the host take between two scalar reads in a row? (docs/host.md, seventh session)

megatron-core's optimizer reads the per-tensor gradient norms one by one (`Tensor.item()`: a
device-to-host copy of `aten::_local_scalar_dense` and a wait for it). Between two such copies with
nothing else on the GPU, the GPU idles for exactly the host's work from one value's arrival to the
next copy's launch. This prints that idle time per bundle whose raw profiler traces were kept
(`raw/device.N.json.xz`, or .gz), and the CPU time of the read op itself, both under the profiler (which
slows the host), beside what the calibration charges such a read (one launch plus one sync).

    python benchmarks/host_reads.py [BUNDLE_DIR ...]   (default: every traces/h200 bundle with raw/)

The last committed raw traces left the tree in the fifty-first session (traces/README.md says where they are in git's
history); mixtral-ep2-mbs2-raw's gave 62 reads in a row, GPU idle 26.0 / 39.0 / 214.2 us (p10/p50/p90), the read
op's CPU 8.4 us (median).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from calib.bundle.io import read_bundle
from calib.calibration import Calibration
from calib.convert.kineto import read_kineto
from calib.models.host import HostModel

ROOT = Path(__file__).resolve().parent.parent
READ_OP = "aten::_local_scalar_dense"  # Tensor.item()


def read_gaps_us(device_trace: Path) -> tuple[np.ndarray, np.ndarray]:
    """(GPU idle between consecutive device-to-host copies with nothing between them, CPU duration of
    each aten::_local_scalar_dense), microseconds, for one rank's Kineto trace."""
    kt = read_kineto(device_trace)
    gpu = sorted(kt.gpu, key=lambda a: a.start_ns)
    gaps = [b.start_ns - (a.start_ns + a.dur_ns) for a, b in zip(gpu, gpu[1:], strict=False)
            if a.kind == b.kind == "memcpy" and "DtoH" in a.name and "DtoH" in b.name]
    cpu = [end - start for spans in kt.cpu_spans.values() for start, end, e in spans
           if e.get("cat") == "cpu_op" and e.get("name") == READ_OP]
    return np.asarray(gaps, dtype=float) / 1e3, np.asarray(cpu, dtype=float) / 1e3


def main(argv: list[str]) -> int:
    dirs = [Path(a) for a in argv] or sorted(p.parent for p in (ROOT / "traces" / "h200").glob("*/raw"))
    if not dirs:
        print("no bundle with raw/ traces")
        return 1
    print(f"{'bundle':32} {'reads in a row':>14} {'GPU idle between, us p10/p50/p90':>34} {'read op CPU us p50':>19}")
    for d in dirs:
        gaps, cpu = [], []
        for f in sorted((d / "raw").glob("device.*.json.?z")):
            g, c = read_gaps_us(f)
            gaps.append(g)
            cpu.append(c)
        g, c = np.concatenate(gaps), np.concatenate(cpu)
        p = np.percentile(g, [10, 50, 90]) if len(g) else [np.nan] * 3
        print(f"{d.name:32} {len(g):14d} {p[0]:12.1f} {p[1]:10.1f} {p[2]:10.1f} {np.median(c) if len(c) else np.nan:19.1f}")
    fitted = HostModel.from_dict(Calibration.load(str(ROOT / "calib" / "data" / "calibration-h200.yaml")).host)
    for tp, pp, ep in sorted({(s.tp, s.pp, s.ep) for s in (read_bundle(d).manifest.spec for d in dirs)}):
        host = fitted.on_path(tp, pp, ep)  # the costs of the bundles' code paths
        # Since the thirtieth session a scalar read is waited for and the next launch costs one launch, no sync
        # (docs/host.md, "Scalar reads cost a launch"); sync_s is the routing copies' cost.
        print(f"calibration-h200 charges a read after a read one launch at TP {tp} / PP {pp} / EP {ep}: "
              f"{host.launch_s * 1e6:.1f} us generated, {(host.replay_launch_s or host.launch_s) * 1e6:.1f} us replayed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
