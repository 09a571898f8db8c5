"""The path from a VLLMServer spec to its plan and children, the same offline (`plan`, `render`) and in the
reconciler: `build_server` resolves the model (sources/model_facts.py: the only step that may do I/O, a config.json
or Hub lookup), calls the pure planner, then builds and checks the children (postbuild.py: the pod template built
once, checked against the escape hatches' rules).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Optional, Union


from . import adapters, api, catalog, chattemplate, escape_hatches, planner, postbuild
from .sources import hub, model_facts
from .urlpolicy import URLPolicy
from .validation import Problem


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


def adapter_facts(spec: api.VLLMServerSpec, hf_endpoint: Optional[str],
                  configs: Optional[model_facts.ConfigCache] = None,
                  read: Callable[..., Any] = hub.file_json) -> dict[str, adapters.AdapterFacts]:
    """Each spec.adapters entry's adapter_config.json facts (adapters.parse_config): read from the Hub (`read`,
    bounded; kept in `configs` between reconciles like config.json), or why not (a path in the pods' cache, no
    Hub endpoint, a failed read), by adapter name."""
    out: dict[str, adapters.AdapterFacts] = {}
    for a in spec.adapters:
        if not api.is_hub_model(a.source):
            out[a.name] = adapters.AdapterFacts(error="is a path in the pod, which the planner cannot read")
            continue
        if not hf_endpoint:
            out[a.name] = adapters.AdapterFacts(error="was not read (offline: no Hub endpoint)")
            continue
        endpoint = hf_endpoint

        def load(source: str = a.source, revision: Optional[str] = a.revision) -> adapters.AdapterFacts:
            facts = adapters.parse_config(read(source, "adapter_config.json", revision, endpoint=endpoint))
            if facts.error:
                raise ValueError(facts.error.removeprefix("adapter_config.json "))
            return facts

        try:
            if configs is None:
                out[a.name] = load()
            else:
                out[a.name], _ = configs.facts(hub.file_url(a.source, "adapter_config.json", a.revision, endpoint),
                                               a.revision, load)
        except ValueError as err:
            out[a.name] = adapters.AdapterFacts(error=str(err))
    return out


def plan_server(name: str, namespace: str, spec: api.VLLMServerSpec, **options: Any) -> planner.Plan:
    """The plan of build_server (its `options`), with every problem its steps found."""
    return build_server(name, namespace, spec, **options).plan


def build_server(
    name: str,
    namespace: str,
    spec: api.VLLMServerSpec,
    *,
    owner: Optional[dict[str, Any]] = None,
    prepare: Optional[Callable[[list[dict[str, Any]]], list[dict[str, Any]]]] = None,
    hf_endpoint: Optional[str] = None,
    fetch: Callable[..., dict] = model_facts.fetch_config,
    default_prometheus_url: Optional[str] = None,
    allow_unsafe_args: bool = False,
    local_config: Optional[str] = None,
    configs: Optional[model_facts.ConfigCache] = None,
    urls: Optional[URLPolicy] = None,
    hf_token: Union[str, bool, None] = False,
    chat_template: Callable[[str], Optional[str]] = chattemplate.problem,
    read_file: Callable[..., Any] = hub.file_json,
    hf_token_repos: Optional[tuple[str, ...]] = None,
) -> postbuild.Built:
    """Resolve model and GPU, plan, then build and check the children (postbuild.build_and_check: `owner` owns
    them, `prepare` is what the caller does to them before sending). Never raises for bad input: problems land
    in the plan, and then there are no children.

    `allow_unsafe_args`: api.allows_unsafe_args(metadata), the escape hatch for --host/--port in extraArgs.
    `local_config`: a config.json (or a directory holding one) of this machine that gives the model's facts in
    place of configURL and the Hub (the CLI's --model-config; never the operator). `configs`: the operator's cache
    of fetched config.json facts. `urls`: the operator's URL settings: a configURL outside them is a problem, and is
    not fetched. `chat_template`: why a chat template cannot be used (chattemplate.problem; the operator's Checker,
    which may raise chattemplate.Queued). `hf_endpoint`: the Hub a model outside the catalog is looked up on (None:
    none, offline); `hf_token`: the token sent to it (hub.lookup's `token`), only for the repos `hf_token_repos`
    names (hub.token_for; None: any, the CLI's own token).
    `read_file`: how a small JSON file of a Hub repo is read (the adapters' adapter_config.json; hub.file_json)."""
    resolving: dict[str, Any] = {"hf_endpoint": hf_endpoint, "fetch": fetch, "local_config": local_config,
                                 "cache": configs, "hf_token": hub.token_for(spec.model.name, hf_token, hf_token_repos)}
    found = _resolve(spec, resolving, urls, local_config, hf_token, hf_token_repos)
    facts = adapter_facts(spec, hf_endpoint, configs, read=read_file) if spec.adapters else {}
    plan = planner.plan(name, namespace, spec, found.model, model_error=found.error,
                        model_error_field=found.error_field, default_prometheus_url=default_prometheus_url,
                        allow_unsafe_args=allow_unsafe_args, urls=urls, adapter_facts=facts)
    _after_plan(plan, spec, found, chat_template)
    return postbuild.build_and_check(plan, owner, prepare)


@dataclasses.dataclass(frozen=True)
class _Resolution:
    """The model's facts as plan_server found them, or why not (the error and the field at fault), and the base
    model a quantized checkpoint's name points to (None: not looked for, or the name points to none)."""

    model: Optional[catalog.ResolvedModel]
    error: Optional[str] = None
    error_field: str = "spec.model.architecture"
    base: Optional[str] = None


def _resolve(spec: api.VLLMServerSpec, resolving: dict[str, Any], urls: Optional[URLPolicy],
             local_config: Optional[str], hf_token: Union[str, bool, None],
             hf_token_repos: Optional[tuple[str, ...]]) -> _Resolution:
    """The resolve step: the model's facts (model_facts.resolve_model with `resolving`), those of the base model
    when an unknown name is a quantized checkpoint's, or why there are none."""
    refused = urls.config_problem(spec.model.config_url) if urls and spec.model.config_url else None
    try:
        if refused:
            raise ValueError(refused)
        return _Resolution(model_facts.resolve_model(spec.model, **resolving))
    except catalog.UnknownModelError as exc:
        base = quantized_base_name(spec.model.name)
        model = _resolve_base(spec, base, resolving, hf_token, hf_token_repos) if base is not None else None
        return _Resolution(model, None if model is not None else str(exc), base=base)
    except ValueError as exc:
        # an explicitly named config.json that cannot be read: the field that named it is at fault
        return _Resolution(None, str(exc), "--model-config" if local_config else "spec.model.configURL"
                           if spec.model.config_url else "spec.model.name")


def _resolve_base(spec: api.VLLMServerSpec, base: str, resolving: dict[str, Any], hf_token: Union[str, bool, None],
                  hf_token_repos: Optional[tuple[str, ...]]) -> Optional[catalog.ResolvedModel]:
    """The facts of `base`, the model a quantized checkpoint was made from, under the checkpoint's name and
    without the base's quantization (none, which says nothing of the checkpoint's); None when it cannot be
    resolved."""
    try:
        resolving["hf_token"] = hub.token_for(base, hf_token, hf_token_repos)
        resolved = model_facts.resolve_model(spec.model.model_copy(update={"name": base}), **resolving)
    except ValueError:
        return None
    return dataclasses.replace(
        resolved, source=f"{resolved.source}, base model of the quantized checkpoint {spec.model.name}",
        architecture=resolved.architecture.model_copy(update={"quantization": None}),
    )


def _after_plan(plan: planner.Plan, spec: api.VLLMServerSpec, found: _Resolution,
                chat_template: Callable[[str], Optional[str]]) -> None:
    """The checks after the plan, into it: the model's notes, the chat template, a quantized checkpoint planned
    as 16-bit, and last the typed fields of the escape hatches (the final pod template is checked once it is
    built: postbuild.py)."""
    model, base = found.model, found.base
    if model is not None:
        plan.notes.extend(model.notes)
    if spec.engine.chat_template:
        why = chat_template(spec.engine.chat_template)  # in a child process, limited (chattemplate.py)
        if why:
            plan.problems.append(Problem("spec.engine.chatTemplate", why))
    if model is not None and base is not None and spec.model.quantization == "none":
        plan.notes.append(f"{spec.model.name} looks like a quantized checkpoint of {base}, but model.quantization is "
                          "none: its weights were sized as 16-bit; set model.quantization (e.g. awq_marlin) to size "
                          "them right")
    plan.problems.extend(escape_hatches.spec_problems(plan.spec))
