#!/usr/bin/env bash
# The README's main job: local control plane + operator + an example VLLMServer.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
echo "building or reusing the cached control plane (Kubernetes and etcd from Go modules; about 7 minutes the first time)..."
bash tools/kube-build.sh >/tmp/vllm-operator-kube-build.log 2>&1 || { tail -50 /tmp/vllm-operator-kube-build.log; exit 1; }
exec .venv/bin/python -m tools.demo "$@"
