"""The checkout passes the linter ([tool.ruff]: no unused or undefined names) and the type checker ([tool.mypy])
configured in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_checkout_is_clean():
    result = ruff("operator", "tests", "e2e", "tools", "bench", "conftest.py")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_linter_notices_an_unused_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    result = ruff("--config", str(ROOT / "pyproject.toml"), str(bad))
    assert result.returncode == 1 and "F401" in result.stdout


def mypy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", "/dev/null", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_package_type_checks():
    """mypy as configured in pyproject.toml ([tool.mypy], pydantic's plugin) finds nothing in the package."""
    result = mypy()
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_type_checker_notices_a_wrong_type(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def half(n: int) -> int:\n    return n / 2\n")
    result = mypy("--config-file", str(ROOT / "pyproject.toml"), str(bad))
    assert result.returncode == 1 and "Incompatible return value" in result.stdout
