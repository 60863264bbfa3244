#!/usr/bin/env bash
# The offline demo: starts the whole stack in one process (every service on
# its own loopback port) and replays a scripted conversation whose tools all
# run for real: Python in a kernel, files, a sub-agent, an approval.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
"$root/scripts/bootstrap.sh"
export OMICOS_KERNEL_PYTHON="${OMICOS_KERNEL_PYTHON:-$root/.venv/bin/python3}"
exec cargo run --quiet -p omicos-cli --bin omicos -- demo "$@"
