"""The API models and the CRD generated from them."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from vllm_operator import api, crd
from vllm_operator.cli import main

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "vllmservers.vllm-operator.io.yaml"


def test_committed_crd_is_generated_from_the_models():
    assert CRD_FILE.read_text() == crd.crd_yaml(), (
        "crds/ is stale: run `vllm-operator crd > crds/vllmservers.vllm-operator.io.yaml`"
    )


def test_crd_command_prints_the_crd(capsys):
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == crd.crd_yaml()


def _walk(node, path="$"):
    yield path, node
    for key in ("properties",):
        for name, child in node.get(key, {}).items():
            yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    schema = crd.openapi_schema()
    for path, node in _walk(schema):
        assert "$ref" not in node and "allOf" not in node, path
        # the one anyOf a structural schema allows: int-or-string, with no type of its own
        assert "anyOf" not in node or (node.get("x-kubernetes-int-or-string") and "type" not in node), path
        assert ("type" in node or node.get("x-kubernetes-int-or-string")
                or node.get("x-kubernetes-preserve-unknown-fields")), f"{path} has no type"
        if node.get("type") == "object" and "properties" not in node and path != "$.metadata":
            assert "additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields"), path


def test_schema_carries_enums_ranges_required_and_defaults():
    spec = crd.openapi_schema()["properties"]["spec"]
    props = spec["properties"]
    assert spec["required"] == ["model"]
    assert props["model"]["required"] == ["name"]
    assert props["workload"]["enum"] == ["StatefulSet", "DaemonSet"]
    assert props["workload"]["default"] == "StatefulSet"
    assert props["ipc"]["enum"] == ["Host", "SharedMemory"]
    assert props["gpu"]["properties"]["count"]["minimum"] == 1
    assert props["engine"]["properties"]["gpuMemoryUtilization"]["maximum"] == 1.0
    assert props["autoscaling"]["properties"]["source"]["enum"] == ["Pods", "Prometheus"]
    assert props["workloadProfile"]["properties"]["priority"]["enum"] == ["latency", "balanced", "throughput"]
    assert props["gpu"]["properties"]["memory"]["pattern"] == api.QUANTITY_PATTERN
    # the only free-form fields are affinity and the spread constraints, passed through to the pod as they are
    # (the API server checks them when the workload is applied), and the pod template patch's two halves, which
    # the operator checks on the final template (escape_hatches.py)
    free = [p for p, n in _walk(crd.openapi_schema()) if n.get("x-kubernetes-preserve-unknown-fields")]
    assert free == ["$.spec.affinity", "$.spec.topologySpreadConstraints[]", "$.spec.podTemplatePatch.metadata",
                    "$.spec.podTemplatePatch.spec"]


def test_quantities_are_int_or_string_with_the_quantity_grammar():
    """A number or a quantity string, as in a pod's resources: an object or "24 GiB" is refused at admission."""
    schema = crd.openapi_schema()
    quantities = sorted(p for p, n in _walk(schema) if n.get("x-kubernetes-int-or-string"))
    containers = [f"$.spec.{key}[].resources.{side}{{}}" for key in ("initContainers", "sidecars")
                  for side in ("limits", "requests")]
    assert quantities == sorted(["$.spec.cache.size", "$.spec.gpu.memory", "$.spec.gpu.reservedMemory",
                                 "$.spec.resources.limits{}", "$.spec.resources.requests{}", "$.spec.shmSize",
                                 "$.spec.volumes[].emptyDir.sizeLimit", *containers])
    for path, node in _walk(schema):
        if node.get("x-kubernetes-int-or-string"):
            assert node["pattern"] == api.QUANTITY_PATTERN and "type" not in node, path
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_every_list_and_map_of_the_spec_is_bounded():
    """A tenant's object stays small, and the API server can bound the cost of the CEL rules walking it."""
    for path, node in _walk(crd.openapi_schema()["properties"]["spec"], "spec"):
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node or "pattern" in node, path


def test_every_field_has_a_description():
    for path, node in _walk(crd.openapi_schema()["properties"]["spec"], "spec"):
        if path != "spec" and not path.endswith("{}") and not path.endswith("[]"):
            assert node.get("description"), f"{path} has no description"


def test_subresources_and_printer_columns():
    version = crd.crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == ["Model", "Workload", "Desired", "Ready-Replicas", "Max-Context", "Ready", "Reason", "Age",
                         "Message"]
    assert crd.crd()["spec"]["names"]["shortNames"] == ["vllms"]


@pytest.mark.parametrize("text,ok", [("24Gi", True), ("23.58Gi", True), ("500M", True), ("1e9", True),
                                     ("24 GiB", False), ("lots", False), ("", False), ("-1Gi", False)])
def test_quantities(text, ok):
    if ok:
        assert api.parse_quantity(text) > 0
    else:
        with pytest.raises(ValueError):
            api.parse_quantity(text)


@pytest.mark.parametrize("value,ok", [("24Gi", True), (0, True), ("0", True), (24, False), (24.5, False)])
def test_memory_sizes_need_a_unit(value, ok):
    spec = {"model": {"name": "m"}, "gpu": {"memory": value}}
    if ok:
        api.VLLMServerSpec.model_validate(spec)
    else:
        with pytest.raises(ValueError, match="no unit"):
            api.VLLMServerSpec.model_validate(spec)


def test_quantity_values():
    assert api.parse_quantity("24Gi") == 24 * 2**30
    assert api.parse_quantity("500M") == 500 * 10**6
    assert float(api.parse_quantity("23.58Gi")) == pytest.approx(23.58 * 2**30)
    assert api.parse_quantity("1e9") == api.parse_quantity("1E+9") == 10**9
    assert api.parse_quantity("15e-1") == api.parse_quantity(".15e1") == Decimal("1.5")
    assert api.parse_quantity(str(2**63 - 1)) == 2**63 - 1
    assert api.parse_quantity("7Ei") == 7 * 2**60


@pytest.mark.parametrize("text", ["1e400", "1e-400", "1e31", "1e-31", "1e999999", "1e9999999", "1e" + "9" * 5000,
                                  "1e1.5", "9" * 400, str(2**63), "8Ei"])
def test_quantities_out_of_range_are_value_errors(text):
    # "1e400" bytes of GPU memory raised OverflowError in the planner; "1e9999999" decimal.Overflow,
    # "1e1.5" decimal.InvalidOperation: neither is a ValueError, so pydantic let them escape.
    with pytest.raises(ValueError, match="out of range"):
        api.parse_quantity(text)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_validate(path):
    for doc in yaml.safe_load_all(path.read_text()):
        api.VLLMServer.model_validate(doc)


def test_descriptions_are_one_paragraph_and_quantities_are_int_or_string_for_kubectl_explain():
    """kubectl explain wraps descriptions itself (a docstring's line breaks printed mid-sentence); an int-or-string
    field is declared anyOf integer/string, as controller-gen declares resource.Quantity."""
    nodes = list(_walk(crd.openapi_schema()))
    broken = [path for path, node in nodes if "\n" in str(node.get("description", ""))]
    assert not broken, broken
    quantities = [node for path, node in nodes if node.get("x-kubernetes-int-or-string")]
    assert len(quantities) >= 5
    assert all(n["anyOf"] == [{"type": "integer"}, {"type": "string"}] for n in quantities)
    # kubectl explain names a CRD field's type from `type` alone (<Object> here): the description says it
    assert all(n["description"].startswith(crd.INT_OR_STRING) for n in quantities)


def test_the_field_reference_is_generated_from_the_models_and_current():
    """docs/reference.md is `make generate`'s, from the same schema as the CRD: every spec field is in it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "reference.md").read_text()
    assert text == crd.field_reference(), "docs/reference.md is stale: run `make generate`"
    for path, node in _walk(crd.openapi_schema()["properties"]["spec"], "spec"):
        if "[]" not in path and "{}" not in path and path != "spec":
            assert f"| `{path}`" in text, path
    assert "| `spec.cache.persistentVolumeClaimRetentionPolicy.whenDeleted` | string |" in text
    assert "| `spec.gpu.memory` | int-or-string |" in text


def _quantity_fields(model, path: str = "$.spec"):
    """Every field of the models that parses a Kubernetes quantity (api.Quantity, api.ByteSize: the validator that
    runs api.parse_quantity), found from the models' annotations, not from any schema."""
    import types
    import typing

    import pydantic

    from vllm_operator.api import names

    def is_quantity(metadata) -> bool:
        return any(getattr(m, "func", None) is names._check_quantity for m in metadata)

    def walk(annotation, metadata, path):
        if is_quantity(metadata):
            yield path
            return
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is typing.Annotated:
            yield from walk(args[0], annotation.__metadata__, path)
        elif origin in (typing.Union, types.UnionType):
            for arg in args:
                yield from walk(arg, (), path)
        elif origin in (list, tuple):
            yield from walk(args[0], (), path + "[]")
        elif origin is dict:
            yield from walk(args[1], (), path + "{}")
        elif isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
            for name, field in annotation.model_fields.items():
                yield from walk(field.annotation, field.metadata, f"{path}.{field.alias or name}")

    return sorted(set(walk(model, (), path)))


def test_every_quantity_of_the_models_is_int_or_string_in_their_own_json_schema_and_the_crd():
    """Issue 20: each quantity field (found by its validator) is declared as controller-gen declares
    resource.Quantity, x-kubernetes-int-or-string with anyOf integer, string, by the models' JSON schema itself
    (api.names), and the CRD carries exactly that; in kubectl explain its type reads <Object> (kubectl names a CRD
    field's type from `type` alone, kubernetes/kubernetes#130946), so its description, or its map's, says
    int-or-string (tests/apiserver/test_explain.py runs kubectl explain on both claimed Kubernetes releases)."""
    fields = _quantity_fields(api.VLLMServerSpec)
    assert {"$.spec.gpu.memory", "$.spec.gpu.reservedMemory", "$.spec.shmSize", "$.spec.cache.size",
            "$.spec.resources.requests{}"} <= set(fields)
    schema = crd.openapi_schema()
    assert fields == sorted(p for p, n in _walk(schema["properties"]["spec"], "$.spec")
                            if n.get("x-kubernetes-int-or-string"))
    raw = api.VLLMServerSpec.model_json_schema(by_alias=True, mode="validation")
    declared = [n for n in _json_nodes(raw) if n.get("x-kubernetes-int-or-string")]
    assert declared and all(n["anyOf"] == [{"type": "integer"}, {"type": "string"}] for n in declared)
    nodes = dict(_walk(schema["properties"]["spec"], "$.spec"))
    for path in fields:
        node = nodes[path]
        assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}] and "type" not in node, path
        if path.endswith("{}"):
            assert nodes[path[:-2]]["description"].startswith(crd.MAP_OF_INT_OR_STRING), path
        else:
            assert node["description"].startswith(crd.INT_OR_STRING), path


def _json_nodes(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _json_nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _json_nodes(value)
