"""Generate every file that is derived from another one, so none is ever edited by hand.

    python -m vllm_operator.generate            # write them (what `make generate` runs)
    python -m vllm_operator.generate --check    # exit 1 and name the stale ones

From the API models (api/) and the chart's sources it writes:

* ``crds/vllmservers.vllm-operator.io.yaml`` and its copy in the chart's ``crds/``;
* ``charts/vllm-operator/values.schema.json`` from ``values.yaml``: types from the
  defaults, descriptions from the comment above each key, and extra JSON Schema from
  ``# @schema {...}`` comment lines (a node whose ``additionalProperties`` is true is
  free-form: its children are not described in the schema);
* ``charts/vllm-operator/files/argocd-health.lua`` and ``manifests/argocd-cm-patch.yaml``
  from ``operator/vllm_operator/argocd_health.lua``;
* ``docs/reference.md``, the field reference, from the same schema as the CRD;
* ``manifests/vllm-operator.yaml``, the kubectl bundle: the chart rendered by Helm's own
  Go code (helm-python-sdk, offline, as ``helm template`` does) with its default values,
  release ``vllm-operator`` in namespace ``vllm-operator``, plus that Namespace and the CRD.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from . import crd

CHART = Path("charts/vllm-operator")
CRD_FILE = "vllmservers.vllm-operator.io.yaml"
LUA_SOURCE = Path(__file__).with_name("argocd_health.lua")
ARGOCD_HEALTH_KEY = "resource.customizations.health.vllm-operator.io_VLLMServer"
BUNDLE_RELEASE = "vllm-operator"
BUNDLE_NAMESPACE = "vllm-operator"
BUNDLE_MANAGED_BY = "kubectl"

#: Helm's install order (pkg/release/util/kind_sorter.go), for a bundle kubectl applies top to bottom.
INSTALL_ORDER = [
    "PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
    "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass",
    "PersistentVolume", "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole", "ClusterRoleList",
    "ClusterRoleBinding", "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList",
    "Service", "DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler",
    "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress", "APIService",
]


def repo_root() -> Path:
    """The checkout this module lives in (operator/vllm_operator/generate.py -> ../..)."""
    return Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- values.yaml -> schema
@dataclass
class KeyDoc:
    """What the comment block above one key of values.yaml says."""

    path: tuple[str, ...]
    line: int
    description: str = ""
    schema: dict[str, Any] = field(default_factory=dict)


_KEY = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):(\s|$)")


def key_docs(text: str) -> dict[tuple[str, ...], KeyDoc]:
    """Every mapping key of values.yaml with the comment block right above it.

    Only block-style mappings are read (the chart's own style); a blank line ends a
    comment block, so a file header is not mistaken for the first key's comment.
    """
    docs: dict[tuple[str, ...], KeyDoc] = {}
    stack: list[tuple[int, str]] = []
    comments: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            comments = []
            continue
        if stripped.startswith("#"):
            comments.append(stripped[1:].strip())
            continue
        m = _KEY.match(line)
        if m is None:  # a list item or a continuation line
            comments = []
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        path = tuple(k for _, k in stack)
        doc = KeyDoc(path, number)
        words = []
        for c in comments:
            if c.startswith("@schema"):
                try:
                    doc.schema.update(json.loads(c[len("@schema"):]))
                except ValueError as e:
                    raise ValueError(f"values.yaml line {number}: bad @schema JSON above {'.'.join(path)}: {e}") from e
            else:
                words.append(c)
        doc.description = " ".join(words).strip()
        docs[path] = doc
        comments = []
    return docs


def undocumented_keys(text: str) -> list[str]:
    """Dotted paths of the keys of values.yaml that have no comment."""
    return [".".join(p) for p, d in key_docs(text).items() if not d.description]


def _type_of(value: Any) -> Optional[str]:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return None


def _node_schema(value: Any, path: tuple[str, ...], docs: dict[tuple[str, ...], KeyDoc]) -> dict[str, Any]:
    doc = docs.get(path)
    if doc is None:
        raise ValueError(f"values.yaml: cannot find the key {'.'.join(path)} (flow-style mappings are not read)")
    schema: dict[str, Any] = {}
    kind = _type_of(value)
    if kind:
        schema["type"] = kind
    if doc.description:
        schema["description"] = doc.description
    if kind == "object" and doc.schema.get("additionalProperties") is None:
        schema["additionalProperties"] = False
        schema["properties"] = {k: _node_schema(v, path + (k,), docs) for k, v in value.items()}
    elif kind == "array" and value and "items" not in doc.schema:
        schema["items"] = {"type": _type_of(value[0])}
    schema.update(doc.schema)
    return schema


def values_schema(values_text: str) -> dict[str, Any]:
    """The JSON Schema (draft 7, as Helm reads it) of values.yaml."""
    values = yaml.safe_load(values_text) or {}
    docs = key_docs(values_text)
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Values of the vllm-operator chart",
        "description": "Generated from values.yaml by `make generate`; edit values.yaml instead.",
        "type": "object",
        "additionalProperties": False,
        "properties": {k: _node_schema(v, (k,), docs) for k, v in values.items()},
    }


# --------------------------------------------------------------------------- chart rendering
def helm_python():
    try:
        import helm_python as hp  # Helm v4's Go SDK behind ctypes: renders charts offline
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit("rendering the chart needs helm-python-sdk: pip install -e '.[helm]'") from e
    return hp


@dataclass
class Rendered:
    """One object of a rendered chart: parsed, and its text as Helm wrote it (comments kept)."""

    obj: dict[str, Any]
    text: str


def _split(text: str) -> list[Rendered]:
    out = []
    for part in re.split(r"^---[ \t]*$", text, flags=re.M):
        obj = yaml.safe_load(part)
        if obj:
            out.append(Rendered(obj, part.strip("\n") + "\n"))
    return out


def render_chart_documents(chart_dir: Path, values: Optional[dict[str, Any]] = None, *,
                           release: str = BUNDLE_RELEASE, namespace: str = BUNDLE_NAMESPACE,
                           include_crds: bool = False) -> list[Rendered]:
    """The chart as Helm renders it for an install (templates only, unless include_crds), in install order."""
    hp = helm_python()
    with hp.Chart.load(str(chart_dir)) as chart:
        chart.validate_schema(values or {})
        rendered = chart.render(values or {}, name=release, namespace=namespace, revision=1, is_install=True)
        crds = chart.crds if include_crds else []
    docs: list[Rendered] = []
    for c in crds:
        docs += _split(c["data"])
    for path in sorted(rendered):
        if path.endswith((".yaml", ".yml")):  # not NOTES.txt
            docs += _split(rendered[path])
    rank = {kind: i for i, kind in enumerate(INSTALL_ORDER)}
    return sorted(docs, key=lambda d: (rank.get(d.obj["kind"], len(rank)), d.obj["metadata"].get("namespace", ""),
                                       d.obj["metadata"]["name"]))


def render_chart(chart_dir: Path, values: Optional[dict[str, Any]] = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The chart's objects as Helm renders them for an install, in install order."""
    return [d.obj for d in render_chart_documents(chart_dir, values, **kwargs)]


def bundle_text(chart_dir: Path) -> str:
    """The kubectl bundle: the Namespace, then the chart's CRD and templates with default values."""
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": BUNDLE_NAMESPACE, "labels": {"app.kubernetes.io/name": "vllm-operator"}}}
    parts = [yaml.safe_dump(namespace, sort_keys=False)]
    for doc in render_chart_documents(chart_dir, include_crds=True):
        # kubectl, not Helm, manages what this file creates
        parts.append(doc.text.replace("app.kubernetes.io/managed-by: Helm",
                                      f"app.kubernetes.io/managed-by: {BUNDLE_MANAGED_BY}"))
    return "---\n".join(parts)


def bundle_objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts) as literal blocks, the way people write them."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s,
                                                             style="|" if "\n" in s else None))


# --------------------------------------------------------------------------- all generated files
def argocd_cm_patch(lua: str) -> str:
    return ("# Generated by `make generate` from operator/vllm_operator/argocd_health.lua. Do not edit.\n"
            "# The VLLMServer health check for Argo CD:\n"
            "#   kubectl -n argocd patch configmap argocd-cm --type merge --patch-file manifests/argocd-cm-patch.yaml\n"
            + yaml.dump({"data": {ARGOCD_HEALTH_KEY: lua}}, Dumper=_Dumper, sort_keys=False, width=120))


def generated_files(root: Optional[Path] = None) -> dict[Path, str]:
    """Relative path -> content of every generated file, computed from the sources in `root`."""
    root = root or repo_root()
    chart = root / CHART
    crd_text = crd.crd_yaml()
    lua = LUA_SOURCE.read_text()
    schema = json.dumps(values_schema((chart / "values.yaml").read_text()), indent=2) + "\n"
    files: dict[Path, str] = {Path("crds") / CRD_FILE: crd_text, CHART / "crds" / CRD_FILE: crd_text}
    for other in sorted((root / "crds").glob("*.yaml")):  # CRDs kept by hand in crds/ (none generated here)
        if other.name != CRD_FILE:
            files[CHART / "crds" / other.name] = other.read_text()
    files |= {
        CHART / "values.schema.json": schema,
        CHART / "files" / "argocd-health.lua": lua,
        Path("manifests") / "argocd-cm-patch.yaml": argocd_cm_patch(lua),
        Path("docs") / "reference.md": crd.field_reference(),
    }
    # Render from a copy of the chart that already holds the new schema, CRD and files.
    with tempfile.TemporaryDirectory(prefix="vllm-operator-chart-") as tmp:
        copy = Path(tmp) / "vllm-operator"
        shutil.copytree(chart, copy)
        for orphan in _orphans(root, files):
            (copy / Path(*orphan.parts[2:])).unlink()
        for path, text in files.items():
            if path.parts[:2] == CHART.parts:
                target = copy / Path(*path.parts[2:])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        header = (f"# Generated by `make generate` from charts/vllm-operator (release {BUNDLE_RELEASE} in namespace "
                  f"{BUNDLE_NAMESPACE}, default values). Do not edit.\n"
                  "#   kubectl apply -f manifests/vllm-operator.yaml\n")
        files[Path("manifests") / "vllm-operator.yaml"] = header + bundle_text(copy)
    return files


def _orphans(root: Path, files: dict[Path, str]) -> list[Path]:
    """Files in the chart's crds/ that no source gives any more."""
    return [p.relative_to(root) for p in sorted((root / CHART / "crds").glob("*")) if p.relative_to(root) not in files]


def stale_files(root: Optional[Path] = None) -> list[Path]:
    """Generated files whose committed content differs from what the sources give (or that should be gone)."""
    root = root or repo_root()
    files = generated_files(root)
    stale = [path for path, text in files.items()
             if not (root / path).exists() or (root / path).read_text() != text]
    return stale + _orphans(root, files)


def write_all(root: Optional[Path] = None) -> list[Path]:
    root = root or repo_root()
    files = generated_files(root)
    changed = []
    for path, text in files.items():
        target = root / path
        if target.exists() and target.read_text() == text:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        changed.append(path)
    for path in _orphans(root, files):
        (root / path).unlink()
        changed.append(path)
    return changed


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_operator.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")
    parser.add_argument("--root", type=Path, default=None, help="the checkout (default: the one holding this module)")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.root)
        for path in stale:
            print(f"stale: {path} (run `make generate`)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_all(args.root):
        print(f"{'wrote' if (args.root or repo_root()).joinpath(path).exists() else 'removed'} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
