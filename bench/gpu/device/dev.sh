#!/bin/bash
# The one command every GPU-machine call runs:  bash build/gpu/run/dev.sh [run SECONDS]
# 1. on a fresh machine: prints its facts (GPU, driver, Python, torch, the tools there)
# 2. stashes the payload part this call carried (build/gpu/pNN) in /root/stash
# 3. once every part is there (parts.sha256): assembles, verifies and unpacks vLLM and the shipped wheels into
#    /root/site (first on PYTHONPATH, so they win over the image's own)
# 4. with 'run SECONDS': runs the matrix rows not yet done until SECONDS after this command started, then packs
#    /root/results into $OUT (results.tgz: each row's JSON and memory lines; logs.tgz: vLLM's whole logs)
T0=$(date +%s)
G=$(cd "$(dirname "$0")" && pwd)
PY=/opt/torch/.venv/bin/python3; [ -x "$PY" ] || PY=python3
mkdir -p /root/stash /root/results
echo "[dev] head=$(git log -1 --format=%h 2>/dev/null) carried: $(ls "$G"/.. | tr '\n' ' ')"
if [ ! -f /root/stash/info.done ]; then
  echo "[dev] fresh machine: $(uname -r) $(nproc) cores"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,compute_cap --format=csv
  $PY --version; which xz zstd unzip gcc | tr '\n' ' '; echo
  $PY -m pip list 2>/dev/null | grep -i -E '^(torch|triton|transformers|tokenizers|numpy|huggingface|safetensors|uvloop|anyio|httpx|numba|protobuf|pillow|jinja2|prometheus) '
  df -h /root | tail -1; free -g | head -2
  touch /root/stash/info.done
fi
for f in "$G"/../p*/payload.part*; do
  [ -f "$f" ] && cp "$f" /root/stash/ && echo "[dev] stashed $(basename "$f") $(stat -c %s "$f")"
done
if [ ! -f /root/site/.installed ]; then
  if (cd /root/stash && sha256sum -c --quiet "$G/parts.sha256" >/dev/null 2>&1); then
    cat /root/stash/payload.part* > /root/payload.tar && rm -f /root/stash/payload.part*
    mkdir -p /root/p /root/site && tar -xf /root/payload.tar -C /root/p && rm -f /root/payload.tar
    $PY -m zipfile -e /root/p/vllm.zip /root/site
    for w in /root/p/ship/*.whl; do $PY -m zipfile -e "$w" /root/site; done
    rm -rf /root/p
    touch /root/site/.installed
    echo "[dev] installed in $(( $(date +%s) - T0 ))s: $(du -sh /root/site | cut -f1)"
  else
    echo "[dev] parts so far: $(ls /root/stash | tr '\n' ' ')"
  fi
fi
export PYTHONPATH=/root/site
if [ -f /root/site/.installed ] && [ "${1:-}" = run ]; then
  if [ ! -f /root/results/gpu.txt ]; then
    HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 $PY -c "
import torch, vllm
p = torch.cuda.get_device_properties(0)
f, t = torch.cuda.mem_get_info()
print('vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda)
print('device', p.name, 'total_memory_bytes', p.total_memory, 'mem_get_info_free', f, 'mem_get_info_total', t)
" 2>&1 | grep -v -E '^(INFO|DEBUG|WARNING)' | tail -5 | tee /root/results/gpu.txt
  fi
  $PY "$G/runner.py" "$G/matrix.json" $(( T0 + ${2:-560} )) 2>&1 | tee -a /root/results/runner.txt
fi
if [ -n "${OUT:-}" ] && [ -d /root/results ]; then
  (cd /root && tar -czf "$OUT/results.tgz" --exclude='*.full.log' results 2>/dev/null)
  (cd /root && tar -czf "$OUT/logs.tgz" results/*.full.log 2>/dev/null)
  cp /root/results/runner.txt "$OUT/" 2>/dev/null
fi
echo "[dev] command took $(( $(date +%s) - T0 ))s"
