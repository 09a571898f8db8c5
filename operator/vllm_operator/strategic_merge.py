"""Strategic merge patch of a pod template, the subset Kubernetes applies to a PodTemplateSpec. Pure.

There is no maintained Python implementation (the Kubernetes Python client sends patches for the API server
to merge; the Go one lives in apimachinery's strategicpatch), so this is the subset spec.podTemplatePatch needs:

- maps merge key by key; a key set to null is removed;
- lists of objects with a patchMergeKey in the Kubernetes API merge by that key (below: containers,
  initContainers, volumes, env, ports, volumeMounts, ...): an element whose key matches an existing one is
  merged into it, a new one is appended; every other list (args, command, tolerations, envFrom, ...) replaces
  the original, as in Kubernetes;
- directives: ``$patch: delete`` in a list element removes the element with that key; ``$patch: replace`` in a
  map replaces the map with the rest of the patch's map, in a list element replaces the list with the patch's
  other elements; ``$patch: delete`` in a map removes the map.

Other directives (``$retainKeys``, ``$setElementOrder/...``, ``$deleteFromPrimitiveList/...``) and merge-keyed
elements without their key are refused (a PatchError naming the path), never ignored. Each node of the
original and the patch is visited once (elements are matched through a dict), so the time is linear in their
sizes; the caller bounds the patch's size and depth (MAX_PATCH_BYTES, MAX_DEPTH).
"""

from __future__ import annotations

import json
from typing import Any

#: The patchMergeKey of each merged list of a PodTemplateSpec (k8s.io/api/core/v1 types.go); the names do not
#: recur elsewhere in a pod template with another meaning.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
}
PATCH = "$patch"
#: Bounds on a patch, checked before it is applied: its JSON size and how deeply it nests.
MAX_PATCH_BYTES = 64 * 1024
MAX_DEPTH = 16


class PatchError(ValueError):
    """A patch this subset cannot apply: `path` is where, in the patch."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


def check_bounds(patch: Any, path: str) -> None:
    """PatchError unless `patch` is a map within MAX_PATCH_BYTES and MAX_DEPTH levels (iterative: no recursion
    on tenant data before it is known to be shallow)."""
    if not isinstance(patch, dict):
        raise PatchError(path, "must be a map (a partial pod template: metadata and spec)")
    size = len(json.dumps(patch, separators=(",", ":")))
    if size > MAX_PATCH_BYTES:
        raise PatchError(path, f"is {size:,} bytes; at most {MAX_PATCH_BYTES:,}")
    stack: list[tuple[Any, int]] = [(patch, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise PatchError(path, f"nests deeper than {MAX_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def apply(original: dict[str, Any], patch: dict[str, Any], path: str = "") -> dict[str, Any]:
    """`original` with `patch` merged in, as a new object (neither argument is changed)."""
    # A JSON round trip copies a template (JSON data) several times faster than copy.deepcopy.
    merged = _merge_map(json.loads(json.dumps(original)), patch, path)
    return merged if merged is not None else {}


def _merge_map(original: dict[str, Any], patch: dict[str, Any], path: str) -> Any:
    directive = patch.get(PATCH)
    if directive == "replace":
        return _strip({k: v for k, v in patch.items() if k != PATCH}, path)
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise PatchError(f"{path}.{PATCH}", f"{directive!r} is not a directive this patch supports "
                                            "(replace, delete, merge)")
    for key, value in patch.items():
        where = f"{path}.{key}" if path else key
        if key == PATCH:
            continue
        if key.startswith("$"):
            raise PatchError(where, "this strategic-merge directive is not supported (only $patch)")
        if value is None:
            original.pop(key, None)
        elif isinstance(value, dict) and isinstance(original.get(key), dict):
            merged = _merge_map(original[key], value, where)
            if merged is None:
                original.pop(key, None)
            else:
                original[key] = merged
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(original.get(key), list):
            original[key] = _merge_list(original[key], value, MERGE_KEYS[key], where)
        else:
            original[key] = _strip(value, where)
    return original


def _merge_list(original: list[Any], patch: list[Any], key: str, path: str) -> list[Any]:
    """Merge by `key`, in apimachinery's order: the patch's elements in the patch's order, the original's others
    in theirs, interleaved so that two elements both in the original keep their original order (a new element
    goes before the original's others: a new init container runs first)."""
    if any(isinstance(e, dict) and e.get(PATCH) == "replace" for e in patch):
        return [_strip(e, f"{path}[{i}]") for i, e in enumerate(patch)
                if not (isinstance(e, dict) and e.get(PATCH) == "replace")]
    position = {e[key]: i for i, e in enumerate(original) if isinstance(e, dict) and _is_key(e.get(key))}
    patched: list[tuple[Any, Any]] = []  # (position in the original or None, element)
    touched: set[Any] = set()
    for i, element in enumerate(patch):
        where = f"{path}[{i}]"
        if not isinstance(element, dict) or key not in element:
            raise PatchError(where, f"each element needs its merge key {key!r}")
        name = element[key]
        if not _is_key(name):
            raise PatchError(f"{where}.{key}", f"the merge key {key!r} must be a string or an integer")
        if name in touched:
            raise PatchError(where, f"{key} {name!r} appears twice in the patch")
        touched.add(name)
        at = position.get(name)
        if element.get(PATCH) == "delete":
            continue
        merged = _strip(element, where) if at is None else _merge_map(original[at], element, where)
        patched.append((at, merged))
    untouched = [(i, e) for i, e in enumerate(original)
                 if not (isinstance(e, dict) and _is_key(e.get(key)) and e.get(key) in touched)]
    out, i, j = [], 0, 0
    while i < len(patched) and j < len(untouched):
        if patched[i][0] is not None and untouched[j][0] < patched[i][0]:
            out.append(untouched[j][1])
            j += 1
        else:
            out.append(patched[i][1])
            i += 1
    return out + [e for _, e in patched[i:]] + [e for _, e in untouched[j:]]


def _is_key(value: Any) -> bool:
    """Whether a merge key's value is one Kubernetes has (a name or a port: a string or an integer)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _strip(value: Any, path: str) -> Any:
    """A new value from the patch: a copy, with directives refused (there is nothing for them to merge into)
    and nulls in maps dropped."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == PATCH and v in ("merge", "replace"):
                continue
            if k.startswith("$"):
                raise PatchError(f"{path}.{k}", "a directive where there is nothing to merge into")
            if v is not None:
                out[k] = _strip(v, f"{path}.{k}")
        return out
    if isinstance(value, list):
        return [_strip(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value
