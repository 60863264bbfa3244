#!/usr/bin/env bash
# The page's browser tests (ui/tests/), in Debian's headless chromium driven
# by playwright-core, against a running stack whose model follows
# ui/tests/stack-script.json:
#
#   OMICOS_UI_URL=http://127.0.0.1:7000 scripts/ui-test.sh
#
# Screenshots go to ui/test-artifacts/ (or $OMICOS_UI_ARTIFACTS).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
: "${OMICOS_UI_URL:?set OMICOS_UI_URL to the page of a running stack, e.g. http://127.0.0.1:7000}"
# Chromium, a colour emoji font for the agents' icons and a CJK font for the
# catalog's Chinese summaries and prompts in the screenshots.
if ! dpkg -s chromium fonts-noto-color-emoji fonts-wqy-zenhei >/dev/null 2>&1; then
  echo "ui-test: installing Debian's chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium fonts-noto-color-emoji fonts-wqy-zenhei >/dev/null
fi
"$root/scripts/ui-deps.sh"
cd "$root/ui"
export OMICOS_UI_URL
exec npx vitest run --config vitest.browser.config.ts "$@"
