"""The tree tells the architecture (docs/DESIGN.md, "Layout"): the pipeline's stages are folders, and which stage
may import which is checked here, from the code's own import statements (function-level ones included)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "kubectl_meshdoctor"
PLUGINS = "kubectl_meshdoctor_plugins"  # the top-level plugins/ folder, installed under this name
MAX_LINES = 500

# Stage -> the stages (and adapters) it must never import. The core knows no tshark, cluster or screen.
FORBIDDEN = {
    "core": ("sources", "live", "sinks", "commands", "kube", "lab", "lint", "istio", "cli", PLUGINS),
    # A detector needs only the core and Envoy's formats (envoy/ parses, it does no I/O): not even another
    # detector (each file declares all it needs).
    PLUGINS: ("sources", "live", "sinks", "commands", "kube", "lab", "lint", "istio", "cli", PLUGINS),
    # Bytes and lines in, events out: the cluster is reached by live/ alone.
    "sources": ("live", "sinks", "commands", "kube", "lab", "cli", PLUGINS),
    # The live capture: the pod's script, the pump, the dissector, the sidecar link, the kernel counters.
    "live": ("sinks", "commands", "lab", "lint", "cli", PLUGINS),
    "sinks": ("sources", "live", "commands", "kube", "lab", "cli", PLUGINS),
    "envoy": ("core", "sources", "live", "sinks", "commands", "kube", "lab", "lint", "istio", "cli", PLUGINS),
    "kube": ("core", "sources", "live", "sinks", "commands", "lab", "lint", "istio", "cli", "envoy", PLUGINS),
    "istio": ("sources", "live", "sinks", "commands", "kube", "lab", "lint", "cli", PLUGINS),
    "lint": ("sources", "live", "sinks", "commands", "kube", "lab", "cli", PLUGINS),
    # Leaves every stage may use: the one reader of capture file headers, children that die with us.
    "pcap_header": ("core", "sources", "live", "sinks", "commands", "kube", "lab", "lint", "istio", "cli", "envoy",
                    "children", "private_dirs", PLUGINS),
    "children": ("core", "sources", "live", "sinks", "commands", "kube", "lab", "lint", "istio", "cli", "envoy",
                 "pcap_header", "private_dirs", PLUGINS),
}
THIRD_PARTY_FORBIDDEN = {
    "core": ("pyshark", "kubernetes", "textual", "rich", "aiohttp", "dpkt"),
    PLUGINS: ("pyshark", "kubernetes", "textual", "rich", "aiohttp", "dpkt"),
}


def _modules() -> dict[str, Path]:
    """Every module of the product by its dotted name (plugins under their installed name)."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        parts = (PLUGINS, *path.relative_to(ROOT / "plugins").with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The absolute names ``name`` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}  # for annotations only, never at run time
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            # `from pkg import module` imports the module
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)
    return found


def _stage(module: str) -> str:
    if module.startswith(PLUGINS):
        return PLUGINS
    parts = module.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 else parts[0]


def test_every_package_is_installed():
    """pyproject lists its packages by hand (plugins/ is installed under another name): none may be missing."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    # A folder of modules without __init__.py would be left out of the wheel without a word.
    folders = {p.parent for p in MODULES.values()}
    assert [str(f.relative_to(ROOT)) for f in sorted(folders) if not (f / "__init__.py").exists()] == []
    assert packages - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - packages == set()


@pytest.mark.parametrize("stage", sorted(FORBIDDEN))
def test_stage_imports_only_what_it_may(stage):
    bad = []
    for name, path in MODULES.items():
        if _stage(name) != stage:
            continue
        for imported in _imports(name, path):
            top = imported.split(".")[0]
            if (imported.startswith(PACKAGE + ".") or top == PLUGINS) and _stage(imported) in FORBIDDEN[stage]:
                bad.append(f"{name} imports {imported}")
            if top in THIRD_PARTY_FORBIDDEN.get(stage, ()):
                bad.append(f"{name} imports {imported}")
    assert bad == []


def test_the_lab_imports_nothing_of_the_product():
    """The lab is a place the product is tried on, an extra: it must run without the product's modules."""
    bad = [f"{name} imports {imported}" for name, path in MODULES.items() if _stage(name) == "lab"
           for imported in _imports(name, path)
           if imported.split(".")[0] in (PACKAGE, PLUGINS) and _stage(imported) not in ("lab",)
           and imported != PACKAGE]
    assert bad == []


def test_no_import_cycle():
    graph = {name: {i for i in _imports(name, path) if i in MODULES and i != name}
             for name, path in MODULES.items()}
    # A package's __init__ imported by its own submodule is Python's doing, not a cycle of ours.
    for name, deps in graph.items():
        deps -= {p for p in deps if name.startswith(p + ".")}
    cycles, index, low, stack, on = [], {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_module_over_500_lines():
    paths = list(MODULES.values()) + sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
    long = {str(p.relative_to(ROOT)): n for p in paths if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_top_level_is_the_design_card():
    for entry in ("pyproject.toml", "kubectl_meshdoctor", "plugins", "tests", "krew-manifest.yaml"):
        assert (ROOT / entry).exists(), entry
