#!/usr/bin/env python3
"""Prove that each Python runner is wired as the benchmark says, against a fake model.

A scripted OpenAI-compatible server on 127.0.0.1 (a random port) answers by the task:

  finish  first a call of list_dir, then (once a tool result is in the request) "all done"
  loop    a call of list_dir every time: the run must end MAX_STEPS after max_steps turns
  invent  a call of a tool that was not offered, then "all done": the run must go on
  slow    answers after 6 s, past the case's 3 s: the run must end TIMEOUT

Every answer reports usage 100 prompt + 10 completion tokens. For each runner it checks:
the status, the model calls, the tokens counted from usage, the tools called, that every
request offered exactly the case's tools of tools.json (names, descriptions, parameters),
that no sampling setting (temperature, top_p, ...) was sent, and that the tool result
reached the model. Takes a few seconds; needs the venv (frameworks/requirements.txt).

    bench/realmodel/.venv/bin/python bench/realmodel/check_wiring.py [RUNTIME...]
"""

import http.server
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNNERS = {
    "bare-loop": "bare_loop.py",
    "pydantic-ai": "pydantic_ai_runner.py",
    "openai-agents": "openai_agents_runner.py",
    "langgraph": "langgraph_runner.py",
}
SAMPLING = {"temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "n", "logit_bias"}
TOOLS = ["read_file", "list_dir"]
MARKER = "marker.txt (5 bytes)"


class Fake(http.server.BaseHTTPRequestHandler):
    bodies: list = []
    lock = threading.Lock()
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.loads(raw)
        with Fake.lock:
            Fake.bodies.append(body)
        prompt = next((m.get("content") for m in body["messages"] if m.get("role") == "user"), "")
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
        has_result = any(m.get("role") == "tool" for m in body["messages"])
        if "slow" in prompt:
            time.sleep(6)
        if "loop" in prompt or ("finish" in prompt and not has_result) or "slow" in prompt:
            message = self._call("list_dir", {"path": "."})
        elif "invent" in prompt and not has_result:
            message = self._call("open_file", {"name": "x"})
        else:
            message = {"role": "assistant", "content": "all done"}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        try:
            if body.get("stream"):
                self._stream(message, finish, usage, body)
            else:
                self._send("application/json", json.dumps({
                    "id": "fake", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage}).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (the time-out case)

    @staticmethod
    def _call(name, arguments):
        call_id = f"call_{time.monotonic_ns()}"
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}

    def _send(self, kind, data):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, message, finish, usage, body):
        base = {"id": "fake", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        delta = {"role": "assistant"}
        if message.get("tool_calls"):
            delta["tool_calls"] = [dict(c, index=i) for i, c in enumerate(message["tool_calls"])]
        else:
            delta["content"] = message["content"]
        chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}]
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**base, "choices": [], "usage": usage})
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        self._send("text/event-stream", data)


SUITE = """
[defaults]
max_steps = 3
timeout_secs = 60
tools = {tools}
min_pass_rate = 0.0

[[case]]
name = "finish"
prompt = "finish: list the folder"
workspace = "ws"
  [[case.check]]
  answer_contains = "all done"

[[case]]
name = "loop"
prompt = "loop: list the folder"
workspace = "ws"

[[case]]
name = "invent"
prompt = "invent: list the folder"
workspace = "ws"

[[case]]
name = "slow"
prompt = "slow: list the folder"
workspace = "ws"
timeout_secs = 3
"""

EXPECTED = {
    # case: (status, model calls, tools called)
    "finish": ("DONE", 2, ["list_dir"]),
    "loop": ("MAX_STEPS", 3, ["list_dir"] * 3),
    "invent": ("DONE", 2, ["open_file"]),
    "slow": ("TIMEOUT", 1, []),
}


def main() -> int:
    runtimes = sys.argv[1:] or list(RUNNERS)
    all_tools = json.loads((HERE / "tools.json").read_text())
    offered = [t for t in all_tools if t["function"]["name"] in TOOLS]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    problems = []
    try:
        with tempfile.TemporaryDirectory(prefix="wiring-") as tmp:
            (Path(tmp) / "ws").mkdir()
            (Path(tmp) / "ws" / "marker.txt").write_text("hello")
            suite = Path(tmp) / "suite.toml"
            suite.write_text(SUITE.format(tools=json.dumps(TOOLS)))
            for runtime in runtimes:
                Fake.bodies.clear()
                out = Path(tmp) / f"{runtime}.json"
                started = time.monotonic()
                done = subprocess.run([sys.executable, str(HERE / "frameworks" / RUNNERS[runtime]), str(suite),
                                       "--base-url", base_url, "--model", "fake-model", "--repeat", "1",
                                       "--json", str(out)], capture_output=True, text=True, timeout=300)
                mine = []
                if not out.is_file():
                    mine.append(f"no result file (exit {done.returncode}): {done.stderr[-1500:]}")
                else:
                    mine += judge(json.loads(out.read_text()), list(Fake.bodies), offered)
                print(f"{runtime}: {'ok' if not mine else 'WRONG'} ({time.monotonic() - started:.1f} s)")
                for problem in mine:
                    print(f"  - {problem}")
                problems += mine
    finally:
        server.shutdown()
    return 1 if problems else 0


def judge(result: dict, bodies: list, offered: list) -> list:
    problems = []
    attempts = {a["case"]: a for a in result["attempts"]}
    for case, (status, calls, tools) in EXPECTED.items():
        a = attempts.get(case)
        if a is None:
            problems.append(f"{case}: no attempt recorded")
            continue
        got = (a["status"], a["model_calls"], a["tools_called"])
        if got != (status, calls, tools):
            problems.append(f"{case}: status/calls/tools {got}, want {(status, calls, tools)} (error: {a['error']})")
        if case != "slow" and (a["prompt_tokens"], a["completion_tokens"]) != (100 * calls, 10 * calls):
            problems.append(f"{case}: tokens {a['prompt_tokens']}+{a['completion_tokens']}, want {100 * calls}+{10 * calls}")
        if case == "finish" and not a["passed"]:
            problems.append(f"finish: answer {a['answer']!r} did not pass")
    for body in bodies:
        # `"strict": false` is the default spelled out (the Agents SDK always sends it).
        sent = [{**t, "function": {k: v for k, v in t["function"].items() if (k, v) != ("strict", False)}}
                for t in body.get("tools") or []]
        sent = sorted(sent, key=lambda t: t["function"]["name"])
        want = sorted(offered, key=lambda t: t["function"]["name"])
        if sent != want:
            problems.append(f"the tools sent differ from tools.json: {json.dumps(sent)[:600]}")
            break
    for body in bodies:
        extra = SAMPLING & set(body)
        if extra:
            problems.append(f"sampling settings sent: { {k: body[k] for k in extra} }")
            break
    results = [m for b in bodies for m in b["messages"] if m.get("role") == "tool"]
    if not any(MARKER in json.dumps(m.get("content")) for m in results):
        problems.append(f"no tool result with {MARKER!r} reached the model")
    keys = {k: sorted({json.dumps(b[k]) for b in bodies if k in b})
            for k in sorted({k for b in bodies for k in b}) if k not in ("messages", "tools", "model")}
    print(f"  request keys besides messages, tools, model: {keys}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
