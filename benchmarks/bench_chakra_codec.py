"""Speed of the Chakra ET codec (issue 2: the workload generator writes ETs of 10^5+ nodes).

Encodes and decodes a trace of N COMP nodes shaped like the generator's (a chain, 5 attributes:
is_cpu_op, num_ops, tensor_size, duration_ns, category), plus the same through the protobuf runtime
alone for comparison. Reports CPU-time nodes/s (wall time is noisy on a shared machine).
Usage: python benchmarks/bench_chakra_codec.py [--nodes 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from calib.chakra.codec import decode, encode, encode_slow
from calib.chakra.model import Attr, ExecutionTrace, Node, NodeType


def trace(n: int) -> ExecutionTrace:
    nodes = [
        Node(id=i, name=f"layer{i % 96}.op{i}", type=NodeType.COMP_NODE, data_deps=[i - 1] if i else [],
             duration_micros=5, attrs=[Attr("is_cpu_op", False), Attr("num_ops", 123456 + i % 7),
                                       Attr("tensor_size", 4096), Attr("duration_ns", 5123), Attr("category", "compute")])
        for i in range(n)
    ]
    return ExecutionTrace(nodes=nodes)


def rate(fn, n: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return n / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=200000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    t = trace(a.nodes)
    data = encode(t)
    print(f"{a.nodes} nodes, {len(data) / 1e6:.1f} MB")
    print(f"encode          {rate(lambda: encode(t), a.nodes, a.repeat):10.0f} nodes/s")
    print(f"encode (protobuf runtime only) {rate(lambda: encode_slow(t), a.nodes, a.repeat):10.0f} nodes/s")
    print(f"decode          {rate(lambda: decode(data), a.nodes, a.repeat):10.0f} nodes/s")


if __name__ == "__main__":
    main()
