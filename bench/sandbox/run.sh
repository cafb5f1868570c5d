#!/usr/bin/env bash
# What the bash tool's namespaces cost: one `loom run` of N bash calls
# (`true`), timed whole with farm-bench, in each mode, against the same
# binary told that bwrap is missing (Landlock alone, or no namespaces).
# Usage: bench/sandbox/run.sh [LOOM] [CALLS]   (default target/release/loom, 20)
set -euo pipefail
loom="$(realpath "${1:-target/release/loom}")"
calls="${2:-20}"
command -v farm-bench >/dev/null || { echo "needs farm-bench" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ws"
python3 -c "
import json, sys
turn = {'tool_calls': [{'name': 'bash', 'arguments': {'command': 'true'}}]}
json.dump([turn] * $calls + [{'content': 'done'}], open('$work/script.json', 'w'))"
for mode in landlock none; do
  printf '[feedback]\nmonitor = false\n[tools.bash]\nsandbox = "%s"\n' "$mode" > "$work/$mode.toml"
  cp "$work/$mode.toml" "$work/$mode-without.toml"
  printf 'bwrap = "/nonexistent/bwrap"\n' >> "$work/$mode-without.toml"
  run="$loom run --yes --max-steps $((calls + 5)) --db $work/$mode.db --model scripted:$work/script.json go --config"
  echo "== sandbox = \"$mode\": $calls bash calls; A: with namespaces, B: without"
  (cd "$work/ws" && farm-bench -n 9 --timeout 600 --vs "$run $work/$mode-without.toml" -- $run "$work/$mode.toml") |
    grep -E '^(A|B) wall|A/B wall'
done
