"""extraArgs against the image's vLLM release: which flag snapshot checks a server (`flag_check`, `FlagCheck`) and
`check_extra_args`, each flag token parsed, refused with its reason or its values checked."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .. import api, vllm_flags
from ..api import VLLMServerSpec
from .tables import (
    CAPACITY_FLAGS, CREDENTIAL_FLAGS, KNOWN_BAD_FLAGS, OWNED_FLAGS, UNSAFE_FLAGS, Problem, capacity_flag, reads_a_file,
)


@dataclass(frozen=True)
class FlagCheck:
    """Which vLLM release's flags check a server: the snapshot of the release its image's tag names (exact), or,
    for a release without one or an image whose tag names none, the nearest snapshot, loosely (vllm_flags)."""

    image: str
    release: Optional[str]
    """The release the image's tag names (None: it names none)."""
    snapshot: vllm_flags.Snapshot
    exact: bool
    unchecked: tuple[str, ...] = ()
    """extraArgs flags the snapshot does not know, passed to vLLM unchecked (loose only)."""

    def warning(self) -> Optional[str]:
        """Why the check was loose, for the plan's notes, the ExtraArgsUnchecked condition and the CLI."""
        if self.exact:
            return None
        have = vllm_flags.releases()
        known = f"vLLM {have[0]} to {have[-1]}" if len(have) > 1 else f"vLLM {have[0]}"
        what = (f"image {self.image} names no vLLM release in its tag" if self.release is None else
                f"image {self.image} runs vLLM {self.release}, which the operator has no flag snapshot of")
        out = (f"{what} (it has {known}'s), so extraArgs were checked loosely against vLLM {self.snapshot.version}'s "
               "flags: a flag or value only another release knows passes, derived flags and credentials stay "
               "refused")
        if self.unchecked:
            out += f"; passed unchecked: {', '.join(self.unchecked)}"
        if self.release is None:
            out += f". Name the release in the tag (vllm/vllm-openai:v{vllm_flags.VERSION}@sha256:...) for the " \
                   "strict check"
        return out


def flag_check(spec: VLLMServerSpec) -> FlagCheck:
    """Pure: the release the image names and the flag snapshot that checks the server's args."""
    release = image_vllm_version(spec.image)
    snap, exact = vllm_flags.snapshot_for(release)
    unchecked = () if exact else tuple(unchecked_extra_args(list(spec.engine.extra_args), snap))
    return FlagCheck(image=spec.image, release=release, snapshot=snap, exact=exact, unchecked=unchecked)


_IMAGE_VERSION = re.compile(r":v?(\d+\.\d+\.\d+(?:[.+-]?[0-9A-Za-z.]+)?)(?:@sha256:[0-9a-f]{64})?$")


def image_vllm_version(image: str) -> Optional[str]:
    """The vLLM release an image's tag names (vllm/vllm-openai:v0.33.1 -> 0.33.1), or None when it names none. A
    build variant after '-' or '+' (v0.32.0-cu130) is the same release; rc1, dev, post are other ones."""
    found = _IMAGE_VERSION.search(image.strip())
    return re.split(r"[-+]", found.group(1))[0] if found else None


def unchecked_extra_args(extra: list[str], snap: Optional[vllm_flags.Snapshot] = None) -> list[str]:
    """The extraArgs flags the flag snapshot does not know (passed unchecked for another vLLM release)."""
    return [flag for flag in (token.partition("=")[0] for token in extra)
            if flag.startswith("--") and _snapshot_flag(flag, snap)[2] is None]


def _snapshot_flag(flag: str, snap: Optional[vllm_flags.Snapshot] = None
                   ) -> tuple[str, Optional[str], Optional[vllm_flags.FlagInfo]]:
    """(normalised flag, its JSON-valued parent for a dotted key such as --compilation-config.mode, what the
    snapshot's parser knows of it, or None). `snap`: the default release's when not given."""
    normal = vllm_flags.normalise(flag)
    # --compilation-config.mode 3 sets one key of a JSON-valued flag (FlexibleArgumentParser).
    dotted = normal.split(".", 1)[0].rstrip("+") if normal.startswith("--") and "." in normal else None
    return normal, dotted, (snap or vllm_flags.snapshot()).flags.get(dotted or normal)


_NUMBER = re.compile(r"^-\.?[0-9]")


def _is_value(token: str) -> bool:
    """What argparse takes as an option's value: not a flag (negative numbers are values)."""
    return not token.startswith("-") or bool(_NUMBER.match(token))


def _values(extra: list[str], i: int, info: Optional[vllm_flags.FlagInfo]) -> list[str]:
    """The values that follow a flag from extra[i]: one, or, for a flag with nargs "+" (`--allowed-media-domains
    a b`), all up to the next flag. An unknown flag (info None) is taken to have one."""
    end = i
    while end < len(extra) and _is_value(extra[end]) and (end == i or (info is not None and info.multiple)):
        end += 1
    return extra[i:end]


@dataclass(frozen=True)
class _ExtraFlag:
    """One flag token of extraArgs, parsed: the flag as written, its '=value' if any, and what the snapshot knows."""

    flag: str
    """The flag as written (-O3 reads as --optimization-level)."""
    eq: str
    """"=" when the value was written inline (--seed=1), else ""."""
    inline: str
    """The inline value ("" when none)."""
    normal: str
    """The flag normalised (vllm_flags.normalise)."""
    dotted: Optional[str]
    """The JSON-valued parent of a dotted key (--compilation-config.mode -> --compilation-config), or None."""
    info: Optional[vllm_flags.FlagInfo]
    """What the snapshot's parser knows of it; None: it does not know it."""
    action: Optional[str]
    """The operator-owned flag this is another option string of (-tp: --tensor-parallel-size), or None."""
    capacity: Optional[str]
    """The capacity flag it is (capacity_flag), or None."""


def _parse_extra_flag(token: str, snap: vllm_flags.Snapshot) -> _ExtraFlag:
    """The parse: one flag token of extraArgs read against the snapshot."""
    flag, eq, inline = token.partition("=")
    if flag.startswith("-O") and not flag.startswith("--") and flag != "-O":  # -O3: --optimization-level 3
        flag, eq, inline = "--optimization-level", "=", flag[2:].lstrip("=") or inline
    normal, dotted, info = _snapshot_flag(flag, snap)
    # Another spelling of a flag the operator owns sets the same value: -tp, --device-memory-utilization,
    # --disable-prefix-caching (0.33) are the action's other option strings.
    action = info.action if info is not None and info.action in OWNED_FLAGS else None
    capacity = capacity_flag(flag, info.action if info is not None else "")
    return _ExtraFlag(flag, eq, inline, normal, dotted, info, action, capacity)


def _names_owned(f: _ExtraFlag) -> bool:
    """Whether the flag, as written, normalised or as the parent of a dotted key, is one the operator owns."""
    return f.normal in OWNED_FLAGS or f.flag in OWNED_FLAGS or bool(f.dotted and f.dotted in OWNED_FLAGS)


def _left_to_its_release(f: _ExtraFlag) -> bool:
    """The per-release snapshot check, loose: whether only the image's own parser could judge the flag (unknown
    to the snapshot, or known bad in it) and nothing else refuses it (owned, capacity, credential, file)."""
    return f.capacity is None and (f.info is None or f.normal in KNOWN_BAD_FLAGS or f.flag in KNOWN_BAD_FLAGS) \
        and f.normal not in CREDENTIAL_FLAGS and not _names_owned(f) and not reads_a_file(f.normal)


def _owned_refusal(f: _ExtraFlag, allow_unsafe: bool) -> Optional[str]:
    """The owned flags: why the operator's own flag may not be set (None for --host/--port under the escape
    hatch, the annotation: `allow_unsafe`)."""
    if f.normal in UNSAFE_FLAGS:
        if allow_unsafe:
            return None  # the escape hatch: the user owns the pod's address (docs/security.md)
        return (f"{f.flag} is fixed by the operator: {OWNED_FLAGS[f.normal]}. To set it anyway, annotate the "
                f"VLLMServer {api.ALLOW_UNSAFE_ARGS_ANNOTATION}: \"true\" (docs/security.md)")
    owner = OWNED_FLAGS.get(f.dotted or f.normal) or OWNED_FLAGS.get(f.flag) or OWNED_FLAGS[f.action or ""]
    if f.action and f.action != f.normal:
        return f"{f.flag} is vLLM's other name for {f.action}, which is derived by the operator; set {owner} " \
               "instead"
    return f"{f.flag} is derived by the operator; set {owner} instead"


def _refusal(f: _ExtraFlag, snap: vllm_flags.Snapshot, allow_unsafe: bool) -> Optional[str]:
    """Why extraArgs may not carry the flag, first reason first (known bad, capacity, credential, owned, reads a
    file, unknown to the snapshot), or None when it may."""
    if f.normal in KNOWN_BAD_FLAGS or f.flag in KNOWN_BAD_FLAGS:
        return f"{f.flag} {KNOWN_BAD_FLAGS.get(f.normal) or KNOWN_BAD_FLAGS[f.flag]}"
    if f.capacity is not None:
        return f"{f.flag} {CAPACITY_FLAGS[f.capacity]}"
    if f.normal in CREDENTIAL_FLAGS:
        return (f"{f.flag} takes a credential, which must not be written in the spec (anyone who can read the "
                f"VLLMServer could read it); {CREDENTIAL_FLAGS[f.normal]}")
    if f.normal in UNSAFE_FLAGS or _names_owned(f) or f.action:
        return _owned_refusal(f, allow_unsafe)
    if reads_a_file(f.normal):
        return (f"{f.flag} reads a file, whose contents would reach vLLM past the operator's checks (--config "
                "splices its flags in); set the flags themselves in extraArgs, or the spec's fields")
    if f.info is None:
        return f"vLLM {snap.version} has no flag {f.flag}: the server would exit with code 2 and crash-loop"
    return None


def _value_problems(f: _ExtraFlag, info: vllm_flags.FlagInfo, extra: list[str], i: int, where: str,
                    loose: bool) -> tuple[int, list[Problem]]:
    """The value checks of an accepted flag whose values start at extra[i]: the index after them, and what is
    wrong (a value missing or not wanted, one outside the choices unless `loose`)."""
    problems: list[Problem] = []
    flag = f.flag
    if f.dotted:
        if not f.eq:
            if i < len(extra) and _is_value(extra[i]):
                i += 1
            else:
                problems.append(Problem(where, f"{flag} needs a value"))
        return i, problems
    if f.eq:
        if not info.takes_value:
            problems.append(Problem(where, f"{flag} takes no value; write {flag} alone"))
        elif info.choices and f.inline not in info.choices and not loose:
            problems.append(Problem(where, f"{flag} {f.inline!r} is not one of {', '.join(info.choices)}"))
        return i, problems
    values = _values(extra, i, info) if info.takes_value else []
    if values:
        i += len(values)
        for value in values:
            if info.choices and value not in info.choices and not loose:
                problems.append(Problem(where, f"{flag} {value!r} is not one of {', '.join(info.choices)}"))
    elif info.takes_value and info.nargs_required:
        problems.append(Problem(where, f"{flag} needs a value"))
    return i, problems


def check_extra_args(extra: list[str], allow_unsafe: bool = False, loose: bool = False,
                     snapshot: Optional[vllm_flags.Snapshot] = None) -> list[Problem]:
    """Refuse flags vLLM does not have, flags the operator derives (or another spelling of one, such as
    --device-memory-utilization for --gpu-memory-utilization; --host/--port only with the escape-hatch
    annotation: `allow_unsafe`) and credentials as flag values (one problem per flag).

    `snapshot`: the flags of the image's vLLM release (the default release's when not given). `loose`: the image
    runs a release without a snapshot of its own: what only its parser can tell (a flag the snapshot lacks or has
    removed, a value outside its choices) is not refused, since that release may differ; what the operator owns
    and credentials still are."""
    snap = snapshot or vllm_flags.snapshot()
    problems: list[Problem] = []
    i = 0
    while i < len(extra):
        token = extra[i]
        where = f"spec.engine.extraArgs[{i}]"
        i += 1
        if _is_value(token):
            problems.append(Problem(where, f"{token!r} is not a flag; extraArgs holds flags and their values, "
                                    "like ['--seed', '1']"))
            continue
        f = _parse_extra_flag(token, snap)
        if loose and _left_to_its_release(f):
            if not f.eq and i < len(extra) and _is_value(extra[i]):
                i += len(_values(extra, i, f.info))
            continue
        refusal = _refusal(f, snap, allow_unsafe)
        if refusal:
            problems.append(Problem(where, refusal))
            # The refused flag's value(s) go with it; do not report them again as "not a flag".
            if not f.eq and (f.info is None or f.info.takes_value):
                i += len(_values(extra, i, f.info))
            continue
        assert f.info is not None
        i, found = _value_problems(f, f.info, extra, i, where, loose)
        problems += found
    return problems
