"""Generate the VLLMServer CustomResourceDefinition from the pydantic models in api/.

The output is a structural OpenAPI v3 schema (every node typed, no $ref, no anyOf
with null) as apiextensions.k8s.io/v1 requires. `vllm-operator crd` prints it and
`crds/` holds the committed copy; a test fails when that copy is stale.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import TYPE_CHECKING, Any

import pydantic
import yaml

from . import api
from .api.names import INT_OR_STRING_ANY_OF

if TYPE_CHECKING:
    import jsonschema

def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs and turn pydantic's JSON Schema into a structural schema."""
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").rsplit("/", 1)[-1]])
        target.update({k: v for k, v in node.items() if k in ("description", "default")})
        node = target
    if "anyOf" in node and not _int_or_string(node):
        options = [o for o in node.pop("anyOf") if o != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {options}")
        merged = dict(options[0])
        merged.update(node)
        node = _resolve(merged, defs)
    if "default" in node and node["default"] is None:
        del node["default"]  # Optional fields: absent, not null
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "$defs"):
            continue
        if key == "additionalProperties" and value is False:
            continue  # structural schemas prune unknown fields; false is not allowed
        if key == "enum":
            out["type"] = "string"
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):  # 2020-12 -> OAS 3.0
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
            continue
        if key == "const":  # Literal with one value
            out["type"] = "string"
            out["enum"] = [value]
            continue
        if key in ("properties",):
            out[key] = {k: _resolve(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _resolve(value, defs)
        else:
            out[key] = value
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _int_or_string(node: dict[str, Any]) -> bool:
    """A quantity as the models declare it (api.names): x-kubernetes-int-or-string with its anyOf integer, string,
    the one union a structural schema allows; it goes into the CRD as it is."""
    return bool(node.get("x-kubernetes-int-or-string")) and node.get("anyOf") == list(INT_OR_STRING_ANY_OF)


def _one_line(text: str) -> str:
    """A docstring as one paragraph: kubectl explain wraps descriptions itself, so a docstring's line breaks would
    print mid-sentence."""
    return re.sub(r"\s*\n\s*", " ", text).strip()


#: How a quantity's description starts. The API server publishes an int-or-string field as declared (no `type`,
#: x-kubernetes-int-or-string, anyOf integer, string), and kubectl explain (1.30 to 1.37 at least) names a CRD
#: field's type from `type` alone, so it prints <Object> (kubernetes/kubernetes#130946; Kubernetes' own kinds
#: print <Quantity> through a $ref, which a CRD cannot have): the description says what the field takes.
INT_OR_STRING = "int-or-string, a Kubernetes quantity such as 24Gi: "
#: How the description of a map of quantities (resources' requests and limits) starts: explain prints the map as
#: <map[string]Object>.
MAP_OF_INT_OR_STRING = "map of int-or-string Kubernetes quantities such as 8 or 64Gi: "


def _explainable(node: Any) -> Any:
    """Descriptions on one line (kubectl explain wraps them itself), and a quantity's, or a map of quantities',
    saying int-or-string where kubectl explain's type says Object."""
    if isinstance(node, list):
        return [_explainable(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: (_one_line(v) if k == "description" and isinstance(v, str) else _explainable(v))
           for k, v in node.items()}
    values = out.get("additionalProperties")
    prefix = (INT_OR_STRING if out.get("x-kubernetes-int-or-string")
              else MAP_OF_INT_OR_STRING if isinstance(values, dict) and values.get("x-kubernetes-int-or-string")
              else "")
    if prefix and not str(out.get("description", "")).startswith(prefix):
        out["description"] = prefix + str(out.get("description", ""))
    return out


def model_schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _explainable(_resolve(raw, defs))


def openapi_schema() -> dict[str, Any]:
    spec = model_schema(api.VLLMServerSpec)
    status = model_schema(api.VLLMServerStatus)
    return {
        "type": "object",
        "description": "VLLMServer runs a vLLM OpenAI-compatible server with flags derived from the model and GPU.",
        "required": ["spec"],
        # Rules on metadata.name live at the root, the only place CEL may read it (a fieldPath cannot point
        # into metadata, so the messages name the field).
        "x-kubernetes-validations": [
            api.cel(f"self.metadata.name.size() <= {api.MAX_NAME_LENGTH}",
                    f"metadata.name: at most {api.MAX_NAME_LENGTH} characters, because pod labels derived from it "
                    "are limited to 63"),
            api.cel("self.metadata.name.matches('^[a-z]')",
                    "metadata.name must start with a letter: the client Service is named after the server and "
                    "Service names must start with a letter (DNS-1035)"),
        ],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # name and generateName bounded as every object's are (a DNS subdomain): releases before the cap (1.30
            # to at least 1.34) size an unbounded metadata.name at the 3 MB request limit in CEL's cost estimate,
            # which the root's name rules then spend much of the CRD's budget on.
            "metadata": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 253},
                "generateName": {"type": "string", "maxLength": 252},
            }},
            "spec": spec,
            "status": status,
        },
    }


@functools.lru_cache(maxsize=1)
def _validator() -> "jsonschema.Draft4Validator":
    """A validator of the CRD's schema. Its bounds (maxLength, maxProperties, maxItems, patterns, enums, minimum
    and maximum, with OpenAPI 3.0's boolean exclusiveMinimum: JSON Schema draft 4) are the API server's; its
    Kubernetes extensions (x-kubernetes-*: CEL rules, list types, int-or-string) are not read here: the pydantic
    models hold an equivalent of each CEL rule, and tests/apiserver/test_plan_verdict.py checks both agree."""
    import jsonschema  # imported when a document is first checked: the operator, which never does, skips it

    return jsonschema.Draft4Validator(openapi_schema())


#: The schema's checks that the models do not repeat (bounds written only into the CRD's schema: WithJsonSchema).
BOUNDS = ("maxLength", "minLength", "maxProperties", "minProperties", "maxItems", "minItems", "pattern")


def schema_problems(document: dict[str, Any], only: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """What the API server's schema check refuses in a VLLMServer document: (the field, `spec.model.name`; what is
    wrong), in the order of the fields; `only`: those of these checks (BOUNDS). Pure; linear in the document's
    size."""
    out = []
    for error in sorted(_validator().iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path]):
        if only and error.validator not in only:
            continue
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
        out.append((path or "the document", _schema_message(error)))
    return out


def _schema_message(error: "jsonschema.ValidationError") -> str:
    """The API server's wording where it is short, without quoting a long value back."""
    value, bound = error.instance, error.validator_value
    if error.validator == "maxLength":
        return f"may not be longer than {bound} characters (it has {len(value)})"
    if error.validator == "maxProperties":
        return f"may not have more than {bound} entries (it has {len(value)})"
    if error.validator == "maxItems":
        return f"may not have more than {bound} items (it has {len(value)})"
    if error.validator == "pattern":
        return f"must match {bound!r}"
    if error.validator == "enum":
        return f"must be one of {', '.join(map(str, bound))}"
    if error.validator in ("minimum", "maximum", "minLength", "minItems", "type", "required"):
        return error.message if len(error.message) <= 200 else error.message[:200] + "..."
    return f"fails the CRD's {error.validator} rule"


PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "Workload", "type": "string", "jsonPath": ".spec.workload"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Ready-Replicas", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Max-Context", "type": "integer", "jsonPath": ".status.plan.estimates.maxModelLen"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    # Why not ready (Loading, OOMKilled, Unschedulable, ...), or why the spec cannot be deployed (InvalidSpec,
    # DoesNotFit, ModelUnknown, GPUUnknown, PodSecurityForbidden): docs/failures.md.
    {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # Ready's message (the field to change, the numbers) in `kubectl get vllms -o wide`.
    {"name": "Message", "type": "string", "priority": 1,
     "jsonPath": '.status.conditions[?(@.type=="Ready")].message'},
]


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "vllm-operator", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": ["all", "vllm"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


HEADER = "# Generated by `vllm-operator crd` from operator/vllm_operator/api/. Do not edit.\n"


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120)


# --------------------------------------------------------------------------- the field reference (docs/reference.md)
REFERENCE_HEADER = """# VLLMServer field reference

Generated by `make generate` from the API models (operator/vllm_operator/api/), as the CRD is; do not edit.
`kubectl explain vllmserver.spec.<field>` prints the same descriptions from the cluster. A quantity (int-or-string
here) shows there as `<Object>`, a map of them as `<map[string]Object>`: kubectl names a custom resource's field
type from the schema's `type`, which an int-or-string field has none of
([kubernetes#130946](https://github.com/kubernetes/kubernetes/issues/130946)); its description starts with
"int-or-string". Examples: examples/; what the operator derives from these fields: [how-it-works.md](how-it-works.md).

"""


def _type_text(node: dict[str, Any]) -> str:
    """A node's type as kubectl explain names it."""
    if node.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    kind = node.get("type", "object")
    if kind == "array":
        return f"[]{_type_text(node.get('items') or {})}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type_text(node['additionalProperties'])}"
    return str(kind)


def _bounds_text(node: dict[str, Any]) -> str:
    """Default, enum and bounds of a node, as short words."""
    words = []
    if "default" in node and not isinstance(node["default"], (dict, list)):
        words.append(f"default `{json_text(node['default'])}`")
    if node.get("enum"):
        words.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    for key, word in (("minimum", ">="), ("maximum", "<="), ("maxLength", "at most {} characters"),
                      ("maxItems", "at most {} items"), ("maxProperties", "at most {} entries")):
        if key in node:
            words.append(word.format(node[key]) if "{}" in word else f"{word} {node[key]}")
    return "; ".join(words)


def json_text(value: Any) -> str:
    return value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()


def _reference_rows(node: dict[str, Any], path: str, rows: list[str]) -> None:
    """One table row per field under `node`, depth first, in the models' order."""
    required = set(node.get("required") or [])
    for name, child in (node.get("properties") or {}).items():
        field_path = f"{path}.{name}"
        description = str(child.get("description", "")).replace("|", "\\|")
        bounds = _bounds_text(child)
        mark = " (required)" if name in required else ""
        rows.append(f"| `{field_path}`{mark} | {_type_text(child)} | {description}"
                    + (f" ({bounds})" if bounds else "") + " |")
        inner = child.get("items") if child.get("type") == "array" else child
        if isinstance(inner, dict) and inner.get("properties"):
            _reference_rows(inner, field_path + ("[]" if inner is not child else ""), rows)


def field_reference() -> str:
    """docs/reference.md: every spec and status field with its type, description, default and bounds."""
    schema = openapi_schema()["properties"]
    parts = [REFERENCE_HEADER]
    for section in ("spec", "status"):
        rows = ["| field | type | description |", "|---|---|---|"]
        _reference_rows(schema[section], section, rows)
        parts.append(f"## {section}\n\n{schema[section].get('description', '')}\n\n" + "\n".join(rows) + "\n\n")
    return "".join(parts).rstrip("\n") + "\n"
