"""Do the generator's memory-op layouts (calib.workload.ops.MEMOP_LAYOUT) match the profiled steps?

The kernel model times a memory-bound op by its family and operand layout (calib.ops.kernel_layout of
the profiled kernel's name); the generator's op templates carry the layout each role ran with. For
every real training bundle (default traces/h200) and pipeline stage, each generated memory op is
matched to the profiled kernels of its stage's representative rank (tp 0, dp 0) with the same aten
op and bytes (both follow calib.ops), and the layouts of those kernels are counted per role (the op's
template name, digits as #). Printed per role: the template's layout, the profiled layouts with
their kernel counts, `!` where the template's is not the most frequent one (exit status 1) and `?`
where the template lists none but the kernels name one. Roles no profiled kernel matches are listed
as unmatched.

    python benchmarks/memop_layouts.py [BUNDLE_DIRS...] [--calibration FILE]
"""

from __future__ import annotations

import argparse
import collections
import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: this checkout's calib
    sys.path.insert(0, str(ROOT))

NEAR = 1.5  # the largest size ratio at which the second pass pairs a template op with a kernel


def _tokens(ops: list) -> list[tuple[str, float]]:
    return [(str(a), float(b)) for a, b in ops]


def _equal_pairs(a: list, b: list) -> list[tuple[int, int]]:
    """(i, j) of the elements difflib's alignment of a with b matches (a[i] == b[j])."""
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [(i1 + d, j1 + d) for tag, i1, i2, j1, _ in sm.get_opcodes() if tag == "equal" for d in range(i2 - i1)]


def profiled_layouts(bundles: list, calibration: object) -> dict[tuple[str, str], dict[str, collections.Counter]]:
    """(role, aten_op) -> {"template": Counter of template layouts, "profiled": Counter of the layouts of
    the kernels matched on aten op and bytes, "near": the same matched on aten op and size within NEAR}.

    Per stage, the memory kernels of the profiled step (in start order; cuBLAS's memsets and the
    optimizer's _foreach_ chunks left out, as the templates have no such ops one by one) are aligned
    with each template's memory ops in program order (difflib on (aten op, bytes)): two ops of one
    aten op and size in a row (a K and a V gradient) are told apart by their order."""
    from calib.fit import shared_pieces
    from calib.ops import GEMM_OPS, kernel_layout
    from calib.validation import engine
    from calib.workload import ops as O
    from calib.workload.generate import generate
    from calib.workload.ops import role_of
    from calib.workload.parallel import rank_of

    km = calibration.kernel_model()  # type: ignore[attr-defined]
    out: dict[tuple[str, str], dict[str, collections.Counter]] = collections.defaultdict(
        lambda: {"template": collections.Counter(), "profiled": collections.Counter(), "near": collections.Counter()})

    def aligned(op: O.Item) -> bool:
        return isinstance(op, O.Op) and op.op_class == "memory" and not op.aten_op.startswith("aten::_foreach")

    for b in bundles:
        spec = b.manifest.spec
        model, par = engine.model_of(spec), engine.parallel_of(spec)
        gen = generate(model, par, km.predict)
        k = shared_pieces(b.table("kernels"))  # as calib fit reads it
        for stage in range(par.pp):
            kk = k[(k["rank"] == rank_of(0, 0, stage, par)) & (k["op_class"] == "memory")]
            kk = kk[(kk["step"] == kk["step"].min()) & ~kk["aten_op"].astype(str).isin(GEMM_OPS)
                    & ~kk["aten_op"].astype(str).str.startswith("aten::_foreach")].sort_values("start_s")
            prof = _tokens(zip(kk["aten_op"], kk["bytes"], strict=True))
            layouts = [kernel_layout(n) for n in kk["name"]]
            for key in gen.replayed[stage]:
                ops = [op for op in gen.templates[key] if aligned(op)]
                if not ops:
                    continue
                mine = _tokens((op.aten_op, op.bytes) for op in ops)
                for op in ops:
                    out[(role_of(op.name), op.aten_op)]["template"][op.layout] += 1
                for i, j in _equal_pairs(mine, prof):
                    out[(role_of(ops[i].name), ops[i].aten_op)]["profiled"][layouts[j]] += 1
                # Second pass on the aten op alone: ops whose bytes the converter counts otherwise
                # (a broadcast operand) or that vary per step (MoE expert token counts), paired only
                # where the sizes agree within NEAR.
                for i, j in _equal_pairs([t[0] for t in mine], [t[0] for t in prof]):
                    op, nbytes = ops[i], prof[j][1]
                    if max(op.bytes, nbytes) <= NEAR * max(min(op.bytes, nbytes), 1.0):
                        out[(role_of(op.name), op.aten_op)]["near"][layouts[j]] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    from calib.bundle.io import load_bundles
    from calib.calibration import Calibration

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="*", default=[str(ROOT / "traces" / "h200")])
    ap.add_argument("--calibration", default=str(ROOT / "calib" / "data" / "calibration-h200.yaml"))
    args = ap.parse_args(argv)
    bundles = sorted((b for b in load_bundles(args.bundles) if b.manifest.kind == "training"
                      and (b.manifest.gpu.vendor or "").lower() != "cpu"), key=lambda b: b.id)
    table = profiled_layouts(bundles, Calibration.load(args.calibration))
    unmatched, disagree, unlisted = [], 0, 0
    for (role, aten), e in sorted(table.items()):
        template = "/".join(sorted(e["template"])) or "-"
        seen, how = (e["profiled"], "profiled") if e["profiled"] else (e["near"], "near    ")
        if not seen:
            unmatched.append(f"{role} ({aten}, template {template or '-'})")
            continue
        top = seen.most_common(1)[0][0]
        listed = set(e["template"]) - {""}
        flag = " " if top in e["template"] else ("!" if listed else "?")
        disagree += flag == "!"
        unlisted += flag == "?"
        prof = ", ".join(f"{lay or '-'} {n}" for lay, n in seen.most_common())
        print(f"{flag} {role:42} {aten:30} template {template or '-':12} {how} {prof}")
    print(f"\n{disagree} of {len(table) - len(unmatched)} matched roles disagree with the profiled steps' most "
          f"frequent layout (!), {unlisted} have none listed where the kernels name one (?); "
          f"{len(unmatched)} roles unmatched:")
    for u in unmatched:
        print("  " + u)
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
