#!/usr/bin/env bash
# Checks deploy/k8s/*.yaml against the Kubernetes API schemas, offline, with
# kubernetes-validate (its schemas ship in the PyPI package), strict: unknown
# fields are errors. Installs it into the project venv on first use.
# The manifests' meaning (env keys, probes, replicas, registration) is checked
# by tests/tests/deploy.rs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
version=1.37.0
if ! .venv/bin/kubernetes-validate --version 2>/dev/null | grep -q "$version"; then
  echo "==> installing kubernetes-validate $version into .venv"
  .venv/bin/python3 -m pip install --disable-pip-version-check -q "kubernetes-validate==$version"
fi
.venv/bin/kubernetes-validate --strict --quiet -k 1.33.0 deploy/k8s/*.yaml
echo "==> deploy/k8s: valid against the Kubernetes 1.33 schemas (strict)"
