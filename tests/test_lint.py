"""The checkout passes the linter configured in pyproject.toml ([tool.ruff]): no unused or undefined names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_checkout_is_clean():
    result = ruff("operator", "tests", "tools", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_linter_notices_an_unused_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    result = ruff("--config", str(ROOT / "pyproject.toml"), str(bad))
    assert result.returncode == 1 and "F401" in result.stdout
