# The two commands of the README, plus generators.
.PHONY: demo test test-unit test-artefacts test-apiserver test-apiserver-oldest test-e2e crd generate golden flags lock

demo:  ## a local control plane, the operator and an example VLLMServer, until Ctrl-C
	bash tools/demo.sh

test:  ## the whole test suite (installs and caches what it needs)
	bash tools/run-tests.sh

# The tiers one at a time (docs/architecture.md#tests); each goes through tools/run-tests.sh, which installs and
# caches what the tests need, except the unit tier, which needs the Python environment only.
test-unit: .venv/bin/python  ## tests/unit: pure, no test-bed binary (minutes)
	.venv/bin/python -m pytest -p no:cacheprovider tests/unit

test-artefacts:  ## tests/artefacts: the chart, alerts, dashboard, kstatus, Argo CD, the release workflow (built tools)
	bash tools/run-tests.sh tests/artefacts

test-apiserver:  ## tests/apiserver: in-process tests against the real API server
	bash tools/run-tests.sh tests/apiserver

test-apiserver-oldest:  ## tests/apiserver against the oldest claimed Kubernetes (tools/testbed/kube-1.30)
	VLLM_OPERATOR_KUBE_MODULE=kube-1.30 VLLM_OPERATOR_OLDEST_KUBE=0 bash tools/run-tests.sh tests/apiserver

test-e2e:  ## e2e/: the operator as a process and real vLLM on the test bed
	bash tools/run-tests.sh e2e

.venv/bin/python:
	python3 -m venv .venv && .venv/bin/python -m pip install -q -e '.[test,helm]'

crd:   ## regenerate the CRD from the pydantic models
	.venv/bin/vllm-operator crd > crds/vllmservers.vllm-operator.io.yaml

generate:  ## regenerate crds/, the chart's crds/ and values.schema.json, manifests/ (tests fail when stale)
	.venv/bin/python -m vllm_operator.generate

golden:  ## regenerate the golden render output of examples/ (on purpose only)
	UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_builders.py -q

flags:  ## regenerate the vLLM flag snapshots (one per supported release) from the real parsers
	.venv/bin/python -m tools.dump_vllm_flags

lock:  ## the image's hash-locked runtime dependencies, from pyproject.toml (tests check they agree)
	.venv/bin/python -m pip install -q pip-tools && .venv/bin/pip-compile -q --generate-hashes --strip-extras \
	  --allow-unsafe --no-emit-find-links -o requirements.lock pyproject.toml
