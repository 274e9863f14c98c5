"""What a run folder holds that the runtime wrote, and where its files may lead.

- The manifest (:data:`MANIFEST`): the top-level names the runtime wrote in a run folder (``config.yaml``,
  ``metrics.jsonl``, ``checkpoints``, ``tb``, the plots, ``eval-*.json`` ...), each recorded when it is
  written (:func:`claim`). ``overwrite=true`` deletes those names and nothing else, and refuses a folder
  holding anything more (:func:`foreign`), naming it: a folder of the user's own files (their
  ``config.yaml``, their plots) is never emptied because its names look like a run's.
- Links: the runtime's own files in a run folder (its top-level names, everything under
  ``checkpoints/``) must not lead out of it (:func:`check_links`): a ``metrics.jsonl`` or ``run.log``
  linked to a user's file would be truncated or appended to, a ``checkpoints/latest`` linked to a file
  elsewhere would be read. Such a link is an error naming it; nothing is read or written through it.
"""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path

from swarm_runtime.config.errors import ConfigError

#: The manifest's file name in a run folder.
MANIFEST = ".swarm-manifest.json"
#: Names a run writes at the top of its folder (patterns): a user's file of such a name is refused, never replaced.
RUN_FILES = (
    "config.yaml",
    "config.*.yaml",
    "metrics.jsonl",
    "run.log",
    "eval.json",
    "eval.md",
    "eval-*.json",
    "*.png",
    "tb",
    "checkpoints",
)
#: Kept by the runtime itself while it holds the folder (never deleted by overwrite, never foreign).
_OWN = (MANIFEST, ".lock")


def owned(run_dir: Path) -> set[str]:
    """The names the manifest of ``run_dir`` lists (empty without one, or when it is not a manifest)."""
    path = Path(run_dir) / MANIFEST
    if path.is_symlink() or not path.is_file():
        return set()
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return set()
    names = data.get("files") if isinstance(data, dict) else None
    return (
        {n for n in names if isinstance(n, str) and n and "/" not in n and n not in (".", "..")}
        if isinstance(names, list)
        else set()
    )


def _write(run_dir: Path, names: set[str]) -> None:
    path = Path(run_dir) / MANIFEST
    tmp = path.with_name(f"{MANIFEST}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.write_text(json.dumps({"files": sorted(names)}, indent=1))
    os.replace(tmp, path)


def start(run_dir: Path, empty: bool = False) -> None:
    """Give ``run_dir`` a manifest (kept as it is when it has one, unless ``empty``: a fresh start)."""
    path = Path(run_dir) / MANIFEST
    if empty or not path.is_file() or path.is_symlink():
        _write(run_dir, set())


def claim(path: Path) -> Path:
    """Record ``path`` (a file or folder at the top of a run folder) in its folder's manifest, when
    that folder has one (experiment folders and sub-runs have none: nothing to do). Returns ``path``."""
    path = Path(path)
    folder = path.parent
    if (folder / MANIFEST).is_file():
        names = owned(folder)
        if path.name not in names:
            _write(folder, names | {path.name})
    return path


def is_own(name: str, names: set[str]) -> bool:
    """Whether the top-level ``name`` is the runtime's: listed, the manifest or lock, or a temporary
    file of a listed one (``.config.yaml.tmp``)."""
    if name in names or name in _OWN or name == f"{MANIFEST}.tmp":
        return True
    return name.startswith(".") and name.endswith(".tmp") and name[1:-4] in names


def foreign(run_dir: Path) -> list[str]:
    """The top-level entries of ``run_dir`` the runtime did not write (not in its manifest)."""
    names = owned(run_dir)
    return sorted(p.name for p in Path(run_dir).iterdir() if not is_own(p.name, names))


def run_named(run_dir: Path) -> list[str]:
    """Entries of ``run_dir`` named like a run's files (:data:`RUN_FILES`) that the manifest does not list:
    a fresh run would overwrite or append to them."""
    names = owned(run_dir)
    return sorted(
        p.name
        for p in Path(run_dir).iterdir()
        if not is_own(p.name, names) and any(fnmatch.fnmatch(p.name, pat) for pat in RUN_FILES)
    )


def shown(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def inside(root: Path, path: Path) -> bool:
    """Whether ``path`` (links followed) lies in ``root`` (links followed)."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
        return True
    except (ValueError, OSError, RuntimeError):
        return False


def check_link(run_dir: Path, path: Path) -> None:
    """Refuse ``path`` when it is a link that leads out of ``run_dir`` (or a link loop)."""
    path = Path(path)
    if path.is_symlink() and not inside(run_dir, path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise ConfigError(
            f"{path} is a link to {target!r}, outside the run folder {str(run_dir)!r}; swarm neither "
            "reads nor writes through it: delete the link (or copy the file into the run folder)"
        )


def check_links(run_dir: Path) -> None:
    """Refuse a run folder whose own files lead out of it: each top-level entry named like a run's file
    (:data:`RUN_FILES`, the manifest), and every entry under ``checkpoints/``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    for p in run_dir.iterdir():
        if p.name in _OWN or any(fnmatch.fnmatch(p.name, pat) for pat in RUN_FILES):
            check_link(run_dir, p)
    ckpts = run_dir / "checkpoints"
    if ckpts.is_dir() and not ckpts.is_symlink():
        for top, dirs, files in os.walk(ckpts, followlinks=False):
            for name in dirs + files:
                check_link(run_dir, Path(top) / name)


#: Where a running ``swarm serve`` names the checkpoints it serves (its versions), so that a run training in the same
#: folder (the closed loop: docs/guides/serve.md) does not prune them from under it (:func:`serving_checkpoints`).
SERVING = Path("serve") / "serving.json"


def write_serving(run_dir: Path, pid: int, folders) -> None:
    """Say (atomically) that process ``pid`` serves the checkpoint ``folders`` of ``run_dir``."""
    path = Path(run_dir) / SERVING
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": int(pid), "checkpoints": sorted({Path(f).name for f in folders})}))
    os.replace(tmp, path)


def clear_serving(run_dir: Path, pid: int) -> None:
    """Process ``pid`` serves no more (its own note removed; another's kept)."""
    path = Path(run_dir) / SERVING
    try:
        if json.loads(path.read_text()).get("pid") == int(pid):
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def serving_checkpoints(run_dir: Path) -> set[str]:
    """The checkpoint names a live ``swarm serve`` of ``run_dir`` serves (none when its note is missing, unreadable
    or its process is gone)."""
    try:
        note = json.loads((Path(run_dir) / SERVING).read_text())
        os.kill(int(note["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    return {str(n) for n in note.get("checkpoints", [])}
