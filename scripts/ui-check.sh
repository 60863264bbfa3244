#!/usr/bin/env bash
# CI's check of the web page: type-checks ui/, runs its unit tests, and
# rebuilds the generated clients and the page into a temporary folder; fails
# when either differs from the committed copy (ui/src/gen/,
# services/webui/dist/). The build is reproducible: the same sources give the
# same bytes (content hashes, no timestamps).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/ui-deps.sh"
cd "$root/ui"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
npx buf generate ../proto --template buf.gen.yaml \
  --path ../proto/omicos/v1/orchestrator.proto --path ../proto/omicos/v1/common.proto -o "$tmp"
npm run --silent typecheck
npx vitest run --reporter=dot
npx vite build --outDir "$tmp/dist" --emptyOutDir --logLevel warn
status=0
if ! diff -r "$tmp/src/gen" src/gen >"$tmp/gen.diff"; then
  echo "ui-check: ui/src/gen/ is not what proto/ generates; run scripts/ui-build.sh and commit" >&2
  head -n 40 "$tmp/gen.diff" >&2
  status=1
fi
if ! diff -r "$tmp/dist" "$root/services/webui/dist" >"$tmp/dist.diff"; then
  echo "ui-check: services/webui/dist/ is not what ui/ builds; run scripts/ui-build.sh and commit" >&2
  head -n 40 "$tmp/dist.diff" >&2
  status=1
fi
[ "$status" = 0 ] && echo "ui-check: generated clients and embedded page match the sources"
exit "$status"
