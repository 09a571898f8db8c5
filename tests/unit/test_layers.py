"""The layers hold (docs/architecture.md): which part of the package may import which, checked on the source.

    pure core   api, catalog (models, config.json, GPUs), planner, validation, builders, the escape-hatch checks, ...:
                data in, data out; no network, no threads, no metrics registry at import
    sources     model facts (the Hub, configURL), vLLM's metrics, the fetch rules; the path that resolves a
                model and plans it
    runtime     the kube client, informers, kopf adaptations, controller, autoscaler, telemetry
    entry       the CLI, the operator's main, the generators

An import only goes up this list (an entry point may import anything, the pure core only the pure core), and
within the runtime only along RUNTIME_EDGES. The walk reads every import of every module, those inside
functions too, so a lazy import cannot hide an edge.
"""

from __future__ import annotations

import ast
import re
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "vllm_operator"

#: Each part of the package (a top-level module or subpackage of vllm_operator; "" is the package itself) and its
#: layer. A part missing here fails test_every_part_has_a_layer: a new module says where it belongs.
LAYERS: dict[str, str] = {
    "": "core", "api": "core", "catalog": "core", "planner": "core", "validation": "core",
    "builders": "core", "postbuild": "core", "escape_hatches": "core", "podsecurity": "core", "strategic_merge": "core",
    "conditions": "core", "server_status": "core", "documents": "core", "bounds": "core",
    "urlpolicy": "core", "vllm_flags": "core", "crd": "core", "adapters": "core",
    "sources": "sources", "pipeline": "sources", "chattemplate": "sources",
    "kube": "runtime", "telemetry": "runtime", "informers": "runtime", "kopfext": "runtime",
    "controller": "runtime", "autoscaler": "runtime", "peering": "runtime",
    "cli": "entry", "operator_main": "entry", "generate": "entry",
}
ORDER = ("core", "sources", "runtime", "entry")
#: Within the runtime, who may import whom (besides itself): the kube client is the base; informers and the kopf
#: adaptations never import the controller; the autoscaler never imports the controller.
RUNTIME_EDGES: dict[str, set[str]] = {
    "telemetry": set(),
    "kube": {"telemetry"},
    "informers": {"kube"},
    "kopfext": {"kube", "telemetry"},
    "peering": {"kube"},
    "autoscaler": {"kube", "telemetry", "informers"},
    "controller": {"kube", "telemetry", "informers", "autoscaler"},
}
#: Libraries the pure core never imports: the cluster, the network, metrics, processes.
NOT_IN_CORE = ("kubernetes", "kopf", "prometheus_client", "aiohttp", "huggingface_hub", "httpx2", "httpcore2",
               "urllib.request", "http", "socket", "ssl", "subprocess", "threading", "concurrent")
#: What `import` of the pure core's entry points may load, run in a fresh interpreter.
CORE_IMPORTS = ("vllm_operator.api", "vllm_operator.planner", "vllm_operator.builders", "vllm_operator.validation",
                "vllm_operator.catalog", "vllm_operator.catalog.gpus", "vllm_operator.crd", "vllm_operator.documents",
                "vllm_operator.escape_hatches", "vllm_operator.postbuild", "vllm_operator.server_status")


def part_of(module: str) -> str:
    """The part a dotted module name of the package belongs to ('vllm_operator.sources.hub' -> 'sources')."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every module `path` imports (absolute dotted names; `from x import y` counts x.y when y is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            submodules = {f"{origin}.{alias.name}" for alias in node.names}
            submodules = {m for m in submodules if _is_module(m)}
            found |= submodules if len(submodules) == len(node.names) else submodules | {origin}
    return found


def _is_module(dotted: str) -> bool:
    if not dotted.startswith("vllm_operator."):
        return False
    rel = Path(*dotted.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def edges() -> dict[str, set[tuple[str, str]]]:
    """{importing module: {(imported part, imported module)}} over the package's own modules."""
    out: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        own = {(part_of(m), m) for m in imports(path) if m == "vllm_operator" or m.startswith("vllm_operator.")}
        out[module_name(path)] = own
    return out


def test_every_part_has_a_layer():
    parts = {part_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert parts - set(LAYERS) == set(), "new parts of the package: give them a layer in LAYERS"
    assert set(LAYERS) - parts == set(), "LAYERS names parts that are gone"


def test_imports_only_go_up_the_layers():
    wrong = []
    for module, imported in edges().items():
        mine = part_of(module)
        for part, target in imported:
            if part == mine:
                continue
            if ORDER.index(LAYERS[part]) > ORDER.index(LAYERS[mine]):
                wrong.append(f"{module} ({LAYERS[mine]}) imports {target} ({LAYERS[part]})")
            elif LAYERS[mine] == LAYERS[part] == "runtime" and part not in RUNTIME_EDGES[mine]:
                wrong.append(f"{module} imports {target}: {mine} may import only {sorted(RUNTIME_EDGES[mine])}")
    assert not wrong, "\n".join(wrong)


def test_no_cycle_between_parts():
    graph: dict[str, set[str]] = {}
    for module, imported in edges().items():
        graph.setdefault(part_of(module), set()).update(p for p, _ in imported if p != part_of(module))
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            part = todo.pop()
            assert part != start, f"{start} reaches itself through its imports"
            if part not in seen:
                seen.add(part)
                todo.extend(graph.get(part, ()))


def test_the_pure_core_imports_no_runtime_library():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if LAYERS[part_of(module)] != "core":
            continue
        for name in imports(path):
            if any(name == lib or name.startswith(lib + ".") for lib in NOT_IN_CORE):
                wrong.append(f"{module} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_layer_walk_sees_a_forbidden_import(tmp_path, monkeypatch):
    """The check can fail: a core module that imports the controller inside a function is caught."""
    package = tmp_path / "vllm_operator"
    (package / "controller").mkdir(parents=True)
    (package / "controller" / "__init__.py").write_text("")
    (package / "controller" / "reconcile.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "planner.py").write_text("def f():\n    from .controller import reconcile\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert imports(package / "planner.py") == {"vllm_operator.controller.reconcile"}
    try:
        test_imports_only_go_up_the_layers()
    except AssertionError as e:
        assert "vllm_operator.planner (core) imports vllm_operator.controller" in str(e)
    else:
        raise AssertionError("the walk missed planner -> controller")


def test_importing_the_pure_core_loads_no_runtime_and_registers_no_metric():
    """In a fresh interpreter: `vllm-operator plan`'s core loads no runtime or sources module, no cluster, network
    or metrics library; importing telemetry itself registers no metric (the operator registers them in run())."""
    code = ("import json, sys\n"
            f"for m in {list(CORE_IMPORTS)!r}: __import__(m)\n"
            "core = sorted(sys.modules)\n"
            "import prometheus_client\n"
            "before = {m.name for m in prometheus_client.REGISTRY.collect()}\n"
            "import vllm_operator.telemetry\n"
            "after = {m.name for m in prometheus_client.REGISTRY.collect()}\n"
            "print(json.dumps([core, sorted(after - before)]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    loaded, registered = json.loads(out)
    ours = [m for m in loaded if m == "vllm_operator" or m.startswith("vllm_operator.")]
    assert ours and all(LAYERS[part_of(m)] == "core" for m in ours), [m for m in ours
                                                                      if LAYERS[part_of(m)] != "core"]
    assert not [m for m in loaded if any(m == lib or m.startswith(lib + ".") for lib in NOT_IN_CORE
                                         if lib not in ("http", "socket", "ssl", "threading", "concurrent"))]
    assert registered == []


def test_the_architecture_page_shows_this_table():
    """docs/architecture.md's import table is this file's LAYERS and RUNTIME_EDGES, row for row."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (core|sources|runtime|entry) \| (.*?) *\|$", text, flags=re.M)
    assert {part: layer for part, layer, _ in rows} == {p: layer for p, layer in LAYERS.items() if p}
    assert {part: set(re.findall(r"`(\w+)`", edges)) for part, layer, edges in rows if layer == "runtime"} == \
        RUNTIME_EDGES
