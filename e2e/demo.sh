#!/usr/bin/env bash
# The README's main job: local control plane + operator + an example VLLMServer.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
command -v kubectl >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -q kubernetes-client >/dev/null
echo "building or reusing the cached Kubernetes 1.20 binaries (about 6 minutes the first time)..."
bash e2e/kube-build.sh >/tmp/vllm-operator-kube-build.log 2>&1 || { tail -50 /tmp/vllm-operator-kube-build.log; exit 1; }
exec .venv/bin/python -m e2e.demo "$@"
