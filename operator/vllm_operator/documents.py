"""VLLMServer documents read and validated, the same for the CLI's YAML files and the API server's spec dicts:
`load_documents` turns YAML text into validated servers or one readable line per error, `parse_spec` a spec
dict. Pure.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Optional

import pydantic
import yaml

from . import api, crd


@dataclass
class Document:
    """One YAML document: a valid server, or the reasons it is not one."""

    index: int
    name: str
    server: Optional[api.VLLMServer] = None
    errors: list[str] = field(default_factory=list)


def _known_fields(model: type[pydantic.BaseModel], loc: tuple) -> list[str]:
    """The camelCase field names at `loc` (for did-you-mean hints)."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", {})
        match = next((f for n, f in fields.items() if part in (n, f.alias)), None)
        if match is None:
            return []
        current = _inner_model(match.annotation)
    if current is None or not hasattr(current, "model_fields"):
        return []
    return [f.alias or n for n, f in current.model_fields.items()]


def _inner_model(annotation: Any) -> Any:
    """The pydantic model inside an annotation (Optional[M], list[M], ...), or None."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):  # only the arguments: never the annotation itself again
        inner = _inner_model(arg)
        if inner is not None:
            return inner
    return None


def format_validation_error(err: pydantic.ValidationError, root: type[pydantic.BaseModel], prefix: str = "") -> list[str]:
    """One line per problem: the field path, what is wrong, and a hint where we have one.

    A misspelt required field ("modle") is one mistake: its "did you mean 'model'?" line
    stands for it, without a second line saying that spec.model is missing.
    """
    def dotted(loc: tuple) -> str:
        return prefix + "".join(f"[{p}]" if isinstance(p, int) else (("." if i or prefix else "") + str(p))
                                for i, p in enumerate(loc))

    lines: list[tuple[str, str]] = []
    suggested: set[str] = set()
    for e in err.errors():
        loc = tuple(e["loc"])
        path = dotted(loc)
        if e["type"] == "extra_forbidden":
            known = _known_fields(root, loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else (f" (known: {', '.join(known)})" if known else "")
            lines.append((path, f"{path}: unknown field{hint}"))
            if close:
                suggested.add(dotted(loc[:-1] + (close[0],)))
        elif e["type"] == "missing":
            lines.append((path, f"{path}: required field is missing"))
        else:
            got = e.get("input")
            shown = f" (got {got!r})" if isinstance(got, (str, int, float, bool)) else ""
            lines.append((path, f"{path}: {_message(e)}{shown}"))
    return [line for path, line in lines if not (path in suggested and line.endswith("required field is missing"))]


#: Fields whose refusal pydantic's wording does not explain, by the end of their path and pydantic's error type;
#: the one place for each message (the API server's own is the CRD's `minimum`).
FIELD_MESSAGES: dict[tuple[tuple[str, ...], str], str] = {
    (("autoscaling", "minReplicas"), "greater_than_equal"):
        "replicas cannot be negative: minReplicas is 0 (scale to zero after an idle window, with the endpoint "
        "picker's signal to wake it: docs/scale-to-zero.md) or more",
}


def _message(error: Any) -> str:
    """pydantic's message, in words where it cannot say the reason (FIELD_MESSAGES, a flag-like value)."""
    loc = tuple(str(part) for part in error["loc"])
    for (suffix, kind), message in FIELD_MESSAGES.items():
        if error["type"] == kind and loc[-len(suffix):] == suffix:
            return message
    if error["type"] == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == api.NOT_A_FLAG_PATTERN:
        return "must not start with '-': vLLM would read it as a flag"
    return error["msg"]


def load_documents(text: str) -> list[Document]:
    """Parse YAML text holding one or more VLLMServer documents."""
    try:
        raw_docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "expected <block end>" in problem or "mapping values are not allowed" in problem:
            problem += " (check the indentation of this line against the lines above it)"
        elif "found character '\\t'" in problem:
            problem += " (YAML indents with spaces, not tabs)"
        if mark is not None:
            lines = text.splitlines()
            if 0 <= mark.line < len(lines) and lines[mark.line].strip():
                problem += f": {lines[mark.line].rstrip()!r}"
        return [Document(0, "", errors=[f"YAML error: {where}{problem}"])]
    docs = []
    for i, raw in enumerate(raw_docs):
        meta = raw.get("metadata") if isinstance(raw, dict) else None
        name = meta.get("name") or f"document {i + 1}" if isinstance(meta, dict) else f"document {i + 1}"
        if not isinstance(raw, dict):
            docs.append(Document(i, str(name), errors=["not a mapping: expected a VLLMServer object"]))
            continue
        if raw.get("kind") != api.KIND:
            docs.append(Document(i, str(name), errors=[f"kind is {raw.get('kind')!r}, expected {api.KIND}"]))
            continue
        docs.append(_document(i, str(name), raw))
    return docs


def _document(index: int, name: str, raw: dict[str, Any]) -> Document:
    """One mapping validated as the API server and the operator do: the CRD's schema (its bounds: lengths, entries,
    items, patterns) and the models (pydantic, with the CEL rules' equivalents). A field both refuse is named once,
    in the models' words."""
    errors: list[str] = []
    server = None
    try:
        # By the camelCase names only, as the API server reads them (it prunes spec.engine.extra_args).
        server = api.VLLMServer.model_validate(raw, by_alias=True, by_name=False)
    except pydantic.ValidationError as err:
        errors = format_validation_error(err, api.VLLMServer)
    named = {line.split(": ", 1)[0] for line in errors}
    # Where the models refused the document, the schema adds only the bounds they do not check themselves.
    errors += [f"{path}: {why}" for path, why in crd.schema_problems(raw, crd.BOUNDS if errors else ())
               if path not in named]
    return Document(index, name, server=None if errors else server, errors=errors)


def parse_spec(spec: dict[str, Any]) -> tuple[Optional[api.VLLMServerSpec], list[str]]:
    """Validate a spec dict from the API server (already schema-checked there, except extras)."""
    try:
        return api.VLLMServerSpec.model_validate(spec, by_alias=True, by_name=False), []
    except pydantic.ValidationError as err:
        return None, format_validation_error(err, api.VLLMServerSpec, prefix="spec")
