#!/usr/bin/env python3
"""What telemetry costs a run, and what a dead collector costs it
(bench/README.md, "Telemetry"): the same scripted run of 30 tool steps,
`loom run --json`, in three ways, several times each, one after the other:

  off      no [telemetry]
  live     a collector on loopback that answers every export at once
  hanging  a collector on loopback that accepts and never answers
  content  like live, with capture_content = true (every prompt, answer,
           argument and result redacted into the spans)

Prints the run's own duration (lifecycle.end's durationMs: the run, not
the command's end, which waits up to 5 s for the last spans) and the
command's wall time, median and worst of each.

  python3 bench/telemetry/run.py [--loom target/release/loom] [--rounds 5] [--steps 30] [--read-bytes N]

With --read-bytes N each step reads a file of N bytes (`read_file`)
instead of a `glob`: results large enough for capture_content's second
redaction pass to show.
"""

import argparse
import http.server
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time


class Answering(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def live_collector():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def hanging_collector():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held = []

    def accept():
        while True:
            connection, _ = listener.accept()
            held.append(connection)  # never read, never answered

    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--loom", default="target/release/loom")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--read-bytes", type=int, default=0)
    args = parser.parse_args()
    loom = os.path.abspath(args.loom)
    work = tempfile.mkdtemp()
    if args.read_bytes:
        line = "export const value = compute(alpha, beta, gamma); // a line of ordinary code\n"
        # One file per step: the same call again and again would be
        # stopped as a loop.
        for i in range(args.steps):
            with open(os.path.join(work, f"big{i}.txt"), "w") as f:
                f.write((line * (args.read_bytes // len(line) + 1))[: args.read_bytes])
        script = [{"tool_calls": [{"name": "read_file", "arguments": {"path": f"big{i}.txt"}}]}
                  for i in range(args.steps)]
    else:
        script = [{"tool_calls": [{"name": "glob", "arguments": {"pattern": f"*{i}*"}}]} for i in range(args.steps)]
    script.append({"content": "done"})
    with open(os.path.join(work, "script.json"), "w") as f:
        json.dump(script, f)
    live = live_collector()
    configs = {"off": None, "live": live, "hanging": hanging_collector(), "content": live}
    results = {name: ([], []) for name in configs}
    for _ in range(args.rounds):
        for name, endpoint in configs.items():
            config = os.path.join(work, f"{name}.toml")
            with open(config, "w") as f:
                if endpoint:
                    f.write(f'[telemetry]\notlp_endpoint = "{endpoint}"\n')
                if name == "content":
                    f.write("capture_content = true\n")
            started = time.monotonic()
            out = subprocess.run(
                [loom, "run", "--json", "--yes", "--max-steps", str(args.steps + 5),
                 "--model", f"scripted:{os.path.join(work, 'script.json')}", "--config", config, "go"],
                cwd=work, capture_output=True, text=True, env={**os.environ, "LOOM_STATE_DIR": os.path.join(work, "state")},
            )
            wall = time.monotonic() - started
            if out.returncode != 0:
                raise SystemExit(f"{name}: exit {out.returncode}: {out.stderr} {out.stdout[-500:]}")
            end = [json.loads(line) for line in out.stdout.splitlines() if '"lifecycle.end"' in line][-1]
            results[name][0].append(end["metrics"]["durationMs"])
            results[name][1].append(wall * 1000)
    for name, (runs, walls) in results.items():
        print(f"{name:8} run: median {statistics.median(runs):.0f} ms, worst {max(runs):.0f} ms;"
              f" command: median {statistics.median(walls):.0f} ms, worst {max(walls):.0f} ms")


if __name__ == "__main__":
    main()
