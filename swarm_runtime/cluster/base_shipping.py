"""How a base's files reach the node of an engine sampler actor (swarm_runtime/cluster/vllm_actors.py): the trainer
ships a record of the base once for all its actors (:func:`ship_base`: its path, its content hash and a
:class:`BaseFiles` actor on the trainer's node), and each actor finds the base on its node (:func:`place_base`): the
trainer's folder in place when its node sees the same files there, else this run's copy in a folder of the node,
written once from Ray's object store. Folders travel as ``{relative path: bytes}`` (:func:`read_folder`,
:func:`write_folder`)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def read_folder(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes): what a node without the folder writes again."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write_folder(files: dict[str, bytes], folder: Path) -> Path:
    """Write ``files`` (relative path -> bytes, :func:`read_folder`'s) as ``folder``, replacing what was there.
    Every path is checked first, nothing written or removed if one is bad: an absolute path or a ``..`` part (one
    that would land outside ``folder``) is a :class:`ValueError` naming it."""
    for rel in files:
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            raise ValueError(
                f"write_folder: {rel!r} is not a relative path inside the folder (absolute, empty or with a '..' part)"
            )
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def _digest(entries) -> str:
    """sha256 over ``(relative path, size, chunks of its bytes)`` entries, in the order given."""
    h = hashlib.sha256()
    for rel, size, chunks in entries:
        h.update(f"{rel}\0{size}\0".encode())
        for chunk in chunks:
            h.update(chunk)
    return h.hexdigest()


def files_digest(files: dict[str, bytes]) -> str:
    """A content hash of a folder's files (:func:`read_folder`'s): their relative paths and bytes."""
    return _digest((rel, len(files[rel]), (files[rel],)) for rel in sorted(files))


def folder_digest(folder: Path) -> str:
    """:func:`files_digest` of the files under ``folder``, read a chunk at a time (a base of many GB)."""

    def chunks(path: Path):
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 24):
                yield chunk

    folder = Path(folder)
    paths = {str(p.relative_to(folder)): p for p in folder.rglob("*") if p.is_file()}
    return _digest((rel, paths[rel].stat().st_size, chunks(paths[rel])) for rel in sorted(paths))


class BaseFiles:
    """A Ray actor on the trainer's node that holds a base's files for the engine actors that cannot use the
    trainer's folder in place: read and put in the object store on the first ask only (a base every node sees
    in place is never read into memory), then the same object for every later ask (every replica of the base,
    every restarted actor)."""

    def __init__(self, folder: str):
        self.folder, self.ref, self.asks = str(folder), None, 0

    def files(self) -> list:
        """``[ref of read_folder(folder)]`` (in a list: the caller gets the ref, and fetches the files itself)."""
        import ray

        self.asks += 1
        if self.ref is None:
            self.ref = ray.put(read_folder(Path(self.folder)))
        return [self.ref]

    def asked(self) -> tuple[int, bool]:
        """``(asks, whether the files are in the object store)``."""
        return self.asks, self.ref is not None


def ship_base(folder: Path) -> dict:
    """What the trainer sends the engine actors of the base in ``folder`` (one record for all the base's replicas):
    its path on the trainer's node, the content hash of its files (:func:`folder_digest`: read from disk a chunk at
    a time, once) and a list holding a :class:`BaseFiles` actor on this node that puts the files in the object store
    when an actor first asks (:func:`place_base`). :func:`unship` ends it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    source = (
        ray.remote(BaseFiles)
        .options(
            num_cpus=0,
            max_restarts=4,
            max_task_retries=2,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
        )
        .remote(str(Path(folder).resolve()))
    )
    return {"path": str(Path(folder).resolve()), "digest": folder_digest(folder), "files": [source]}


def fetch_base(source) -> dict[str, bytes]:
    """The files of a shipped base (:func:`ship_base`'s ``files[0]``), asked of its :class:`BaseFiles` actor."""
    import ray

    return ray.get(ray.get(source.files.remote())[0])


def unship(shipped: dict) -> None:
    """End the :class:`BaseFiles` actor of a shipped base (its files leave the object store with it)."""
    import ray

    if ray.is_initialized():
        try:
            ray.kill(shipped["files"][0], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


def place_base(shipped: dict, scratch: Path, fetch) -> tuple[Path, str]:
    """The folder an engine actor's server loads the shipped base from (:func:`ship_base`), and how it got there:

    - ``"in place"``: the trainer's folder (``shipped["path"]``) is a folder on this node too (a shared
      filesystem, or the trainer's own node) with the same content hash, read here (:func:`folder_digest`).
      Nothing is shipped.
    - ``"cached"``: this node's copy for this run, ``scratch/base-<hash>``, written complete by an earlier start (of
      this actor, or of the one Ray restarted), is used again. Nothing is shipped.
    - ``"shipped"``: else the files come through Ray's object store (``fetch(files[0])``: :func:`fetch_base`) and
      are written to ``scratch/base-<hash>`` (into a folder beside it, renamed when complete, then marked complete)."""
    digest = str(shipped["digest"])
    here = Path(shipped["path"])
    try:
        if here.is_dir() and folder_digest(here) == digest:
            return here, "in place"
    except OSError:
        pass  # not readable here: ship it
    scratch = Path(scratch)
    cached, done = scratch / f"base-{digest[:16]}", scratch / f"base-{digest[:16]}.complete"
    if done.exists() and done.read_text() == digest and cached.is_dir():
        return cached, "cached"
    partial = scratch / f".base-{digest[:16]}-{os.getpid()}"
    write_folder(fetch(shipped["files"][0]), partial)
    shutil.rmtree(cached, ignore_errors=True)
    partial.rename(cached)
    done.write_text(digest)
    return cached, "shipped"
