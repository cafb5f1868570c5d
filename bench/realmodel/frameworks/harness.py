"""What every Python runner of the real-model benchmark shares (bench/realmodel/README.md).

The runners differ only in the agent framework that drives the model; everything that
makes their figures comparable with `loom eval` is done once, here and beside it:

- suite.py: the suite (TOML) and its checks on the final workspace, as docs/eval.md says;
- toolbox.py: Loom's tools (tools.json, captured from Loom's first request), filtered to
  the case's `tools`, implemented with Loom's behaviour, confined to the attempt's copy;
- metering.py: the model's traffic counted at the HTTP layer (model calls, tokens from
  the usage each response reports, the tool names the model asked for);
- this file: a fresh workspace copy per attempt, the attempt's time limit, and the result
  JSON in the format `loom eval --json` writes, with the command line all runners share.

A runner supplies one coroutine, `run(attempt) -> Outcome`, and calls `main(runtime, run)`.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime as dt
import json
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

import httpx2

from metering import Meter, MeteredTransport
from suite import Case, copy_workspace, load_suite, run_checks
from toolbox import Toolbox, load_tool_specs

# The instructions every Python runner gives the model, the same for all four: what a
# user of those frameworks would write. Loom uses its own system prompt; its length is
# part of what the benchmark compares (first_request.json holds it).
INSTRUCTIONS = (
    "You are a coding agent working in a project folder. Use the tools to look at and "
    "change its files; paths are relative to the project folder. When the task is done, "
    "reply with a short final answer."
)

# Statuses a runner may report (the `status` field of an attempt).
DONE, MAX_STEPS, TIMEOUT, ERROR = "DONE", "MAX_STEPS", "TIMEOUT", "ERROR"


@dataclass
class Attempt:
    """What a runner gets for one attempt."""
    case: Case
    number: int
    workspace: Path
    tools: Toolbox
    base_url: str
    model: str                  # the name the server knows (no "openai:" prefix)
    http_client: httpx2.AsyncClient
    instructions: str
    max_steps: int
    meter: Meter


@dataclass
class Outcome:
    status: str
    answer: str | None = None
    error: str | None = None


RunFn = Callable[[Attempt], Awaitable[Outcome]]


def _api_model(name: str) -> str:
    return name.split(":", 1)[1] if name.startswith("openai:") else name


async def _attempt(run: RunFn, case: Case, number: int, base_url: str, model: str,
                   keep_bodies: bool) -> tuple[dict, Meter]:
    with tempfile.TemporaryDirectory(prefix=f"realmodel-{case.name}-") as tmp:
        workspace = copy_workspace(case, tmp)
        tools = Toolbox(workspace, case.tools)
        meter = Meter(keep_bodies)
        # The client's own time-out is the attempt's: the attempt's limit decides.
        client = httpx2.AsyncClient(transport=MeteredTransport(meter),
                                    timeout=httpx2.Timeout(case.timeout_secs + 30))
        attempt = Attempt(case=case, number=number, workspace=workspace, tools=tools,
                          base_url=base_url, model=_api_model(model), http_client=client,
                          instructions=INSTRUCTIONS, max_steps=case.max_steps, meter=meter)
        started = time.monotonic()
        try:
            outcome = await asyncio.wait_for(run(attempt), timeout=case.timeout_secs)
        except (asyncio.TimeoutError, TimeoutError):
            outcome = Outcome(TIMEOUT, error=f"the attempt passed its {case.timeout_secs:g} s")
        except Exception as err:
            outcome = Outcome(ERROR, error=f"{type(err).__name__}: {err}"[:2000])
        wall = time.monotonic() - started
        tools.kill_all()
        try:
            await client.aclose()
        except Exception:
            pass
        result = {
            "case": case.name, "attempt": number, "passed": False,
            "status": outcome.status, "steps": meter.steps, "model_calls": len(meter.calls),
            "prompt_tokens": meter.prompt_tokens, "completion_tokens": meter.completion_tokens,
            "cost_usd": 0.0, "wall_secs": round(wall, 2), "run_id": None,
            "answer": outcome.answer, "tools_called": meter.tools_called, "error": outcome.error,
        }
        result["checks"] = run_checks(case, workspace, result)
        result["passed"] = all(c["passed"] for c in result["checks"])
        return result, meter


def _wait_for_server(base_url: str, runtime: str, limit: float = 180) -> None:
    """Before an attempt: wait while the server is down or loading (503), as after a crash
    and run.sh's restart, so that an attempt is not lost to the restart's few seconds.
    Any other answer, even 404 from a server without /health, counts as up."""
    health = base_url.rstrip("/").removesuffix("/v1") + "/health"
    deadline = time.monotonic() + limit
    said = False
    while True:
        try:
            urllib.request.urlopen(health, timeout=10).close()
            return
        except urllib.error.HTTPError as err:
            if err.code != 503:
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            return  # let the attempt fail and say why
        if not said:
            print(f"[{runtime}] the model server is not answering ({health}); waiting", file=sys.stderr, flush=True)
            said = True
        time.sleep(2)


def _summaries(cases: list[Case], attempts: list[dict]) -> list[dict]:
    out = []
    for case in cases:
        mine = [a for a in attempts if a["case"] == case.name]
        passed = sum(a["passed"] for a in mine)
        rate = passed / len(mine) if mine else 0.0
        out.append({"case": case.name, "passed": passed, "attempts": len(mine),
                    "pass_rate": round(rate, 3), "min_pass_rate": case.min_pass_rate,
                    "ok": rate >= case.min_pass_rate})
    return out


def main(runtime: str, run: RunFn, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Run a suite through {runtime} (bench/realmodel/README.md)")
    parser.add_argument("suite")
    parser.add_argument("--base-url", default=os.environ.get("BASE_URL"),
                        help="the OpenAI-compatible API base (default: $BASE_URL)")
    parser.add_argument("--model", default=os.environ.get("MODEL"),
                        help="model name, with or without 'openai:' (default: $MODEL)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("-j", "--jobs", type=int, default=1, help="attempts at once")
    parser.add_argument("--case", action="append", default=[], help="only this case (repeatable)")
    parser.add_argument("--json", dest="json_out", help="write the results here")
    parser.add_argument("--dump-requests", metavar="DIR",
                        help="write every request body the framework sent, per attempt, into DIR")
    args = parser.parse_args(argv)

    suite = load_suite(args.suite)
    cases = suite.cases
    if args.case:
        unknown = set(args.case) - {c.name for c in cases}
        if unknown:
            parser.error(f"no such case: {', '.join(sorted(unknown))}")
        cases = [c for c in cases if c.name in args.case]
    if not args.base_url:
        parser.error("--base-url (or $BASE_URL) is required")
    for case in cases:
        load_tool_specs(case.tools)  # fail now, not in every attempt
        if not (case.model or args.model):
            parser.error(f"case {case.name}: no model (--model, $MODEL or the suite's model)")

    started_at = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    shown_model = args.model or next((c.model for c in cases if c.model), "")
    document = {"runtime": runtime, "suite": args.suite,
                "model": shown_model if ":" in shown_model else f"openai:{shown_model}",
                "started_at": started_at, "attempts": [], "cases": []}
    order = {c.name: i for i, c in enumerate(cases)}
    jobs = [(case, n) for n in range(1, args.repeat + 1) for case in cases]
    lock = threading.Lock()
    total = len(jobs)

    def save():
        document["attempts"].sort(key=lambda a: (order[a["case"]], a["attempt"]))
        document["cases"] = _summaries(cases, document["attempts"])
        if args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            tmp = args.json_out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(document, f, indent=2)
                f.write("\n")
            os.replace(tmp, args.json_out)

    def one(job):
        case, number = job
        model = case.model or args.model
        _wait_for_server(args.base_url, runtime)
        result, meter = asyncio.run(_attempt(run, case, number, args.base_url, model,
                                             keep_bodies=bool(args.dump_requests)))
        if args.dump_requests:
            out = Path(args.dump_requests) / f"{case.name}-{number}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(meter.bodies, indent=2) + "\n")
        with lock:
            document["attempts"].append(result)
            done = len(document["attempts"])
            save()
        failed = next((c["check"] for c in result["checks"] if not c["passed"]), "")
        print(f"[{runtime}] {done}/{total} {case.name} #{number}: {'PASS' if result['passed'] else 'FAIL'} "
              f"{result['status']} calls={result['model_calls']} tokens={result['prompt_tokens']}+"
              f"{result['completion_tokens']} {result['wall_secs']:.1f}s tools={result['tools_called']}"
              + (f" failed: {failed}" if failed else "") + (f" error: {result['error']}" if result["error"] else ""),
              file=sys.stderr, flush=True)

    print(f"[{runtime}] {total} attempts ({len(cases)} cases x {args.repeat}), {args.jobs} at once, "
          f"model {document['model']} at {args.base_url}", file=sys.stderr, flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for future in concurrent.futures.as_completed([pool.submit(one, job) for job in jobs]):
            future.result()
    save()
    summary = document["cases"]
    passed = sum(c["passed"] for c in summary)
    attempts = sum(c["attempts"] for c in summary)
    print(f"[{runtime}] passed {passed}/{attempts} attempts", file=sys.stderr)
    return 0 if all(c["ok"] for c in summary) else 1
