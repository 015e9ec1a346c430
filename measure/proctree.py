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
        # The command name sits in parentheses and may itself hold spaces or parentheses.
        fields = stat[stat.rfind(")") + 2:].split()
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
    Stopping the tree first keeps a parent from starting a child between the read and the kill."""
    for _ in range(3):
        tree = [pid, *descendants(pid)]
        for p in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGSTOP)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        for p in [pid, *descendants(pid), *tree]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        if not descendants(pid):
            return
