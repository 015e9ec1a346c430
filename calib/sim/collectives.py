"""ASTRA-sim's collective algorithms, congestion-unaware, as per-rank message programs.

A collective of S bytes is cut into chunks (preferred-dataset-splits); every chunk runs a plan of
phases (localBWAware: reduce-scatter up the dimensions, all-reduce on the last, all-gather back
down; baseline: an all-reduce per dimension). On every rank each network dimension is a FIFO
server running at most active-chunks-per-dimension chunk phases at once, shared by all phases
on that dimension. Inside a phase every rank runs a small program of sends and waits:

    send(dst, bytes, tag)            eager: the message arrives after T(bytes) on its route
    wait(messages, reduce_bytes)     t = max(t, arrivals) + E + P(reduce_bytes)

and leaves the phase one endpoint delay E after its last wait (the double binary tree places its
delays as ASTRA-sim's tree state machine does: see `program`). P(m) = 3 * floor(m / L) is the
cost of reducing m received bytes (read twice, write once) at local memory bandwidth L.
Nothing contends, so a phase's times are a max-plus function of the ranks' start times; the
only ordering that matters is each rank's server queue, simulated with an event heap.

Why programs and not closed forms: members may start a collective at different times
(stragglers), and rings over communicator sub-groups cross dimensions with different link
times; both make finish times differ per rank exactly as ASTRA-sim's per-rank state machines
do. When all members start together and every link of the phase costs the same, one rank's
program answers for all (the symmetric fast path used at thousands of ranks).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from calib.chakra.model import CommType
from calib.errors import CalibError
from calib.sim.config import SystemConfig
from calib.sim.network import MultiDimTopology

AR, RS, AG, A2A = "ALL_REDUCE", "REDUCE_SCATTER", "ALL_GATHER", "ALL_TO_ALL"
KINDS = {CommType.ALL_REDUCE: AR, CommType.REDUCE_SCATTER: RS, CommType.ALL_GATHER: AG, CommType.ALL_TO_ALL: A2A}
GROUP_ENDPOINT_DELAY_NS = 10  # ASTRA-sim uses 10 ns for sub-group collectives whatever the system says
GROUP = -1  # phase "dimension" of a communicator sub-group: one ring over its ranks, in file order


@dataclass(frozen=True)
class Phase:
    kind: str
    impl: str
    size: int  # bytes of one chunk entering this phase, on one rank
    dim: int  # network dimension, or GROUP

    n: int = 1  # ranks taking part (size of the dimension or of the group)
    reverse: bool = False  # ring direction: receive from the next position instead of the previous

    @property
    def out_size(self) -> int:
        if self.impl == "doubleBinaryTree":  # always a whole tree all-reduce: the data keeps its size
            return self.size
        return self.size // self.n if self.kind == RS else self.size * self.n if self.kind == AG else self.size


@dataclass(frozen=True)
class Plan:
    phases: tuple[Phase, ...]
    chunks: int
    endpoint_ns: int


def _impl(system: SystemConfig, kind: str, dim: int) -> str:
    table = {
        AR: system.all_reduce_impl,
        RS: system.reduce_scatter_impl,
        AG: system.all_gather_impl,
        A2A: system.all_to_all_impl,
    }[kind]
    if not table:
        raise CalibError(f"system configuration has no {kind.lower().replace('_', '-')}-implementation")
    if dim == GROUP:
        # A sub-group is one ring: ASTRA-sim keeps a single listed implementation, but replaces a
        # multi-dimensional list by ring (its CommunicatorGroup plan).
        return table[0] if len(table) == 1 else "ring"
    return table[min(dim, len(table) - 1)]


def chunking(kind: str, size: int, total_ranks: int, system: SystemConfig) -> tuple[int, int]:
    """(chunk bytes, number of chunks); every chunk is full size, as ASTRA-sim counts them."""
    splits = max(1, int(system.preferred_dataset_splits))
    chunk = size // splits
    if kind != AG and chunk < total_ranks:
        return total_ranks, splits  # ASTRA-sim then also grows the collective to splits x chunk
    chunk = max(chunk, 1)
    return chunk, max(1, math.ceil(size / chunk))


def plan_collective(
    kind: str, size: int, members: list[int], topo: MultiDimTopology, system: SystemConfig
) -> Plan:
    chunk, nchunks = chunking(kind, size, topo.npus, system)
    if len(members) != topo.npus:  # a sub-group: one ring over its ranks on the physical network
        n = len(members)
        phase = Phase(kind, _impl(system, kind, GROUP), chunk, GROUP, n)
        return Plan((phase,) if n > 1 else (), nchunks, GROUP_ENDPOINT_DELAY_NS)
    dims = [d for d, n in enumerate(topo.shape) if n > 1 and d < _dims_configured(system, kind, topo)]
    phases: list[Phase] = []
    data = chunk

    def add(k: str, d: int, reverse: bool = False) -> None:
        nonlocal data
        # Every phase of a collective takes its algorithm from that collective's own list (the
        # reduce-scatter and all-gather phases of an all-reduce use the all-reduce list).
        ph = Phase(k, _impl(system, kind, d), data, d, topo.shape[d], reverse)
        phases.append(ph)
        data = ph.out_size

    if kind == AR and system.collective_optimization == "baseline":
        for d in dims:
            add(AR, d)
    elif kind == AR:
        for d in dims[:-1]:
            add(RS, d)
        if dims:
            add(AR, dims[-1])
        for d in reversed(dims[:-1]):
            add(AG, d, reverse=True)
    elif kind == RS:
        for d in dims:
            add(RS, d)
    elif kind == AG:
        for d in reversed(dims):
            add(AG, d)
    else:
        for d in dims:
            add(A2A, d)
    return Plan(tuple(phases), nchunks, int(system.endpoint_delay_ns))


def _dims_configured(system: SystemConfig, kind: str, topo: MultiDimTopology) -> int:
    """An implementation list shorter than the network uses only its first dimensions."""
    table = {AR: system.all_reduce_impl, RS: system.reduce_scatter_impl, AG: system.all_gather_impl, A2A: system.all_to_all_impl}[kind]
    if len(table) > len(topo.shape):
        raise CalibError(
            f"system configuration lists {len(table)} {kind.lower().replace('_', '-')} implementations "
            f"for a {len(topo.shape)}-dimensional network"
        )
    return len(table)


# --- per-rank programs --------------------------------------------------------------------------
# An op is ("send", [dst positions], bytes, tag), ("wait", [(src position, tag)], reduce_bytes, bytes),
# ("delay",) (one endpoint delay), a final ("exit",): the phase ends now, not one delay later, or
# ("dar", peers, reduce_bytes, bytes, [all-gather dsts], [all-gather srcs], all-gather reduce_bytes):
# the rest of a direct all-reduce after its reduce-scatter sends (see `_interpret`).


def _tree_links(n: int) -> list[tuple[int, list[int]]]:
    """(parent, children) per position of the RootMax binary tree: in-order numbering, root n-1."""
    parent = [-1] * n
    children: list[list[int]] = [[] for _ in range(n)]

    def build(lo: int, hi: int) -> int:  # in-order tree over positions lo..hi, returns its root
        if lo > hi:
            return -1
        x = 1 << ((hi + 1).bit_length() - 1)  # largest power of two <= hi + 1 (1-indexed)
        mid = x - 1 if lo == 0 else (lo + hi) // 2
        for sub in (build(lo, mid - 1), build(mid + 1, hi)):
            if sub >= 0:
                parent[sub] = mid
                children[mid].append(sub)
        return mid

    if n == 1:
        return [(-1, [])]
    top = n - 1
    sub = build(0, n - 2)
    parent[sub] = top
    children[top].append(sub)
    return [(parent[i], children[i]) for i in range(n)]


def program(ph: Phase, pos: int, n: int, chunk_index: int) -> list[tuple]:
    m = ph.size
    ops: list[tuple] = []
    if ph.impl == "doubleBinaryTree":
        # Successive chunks alternate between the RootMax tree and its mirror image (RootMin).
        mirror = chunk_index % 2 == 1
        links = _tree_links(n)
        p = n - 1 - pos if mirror else pos
        par, kids = links[p]
        conv = (lambda q: n - 1 - q) if mirror else (lambda q: q)
        par_pos = conv(par) if par >= 0 else -1
        kid_pos = [conv(k) for k in kids]
        # A leaf first hands its data to the network (one endpoint delay), an inner node or the
        # root leaves as soon as it has sent down: the phase ends without a trailing delay.
        if not kid_pos:
            ops.append(("delay",))
        if kid_pos:
            ops.append(("wait", [(k, "up") for k in kid_pos], m, m))
        if par_pos >= 0:
            ops.append(("send", [par_pos], m, "up"))
            ops.append(("wait", [(par_pos, "down")], m if kid_pos else 0, m))
        if kid_pos:
            ops.append(("send", kid_pos, m, "down"))
        ops.append(("exit",))
        return ops
    if ph.impl == "halvingDoubling":
        k = max(1, (n - 1).bit_length())
        if 1 << k != n:
            raise CalibError(f"halvingDoubling needs a power-of-two number of ranks, got {n}")
        if ph.kind == A2A:
            raise CalibError("halvingDoubling has no all-to-all; use ring or direct")
        if ph.kind in (AR, RS):  # halving: reduce-scatter
            for i in range(1, k + 1):
                peer = pos ^ (1 << (i - 1))
                ops.append(("send", [peer], m >> i, ("rs", i)))
                # ASTRA-sim charges the reduction of each received half to the packet it sends
                # next (m / 2^(i+1)); the last exchange's reduction is not charged.
                ops.append(("wait", [(peer, ("rs", i))], (m >> (i + 1)) if i < k else 0, m >> i))
        if ph.kind in (AR, AG):  # doubling: all-gather (of the whole n-fold result for AG)
            top = m if ph.kind == AR else m * n
            for i in range(k, 0, -1):
                peer = pos ^ (1 << (i - 1))
                ops.append(("send", [peer], top >> i, ("ag", i)))
                ops.append(("wait", [(peer, ("ag", i))], 0, top >> i))
        return ops
    if ph.impl == "direct":
        peers = [q for q in range(n) if q != pos]
        part = m // n
        if ph.kind == AR:
            # Over a sub-group ring ASTRA-sim budgets (n-1)^2 reducing packets instead of n-1, so for
            # n >= 3 the all-gather half is reduced too (seen as one extra P in cg_halves_direct_fc8).
            again = part if ph.dim == GROUP and (n - 1) ** 2 >= 2 * (n - 1) else 0
            # Each received reduce-scatter piece is reduced on its own; once every piece has arrived,
            # each finished reduction releases one all-gather message, to the peers in ring order.
            ops.append(("send", peers, part, "rs"))
            ops.append(("dar", peers, part, part, [(pos + k) % n for k in range(1, n)],
                        [(pos - k) % n for k in range(1, n)], again))
            return ops
        if ph.kind == RS:
            steps = [(part, part)]
        elif ph.kind == AG:
            steps = [(m, 0)]
        else:
            steps = [(part, 0)]
        for s, (size, red) in enumerate(steps):
            ops.append(("send", peers, size, s))
            ops.append(("wait", [(q, s) for q in peers], red, size))
        return ops
    # ring
    step = -1 if ph.reverse else 1
    succ, pred = (pos + step) % n, (pos - step) % n
    if ph.kind == AR:
        steps = [(m // n, True)] * (n - 1) + [(m // n, False)] * (n - 1)
    elif ph.kind == RS:
        steps = [(m // n, True)] * (n - 1)
    elif ph.kind == AG:
        steps = [(m, False)] * (n - 1)
    else:
        steps = [(m // n, False)] * (n * (n - 1) // 2)
    for s, (size, red) in enumerate(steps):
        ops.append(("send", [succ], size, s))
        ops.append(("wait", [(pred, s)], size if red else 0, size))
    return ops


class CollectiveTimer:
    """Times collectives on one network and system; answers are cached by shape and start offsets."""

    def __init__(self, topo: MultiDimTopology, system: SystemConfig) -> None:
        self.topo = topo
        self.system = system
        lmb = system.local_mem_bw_gbps
        self.mem_bytes_per_ns = float(lmb) if lmb else 0.0  # GB/s with GB = 10^9 bytes = bytes/ns
        self._cache: dict[tuple, list[int]] = {}
        self._prog_cache: dict[tuple, list[tuple]] = {}
        self._msg_cache: dict[tuple[int, int, int], int] = {}
        self._plans: dict[tuple, Plan] = {}
        self._trees_built: dict[tuple[str, int], int] = {}  # (kind, dim) -> tree phases built so far

    def reduce_ns(self, nbytes: int) -> int:
        if nbytes <= 0 or self.mem_bytes_per_ns <= 0:
            return 0
        return 3 * int(nbytes // self.mem_bytes_per_ns)

    def finish_times(
        self, kind: str, size: int, members: list[int], starts: list[int], group_key: object = None
    ) -> list[int]:
        """Per-member finish time of one collective whose members start at `starts` (ns).

        `group_key` names the member list for the cache (e.g. the pg id); None: the list itself."""
        t0 = min(starts)
        rel = tuple(s - t0 for s in starts)
        gkey = tuple(members) if group_key is None else group_key
        plan = self._plans.get((kind, size, gkey))
        if plan is None:
            plan = self._plans[(kind, size, gkey)] = plan_collective(kind, size, members, self.topo, self.system)
        trees = self._tree_parities(kind, plan)
        key = (kind, size, gkey, rel, tuple(sorted(trees.items())))
        hit = self._cache.get(key)
        if hit is None:
            if not plan.phases:
                hit = [r + 1 for r in rel]
            elif not any(rel) and self._symmetric(plan, members):
                one = self._run(plan, members, list(rel), only=members[0])
                hit = [one[0]] * len(members)
            else:
                hit = self._run_lines(plan, members, list(rel), trees)
            self._cache[key] = hit
        return [t0 + h for h in hit]

    def _tree_parities(self, kind: str, plan: Plan) -> dict[tuple[int, int], int]:
        """Which of the two trees each (chunk, phase) of a double-binary-tree plan uses.

        ASTRA-sim keeps one tree pair per dimension and alternates it every time it builds a phase
        on it, across collectives: the k-th tree phase on a dimension (counting all earlier
        collectives of the same type) uses the RootMax tree when k is even, its mirror when odd."""
        out: dict[tuple[int, int], int] = {}
        for p, ph in enumerate(plan.phases):
            if ph.impl == "doubleBinaryTree" and ph.dim != GROUP:
                for c in range(plan.chunks):
                    out[(c, p)] = 0
        if not out:
            return out
        for c in range(plan.chunks):
            for p, ph in enumerate(plan.phases):
                if (c, p) in out:
                    k = self._trees_built.get((kind, ph.dim), 0)
                    out[(c, p)] = k % 2
                    self._trees_built[(kind, ph.dim)] = k + 1
        return out

    # -- internals --------------------------------------------------------------------------------
    def _line(self, ph: Phase, members: list[int], rank: int, where: dict[int, int]) -> tuple[list[int], int]:
        if ph.dim == GROUP:
            return members, where[rank]
        return self.topo.line(rank, ph.dim), self.topo.coord(rank, ph.dim)

    def _symmetric(self, plan: Plan, members: list[int]) -> bool:
        """True when every rank's program sees the same link times (one rank answers for all)."""
        for ph in plan.phases:
            if ph.impl == "doubleBinaryTree" or (ph.impl == "direct" and ph.kind == AR):
                return False
            if ph.dim == GROUP:
                n = len(members)
                if ph.impl == "ring":
                    routes = {self.topo.route(members[i], members[(i + 1) % n]) for i in range(n)}
                    if len(routes) > 1:
                        return False
                else:
                    if len({self.topo.route(a, b) for a in members for b in members if a != b}) > 1:
                        return False
        return True

    def _prog(self, ph: Phase, pos: int, n: int, chunk: int) -> list[tuple]:
        key = (ph, pos, n, chunk % 2 if ph.impl == "doubleBinaryTree" else 0)
        p = self._prog_cache.get(key)
        if p is None:
            p = self._prog_cache[key] = program(ph, pos, n, chunk)
        return p

    def _run(self, plan: Plan, members: list[int], rel: list[int], only: int | None = None) -> list[int]:
        """Event simulation of chunks through per-rank dimension servers; returns finish per member
        (or [finish of `only`] on the symmetric fast path, where a rank's peers mirror it)."""
        E = plan.endpoint_ns
        cap = max(1, int(self.system.active_chunks_per_dimension))
        nph = len(plan.phases)
        ranks = [only] if only is not None else members
        where = {m: j for j, m in enumerate(members)}
        start = {r: rel[where[r]] for r in ranks}
        # per (chunk, phase, rank): program counter, local time, sent[tag] times
        state: dict[tuple[int, int, int], list] = {}
        sent: dict[tuple, int] = {}  # (chunk, phase, src, dst, tag) -> send time
        waiting: dict[tuple, list[tuple[int, int, int]]] = {}
        busy: dict[tuple[int, int], int] = {}
        queue: dict[tuple[int, int], list[tuple[int, int]]] = {}
        done_at: dict[int, int] = {}
        left = {r: plan.chunks for r in ranks}
        heap: list[tuple[int, int, str, int, int, int]] = []
        seq = 0

        def push(t: int, what: str, r: int, c: int, p: int) -> None:
            nonlocal seq
            heapq.heappush(heap, (t, seq, what, r, c, p))
            seq += 1

        def advance(c: int, p: int, r: int) -> None:
            ph = plan.phases[p]
            st = state[(c, p, r)]
            line, pos = self._line(ph, members, r, where)
            ops = self._prog(ph, pos, len(line), c)
            while st[0] < len(ops):
                op = ops[st[0]]
                if op[0] == "delay":
                    st[1] += E
                    st[0] += 1
                    continue
                if op[0] == "exit":
                    push(st[1], "done", r, c, p)
                    return
                if op[0] == "dar":  # never on this path: _symmetric sends direct all-reduce to _run_lines
                    raise CalibError("direct all-reduce needs the line engine (internal)")
                if op[0] == "send":
                    _, dsts, _nbytes, tag = op
                    st[2][tag] = st[1]
                    for dq in dsts:
                        dst = line[dq]
                        sent[(c, p, r, dst, tag)] = st[1]
                        for w in waiting.pop((c, p, r, dst, tag), ()):
                            advance(*w)
                        if only is not None:
                            break
                    st[0] += 1
                    continue
                _, srcs, red, size = op
                arrive = st[1]
                for sq, tag in srcs:
                    src = line[sq]
                    if only is not None:  # mirror: the peer sent this tag when we sent ours
                        t_send = st[2].get(tag, st[1])
                    else:
                        got = sent.get((c, p, src, r, tag))
                        if got is None:
                            waiting.setdefault((c, p, src, r, tag), []).append((c, p, r))
                            return
                        t_send = got
                    arrive = max(arrive, t_send + self.topo.message_ns(src, r, size))
                st[1] = arrive + E + self.reduce_ns(red)
                st[0] += 1
            push(st[1] + E, "done", r, c, p)

        def begin(r: int, c: int, p: int, t: int) -> None:  # noqa: ARG001 - p, c name the phase
            state[(c, p, r)] = [0, t, {}]  # program counter, local clock, own send time per tag
            advance(c, p, r)

        def offer(r: int, d: int, c: int, p: int, t: int) -> None:
            q = queue.setdefault((r, d), [])
            q.append((c, p))
            while q and busy.get((r, d), 0) < cap:
                c2, p2 = q.pop(0)
                busy[(r, d)] = busy.get((r, d), 0) + 1
                begin(r, c2, p2, t)

        for r in ranks:
            for c in range(plan.chunks):
                push(start[r], "ready", r, c, 0)
        while heap:
            t, _, what, r, c, p = heapq.heappop(heap)
            if what == "ready":
                offer(r, plan.phases[p].dim, c, p, t)
                continue
            d = plan.phases[p].dim
            busy[(r, d)] -= 1
            state.pop((c, p, r), None)
            if p + 1 < nph:
                push(t, "ready", r, c, p + 1)
            else:
                left[r] -= 1
                if left[r] == 0:
                    done_at[r] = t
            q = queue.get((r, d))
            while q and busy[(r, d)] < cap:
                c2, p2 = q.pop(0)
                busy[(r, d)] += 1
                begin(r, c2, p2, t)
        if len(done_at) != len(ranks):
            stuck = [r for r in ranks if r not in done_at]
            raise CalibError(f"collective on ranks {members[:8]}... never completed on rank {stuck[0]} (internal)")
        return [done_at[r] for r in ranks]

    # -- the general path: members start at different times, or links differ ------------------------
    def _msg_ns(self, src: int, dst: int, size: int) -> int:
        key = (src, dst, size)
        t = self._msg_cache.get(key)
        if t is None:
            t = self._msg_cache[key] = self.topo.message_ns(src, dst, size)
        return t

    def _run_lines(
        self, plan: Plan, members: list[int], rel: list[int], trees: dict[tuple[int, int], int] | None = None
    ) -> list[int]:
        """Chunks through per-rank dimension servers, event by event; a phase is computed for a
        whole line (the ranks that run it together) once all of them have started it. That is
        causal: every algorithm here makes each rank's finish wait for every line member's data."""
        E = plan.endpoint_ns
        cap = max(1, int(self.system.active_chunks_per_dimension))
        nph = len(plan.phases)
        where = {m: j for j, m in enumerate(members)}
        heap: list[tuple[int, int, int, int, int, bool]] = []  # (time, seq, rank, chunk, phase, done?)
        seq = 0
        busy: dict[tuple[int, int], int] = {}
        queue: dict[tuple[int, int], deque] = {}
        started: dict[tuple[int, int, int], dict[int, int]] = {}
        lines: dict[tuple[int, int], list[int]] = {}
        left = dict.fromkeys(members, plan.chunks)
        done_at: dict[int, int] = {}

        def push(t: int, r: int, c: int, p: int, done: bool) -> None:
            nonlocal seq
            heapq.heappush(heap, (t, seq, r, c, p, done))
            seq += 1

        def begin(r: int, c: int, p: int, t: int) -> None:
            ph = plan.phases[p]
            if ph.dim == GROUP:
                base, line, pos = -1, members, where[r]
            else:
                pos = self.topo.coord(r, ph.dim)
                base = r - pos * self.topo.strides[ph.dim]
                line = lines.get((ph.dim, base))
                if line is None:
                    line = lines[(ph.dim, base)] = self.topo.line(r, ph.dim)
            got = started.setdefault((c, p, base), {})
            got[pos] = t
            if len(got) == len(line):
                del started[(c, p, base)]
                # a tree phase takes its tree from `trees`; other programs ignore the index
                which = trees.get((c, p), c) if trees else c
                fin = self._line_finish(ph, line, [got[i] for i in range(len(line))], E, which)
                for i, f in enumerate(fin):
                    push(f, line[i], c, p, True)

        def serve(r: int, d: int, t: int) -> None:
            q = queue.get((r, d))
            while q and busy.get((r, d), 0) < cap:
                c2, p2 = q.popleft()
                busy[(r, d)] = busy.get((r, d), 0) + 1
                begin(r, c2, p2, t)

        for r in members:
            for c in range(plan.chunks):
                push(rel[where[r]], r, c, 0, False)
        while heap:
            t, _, r, c, p, done = heapq.heappop(heap)
            d = plan.phases[p].dim
            if not done:
                queue.setdefault((r, d), deque()).append((c, p))
                serve(r, d, t)
                continue
            busy[(r, d)] -= 1
            if p + 1 < nph:
                push(t, r, c, p + 1, False)
            else:
                left[r] -= 1
                if left[r] == 0:
                    done_at[r] = t
            serve(r, d, t)
        if len(done_at) != len(members):
            raise CalibError(
                f"{plan.phases[0].kind} over {len(members)} ranks deadlocks in its chunk pipeline: its members start "
                f"at different times and their chunks wait for each other on the dimension queues "
                f"(active-chunks-per-dimension {cap}); ASTRA-sim hangs on it the same way"
            )
        return [done_at[r] for r in members]

    def _line_finish(self, ph: Phase, line: list[int], starts: list[int], E: int, chunk: int) -> list[int]:
        """Finish time of every position of one phase run together by `line`, given their starts."""
        n = len(line)
        if ph.impl == "ring" or (ph.impl == "direct" and ph.kind != AR):
            steps = [(op[2], op[3]) for op in self._prog(ph, 0, n, chunk) if op[0] == "wait"]
            s = np.asarray(starts, dtype=np.int64)
            if ph.impl == "ring":
                links: dict[int, np.ndarray] = {}
                step = -1 if ph.reverse else 1
                for red, size in steps:
                    T = links.get(size)
                    if T is None:
                        T = np.array([self._msg_ns(line[(i - step) % n], line[i], size) for i in range(n)], dtype=np.int64)
                        links[size] = T
                    s = np.maximum(s, np.roll(s, step) + T) + (E + self.reduce_ns(red))
            else:
                never = np.iinfo(np.int64).min // 4
                mats: dict[int, np.ndarray] = {}
                for red, size in steps:
                    M = mats.get(size)
                    if M is None:  # M[j, i]: time of j's message to i
                        M = np.array([[self._msg_ns(a, b, size) if a != b else never for b in line] for a in line], dtype=np.int64)
                        mats[size] = M
                    s = np.maximum(s, (s[:, None] + M).max(axis=0)) + (E + self.reduce_ns(red))
            return [int(x) + E for x in s]
        return self._interpret(ph, line, starts, E, chunk)

    def _interpret(self, ph: Phase, line: list[int], starts: list[int], E: int, chunk: int) -> list[int]:
        """Run every position's program (any algorithm) with message passing inside the line."""
        n = len(line)
        progs = [self._prog(ph, i, n, chunk) for i in range(n)]
        pc = [0] * n
        clock = list(starts)
        fin: list[int | None] = [None] * n
        sent: dict[tuple, int] = {}
        waiting: dict[tuple, int] = {}
        dar: dict[int, dict] = {}
        todo = list(range(n))
        while todo:
            i = todo.pop()
            ops = progs[i]
            while fin[i] is None:
                if pc[i] == len(ops):
                    fin[i] = clock[i] + E
                    break
                op = ops[pc[i]]
                if op[0] == "delay":
                    clock[i] += E
                elif op[0] == "exit":
                    fin[i] = clock[i]
                    break
                elif op[0] == "send":
                    for dq in op[1]:
                        sent[(i, dq, op[3])] = clock[i]
                        w = waiting.pop((i, dq, op[3]), None)
                        if w is not None:
                            todo.append(w)
                elif op[0] == "dar":
                    if not self._direct_allreduce(i, op, line, clock, dar, sent, waiting, todo, E):
                        break  # blocked on a message; resumed when it is sent
                else:
                    arrive = clock[i]
                    for sq, tag in op[1]:
                        t = sent.get((sq, i, tag))
                        if t is None:
                            waiting[(sq, i, tag)] = i
                            break
                        arrive = max(arrive, t + self._msg_ns(line[sq], line[i], op[3]))
                    else:
                        clock[i] = arrive + E + self.reduce_ns(op[2])
                        pc[i] += 1
                        continue
                    break  # blocked on a message; resumed when it is sent
                pc[i] += 1
        if any(f is None for f in fin):
            raise CalibError(f"{ph.impl} {ph.kind} over {n} ranks did not complete (internal)")
        return [int(f) for f in fin]  # type: ignore[arg-type]

    def _direct_allreduce(self, i: int, op: tuple, line: list[int], clock: list[int], dar: dict, sent: dict,
                          waiting: dict, todo: list, E: int) -> bool:
        """Direct all-reduce after its reduce-scatter sends, as ASTRA-sim's AllToAll algorithm runs it.

        Every received piece is reduced on its own; each finished reduction, and later each
        finished all-gather receive, frees one send slot. The all-gather may start once every
        reduce-scatter piece has arrived (g: the first reduction finished no earlier than the last
        arrival); its k-th message (to the k-th peer in ring order) leaves at max(g, the k-th freed
        slot). The rank is done when the last slot is freed. With equal link times this is
        max(arrivals) + E + P for every message; on a Ring, a reduction slower than the farthest
        peer's extra hops lets the near peers' pieces start the all-gather early.
        Returns False when blocked on a message (`waiting` says which), True when done."""
        _, peers, red_rs, size, ag_dsts, ag_srcs, red_ag = op
        st = dar.get(i)
        if st is None:
            arrivals = []
            for q in peers:
                t = sent.get((q, i, "rs"))
                if t is None:
                    waiting[(q, i, "rs")] = i
                    return False
                arrivals.append(max(clock[i], t + self._msg_ns(line[q], line[i], size)))
            last = max(arrivals)
            p_rs = self.reduce_ns(red_rs)
            freed = sorted(t + E + p_rs for t in arrivals)
            st = dar[i] = {"freed": freed, "g": min(t for t in freed if t >= last), "sends": [], "ag": []}
        p_ag = self.reduce_ns(red_ag)
        n_ag = len(ag_dsts)
        while len(st["ag"]) < n_ag:
            k = len(st["sends"]) + 1  # next all-gather message, needs every receive j < k known
            while len(st["ag"]) < min(k - 1, n_ag):
                j = len(st["ag"]) + 1
                src = ag_srcs[j - 1]
                t = sent.get((src, i, ("ag", j)))
                if t is None:
                    waiting[(src, i, ("ag", j))] = i
                    return False
                arrive = t + self._msg_ns(line[src], line[i], size)
                st["ag"].append(max(st["sends"][j - 1], arrive) + E + p_ag)
            if k > n_ag:
                continue
            when = max(st["g"], sorted(st["freed"] + st["ag"])[k - 1])
            st["sends"].append(when)
            dst = ag_dsts[k - 1]
            sent[(i, dst, ("ag", k))] = when
            w = waiting.pop((i, dst, ("ag", k)), None)
            if w is not None:
                todo.append(w)
        clock[i] = max(st["freed"] + st["ag"])
        return True
