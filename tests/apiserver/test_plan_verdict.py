"""One verdict (issue 20 item 3): `vllm-operator plan` says of a document what the cluster says of it.

Each case goes through `plan` (in-process, offline, with the operator's default URL settings) and through the real
kube-apiserver (`kubectl apply`, strict field validation, the CRD's schema and CEL rules) and then, when admitted,
the operator's reconcile (in-process, the default URL settings: the public Hub only): its SpecValid condition.
`plan` accepts a document exactly when the API server admits it and the operator finds it valid.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.apiserver.test_crd_admission import REFUSED, server
from vllm_operator import cli
from vllm_operator.controller.reconcile import Reconciler
from vllm_operator.urlpolicy import URLPolicy

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
GROUP_PATH = "/apis/vllm-operator.io/v1alpha1"


def _extra(*args: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        doc["spec"].setdefault("engine", {})["extraArgs"] = list(args)
    return change


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        node = doc["spec"]
        keys = path.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return change


#: The first hour's cases (issue 20), beside every refusal of test_crd_admission.REFUSED and the examples.
FIRST_HOUR: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("the example as it is", lambda doc: None),
    ("a 300 KB pod annotation", _set("podAnnotations", {"note": "x" * 300_000})),
    ("65 pod annotations", _set("podAnnotations", {f"k{i}": "v" for i in range(65)})),
    ("a 64-character label value", _set("podLabels", {"team": "a" * 64})),
    ("a local configURL", _set("model.configURL", "/models/llama/config.json")),
    ("a file configURL", _set("model.configURL", "file:///etc/passwd")),
    ("a configURL outside the allowed URLs", _set("model.configURL", "https://example.test/config.json")),
    ("pipeline parallel over GPUs the pod lacks", _extra("--pipeline-parallel-size=2")),
    ("data parallel", _extra("-dp", "2")),
    ("LoRA", _extra("--enable-lora", "--max-loras", "4")),
    ("speculative decoding", _extra("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}')),
    ("KV offload", _extra("--kv-offloading-size", "8")),
    ("a flag vLLM lacks", _extra("--no-such-flag")),
    ("a harmless flag", _extra("--seed", "1")),
    ("gpu.count 3 on 32 heads", _set("gpu.count", 3)),
    ("a GPU that does not exist", _set("gpu.product", "H100x")),
    ("a model outside the catalog", _set("model.name", "acme/unknown-7b")),
    ("a model too large for its GPU", _set("model.name", "meta-llama/Llama-3.3-70B-Instruct")),
    ("migProfile and resourceName", lambda doc: doc["spec"]["gpu"].update(
        {"product": "NVIDIA-A100-SXM4-80GB", "migProfile": "3g.40gb", "resourceName": "nvidia.com/gpu.shared"})),
    ("minReplicas 0", _set("autoscaling", {"enabled": True, "minReplicas": 0, "maxReplicas": 2})),
    ("GPUs in resources.requests", _set("resources", {"requests": {"nvidia.com/gpu": "1"}})),
    # maxNodes where the planner keeps one node (a cluster without LeaderWorkerSet serves it), and where even its
    # largest layout cannot hold the model (refused before the cluster's kinds matter)
    ("maxNodes on a model one node holds", lambda doc: doc["spec"].update(maxNodes=4, cache={"claimName": "m"})),
    ("maxNodes too few for the model", lambda doc: doc["spec"].update(
        maxNodes=2, cache={"claimName": "m"}, model={"name": "meta-llama/Llama-3.1-405B-Instruct"})),
]


def _cases() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for name, change in FIRST_HOUR:
        doc = server("verdict")
        change(doc)
        cases.append((name, doc))
    cases += [(case, server("verdict", **changes)) for case, changes, _, _ in REFUSED]
    cases += [(f"name {name}", server(name)) for name in ("a" * 52, "a" * 53, "9llama")]
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if (doc["spec"].get("nodes") or 1) > 1:
            continue  # what the cluster serves (LeaderWorkerSet), not the spec: tests/apiserver/test_leaderworkerset.py
        doc["metadata"] = {"name": "verdict"}
        cases.append((f"example {path.stem}", doc))
    return cases


CASES = _cases()


def plan_accepts(doc: dict[str, Any], namespace: str, tmp_path: Path, capsys) -> tuple[bool, str]:
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc = cli.main(["plan", "--offline", "-n", namespace, str(path)])
    _, err = capsys.readouterr()
    return rc == 0, err


def cluster_accepts(control_plane, kube, namespace: str, doc: dict[str, Any]) -> tuple[bool, str]:
    """Admitted by the API server and found valid by the operator's reconcile (SpecValid True)."""
    p = control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc), check=False)
    if p.returncode != 0:
        return False, p.stderr
    reconciler = Reconciler(kube, urls=URLPolicy())  # the operator's defaults: offline, the public Hub only
    reconciler.reconcile(namespace, doc["metadata"]["name"])
    stored = kube.request("GET", f"{GROUP_PATH}/namespaces/{namespace}/vllmservers/{doc['metadata']['name']}")
    [valid] = [c for c in stored["status"]["conditions"] if c["type"] == "SpecValid"]
    return valid["status"] == "True", valid.get("message", "")


@pytest.mark.parametrize("case,doc", CASES, ids=[c[0] for c in CASES])
def test_plan_and_the_cluster_give_one_verdict(control_plane, crd_installed, kube, namespace, tmp_path, capsys,
                                               case, doc):
    planned, plan_says = plan_accepts(copy.deepcopy(doc), namespace, tmp_path, capsys)
    applied, cluster_says = cluster_accepts(control_plane, kube, namespace, copy.deepcopy(doc))
    assert planned == applied, f"{case}: plan {'accepts' if planned else 'refuses'} ({plan_says.strip()}), the " \
                               f"cluster {'accepts' if applied else 'refuses'} ({cluster_says.strip()})"
