#!/usr/bin/env bash
# Builds the web page from ui/ and refreshes the copies the repository keeps:
# the TypeScript clients generated from proto/ (ui/src/gen/) and the built
# page the binary embeds (services/webui/dist/). Commit both after a change.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/ui-deps.sh"
cd "$root/ui"
npm run --silent gen
npm run --silent typecheck
npm run --silent build -- --logLevel warn
rm -rf "$root/services/webui/dist"
cp -R dist "$root/services/webui/dist"
echo "ui-build: services/webui/dist/ refreshed ($(find "$root/services/webui/dist" -type f | wc -l) files)"
