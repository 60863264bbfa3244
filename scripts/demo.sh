#!/usr/bin/env bash
# The offline demo: starts the whole stack in one process (every service on
# its own loopback port) and replays a scripted conversation whose tools all
# run for real: Python in a kernel, files, a sub-agent, an approval.
#
#   ./scripts/demo.sh            the demo in a fresh workspace, removed at the end
#   ./scripts/demo.sh --keep     the same, the workspace kept (its path is printed)
#   ./scripts/demo.sh --workspace DIR   the demo in DIR (kept)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

keep=0
workspace=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --workspace) workspace="$2"; keep=1; shift ;;
    --workspace=*) workspace="${1#--workspace=}"; keep=1 ;;
    *) args+=("$1") ;;
  esac
  shift
done

"$root/scripts/bootstrap.sh"
export OMICOS_KERNEL_PYTHON="${OMICOS_KERNEL_PYTHON:-$root/.venv/bin/python3}"

target="${CARGO_TARGET_DIR:-$root/target}"
if [ ! -x "$target/debug/omicos" ]; then
  echo "==> building omicos: the first build takes 10-15 minutes on 2 cores and about 8 GB of disk; cargo shows its progress below"
else
  echo "==> building omicos (up to date in seconds)"
fi
cargo build -p omicos-cli --bin omicos

if [ -z "$workspace" ]; then
  workspace="$(mktemp -d "${TMPDIR:-/tmp}/omicos-demo.XXXXXX")"
fi
if [ "$keep" = 1 ]; then
  echo "==> the demo's workspace: $workspace (kept)"
else
  echo "==> the demo's workspace: $workspace (removed at the end; --keep keeps it)"
  trap 'rm -rf "$workspace"' EXIT
fi
"$target/debug/omicos" demo --workspace "$workspace" ${args[@]+"${args[@]}"}
