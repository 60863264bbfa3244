#!/usr/bin/env bash
# Sets up what omicos needs besides cargo: a project-local Python venv (.venv)
# with ipykernel for the kernel provider. Idempotent; fast when already done.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if ! .venv/bin/python3 -c 'import ipykernel, jupyter_client, matplotlib, tqdm, mcp, a2a' 2>/dev/null; then
  echo "==> creating .venv with ipykernel (requirements.txt)"
  "$py" -m venv .venv
  .venv/bin/python3 -m pip install --disable-pip-version-check -q -r requirements.txt
fi
echo "==> kernel python: $root/.venv/bin/python3"
