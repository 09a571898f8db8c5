#!/usr/bin/env bash
# The README's main job: local control plane + operator + an example VLLMServer. Says each step as it starts,
# from the first second (the first run installs and builds for minutes; later ones reuse both).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
start=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - start ))s)"; }

step "make demo: a local control plane, the operator and an example VLLMServer (Ctrl-C ends it)"
if [[ ! -x .venv/bin/python ]]; then
  step "creating the Python environment (.venv)"
  python3 -m venv .venv
fi
# Reinstall only when pyproject.toml changed since the last install (or the package is missing): a quiet
# `pip install` on every run cost 30 s of silence.
stamp=.venv/.vllm-operator-demo-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]] || ! .venv/bin/python -c 'import vllm_operator, kubernetes' 2>/dev/null; then
  step "installing vllm-operator and its dependencies into .venv (about a minute the first time)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
  echo "$want" > "$stamp"
else
  step "Python environment up to date (.venv)"
fi
step "building or reusing the cached control plane (Kubernetes and etcd from Go modules; about 7 minutes the first time)"
bash tools/kube-build.sh >/tmp/vllm-operator-kube-build.log 2>&1 || { tail -50 /tmp/vllm-operator-kube-build.log; exit 1; }
step "starting the demo"
exec .venv/bin/python -m tools.demo "$@"
