"""`calib trace`: show, check and convert Chakra execution traces (logic in calib.chakra / calib.convert)."""

from __future__ import annotations

from pathlib import Path

import typer

from calib.errors import CalibError

trace_app = typer.Typer(help="Chakra execution traces: show, check, convert PyTorch traces to Chakra.", no_args_is_help=True)


@trace_app.command("show")
def show(path: Path = typer.Argument(..., help="Chakra ET file (.et or .et.gz)")) -> None:
    """Summarize one ET: node counts by type, compute and communication time, collectives."""
    from rich.console import Console
    from rich.table import Table

    from calib.chakra.codec import read_et
    from calib.chakra.summary import summarize

    trace = read_et(path)
    s = summarize(trace)
    con = Console()
    con.print(f"[bold]{path}[/bold]  version {trace.version or '(empty)'}  {s.nodes} nodes")
    t = Table("node type", "count")
    for name, count in s.by_type.items():
        t.add_row(name, str(count))
    t.add_row("(of which is_cpu_op)", str(s.cpu_ops))
    con.print(t)
    con.print(
        f"compute {s.compute_time_s * 1e3:.3f} ms   communication {s.comm_time_s * 1e3:.3f} ms   "
        f"cpu ops {s.cpu_time_s * 1e3:.3f} ms  (sums of node durations over all streams)"
    )
    if s.collectives:
        c = Table("kind", "group (pg_name)", "bytes", "count", "total ms")
        for g in s.collectives:
            c.add_row(g.kind, g.pg_name or "world", f"{g.bytes:,}", str(g.count), f"{g.time_s * 1e3:.3f}")
        con.print(c)


@trace_app.command("check")
def check(paths: list[Path] = typer.Argument(..., help="Chakra ET files to validate")) -> None:
    """Validate ETs (ids, dependencies, cycles, required attributes and slots); one line per bad file."""
    from calib.chakra.codec import read_et
    from calib.chakra.validate import problems

    bad = 0
    for p in paths:
        try:
            found = problems(read_et(p))
        except CalibError as exc:
            found = [str(exc)]
        if found:
            bad += 1
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            typer.echo(f"{p}: {found[0]}{more}" if not found[0].startswith(str(p)) else f"{found[0]}{more}")
        else:
            typer.echo(f"{p}: ok")
    if bad:
        # SystemExit, not typer.Exit: with standalone_mode=False click turns typer.Exit into a return value.
        raise SystemExit(1)


@trace_app.command("json")
def to_json_cmd(
    path: Path = typer.Argument(..., help="Chakra ET file (.et or .et.gz)"),
    out: Path | None = typer.Option(None, "-o", "--out", help="JSON file to write (default: standard output)"),
) -> None:
    """Export an ET as JSON (lossless: every attribute with its protobuf slot)."""
    import json

    from calib.chakra.codec import read_et, write_bytes_atomic
    from calib.chakra.jsonio import to_json

    text = json.dumps(to_json(read_et(path)), indent=1) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        write_bytes_atomic(out, text.encode())


@trace_app.command("convert")
def convert(
    host: Path | None = typer.Argument(None, help="PyTorch host execution trace (host.N.json[.gz])"),
    device: Path | None = typer.Argument(None, help="Kineto device trace of the same rank (device.N.json[.gz])"),
    out: Path = typer.Option(..., "-o", "--out", help="output ET file (rank.N.et[.gz]) or, with --dir, folder"),
    run_dir: Path | None = typer.Option(None, "--dir", help="run folder holding host.N.json[.gz] + device.N.json[.gz]"),
    gz: bool = typer.Option(False, "--gzip", help="with --dir: write rank.N.et.gz (ASTRA-sim's newer feeder needs plain)"),
) -> None:
    """Convert PyTorch traces (host ET + Kineto) to Chakra ETs, one per rank, plus comm_groups.json."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # On bad input the one `error:` line is all the user gets (it names the file and the cause);
        # warnings (e.g. an untested host-trace schema) are printed only when the conversion succeeds.
        _convert(host, device, out, run_dir, gz)
    for w in caught:  # one line each, not Python's "file:line: UserWarning" form
        typer.echo(f"warning: {w.message}", err=True)


def _convert(host: Path | None, device: Path | None, out: Path, run_dir: Path | None, gz: bool) -> None:
    from calib.convert import convert_pair, convert_run

    if run_dir is not None:
        if host is not None or device is not None:
            raise CalibError("give either HOST DEVICE or --dir RUN_DIR, not both")
        conv = convert_run(run_dir, out, compress=gz)
        typer.echo(f"wrote {len(conv.traces)} rank ETs and comm_groups.json to {out}")
        return
    if host is None or device is None:
        raise CalibError("calib trace convert needs HOST and DEVICE trace files (or --dir RUN_DIR)")
    conv = convert_pair(host, device, out)
    (rank,) = conv.traces
    trace = conv.traces[rank]
    typer.echo(f"wrote {out}: rank {rank}, {len(trace.nodes)} nodes")


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
