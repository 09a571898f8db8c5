"""Fuzzed VLLMServer specs through validation -> planner -> builders.

Three families of generated documents (hypothesis):

* plausible: catalog models and GPUs, sane numbers, valid Kubernetes names -- many still
  do not fit their GPU, which the planner must say;
* extreme: anything goes -- huge and negative numbers, zero GPUs, unicode, empty lists,
  wrong types, unknown fields at any depth;
* broken: a plausible document with one field set to a value known to be invalid.

Properties: no exception escapes `load_documents`/`parse_spec` -> `plan_server` ->
`build_all`; every refusal is one line that starts with the field's path (and a broken
document's lines name the broken field); every accepted spec renders objects. A sample of
accepted specs goes through the API server's server-side dry-run (apiserver), and a sample
of their args through vLLM's own parser (vllm). The counts are in the "stress figures".
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections import Counter
from typing import Any, Optional

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_operator import api, builders, catalog, documents, pipeline
from vllm_operator.controller.drift import with_hash

MODELS = catalog.known_models()
GPUS = [g.product for g in catalog.known_gpus()]
SAFE_EXTRA_ARGS = [["--seed", "1"], ["--disable-log-requests"], ["--max-logprobs", "5"], ["--tokenizer-mode", "auto"],
                   ["--generation-config", "vllm"], ["--enable-chunked-prefill"], ["--uvicorn-log-level", "warning"]]
FIELD_PATH = re.compile(r"^(spec|metadata|apiVersion|kind)([.\[][^: ]*)?[: ].+")
COUNTS: Counter = Counter()

# ----------------------------------------------------------------------------- names Kubernetes accepts
dns_label = st.from_regex(r"\A[a-z]([a-z0-9-]{0,20}[a-z0-9])?\Z")
label_value = st.from_regex(r"\A([A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?)?\Z")
label_key = st.builds(lambda p, n: f"{p}/{n}" if p else n, st.sampled_from(["", "example.com", "team.io"]),
                      st.from_regex(r"\A[a-z]([-a-z0-9_.]{0,15}[a-z0-9])?\Z"))
quantity_gi = st.integers(1, 2000).map(lambda n: f"{n}Gi")
unicode_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)


@st.composite
def plausible(draw) -> dict[str, Any]:
    """A schema-valid VLLMServer a user could write; the planner may still refuse it (does not fit)."""
    workload = draw(st.sampled_from(["StatefulSet", "StatefulSet", "DaemonSet"]))
    model: dict[str, Any] = {"name": draw(st.sampled_from(MODELS))}
    if draw(st.booleans()):
        model["servedName"] = draw(st.one_of(dns_label, unicode_text))
    if draw(st.integers(0, 4)) == 0:
        model["quantization"] = draw(st.sampled_from(["awq_marlin", "gptq_marlin", "fp8"]))
    if draw(st.integers(0, 4)) == 0:
        model["dtype"] = draw(st.sampled_from(["bfloat16", "float16"]))
    gpu: dict[str, Any] = {"count": draw(st.sampled_from([1, 1, 2, 4, 8])), "product": draw(st.sampled_from(GPUS))}
    if draw(st.integers(0, 5)) == 0:
        gpu["reservedMemory"] = draw(st.sampled_from(["512Mi", "1Gi", "1.2Gi"]))
    spec: dict[str, Any] = {"model": model, "gpu": gpu, "workload": workload}
    if workload == "StatefulSet":
        spec["replicas"] = draw(st.integers(0, 4))
    profile: dict[str, Any] = {}
    if draw(st.booleans()):
        profile["maxContextTokens"] = draw(st.integers(512, 262144))
    if draw(st.booleans()):
        profile["p95PromptTokens"] = draw(st.integers(1, 8000))
        profile["p95OutputTokens"] = draw(st.integers(1, 4000))
    if draw(st.booleans()):
        profile["targetConcurrency"] = draw(st.integers(1, 256))
    if draw(st.booleans()):
        profile["priority"] = draw(st.sampled_from(["latency", "balanced", "throughput"]))
    if profile:
        spec["workloadProfile"] = profile
    engine: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        engine["kvCacheDtype"] = draw(st.sampled_from(["auto", "fp8"]))
    if draw(st.integers(0, 3)) == 0:
        engine["enablePrefixCaching"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        engine["enforceEager"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        engine["extraArgs"] = [a for args in draw(st.lists(st.sampled_from(SAFE_EXTRA_ARGS), max_size=3, unique_by=tuple))
                               for a in args]
    if draw(st.integers(0, 3)) == 0:
        engine["env"] = [{"name": n, "value": v} for n, v in draw(st.dictionaries(
            st.from_regex(r"\AVLLM_[A-Z_]{1,12}\Z"), st.sampled_from(["1", "0", "debug", ""]), max_size=3)).items()
            if not re.search("TOKEN|SECRET|KEY|PASS", n)]
    if engine:
        spec["engine"] = engine
    if draw(st.booleans()):
        spec["ipc"] = draw(st.sampled_from(["Host", "SharedMemory"]))
    if draw(st.integers(0, 3)) == 0:
        if workload == "StatefulSet" and draw(st.booleans()):
            spec["cache"] = {"size": draw(quantity_gi)}
            if draw(st.booleans()):
                spec["cache"]["storageClassName"] = draw(dns_label)
        else:
            spec["cache"] = {"claimName": draw(dns_label)}
    if draw(st.booleans()):
        spec["hfTokenSecretRef"] = {"name": draw(dns_label), "key": draw(st.from_regex(r"\A[a-z][a-z0-9._-]{0,10}\Z"))}
    if workload == "StatefulSet" and draw(st.integers(0, 3)) == 0:
        low = draw(st.integers(1, 4))
        spec["autoscaling"] = {"enabled": True, "minReplicas": low, "maxReplicas": draw(st.integers(low, 10)),
                               "targetWaitingPerReplica": draw(st.sampled_from([0.5, 1, 2, 4.5]))}
    if workload == "DaemonSet" and draw(st.integers(0, 4)) == 0:
        spec["hostNetwork"] = True
    if draw(st.integers(0, 3)) == 0:
        spec["nodeSelector"] = draw(st.dictionaries(label_key, label_value, max_size=3))
    if draw(st.integers(0, 3)) == 0:
        spec["tolerations"] = [draw(st.sampled_from([
            {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},
            {"operator": "Exists"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 30}]))]
    if draw(st.integers(0, 3)) == 0:
        spec["podLabels"] = draw(st.dictionaries(label_key, label_value, max_size=3))
    if draw(st.integers(0, 3)) == 0:
        spec["podAnnotations"] = draw(st.dictionaries(label_key, unicode_text, max_size=3))
    if draw(st.integers(0, 4)) == 0:
        cpu = draw(st.integers(1, 64))
        spec["resources"] = {"requests": {"cpu": str(cpu), "memory": draw(quantity_gi)},
                             "limits": {"cpu": str(cpu * draw(st.integers(1, 2)))}}
    if draw(st.integers(0, 5)) == 0:
        spec["serviceAccountName"] = draw(dns_label)
    if draw(st.integers(0, 5)) == 0:
        spec["priorityClassName"] = draw(dns_label)
    if draw(st.integers(0, 5)) == 0:
        spec["imagePullPolicy"] = draw(st.sampled_from(["Always", "IfNotPresent", "Never"]))
    name = draw(st.from_regex(r"\A[a-z]([a-z0-9-]{0,30}[a-z0-9])?\Z"))
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, "namespace": "fuzz"},
            "spec": spec}


# ----------------------------------------------------------------------------- anything goes
ANY_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-10**15, 10**15), st.sampled_from([0, -1, 2**63, 10**30]),
                       st.floats(allow_nan=True, allow_infinity=True), unicode_text, st.just(""))
ANY_VALUE = st.recursive(ANY_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                             st.dictionaries(unicode_text, inner, max_size=3)),
                         max_leaves=6)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


def _set(doc: Any, path: tuple, value: Any) -> None:
    for p in path[:-1]:
        doc = doc[p]
    doc[path[-1]] = value


EXTREME_FIELDS = {
    ("spec", "gpu", "count"): st.sampled_from([0, -1, 65, 10**9, 3, 5, 7, 64]),
    ("spec", "replicas"): st.sampled_from([0, 1000, 1001, -5]),
    ("spec", "workloadProfile", "maxContextTokens"): st.sampled_from([16, 15, 10**8, 10**8 + 1, 2**40]),
    ("spec", "workloadProfile", "p95PromptTokens"): st.sampled_from([1, 10**8, 10**9]),
    ("spec", "workloadProfile", "targetConcurrency"): st.sampled_from([1, 65536, 65537]),
    ("spec", "engine", "maxModelLen"): st.sampled_from([16, 10**8, 0]),
    ("spec", "engine", "maxNumSeqs"): st.sampled_from([1, 65536, 0]),
    ("spec", "engine", "maxNumBatchedTokens"): st.sampled_from([1, 10**7, 0]),
    ("spec", "engine", "gpuMemoryUtilization"): st.sampled_from([0.01, 1.0, 0.0, 1.0001, 1e-300]),
    ("spec", "engine", "extraArgs"): st.one_of(st.just([]), st.lists(unicode_text, max_size=4),
                                               st.lists(st.sampled_from(["--seed", "1", "--port", "=", "-", "--",
                                                                         "-O3", "--compilation-config.mode"]),
                                                        max_size=5)),
    ("spec", "engine", "env"): st.one_of(st.just([]), st.lists(st.fixed_dictionaries(
        {"name": unicode_text, "value": unicode_text}), max_size=3)),
    ("spec", "gpu", "memory"): st.sampled_from(["0", "1", "1Ei", "24Gi", "-24Gi", "1e30", "0.5Gi"]),
    ("spec", "gpu", "reservedMemory"): st.sampled_from(["0", "100Gi", "-1Gi", "23.99Gi"]),
    ("spec", "shmSize"): st.sampled_from(["0", "1Mi", "1Ei", "-1"]),
    ("spec", "model", "name"): st.one_of(unicode_text, st.sampled_from(["/", ".", "a" * 512, "org/" + "ü" * 30])),
    ("spec", "model", "servedName"): unicode_text,
    ("spec", "tolerations"): st.just([]),
    ("spec", "nodeSelector"): st.dictionaries(unicode_text, unicode_text, max_size=2),
    ("spec", "podLabels"): st.dictionaries(unicode_text, unicode_text, max_size=2),
    ("metadata", "name"): st.one_of(unicode_text, st.from_regex(r"\A[a-z]{40,70}\Z")),
    ("spec", "autoscaling"): st.fixed_dictionaries({"enabled": st.booleans(), "minReplicas": st.integers(-1, 5),
                                                    "maxReplicas": st.integers(-1, 5)}),
}


@st.composite
def extreme(draw) -> dict[str, Any]:
    """A plausible document with several fields pushed to extremes, wrong types or unknown keys."""
    doc = draw(plausible())
    for _ in range(draw(st.integers(1, 4))):
        choice = draw(st.integers(0, 3))
        if choice == 0:  # a known field to an extreme value
            path = draw(st.sampled_from(sorted(EXTREME_FIELDS, key=str)))
            parent = doc
            for p in path[:-1]:
                parent = parent.setdefault(p, {}) if isinstance(parent, dict) else {}
            if isinstance(parent, dict):
                parent[path[-1]] = draw(EXTREME_FIELDS[path])
        elif choice == 1:  # any existing node to any value (wrong types)
            path = draw(st.sampled_from(_paths(doc)[1:]))
            _set(doc, path, draw(ANY_VALUE))
        elif choice == 2:  # an unknown field somewhere in a mapping
            mappings = [p for p in _paths(doc) if isinstance(_get(doc, p), dict) and p[:1] == ("spec",)]
            if not mappings:
                continue
            path = draw(st.sampled_from(mappings))
            _get(doc, path)[draw(st.sampled_from(["bogus", "extra_args", "Replicas", "ünknown"]))] = draw(ANY_SCALAR)
        else:  # drop a field
            path = draw(st.sampled_from(_paths(doc)[1:]))
            parent = _get(doc, path[:-1])
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif isinstance(parent, list) and parent:
                parent.pop(path[-1])
    return doc


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


# ----------------------------------------------------------------------------- known-invalid single fields
#: (path in the document, bad values, the field the message must name)
BROKEN: list[tuple[tuple, list, str]] = [
    (("spec", "gpu", "count"), [0, -1, 65, "two", 2.5, None, []], "spec.gpu.count"),
    (("spec", "replicas"), [-1, 1001, "x", 1.5, {}], "spec.replicas"),
    (("spec", "workload"), ["Deployment", "", 1], "spec.workload"),
    (("spec", "ipc"), ["Shared", None], "spec.ipc"),
    (("spec", "model", "name"), ["", "x" * 513, 7, None], "spec.model.name"),
    (("spec", "model", "quantization"), ["int3", "AWQ", "bitsandbytes", "gguf"], "spec.model.quantization"),
    (("spec", "model", "dtype"), ["fp64", "float8"], "spec.model.dtype"),
    (("spec", "model", "configURL"), [""], "spec.model.configURL"),
    (("spec", "workloadProfile", "maxContextTokens"), [0, 15, 10**12, "long"], "spec.workloadProfile.maxContextTokens"),
    (("spec", "workloadProfile", "priority"), ["fast", ""], "spec.workloadProfile.priority"),
    (("spec", "engine", "gpuMemoryUtilization"), [0, 1.5, -0.1, "high"], "spec.engine.gpuMemoryUtilization"),
    (("spec", "engine", "maxNumSeqs"), [0, -3, 10**6], "spec.engine.maxNumSeqs"),
    (("spec", "engine", "kvCacheDtype"), ["int4"], "spec.engine.kvCacheDtype"),
    (("spec", "engine", "extraArgs"), [["--swap-space", "4"], ["--no-such-flag"], ["not-a-flag"], "--seed 1",
                                       ["--max-model-len", "4096"], ["--port", "9000"], ["--host", "127.0.0.1"],
                                       ["--api-key", "s3cr3t-value"], ["--hf-token", "hf_abcdefghijklmnopqrstuv"]],
     "spec.engine.extraArgs"),
    (("spec", "engine", "env"), [[{"name": "HF_TOKEN", "value": "x"}], [{"name": "A", "value": "hf_" + "a" * 30}],
                                 [{"name": "1 bad name", "value": "v"}], [{"name": "DB_PASSWORD", "value": "hunter2"}],
                                 [{"value": "v"}], "A=B"], "spec.engine.env"),
    (("spec", "gpu", "memory"), ["12 GB", "-", "lots"], "spec.gpu.memory"),
    (("spec", "gpu", "reservedMemory"), ["lots", "1 Gi"], "spec.gpu.reservedMemory"),
    (("spec", "cache"), [{}, {"size": "10Gi", "claimName": "x"}, {"size": "ten"}], "spec.cache"),
    (("spec", "autoscaling"), [{"enabled": True}, {"enabled": True, "minReplicas": 3, "maxReplicas": 2}],
     "spec.autoscaling"),
    (("spec", "autoscaling", "minReplicas"), [-1], "spec.autoscaling.minReplicas"),
    (("metadata", "name"), ["UPPER", "ñame", "a" * 53, "a" * 64, "-x", ""], "metadata.name"),
    (("spec", "bogus"), [1, "x"], "spec.bogus"),
    (("spec", "gpu", "Count"), [1], "spec.gpu.Count"),
    (("spec", "engine", "extra_args"), [["--seed", "1"]], "spec.engine.extra_args"),
    (("spec", "tolerations"), [[{"operator": "Maybe"}], "all"], "spec.tolerations"),
    (("spec", "resources", "requests"), [{"cpu": "lots"}, {"nvidia.com/gpu": "1"}], "spec.resources"),
    (("spec", "nodeSelector"), [["a"], {"k": 1.5j if False else []}], "spec.nodeSelector"),
    (("spec", "hfTokenSecretRef"), [{"key": "token"}, "hf-token"], "spec.hfTokenSecretRef"),
    (("spec", "imagePullPolicy"), ["Sometimes"], "spec.imagePullPolicy"),
    (("spec", "image"), ["", None], "spec.image"),
]


@st.composite
def broken(draw) -> tuple[dict[str, Any], str]:
    doc = draw(plausible())
    path, values, field = draw(st.sampled_from(BROKEN))
    parent = doc
    for p in path[:-1]:
        parent = parent.setdefault(p, {})
    parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(values)))
    if field == "spec.hostNetwork" or field.startswith("spec.autoscaling"):
        doc["spec"]["workload"] = "StatefulSet"
    return doc, field


# ----------------------------------------------------------------------------- the pipeline under test
def offline_fetch(url: str) -> dict:
    raise ValueError(f"could not fetch config.json from {url}: no network in tests")  # as model_facts.fetch_config


OWNER = {"metadata": {"name": "owner", "uid": "00000000-0000-0000-0000-000000000000"}}


def run_pipeline(doc: dict[str, Any]) -> tuple[list[str], Optional[list[dict]], Optional[Any]]:
    """(refusal lines, rendered objects, plan): the way the CLI (load_documents) and the operator (parse_spec) go."""
    text = yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), allow_unicode=True)
    docs = documents.load_documents(text)
    assert len(docs) == 1
    d = docs[0]
    # The operator's path: the API server hands it the spec as a dict.
    spec_model, spec_errors = documents.parse_spec(doc.get("spec") if isinstance(doc.get("spec"), dict) else {})
    if d.errors:
        return d.errors, None, None
    assert spec_model is not None and not spec_errors, spec_errors  # both paths agree on the spec
    s = d.server
    plan = pipeline.plan_server(s.metadata.name, s.metadata.namespace, s.spec, fetch=offline_fetch)
    if not plan.fits:
        return [str(p) for p in plan.problems], None, plan
    owner = {**OWNER, "metadata": {**OWNER["metadata"], "name": s.metadata.name}}
    objects = builders.build_all(plan, owner)
    return [], objects, plan


def check_rendered(doc: dict[str, Any], objects: list[dict], plan) -> None:
    kinds = [o["kind"] for o in objects]
    workload = doc["spec"].get("workload", "StatefulSet")
    assert kinds.count(workload) == 1 and kinds.count("Service") == (2 if workload == "StatefulSet" else 1)
    for obj in objects:
        json.dumps(obj)  # JSON-serialisable, as it is sent
        with_hash(obj)
        assert obj["metadata"]["name"].startswith(doc["metadata"]["name"])
    container = next(o for o in objects if o["kind"] == workload)["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == plan.args and all(isinstance(a, str) for a in plan.args)
    assert plan.args[0] == doc["spec"]["model"]["name"]


def check_refusal(lines: list[str]) -> None:
    assert lines, "refused without a reason"
    for line in lines:
        assert FIELD_PATH.match(line), f"a refusal that names no field: {line!r}"


LONG = os.environ.get("VLLM_OPERATOR_LONG", "") not in ("", "0")  # --long sets it (e2e/testbed/pytest_stress.py)
FUZZ = settings(max_examples=2000 if LONG else 200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.filter_too_much])


@FUZZ
@given(plausible())
def test_plausible_specs_render_or_are_refused_by_field(doc):
    lines, objects, plan = run_pipeline(doc)
    COUNTS["plausible"] += 1
    if objects is None:
        COUNTS["plausible refused"] += 1
        check_refusal(lines)
    else:
        COUNTS["plausible rendered"] += 1
        check_rendered(doc, objects, plan)


@FUZZ
@given(extreme())
def test_extreme_specs_never_raise(doc):
    lines, objects, plan = run_pipeline(doc)
    COUNTS["extreme"] += 1
    if objects is None:
        COUNTS["extreme refused"] += 1
        check_refusal(lines)
    else:
        COUNTS["extreme rendered"] += 1
        check_rendered(doc, objects, plan)


@FUZZ
@given(broken())
def test_broken_field_is_named(case):
    doc, field = case
    lines, objects, _ = run_pipeline(doc)
    COUNTS["broken"] += 1
    assert objects is None, f"{field} = {_get_field(doc, field)!r} was accepted"
    check_refusal(lines)
    assert any(line.startswith(field) for line in lines), f"no message names {field}: {lines}"


def _get_field(doc: dict, dotted: str) -> Any:
    node: Any = doc
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def test_zz_report_counts(stress_report):
    """Runs last in this module: the numbers of cases the fuzzers ran."""
    for key in ("plausible", "plausible rendered", "plausible refused", "extreme", "extreme rendered",
                "extreme refused", "broken"):
        stress_report("fuzz", key, COUNTS[key])


# ----------------------------------------------------------------------------- samples for the API server and vLLM
def sample_rendered(strategy, count: int, max_examples: int = 400) -> list[tuple[dict, list[dict], Any]]:
    """Up to `count` generated documents that render, with their objects and plan."""
    found: list[tuple[dict, list[dict], Any]] = []

    @settings(max_examples=max_examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(strategy)
    def collect(doc):
        if len(found) >= count:
            return
        _, objects, plan = run_pipeline(doc)
        if objects is not None:
            found.append((doc, objects, plan))

    collect()
    return found
