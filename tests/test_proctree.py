"""measure.proctree kills a launcher and the children it started in sessions of their own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from measure.proctree import descendants, kill_tree

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")

# A parent that starts a child in a new session (as torchrun starts its workers), writes its pid, and waits.
_LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_kill_tree_reaches_children_in_their_own_session(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(pid_file)], start_new_session=True)
    for _ in range(200):
        if pid_file.is_file() and pid_file.read_text():
            break
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert child in descendants(proc.pid)
    assert os.getpgid(child) != os.getpgid(proc.pid)  # what killpg alone would miss
    kill_tree(proc.pid)
    proc.wait(timeout=10)
    for _ in range(100):
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)


def test_kill_tree_of_a_finished_process_is_quiet() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    kill_tree(proc.pid)
