"""The CRD refuses what needs no catalog at `kubectl apply`, on the real kube-apiserver: typed quantities,
the CEL rules (x-kubernetes-validations) and strict field validation. No operator runs here: every refusal
below comes from the API server alone, so `kubectl apply` and Argo CD report the failure at once.

Each case starts from a valid example and changes one thing; the valid example itself is admitted (a
server-side dry run), so a rule that refused everything would fail the first test.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())


def server(name: str = "llama", **spec_changes) -> dict:
    doc = copy.deepcopy(EXAMPLE)
    doc["metadata"] = {"name": name}
    for path, value in spec_changes.items():
        node = doc["spec"]
        keys = path.split("__")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return doc


def apply(cp, namespace: str, doc: dict, *extra: str):
    """`kubectl apply` as a user would (client-side apply, strict field validation by default), dry-run on the
    server: the whole admission chain runs, nothing is stored."""
    return cp.kubectl("apply", "-n", namespace, "--dry-run=server", *extra, "-f", "-", input=json.dumps(doc),
                      check=False)


def test_the_valid_examples_are_admitted(control_plane, crd_installed, namespace):
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        doc["metadata"].pop("namespace", None)
        p = apply(control_plane, namespace, doc)
        assert p.returncode == 0, f"{path.name}: {p.stderr}"
    # The escape hatches, rendered into a StatefulSet the API server itself accepts (server-side dry run).
    from vllm_operator import builders, pipeline
    from vllm_operator.api import VLLMServer

    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["metadata"] = {"name": "hatch", "namespace": namespace}
    doc["spec"].update(runtimeClassName="nvidia", startupSeconds=3600, topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "hatch"}}}])
    assert apply(control_plane, namespace, doc).returncode == 0
    server = VLLMServer.model_validate(doc)
    [sts] = [o for o in builders.build_all(pipeline.plan_server("hatch", namespace, server.spec))
             if o["kind"] == "StatefulSet"]
    p = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(sts), check=False)
    assert p.returncode == 0, p.stderr
    # One shared ReadWriteMany claim is what a DaemonSet may create (a claim per pod it may not).
    doc = yaml.safe_load((ROOT / "examples" / "qwen-7b-daemonset.yaml").read_text())
    doc["metadata"].pop("namespace", None)
    doc["spec"]["cache"] = {"size": "100Gi", "shared": True, "storageClassName": "nfs"}
    p = apply(control_plane, namespace, doc)
    assert p.returncode == 0, p.stderr


REFUSED = [
    # (case, spec changes, the field the API server names, words of the message)
    ("memory without a unit", {"gpu__memory": 24}, "spec.gpu.memory", "needs a unit"),
    # an object where an int-or-string belongs fails strict decoding, which names the field
    ("memory as an object", {"gpu__memory": {"size": "24Gi"}}, "spec.gpu.memory", "unknown field"),
    ("memory not a quantity", {"gpu__memory": "24 GiB"}, "spec.gpu.memory", "should match"),
    ("negative reserved memory", {"gpu__reservedMemory": "-1Gi"}, "spec.gpu.reservedMemory", "should match"),
    ("shm size as a list", {"shmSize": ["1Gi"]}, "spec.shmSize", "must be of type"),
    ("cpu request as an object", {"resources": {"requests": {"cpu": {"n": 8}}}}, "spec.resources.requests.cpu",
     "unknown field"),
    # (a request above its limit is the operator's to refuse, SpecValid=False: a CEL rule comparing int-or-string
    # quantities does not fit Kubernetes 1.30's cost budget; tests/unit/test_escape_hatches.py)
    ("GPUs in resources", {"resources": {"limits": {"nvidia.com/gpu": "2"}}}, "spec.resources.limits",
     "spec.gpu (count, migProfile, resourceName)"),
    ("autoscaling a DaemonSet", {"workload": "DaemonSet", "autoscaling": {"enabled": True, "maxReplicas": 3}},
     "spec.autoscaling.enabled", "needs workload: StatefulSet"),
    ("autoscaling without maxReplicas", {"autoscaling": {"enabled": True}}, "spec.autoscaling.maxReplicas",
     "required when autoscaling is enabled"),
    ("maxReplicas below minReplicas", {"autoscaling": {"enabled": True, "minReplicas": 4, "maxReplicas": 2}},
     "spec.autoscaling.maxReplicas", "at least minReplicas"),
    ("host network on a StatefulSet", {"hostNetwork": True}, "spec.hostNetwork", "only a DaemonSet"),
    ("a claim and a size", {"cache": {"claimName": "models", "size": "100Gi"}}, "spec.cache.claimName",
     "not both"),
    ("a cache with neither", {"cache": {"storageClassName": "fast"}}, "spec.cache", "set size"),
    ("a claim per pod of a DaemonSet", {"workload": "DaemonSet", "cache": {"size": "100Gi"}}, "spec.cache.size",
     "cannot create a claim per pod"),
    ("a shared cache without a size", {"cache": {"shared": True, "storageClassName": "nfs"}}, "spec.cache.shared",
     "shared needs size"),
    ("a group of nodes as a DaemonSet", {"workload": "DaemonSet", "nodes": 2}, "spec.nodes",
     "LeaderWorkerSet of groups"),
    ("a group of nodes on MIG slices", {"nodes": 2, "gpu__count": 1, "gpu__migProfile": "3g.40gb"}, "spec.nodes",
     "MIG slices"),
    ("a claim per pod of a group", {"nodes": 2, "cache": {"size": "100Gi"}}, "spec.cache.size",
     "no claim per pod"),
    ("no nodes", {"nodes": 0}, "spec.nodes", "should be greater than or equal to 1"),
    ("maxNodes beside nodes", {"nodes": 2, "maxNodes": 4, "cache": {"claimName": "models"}}, "spec.maxNodes",
     "exclude each other"),
    ("maxNodes on a DaemonSet", {"workload": "DaemonSet", "maxNodes": 4, "cache": {"claimName": "models"}},
     "spec.maxNodes", "LeaderWorkerSet of groups"),
    ("maxNodes on MIG slices", {"maxNodes": 2, "gpu__count": 1, "gpu__product": "NVIDIA-A100-SXM4-80GB",
                                "gpu__migProfile": "3g.40gb", "cache": {"claimName": "models"}},
     "spec.maxNodes", "MIG slices"),
    ("maxNodes with a claim per pod", {"maxNodes": 2}, "spec.cache.size", "no claim per pod"),
    ("maxNodes of 1", {"maxNodes": 1, "cache": {"claimName": "models"}}, "spec.maxNodes",
     "should be greater than or equal to 2"),
    ("batched tokens below seqs", {"engine": {"maxNumSeqs": 64, "maxNumBatchedTokens": 32}},
     "spec.engine.maxNumBatchedTokens", "at least maxNumSeqs"),
    ("HF_HOME in env", {"engine": {"env": [{"name": "HF_HOME", "value": "/x"}]}}, "spec.engine.env[0].name",
     "set by the operator"),
    ("CUDA_VISIBLE_DEVICES in env", {"engine": {"env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]}},
     "spec.engine.env[0].name", "device plugin"),
    ("value and valueFrom", {"engine": {"env": [{"name": "K", "value": "v", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}}}]}}, "spec.engine.env[0].value", "not both"),
    ("Exists with a value", {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
     "spec.tolerations[0].value", "must be empty with operator: Exists"),
    ("no key and not Exists", {"tolerations": [{"operator": "Equal", "value": "v"}]},
     "spec.tolerations[0].operator", "must be Exists when key is empty"),
    ("tolerationSeconds on NoSchedule", {"tolerations": [{"key": "k", "effect": "NoSchedule",
                                                          "tolerationSeconds": 5}]},
     "spec.tolerations[0].tolerationSeconds", "NoExecute only"),
    ("too many tolerations", {"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(40)]},
     "spec.tolerations", "Too many"),
    # the escape hatches
    ("a volume with two sources", {"volumes": [{"name": "v", "emptyDir": {}, "secret": {"secretName": "s"}}]},
     "spec.volumes[0]", "exactly one of"),
    ("a hostPath volume", {"volumes": [{"name": "v", "hostPath": {"path": "/"}}]}, "spec.volumes[0].hostPath",
     "unknown field"),
    ("the operator's volume name", {"volumes": [{"name": "cache", "emptyDir": {}}]}, "spec.volumes[0].name",
     "operator's own volumes"),
    ("a volume name twice", {"volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}]},
     "spec.volumes[1]", "Duplicate value"),
    ("a sidecar named vllm", {"sidecars": [{"name": "vllm", "image": "x"}]}, "spec.sidecars[0].name",
     "operator's own containers"),
    ("a privileged sidecar", {"sidecars": [{"name": "p", "image": "x", "securityContext": {"privileged": True}}]},
     "spec.sidecars[0].securityContext", "unknown field"),
    ("too many sidecars", {"sidecars": [{"name": f"s{i}", "image": "x"} for i in range(5)]}, "spec.sidecars",
     "Too many"),
    ("a sidecar that sees every GPU", {"sidecars": [{"name": "p", "image": "x", "env": [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}, "spec.sidecars[0].env[0].name", "device plugin"),
    ("a patch beside metadata and spec", {"podTemplatePatch": {"status": {}}}, "spec.podTemplatePatch.status",
     "unknown field"),
    ("a MIG resource name", {"gpu__resourceName": "nvidia.com/mig-1g.10gb"}, "spec.gpu.resourceName",
     "migProfile"),
    ("another vendor's resource", {"gpu__resourceName": "amd.com/gpu"}, "spec.gpu.resourceName", "should match"),
    # LoRA adapters (docs/adapters.md)
    ("an adapter name with a space", {"adapters": [{"name": "a b", "source": "org/a"}]}, "spec.adapters[0].name",
     "should match"),
    ("an adapter source that is a URL", {"adapters": [{"name": "a", "source": "https://x/a"}]},
     "spec.adapters[0].source", "should match"),
    ("an adapter path with ..", {"adapters": [{"name": "a", "source": "/cache/../etc"}]}, "spec.adapters[0].source",
     "without '..'"),
    ("a revision of a path", {"adapters": [{"name": "a", "source": "/cache/a", "revision": "main"}]},
     "spec.adapters[0].revision", "a Hub repo"),
    ("an adapter name twice", {"adapters": [{"name": "a", "source": "/cache/a"}, {"name": "a", "source": "/cache/b"}]},
     "spec.adapters[1]", "Duplicate value"),
    ("too many adapters", {"adapters": [{"name": f"a{i}", "source": f"/cache/a{i}"} for i in range(33)]},
     "spec.adapters", "Too many"),
]


@pytest.mark.parametrize("case,changes,field,words", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_at_admission_naming_the_field(control_plane, crd_installed, namespace, case, changes, field,
                                               words):
    p = apply(control_plane, namespace, server(**changes))
    assert p.returncode != 0, f"{case}: admitted"
    assert field in p.stderr and words in p.stderr, p.stderr


@pytest.mark.parametrize("name,words", [("a" * 53, "at most 52 characters"), ("9llama", "must start with a letter")])
def test_names_the_children_could_not_carry_are_refused(control_plane, crd_installed, namespace, name, words):
    p = apply(control_plane, namespace, server(name))
    assert p.returncode != 0 and "metadata.name" in p.stderr and words in p.stderr, p.stderr


def test_quantities_as_numbers_where_kubernetes_takes_them(control_plane, crd_installed, namespace):
    """A cpu request of 8 and a reservedMemory of 0 are quantities as Kubernetes writes them."""
    doc = server(resources={"requests": {"cpu": 8, "memory": "64Gi"}, "limits": {"memory": "64Gi"}},
                 gpu__reservedMemory=0)
    p = apply(control_plane, namespace, doc)
    assert p.returncode == 0, p.stderr


def test_an_unknown_field_gets_strict_field_validation(control_plane, crd_installed, namespace):
    doc = server()
    doc["spec"]["modle"] = {"name": "typo"}
    doc["spec"]["engine"] = {"extra_args": ["--seed", "1"]}  # snake_case: the API's name is extraArgs
    p = apply(control_plane, namespace, doc)
    assert p.returncode != 0
    assert 'unknown field "spec.modle"' in p.stderr and 'unknown field "spec.engine.extra_args"' in p.stderr, p.stderr
    # the same document with validation turned down to a warning is admitted and pruned: the error above is
    # the API server's strict field validation, not a schema rule
    p = apply(control_plane, namespace, doc, "--validate=warn")
    assert p.returncode == 0 and "unknown field" in p.stderr, p.stderr
