"""`calib sim`: a drop-in for ASTRA-sim's analytical binary (same flags, same per-rank lines)."""

from __future__ import annotations

import json
import sys
from datetime import datetime

import typer

from calib.errors import CalibError

# ASTRA-sim parses these and ignores them; calib accepts them too, and says so.
_IGNORED = ("--compute-scale", "--comm-scale", "--num-queues-per-dim", "--rendezvous-protocol")


def _line(rank: int, finish: int, exposed: int) -> str:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"[{stamp}] [workload] [info] sys[{rank}] finished, {finish} cycles, exposed communication {exposed} cycles."


def register(app: typer.Typer) -> None:
    @app.command(
        "sim",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        help=(
            "Simulate per-rank Chakra ETs like ASTRA-sim's analytical binary and print its "
            "'sys\\[i] finished, T cycles, exposed communication X cycles.' lines (1 cycle = 1 ns). "
            "Example: calib sim --workload-configuration=wl --system-configuration=system.json "
            "--network-configuration=network.yml --remote-memory-configuration=memory.json"
        ),
    )
    def sim(
        ctx: typer.Context,
        workload_configuration: str = typer.Option(..., "--workload-configuration", help="ET prefix: reads PREFIX.<rank>.et for every rank."),
        system_configuration: str = typer.Option(..., "--system-configuration", help="ASTRA-sim system JSON."),
        network_configuration: str = typer.Option(..., "--network-configuration", help="ASTRA-sim analytical network YAML."),
        remote_memory_configuration: str = typer.Option(..., "--remote-memory-configuration", help="ASTRA-sim memory JSON (only NO_MEMORY_EXPANSION is modelled)."),
        comm_group_configuration: str | None = typer.Option(None, "--comm-group-configuration", help='Comm groups JSON {"<id>": [ranks]}.'),
        logging_folder: str | None = typer.Option(None, "--logging-folder", help="Folder for the timeline (analytical backend) and ASTRA-sim's logs."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON instead of the per-rank lines."),
        backend: str = typer.Option("analytical", "--backend", help="analytical (embedded) or astrasim (runs the binary)."),
        astra_sim_bin: str | None = typer.Option(None, "--astra-sim-bin", help="ASTRA-sim binary for --backend astrasim (else ASTRA_SIM_BIN)."),
        timeline: str | None = typer.Option(None, "--timeline", help="Write per-node start/end times as Chrome-trace JSON (open in Perfetto)."),
    ) -> None:
        from pathlib import Path

        from calib.sim import NetworkConfig, SystemConfig, simulate
        from calib.sim.inputs import read_workload

        extra = list(ctx.args)
        for a in extra:
            name = a.split("=", 1)[0]
            if name in _IGNORED:
                print(f"warning: {name} has no effect in ASTRA-sim either; ignored", file=sys.stderr)
            else:
                print(f"warning: unknown option {name} ignored (ASTRA-sim ignores unknown flags too)", file=sys.stderr)
        if backend == "astrasim":  # say so before reading thousands of ETs
            from calib.sim.astrasim import find_binary

            astra_sim_bin = find_binary(astra_sim_bin)
        network = NetworkConfig.from_yaml(network_configuration)
        system = SystemConfig.from_json(system_configuration)
        _check_memory(remote_memory_configuration)
        workload = read_workload(workload_configuration, network.npus, comm_group_configuration)
        if timeline is None and logging_folder and backend == "analytical":
            try:
                Path(logging_folder).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CalibError(f"logging folder {logging_folder}: {exc.strerror or exc}") from None
            timeline = str(Path(logging_folder) / "timeline.json")
        result = simulate(workload, network, system, backend=backend, astra_sim_bin=astra_sim_bin, timeline_path=timeline)
        if as_json:
            print(json.dumps(result.to_dict()))
            return
        for r, (f, x) in enumerate(zip(result.finish_ns, result.exposed_comm_ns, strict=True)):
            print(_line(r, f, x))


def _check_memory(path: str) -> None:
    from pathlib import Path

    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CalibError(f"remote-memory configuration {p}: {exc}") from None
    kind = data.get("memory-type") if isinstance(data, dict) else None
    if kind != "NO_MEMORY_EXPANSION":
        raise CalibError(f"remote-memory configuration {p}: memory-type {kind!r} is not modelled (only NO_MEMORY_EXPANSION)")
