"""The host's own pace, sampled from a second process beside a training run.

A run whose GPU waits for the host is as fast as its CPU; the same configuration measured twice on
these machines differs by up to 62 %, and the same fixed pure-Python work takes 5-8 ms in one spell
and 10-16 ms in another, without steal time or a busy neighbour to see (docs/host.md, "The host's
own pace moves"; measure/probes/host_pace.py). A light process timing that work every `gap_s`
follows the trainer's host-paced steps (r about +0.8 per block on GPT-3 1.3B) at about 5 % of one
CPU and no cost to the steps that the probe could see. `calib measure` runs it beside every
training, so a bundle says how fast its host was while it ran (table host_pace, calib.bundle.schema).

The sampler is its own process, not a thread: a thread would share the trainer's GIL and time the
trainer as much as the CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from calib.bundle.schema import HOST_PACE_COLUMNS
from calib.errors import CalibError

if TYPE_CHECKING:
    import pandas as pd

PACE_ITERATIONS = 4_000  # iterations of python_work_us per sample: about 1 ms at the usual pace
PACE_GAP_S = 0.02  # seconds between samples: one sample per ~21 ms, ~5 % of one CPU


def python_work_us(n: int = 20_000, tries: int = 3) -> float:
    """Microseconds for a fixed pure-Python workload shaped like module-call glue (attribute lookups,
    small dicts, calls); the best of `tries`, so a preemption inside one does not count."""

    class Box:
        def __init__(self, v: int) -> None:
            self.v = v

        def get(self) -> int:
            return self.v

    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter_ns()
        acc = 0
        for i in range(n):
            b = Box(i)
            d = {"a": b, "k": i & 7}
            acc += d["a"].get() + d["k"]
        best = min(best, (time.perf_counter_ns() - t) / 1e3)
    return best


def sample_forever(log: Path, gap_s: float = PACE_GAP_S, iterations: int = PACE_ITERATIONS) -> None:
    """Write one line per sample until killed, or until the process that started it is gone (a
    launcher killed outright must not leave a sampler running): its start (perf_counter_ns,
    CLOCK_MONOTONIC, the clock the trainer stamps its steps with) and the microseconds the work took."""
    parent = os.getppid()
    with open(log, "w") as f:
        while os.getppid() == parent:
            t = time.perf_counter_ns()
            f.write(f"{t} {python_work_us(iterations, tries=1):.1f}\n")
            f.flush()
            time.sleep(gap_s)


def read_log(text: str, t0: float) -> pd.DataFrame:
    """HOST_PACE_COLUMNS from a sampler log; a line cut short by the kill is dropped, not misread."""
    # Imported here, not above: this module is the sampler's child process, which must start at once
    # (pandas and pyarrow alone took 8 s on a cold disk; measure/telemetry/__init__.py).
    import pandas as pd

    rows = []
    for line in text.split("\n")[:-1]:  # the last piece is "" or a line the kill cut short
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            ns, us = int(parts[0]), float(parts[1])
        except ValueError:
            continue
        if us > 0:
            rows.append((ns / 1e9 - t0, us / 1e6))
    return pd.DataFrame(rows, columns=HOST_PACE_COLUMNS)


class HostPaceSampler:
    """Runs `sample_forever` in a child process from start() to stop(); frame() is what it saw."""

    def __init__(self, log: Path, t0: float, gap_s: float = PACE_GAP_S, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.log = Path(log)
        self.t0 = t0
        self.gap_s = gap_s
        self.cwd = cwd
        self.env = env
        self._proc: subprocess.Popen | None = None
        self._span = (0.0, 0.0)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> HostPaceSampler:
        argv = [sys.executable, "-m", "measure.telemetry.host_pace", str(self.log), str(self.gap_s)]
        try:
            self._proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
        except OSError as exc:
            raise CalibError(f"host pace: cannot start its sampler process ({exc.strerror or exc})") from None
        self._span = (time.monotonic(), 0.0)
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.kill()
        self._proc.wait()
        self._span = (self._span[0], time.monotonic())

    def frame(self) -> pd.DataFrame:
        text = self.log.read_text() if self.log.is_file() else ""
        return read_log(text, self.t0)

    def rate_hz(self, samples: int) -> float:
        start, stop = self._span
        return samples / (stop - start) if stop > start else 0.0


def main(argv: list[str]) -> int:
    sample_forever(Path(argv[0]), float(argv[1]) if len(argv) > 1 else PACE_GAP_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
