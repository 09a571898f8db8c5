#!/bin/bash
# Lay out what the GPU machine's calls carry, under REPO/build/gpu (build/ is git-ignored):
#   build/gpu/run   the device scripts, matrix.json, one config.json folder per model, parts.sha256 (every call)
#   build/gpu/pNN   payload part NN alone (a hard link), carried by one call each
# Usage: bash bench/gpu/stage.sh REPO WORKDIR MATRIX_JSON MODELS_DIR
set -euo pipefail
R=$1; W=$2; M=$3; MODELS=$4
HERE=$(cd "$(dirname "$0")" && pwd)
git -C "$R" check-ignore -q build/gpu/x || { echo "build/ is not ignored in $R"; exit 1; }
rm -rf "$R/build/gpu"; mkdir -p "$R/build/gpu/run"
cp -r "$HERE"/device/* "$R/build/gpu/run/"
cp "$W/parts/parts.sha256" "$R/build/gpu/run/"
cp "$M" "$R/build/gpu/run/matrix.json"; cp -r "$MODELS" "$R/build/gpu/run/models"
for p in "$W"/parts/payload.part*; do
  n=${p##*payload.part}; mkdir -p "$R/build/gpu/p$n"; ln "$p" "$R/build/gpu/p$n/"
done
du -sh "$R"/build/gpu/* | sed "s#^#[stage] #"
