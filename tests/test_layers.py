"""The structure of ``swarm_runtime``, read from the source (ast; imports inside functions count too):
no import circle among its modules, and a core (``swarm_runtime/core``) that imports nothing outside itself
and no torch, Ray or HTTP library. docs/layout.md describes the layout these checks keep."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "swarm_runtime"
#: Libraries the core may not import: it is the method's arithmetic and the loop, pure Python.
HEAVY = ("torch", "transformers", "peft", "ray", "deepspeed", "httpx", "httpcore", "fastapi", "uvicorn", "vllm")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(pkg: Path = PKG, root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(pkg.rglob("*.py")) if "__pycache__" not in p.parts}


def imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``path`` (module ``name``) imports anywhere, by dotted name. ``from a import
    b`` counts as an import of ``a.b`` where that is a module, else of ``a``; a package's ``__init__`` is not
    counted as imported by its own submodules (importing ``a.b.c`` runs ``a.b``'s ``__init__`` first, by
    Python's rules, not by choice)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != name and not name.startswith(n + "."):
                out.add(n)
    return out


def graph(pkg: Path = PKG, root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(pkg, root)
    return {m: imports(p, m, known) for m, p in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``edges``: its strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    found = circles(graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            out |= {id(x) for stmt in node.body for x in ast.walk(stmt)}
    return out


def core_imports(pkg: Path = PKG, root: Path = ROOT) -> list[tuple[str, str]]:
    """(core module, what it imports that it may not): a module of the package outside the core, or a heavy
    library (an import under ``if TYPE_CHECKING:``, for annotations, is never run and not counted)."""
    top_name = pkg.name
    core = f"{top_name}.core"
    bad = []
    for m, p in modules(pkg, root).items():
        if not (m == core or m.startswith(core + ".")):
            continue
        tree = ast.parse(p.read_text())
        skip = type_checking_only(tree)
        for node in ast.walk(tree):
            names = []
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module] + (
                    [f"{node.module}.{a.name}" for a in node.names] if node.module == top_name else []
                )
            elif isinstance(node, ast.ImportFrom) and node.level:
                bad.append((m, "a relative import"))
            for n in names:
                top = n.split(".")[0]
                if top in HEAVY or (top == top_name and n != top_name and not (n == core or n.startswith(core + "."))):
                    bad.append((m, n))
    return bad


def test_the_core_imports_only_itself():
    bad = core_imports()
    assert not bad, "the core imports outside itself: " + ", ".join(f"{m} -> {n}" for m, n in bad)


def test_the_core_loads_without_torch(tmp_path):
    """Importing every core module leaves torch unimported (checked in a fresh interpreter)."""
    import subprocess
    import sys

    names = [m for m in modules() if m.startswith("swarm_runtime.core")]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in names)
        + f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("case", ["circle", "core"])
def test_the_checks_can_fail(tmp_path, case):
    """A made-up package with a circle (``a`` -> ``b`` -> ``a``, the second import inside a function), and a core
    module importing outside the core: both are found."""
    pkg = tmp_path / "pkg"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "core" / "c.py").write_text("import torch\n\n\ndef g():\n    from pkg.a import f\n")
    if case == "circle":
        assert circles(graph(pkg, tmp_path)) == [["pkg.a", "pkg.b"]]
    else:
        assert core_imports(pkg, tmp_path) == [("pkg.core.c", "torch"), ("pkg.core.c", "pkg.a")]
