"""The import layering of ``swarm_runtime``: a core module (``swarm_runtime/*.py``) imports only the
subpackages below it, read from the source (ast, lazy imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "swarm_runtime"

#: The subpackages, lowest first: each builds on those before it (policy < rollout < train < rlcr, ...).
SUBPACKAGES = {"policy": 1, "cluster": 1, "rollout": 2, "train": 3, "rlcr": 4, "experiments": 4, "serve": 4}
#: The highest subpackage each core module may import; 0: none (the base every subpackage imports).
#: The wiring at the top (the command line, the built-in registrations, the conformance kit) imports any.
TOP = max(SUBPACKAGES.values())
CORE = {
    "episode": SUBPACKAGES["rollout"],
    "evaluate": SUBPACKAGES["rollout"],
    "deploy": SUBPACKAGES["rollout"],
    "run": SUBPACKAGES["rollout"],
    "cli": TOP,
    "builtins": TOP,
    "testing": TOP,
}


def imported_subpackages(path: Path) -> set[str]:
    """The ``swarm_runtime`` subpackages ``path`` imports anywhere (top level or inside a function)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [node.module]
            if isinstance(node, ast.ImportFrom) and node.module and not node.level
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        for name in names:
            parts = name.split(".")
            if parts[0] == "swarm_runtime" and len(parts) > 1 and parts[1] in SUBPACKAGES:
                out.add(parts[1])
        if isinstance(node, ast.ImportFrom) and node.module == "swarm_runtime" and not node.level:
            out |= {a.name for a in node.names if a.name in SUBPACKAGES}
    return out


def core_modules() -> list[Path]:
    return sorted(PKG.glob("*.py"))


def test_the_layers_name_every_subpackage():
    """A new subpackage gets a layer (else the test below would not see imports of it)."""
    found = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert found == set(SUBPACKAGES), f"give {sorted(found ^ set(SUBPACKAGES))} a layer in SUBPACKAGES"


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: p.stem)
def test_core_module_imports_no_subpackage_above_it(path):
    allowed = CORE.get(path.stem, 0)
    above = sorted(s for s in imported_subpackages(path) if SUBPACKAGES[s] > allowed)
    assert not above, (
        f"swarm_runtime/{path.name} imports {above}, above its layer ({allowed}): move what it "
        "needs down into a core module"
    )


def test_the_walk_sees_lazy_and_top_level_imports(tmp_path):
    """The check can fail: an import inside a function counts, and so does ``from swarm_runtime import train``."""
    src = tmp_path / "m.py"
    src.write_text(
        "import os\nfrom swarm_runtime.config import ConfigError\n"
        "def f():\n    from swarm_runtime.train.optim import master_weights\n"
        "from swarm_runtime import rlcr\nimport swarm_runtime.serve.gateway\n"
    )
    assert imported_subpackages(src) == {"train", "rlcr", "serve"}


def imported_modules(path: Path) -> set[str]:
    """Every ``swarm_runtime`` module ``path`` imports, by its dotted name."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.startswith("swarm_runtime.")}


def test_validation_does_not_import_the_config():
    """One direction only: the config imports its validation, never the other way round (no import circle)."""
    assert "swarm_runtime.validation" in imported_modules(PKG / "config.py")
    for below in ("validation", "errors", "schemes", "masters"):
        assert "swarm_runtime.config" not in imported_modules(PKG / f"{below}.py"), below
