"""Determinism of a domain's env: the same seed and actions give the same trajectory, also in other
processes under other hash seeds.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from swarm_runtime.conformance.probe import (
    ConformanceWarning,
    Where,
    first_mismatch,
    load_task,
    shorten,
    task_label,
    trace,
)
from swarm_runtime.core.domain import Domain


# ------------------------------------------------------------------ determinism, in this process and across processes
def check_determinism(
    domain: Domain, task: str | DictConfig, seeds=(0, 1, 2), steps: int = 60, processes: bool = True
) -> dict[int, list]:
    """Two episodes from one seed with the same actions are identical, in this process and (with
    ``processes``) in two other Python processes with other ``PYTHONHASHSEED`` values: a ``reset`` or
    ``step`` that iterates a ``set`` of strings or uses ``hash()`` gives another world in another
    process (a resumed run, an evaluation, a served worker), while every check inside one process
    passes. Returns this process's traces (:func:`trace`) by seed."""
    cfg = load_task(domain, task)
    name = task_label(task)
    n = min(int(steps), int(cfg.max_decisions))
    with alongside_children(domain, task, processes, seeds, steps) as out:
        here = out["here"] = {int(s): trace(domain, cfg, int(s), n, name) for s in seeds}
        for s in seeds:
            first_mismatch(
                domain,
                name,
                int(s),
                here[int(s)],
                trace(domain, cfg, int(s), n, name),
                "two episodes from the same seed with the same actions differ",
            )
    return here


@contextmanager
def alongside_children(domain: Domain, task: str | DictConfig, enabled: bool = True, seeds=(0, 1, 2), steps: int = 60):
    """Start the other processes (:func:`start_children`), run the body, which stores this process's
    traces under ``"here"`` of the dict it gets, then compare (:func:`finish_children`); a body that
    fails ends the children first."""
    children = start_children(domain, task, seeds, steps) if enabled else None
    out: dict = {}
    try:
        yield out
    except BaseException:
        if children is not None:
            stop_children(children)
        raise
    if children is not None:
        finish_children(children, out["here"])


def _hash_seeds(k: int = 2) -> list[str]:
    """``k`` ``PYTHONHASHSEED`` values other than this process's (fixed, so a failure reproduces)."""
    mine = os.environ.get("PYTHONHASHSEED")
    return [v for v in ("1", "2", "3") if v != mine][:k]


def cloudpickle_module():
    """cloudpickle, which pickles a class defined in ``__main__`` or inside a function by value: the standalone
    package, else the copy Ray ships (``ray.cloudpickle``, with the ``ray`` extra); None when neither is installed."""
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        pass
    try:
        from ray import cloudpickle

        return cloudpickle
    except ImportError:
        return None


def _payload(domain: Domain, task: str | DictConfig) -> bytes | str:
    """What a child process needs to rebuild ``domain`` (pickled by reference to its class, or by its
    registered name, or, for a class defined in ``__main__`` or inside a function, by value with cloudpickle:
    :func:`cloudpickle_module`), or why it cannot."""
    cls = type(domain)
    how: tuple | None = ("pickle", domain)
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        how = None
        try:
            from swarm_runtime.plugins.manager import get_registry

            if type(get_registry()[1].domains.get(domain.name)) is cls:
                how = ("registry", domain.name)
        except Exception:
            pass
        if how is None:
            how = _by_value(domain)
        if isinstance(how, str):
            return how
    try:
        return pickle.dumps({"how": how, "task": task if isinstance(task, str) else OmegaConf.to_container(task)})
    except Exception as exc:
        return f"the domain object cannot be pickled ({type(exc).__name__}: {shorten(str(exc), 120)})"


def _by_value(domain: Domain) -> tuple | str:
    """``("cloudpickle", bytes)``: ``domain`` and its class pickled by value, for a class another process cannot
    import; or why not (no cloudpickle, or the object cannot be pickled)."""
    cls = type(domain)
    where = "__main__" if cls.__module__ == "__main__" else "a function"
    cloudpickle = cloudpickle_module()
    if cloudpickle is None:
        return (
            f"its class {cls.__qualname__} is defined in {where}, so another process cannot import it, and "
            "cloudpickle, which would carry it there, is not installed (define it at module level, or pip install "
            "cloudpickle)"
        )
    try:
        return ("cloudpickle", cloudpickle.dumps(domain))
    except Exception as exc:
        return (
            f"its class {cls.__qualname__} is defined in {where} and cloudpickle cannot carry it to another "
            f"process ({type(exc).__name__}: {shorten(str(exc), 120)}; define it at module level)"
        )


@dataclass
class Children:
    """Child processes replaying a domain's traces under other hash seeds (:func:`start_children`)."""

    domain: Domain
    task: str | DictConfig
    seeds: tuple
    procs: list  #: (PYTHONHASHSEED, Popen)


def start_children(domain: Domain, task: str | DictConfig, seeds=(0, 1, 2), steps: int = 60) -> Children | None:
    """Start two Python processes, each with another ``PYTHONHASHSEED``, that rebuild the domain and
    compute the traces of ``seeds`` (they run while this process goes on); None, with a
    :class:`ConformanceWarning`, when another process cannot rebuild the domain."""
    cfg = load_task(domain, task)
    body = _payload(domain, task)
    if isinstance(body, str):
        warnings.warn(
            f"{domain.name}/{task_label(task)}: determinism across processes not checked: {body}",
            ConformanceWarning,
            stacklevel=2,
        )
        return None
    header = json.dumps(
        {
            "path": [p for p in sys.path if isinstance(p, str)],
            "seeds": [int(s) for s in seeds],
            "steps": min(int(steps), int(cfg.max_decisions)),
        }
    )
    procs = []
    for hs in _hash_seeds():
        env = {**os.environ, "PYTHONHASHSEED": hs, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-c", "from swarm_runtime.conformance.determinism import _child; _child()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        proc.stdin.write(header.encode() + b"\n" + base64.b64encode(body))
        proc.stdin.close()
        proc.stdin = None  # written in full; communicate() later only reads
        procs.append((hs, proc))
    return Children(domain, task, tuple(int(s) for s in seeds), procs)


def stop_children(children: Children) -> None:
    """End the children that are still running (a check failed first) and close their pipes."""
    for _, proc in children.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f is not None and not f.closed:
                f.close()


def finish_children(children: Children, here: dict[int, list], timeout: float = 300.0) -> None:
    """Compare the children's traces with ``here`` (this process's, by seed): the first difference
    fails, naming the seed, step, action and role, and the other process's hash seed."""
    domain, name = children.domain, task_label(children.task)
    results = []
    try:
        for hs, proc in children.procs:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                Where(domain.name, name).fail(
                    f"another process (PYTHONHASHSEED={hs}) did not replay seeds "
                    f"{list(children.seeds)} within {timeout:g} s"
                )
            results.append((hs, proc.returncode, out, err))
    finally:
        stop_children(children)
    for hs, rc, out, err in results:
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            got = json.loads(lines[-1])
        except (IndexError, ValueError):
            got = {"error": "crash", "message": err.decode(errors="replace").strip()[-400:] or f"exit code {rc}"}
        if got.get("error") == "load":
            warnings.warn(
                f"{domain.name}/{name}: determinism across processes not checked: another process could "
                f"not rebuild the domain ({got['message']})",
                ConformanceWarning,
                stacklevel=2,
            )
            return
        if "error" in got:
            Where(domain.name, name).fail(
                f"in another process (PYTHONHASHSEED={hs}) replaying seeds "
                f"{list(children.seeds)} failed where this process passes: {got['message']}"
            )
        for s in children.seeds:
            first_mismatch(
                domain,
                name,
                s,
                json.loads(json.dumps(here[s])),
                got["traces"][str(s)],
                f"another process (PYTHONHASHSEED={hs}) gave another episode for the same seed and "
                "actions (this process vs that one): the env depends on the hash seed (iterating a "
                "set() of strings, hash()); use sorted(), a seeded random.Random or hashlib",
            )


def _child() -> None:
    """Entry point of the processes :func:`start_children` starts: rebuild the domain, print its traces."""
    header, body = sys.stdin.buffer.read().split(b"\n", 1)
    head = json.loads(header)
    for p in reversed(head["path"]):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        spec = pickle.loads(base64.b64decode(body))
        kind, what = spec["how"]
        if kind == "registry":
            from swarm_runtime.plugins.manager import get_registry

            what = get_registry()[1].domains[what]
        elif kind == "cloudpickle":  # a class pickled by value: unpickling imports cloudpickle's own helpers
            what = pickle.loads(what)
        task = spec["task"] if isinstance(spec["task"], str) else OmegaConf.create(spec["task"])
        cfg = load_task(what, task)
    except Exception as exc:
        print(json.dumps({"error": "load", "message": f"{type(exc).__name__}: {shorten(str(exc), 200)}"}))
        return
    try:
        traces = {str(s): trace(what, cfg, int(s), int(head["steps"]), task_label(task)) for s in head["seeds"]}
    except Exception as exc:
        print(json.dumps({"error": "run", "message": f"{type(exc).__name__}: {shorten(str(exc), 300)}"}))
        return
    print(json.dumps({"traces": traces}))
