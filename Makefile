# The two commands of the README, plus generators.
.PHONY: demo test crd generate golden flags lock

demo:  ## a local control plane, the operator and an example VLLMServer, until Ctrl-C
	bash tools/demo.sh

test:  ## the whole test suite (installs and caches what it needs)
	bash tools/run-tests.sh

crd:   ## regenerate the CRD from the pydantic models
	.venv/bin/vllm-operator crd > crds/vllmservers.vllm-operator.io.yaml

generate:  ## regenerate crds/, the chart's crds/ and values.schema.json, manifests/ (tests fail when stale)
	.venv/bin/python -m vllm_operator.packaging

golden:  ## regenerate the golden render output of examples/ (on purpose only)
	UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_builders.py -q

flags:  ## regenerate the vLLM flag snapshots (one per supported release) from the real parsers
	.venv/bin/python -m tools.dump_vllm_flags

lock:  ## the image's hash-locked runtime dependencies, from pyproject.toml (tests check they agree)
	.venv/bin/python -m pip install -q pip-tools && .venv/bin/pip-compile -q --generate-hashes --strip-extras \
	  --allow-unsafe --no-emit-find-links -o requirements.lock pyproject.toml
