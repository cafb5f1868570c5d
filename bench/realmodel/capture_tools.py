#!/usr/bin/env python3
"""Write bench/realmodel/tools.json from what Loom really sends a model.

The Python runners of the benchmark must offer the model exactly Loom's
tools (same names, descriptions and JSON-schema parameters: issue 48,
part 2), so they are not copied by hand but taken from Loom's first
request: a one-request OpenAI-compatible server on 127.0.0.1 (a random
port) records the body and answers with a streamed assistant text "ok",
so the run ends after one model call without running any tool.

    python3 bench/realmodel/capture_tools.py          # LOOM_BIN, else target/debug/loom

Writes, beside this file:
  tools.json          the request's `tools` array (pretty, sorted keys)
  first_request.json  {"system": <the system message>, "body": <the whole first body>}

Re-run it whenever Loom's tool descriptions or system prompt change.
"""

import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


class Capture(http.server.BaseHTTPRequestHandler):
    bodies: list = []

    def log_message(self, *args):  # keep stderr for what matters
        pass

    def do_GET(self):
        # Some clients ask for the model list first; answer it plainly.
        self._json({"object": "list", "data": [{"id": "capture", "object": "model"}]})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"unparsed": raw.decode("utf-8", "replace")}
        Capture.bodies.append(body)
        if body.get("stream"):
            self._stream_ok()
        else:
            self._json(
                {
                    "id": "capture-1",
                    "object": "chat.completion",
                    "model": "capture",
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )

    def _json(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream_ok(self):
        base = {"id": "capture-1", "object": "chat.completion.chunk", "model": "capture"}
        chunks = [
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            # The usage chunk that `stream_options.include_usage` asks for.
            {**base, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
        ]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def system_message(body: dict):
    for message in body.get("messages", []):
        if message.get("role") in ("system", "developer"):
            return message.get("content")
    return None


def main() -> int:
    loom = os.environ.get("LOOM_BIN") or str(REPO / "target" / "debug" / "loom")
    if not Path(loom).is_file():
        print(f"capture_tools: no Loom binary at {loom} (build it or set LOOM_BIN)", file=sys.stderr)
        return 1
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        with tempfile.TemporaryDirectory(prefix="loom-capture-") as tmp:
            workspace = Path(tmp, "ws")
            workspace.mkdir()
            env = dict(os.environ)
            # Loom's state, its list of places and the user's config all in the temp dir:
            # the capture must show Loom's defaults, not this machine's loom.toml.
            env["LOOM_PLACES"] = str(Path(tmp, "places"))
            env["LOOM_STATE_DIR"] = str(Path(tmp, "state"))
            env["XDG_CONFIG_HOME"] = str(Path(tmp, "config"))
            env.pop("LOOM_MODEL", None)
            env.setdefault("OPENAI_API_KEY", "capture")
            cmd = [loom, "run", "--model", "openai:capture", "--base-url", f"http://127.0.0.1:{port}/v1",
                   "--max-steps", "1", "hi"]
            done = subprocess.run(cmd, cwd=workspace, env=env, capture_output=True, text=True, timeout=120,
                                  stdin=subprocess.DEVNULL)
            if not Capture.bodies:
                print(f"capture_tools: Loom sent no request (exit {done.returncode})\n{done.stderr}", file=sys.stderr)
                return 1
            if done.returncode != 0:
                print(f"capture_tools: note: loom exited {done.returncode}: {done.stderr.strip()[-500:]}",
                      file=sys.stderr)
    finally:
        server.shutdown()

    body = Capture.bodies[0]
    tools = body.get("tools")
    if not tools:
        print("capture_tools: the first request carried no `tools`", file=sys.stderr)
        return 1
    (HERE / "tools.json").write_text(json.dumps(tools, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    first = {"system": system_message(body), "body": body}
    (HERE / "first_request.json").write_text(json.dumps(first, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    names = [t.get("function", {}).get("name") for t in tools]
    print(f"capture_tools: {len(tools)} tools ({', '.join(names)}) -> {HERE / 'tools.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
