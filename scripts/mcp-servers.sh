#!/usr/bin/env bash
# Installs the MCP reference servers and the TypeScript SDK client (pinned in
# tests/mcp-servers/package.json and its lockfile) into
# tests/mcp-servers/node_modules, for services/mcp's tests. Idempotent: a
# second run with nothing changed returns at once.
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/tests/mcp-servers"
stamp="$dir/node_modules/.omicos-installed"
if [ -f "$stamp" ] && [ "$stamp" -nt "$dir/package-lock.json" ] && [ "$stamp" -nt "$dir/package.json" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "mcp-servers.sh: npm is required (apt-get install nodejs npm)" >&2; exit 1; }
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
touch "$stamp"
