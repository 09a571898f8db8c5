"""`kubectl explain vllmservers...` with the test bed's own kubectl against its real API server, the same release
for both (1.37.2; 1.30.14 in the oldest tier, tools/run-tests.sh): what docs/reference.md says explain prints.

Quantities (issue 20): the CRD declares each as controller-gen declares resource.Quantity (x-kubernetes-int-or-string,
anyOf integer, string), the API server publishes that declaration in its OpenAPI v3 and admits an integer or a
string. kubectl explain names a custom resource field's type from the schema's `type` alone (its template's
typeGuess: `$ref`, items, additionalProperties, else `type`, else Object), and an int-or-string field has no `type`:
it prints <Object> (kubernetes/kubernetes#130946; Kubernetes' own kinds print <Quantity> through a `$ref`, which a
CRD schema cannot have). So the description says int-or-string, first.
"""

from __future__ import annotations

import json
import re

import pytest

from e2e.testbed.controlplane import wait_for
from tests.apiserver.test_crd_admission import apply, server
from vllm_operator import api, crd

pytestmark = pytest.mark.apiserver


def _paths(node: dict, path: str):
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _paths(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _paths(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _paths(node["additionalProperties"], f"{path}{{}}")


#: Every quantity field of the CRD as kubectl explain names it (lists walked through), and whether it is a map of
#: quantities (resources' requests and limits: explain names the map).
QUANTITIES = sorted({(path.replace("[]", "").removesuffix("{}"), path.endswith("{}"))
                     for path, node in _paths(crd.openapi_schema()["properties"]["spec"], "spec")
                     if node.get("x-kubernetes-int-or-string")})


def explain(control_plane, path: str) -> tuple[str, str]:
    """(the type kubectl explain prints for `path`, its description on one line)."""
    out = wait_for(lambda: (lambda p: p.stdout if p.returncode == 0 else None)(
        control_plane.kubectl("explain", f"vllmservers.{path}", check=False)), 60,
        f"kubectl explain vllmservers.{path} (the CRD's OpenAPI published)")
    field = re.search(r"^FIELD:\s*\S+\s*<([^>]*)>", out, re.M)
    assert field, out
    description = out[out.index("DESCRIPTION:") + len("DESCRIPTION:"):]
    description = description[:description.index("FIELDS:")] if "FIELDS:" in description else description
    return field.group(1), " ".join(description.split())


def test_every_quantity_explains_as_int_or_string(control_plane, crd_installed):
    assert {("spec.gpu.memory", False), ("spec.gpu.reservedMemory", False), ("spec.shmSize", False),
            ("spec.cache.size", False), ("spec.volumes.emptyDir.sizeLimit", False),
            ("spec.resources.requests", True)} <= set(QUANTITIES), QUANTITIES
    for path, is_map in QUANTITIES:
        kind, description = explain(control_plane, path)
        if is_map:
            assert (kind, description[:len(crd.MAP_OF_INT_OR_STRING.strip())]) == (
                "map[string]Object", crd.MAP_OF_INT_OR_STRING.strip()), (path, kind, description)
        else:
            assert (kind, description[:len(crd.INT_OR_STRING.strip())]) == (
                "Object", crd.INT_OR_STRING.strip()), (path, kind, description)


def test_the_api_server_publishes_the_quantities_as_int_or_string(control_plane, crd_installed):
    """What kubectl explain reads: the server's OpenAPI v3 for the group, each quantity without a `type`, with
    x-kubernetes-int-or-string and anyOf integer, string."""
    def published():
        p = control_plane.kubectl("get", "--raw", f"/openapi/v3/apis/{api.GROUP}/{api.VERSION}", check=False)
        if p.returncode != 0:
            return None
        schemas = json.loads(p.stdout)["components"]["schemas"]
        return next((s for name, s in schemas.items() if name.endswith(f".{api.KIND}")), None)
    root = wait_for(published, 60, "the CRD's OpenAPI v3 published")
    nodes = dict(_paths(root["properties"]["spec"], "spec"))
    found = sorted({p.replace("[]", "").removesuffix("{}") for p, n in nodes.items()
                    if n.get("x-kubernetes-int-or-string")})
    assert found == sorted(path for path, _ in QUANTITIES)
    for path, node in nodes.items():
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path


def test_a_quantity_is_admitted_as_an_integer_or_a_string(control_plane, crd_installed, namespace):
    doc = server("quantities", resources={"requests": {"cpu": 8, "memory": "64Gi"}, "limits": {"cpu": "8"}},
                 shmSize="2Gi", gpu__reservedMemory=0)
    p = apply(control_plane, namespace, doc)
    assert p.returncode == 0, p.stderr


def test_kubectl_explain_prints_whole_sentences(control_plane, crd_installed):
    """kubectl explain wraps a description itself: one with a docstring's hard line breaks printed mid-sentence
    breaks (28 fields before issue 20)."""
    out = control_plane.kubectl("explain", "vllmservers.spec.cache").stdout
    assert re.search(r"^\s*persistentVolumeClaimRetentionPolicy\s+<Object>", out, re.M), out
    policy = crd.openapi_schema()["properties"]["spec"]["properties"]["cache"]["properties"][
        "persistentVolumeClaimRetentionPolicy"]
    text = control_plane.kubectl("explain", "vllmservers.spec.cache.persistentVolumeClaimRetentionPolicy").stdout
    lines = text[text.index("DESCRIPTION:") + len("DESCRIPTION:"):text.index("FIELDS:")].strip().splitlines()
    assert " ".join(" ".join(lines).split()) == policy["description"]
    assert all(len(line.strip()) > 50 for line in lines[:-1]), lines  # kubectl's wrapping, not the docstring's
