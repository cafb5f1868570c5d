#!/usr/bin/env bash
# What the bash tool's namespaces cost: one `loom run` of N bash calls
# (`true`), timed whole with farm-bench, in each mode, against the same
# binary with bwrap kept off its PATH (Landlock alone, or no namespaces).
# Usage: bench/sandbox/run.sh [LOOM] [CALLS]   (default target/release/loom, 20)
set -euo pipefail
loom="$(realpath "${1:-target/release/loom}")"
calls="${2:-20}"
command -v farm-bench >/dev/null || { echo "needs farm-bench" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ws" "$work/nobwrap"
# A PATH with bash and the programs the run needs, and no bwrap.
for program in bash true env; do ln -s "$(command -v $program)" "$work/nobwrap/$program"; done
python3 -c "
import json, sys
turn = {'tool_calls': [{'name': 'bash', 'arguments': {'command': 'true'}}]}
json.dump([turn] * $calls + [{'content': 'done'}], open('$work/script.json', 'w'))"
for mode in landlock none; do
  printf '[tools.bash]\nsandbox = "%s"\n[feedback]\nmonitor = false\n' "$mode" > "$work/$mode.toml"
  run="$loom run --yes --max-steps $((calls + 5)) --db $work/$mode.db --config $work/$mode.toml --model scripted:$work/script.json go"
  echo "== sandbox = \"$mode\": $calls bash calls; A: with namespaces, B: bwrap not on PATH"
  (cd "$work/ws" && farm-bench -n 9 --timeout 600 --vs "env PATH=$work/nobwrap $run" -- $run) |
    grep -E '^(A|B) wall|A/B wall'
done
