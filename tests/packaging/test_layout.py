"""The tree tells the architecture (docs/DESIGN.md, "Layout"): the pipeline's stages are folders. Which stage may
import which is pyproject.toml's import-linter contracts, run here; the rest (packages installed, no import
cycle, module size, the lab out of the product's wheel) is checked here from the code itself."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = "kubectl_meshdoctor"
PLUGINS = "kubectl_meshdoctor_plugins"  # the top-level plugins/ folder, installed under this name
MAX_LINES = 500

LAB, LAB_PACKAGE = "lab", "meshdoctor_lab"  # the pod lab: a distribution of its own in lab/
# Which stage may import which is import-linter's to check: the contracts are in pyproject.toml.


def _modules() -> dict[str, Path]:
    """Every module of the product and of the lab by its dotted name (plugins under their installed name)."""
    out = {}
    for base in (ROOT, ROOT / LAB):
        for path in sorted((base / (PACKAGE if base == ROOT else LAB_PACKAGE)).rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        parts = (PLUGINS, *path.relative_to(ROOT / "plugins").with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The absolute names ``name`` imports, anywhere in its body, those for annotations only (TYPE_CHECKING)
    included: two modules that need each other's names are one module in two files, whenever Python reads them."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


@pytest.mark.parametrize("project, package", [(ROOT, PACKAGE), (ROOT / LAB, LAB_PACKAGE)])
def test_every_package_is_installed(project, package):
    """pyproject lists its packages by hand (plugins/ is installed under another name): none may be missing.
    The product's lists none of the lab's, the lab's none of the product's."""
    listed = set(tomllib.loads((project / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"
                and (name.split(".")[0] == LAB_PACKAGE) == (package == LAB_PACKAGE)}
    # A folder of modules without __init__.py would be left out of the wheel without a word.
    folders = {p.parent for p in MODULES.values()}
    assert [str(f.relative_to(ROOT)) for f in sorted(folders) if not (f / "__init__.py").exists()] == []
    assert packages - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - packages == set()


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


def test_no_module_name_is_used_twice():
    """A traceback or a grep names a module by its file name: across the product, its detectors and the lab,
    each name (but a package's __init__ and __main__) is one module."""
    by_name: dict[str, list[str]] = {}
    for dotted, path in MODULES.items():
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, []).append(dotted)
    assert {name: where for name, where in by_name.items() if len(where) > 1} == {}


def test_the_top_level_is_the_design_card():
    for entry in ("pyproject.toml", "kubectl_meshdoctor", "plugins", "tests", "krew-manifest.yaml"):
        assert (ROOT / entry).exists(), entry


def lint_imports(pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    """import-linter over pyproject.toml's contracts (the product, its detectors and the lab, installed)."""
    env = {**os.environ, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    # Run from ``pythonpath`` itself: `python -c` puts its working directory first on sys.path.
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()",
                           "--no-cache", "--config", str(ROOT / "pyproject.toml")], cwd=pythonpath or ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_layout_contracts_are_kept():
    proc = lint_imports()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " broken" in proc.stdout and "0 broken" in proc.stdout


@pytest.mark.parametrize("module, importing, contract", [
    ("kubectl_meshdoctor/core/oops.py", "import meshdoctor_lab.lab", "the product imports nothing of the pod lab"),
    ("kubectl_meshdoctor/frontends/oops.py", "from kubectl_meshdoctor.kube import client",
     "front ends and reports show findings"),
    ("plugins/oops.py", "from kubectl_meshdoctor_plugins import stale_keepalive", "none imports another"),
])
def test_a_broken_layout_rule_fails_the_contracts(tmp_path, module, importing, contract):
    """The contracts can fail: the product and its detectors, copied, with one import that breaks a rule, found
    before the installed ones (PYTHONPATH)."""
    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "plugins", tmp_path / PLUGINS, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / module.replace("plugins/", PLUGINS + "/")
    target.write_text(importing + "\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]
    broken = [line for line in proc.stdout.splitlines() if line.endswith("BROKEN")]
    assert len(broken) == 1 and contract in broken[0], proc.stdout[-3000:]


def test_the_products_wheel_holds_no_lab(tmp_path):
    """`pip install .` installs the product alone: its wheel holds no module of the lab."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                           "--wheel-dir", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("kubectl_meshdoctor-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith(f"{PACKAGE}/core/") for n in names) and any(n.startswith(f"{PLUGINS}/") for n in names)
    assert [n for n in names if LAB_PACKAGE in n or "/lab/" in n or n.startswith("lab/")] == []
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "kubectl_meshdoctor.commands" not in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_no_name_with_a_leading_underscore_is_imported_from_another_module():
    """A name another module imports is its module's interface; a leading underscore says the opposite."""
    bad = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                bad += [f"{name}: from {'.' * node.level}{node.module or ''} import {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == []
