#!/usr/bin/env bash
# The real-model benchmark, whole (bench/realmodel/README.md): start the model, run the
# suite through Loom (`loom eval`) and through each Python framework, then print the tables.
#
#   bash bench/realmodel/run.sh
#   RUNTIMES="loom bare-loop" REPEAT=1 bash bench/realmodel/run.sh
#
# Environment (all optional):
#   RUNTIMES  which, in order      (default: loom bare-loop pydantic-ai openai-agents langgraph)
#   REPEAT    attempts per case    (default 3)
#   JOBS      attempts at once     (default 1: wall times are then each attempt's own)
#   SUITE     the suite file       (default bench/realmodel/suite.toml)
#   LOOM_BIN  the loom binary      (default target/debug/loom)
#   RESULTS   where results go     (default bench/realmodel/results)
# Writes RESULTS/<date>-<runtime>.json per runtime and RESULTS/<date>-report.md (and
# RESULTS/<date>-restarts.log when the model server had to be restarted during the run).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"

RUNTIMES="${RUNTIMES:-loom bare-loop pydantic-ai openai-agents langgraph}"
REPEAT="${REPEAT:-3}"
JOBS="${JOBS:-1}"
SUITE="${SUITE:-bench/realmodel/suite.toml}"
LOOM_BIN="${LOOM_BIN:-target/debug/loom}"
RESULTS="${RESULTS:-bench/realmodel/results}"
STAMP="$(date -u +%Y-%m-%d-%H%M)"

runner_of() {
  case "$1" in
    bare-loop) echo bare_loop.py ;;
    pydantic-ai) echo pydantic_ai_runner.py ;;
    openai-agents) echo openai_agents_runner.py ;;
    langgraph) echo langgraph_runner.py ;;
    *) return 1 ;;
  esac
}

for rt in $RUNTIMES; do
  [ "$rt" = loom ] || runner_of "$rt" >/dev/null || { echo "run.sh: unknown runtime '$rt'" >&2; exit 2; }
done

eval "$(bash "$HERE/setup.sh")"   # BASE_URL, MODEL, SERVER_LOG

# The frameworks' venv, rebuilt when requirements.txt changes (its hash is kept beside it).
if [ "$RUNTIMES" != loom ]; then
  venv="$HERE/.venv"
  want="$(sha256sum "$HERE/frameworks/requirements.txt" | cut -d' ' -f1)"
  if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    echo "[run.sh] installing the frameworks into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$HERE/frameworks/requirements.txt"
    echo "$want" >"$venv/.requirements.sha256"
  fi
fi

mkdir -p "$RESULTS"

# llama.cpp b8156 sometimes aborts mid-answer ("Unexpected empty grammar stack after
# accepting piece"), whatever the client: the attempt in flight fails, and without a
# restart so would every later one, of whichever runtime happened to be running. So a
# watchdog restarts a dead server for all runtimes alike, and notes when it did.
watchdog() {
  while sleep 2; do
    curl -sf -m 10 "${BASE_URL%/v1}/health" >/dev/null 2>&1 && continue
    sleep 2   # asked twice: one missed answer is not a dead server
    curl -sf -m 10 "${BASE_URL%/v1}/health" >/dev/null 2>&1 && continue
    echo "[run.sh] $(date -u +%H:%M:%S) the model server is down; restarting it" |
      tee -a "$RESULTS/$STAMP-restarts.log" >&2
    bash "$HERE/setup.sh" >/dev/null || true
    # Why it died, when it says: llama.cpp's last words are in the log it left.
    grep -a -m 3 -E "terminate called|what\(\)|error" "$SERVER_LOG.previous" 2>/dev/null |
      sed 's/^/    /' >>"$RESULTS/$STAMP-restarts.log" || true
  done
}
watchdog &
WATCHDOG=$!
trap 'kill "$WATCHDOG" 2>/dev/null || true' EXIT

written=()
for rt in $RUNTIMES; do
  bash "$HERE/setup.sh" >/dev/null   # each runtime starts on a live server
  out="$RESULTS/$STAMP-$rt.json"
  echo "[run.sh] $rt: $SUITE x $REPEAT -> $out" >&2
  if [ "$rt" = loom ]; then
    "$LOOM_BIN" eval "$SUITE" --model "openai:$MODEL" --base-url "$BASE_URL" \
      --repeat "$REPEAT" -j "$JOBS" --json "$out" || echo "[run.sh] loom eval exited $?" >&2
  else
    "$HERE/.venv/bin/python" "$HERE/frameworks/$(runner_of "$rt")" "$SUITE" --base-url "$BASE_URL" \
      --model "$MODEL" --repeat "$REPEAT" -j "$JOBS" --json "$out" || echo "[run.sh] $rt exited $?" >&2
  fi
  [ -f "$out" ] && written+=("$out")
done

[ "${#written[@]}" -gt 0 ] || { echo "run.sh: no runtime wrote results" >&2; exit 1; }
python3 "$HERE/report.py" "${written[@]}" | tee "$RESULTS/$STAMP-report.md"
