#!/usr/bin/env bash
# Installs the pinned MCP servers the tests run against into DIR (default
# target/mcp-servers): the npm servers with `npm ci` from the lockfile, the
# Python time server with pip from exact pins. Installs node/npm (Debian)
# when missing. Skips what is installed already with the same pins.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-$here/../../target/mcp-servers}"
mkdir -p "$dir/npm" "$dir/py"
dir="$(cd "$dir" && pwd)"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get update -qq && apt-get install -y -qq nodejs npm
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq python3 python3-pip
fi

if ! cmp -s "$here/package-lock.json" "$dir/npm/package-lock.json" || [ ! -d "$dir/npm/node_modules" ]; then
  cp "$here/package.json" "$here/package-lock.json" "$dir/npm/"
  (cd "$dir/npm" && npm ci --no-audit --no-fund --loglevel=error)
fi

if ! cmp -s "$here/requirements.txt" "$dir/py/.requirements.txt"; then
  rm -rf "$dir/py" && mkdir -p "$dir/py"
  python3 -m pip install --quiet --disable-pip-version-check --target "$dir/py" -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$dir/py/.requirements.txt"
fi
echo "MCP test servers in $dir"
