"""The ASTRA-sim backend: write its inputs for a workload, run its binary, read its answer.

Inputs (docs/design.md, `--emit-astra-sim`): `workload.<rank>.et` (plain: ASTRA-sim's feeder does
not read gzip), `system.json`, `network.yml`, `memory.json`, `comm_groups.json` when the workload
has groups, and `run.sh` with the exact command line. The binary prints one line per rank,
`sys[i] finished, T cycles, exposed communication X cycles.` (1 cycle = 1 ns).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from calib.chakra.codec import write_bytes_atomic, write_et
from calib.chakra.model import Attr, ExecutionTrace, Node, NodeType
from calib.errors import CalibError
from calib.sim.config import NetworkConfig, SystemConfig
from calib.sim.inputs import write_comm_groups
from calib.sim.types import SimResult, SimWorkload

DEFAULT_BINARY = "AstraSim_Analytical_Congestion_Unaware"
PREFIX = "workload"
FINISH_LINE = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles, exposed communication (\d+) cycles\.")
NO_MEMORY = {"memory-type": "NO_MEMORY_EXPANSION"}


def _idle() -> ExecutionTrace:
    # ASTRA-sim aborts on a rank whose ET has no node ("No dependancy free nodes found").
    return ExecutionTrace(nodes=[Node(0, "idle", NodeType.COMP_NODE, attrs=[Attr("is_cpu_op", False)])])


def with_rendezvous_nodes(trace: ExecutionTrace) -> ExecutionTrace:
    """The trace with each collective's TP rendezvous (attr rendezvous_ns, calib.workload.host) as a GPU
    node of that duration after it, on which whatever depended on the collective now depends: ASTRA-sim
    has no per-collective delay, and the embedded simulator holds the collective itself that much longer
    (the same step where the compute stream waits for the collective). The trace itself when it has none."""
    delays = {n.id: int(n.attr("rendezvous_ns") or 0) for n in trace.nodes
              if n.type == NodeType.COMM_COLL_NODE and int(n.attr("rendezvous_ns") or 0) > 0}
    if not delays:
        return trace
    next_id = max(n.id for n in trace.nodes) + 1
    after: dict[int, int] = {}
    added: list[Node] = []
    for cid, ns in sorted(delays.items()):
        after[cid] = next_id
        added.append(Node(next_id, f"rendezvous:{cid}", NodeType.COMP_NODE, data_deps=[cid],
                          duration_micros=int(round(ns / 1000)),
                          attrs=[Attr("is_cpu_op", False, "bool_val"), Attr("duration_ns", ns, "uint64_val"),
                                 Attr("category", "comm", "string_val")]))
        next_id += 1
    nodes = []
    for n in trace.nodes:
        if any(d in after for d in (*n.data_deps, *n.ctrl_deps)):
            n = Node(n.id, n.name, n.type, [after.get(d, d) for d in n.ctrl_deps], [after.get(d, d) for d in n.data_deps],
                     n.start_time_micros, n.duration_micros, n.inputs, n.outputs, list(n.attrs))
        nodes.append(n)
    return ExecutionTrace(nodes=nodes + added, version=trace.version, metadata_attrs=list(trace.metadata_attrs))


def write_inputs(
    workload: SimWorkload, network: NetworkConfig, system: SystemConfig, out_dir: str | Path, binary: str = DEFAULT_BINARY
) -> list[str]:
    """Write every input file into `out_dir`; return the argv that runs ASTRA-sim there."""
    network.check_ranks(workload.num_ranks)
    network, system = _without_unit_dims(network, system)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(workload.num_ranks):
        trace = with_rendezvous_nodes(workload.trace_of(rank))
        write_et(trace if trace.nodes else _idle(), out / f"{PREFIX}.{rank}.et")
    write_bytes_atomic(out / "system.json", json.dumps(system.to_dict(), indent=2).encode())
    write_bytes_atomic(out / "network.yml", yaml.safe_dump(network.to_dict(), sort_keys=False).encode())
    write_bytes_atomic(out / "memory.json", json.dumps(NO_MEMORY).encode())
    argv = [
        binary,
        f"--workload-configuration={PREFIX}",
        "--system-configuration=system.json",
        "--network-configuration=network.yml",
        "--remote-memory-configuration=memory.json",
    ]
    if workload.comm_groups:
        write_comm_groups(workload.comm_groups, out / "comm_groups.json")
        argv.append("--comm-group-configuration=comm_groups.json")
    argv.append("--logging-folder=log")
    script = f'#!/bin/sh\n# Run from this folder. ASTRA_SIM_BIN overrides the binary.\ncd "$(dirname "$0")"\nexec "${{ASTRA_SIM_BIN:-{binary}}}" {shlex.join(argv[1:])}\n'
    write_bytes_atomic(out / "run.sh", script.encode())
    os.chmod(out / "run.sh", 0o755)
    return argv


def _without_unit_dims(network: NetworkConfig, system: SystemConfig) -> tuple[NetworkConfig, SystemConfig]:
    """ASTRA-sim refuses a dimension of one NPU; it changes no coordinate, so leave it (and its
    implementation entries) out."""
    keep = [i for i, d in enumerate(network.dims) if d.npus > 1] or [0]
    if len(keep) == len(network.dims):
        return network, system

    def cut(impls: list[str]) -> list[str]:
        return [impls[i] for i in keep if i < len(impls)] or impls[:1]

    system = dataclasses.replace(
        system, all_reduce_impl=cut(system.all_reduce_impl), all_gather_impl=cut(system.all_gather_impl),
        reduce_scatter_impl=cut(system.reduce_scatter_impl), all_to_all_impl=cut(system.all_to_all_impl),
    )
    return NetworkConfig(tuple(network.dims[i] for i in keep)), system


def parse_output(text: str, num_ranks: int, source: str = "ASTRA-sim") -> tuple[list[int], list[int]]:
    """Per-rank (finish_ns, exposed_comm_ns) from the `sys[i] finished` lines."""
    finish: dict[int, int] = {}
    exposed: dict[int, int] = {}
    for m in FINISH_LINE.finditer(text):
        r = int(m.group(1))
        finish[r] = int(m.group(2))
        exposed[r] = int(m.group(3))
    missing = [r for r in range(num_ranks) if r not in finish]
    if missing:
        raise CalibError(
            f"{source} reported {len(finish)} of {num_ranks} ranks (first missing: sys[{missing[0]}]); "
            "its run did not complete"
        )
    return [finish[r] for r in range(num_ranks)], [exposed[r] for r in range(num_ranks)]


def find_binary(astra_sim_bin: str | None) -> str:
    path = astra_sim_bin or os.environ.get("ASTRA_SIM_BIN")
    if not path:
        raise CalibError("no ASTRA-sim binary: pass --astra-sim-bin PATH or set ASTRA_SIM_BIN")
    found = shutil.which(path)
    if found is None:
        raise CalibError(f"ASTRA-sim binary {path!r} does not exist or is not executable")
    # The binary runs in its own work folder: a relative path (./astra_sim) must not change meaning.
    return str(Path(found).absolute())


def run_astrasim(
    workload: SimWorkload,
    network: NetworkConfig,
    system: SystemConfig,
    astra_sim_bin: str | None = None,
    work_dir: str | Path | None = None,
    timeout_s: float | None = None,
) -> SimResult:
    """Write the inputs, run the binary in that folder, parse its per-rank lines."""
    binary = find_binary(astra_sim_bin)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="calib-astrasim-") as tmp:
        where = Path(work_dir) if work_dir else Path(tmp)
        argv = write_inputs(workload, network, system, where, binary=binary)
        try:
            proc = subprocess.run(argv, cwd=where, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise CalibError(f"ASTRA-sim ({binary}) did not finish within {timeout_s} s") from None
        except OSError as exc:
            raise CalibError(f"ASTRA-sim binary {binary} cannot run: {exc.strerror or exc}") from None
        if proc.returncode != 0:
            tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            why = tail[-1] if tail else "no output"
            raise CalibError(f"ASTRA-sim ({binary}) exited with status {proc.returncode}: {why}")
        finish, exposed = parse_output(proc.stdout, workload.num_ranks, source=f"ASTRA-sim ({binary})")
    return SimResult(
        backend="astrasim", finish_ns=finish, exposed_comm_ns=exposed, wall_s=time.perf_counter() - t0,
        simulated_ranks=workload.num_ranks,
    )
