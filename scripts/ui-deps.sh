#!/usr/bin/env bash
# Installs ui/'s npm packages exactly as package-lock.json pins them
# (npm ci), unless node_modules was installed from this very lockfile.
set -euo pipefail
ui="$(cd "$(dirname "$0")/../ui" && pwd)"
cd "$ui"
if ! command -v npm >/dev/null 2>&1; then
  echo "ui-deps: npm is not installed (Node.js 20 with npm 11 builds the page)" >&2
  exit 1
fi
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat node_modules/.omicos-lock-sha256 2>/dev/null)" = "$want" ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > node_modules/.omicos-lock-sha256
