"""What produced a results file: library versions and the code's commit.

Every ``eval.json`` (``swarm run``, ``swarm eval``) and experiment ``results.json`` carries
:func:`versions` under ``"versions"``, so a figure that does not reproduce can be traced to a
library release (an unpinned transformers release once changed a documented figure) or to the
code that ran; the printed footers show :func:`versions_line`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

#: Distributions whose versions a result depends on (the package's own comes first).
LIBRARIES = ("torch", "transformers", "peft")
PACKAGE = "swarm-runtime"
NOT_INSTALLED = "not installed"
#: Environment variable naming the code's commit where git cannot tell (a ``git archive`` export, an sdist).
COMMIT_ENV = "SWARM_COMMIT"
#: What the printed outputs say, instead of a commit, for code that is not a git checkout.
NOT_A_CHECKOUT = "not a git checkout"


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


def code_commit(where: Path | None = None) -> str | None:
    """``git rev-parse --short HEAD`` of the checkout this package runs from, with ``+dirty`` when
    tracked files differ from it; ``None`` outside a checkout (an installed wheel), when git is
    missing, or when the package merely sits inside some other repository."""
    pkg = Path(where or Path(__file__).resolve().parents[1])  # the swarm_runtime package folder
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=pkg, capture_output=True, text=True, timeout=10
        )
        if top.returncode or Path(top.stdout.strip()).resolve() != pkg.parent.resolve():
            return None
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=pkg, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        if not head:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=pkg,
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


@lru_cache(maxsize=1)
def versions() -> dict[str, str | None]:
    """``python``, ``torch``, ``transformers``, ``peft`` (``"not installed"`` when absent), the
    package's own version (``swarm_runtime.__version__``: that of the code that ran, which an installed
    distribution's metadata need not be) and ``commit``: :func:`code_commit`, else the
    ``SWARM_COMMIT`` environment variable (set it where the code is no git checkout: a ``git archive``
    export, an sdist), else ``None``."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    out.update({name: _dist_version(name) for name in LIBRARIES})
    from swarm_runtime import __version__

    out[PACKAGE] = __version__
    out["commit"] = code_commit() or given_commit()
    return out


#: What ``SWARM_COMMIT`` may hold: a git commit hash, short or full, optionally marked ``+dirty``.
COMMIT_PATTERN = re.compile(r"[0-9a-f]{7,40}(\+dirty)?")


def given_commit() -> str | None:
    """The commit ``SWARM_COMMIT`` names (``None`` when unset or blank); anything but a hash of 7-40 hex
    digits (``+dirty`` allowed) is a :class:`~swarm_runtime.config.load.ConfigError` naming the value, so a
    typo or a branch name is never written into results as if it were a commit."""
    value = os.environ.get(COMMIT_ENV, "").strip()
    if not value:
        return None
    if not COMMIT_PATTERN.fullmatch(value.lower()):
        from swarm_runtime.config.errors import ConfigError

        raise ConfigError(
            f"{COMMIT_ENV}={value!r} is not a commit: give the hash of the code's commit, 7 to 40 hex "
            f"digits (optionally with +dirty), e.g. {COMMIT_ENV}=$(git rev-parse --short HEAD), or unset it"
        )
    return value.lower()


def pin() -> dict[str, str | None]:
    """Record :func:`versions` now, when a run or an experiment starts: they are read once per process
    (cached), and a long run must carry the commit of the code it loaded, not the one the checkout
    has moved to by the time it writes its results."""
    return versions()


def commit_text(v: dict | None = None) -> str:
    """The code's commit as printed: ``commit 853edf0``, or ``not a git checkout`` (the versions say
    which release ran; ``SWARM_COMMIT`` names the commit there)."""
    v = versions() if v is None else v
    return f"commit {v['commit']}" if v.get("commit") else NOT_A_CHECKOUT


def versions_line(v: dict | None = None) -> str:
    """One short line: ``versions: python 3.12.3, torch 2.13.0, ... swarm-runtime 0.1.0 (commit 853edf0)``,
    or ``... swarm-runtime 0.1.0 (not a git checkout)``."""
    v = versions() if v is None else v
    libs = ", ".join(f"{k} {v[k]}" for k in ("python", *LIBRARIES, PACKAGE) if k in v)
    return f"versions: {libs} ({commit_text(v)})"


def stamp(path: Path) -> bool:
    """Add ``"versions"`` to the JSON object in ``path`` (a trainer's ``eval.json``) when it has none;
    written atomically. ``False`` when there is no such file."""
    from swarm_runtime.runs.outputs import write_json

    path = Path(path)
    if not path.is_file():
        return False
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "versions" not in data:
        data["versions"] = versions()
        write_json(path, data)
    return True
