#!/usr/bin/env bash
# Everything the tests need besides Rust: the pinned MCP servers
# (tests/mcp/install.sh), bubblewrap for the bash sandbox, Debian's
# redis-server for the Redis store's tests (they start their own, on a free
# port) and, for the web page's browser tests, Debian's Chromium and
# ChromeDriver. Skips what is there already.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/mcp/install.sh" "$@"
# The bash tool's sandbox builds its namespaces with Debian's bubblewrap.
if ! command -v bwrap >/dev/null; then
  apt-get update -qq && apt-get install -y -qq bubblewrap
fi
# The hook tests' scripts read their JSON input with jq, as users' hooks do.
if ! command -v jq >/dev/null; then
  apt-get update -qq && apt-get install -y -qq jq
fi
if ! command -v redis-server >/dev/null; then
  apt-get update -qq && apt-get install -y -qq redis-server
fi
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt-get update -qq && apt-get install -y -qq chromium chromium-driver
fi
