"""The suite file and its checks, as docs/eval.md defines them (bench/realmodel/README.md).

Read with tomllib; a case's own keys win over [defaults]. The checks judge an attempt's
final workspace and its outcome (answer, tools called, steps, tokens, status) and are
worded like `loom eval`'s. Standard library only: verify_suite.py uses it without the venv.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

CHECK_KINDS = (
    "file_exists", "file_absent", "file_contains", "file_matches", "command",
    "answer_contains", "answer_matches", "tool_called", "tool_not_called",
    "max_steps", "max_tokens", "max_cost_usd", "status",
)
CASE_KEYS = {"name", "prompt", "workspace", "model", "mode", "max_steps", "timeout_secs",
             "tools", "min_pass_rate", "check"}
DEFAULT_KEYS = {"model", "mode", "max_steps", "timeout_secs", "tools", "min_pass_rate"}
COMMAND_CHECK_TIMEOUT = 120


# --- the suite -----------------------------------------------------------------------------


class SuiteError(Exception):
    pass


@dataclass
class Case:
    name: str
    prompt: str
    workspace: Path
    checks: list[dict]
    model: str | None = None
    mode: str | None = None
    max_steps: int = 10
    timeout_secs: float = 240
    tools: list[str] | None = None   # None: every tool of tools.json
    min_pass_rate: float = 1.0


@dataclass
class Suite:
    path: Path
    cases: list[Case]


def load_suite(path: str | os.PathLike) -> Suite:
    path = Path(path)
    with open(path, "rb") as f:
        data = tomllib.load(f)
    defaults = data.get("defaults", {})
    unknown = set(defaults) - DEFAULT_KEYS
    if unknown:
        raise SuiteError(f"{path}: unknown keys in [defaults]: {sorted(unknown)}")
    cases = []
    for raw in data.get("case", []):
        unknown = set(raw) - CASE_KEYS
        if unknown:
            raise SuiteError(f"{path}: case {raw.get('name')!r}: unknown keys {sorted(unknown)}")
        merged = {**defaults, **raw}
        for key in ("name", "prompt", "workspace"):
            if key not in merged:
                raise SuiteError(f"{path}: a case has no {key!r}")
        checks = raw.get("check", [])
        for check in checks:
            if len(check) != 1 or next(iter(check)) not in CHECK_KINDS:
                raise SuiteError(f"{path}: case {merged['name']!r}: a check must have exactly one of {CHECK_KINDS}: {check}")
        workspace = (path.parent / merged["workspace"]).resolve()
        if not workspace.is_dir():
            raise SuiteError(f"{path}: case {merged['name']!r}: no workspace folder {workspace}")
        cases.append(Case(
            name=merged["name"], prompt=merged["prompt"], workspace=workspace, checks=checks,
            model=merged.get("model"), mode=merged.get("mode"),
            max_steps=int(merged.get("max_steps", 10)),
            timeout_secs=float(merged.get("timeout_secs", 240)),
            tools=merged.get("tools"), min_pass_rate=float(merged.get("min_pass_rate", 1.0)),
        ))
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise SuiteError(f"{path}: case names repeat")
    return Suite(path=path, cases=cases)


def copy_workspace(case: Case, parent: str | os.PathLike) -> Path:
    """A fresh copy of the case's workspace, so no attempt sees another's changes."""
    target = Path(parent) / "ws"
    shutil.copytree(case.workspace, target, symlinks=True)
    return target


# --- the checks ----------------------------------------------------------------------------


def _read_text(workspace: Path, rel: str) -> str | None:
    path = workspace / rel
    if not path.is_file():
        return None
    return path.read_bytes().decode("utf-8", "replace")


def run_check(check: dict, workspace: Path, result: dict) -> dict:
    """One check on the final workspace and the run's outcome, as docs/eval.md defines it."""
    ((kind, value),) = check.items()
    label, passed, detail = f"{kind} {value}", False, ""
    answer = result.get("answer") or ""
    if kind == "file_exists":
        passed = (workspace / value).exists()
        detail = "" if passed else f"{value} does not exist"
    elif kind == "file_absent":
        passed = not (workspace / value).exists()
        detail = "" if passed else f"{value} exists"
    elif kind in ("file_contains", "file_matches"):
        rel = value["path"]
        needle = value["text"] if kind == "file_contains" else value["regex"]
        label = f"{kind} {rel} {json.dumps(needle)}"
        text = _read_text(workspace, rel)
        if text is None:
            detail = f"{rel} does not exist"
        elif kind == "file_contains":
            passed = needle in text
            detail = "" if passed else f"{rel} does not contain {json.dumps(needle)}"
        else:
            passed = re.search(needle, text) is not None
            detail = "" if passed else f"{rel} does not match /{needle}/"
    elif kind == "command":
        try:
            done = subprocess.run(["bash", "-c", value], cwd=workspace, capture_output=True,
                                  stdin=subprocess.DEVNULL, timeout=COMMAND_CHECK_TIMEOUT,
                                  start_new_session=True)
            passed = done.returncode == 0
            output = (done.stdout + done.stderr).decode("utf-8", "replace").strip()
            detail = "" if passed else f"exit code {done.returncode}: {output[-400:]}"
        except subprocess.TimeoutExpired:
            detail = f"timed out after {COMMAND_CHECK_TIMEOUT} s"
    elif kind == "answer_contains":
        label = f"{kind} {json.dumps(value)}"
        passed = value in answer
        detail = "" if passed else f"the answer does not contain {json.dumps(value)}"
    elif kind == "answer_matches":
        label = f"{kind} {json.dumps(value)}"
        passed = re.search(value, answer) is not None
        detail = "" if passed else f"the answer does not match /{value}/"
    elif kind == "tool_called":
        passed = value in result.get("tools_called", [])
        detail = "" if passed else f"{value} was not called"
    elif kind == "tool_not_called":
        passed = value not in result.get("tools_called", [])
        detail = "" if passed else f"{value} was called"
    elif kind == "max_steps":
        passed = result.get("steps", 0) <= value
        detail = "" if passed else f"{result.get('steps')} steps"
    elif kind == "max_tokens":
        used = result.get("prompt_tokens", 0) + result.get("completion_tokens", 0)
        passed = used <= value
        detail = "" if passed else f"{used} tokens"
    elif kind == "max_cost_usd":
        passed = (result.get("cost_usd") or 0.0) <= value
        detail = "" if passed else f"{result.get('cost_usd')} USD"
    elif kind == "status":
        passed = result.get("status") == value
        detail = "" if passed else f"status {result.get('status')}"
    # As `loom eval` writes a check: a detail only when it failed.
    return {"check": label, "kind": kind, "passed": passed, **({} if passed else {"detail": detail})}


def run_checks(case: Case, workspace: Path, result: dict) -> list[dict]:
    return [run_check(check, workspace, result) for check in case.checks]
