"""Regenerate the per-case agreement table of docs/simulator.md: the embedded simulator against
ASTRA-sim's own answers on every case of ../shared/reference/astra-sim-cases/.

Usage: python benchmarks/sim_agreement.py [CASES_DIR] [--check]   (--check: fail if the doc is stale)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from calib.sim.reference import case_dirs, run_case

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "simulator.md"
BEGIN, END = "<!-- agreement:begin -->", "<!-- agreement:end -->"


def table(cases_dir: Path) -> str:
    rows = [run_case(d) for d in case_dirs(cases_dir)]
    exact = sum(r.exact for r in rows)
    worst = max(rows, key=lambda r: r.max_finish_err)
    out = [
        f"{len(rows)} cases; {exact} agree to the nanosecond on every rank (finish and exposed communication); "
        f"worst per-rank finish-time difference {worst.max_finish_err * 100:.4f}% (`{worst.name}`).",
        "",
        "| case | ranks | ASTRA-sim max finish (ns) | calib max finish (ns) | max per-rank finish diff | max per-rank exposed diff | exact |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        out.append(
            f"| `{r.name}` | {r.ranks} | {r.expected_max_ns} | {r.got_max_ns} | {r.max_finish_err * 100:.4f}% | "
            f"{r.max_exposed_err * 100:.4f}% | {'yes' if r.exact else 'no'} |"
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    shared = Path(os.environ.get("CALIB_SHARED", ROOT.parent / "shared"))
    cases = Path(args[0]) if args else shared / "reference" / "astra-sim-cases"
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{table(cases)}\n{END}{tail}"
    if check:
        if new != text:
            print(f"{DOC} is stale: run python benchmarks/sim_agreement.py", file=sys.stderr)
            return 1
        return 0
    tmp = DOC.with_suffix(".md.partial")
    tmp.write_text(new)
    os.replace(tmp, DOC)
    print(f"wrote the agreement table of {len(case_dirs(cases))} cases into {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
