"""The escape hatches: extra volumes and containers, and spec.podTemplatePatch checked on the final pod template.

strategic_merge.apply is compared with the real strategic merge patch (`kubectl patch --local --type=strategic`, apimachinery's
code, no server needed) on the cases the subset covers; the escape hatches' rules are checked, through the plan as
`plan` and the operator check them (postbuild.build_and_check), on what a patch may and may not do
(docs/escape-hatches.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_operator import api, builders, escape_hatches, documents, pipeline, podsecurity, strategic_merge
from vllm_operator.planner import Plan

ROOT = Path(__file__).resolve().parents[2]

POD = {
    "metadata": {"labels": {"app": "x", "team": "a"}, "annotations": {"a": "1"}},
    "spec": {
        "initContainers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}],
        "containers": [{"name": "vllm", "image": "v", "args": ["--x", "1"],
                        "env": [{"name": "A", "value": "1"}, {"name": "Z", "value": "2"}],
                        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
        "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "home", "emptyDir": {}}],
        "tolerations": [{"key": "k", "operator": "Exists"}],
        "nodeSelector": {"n": "1"},
    },
}

#: Patches the subset covers, each applied by strategic_merge and by kubectl.
PATCHES = [
    {"metadata": {"labels": {"extra": "1", "team": None}, "annotations": {"b": "2"}}},
    {"spec": {"containers": [{"name": "vllm", "env": [{"name": "B", "value": "3"}, {"name": "A", "value": "9"}]}]}},
    {"spec": {"containers": [{"name": "vllm", "env": [{"name": "A", "$patch": "delete"}], "args": ["--y"]}]}},
    {"spec": {"containers": [{"name": "vllm", "ports": [{"containerPort": 9000, "name": "m"}],
                              "volumeMounts": [{"name": "x", "mountPath": "/x"}]}]}},
    {"spec": {"initContainers": [{"name": "c", "image": "j"}]}},
    {"spec": {"initContainers": [{"name": "c", "image": "j"}, {"name": "a", "image": "k"}]}},
    {"spec": {"initContainers": [{"name": "b", "image": "k"}, {"name": "c", "image": "j"}]}},
    {"spec": {"initContainers": [{"name": "a", "$patch": "delete"}]}},
    {"spec": {"volumes": [{"name": "w", "secret": {"secretName": "s"}}, {"name": "home", "emptyDir": {"medium": "Memory"}}]}},
    {"spec": {"tolerations": [{"key": "t", "operator": "Exists"}], "nodeSelector": {"n": None, "m": "2"}}},
    {"spec": {"nodeSelector": {"$patch": "replace", "only": "1"}}},
    {"spec": {"volumes": [{"$patch": "replace"}, {"name": "only", "emptyDir": {}}]}},
    {"spec": {"containers": [{"name": "vllm", "resources": {"limits": {"memory": "2Gi"}, "requests": {"cpu": None}}}]}},
]


def test_the_original_is_left_alone_and_unsupported_directives_are_refused():
    before = json.dumps(POD, sort_keys=True)
    strategic_merge.apply(POD, PATCHES[1])
    assert json.dumps(POD, sort_keys=True) == before
    with pytest.raises(strategic_merge.PatchError, match=r"spec.\$retainKeys: .*not supported"):
        strategic_merge.apply(POD, {"spec": {"$retainKeys": ["volumes"]}})
    with pytest.raises(strategic_merge.PatchError, match=r"spec.containers\[0\]: each element needs its merge key 'name'"):
        strategic_merge.apply(POD, {"spec": {"containers": [{"image": "x"}]}})
    with pytest.raises(strategic_merge.PatchError, match="appears twice"):
        strategic_merge.apply(POD, {"spec": {"volumes": [{"name": "w", "emptyDir": {}}, {"name": "w", "emptyDir": {}}]}})
    with pytest.raises(strategic_merge.PatchError, match="not a directive"):
        strategic_merge.apply(POD, {"spec": {"$patch": "explode"}})


def test_a_patch_is_bounded_in_size_and_depth_and_merges_in_linear_time():
    with pytest.raises(strategic_merge.PatchError, match="bytes; at most 65,536"):
        strategic_merge.check_bounds({"metadata": {"annotations": {"a": "x" * 70_000}}}, "p")
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(20):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(strategic_merge.PatchError, match="deeper than 16"):
        strategic_merge.check_bounds(deep, "p")
    # 10 000 list elements on each side, half of them matching: matching each against the others (quadratic) would
    # take 10^8 steps, tens of seconds; linear takes about 0.3 s (bench: 0.7 s for 20 000, 1.9 s for 40 000)
    env = [{"name": f"E{i}", "value": "1"} for i in range(10_000)]
    original = {"spec": {"containers": [{"name": "vllm", "env": env}]}}
    patch = {"spec": {"containers": [{"name": "vllm", "env": [{"name": f"E{i}", "value": "2"}
                                                              for i in range(0, 20_000, 2)]}]}}
    start = time.perf_counter()
    merged = strategic_merge.apply(original, patch)
    assert time.perf_counter() - start < 5.0
    assert len(merged["spec"]["containers"][0]["env"]) == 15_000


# --------------------------------------------------------------------------- the rules
def plan_with(**spec: Any) -> Plan:
    spec.setdefault("model", {"name": "meta-llama/Llama-3.2-3B-Instruct"})
    spec.setdefault("gpu", {"count": 1, "product": "NVIDIA-L4"})
    spec.setdefault("workloadProfile", {"maxContextTokens": 8192})
    return pipeline.plan_server("srv", "ns1", api.VLLMServerSpec.model_validate(spec))


def fields(plan: Plan) -> list[str]:
    return [p.field for p in plan.problems]


SIDECAR = {"name": "proxy", "image": "envoyproxy/envoy:v1.31.0", "ports": [{"containerPort": 9901}],
           "volumeMounts": [{"name": "certs", "mountPath": "/etc/certs", "readOnly": True}]}
VOLUMES = [{"name": "certs", "secret": {"secretName": "ca-bundle"}}, {"name": "scratch", "emptyDir": {}}]


def test_extra_volumes_and_containers_are_built_with_the_operators_security_context():
    plan = plan_with(volumes=VOLUMES, volumeMounts=[{"name": "certs", "mountPath": "/etc/certs"}],
                     initContainers=[{"name": "warm", "image": "busybox:1", "command": ["true"]}],
                     sidecars=[SIDECAR])
    assert plan.fits, plan.problems
    pod = builders.pod_template(plan)["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["warm", "proxy", "download"]
    warm, proxy, _ = pod["initContainers"]
    assert "restartPolicy" not in warm and proxy["restartPolicy"] == "Always"  # a native sidecar
    for c in (warm, proxy):
        assert c["securityContext"] == builders.CONTAINER_SECURITY_CONTEXT
    assert pod["volumes"][-2:] == [{"name": "certs", "secret": {"secretName": "ca-bundle"}},
                                   {"name": "scratch", "emptyDir": {}}]
    assert {"name": "certs", "mountPath": "/etc/certs"} in pod["containers"][0]["volumeMounts"]


@pytest.mark.parametrize("spec, field", [
    ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, "spec.volumeMounts[0].name"),
    ({"volumes": VOLUMES, "volumeMounts": [{"name": "scratch", "mountPath": "/cache/x"}]}, "spec.volumeMounts[0]"),
    ({"volumes": [{"name": "home", "emptyDir": {}}]}, "spec.volumes[0].name"),
    ({"volumes": [{"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}}]}, "spec.volumes[0]"),
    ({"sidecars": [{"name": "vllm", "image": "x"}]}, "spec.sidecars[0].name"),
    ({"initContainers": [{"name": "p", "image": "x"}], "sidecars": [{"name": "p", "image": "x"}]},
     "spec.sidecars[0].name"),
    ({"sidecars": [{"name": "p", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
     "spec.sidecars[0].resources.limits"),
    ({"podTemplatePatch": {"status": {}}}, "spec.podTemplatePatch"),
])
def test_the_typed_fields_are_checked(spec, field):
    assert field in fields(plan_with(**spec))


def test_a_patch_that_adjusts_is_applied_last():
    patch = {"metadata": {"annotations": {"prometheus.io/scrape": "true"}},
             "spec": {"containers": [{"name": "vllm", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
                                      "resources": {"requests": {"cpu": "6"}}}],
                      "initContainers": [{"name": "proxy", "readinessProbe": {"tcpSocket": {"port": 9901}},
                                          "securityContext": {"readOnlyRootFilesystem": True}}],
                      "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]}}}
    plan = plan_with(volumes=VOLUMES, sidecars=[SIDECAR], podTemplatePatch=patch)
    assert plan.fits, plan.problems
    [sts] = [o for o in builders.build_all(plan) if o["kind"] == "StatefulSet"]
    pod = sts["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    vllm = pod["spec"]["containers"][0]
    assert vllm["env"][0] == {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}  # new elements first, as in Kubernetes
    assert vllm["resources"]["requests"]["cpu"] == "6" and vllm["resources"]["requests"]["nvidia.com/gpu"] == "1"
    proxy = pod["spec"]["initContainers"][0]
    assert proxy["readinessProbe"] == {"tcpSocket": {"port": 9901}}
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    assert proxy["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["dnsConfig"] == {"options": [{"name": "ndots", "value": "1"}]}


V = "spec.podTemplatePatch.spec.containers[vllm]"


@pytest.mark.parametrize("patch, field", [
    # what the operator derives
    ({"spec": {"containers": [{"name": "vllm", "args": ["--port", "9"]}]}}, f"{V}.args"),
    ({"spec": {"containers": [{"name": "vllm", "image": "evil:1"}]}}, f"{V}.image"),
    ({"spec": {"containers": [{"name": "vllm", "command": ["sh"]}]}}, f"{V}.command"),
    ({"spec": {"containers": [{"name": "vllm", "startupProbe": {"failureThreshold": 1}}]}}, f"{V}.startupProbe"),
    ({"spec": {"containers": [{"name": "vllm", "$patch": "delete"}]}}, V),
    ({"spec": {"containers": [{"name": "vllm", "env": [{"name": "HF_HOME", "value": "/x"}]}]}}, f"{V}.env[HF_HOME]"),
    ({"spec": {"containers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}},
     f"{V}.resources.limits"),
    ({"metadata": {"labels": {"app.kubernetes.io/instance": "other"}}},
     "spec.podTemplatePatch.metadata.labels[app.kubernetes.io/instance]"),
    ({"spec": {"serviceAccountName": "admin"}}, "spec.podTemplatePatch.spec.serviceAccountName"),
    ({"spec": {"automountServiceAccountToken": True}}, "spec.podTemplatePatch.spec.automountServiceAccountToken"),
    ({"spec": {"terminationGracePeriodSeconds": 1}}, "spec.podTemplatePatch.spec.terminationGracePeriodSeconds"),
    ({"spec": {"volumes": [{"name": "cache", "emptyDir": {"medium": "Memory"}}]}},
     "spec.podTemplatePatch.spec.volumes[cache]"),
    ({"spec": {"initContainers": [{"name": "download", "command": ["true"]}]}},
     "spec.podTemplatePatch.spec.initContainers[download]"),
    # grants the typed fields (and the admission policy) did not see
    ({"spec": {"volumes": [{"name": "x", "secret": {"secretName": "admin-token"}}]}},
     "spec.podTemplatePatch.spec.volumes[x].secret.secretName"),
    ({"spec": {"containers": [{"name": "vllm", "envFrom": [{"secretRef": {"name": "db"}}]}]}},
     f"{V}.envFrom[0].secretRef.name"),
    ({"spec": {"imagePullSecrets": [{"name": "regcred"}]}}, "spec.podTemplatePatch.spec.imagePullSecrets"),
    ({"spec": {"volumes": [{"name": "p", "projected": {"sources": [{"configMap": {"name": "c"}}]}}]}},
     "spec.podTemplatePatch.spec.volumes[p].projected.sources[0].configMap.name"),
    ({"spec": {"containers": [{"name": "miner", "image": "evil:1"}]}},
     "spec.podTemplatePatch.spec.containers[miner].image"),
    # GPUs
    ({"spec": {"initContainers": [{"name": "proxy", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}},
     "spec.podTemplatePatch.spec.initContainers[proxy].env[NVIDIA_VISIBLE_DEVICES]"),
    ({"spec": {"initContainers": [{"name": "proxy", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
     "spec.podTemplatePatch.spec.initContainers[proxy].resources.limits"),
    # Pod Security, on the final template
    ({"spec": {"initContainers": [{"name": "proxy", "securityContext": {"privileged": True}}]}},
     "spec.podTemplatePatch.spec.initContainers[proxy].securityContext.privileged"),
    ({"spec": {"initContainers": [{"name": "proxy", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}},
     "spec.podTemplatePatch.spec.initContainers[proxy].securityContext.capabilities.add"),
    ({"spec": {"containers": [{"name": "vllm", "securityContext": {"allowPrivilegeEscalation": True}}]}},
     f"{V}.securityContext.allowPrivilegeEscalation"),
    ({"spec": {"securityContext": {"runAsUser": 0}}}, f"{V}.securityContext.runAsUser"),
    ({"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}, "spec.podTemplatePatch.spec.volumes[h].hostPath"),
    ({"spec": {"hostPID": True}}, "spec.podTemplatePatch.spec.hostPID"),
    ({"spec": {"containers": [{"name": "vllm", "ports": [{"containerPort": 8000, "hostPort": 80}]}]}}, f"{V}.ports"),
    # what the subset cannot do, and what is no pod template
    ({"spec": {"$setElementOrder/containers": [{"name": "vllm"}]}},
     "spec.podTemplatePatch.spec.$setElementOrder/containers"),
    ({"spec": {"containers": "vllm"}}, "spec.podTemplatePatch.spec.containers"),
    ({"spec": {"containers": [{"name": "vllm", "securityContext": "root"}]}}, f"{V}.securityContext"),
    ({"spec": {"containers": [{"name": "vllm", "env": ["A=1"]}]}}, "spec.podTemplatePatch.spec.containers[0].env[0]"),
    ({"spec": {"containers": [{"name": "vllm", "resources": {"limits": "lots"}}]}}, "spec.podTemplatePatch"),
])
def test_a_patch_beyond_the_rules_is_refused_naming_the_field(patch, field):
    plan = plan_with(volumes=VOLUMES, sidecars=[SIDECAR], podTemplatePatch=patch)
    assert field in fields(plan), plan.problems
    with pytest.raises(ValueError):
        builders.build_all(plan)


def test_a_patch_may_move_what_the_typed_fields_granted():
    """A Secret spec.volumes names (which the admission policy checked) may reach the vLLM container through the
    patch as a projected volume or env; the images of spec.sidecars may run in another container."""
    patch = {"spec": {"volumes": [{"name": "both", "projected": {"sources": [{"secret": {"name": "ca-bundle"}}]}}],
                      "containers": [{"name": "vllm", "env": [{"name": "CA", "valueFrom": {"secretKeyRef": {
                          "name": "ca-bundle", "key": "ca.crt"}}}]}]}}
    plan = plan_with(volumes=VOLUMES, sidecars=[SIDECAR], podTemplatePatch=patch)
    assert plan.fits, plan.problems


def test_host_namespaces_the_spec_asks_for_are_not_refused():
    plan = plan_with(workload="DaemonSet", hostNetwork=True, ipc="Host",
                     podTemplatePatch={"metadata": {"annotations": {"a": "b"}}})
    assert plan.fits, plan.problems


def test_every_example_passes_the_final_template_rules():
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        [doc] = documents.load_documents(path.read_text())
        plan = pipeline.plan_server(doc.server.metadata.name, "ns", doc.server.spec)
        assert plan.fits, (path.name, plan.problems)
        assert escape_hatches.final_template(plan, builders.base_pod_template(plan))[1] == []


# --------------------------------------------------------------------------- gpu.resourceName
def test_a_renamed_gpu_resource_is_requested_instead_of_nvidia_com_gpu():
    """Time-slicing with renameByDefault advertises nvidia.com/gpu.shared on nodes GFD labels NVIDIA-L4-SHARED:
    the pod must request that resource, or it never schedules."""
    plan = plan_with(gpu={"count": 1, "product": "NVIDIA-L4-SHARED", "memory": "12Gi",
                          "resourceName": "nvidia.com/gpu.shared"})
    assert plan.fits, plan.problems
    resources = builders.pod_template(plan)["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu.shared"] == "1" and "nvidia.com/gpu" not in resources["limits"]
    refused = plan_with(gpu={"count": 1, "product": "NVIDIA-L4", "resourceName": "nvidia.com/gpu.shared"},
                        resources={"limits": {"nvidia.com/gpu.shared": "2"}})
    assert "spec.resources" in fields(refused)
    with pytest.raises(ValueError, match="resourceName"):
        api.GPUSpec.model_validate({"resourceName": "amd.com/gpu"})


def test_the_admission_policy_unrolls_as_many_containers_as_the_crd_allows():
    """The policy checks each extra container's env by index, unrolled in the template: as many as maxItems."""
    template = (ROOT / "charts/vllm-operator/templates/admission-policy.yaml").read_text()
    assert f"{{{{- $maxContainers := {api.MAX_EXTRA_CONTAINERS} }}}}" in template


# --------------------------------------------------------------------------- fuzzed patches
_KEYS = ["containers", "initContainers", "volumes", "env", "envFrom", "name", "image", "args", "securityContext",
         "privileged", "capabilities", "add", "resources", "limits", "nvidia.com/gpu", "secret", "secretName",
         "hostPath", "path", "hostPID", "serviceAccountName", "labels", "annotations", "metadata", "spec",
         "valueFrom", "secretKeyRef", "volumeMounts", "mountPath", "ports", "containerPort", "$patch", "vllm",
         "proxy", "download", "cache", "runAsUser", "NVIDIA_VISIBLE_DEVICES"]
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-1, 70000), st.sampled_from(_KEYS + ["delete", "replace"]))
_JSON = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)), max_leaves=30)
_CONTAINER = st.fixed_dictionaries({"name": st.sampled_from(["vllm", "proxy", "download", "new"])},
                                   optional={k: _JSON for k in _KEYS[3:20] if k != "name"})
_POD_SPEC = st.fixed_dictionaries({}, optional={"containers": st.lists(_CONTAINER, max_size=2),
                                                "initContainers": st.lists(_CONTAINER, max_size=2),
                                                **{k: _JSON for k in _KEYS[2:25]}})
_PATCHES = st.fixed_dictionaries({}, optional={"metadata": st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=3),
                                               "spec": _POD_SPEC})
_BASE = {"volumes": VOLUMES, "sidecars": [SIDECAR]}


@settings(max_examples=150, deadline=None, database=None)
@given(_PATCHES)
def test_any_patch_is_refused_naming_a_field_or_builds_a_template_within_the_rules(patch):
    """No patch raises; one that is admitted builds a template that passes Pod Security restricted, keeps the vLLM
    container as derived and names no Secret, ConfigMap, claim or image the typed fields did not."""
    plain = plan_with(**_BASE)
    try:
        spec = api.VLLMServerSpec.model_validate({**plain.spec.model_dump(by_alias=True, exclude_none=True),
                                                  "podTemplatePatch": patch})
    except ValueError:
        return  # not a map: the CRD's schema refuses it first
    plan = pipeline.plan_server("srv", "ns1", spec)
    if not plan.fits:
        assert all(p.field.startswith("spec.podTemplatePatch") for p in plan.problems), plan.problems
        return
    base, final = builders.base_pod_template(plain), builders.pod_template(plan)
    assert podsecurity_ok(final["spec"])
    assert set(escape_hatches.references(final["spec"])) <= set(escape_hatches.references(base["spec"]))
    vllm = {c["name"]: c for c in final["spec"]["containers"]}["vllm"]
    base_vllm = base["spec"]["containers"][0]
    for key in ("image", "args", "ports", "startupProbe", "livenessProbe", "readinessProbe"):
        assert vllm.get(key) == base_vllm.get(key)


def podsecurity_ok(pod_spec: dict) -> bool:
    return podsecurity.beyond_the_spec(pod_spec, host_ipc=False, host_network=False) == []


def test_a_request_above_its_limit_is_refused_by_the_operator_in_every_container():
    """The operator's check, not the CRD's: a CEL rule comparing int-or-string quantities does not fit Kubernetes
    1.30's cost budget (issue 20), so the spec's own resources and each extra container's are compared here."""
    container = {"image": "x", "resources": {"requests": {"memory": "2Gi", "cpu": "500m"},
                                             "limits": {"memory": "1Gi", "cpu": 1}}}
    spec = api.VLLMServerSpec.model_validate({
        "model": {"name": "meta-llama/Llama-3.2-3B-Instruct"}, "gpu": {"count": 1, "product": "NVIDIA-L4"},
        "resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}},
        "sidecars": [{"name": "s", **container}], "initContainers": [{"name": "i", **container}]})
    problems = {p.field: p.message for p in pipeline.plan_server("srv", "ns", spec).problems}
    for field in ("spec.resources.requests.memory", "spec.sidecars[0].resources.requests.memory",
                  "spec.initContainers[0].resources.requests.memory"):
        assert "above the limit" in problems[field], problems
    assert not any(".cpu" in f for f in problems), "500m is below 1"
