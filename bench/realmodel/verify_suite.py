#!/usr/bin/env python3
"""Prove that every case of the benchmark's suites judges what it says
(bench/realmodel/README.md): on a temp copy of its untouched workspace the case must
fail (at least one check fails), and on a copy with the hand-made solution laid over it
it must pass (every check passes). Uses the same check code as the Python runners
(frameworks/suite.py), so no model and no venv are needed.

A solution is solutions/<case>/files/... (files laid over the workspace, replacing or
adding) and, for a question, solutions/<case>/answer.txt (the final answer).

    python3 bench/realmodel/verify_suite.py [SUITE.toml ...]   # default: suite.toml smoke.toml
"""

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "frameworks"))

from suite import copy_workspace, load_suite, run_checks  # noqa: E402


def outcome(answer=None) -> dict:
    """What a run that did nothing wrong would report, apart from the workspace and answer."""
    return {"answer": answer, "status": "DONE", "steps": 1, "prompt_tokens": 0,
            "completion_tokens": 0, "cost_usd": 0.0, "tools_called": []}


def judge(case, solution: Path | None) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix=f"verify-{case.name}-") as tmp:
        workspace = copy_workspace(case, tmp)
        answer = None
        if solution is not None:
            files = solution / "files"
            if files.is_dir():
                shutil.copytree(files, workspace, dirs_exist_ok=True)
            if (solution / "answer.txt").is_file():
                answer = (solution / "answer.txt").read_text().strip()
        return run_checks(case, workspace, outcome(answer))


def main() -> int:
    suites = sys.argv[1:] or [str(HERE / "suite.toml"), str(HERE / "smoke.toml")]
    wrong = []
    for path in suites:
        suite = load_suite(path)
        print(f"{path}: {len(suite.cases)} cases")
        for case in suite.cases:
            solution = HERE / "solutions" / case.name
            if not case.checks:
                wrong.append(f"{case.name}: has no checks")
                continue
            untouched = judge(case, None)
            if all(c["passed"] for c in untouched):
                wrong.append(f"{case.name}: passes on its untouched workspace")
            if not solution.is_dir():
                wrong.append(f"{case.name}: no solution in {solution}")
                continue
            solved = judge(case, solution)
            failed = [c for c in solved if not c["passed"]]
            for check in failed:
                wrong.append(f"{case.name}: the solution fails {check['check']}: {check['detail']}")
            failing_untouched = sum(not c["passed"] for c in untouched)
            print(f"  {case.name:20} untouched: {failing_untouched}/{len(untouched)} checks fail; "
                  f"solution: {len(solved) - len(failed)}/{len(solved)} pass")
    for line in wrong:
        print(f"WRONG {line}")
    print("verify_suite: " + ("every case fails untouched and passes solved" if not wrong else f"{len(wrong)} problems"))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
