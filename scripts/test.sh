#!/usr/bin/env bash
# Runs the whole test suite: unit tests, provider tests against real servers
# on loopback, and end-to-end tests of the gRPC services.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# What the run needs besides cargo and Python 3.11, said up front.
if ! command -v npm >/dev/null 2>&1; then
  echo "==> npm not installed: the MCP tests (tests/mcp-servers) cannot be set up and will fail, the page checks and browser tests are SKIPPED; install Node 20 and npm (apt-get install nodejs npm)"
fi
if [ "$(id -u)" != 0 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "==> not root and no chromium: the browser tests need Debian's chromium (they install it with apt-get as root); OMICOS_SKIP_UI_BROWSER=1 skips them"
fi
"$root/scripts/bootstrap.sh"
export OMICOS_KERNEL_PYTHON="${OMICOS_KERNEL_PYTHON:-$root/.venv/bin/python3}"
# PostgreSQL-backed tests run when 127.0.0.1:5432 answers; start the local cluster if it is installed but down.
if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  fi
fi
if (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  echo "==> PostgreSQL on 127.0.0.1:5432: PostgreSQL tests will run"
elif [ "${CI:-}" = "true" ] || [ "${CI:-}" = "1" ]; then
  echo "==> PostgreSQL not reachable on 127.0.0.1:5432: under CI=true the PostgreSQL tests will FAIL (services/testdb)"
else
  echo "==> PostgreSQL not reachable on 127.0.0.1:5432: PostgreSQL tests will print SKIPPED (they fail under CI=true)"
fi
# The Kubernetes manifests against the API schemas (tests/tests/deploy.rs checks their meaning).
"$root/scripts/deploy-check.sh"
# The web page: the committed build and generated clients must match ui/ and proto/.
if command -v npm >/dev/null 2>&1; then
  "$root/scripts/ui-check.sh"
else
  echo "==> npm not installed: ui-check SKIPPED (the committed page in services/webui/dist/ is not re-verified)"
fi
if command -v npm >/dev/null 2>&1; then
  "$root/scripts/mcp-servers.sh"  # MCP reference servers + TS SDK client for services/mcp's tests
fi
status=0
# The service binaries the cluster tests start as processes, built with the
# tests' feature set before the suite: the tests then do not build them
# themselves (a build during the run could relink a binary being started).
cargo build --workspace --bins --tests
export OMICOS_TEST_BINS_BUILT=1
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@" || status=$?
else
  cargo test --workspace --no-fail-fast "$@" || status=$?
fi
# The page in a real browser on a real stack (omicos up + the scripted model);
# it installs chromium with apt-get when missing. OMICOS_SKIP_UI_BROWSER=1 skips it.
if [ "${OMICOS_SKIP_UI_BROWSER:-}" = "1" ]; then
  echo "==> OMICOS_SKIP_UI_BROWSER=1: the browser tests SKIPPED"
elif command -v npm >/dev/null 2>&1; then
  "$root/scripts/ui-stack-test.sh" || status=$?
else
  echo "==> npm not installed: the browser tests SKIPPED (scripts/ui-stack-test.sh)"
fi
echo "==> summary"
python3 "$root/scripts/skipped-tests.py" "${CARGO_TARGET_DIR:-$root/target}/nextest/default/junit.xml" || true
if [ "$status" = 0 ]; then
  echo "==> test.sh: passed"
else
  echo "==> test.sh: FAILED (exit $status)"
fi
exit "$status"
