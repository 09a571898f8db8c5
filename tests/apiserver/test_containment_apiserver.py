"""What reaches the pod, on the real kube-apiserver (issue 18): a tenant with only create/update on vllmservers
(impersonated, `kubectl --as`), the chart's admission policy installed, the reconciler in-process.

Each attack below is admitted by the API server and the policy (they cannot see into a free-form patch), and
main at 6bf2599 applied a StatefulSet for it (SpecValid=True): a projected ServiceAccount token, an ephemeral claim
of another team's PersistentVolume, an inline CSI volume, NVIDIA_VISIBLE_DEVICES through envFrom's prefix, a non-string merge key (a TypeError out of the reconcile). Now each is
SpecValid=False naming the field, and nothing is applied. Other NVIDIA device resources beside gpu.count
(nvidia.com/gpu.shared) and NVIDIA_* variables in the typed fields are refused by the CRD itself.

Pod Security: the API server's own admission decides, by a dry run of the first pod (controller/pod_admission.py);
the offline reading (podsecurity.py, the CLI's `plan`) agrees with it on every baseline rule tested here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.apiserver.test_admission_policy import TENANT, TENANT_GROUP, Policy, Tenant
from vllm_operator import api, builders, pipeline, podsecurity
from vllm_operator.controller.pod_admission import PodAdmission
from vllm_operator.controller.reconcile import Reconciler
from vllm_operator.kube.client import Kube

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"
EXAMPLE = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
SIDECAR = {"name": "proxy", "image": "envoyproxy/envoy:v1.31.0"}


def server(name: str, **spec) -> dict:
    doc = copy.deepcopy(EXAMPLE)
    doc["metadata"] = {"name": name}
    doc["spec"].pop("cache")
    doc["spec"].pop("hfTokenSecretRef")
    doc["spec"]["volumes"] = [{"name": "settings", "configMap": {"name": "app-settings"}}]
    doc["spec"]["sidecars"] = [SIDECAR]
    doc["spec"].update(spec)
    return doc


def patched(name: str, patch: dict) -> dict:
    return server(name, podTemplatePatch=patch)


def projected(source: dict) -> dict:
    return {"spec": {"volumes": [{"name": "t", "projected": {"sources": [source]}}],
                     "containers": [{"name": "vllm", "volumeMounts": [{"name": "t", "mountPath": "/var/run/t"}]}]}}


#: (name, the tenant's VLLMServer, the field SpecValid names)
ATTACKS = [
    ("sa-token", patched("sa-token", projected({"serviceAccountToken": {"path": "token", "audience": "api"}})),
     "spec.podTemplatePatch.spec.volumes[t].projected.sources[0].serviceAccountToken"),
    ("other-pv", patched("other-pv", {"spec": {"volumes": [{"name": "e", "ephemeral": {"volumeClaimTemplate": {
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "team-b-data",
                 "resources": {"requests": {"storage": "1Gi"}}}}}}]}}),
     "spec.podTemplatePatch.spec.volumes[e].ephemeral"),
    ("csi", patched("csi", {"spec": {"volumes": [{"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}}]}}),
     "spec.podTemplatePatch.spec.volumes[c].csi"),
    ("nvidia-prefix", patched("nvidia-prefix", {"spec": {"initContainers": [{"name": "proxy", "envFrom": [
        {"prefix": "NVIDIA_", "configMapRef": {"name": "app-settings"}}]}]}}),
     "spec.podTemplatePatch.spec.initContainers[proxy].envFrom[0].prefix"),
    ("merge-key", patched("merge-key", {"spec": {"containers": [{"name": {"x": 1}}]}}),
     "spec.podTemplatePatch.spec.containers[0].name"),
    ("selinux", patched("selinux", {"spec": {"initContainers": [{"name": "proxy", "securityContext": {
        "seLinuxOptions": {"type": "spc_t"}}}]}}),
     "spec.podTemplatePatch.spec.initContainers[proxy].securityContext.seLinuxOptions"),
    ("apparmor", server("apparmor", podAnnotations={
        "container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"}),
     "spec.podAnnotations[container.apparmor.security.beta.kubernetes.io/vllm]"),
]


@pytest.fixture
def tenant(control_plane, namespace, crd_installed):
    policy = Policy(control_plane, namespace).install()
    who = Tenant(control_plane, namespace)
    who.grant("pods", "create")
    who.grant("configmaps", "get", name="app-settings")
    control_plane.kubectl("create", "configmap", "app-settings", "-n", namespace,
                          "--from-literal=VISIBLE_DEVICES=all")
    yield who
    policy.remove()


def get_server(kube: Kube, ns: str, name: str) -> dict:
    return kube.request("GET", f"{GROUP_PATH}/namespaces/{ns}/vllmservers/{name}")


def spec_valid(obj: dict) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "SpecValid"), {})


def create_as_tenant(cp, namespace: str, doc: dict) -> None:
    p = cp.kubectl("create", "-n", namespace, f"--as={TENANT}", f"--as-group={TENANT_GROUP}", "-f", "-",
                   input=json.dumps(doc), check=False)
    assert p.returncode == 0, p.stderr  # the API server and the policy admit it: the operator is the last line


def test_each_attack_is_refused_naming_the_field_and_nothing_is_applied(control_plane, kube, namespace, tenant):
    assert not tenant.can_i("get", "secrets") and not tenant.can_i("get", "persistentvolumes")
    reconciler = Reconciler(kube, pod_admission=PodAdmission())
    for name, doc, field in ATTACKS:
        create_as_tenant(control_plane, namespace, doc)
        reconciler.reconcile(namespace, name)  # never raises (the merge key was a TypeError, retried forever)
        cond = spec_valid(get_server(kube, namespace, name))
        assert cond.get("status") == "False" and field in cond.get("message", ""), (name, cond)
        assert "\n" not in cond["message"] and "\x1b" not in cond["message"]
        assert kube.get("apps/v1", "StatefulSet", namespace, name) is None, name
    # ... while the same server without the attack is applied
    create_as_tenant(control_plane, namespace, server("plain"))
    reconciler.reconcile(namespace, "plain")
    assert spec_valid(get_server(kube, namespace, "plain")).get("status") == "True"
    assert kube.get("apps/v1", "StatefulSet", namespace, "plain") is not None


def test_the_api_servers_pod_security_decides_where_the_namespace_cannot_be_read(control_plane, kube, namespace,
                                                                                 crd_installed):
    """Roles-only mode: the operator may not read the namespace's label, so the offline reading has no level; the
    dry run asks the API server's own Pod Security admission, and its words reach the condition. On main the
    StatefulSet was applied and its pods refused (FailedCreate) with SpecValid=True."""
    control_plane.kubectl("label", "namespace", namespace, f"{podsecurity.ENFORCE_LABEL}=baseline", "--overwrite")
    reconciler = Reconciler(kube, pod_admission=PodAdmission())
    reconciler.namespace_labels = lambda ns: None  # type: ignore[method-assign]  # as without get on namespaces
    doc = server("host-ipc", ipc="Host")
    doc["metadata"]["namespace"] = namespace
    control_plane.kubectl("create", "-f", "-", input=json.dumps(doc))
    reconciler.reconcile(namespace, "host-ipc")
    cond = spec_valid(get_server(kube, namespace, "host-ipc"))
    assert cond.get("status") == "False" and cond.get("reason") == "PodSecurityForbidden", cond
    assert "violates PodSecurity" in cond["message"] and "hostIPC" in cond["message"], cond
    assert kube.get("apps/v1", "StatefulSet", namespace, "host-ipc") is None
    assert kube.list("v1", "Pod", namespace) == []  # a dry run stores nothing


def base_workload(namespace: str) -> dict:
    doc = server("psa")
    plan = pipeline.plan_server("psa", namespace, api.VLLMServerSpec.model_validate(doc["spec"]))
    assert plan.fits, plan.problems
    [sts] = [o for o in builders.build_all(plan) if o["kind"] == "StatefulSet"]
    sts["metadata"]["namespace"] = namespace
    return sts


def container_sc(**fields):
    return lambda t: t["spec"]["initContainers"][0]["securityContext"].update(fields)


#: Each baseline rule the hand-written subset missed, broken one at a time on a pod that passes.
BREAKS = {
    "apparmor-annotation": lambda t: t["metadata"].setdefault("annotations", {}).update(
        {"container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"}),
    "apparmor-field": container_sc(appArmorProfile={"type": "Unconfined"}),
    "selinux": container_sc(seLinuxOptions={"type": "spc_t"}),
    "procmount-userns": lambda t: (t["spec"].update(hostUsers=False),
                            container_sc(procMount="Unmasked")(t)),
    "sysctl": lambda t: t["spec"]["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "65536"}]),
    "seccomp-unconfined": container_sc(seccompProfile={"type": "Unconfined"}),
    "probe-host": lambda t: t["spec"]["initContainers"][0].update(
        readinessProbe={"httpGet": {"host": "10.0.0.1", "port": 80}}),
}


#: Breaks the API server admits at baseline (not at restricted): Unmasked /proc in a user namespace of the pod's
#: own (1.33+).
ADMITTED = {"procmount-userns"}

#: Rules of the newest Pod Security standards that the oldest claimed Kubernetes (1.30) does not check yet: host in
#: probes, and Unmasked /proc in a user namespace at restricted. The offline reading keeps the newest standards (it
#: is stricter there, never looser); on an API server older than the minor named, the case is not compared.
NEWER_THAN = {("probe-host", "baseline"): 34, ("probe-host", "restricted"): 34, ("procmount-userns", "restricted"): 33}


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_the_offline_reading_agrees_with_the_api_servers_pod_security(control_plane, kube, namespace, level):
    control_plane.kubectl("label", "namespace", namespace, f"{podsecurity.ENFORCE_LABEL}={level}", "--overwrite")
    admission = PodAdmission()
    workload = base_workload(namespace)
    template = workload["spec"]["template"]
    assert admission.refusal(kube, workload) is None
    assert podsecurity.violations(template["spec"], level, template["metadata"].get("annotations")) == []
    minor = int("".join(c for c in client.VersionApi(kube.api).get_code().minor if c.isdigit()))
    for what, breaking in BREAKS.items():
        if minor < NEWER_THAN.get((what, level), 0):
            continue
        broken = copy.deepcopy(workload)
        breaking(broken["spec"]["template"])
        t = broken["spec"]["template"]
        why = PodAdmission().refusal(kube, broken)
        offline = podsecurity.violations(t["spec"], level, t["metadata"].get("annotations"))
        assert bool(why) == bool(offline), (what, why, offline)  # the two readings agree
        assert (why is None) == (what in ADMITTED and level == "baseline"), (what, why)
        assert why is None or "violates PodSecurity" in why, why


def test_the_crd_refuses_device_resources_and_variables_in_the_typed_fields(control_plane, namespace, crd_installed):
    """nvidia.com/gpu.shared beside gpu.count and NVIDIA_* variables: the API server refuses them before the operator
    sees them (the operator refuses them too, for the CLI and objects admitted before)."""
    for name, spec, words in (
            ("shared", {"resources": {"limits": {"nvidia.com/gpu.shared": "8"}}}, "nvidia.com/ device resources"),
            ("sidecar", {"sidecars": [{"name": "p", "image": "x", "resources": {"requests": {"nvidia.com/mig-1g.10gb":
                                                                                              "1"}}}]},
             "nvidia.com/ device resources"),
            ("toolkit", {"engine": {"env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]}}, "NVIDIA_*")):
        doc = server(name, **spec)
        p = control_plane.kubectl("create", "-n", namespace, "--dry-run=server", "-f", "-", input=json.dumps(doc),
                                  check=False)
        assert p.returncode != 0 and words in p.stderr, (name, p.stderr)
