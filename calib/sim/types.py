"""What every simulator backend takes and returns.

A SimWorkload is one step's work for `num_ranks` ranks, given as one ExecutionTrace per rank
class: ranks whose work is identical up to their group coordinates share one trace, written from
the point of view of the class representative `rep` (its pg_name ids and send/recv peers). The
embedded backend simulates each class once; the ASTRA-sim backend needs one file per rank and
asks `materialize(rank)` for it. A workload read from per-rank files has one class per rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from calib.chakra.model import ExecutionTrace


@dataclass
class RankClass:
    rep: int
    members: list[int]
    trace: ExecutionTrace


@dataclass
class SimWorkload:
    num_ranks: int
    classes: list[RankClass]
    comm_groups: dict[int, list[int]] = field(default_factory=dict)
    # rank -> that rank's own ET (pg ids and peers rewritten for it); needed only to write files.
    materialize: Callable[[int], ExecutionTrace] | None = None
    # Set by a maker that keeps its classes' nodes, ids, types and dependencies as they are from one simulation
    # to the next, changing durations and attributes only (a host fit re-costs one workload in place at dozens
    # of costs): the embedded simulator then orders each class's dependency graph once (`graphs`), not at
    # every simulation.
    fixed_structure: bool = False
    graphs: list = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def per_rank(cls, traces: dict[int, ExecutionTrace], comm_groups: dict[int, list[int]] | None = None) -> SimWorkload:
        n = len(traces)
        classes = [RankClass(rep=r, members=[r], trace=traces[r]) for r in sorted(traces)]
        return cls(num_ranks=n, classes=classes, comm_groups=dict(comm_groups or {}), materialize=traces.__getitem__)

    def class_of(self) -> list[int]:
        """rank -> index into `classes`."""
        out = [-1] * self.num_ranks
        for i, c in enumerate(self.classes):
            for r in c.members:
                out[r] = i
        return out

    def trace_of(self, rank: int) -> ExecutionTrace:
        if self.materialize is not None:
            return self.materialize(rank)
        for c in self.classes:
            if c.rep == rank:
                return c.trace
        raise KeyError(rank)


@dataclass
class SimResult:
    """Per-rank results in integer nanoseconds (ASTRA-sim's cycles), expanded to every rank."""

    backend: str
    finish_ns: list[int]
    exposed_comm_ns: list[int]
    # Per rank: time during which a node of each category (node attr `category`, else "compute",
    # "comm", "cpu") was running, and the part of each communication category not hidden behind
    # compute ("exposed"). Empty for backends that cannot tell (ASTRA-sim).
    busy_ns: list[dict[str, int]] = field(default_factory=list)
    exposed_ns: list[dict[str, int]] = field(default_factory=list)
    wall_s: float = 0.0
    simulated_ranks: int = 0  # how many rank timelines were actually simulated (symmetry)

    @property
    def step_time_s(self) -> float:
        return max(self.finish_ns) * 1e-9 if self.finish_ns else 0.0

    def to_dict(self) -> dict:
        """JSON-ready: per-rank lists in ns, plus the step time in seconds."""
        return {
            "backend": self.backend,
            "num_ranks": len(self.finish_ns),
            "step_time_s": self.step_time_s,
            "max_finish_ns": max(self.finish_ns) if self.finish_ns else 0,
            "finish_ns": list(self.finish_ns),
            "exposed_comm_ns": list(self.exposed_comm_ns),
            "busy_ns": list(self.busy_ns),
            "exposed_ns": list(self.exposed_ns),
            "wall_s": self.wall_s,
            "simulated_ranks": self.simulated_ranks,
        }
