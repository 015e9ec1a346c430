"""Kill a launched process and everything it started.

torchrun starts each worker in a session of its own, so killing the launcher's process group leaves
the workers running: they keep their GPUs and may join the next run that reuses the port. The tree
is therefore read off /proc before anything is killed (a killed parent's orphans are re-parented
and could no longer be found).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

_PROC = Path("/proc")
# Reads of the tree while stopping it: the second finds what was started between the first read and the
# stop; the bound only guards against a process that keeps starting children and cannot be stopped.
_STOP_ROUNDS = 8


def stat_fields(stat: str) -> list[str]:
    """A /proc/<pid>/stat line's fields after the command name, from its third (the state) on: the name sits
    in parentheses and may itself hold spaces or parentheses."""
    return stat[stat.rfind(")") + 2:].split()


def _children_table() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc/<pid>/stat (empty where /proc is absent)."""
    table: dict[int, list[int]] = {}
    if not _PROC.is_dir():
        return table
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat_fields(stat)
        if len(fields) > 1:
            table.setdefault(int(fields[1]), []).append(int(entry.name))
    return table


def descendants(pid: int) -> list[int]:
    """Every process below pid, parents before children."""
    table = _children_table()
    out: list[int] = []
    todo = list(table.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(table.get(p, []))
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL pid's process group and every descendant, including those in sessions of their own.
    The tree is stopped first, and read again until no new process appears (a stopped process starts
    no more children): once a parent is killed, its orphans could no longer be found from pid."""
    stopped: list[int] = []
    for _ in range(_STOP_ROUNDS):
        new = [p for p in [pid, *descendants(pid)] if p not in stopped]
        if not new:
            break
        for p in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
        stopped += new
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for p in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
