#!/usr/bin/env bash
# The page's browser tests on a real stack, as scripts/test.sh runs them:
#   1. the scripted model: omicos-fake-llm following ui/tests/stack-script.json
#      (OpenAI Chat Completions SSE on a loopback port);
#   2. `omicos up` on ephemeral loopback ports in a fresh workspace, its
#      orchestrator pointed at that model (every tool runs for real: the
#      kernel with tqdm and matplotlib from the project venv);
#   3. scripts/ui-test.sh against the page URL that `omicos up` prints;
#   4. both stopped with SIGTERM, whatever the tests said.
# Screenshots, axe reports and the stack's log go to ui/test-artifacts/
# (or $OMICOS_UI_ARTIFACTS).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
artifacts="${OMICOS_UI_ARTIFACTS:-$root/ui/test-artifacts}"
mkdir -p "$artifacts"
export OMICOS_UI_ARTIFACTS="$artifacts"
export OMICOS_KERNEL_PYTHON="${OMICOS_KERNEL_PYTHON:-$root/.venv/bin/python3}"

echo "==> ui-stack-test: building omicos and omicos-fake-llm"
cargo build --quiet -p omicos-cli --bin omicos -p omicos-e2e --bin omicos-fake-llm
bin="${CARGO_TARGET_DIR:-$root/target}/debug"

tmp="$(mktemp -d)"
llm_pid=""
up_pid=""
stop() {
  for pid in $up_pid $llm_pid; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in $up_pid $llm_pid; do
    # A drain is bounded (5 s grace); past 20 s something hangs.
    for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  cp "$tmp/up.log" "$artifacts/stack.log" 2>/dev/null || true
  cp "$tmp/llm.log" "$artifacts/fake-llm.log" 2>/dev/null || true
  rm -rf "$tmp"
}
trap stop EXIT

# Waits until file $1 has a line matching $2 (at most $3 seconds); prints it.
wait_line() {
  for _ in $(seq 1 $(($3 * 10))); do
    if line="$(grep -m1 -E "$2" "$1" 2>/dev/null)"; then
      echo "$line"
      return 0
    fi
    sleep 0.1
  done
  echo "ui-stack-test: no line matching '$2' in $1 within $3 s:" >&2
  cat "$1" >&2
  return 1
}

"$bin/omicos-fake-llm" "$root/ui/tests/stack-script.json" >"$tmp/llm.log" 2>&1 &
llm_pid=$!
llm_url="$(wait_line "$tmp/llm.log" '^openai ' 30 | cut -d' ' -f2)"

mkdir -p "$tmp/ws"
# A small upload limit, so the page's refusal of a file over it is tested
# with a 2 MB file; the tests read the limit and the workspace (to check the
# bytes an attached file landed with) from these.
export OMICOS_UI_UPLOAD_LIMIT=1048576
export OMICOS_UI_WORKSPACE="$tmp/ws"
OMICOS_LLM_BACKEND=openai OMICOS_LLM_BASE_URL="$llm_url" OMICOS_LLM_API_KEY=fake \
  OMICOS_LLM_MODEL=fake-model NO_COLOR=1 RUST_LOG="${RUST_LOG:-warn}" \
  OMICOS_UPLOADS_MAX_FILE_BYTES="$OMICOS_UI_UPLOAD_LIMIT" \
  "$bin/omicos" up --port-base 0 --workspace "$tmp/ws" >"$tmp/up.log" 2>&1 &
up_pid=$!
page="$(wait_line "$tmp/up.log" '^ +page +http' 120 | awk '{print $2}')"
echo "==> ui-stack-test: the page at $page, the model at $llm_url"

OMICOS_UI_URL="$page" "$root/scripts/ui-test.sh" "$@"
