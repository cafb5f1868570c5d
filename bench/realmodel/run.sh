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
# Writes RESULTS/<date>-<runtime>.json per runtime and RESULTS/<date>-report.md.
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

eval "$(bash "$HERE/setup.sh")"   # BASE_URL, MODEL

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
written=()
for rt in $RUNTIMES; do
  out="$RESULTS/$STAMP-$rt.json"
  echo "[run.sh] $rt: $SUITE x $REPEAT -> $out" >&2
  if [ "$rt" = loom ]; then
    # loom eval takes the server from OPENAI_BASE_URL, as `loom run` does.
    OPENAI_BASE_URL="$BASE_URL" "$LOOM_BIN" eval "$SUITE" --model "openai:$MODEL" \
      --repeat "$REPEAT" -j "$JOBS" --json "$out" || echo "[run.sh] loom eval exited $?" >&2
  else
    "$HERE/.venv/bin/python" "$HERE/frameworks/$(runner_of "$rt")" "$SUITE" --base-url "$BASE_URL" \
      --model "$MODEL" --repeat "$REPEAT" -j "$JOBS" --json "$out" || echo "[run.sh] $rt exited $?" >&2
  fi
  [ -f "$out" ] && written+=("$out")
done

[ "${#written[@]}" -gt 0 ] || { echo "run.sh: no runtime wrote results" >&2; exit 1; }
python3 "$HERE/report.py" "${written[@]}" | tee "$RESULTS/$STAMP-report.md"
