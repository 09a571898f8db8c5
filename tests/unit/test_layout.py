"""The README's layout table lists every module of the package, and names no path that is gone."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "vllm_operator"


def listed() -> set[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Layout")
    table = text[start:text.index("\n## ", start + 1)]
    return set(re.findall(r"^\| `([^`]+)`", table, flags=re.M))


def test_every_module_is_in_the_layout_table():
    paths = listed()
    missing = []
    for module in sorted(PACKAGE.rglob("*.py")):
        if module.name == "__init__.py" and module.parent == PACKAGE:
            continue
        rel = module.relative_to(ROOT).as_posix()
        # a module is listed by itself or by its subpackage's row (catalog/, autoscaler/)
        if rel not in paths and not any(p.endswith("/") and rel.startswith(p) for p in paths):
            if module.name != "__init__.py" or f"{module.parent.relative_to(ROOT).as_posix()}/" not in paths:
                missing.append(rel)
    # subpackage __init__ files are listed through their modules
    missing = [m for m in missing if not m.endswith("/__init__.py")]
    assert not missing, f"README's layout table lacks {missing}"


def test_every_listed_path_exists():
    gone = [p for p in listed() if not (ROOT / p).exists()]
    assert not gone, f"README's layout table names paths that are gone: {gone}"
