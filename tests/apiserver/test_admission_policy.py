"""The chart's ValidatingAdmissionPolicy on the real kube-apiserver: no confused deputy.

The operator creates a VLLMServer's pods under its own ServiceAccount, so the policy admits a VLLMServer only
when its requester may themselves get the Secrets it names, get its ServiceAccount and claim, and create pods
in the namespace; and it applies the chart's settings (host IPC and network, images, ServiceAccounts,
PriorityClasses, claims, pod label keys).

The CRD and the policy objects are rendered from the chart by Helm's own code (generate.render_chart), the
binding in namespaced mode so that it only covers the test's namespace. The tenant is an impersonated user
(`kubectl --as`) whose RBAC is a Role in that namespace. Every refusal below is the policy's own: no operator
runs, and the CRD admits each spec (the admin's requests, and the same spec by a user granted what it needs).
"""

from __future__ import annotations

import copy
import json
import secrets as random
from pathlib import Path

import pytest
import yaml

from e2e.testbed.convergence import wait_established
from e2e.testbed.controlplane import wait_for
from vllm_operator import generate

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
TENANT = "tenant-user"
TENANT_GROUP = "tenants"
#: Kinds the chart renders for the policy.
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def server(name: str = "llama", **spec) -> dict:
    """The example with top-level spec fields replaced; no cache (a claim per replica needs no permission)
    and no hfTokenSecretRef unless given."""
    doc = copy.deepcopy(EXAMPLE)
    doc["metadata"] = {"name": name}
    doc["spec"].pop("cache")
    doc["spec"].pop("hfTokenSecretRef")
    doc["spec"].update(spec)
    return doc


def secret_env(*names: str) -> dict:
    return {"env": [{"name": f"KEY_{i}", "valueFrom": {"secretKeyRef": {"name": n, "key": "k"}}}
                    for i, n in enumerate(names)]}


class Policy:
    """The chart's policy objects for one namespace, applied and removed by the admin."""

    def __init__(self, cp, namespace: str):
        self.cp, self.namespace = cp, namespace
        self.release = f"vap-{random.token_hex(3)}"
        self.objects: list[dict] = []
        [crd] = [d for d in self.render({}, include_crds=True) if d["kind"] == "CustomResourceDefinition"
                 and d["metadata"]["name"] == "vllmservers.vllm-operator.io"]
        cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd))
        wait_established(cp, "vllmservers.vllm-operator.io")

    def render(self, settings: dict, **kwargs) -> list[dict]:
        values = {"operator": {"watchNamespaces": [self.namespace]}, "admissionPolicy": settings}
        return generate.render_chart(ROOT / generate.CHART, values, release=self.release, namespace="vllm-operator",
                                      **kwargs)

    def install(self, settings: dict | None = None) -> "Policy":
        self.remove()
        docs = self.render(settings or {})
        self.objects = [d for d in docs if d["kind"] in POLICY_KINDS]
        assert [d["kind"] for d in self.objects] == list(POLICY_KINDS)
        self.cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                               "items": self.objects}))
        return self

    def remove(self) -> None:
        for obj in self.objects:
            self.cp.kubectl("delete", obj["kind"].lower() + ".admissionregistration.k8s.io", obj["metadata"]["name"],
                            "--ignore-not-found")
        self.objects = []


@pytest.fixture
def policy(control_plane, namespace):
    p = Policy(control_plane, namespace)
    yield p
    p.remove()


class Tenant:
    """An impersonated user with a Role in the namespace: VLLMServers, and what a test grants on top."""

    def __init__(self, cp, namespace: str, user: str = TENANT):
        self.cp, self.namespace, self.user = cp, namespace, user
        self.grant("vllmservers", "create,get,list,update,patch", group="vllm-operator.io")

    def grant(self, resource: str, verbs: str, *, name: str | None = None, group: str = "") -> None:
        role = f"{self.user}-{resource}-{name or 'all'}".replace(".", "-")[:63]
        args = ["create", "role", role, f"--verb={verbs}", f"--resource={resource}{'.' + group if group else ''}",
                "-n", self.namespace]
        self.cp.kubectl(*args, *([f"--resource-name={name}"] if name else []))
        self.cp.kubectl("create", "rolebinding", role, f"--role={role}", f"--user={self.user}", "-n", self.namespace)
        kind = f"{resource}.{group}" if group else resource
        wait_for(lambda: self.can_i(verbs.split(",")[0], kind + (f"/{name}" if name else "")), 30,
                 f"{self.user} may {verbs} {resource}")

    def can_i(self, verb: str, what: str) -> bool:
        return self.cp.kubectl("auth", "can-i", verb, what, "-n", self.namespace, f"--as={self.user}",
                               f"--as-group={TENANT_GROUP}", check=False).stdout.strip() == "yes"

    def create(self, doc: dict, *, dry_run: bool = True):
        """`kubectl create` as the tenant; a server-side dry run unless told (the whole admission chain runs)."""
        return self.cp.kubectl("create", "-n", self.namespace, f"--as={self.user}", f"--as-group={TENANT_GROUP}",
                               *(["--dry-run=server"] if dry_run else []), "-f", "-", input=json.dumps(doc),
                               check=False)

    def patch(self, name: str, patch: dict):
        return self.cp.kubectl("patch", "vllmservers", name, "-n", self.namespace, "--type=merge", "-p",
                               json.dumps(patch), f"--as={self.user}", f"--as-group={TENANT_GROUP}", check=False)


def admin_create(cp, namespace: str, doc: dict, *, dry_run: bool = True):
    return cp.kubectl("create", "-n", namespace, *(["--dry-run=server"] if dry_run else []), "-f", "-",
                      input=json.dumps(doc), check=False)


def refused(create, doc: dict, *words: str, timeout: float = 30) -> str:
    """The policy's refusal of `doc`, naming `words`. A new or changed policy takes a moment to be enforced
    (the API server's policy informer): poll for it, never sleep."""
    last = []

    def attempt():
        p = create(doc)
        last[:] = [p.stderr or "admitted"]
        return p.returncode != 0 and "ValidatingAdmissionPolicy" in p.stderr and all(w in p.stderr for w in words)

    try:
        wait_for(attempt, timeout, "the refusal")
    except TimeoutError:
        pytest.fail(f"not refused naming {words} within {timeout}s: {last[0]}")
    return last[0]


def admitted(create, doc: dict, timeout: float = 30) -> None:
    """Admitted; polled like a refusal, for a policy just relaxed or a grant just made."""
    last = []

    def attempt():
        p = create(doc)
        last[:] = [p.stderr]
        return p.returncode == 0

    try:
        wait_for(attempt, timeout, "admission")
    except TimeoutError:
        pytest.fail(f"not admitted within {timeout}s: {last[0]}")


@pytest.fixture
def tenant(control_plane, namespace, policy):
    t = Tenant(control_plane, namespace)
    t.grant("pods", "create")
    return t


# --------------------------------------------------------------------------- what the requester may do
def test_a_secret_the_tenant_cannot_read_is_refused_and_one_they_can_is_admitted(control_plane, namespace, policy,
                                                                                 tenant):
    cp = control_plane
    policy.install()
    doc = server(hfTokenSecretRef={"name": "hf-token", "key": "token"})
    admitted(lambda d: admin_create(cp, namespace, d), doc)  # the CRD takes it: what follows is the policy
    refused(tenant.create, doc, "spec.hfTokenSecretRef.name:", f"{TENANT} may not get Secret hf-token",
            f"in namespace {namespace}", "grant get on secrets/hf-token")

    env = server("env", engine=secret_env("api-key"))
    refused(tenant.create, env, "spec.engine.env[KEY_0].valueFrom.secretKeyRef.name:",
            f"{TENANT} may not get Secret api-key")

    # a user who may read the Secret is admitted with the same spec; the tenant too once granted it
    reader = Tenant(cp, namespace, "secret-reader")
    reader.grant("pods", "create")
    reader.grant("secrets", "get", name="hf-token")
    admitted(reader.create, doc)
    tenant.grant("secrets", "get", name="hf-token")
    admitted(tenant.create, doc)
    # get on one Secret is not get on another
    both = server("both", hfTokenSecretRef={"name": "hf-token"}, engine=secret_env("hf-token", "api-key"))
    refused(tenant.create, both, "spec.engine.env[KEY_1].valueFrom.secretKeyRef.name:", "Secret api-key")
    tenant.grant("secrets", "get", name="api-key")
    admitted(tenant.create, both)


def test_sixteen_secret_references_fit_the_cel_budget_and_seventeen_are_refused(control_plane, namespace, policy,
                                                                                tenant):
    """Each authorization check costs 350000 of CEL's 10000000 per policy evaluation: 16 references plus the
    pods, ServiceAccount and claim checks fit, and more are refused with a message rather than a budget error."""
    policy.install()
    tenant.grant("secrets", "get")
    names = [f"s{i}" for i in range(16)]
    sixteen = server(hfTokenSecretRef={"name": "hf-token"}, engine=secret_env(*names[:15]),
                     serviceAccountName="default", cache={"claimName": "models"})
    tenant.grant("serviceaccounts", "get")
    tenant.grant("persistentvolumeclaims", "get")
    refused(tenant.create, server(engine=secret_env(*names, "s16")), "at most 16 Secret, ConfigMap and claim references",
            "17 given")
    # the escape hatches' references count against the same budget: 15 env Secrets and a volume's ConfigMap ...
    tenant.grant("configmaps", "get")
    volume = [{"name": "config", "configMap": {"name": "c"}}]
    admitted(tenant.create, server(engine=secret_env(*names[:15]), volumes=volume))
    # ... and a sidecar's Secret is the 17th
    sidecar = [{"name": "proxy", "image": "envoy:1", "env": secret_env("s16")["env"]}]
    refused(tenant.create, server(engine=secret_env(*names[:15]), volumes=volume, sidecars=sidecar), "17 given")
    admitted(tenant.create, sixteen)


def test_a_serviceaccount_needs_get_on_it(control_plane, namespace, policy, tenant):
    policy.install()
    control_plane.kubectl("create", "serviceaccount", "cloud-identity", "-n", namespace)
    doc = server(serviceAccountName="cloud-identity")
    refused(tenant.create, doc, "spec.serviceAccountName:", f"{TENANT} may not get ServiceAccount cloud-identity",
            "the pods would run as it")
    tenant.grant("serviceaccounts", "get", name="cloud-identity")
    admitted(tenant.create, doc)
    refused(tenant.create, server(serviceAccountName="other"), "ServiceAccount other")


def test_a_claim_needs_get_on_it(control_plane, namespace, policy, tenant):
    policy.install()
    doc = server(cache={"claimName": "models"})
    refused(tenant.create, doc, "spec.cache.claimName:", f"{TENANT} may not get PersistentVolumeClaim models")
    tenant.grant("persistentvolumeclaims", "get", name="models")
    admitted(tenant.create, doc)
    # a new claim per replica (cache.size) names no existing claim
    admitted(tenant.create, server("sized", cache={"size": "50Gi"}))


def test_the_escape_hatches_references_need_get_on_each(control_plane, namespace, policy, tenant):
    """spec.volumes (Secret, ConfigMap, claim) and the env of spec.initContainers and spec.sidecars name things the
    pods would read: each needs get, as hfTokenSecretRef does. (The pod template patch may not name any: the
    operator refuses a final template with a reference the typed fields did not make, escape_hatches.py.)"""
    policy.install()
    doc = server(volumes=[{"name": "ca", "secret": {"secretName": "ca-bundle"}},
                          {"name": "config", "configMap": {"name": "proxy-config"}},
                          {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
                 initContainers=[{"name": "warm", "image": "busybox:1",
                                  "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "warm-token",
                                                                                       "key": "t"}}}]}],
                 sidecars=[{"name": "proxy", "image": "envoy:1",
                            "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "proxy-key", "key": "k"}}}]}])
    admitted(lambda d: admin_create(control_plane, namespace, d), doc)
    refused(tenant.create, doc, "spec.volumes[ca].secret.secretName:", f"{TENANT} may not get Secret ca-bundle",
            "grant get on secrets/ca-bundle")
    tenant.grant("secrets", "get", name="ca-bundle")
    refused(tenant.create, doc, "spec.volumes[config].configMap.name:", "may not get ConfigMap proxy-config",
            "grant get on configmaps/proxy-config")
    tenant.grant("configmaps", "get", name="proxy-config")
    refused(tenant.create, doc, "spec.volumes[data].persistentVolumeClaim.claimName:",
            "may not get PersistentVolumeClaim datasets")
    tenant.grant("persistentvolumeclaims", "get", name="datasets")
    refused(tenant.create, doc, "spec.initContainers[warm].env[T].valueFrom.secretKeyRef.name:", "Secret warm-token")
    tenant.grant("secrets", "get", name="warm-token")
    refused(tenant.create, doc, "spec.sidecars[proxy].env[K].valueFrom.secretKeyRef.name:", "Secret proxy-key")
    tenant.grant("secrets", "get", name="proxy-key")
    admitted(tenant.create, doc)


def test_the_requester_must_be_allowed_to_create_pods(control_plane, namespace, policy):
    policy.install()
    tenant = Tenant(control_plane, namespace)  # VLLMServers only
    refused(tenant.create, server(), "spec:", f"{TENANT} may not create pods in namespace {namespace}")
    tenant.grant("pods", "create")
    admitted(tenant.create, server())

    # requirePodCreate: false leaves it to the other checks
    other = Tenant(control_plane, namespace, "no-pods")
    policy.install({"requirePodCreate": False})
    refused(other.create, server(hfTokenSecretRef={"name": "hf-token"}), "may not get Secret hf-token")
    admitted(other.create, server())


def test_an_update_is_checked_when_it_changes_the_spec(control_plane, namespace, policy):
    """The server an admin made with a Secret: a tenant who cannot read it may relabel it (as the operator
    patches its finalizer), but not change its spec (a new image would get the token)."""
    cp = control_plane
    policy.install()
    tenant = Tenant(cp, namespace)
    tenant.grant("pods", "create")
    refused(tenant.create, server("probe", hfTokenSecretRef={"name": "hf-token"}), "Secret hf-token")
    p = admin_create(cp, namespace, server(hfTokenSecretRef={"name": "hf-token"}), dry_run=False)
    assert p.returncode == 0, p.stderr
    assert tenant.patch("llama", {"metadata": {"labels": {"team": "a"}}}).returncode == 0
    p = tenant.patch("llama", {"spec": {"image": "example.com/evil:1"}})
    assert p.returncode != 0 and "spec.hfTokenSecretRef.name:" in p.stderr, p.stderr
    tenant.grant("secrets", "get", name="hf-token")
    p = tenant.patch("llama", {"spec": {"image": "example.com/evil:1"}})
    assert p.returncode == 0, p.stderr


# --------------------------------------------------------------------------- the settings
def test_host_network_is_refused_by_default_and_host_ipc_when_configured(control_plane, namespace, policy):
    cp = control_plane
    create = lambda d: admin_create(cp, namespace, d)  # noqa: E731 - settings bind even system:masters
    policy.install()
    daemon = server(workload="DaemonSet", hostNetwork=True)
    refused(create, daemon, "spec.hostNetwork:", "admissionPolicy.allowHostNetwork is false")
    admitted(create, server(ipc="Host"))

    policy.install({"allowHostIPC": False, "allowHostNetwork": True})
    refused(create, server(ipc="Host"), "spec.ipc: Host", "admissionPolicy.allowHostIPC is false")
    admitted(create, daemon)


def test_allowlists_and_denied_label_prefixes(control_plane, namespace, policy):
    cp = control_plane
    create = lambda d: admin_create(cp, namespace, d)  # noqa: E731
    cp.kubectl("create", "serviceaccount", "vllm", "-n", namespace)
    policy.install({"allowedImagePrefixes": ["docker.io/vllm/vllm-openai:"],
                    "allowedServiceAccounts": ["vllm"], "allowedPriorityClasses": ["inference"],
                    "allowedClaims": ["models"], "deniedPodLabelKeyPrefixes": ["app.kubernetes.io/"]})
    refused(create, server(image="vllm/vllm-openai:v0.32.0"), "spec.image: vllm/vllm-openai:v0.32.0",
            "admissionPolicy.allowedImagePrefixes: docker.io/vllm/vllm-openai:")
    refused(create, server(image="docker.io/vllm/vllm-openai:v0.32.0", serviceAccountName="default"),
            "spec.serviceAccountName: default is not allowed")
    refused(create, server(image="docker.io/vllm/vllm-openai:v0.32.0", priorityClassName="system-node-critical"),
            "spec.priorityClassName: system-node-critical is not allowed")
    refused(create, server(image="docker.io/vllm/vllm-openai:v0.32.0", cache={"claimName": "other"}),
            "spec.cache.claimName: other is not allowed")
    refused(create, server(image="docker.io/vllm/vllm-openai:v0.32.0",
                           podLabels={"app.kubernetes.io/name": "frontend", "team": "a"}),
            "spec.podLabels, spec.podTemplatePatch.metadata.labels: app.kubernetes.io/name not allowed")
    # ... and the same keys through the pod template patch (issue 18: the patch's labels passed by the policy)
    refused(create, server(image="docker.io/vllm/vllm-openai:v0.32.0",
                           podTemplatePatch={"metadata": {"labels": {"app.kubernetes.io/part-of": "billing"}}}),
            "spec.podLabels, spec.podTemplatePatch.metadata.labels: app.kubernetes.io/part-of not allowed")
    admitted(create, server(image="docker.io/vllm/vllm-openai:v0.32.0", serviceAccountName="vllm",
                            priorityClassName="inference", cache={"claimName": "models"}, podLabels={"team": "a"}))

    # the extra containers' images too
    refused(create, server(image="docker.io/vllm/vllm-openai:v0.32.0",
                           sidecars=[{"name": "proxy", "image": "quay.io/evil/proxy:1"}]),
            "spec.initContainers, spec.sidecars: quay.io/evil/proxy:1 does not start with an allowed prefix")
    admitted(create, server(image="docker.io/vllm/vllm-openai:v0.32.0",
                            sidecars=[{"name": "proxy", "image": "docker.io/vllm/vllm-openai:v0.32.0"}]))

    policy.install({"allowedPodLabelKeys": ["team"]})
    refused(create, server(podLabels={"team": "a", "app": "frontend"}),
            "spec.podLabels, spec.podTemplatePatch.metadata.labels: app not allowed",
            "admissionPolicy.allowedPodLabelKeys: team")
    refused(create, server(podLabels={"team": "a"}, podTemplatePatch={"metadata": {"labels": {"app": "frontend"}}}),
            "spec.podLabels, spec.podTemplatePatch.metadata.labels: app not allowed")
    admitted(create, server(podLabels={"team": "a"}, podTemplatePatch={"metadata": {"labels": {"team": "b"}}}))
    admitted(create, server(podLabels={"team": "a"}))


def test_the_binding_covers_the_watched_namespaces_only(control_plane, namespace, policy, k8s):
    """Namespaced mode binds the policy to the watched namespaces: a cluster-wide install covers all."""
    docs = generate.render_chart(ROOT / generate.CHART, {}, release="r", namespace="ops")
    [binding] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert "matchResources" not in binding["spec"] and binding["spec"]["validationActions"] == ["Deny"]
    policy.install()
    other = f"other-{random.token_hex(3)}"
    control_plane.kubectl("create", "namespace", other)
    try:
        outside = Tenant(control_plane, other)
        outside.grant("pods", "create")
        refused(Tenant(control_plane, namespace).create, server(), "may not create pods")
        admitted(outside.create, server(hfTokenSecretRef={"name": "hf-token"}))  # no get on it, not refused
    finally:
        control_plane.kubectl("delete", "namespace", other, "--wait=false")
