#!/bin/bash
# Build the payload that carries vLLM to the GPU machine (run here, on the CPU machine).
#  - the vLLM wheel with what an H200 (SM90) start never loads deleted from it in place (zip -d: nothing is
#    recompressed, seconds on a busy 2-core machine): the FA2 kernels (FA3 serves Hopper; 129 MB deflated), the
#    Rust frontend binary vllm-rs, the Blackwell-only FMHA sources, deep_gemm's .so for the other Pythons, swagger's
#    static files: 304 -> 152 MB;
#  - the cp312 wheels the GPU machine's image lacks (ship.txt), as they are (20 MB);
#  - both in one tar, split into parts of at most PART_MIB (each carried by one device command) + parts.sha256.
# (xz -9 packs the CUDA kernels far better, FA3's 153 MB to 7.9 MB, but takes ~6 CPU-minutes for the tree: too long
# on a shared 2-core machine for a saving of one part.) 172 MB: three parts of 55 MiB.
# Usage: bash bench/gpu/pack.sh VLLM_WHEEL WORKDIR [PART_MIB]
set -euo pipefail
WHL=$1; W=$2; PART=${3:-55}
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$W/ship" "$W/parts"; mkdir -p "$W/ship" "$W/parts"
cp "$WHL" "$W/vllm.zip"
zip -q -d "$W/vllm.zip" 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm-rs' 'vllm/third_party/fmha_sm100/*' \
  'vllm/entrypoints/serve/instrumentator/static/*' 'vllm/third_party/deep_gemm/_C.cpython-31[0134]-*'
P="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none --no-deps"
for pl in manylinux_2_28_x86_64 manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
          manylinux_2_26_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64; do
  P="$P --platform $pl"; done
pip download -q $P -d "$W/ship" $(grep -v '^#' "$HERE/ship.txt" | tr '\n' ' ')
(cd "$W" && tar -cf payload.tar vllm.zip ship)
(cd "$W/parts" && split -b "${PART}M" -d -a 2 ../payload.tar payload.part && sha256sum payload.part* > parts.sha256)
ls -la "$W/parts"
