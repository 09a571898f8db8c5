"""`make demo` (tools/demo.sh) says what it does from its first second and installs only when it must (issue 20
item 6: it printed nothing for 34 s, a quiet `pip install` on every run).

The script runs as written, in a copy of the repository's layout whose .venv/bin/python and tools/kube-build.sh
record what they are asked instead of installing and building (the real ones take minutes): what is under test is
the script's order of words and work.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$RECORD"
if [[ "$1" == "-c" ]]; then [[ -f "$(dirname "$0")/installed" ]]; exit; fi
if [[ "$*" == *"pip install"* ]]; then touch "$(dirname "$0")/installed"; fi
"""


def demo_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "repo"
    (tree / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "demo.sh", tree / "tools" / "demo.sh")
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    (tree / "tools" / "kube-build.sh").write_text('echo "kube-build" >> "$RECORD"\n')
    python = tree / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tree


def run_demo(tree: Path, record: Path) -> tuple[list[tuple[float, str]], list[str]]:
    """(each line the script printed with the seconds since it started, what it ran)."""
    record.write_text("")
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", str(tree / "tools" / "demo.sh"), "--once"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "RECORD": str(record)})
    assert proc.stdout is not None
    lines = [(time.monotonic() - t0, line.rstrip()) for line in proc.stdout]
    assert proc.wait(timeout=60) == 0
    return lines, record.read_text().splitlines()


def test_make_demo_speaks_first_and_installs_only_when_pyproject_changed(tmp_path):
    tree, record = demo_tree(tmp_path), tmp_path / "record"
    lines, ran = run_demo(tree, record)
    assert lines[0][1].startswith("== make demo:") and lines[0][0] < 5.0  # before any install or build
    assert any("installing vllm-operator" in line for _, line in lines)
    assert [r for r in ran if "pip install" in r] and ran[-1] == "python -m tools.demo --once"
    lines, ran = run_demo(tree, record)  # up to date: no pip at all
    assert not [r for r in ran if "pip" in r] and any("up to date" in line for _, line in lines)
    assert "kube-build" in ran and ran[-1] == "python -m tools.demo --once"
    (tree / "pyproject.toml").write_text((tree / "pyproject.toml").read_text() + "\n# changed\n")
    _, ran = run_demo(tree, record)
    assert [r for r in ran if "pip install" in r]
