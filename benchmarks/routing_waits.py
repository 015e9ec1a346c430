"""How often the host waits in a profiled Mixtral step, and for what, from raw Kineto device traces
(docs/host.md, "One wait per routing").

    python benchmarks/routing_waits.py [RAW_DIR ...] [--save FILE]
    (default: the committed summaries: round 34's, traces/h200/_probes/routing-waits-1/summary.json, and
    mixtral-ep2-mbs2-raw's, traces/h200/_probes/routing-waits-ep2/summary.json, written from its raw traces before
    they left the tree in the fifty-first session)

A RAW_DIR holds a bundle's raw traces (device.N.json[.gz|.xz], one per rank; `calib measure train --keep-raw`,
round 34 in measure/campaigns/h200.py). Per rank of each: the device-to-host copies by stream, the host's
cudaEventSynchronize calls (megatron-core 0.19's alltoall token dispatcher waits on its routing copies' event
once per MoE layer forward) and cudaStreamSynchronize calls (the optimizer's scalar reads, `.item()`), with
the median time the host was blocked in each and the median time from the end of an event wait to the
host's next kernel launch (Python work, profiler on). `--save` writes the summary as JSON.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUMMARIES = [ROOT / "traces" / "h200" / "_probes" / d / "summary.json" for d in ("routing-waits-1", "routing-waits-ep2")]
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync")


def load(path: Path) -> list[dict]:
    from calib.compressed import decompress

    data = json.loads(decompress(path.read_bytes(), str(path)))
    return data["traceEvents"] if isinstance(data, dict) else data


def rank_summary(events: list[dict]) -> dict:
    runtime = sorted((e for e in events if e.get("cat") == "cuda_runtime" and "dur" in e), key=lambda e: e["ts"])
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "DtoH" in str(e.get("name"))]
    by_stream: dict[str, int] = {}
    for e in copies:
        key = str(e.get("args", {}).get("stream"))
        by_stream[key] = by_stream.get(key, 0) + 1
    waits = [e for e in runtime if e["name"] == "cudaEventSynchronize"]
    stream_syncs = [e for e in runtime if e["name"] == "cudaStreamSynchronize"]
    after = []
    for w in waits:
        end = w["ts"] + w["dur"]
        nxt = next((e for e in runtime if e["ts"] >= end and e.get("tid") == w.get("tid") and e["name"] in LAUNCHES), None)
        if nxt is not None:
            after.append(nxt["ts"] - end)
    med = lambda xs: round(statistics.median(xs), 1) if xs else None  # noqa: E731
    return {"dtoh_copies_by_stream": dict(sorted(by_stream.items())), "event_syncs": len(waits),
            "event_sync_us_median": med([w["dur"] for w in waits]), "after_event_sync_to_launch_us_median": med(after),
            "stream_syncs": len(stream_syncs), "stream_sync_us_median": med([w["dur"] for w in stream_syncs])}


def summarize(raw_dir: Path) -> dict:
    files = sorted(raw_dir.glob("device.*.json*"), key=lambda p: int(re.search(r"device\.(\d+)", p.name).group(1)))
    return {"run": raw_dir.parent.name if raw_dir.name == "raw" else raw_dir.name, "ranks": {f.name.split(".")[1]: rank_summary(load(f)) for f in files}}


def main(argv: list[str]) -> int:
    save = Path(argv[argv.index("--save") + 1]) if "--save" in argv else None
    dirs = [Path(a) for i, a in enumerate(argv) if a != "--save" and (i == 0 or argv[i - 1] != "--save")]
    if dirs:
        out = [summarize(d) for d in dirs]
    else:
        out = [s for f in SUMMARIES if f.is_file() for s in json.loads(f.read_text())]
    for s in out:
        for rank, r in s["ranks"].items():
            print(f"{s['run']:28s} rank {rank}: DtoH copies by stream {r['dtoh_copies_by_stream']}; event syncs "
                  f"{r['event_syncs']} (blocked {r['event_sync_us_median']} us, then {r['after_event_sync_to_launch_us_median']}"
                  f" us to the next launch); stream syncs {r['stream_syncs']} (blocked {r['stream_sync_us_median']} us)")
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        save.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
