"""GPUs as clusters label them, on the real API server (issue 12): a spec naming a GPU by an alias, a family or
another label convention gets pods, made by the real StatefulSet controller from what the operator applied, that
carry the canonical node label; a node labelled as GPU feature discovery labels it runs them (the fake kubelet
schedules only pods whose node selector matches its labels)."""

from __future__ import annotations

import pytest

from e2e.testbed.controlplane import wait_for
from e2e.testbed.fakekubelet import FakeKubelet
from e2e.testbed.operator_install import kubectl_apply, load_example

pytestmark = [pytest.mark.apiserver]


def pod_of(kube, namespace: str, name: str) -> dict:
    return wait_for(lambda: next(iter(kube.list("v1", "Pod", namespace,
                                                label_selector=f"app.kubernetes.io/instance={name}")), None),
                    60, f"{name}'s pod")


def test_aliases_families_and_conventions_select_the_labels_nodes_carry(control_plane, operator, kube, k8s,
                                                                       namespace):
    for name, gpu in (("alias", {"count": 1, "product": "L4"}), ("family", {"count": 1, "product": "h100"}),
                      ("gke", {"count": 1, "product": "L4", "labelConvention": "GKE"})):
        kubectl_apply(control_plane, load_example(name, namespace, gpu=gpu))

    assert pod_of(kube, namespace, "alias")["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    family = pod_of(kube, namespace, "family")["spec"]
    [term] = family["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.product", "operator": "In",
                                         "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"]}]
    assert pod_of(kube, namespace, "gke")["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}

    # A node as GPU feature discovery labels an L4 runs the alias's pod (and not the GKE one, labelled otherwise).
    with FakeKubelet(k8s, namespace=namespace, node_name=f"gfd-{namespace}"[:60], gpu_product="NVIDIA-L4"):
        wait_for(lambda: pod_of(kube, namespace, "alias")["spec"].get("nodeName"), 60, "the alias's pod scheduled")
        wait_for(lambda: any(c.get("reason") == "Unschedulable" for c in
                             pod_of(kube, namespace, "gke").get("status", {}).get("conditions") or []), 60,
                 "the GKE pod left unscheduled on a GFD-labelled node")
