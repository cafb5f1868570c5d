#!/usr/bin/env python3
"""The benchmark's tables (bench/realmodel/README.md) from result files: `loom eval --json`
and the Python runners' (the same format, docs/eval.md). Markdown on stdout.

    python3 bench/realmodel/report.py results/2026-12-07-*.json    # or a folder of them

Files of the same runtime are merged (e.g. two halves of one run). Per runtime:

- success: passed attempts / all attempts;
- model calls and wall time: the median over all attempts;
- prompt and completion tokens per success: the sum over ALL attempts divided by the
  passed ones (what a success costs, failures included; "—" when none passed);
- per case: passed / attempts;
- failures by cause, one cause per failed attempt: its status when not DONE, else the
  kind of its first failed check; and, counted besides (an attempt may have both), the
  failed attempts that "answered without calling a tool" and those that "invented a tool
  name" (called a tool its case did not offer).
"""

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "frameworks"))

ORDER = ["loom", "bare-loop", "pydantic-ai", "openai-agents", "langgraph"]
NO_TOOL = "answered without calling a tool"
INVENTED = "invented a tool name"


def load(paths: list[str]) -> dict[str, dict]:
    runs: dict[str, dict] = {}
    files = []
    for p in paths:
        path = Path(p)
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    for path in files:
        data = json.loads(path.read_text())
        if "attempts" not in data or "runtime" not in data:
            continue
        run = runs.setdefault(data["runtime"], {"attempts": [], "cases": [], "suite": data.get("suite"),
                                                "model": data.get("model"), "started": []})
        run["attempts"] += data["attempts"]
        run["started"].append(data.get("started_at", ""))
        for case in data.get("cases", []):
            if case["case"] not in run["cases"]:
                run["cases"].append(case["case"])
    return runs


def offered_tools(suite_path: str | None) -> dict[str, set] | None:
    """Each case's offered tools, from the suite the results name (None: unknown)."""
    if not suite_path:
        return None
    from suite import load_suite
    from toolbox import load_tool_specs
    # As written in the results (relative to where the run started), else the file of
    # that name beside this script.
    for candidate in (Path(suite_path), HERE / Path(suite_path).name):
        if candidate.is_file():
            break
    else:
        return None
    try:
        suite = load_suite(candidate)
        return {c.name: {s["function"]["name"] for s in load_tool_specs(c.tools)} for c in suite.cases}
    except Exception:
        return None


def causes(attempt: dict, offered: set | None) -> list[str]:
    if attempt["status"] != "DONE":
        # An error's kind too (the text before its first colon): "ERROR: APIConnectionError".
        error = (attempt.get("error") or "").split(":", 1)[0].strip()
        found = [attempt["status"] + (f": {error[:40]}" if attempt["status"] == "ERROR" and error else "")]
    else:
        first = next((c for c in attempt.get("checks", []) if not c["passed"]), None)
        found = [(first.get("kind") or first["check"].split(" ", 1)[0]) if first else "unknown"]
    called = attempt.get("tools_called") or []
    if not called and attempt["status"] == "DONE":
        found.append(NO_TOOL)
    if offered is not None and any(name not in offered for name in called):
        found.append(INVENTED)
    return found


def median(values):
    return statistics.median(values) if values else 0


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    runs = load(sys.argv[1:])
    if not runs:
        print("report.py: no result files", file=sys.stderr)
        return 1
    names = sorted(runs, key=lambda r: (ORDER.index(r) if r in ORDER else len(ORDER), r))
    first = runs[names[0]]
    print(f"Model `{first['model']}`, suite `{first['suite']}`; runs started "
          f"{min(s for r in runs.values() for s in r['started'])}.\n")

    print("| runtime | passed | success | median model calls | prompt tokens / success "
          "| completion tokens / success | median wall s / attempt |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        attempts = runs[name]["attempts"]
        passed = sum(a["passed"] for a in attempts)
        prompt = sum(a.get("prompt_tokens") or 0 for a in attempts)
        completion = sum(a.get("completion_tokens") or 0 for a in attempts)
        per = (lambda total: f"{total / passed:,.0f}") if passed else (lambda total: "—")
        print(f"| {name} | {passed}/{len(attempts)} | {100 * passed / max(len(attempts), 1):.0f} % "
              f"| {median([a.get('model_calls') or 0 for a in attempts]):g} | {per(prompt)} | {per(completion)} "
              f"| {median([a.get('wall_secs') or 0 for a in attempts]):.1f} |")

    cases = []
    for name in names:
        cases += [c for c in runs[name]["cases"] if c not in cases]
    print("\nPassed attempts per case:\n")
    print("| case | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for case in cases:
        cells = []
        for name in names:
            mine = [a for a in runs[name]["attempts"] if a["case"] == case]
            cells.append(f"{sum(a['passed'] for a in mine)}/{len(mine)}" if mine else "")
        print(f"| {case} | " + " | ".join(cells) + " |")

    counts: dict[str, dict[str, int]] = {}
    for name in names:
        offered = offered_tools(runs[name]["suite"])
        for attempt in runs[name]["attempts"]:
            if attempt["passed"]:
                continue
            tools = offered.get(attempt["case"]) if offered else None
            for cause in causes(attempt, tools):
                counts.setdefault(cause, {}).setdefault(name, 0)
                counts[cause][name] += 1
    print("\nFailed attempts by cause (a status other than DONE (with an error's kind), else the first failed check; "
          "the last two rows are counted besides):\n")
    print("| cause | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    extra = [NO_TOOL, INVENTED]
    for cause in sorted(counts, key=lambda c: (c in extra, extra.index(c) if c in extra else 0,
                                                -sum(counts[c].values()), c)):
        print(f"| {cause} | " + " | ".join(str(counts[cause].get(n, 0)) for n in names) + " |")
    if not counts:
        print("| (none) |" + " |" * len(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
