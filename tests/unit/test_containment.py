"""Hostile-tenant containment of what reaches the pod (issue 18): the pod template patch is an allowlist, the volume
kinds are the typed ones, no container sees a token, a device or a Secret the typed fields did not name, the offline
Pod Security reading has every baseline rule, and no patch makes the pure functions raise.

Each case here was accepted by main at 6bf2599 (SpecValid=True); the API-server side of the same classes:
tests/apiserver/test_containment_apiserver.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_operator import api, builders, escape_hatches, pipeline, podsecurity
from vllm_operator.planner import Plan

P = "spec.podTemplatePatch.spec"
SIDECAR = {"name": "proxy", "image": "envoyproxy/envoy:v1.31.0"}
VOLUMES = [{"name": "settings", "configMap": {"name": "app-settings"}}]


def plan_with(**spec: Any) -> Plan:
    spec.setdefault("model", {"name": "meta-llama/Llama-3.2-3B-Instruct"})
    spec.setdefault("gpu", {"count": 1, "product": "NVIDIA-L4"})
    spec.setdefault("workloadProfile", {"maxContextTokens": 8192})
    spec.setdefault("volumes", VOLUMES)
    spec.setdefault("sidecars", [SIDECAR])
    return pipeline.plan_server("srv", "ns1", api.VLLMServerSpec.model_validate(spec))


def fields(plan: Plan) -> list[str]:
    return [p.field for p in plan.problems]


def refused(patch: dict[str, Any], field: str, **spec: Any) -> None:
    plan = plan_with(podTemplatePatch=patch, **spec)
    assert field in fields(plan), plan.problems
    with pytest.raises(ValueError):
        builders.build_all(plan)


def projected(source: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"volumes": [{"name": "t", "projected": {"sources": [source]}}],
                     "containers": [{"name": "vllm", "volumeMounts": [{"name": "t", "mountPath": "/t"}]}]}}


@pytest.mark.parametrize("patch, field", [
    # credentials: tokens and certificates of any account of the namespace, despite automountServiceAccountToken
    (projected({"serviceAccountToken": {"path": "token", "audience": "vault"}}),
     f"{P}.volumes[t].projected.sources[0].serviceAccountToken"),
    (projected({"podCertificate": {"signerName": "example.com/s", "keyType": "ED25519", "credentialBundlePath": "c"}}),
     f"{P}.volumes[t].projected.sources[0].podCertificate"),
    (projected({"clusterTrustBundle": {"signerName": "example.com/s", "path": "b"}}),
     f"{P}.volumes[t].projected.sources[0].clusterTrustBundle"),
    # volumes the policy never saw: another team's PersistentVolume, a clone, an inline CSI volume, an image
    ({"spec": {"volumes": [{"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "volumeName": "team-b-data", "resources": {"requests": {"storage": "1Gi"}}}}}}]}},
     f"{P}.volumes[e].ephemeral"),
    ({"spec": {"volumes": [{"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "secret-data"},
        "resources": {"requests": {"storage": "1Gi"}}}}}}]}}, f"{P}.volumes[e].ephemeral"),
    ({"spec": {"volumes": [{"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}}]}}, f"{P}.volumes[c].csi"),
    ({"spec": {"volumes": [{"name": "i", "image": {"reference": "evil:1"}}]}}, f"{P}.volumes[i].image"),
    ({"spec": {"volumes": [{"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}]}}, f"{P}.volumes[n].nfs"),
    # devices: the container toolkit's variables, by env or by envFrom's prefix
    ({"spec": {"initContainers": [{"name": "proxy", "envFrom": [{"prefix": "NVIDIA_",
                                                                 "configMapRef": {"name": "app-settings"}}]}]}},
     f"{P}.initContainers[proxy].envFrom[0].prefix"),
    ({"spec": {"initContainers": [{"name": "proxy", "envFrom": [{"configMapRef": {"name": "app-settings"}}]}]}},
     f"{P}.initContainers[proxy].envFrom[0].prefix"),
    ({"spec": {"initContainers": [{"name": "proxy", "envFrom": [{"prefix": "CUDA_",
                                                                 "configMapRef": {"name": "app-settings"}}]}]}},
     f"{P}.initContainers[proxy].envFrom[0].prefix"),
    ({"spec": {"initContainers": [{"name": "proxy", "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]}]}},
     f"{P}.initContainers[proxy].env[NVIDIA_DRIVER_CAPABILITIES]"),
    # outside the allowlist
    ({"spec": {"ephemeralContainers": [{"name": "debug", "image": "envoyproxy/envoy:v1.31.0"}]}},
     f"{P}.ephemeralContainers"),
    ({"spec": {"schedulerName": "my-scheduler"}}, f"{P}.schedulerName"),
    ({"spec": {"shareProcessNamespace": True}}, f"{P}.shareProcessNamespace"),
    ({"spec": {"os": {"name": "windows"}}}, f"{P}.os"),
    ({"metadata": {"finalizers": ["x"]}}, "spec.podTemplatePatch.metadata.finalizers"),
    ({"spec": {"containers": [{"name": "vllm", "volumeDevices": [{"name": "settings", "devicePath": "/dev/x"}]}]}},
     f"{P}.containers[vllm].volumeDevices"),
    ({"spec": {"containers": [{"name": "vllm", "workingDir": "/tmp"}]}}, f"{P}.containers[vllm].workingDir"),
    ({"spec": {"containers": [{"name": "second", "image": "envoyproxy/envoy:v1.31.0"}]}}, f"{P}.containers[second]"),
    # Pod Security baseline rules the hand-written subset missed
    ({"spec": {"initContainers": [{"name": "proxy", "securityContext": {"seLinuxOptions": {"type": "spc_t"}}}]}},
     f"{P}.initContainers[proxy].securityContext.seLinuxOptions"),
    ({"spec": {"initContainers": [{"name": "proxy", "securityContext": {"procMount": "Unmasked"}}]}},
     f"{P}.initContainers[proxy].securityContext.procMount"),
    ({"spec": {"initContainers": [{"name": "proxy", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}]}},
     f"{P}.initContainers[proxy].securityContext.appArmorProfile"),
    ({"spec": {"initContainers": [{"name": "proxy", "securityContext": {"windowsOptions": {"hostProcess": True}}}]}},
     f"{P}.initContainers[proxy].securityContext.windowsOptions"),
    ({"spec": {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}},
     f"{P}.securityContext.sysctls"),
    ({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"}}},
     "spec.podTemplatePatch.metadata.annotations[container.apparmor.security.beta.kubernetes.io/vllm]"),
    ({"spec": {"initContainers": [{"name": "proxy", "readinessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}]}},
     f"{P}.initContainers[proxy].readinessProbe.httpGet.host"),
])
def test_a_patch_outside_the_allowlist_is_refused_naming_the_field(patch, field):
    refused(patch, field)


def test_apparmor_unconfined_through_the_typed_pod_annotations_is_refused():
    plan = plan_with(podAnnotations={"container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"})
    assert "spec.podAnnotations[container.apparmor.security.beta.kubernetes.io/vllm]" in fields(plan), plan.problems


def test_other_nvidia_device_resources_beside_gpu_count_are_refused():
    plan = plan_with(resources={"limits": {"nvidia.com/gpu.shared": "8"}})
    assert "spec.resources" in fields(plan), plan.problems
    plan = plan_with(engine={"env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]})
    assert "spec.engine.env[0]" in fields(plan), plan.problems


def test_what_the_allowlist_offers_is_admitted():
    patch = {"metadata": {"labels": {"team": "a"}, "annotations": {"prometheus.io/scrape": "true",
                                                                   "container.apparmor.security.beta.kubernetes.io/vllm":
                                                                       "runtime/default"}},
             "spec": {"tolerations": [{"key": "t", "operator": "Exists"}], "nodeSelector": {"zone": "a"},
                      "affinity": {"nodeAffinity": {}}, "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]},
                      "securityContext": {"fsGroup": 2000, "supplementalGroups": [3000]},
                      "volumes": [{"name": "d", "downwardAPI": {"items": [{"path": "l", "fieldRef": {
                          "fieldPath": "metadata.labels"}}]}}],
                      "containers": [{"name": "vllm", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
                                      "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "app-settings"}}],
                                      "resources": {"requests": {"cpu": "6"}},
                                      "volumeMounts": [{"name": "d", "mountPath": "/etc/podinfo"}],
                                      "securityContext": {"readOnlyRootFilesystem": True}}],
                      "initContainers": [{"name": "proxy", "args": ["--x"], "readinessProbe": {
                          "tcpSocket": {"port": 9901}}, "resources": {"limits": {"memory": "1Gi"}}}]}}
    plan = plan_with(podTemplatePatch=patch)
    assert plan.fits, plan.problems


def test_every_name_a_container_can_see_is_found_by_the_walk():
    pod = {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"audience": "a", "path": "t"}},
                                                               {"podCertificate": {"signerName": "s"}}]}},
                       {"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {"volumeName": "pv-b"}}}},
                       {"name": "c", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi-secret"}}}],
           "containers": [{"name": "x", "envFrom": [{"prefix": "P_", "secretRef": {"name": "s1"}}],
                           "resources": {"claims": [{"name": "gpu-claim"}]}}]}
    kinds = {kind for kind, _ in escape_hatches.references(pod)}
    assert {"ServiceAccountToken", "PodCertificate", "PersistentVolume", "csi volume", "Secret",
            "ResourceClaim"} <= kinds
    assert ("Secret", "csi-secret") in escape_hatches.references(pod)
    assert ("Secret", "s1") in escape_hatches.references(pod)


@pytest.mark.parametrize("spec, what", [
    ({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}, "sysctl"),
    ({"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]}}, None),
    ({"containers": [{"name": "c", "securityContext": {"seLinuxOptions": {"type": "spc_t"}}}]}, "seLinuxOptions"),
    ({"containers": [{"name": "c", "securityContext": {"seLinuxOptions": {"type": "container_t"}}}]}, None),
    ({"containers": [{"name": "c", "securityContext": {"procMount": "Unmasked"}}]}, "procMount"),
    ({"containers": [{"name": "c", "securityContext": {"procMount": "Unmasked"}}], "hostUsers": False}, None),
    ({"containers": [{"name": "c", "securityContext": {"windowsOptions": {"hostProcess": True}}}]}, "hostProcess"),
    ({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}, "seccompProfile Unconfined"),
    ({"ephemeralContainers": [{"name": "e", "securityContext": {"privileged": True}}]}, "privileged"),
    ({"containers": [{"name": "c", "lifecycle": {"preStop": {"httpGet": {"host": "h", "port": 1}}}}]}, "httpGet.host"),
    ({"containers": "not a list", "volumes": [None, 3]}, None),
])
def test_the_offline_reading_has_every_baseline_rule(spec, what):
    found = podsecurity.violations(spec, "baseline")
    assert (what is None and not found) or any(what in v.what for v in found), found
    assert podsecurity.violations(spec, "baseline", {podsecurity.APPARMOR_ANNOTATION + "c": "unconfined"})


# --------------------------------------------------------------------------- never raises
_ANY = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=8)
_NAMED = st.fixed_dictionaries({"name": st.one_of(_ANY, st.sampled_from(["vllm", "proxy", "cache"]))},
                               optional={"image": _ANY, "env": st.lists(st.fixed_dictionaries({"name": _ANY}),
                                                                        max_size=2), "mountPath": _ANY})
_LISTS = ["containers", "initContainers", "volumes", "imagePullSecrets", "ephemeralContainers", "tolerations"]


@settings(max_examples=200, deadline=None, database=None)
@given(st.dictionaries(st.sampled_from(_LISTS), st.lists(_NAMED, max_size=2), max_size=3), _ANY)
def test_no_patch_makes_the_plan_raise(pod_spec, metadata):
    """A non-string merge key (`containers: [{name: {x: 1}}]`), a list where a map belongs, anything: a problem
    naming a field under spec.podTemplatePatch, never an exception (the reconciler would retry it forever)."""
    patch = {"spec": pod_spec, "metadata": metadata}
    plan = plan_with(podTemplatePatch=patch)
    assert plan.fits or all(p.field.startswith("spec.podTemplatePatch") for p in plan.problems), plan.problems


def test_a_non_string_merge_key_is_a_problem():
    plan = plan_with(podTemplatePatch={"spec": {"containers": [{"name": {"x": 1}}]}})
    assert fields(plan) == ["spec.podTemplatePatch.spec.containers[0].name"], plan.problems


# --------------------------------------------------------------------------- flags that read a file
def test_the_flags_that_read_a_file_come_from_every_releases_snapshot():
    from vllm_operator import validation, vllm_flags

    found = set()
    for release in vllm_flags.releases():
        found |= {f for f in vllm_flags.snapshot(release).flags if validation.reads_a_file(f)}
    assert {"--config", "--log-config-file", "--ssl-keyfile", "--tool-parser-plugin", "--generation-config",
            "--allowed-local-media-path", "--hf-config-path"} <= found
    assert not found & {"--root-path", "--io-processor-plugin", "--model-loader-extra-config", "--tokenizer"}


@pytest.mark.parametrize("extra", [["--config", "/etc/app/flags.yaml"], ["--config=/etc/app/flags.yaml"],
                                   ["--log-config-file", "/x.json"], ["--tool-parser-plugin", "/x.py"],
                                   ["--generation-config", "/models/x"]])
@pytest.mark.parametrize("image", ["vllm/vllm-openai:v0.32.0", "vllm/vllm-openai:v0.99.0", "vllm/vllm-openai:latest"])
def test_extra_args_may_not_read_a_file(extra, image):
    """--config splices a file's flags in, past the flag check (--chat-template, --port, ...); with a release the
    operator has no snapshot of (checked loosely) too."""
    plan = plan_with(image=image, engine={"extraArgs": extra})
    assert "spec.engine.extraArgs[0]" in fields(plan), plan.problems
    assert any("reads a file" in p.message for p in plan.problems)


def test_the_problems_of_a_patch_are_few_clean_lines():
    """The patch's keys are the tenant's and become field paths in SpecValid, its Event and `kubectl describe`:
    newlines, ANSI escapes and bidi overrides never reach them, and a patch of many unknown keys is a dozen
    problems, not hundreds."""
    plan = plan_with(podTemplatePatch={"spec": {"\x1b[31mred\nline\u202e": 1,
                                                **{f"unknown{i}": i for i in range(300)}}})
    assert not plan.fits and len(plan.problems) <= escape_hatches.MAX_PROBLEMS + 1
    for p in plan.problems:
        assert not any(ch in p.field + p.message for ch in "\x1b\n\u202e"), p
        assert len(p.field) <= escape_hatches.MAX_FIELD_CHARS and len(p.message) <= escape_hatches.MAX_MESSAGE_CHARS
    assert plan.problems[0].field == "spec.podTemplatePatch.spec.?[31mred?line?"


def test_the_walk_of_the_typed_fields_finds_exactly_what_the_admission_policy_checks():
    """Every name the typed fields put in the pod is one the chart's policy checks the requester may get (its `refs`
    variable and the cache claim's validation); the patch may add none (above). A typed field that granted a name the
    policy does not check would show here as an extra name."""
    from pathlib import Path

    plan = plan_with(hfTokenSecretRef={"name": "hf", "key": "t"},
                     engine={"env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "engine-s", "key": "k"}}}]},
                     cache={"claimName": "models"},
                     volumes=[{"name": "a", "secret": {"secretName": "vol-s"}},
                              {"name": "b", "configMap": {"name": "vol-c"}},
                              {"name": "c", "persistentVolumeClaim": {"claimName": "vol-p"}}],
                     initContainers=[{"name": "i", "image": "x", "env": [
                         {"name": "K", "valueFrom": {"secretKeyRef": {"name": "init-s", "key": "k"}}}]}],
                     sidecars=[{"name": "s", "image": "x", "env": [
                         {"name": "K", "valueFrom": {"secretKeyRef": {"name": "side-s", "key": "k"}}}]}])
    assert plan.fits, plan.problems
    found = set(escape_hatches.references(builders.base_pod_template(plan)["spec"]))
    assert found == {("Secret", "hf"), ("Secret", "engine-s"), ("PersistentVolumeClaim", "models"),
                     ("Secret", "vol-s"), ("ConfigMap", "vol-c"), ("PersistentVolumeClaim", "vol-p"),
                     ("Secret", "init-s"), ("Secret", "side-s")}
    policy = (Path(__file__).resolve().parents[2] / "charts/vllm-operator/templates/admission-policy.yaml").read_text()
    for field in ("spec.hfTokenSecretRef.name", "spec.engine.env[", "spec.volumes[", ".secret.secretName",
                  ".configMap.name", ".persistentVolumeClaim.claimName", "spec.cache.claimName", "initContainers",
                  "sidecars", "podTemplatePatch.metadata.labels"):
        assert field in policy, field
