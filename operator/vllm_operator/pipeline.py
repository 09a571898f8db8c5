"""Read VLLMServer documents and run them through catalog -> planner, the same way offline and in-cluster.

`load_documents` turns YAML text into validated servers or one readable line per error;
`plan_server` resolves the model and GPU (the only step that may do I/O: a config.json
fetch) and calls the pure planner.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import pydantic
import yaml

from . import api, catalog, chattemplate, hatches, planner
from .sources import model_facts
from .urlpolicy import URLPolicy
from .validation import Problem


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


def _message(error: Any) -> str:
    """pydantic's message, in words for the one pattern whose reason it cannot say."""
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
        try:
            # By the camelCase names only, as the API server reads them (it prunes spec.engine.extra_args).
            docs.append(Document(i, str(name), server=api.VLLMServer.model_validate(raw, by_alias=True,
                                                                                    by_name=False)))
        except pydantic.ValidationError as err:
            docs.append(Document(i, str(name), errors=format_validation_error(err, api.VLLMServer)))
    return docs


def parse_spec(spec: dict[str, Any]) -> tuple[Optional[api.VLLMServerSpec], list[str]]:
    """Validate a spec dict from the API server (already schema-checked there, except extras)."""
    try:
        return api.VLLMServerSpec.model_validate(spec, by_alias=True, by_name=False), []
    except pydantic.ValidationError as err:
        return None, format_validation_error(err, api.VLLMServerSpec, prefix="spec")


#: Where a quantized checkpoint's name departs from its base model's: Qwen2.5-32B-Instruct-AWQ,
#: Meta-Llama-3.1-8B-Instruct-AWQ-INT4, ...-GPTQ-Int8, ...-FP8-Dynamic, ...-bnb-4bit.
_QUANTIZED_SUFFIX = re.compile(
    r"[-_.](awq|gptq|fp8|int4|int8|w4a16|w8a8|w4a8|bnb|4bit|8bit|nf4|gguf)(?![a-z0-9]).*$", re.IGNORECASE
)


def quantized_base_name(name: str) -> Optional[str]:
    """The catalog model a quantized checkpoint was made from, when its name says so.

    Quantization changes the weights, not the architecture, so e.g. Qwen/Qwen2.5-32B-Instruct-AWQ
    is planned with Qwen/Qwen2.5-32B-Instruct's shapes (and model.quantization sizes the weights).
    """
    match = _QUANTIZED_SUFFIX.search(name)
    if match is None or match.start() == 0:
        return None
    base = name[: match.start()]
    for candidate in (base, base.rsplit("/", 1)[-1]):  # another org re-publishes: try the bare name too
        if catalog.lookup_model(candidate) is not None:
            return candidate
    return None


def plan_server(
    name: str,
    namespace: str,
    spec: api.VLLMServerSpec,
    *,
    hf_endpoint: Optional[str] = None,
    fetch: Callable[..., dict] = model_facts.fetch_config,
    default_prometheus_url: Optional[str] = None,
    allow_unsafe_args: bool = False,
    local_files: bool = False,
    configs: Optional[model_facts.ConfigCache] = None,
    urls: Optional[URLPolicy] = None,
    hf_token: Union[str, bool, None] = False,
) -> planner.Plan:
    """Resolve model and GPU, then plan. Never raises for bad input: problems land in the plan.

    `allow_unsafe_args`: api.allows_unsafe_args(metadata), the escape hatch for --host/--port in extraArgs.
    `local_files`: a model directory or config.json path is read from this machine (the CLI; never the
    operator). `configs`: the operator's cache of fetched config.json facts. `urls`: the operator's URL
    settings: a configURL outside them is a problem, and is not fetched. `hf_endpoint`: the Hub a model outside the
    catalog is looked up on (None: none, offline); `hf_token`: the token sent to it (hub.lookup's `token`)."""
    model_error = None
    model_error_field = "spec.model.architecture"
    base = None
    resolving: dict[str, Any] = {"hf_endpoint": hf_endpoint, "fetch": fetch, "local_files": local_files,
                                 "cache": configs, "hf_token": hf_token}
    refused = urls.config_problem(spec.model.config_url) if urls and spec.model.config_url else None
    try:
        if refused:
            raise ValueError(refused)
        model = model_facts.resolve_model(spec.model, **resolving)
    except catalog.UnknownModelError as exc:
        model, model_error = None, str(exc)
        base = quantized_base_name(spec.model.name)
        if base is not None:
            try:
                resolved = model_facts.resolve_model(spec.model.model_copy(update={"name": base}), **resolving)
            except ValueError:
                pass
            else:
                # The base model's facts, not the checkpoint's: its quantization (none) says nothing of this one.
                model, model_error = dataclasses.replace(
                    resolved, source=f"{resolved.source}, base model of the quantized checkpoint {spec.model.name}",
                    architecture=resolved.architecture.model_copy(update={"quantization": None}),
                ), None
    except ValueError as exc:
        # an explicitly named config.json that cannot be read: the field that named it is at fault
        model, model_error = None, str(exc)
        model_error_field = "spec.model.configURL" if spec.model.config_url else "spec.model.name"
    plan = planner.plan(name, namespace, spec, model, model_error=model_error, model_error_field=model_error_field,
                        default_prometheus_url=default_prometheus_url, allow_unsafe_args=allow_unsafe_args,
                        urls=urls)
    if model is not None:
        plan.notes.extend(model.notes)
    if spec.engine.chat_template:
        why = chattemplate.problem(spec.engine.chat_template)  # in a child process, limited (chattemplate.py)
        if why:
            plan.problems.append(Problem("spec.engine.chatTemplate", why))
    if model is not None and base is not None and spec.model.quantization == "none":
        plan.notes.append(f"{spec.model.name} looks like a quantized checkpoint of {base}, but model.quantization is "
                          "none: its weights were sized as 16-bit; set model.quantization (e.g. awq_marlin) to size "
                          "them right")
    # Last: the final pod template (after spec.podTemplatePatch) is checked once everything else fits.
    plan.problems.extend(hatches.problems(plan))
    return plan
