"""Model facts: a model's architecture from the catalog, its config.json (a URL, the Hugging Face Hub with its
safetensors metadata: ``hub.py``, or for the CLI only a file its `--model-config` names) and the ``spec.model.architecture`` overrides, in
that order of precedence. The one module of the planning path that does I/O.

:func:`fetch_config` and ``hub.lookup`` can be replaced by the caller, and :class:`ConfigCache` can keep their
answers; :func:`read_config_file` is for the offline CLI only: in the operator a config.json comes over http(s)
or not at all, since the operator's own files are none of a tenant's business.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import pydantic

from . import fetch as net
from . import hub
from ..api import ModelArchitecture, ModelSpec
from ..catalog.config import _out_of_range, architecture_from_config
from ..catalog.models import (ARCH_FIELDS, CAMEL, HUB_ADVICE, ResolvedModel, UnknownModelError, _catalog_source,
                              _estimate, lookup_model)

#: The largest config.json read. Real ones are under 100 KB (most under 10 KB; the long ones list
#: id2label maps or quantization ignore lists), so 1 MiB is ten times that, and parsing 1 MiB of the
#: worst JSON for memory (empty objects) peaks at tens of MB, where 16 MiB of it peaked at 454 MiB RSS.
MAX_CONFIG_BYTES = 2**20


def fetch_config(url: str, *, timeout: float = 5.0) -> dict[str, Any]:
    """A config.json from an http(s) URL, within `timeout` seconds in all (ValueError with a category else).

    Through vllm_operator.fetch: no redirect, a total deadline, MAX_CONFIG_BYTES, and errors that quote nothing
    the server sent, since the URL is a tenant's (spec.model.configURL) and the operator's network is not."""
    try:
        body = net.get(url, seconds=timeout, max_bytes=MAX_CONFIG_BYTES, accept="application/json",
                         use_proxy=True)
    except net.FetchError as err:
        raise ValueError(f"could not fetch config.json from {url}: {err}") from None
    return _config_object(body, url)


def read_config_file(path: str) -> dict[str, Any]:
    """A config.json from a file or a directory holding one: for the offline CLI only (the operator never
    reads its own files for a tenant)."""
    path = path[len("file://"):] if path.startswith("file://") else path
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ValueError(f"could not read config.json at {path}: {err.strerror or err}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"config.json at {path}: {net.too_large(MAX_CONFIG_BYTES)}")
    return _config_object(raw, path)


def _config_object(raw: bytes, where: str) -> dict[str, Any]:
    try:
        data = net.load_json(raw)
    except net.FetchError as err:
        raise ValueError(f"config.json at {where}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config.json at {where}: not a JSON object")
    return data


class ConfigCache:
    """The architecture each config.json gave, per (URL, revision), so that a reconcile does not fetch it again.

    Facts are kept `ttl` seconds. When a refetch fails, the last good facts stand in, with a note (a Hub
    outage must not turn running servers invalid), and a failed URL is tried again after `retry` seconds,
    not at every reconcile (one that answers slowly would cost a deadline each time). The `max_entries`
    most recently used are kept: the URLs are the tenants' to choose."""

    @dataclass(frozen=True)
    class _Entry:
        architecture: Any = None
        fetched_at: float = 0.0
        error: Optional[str] = None
        failed_at: float = 0.0

    def __init__(self, ttl: float = 600.0, retry: float = 60.0, max_entries: int = 1024,
                 clock: Callable[[], float] = time.time):
        self.ttl, self.retry, self.max_entries, self._clock = ttl, retry, max_entries, clock
        self._entries: OrderedDict[tuple[str, Optional[str]], ConfigCache._Entry] = OrderedDict()
        self._lock = threading.Lock()

    def facts(self, url: str, revision: Optional[str], load: Callable[[], Any]) -> tuple[Any, str]:
        """What `load` gave (an architecture, or the Hub's facts) and, when it is the last good one standing in, a
        note saying so. ValueError
        when no fetch of this URL has succeeded (the same one again until the retry is due)."""
        key, now = (url, revision), self._clock()
        entry = self._get(key)
        if entry.architecture is not None and now - entry.fetched_at < self.ttl:
            return entry.architecture, ""
        if entry.error is None or now - entry.failed_at >= self.retry:
            try:
                architecture = load()
            except ValueError as err:
                entry = self._put(key, dataclasses.replace(entry, error=str(err), failed_at=now))
            else:
                self._put(key, self._Entry(architecture, now))
                return architecture, ""
        if entry.architecture is None:
            raise ValueError(entry.error)
        fetched = dt.datetime.fromtimestamp(entry.fetched_at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return entry.architecture, f"warning: {entry.error}; planned with the facts it gave at {fetched}"

    def _get(self, key: tuple[str, Optional[str]]) -> "ConfigCache._Entry":
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        return entry or self._Entry()

    def _put(self, key: tuple[str, Optional[str]], entry: "ConfigCache._Entry") -> "ConfigCache._Entry":
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return entry


def hf_config_url(model_name: str, revision: Optional[str], endpoint: str) -> str:
    """The URL of a model's config.json on a Hugging Face compatible endpoint."""
    rev = urllib.parse.quote(revision or "main", safe="")
    return f"{endpoint.rstrip('/')}/{model_name.strip('/')}/resolve/{rev}/config.json"


# --------------------------------------------------------------------------- resolve
def _given(arch: Optional[ModelArchitecture]) -> dict[str, Any]:
    if arch is None:
        return {}
    return {k: getattr(arch, k) for k in ARCH_FIELDS if getattr(arch, k) is not None}


def resolve_model(
    model: ModelSpec,
    *,
    hf_endpoint: Optional[str] = None,
    fetch: Callable[[str], dict[str, Any]] = fetch_config,
    local_config: Optional[str] = None,
    cache: Optional[ConfigCache] = None,
    hub_lookup: Callable[..., hub.HubFacts] = hub.lookup,
    hf_token: Union[str, bool, None] = False,
) -> ResolvedModel:
    """Combine catalog, config.json and spec into a complete architecture.

    Precedence, lowest to highest: the catalog entry; the config.json (from `local_config`, a file or directory
    on this machine the CLI's --model-config names, never the spec; from
    ``spec.model.configURL``; or from the Hub at ``hf_endpoint`` when the
    model is not in the catalog, with the exact parameter count of its safetensors metadata
    (`hub_lookup`, sending `hf_token`: hub.lookup's token); each field given under
    ``spec.model.architecture``.
    Then the derivable fields are filled and listed in ``estimated``. Raises
    UnknownModelError when the result is still too incomplete to plan with, and
    ValueError when an explicitly requested config.json cannot be read. `cache` keeps
    fetched facts (ConfigCache) and may answer with older ones and a note.
    """
    facts = _Facts()
    in_catalog = _from_catalog(facts, model)
    _from_config(facts, model, hf_endpoint, in_catalog, fetch, local_config, cache, hub_lookup, hf_token)
    _from_spec(facts, model)
    estimated = _derive_shapes(facts.fields)
    _refuse_incomplete(model.name, facts, estimated)
    if facts.fetch_problem:  # planned all the same, from the spec: say what the lookup cost and how to skip it
        facts.notes = (*facts.notes, f"{facts.fetch_problem}; planned from spec.model.architecture. {HUB_ADVICE}")
    if facts.from_hub and facts.fields.get("parameter_count") and not _spec_counts(model):
        facts.notes = (*facts.notes, _exact_count_note(facts.fields))
    _estimate_the_rest(model.name, facts.fields, estimated)
    return _resolved(model, facts, estimated)


@dataclass
class _Facts:
    """What resolve_model has gathered so far: the fields, lowest precedence first, and where they came from."""

    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    sources: list[str] = dataclasses.field(default_factory=list)
    notes: tuple[str, ...] = ()
    #: why a config.json the spec did not name could not be read (a detail of an incomplete architecture)
    fetch_problem: str = ""
    from_hub: bool = False
    stored_weight_bytes: Optional[int] = None


def _from_catalog(facts: _Facts, model: ModelSpec) -> bool:
    """1. The catalog entry, if the model has one (whether it has)."""
    entry = lookup_model(model.name)
    if entry is None:
        return False
    facts.fields.update(_given(entry))
    facts.sources.append(f"catalog ({_catalog_source(model.name)})")
    return True


def _from_config(facts: _Facts, model: ModelSpec, hf_endpoint: Optional[str], in_catalog: bool,
                 fetch: Callable[[str], dict[str, Any]], local_config: Optional[str], cache: Optional[ConfigCache],
                 hub_lookup: Callable[..., hub.HubFacts], hf_token: Union[str, bool, None]) -> None:
    """2. The config.json: the CLI's --model-config, spec.model.configURL, or the Hub with the safetensors
    metadata for a model outside the catalog. A config.json explicitly named that cannot be read raises."""
    config_location, explicit = _config_location(model, hf_endpoint, in_catalog, local_config)
    facts.from_hub = config_location is not None and not explicit and hf_endpoint is not None
    if config_location is None:
        return
    try:
        if facts.from_hub:
            assert hf_endpoint is not None
            from_the_hub, note = _hub_architecture(model, hf_endpoint, hub_lookup, hf_token, cache)
            from_config, facts.stored_weight_bytes = from_the_hub.architecture, from_the_hub.stored_weight_bytes
        else:
            from_config, note = _config_architecture(config_location, model.revision, fetch,
                                                     config_location == local_config, cache)
    except ValueError as err:
        if explicit:
            raise
        facts.fetch_problem = str(err)
        return
    facts.fields.update(_given(from_config))
    facts.sources.append(f"Hub ({config_location}: config.json, safetensors metadata)" if facts.from_hub
                         else f"config.json ({config_location})")
    facts.notes = (note,) if note else ()


def _from_spec(facts: _Facts, model: ModelSpec) -> None:
    """3. Each field given under spec.model.architecture."""
    spec_fields = _given(model.architecture)
    if spec_fields:
        facts.fields.update(spec_fields)
        facts.sources.append("spec")


def _derive_shapes(fields: dict[str, Any]) -> list[str]:
    """4. The shapes the others give unambiguously (KV heads, head size, hidden size); the names of those derived."""
    estimated: list[str] = []
    heads = fields.get("num_attention_heads")
    if heads and not fields.get("num_kv_heads"):
        fields["num_kv_heads"] = heads
        estimated.append("num_kv_heads")
    if heads and fields.get("hidden_size") and not fields.get("head_dim") and fields["hidden_size"] % heads == 0:
        fields["head_dim"] = fields["hidden_size"] // heads
        estimated.append("head_dim")
    if heads and fields.get("head_dim") and not fields.get("hidden_size"):
        fields["hidden_size"] = heads * fields["head_dim"]
        estimated.append("hidden_size")
    return estimated


def _refuse_incomplete(name: str, facts: _Facts, estimated: list[str]) -> None:
    """5. UnknownModelError naming what is still missing to plan with."""
    fields = facts.fields
    heads = fields.get("num_attention_heads")
    missing = [CAMEL[k] for k in ("num_layers", "num_attention_heads", "hidden_size", "max_position_embeddings")
               if not fields.get(k)]
    if heads and fields.get("hidden_size") and not fields.get("head_dim"):
        missing.append(CAMEL["head_dim"])  # hidden_size is not a multiple of the head count
    if not fields.get("vocab_size") and (fields.get("parameter_count") or fields.get("intermediate_size")):
        missing.append(CAMEL["vocab_size"])
    elif not fields.get("parameter_count") and not (fields.get("vocab_size") and fields.get("intermediate_size")):
        absent = [CAMEL[k] for k in ("vocab_size", "intermediate_size") if not fields.get(k)]
        missing.append(f"{' and '.join(absent)} (or {CAMEL['parameter_count']})")
    if missing:
        if "num_kv_heads" in estimated or not heads:
            missing.append(f"{CAMEL['num_kv_heads']} (optional; defaults to {CAMEL['num_attention_heads']})")
        raise UnknownModelError(name, missing, facts.fetch_problem)


def _spec_counts(model: ModelSpec) -> bool:
    """Whether the spec gives the parameter count itself."""
    return bool(model.architecture and model.architecture.parameter_count)


def _estimate_the_rest(name: str, fields: dict[str, Any], estimated: list[str]) -> None:
    """6. The parameter count from the shapes, or the MLP width back-solved from it; the dtype."""
    if not fields.get("parameter_count"):
        fields["parameter_count"] = _estimate(fields)
        estimated.append("parameter_count")
    elif not fields.get("intermediate_size"):
        # Back-solve the MLP width from the parameter count (used for activation estimates only).
        without_mlp = _estimate({**fields, "intermediate_size": 0})
        per_unit = 3 * fields["hidden_size"] * fields["num_layers"] * (fields.get("num_experts") or 1)
        width = (fields["parameter_count"] - without_mlp) // per_unit
        if width < 1:
            raise UnknownModelError(name, [CAMEL["intermediate_size"]],
                                    "parameterCount is too small for the other shapes")
        fields["intermediate_size"] = width
        estimated.append("intermediate_size")
    if not fields.get("torch_dtype"):
        fields["torch_dtype"] = "bfloat16"
        estimated.append("torch_dtype")


def _resolved(model: ModelSpec, facts: _Facts, estimated: list[str]) -> ResolvedModel:
    """7. The architecture, validated against the API's bounds, and where it came from."""
    sources = facts.sources
    if not sources:
        source = "spec"
    elif sources[-1] == "spec" and len(sources) > 1:
        source = "spec over " + " over ".join(reversed(sources[:-1]))
    else:
        source = " over ".join(reversed(sources))
    try:
        architecture = ModelArchitecture.model_validate(facts.fields)
    except pydantic.ValidationError as err:  # an estimate beyond the API's bounds: the spec has to give it
        raise UnknownModelError(model.name, _out_of_range(err), "estimated beyond the API's bounds") from None
    # the spec's count is what the spec wants sized
    stored_weight_bytes = None if _spec_counts(model) else facts.stored_weight_bytes
    return ResolvedModel(architecture=architecture, source=source, estimated=tuple(estimated), notes=facts.notes,
                         stored_weight_bytes=stored_weight_bytes)


def _config_location(model: ModelSpec, hf_endpoint: Optional[str], in_catalog: bool,
                     local_config: Optional[str]) -> tuple[Optional[str], bool]:
    """Where the model's config.json is, if anywhere, and whether it was named (a failure is then the user's to
    fix; a Hugging Face endpoint's is only a detail of an incomplete architecture). A spec's model.name is never
    read as a local directory: the operator cannot read one, so `plan` does not either (--model-config does)."""
    if local_config:
        return local_config, True
    if model.config_url:
        return model.config_url, True
    if hf_endpoint and not in_catalog:
        return f"{hf_endpoint.rstrip('/')}/{model.name.strip('/')}", False
    return None, True


#: safetensors dtypes the Hub counts -> the config.json dtype they are (for a config.json without torch_dtype).
_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


@dataclass(frozen=True)
class _HubArchitecture:
    architecture: ModelArchitecture
    stored_weight_bytes: Optional[int]


def _hub_architecture(model: ModelSpec, endpoint: str, lookup: Callable[..., hub.HubFacts],
                      token: Union[str, bool, None], cache: Optional[ConfigCache]) -> tuple[_HubArchitecture, str]:
    """The architecture the Hub gives (config.json and the safetensors metadata), and a note when older facts stand
    in for it. The Hub's parameter count is the checkpoint's exact one when its weights are stored unpacked (16 or
    32 bits, fp8): a 4-bit checkpoint's count is of packed elements (an AWQ int32 holds eight weights), so there
    the shapes' estimate stays."""

    def load() -> _HubArchitecture:
        try:
            facts = lookup(model.name, model.revision, endpoint=endpoint, token=token)
        except hub.HubError as err:
            raise ValueError(f"the Hub at {endpoint}: {err}") from None
        architecture = _facts(facts.config, f"{endpoint}/{model.name}")
        update: dict[str, Any] = {}
        if facts.total and architecture.quantization in ("none", "fp8"):
            update["parameter_count"] = facts.total
        if architecture.torch_dtype is None and facts.parameters:
            dominant = max(facts.parameters, key=facts.parameters.__getitem__)
            update["torch_dtype"] = _SAFETENSORS_DTYPES.get(dominant)
        try:
            return _HubArchitecture(ModelArchitecture.model_validate({**_given(architecture), **_given_values(update)}),
                                    facts.stored_bytes)
        except pydantic.ValidationError as err:
            raise ValueError(f"the Hub at {endpoint}: out of range: {', '.join(_out_of_range(err))}") from None

    key = f"hub:{endpoint.rstrip('/')}/{model.name}"
    return cache.facts(key, model.revision, load) if cache is not None else (load(), "")


def _given_values(update: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in update.items() if v is not None}


def _exact_count_note(fields: dict[str, Any]) -> str:
    """The Hub's exact count beside what the shapes give: the planner sized the weights with the exact one."""
    exact = fields["parameter_count"]
    shapes = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size",
              "vocab_size")
    if not all(fields.get(k) for k in shapes):
        return f"weights sized with the Hub's exact parameter count {exact:,} (safetensors metadata)"
    derived = _estimate(fields)
    return (f"weights sized with the Hub's exact parameter count {exact:,} (safetensors metadata); config.json's "
            f"shapes give {derived:,} ({(derived - exact) / exact:+.2%})")


def _config_architecture(location: str, revision: Optional[str], fetch: Callable[[str], dict[str, Any]],
                         local: bool, cache: Optional[ConfigCache]) -> tuple[ModelArchitecture, str]:
    """The architecture a config.json gives, and a note when older facts stand in for it. `local`: the CLI's
    --model-config, a file of this machine."""
    if local:
        return _facts(read_config_file(location), location), ""

    def load() -> ModelArchitecture:
        return _facts(fetch(location), location)

    return cache.facts(location, revision, load) if cache is not None else (load(), "")


def _facts(config: dict[str, Any], location: str) -> ModelArchitecture:
    try:
        return architecture_from_config(config)
    except ValueError as err:
        raise ValueError(f"config.json at {location}: {err}") from None
