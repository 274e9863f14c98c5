"""Run the real ``swarm`` CLI (``swarm_runtime.cli.main.main``) many times from one process that has
imported everything once: each command runs in a forked child, a process of its own (exit codes,
SIGKILL, files, locks as with the ``swarm`` executable), without paying the imports again.

    python tests/forkcli.py sweep WORKDIR ARG...   # the kill-at-every-checkpoint-operation sweep
    python tests/forkcli.py serve [ARG...]         # a warm CLI: one JSON request a line (``WarmCLI``)

``sweep``: an uninterrupted run (``WORKDIR/ref``) counts the file operations (``os.replace``,
``os.rename``, ``shutil.rmtree``) that :mod:`swarm_runtime.runs.checkpoint` makes, and just before its N-th
such operation copies its run folder to ``WORKDIR/kill-N``: the folder a SIGKILL at that operation
leaves (below, ``_snapshot``); each ``kill-N`` is then resumed with the plain CLI (``resume=true``, no
injection). The first operation is also met by a real run SIGKILLed there, whose folder is resumed
too (``WORKDIR/real-1``): the copy's claim, witnessed once. ``WORKDIR/sweep.json`` records every exit code. No hook in the
production code: the operations are wrapped here, in the child, before ``main`` runs.

``serve``: the warm interpreter behind ``conftest.warm_swarm`` (``WarmCLI``). Each request line
``{"argv", "cwd", "env", "timeout"}`` runs ``swarm ARGV`` in a forked child (in ``cwd``, ``env`` set,
stdin from /dev/null, stdout and stderr to files) and is answered with one line ``{"rc", "stdout",
"stderr"}`` (``rc`` null after ``timeout``: the child is killed). Use it where a test checks what a
command does, not how a cold process starts: variables read at import time (plugin allow/block
lists, ``XDG_CACHE_HOME`` for modules already loaded) keep the values the server started with, and
each command keeps at least one test through the cold ``conftest.swarm``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path


def _inject(kill_at: int | None, counter: list, snapshot=None) -> None:
    import swarm_runtime.runs.checkpoint as ckpt_module

    copytree = shutil.copytree  # the unwrapped one: _snapshot's copy is no checkpoint operation

    def wrap(fn):
        def op(*a, **k):
            if sys._getframe(1).f_code.co_filename == ckpt_module.__file__:
                counter[0] += 1
                if kill_at is not None and counter[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                if snapshot is not None:
                    snapshot(counter[0], copytree)
            return fn(*a, **k)

        return op

    os.replace, os.rename, shutil.rmtree = wrap(os.replace), wrap(os.rename), wrap(shutil.rmtree)


def _snapshot(run_dir: Path, work: Path):
    """Before each checkpoint operation N of the run in ``run_dir``: its folder copied to ``work/kill-N``, the
    state a SIGKILL there leaves. The run's thread is held in the operation while the copy is made, and a kill
    keeps exactly what the kernel has of each file (the page cache outlives the process; what sits in the
    process's own buffers is lost to both); the flock on ``.lock`` goes with the process, and the copy holds none.
    The one difference, the run folder's own path in ``config.yaml``, is set to the copy's (``retarget``)."""

    def take(n: int, copytree) -> None:
        copytree(run_dir, work / f"kill-{n}", symlinks=True)

    return take


def retarget(run_dir: Path, copy: Path) -> None:
    """``copy``, a copy of the run folder ``run_dir``, names itself where the run named its folder."""
    hits = [p for p in copy.rglob("*") if p.is_file() and str(run_dir).encode() in p.read_bytes()]
    cfg = copy / "config.yaml"
    assert {p.name for p in hits} <= {"config.yaml", "swarm.log", "run.log"}, hits  # nothing else names it
    cfg.write_text(cfg.read_text().replace(f"run_dir: {run_dir}\n", f"run_dir: {copy}\n"))


def run(argv: list[str], log: Path, kill_at: int | None = None, count: bool = False, snapshot=None) -> tuple[int, int]:
    """``swarm ARGV`` in a forked child (stdout and stderr to ``log``); returns (exit code, or
    -signal, and the number of checkpoint file operations when ``count``)."""
    ops_file = log.with_suffix(".ops")
    pid = os.fork()
    if pid == 0:  # the child: a fresh `swarm` process as far as the run folder can tell
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        counter = [0]
        if count or kill_at is not None or snapshot is not None:
            _inject(kill_at, counter, snapshot)
        _fresh_thread_pool()
        rc = 1
        try:
            from swarm_runtime.cli.main import main

            rc = main(argv)
        finally:
            if count:
                ops_file.write_text(str(counter[0]))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), int(ops_file.read_text()) if count and ops_file.exists() else 0


def sweep(work: Path, args: list[str]) -> dict:
    ref = work / "ref"
    rc, ops = run(["run", *args, f"run_dir={ref}"], work / "ref.log", count=True, snapshot=_snapshot(ref, work))
    out = {"ref": rc, "ops": ops, "cases": {}, "real": {}}
    for n in range(1, ops + 1):
        d = work / f"kill-{n}"
        retarget(ref, d)
        resumed, _ = run(["run", "resume=true", f"run_dir={d}"], work / f"resume-{n}.log")
        out["cases"][n] = resumed
    for n in [1]:  # a real kill at the first operation
        d = work / f"real-{n}"
        killed, _ = run(["run", *args, f"run_dir={d}"], work / f"real-{n}.log", kill_at=n)
        resumed, _ = run(["run", "resume=true", f"run_dir={d}"], work / f"resume-real-{n}.log")
        out["real"][n] = [killed, resumed]
    return out


def _fresh_thread_pool() -> None:
    """In a forked child, before the command starts threads: torch's intra-op thread pool, which the server made
    (``warm_up``), is marked corrupt by torch's fork handler and rebuilt by the first call that asks for it. Two
    threads asking at once (transformers loads a checkpoint's tensors on a thread pool) race there, and the loser
    gets no pool ("pool INTERNAL ASSERT FAILED ... Invalid thread pool!"). Rebuild it here, on one thread."""
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(torch.get_num_threads())


def _child(req: dict, out: str, err: str) -> None:
    """In the forked child: become ``swarm ARGV`` as started from ``cwd`` with ``env``; never returns."""
    rc = 1
    try:
        os.chdir(req["cwd"])
        os.environ.update(req.get("env") or {})
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.argv = ["swarm", *req["argv"]]
        _fresh_thread_pool()
        from swarm_runtime.cli.main import main

        try:
            rc = main(list(req["argv"]))
        except SystemExit as exc:  # argparse: --help, usage errors
            code = exc.code
            rc = code if isinstance(code, int) else (0 if code is None else (print(code, file=sys.stderr) or 1))
        except BaseException:  # as `python -m swarm_runtime.cli.main` would: the traceback, exit 1
            traceback.print_exc()
            rc = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc if isinstance(rc, int) else 1)


def _serve_one(req: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="warmcli-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req, out, err)
        deadline = time.monotonic() + float(req.get("timeout") or 300)
        wait, status = 0.001, None
        while status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
            elif time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            else:
                time.sleep(wait)
                wait = min(wait * 2, 0.02)

        def text(path: str) -> str:
            return Path(path).read_text(errors="replace") if os.path.exists(path) else ""

        rc = None if status is None else os.waitstatus_to_exitcode(status)
        return {"rc": rc, "stdout": text(out), "stderr": text(err)}


def serve(args: list[str]) -> None:
    """Answer requests from stdin on the original stdout; anything else printed goes to stderr."""
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from loguru import logger

    logger.remove()  # the registry's debug line; each child's ``main`` sets its own sinks
    if args:
        warm_up(args)
    reply.write(json.dumps({"ready": True}) + "\n")
    reply.flush()
    for line in sys.stdin:
        if line.strip():
            reply.write(json.dumps(_serve_one(json.loads(line))) + "\n")
            reply.flush()


class WarmCLI:
    """The client: ``WarmCLI(ROOT)(argv, cwd=..., env=..., timeout=...)`` -> ``CompletedProcess``
    (``TimeoutExpired`` after ``timeout``), as ``subprocess.run([... swarm, *argv], text=True,
    capture_output=True)`` gives. One command at a time (a lock): the server forks one child at a time."""

    def __init__(self, warm_args: list[str] | None = None):
        import threading

        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve", *(warm_args or [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lock = threading.Lock()
        ready = self.proc.stdout.readline()
        assert ready.strip() == '{"ready": true}', f"warm CLI did not start: {ready!r}"

    def __call__(self, argv, cwd, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        req = {"argv": [str(a) for a in argv], "cwd": str(cwd), "env": env or {}, "timeout": timeout}
        with self.lock:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        assert line, f"warm CLI server died (exit {self.proc.poll()})"
        res = json.loads(line)
        cmd = ["swarm", *req["argv"]]
        if res["rc"] is None:
            raise subprocess.TimeoutExpired(cmd, timeout, output=res["stdout"], stderr=res["stderr"])
        return subprocess.CompletedProcess(cmd, res["rc"], res["stdout"], res["stderr"])

    def close(self) -> None:
        """Stop the server (its children are all reaped; nothing of it needs a clean exit)."""
        self.proc.stdin.close()
        self.proc.kill()
        self.proc.wait()


def warm_up(args: list[str]) -> None:
    """Build the run's swarm once here (no folder, nothing written), so the lazily imported model
    code is loaded before the forks and each child only trains."""
    import torch

    from swarm_runtime.config.load import resolve
    from swarm_runtime.plugins.manager import get_registry
    from swarm_runtime.runs.context import RunContext

    torch.set_num_threads(1)
    pm, reg = get_registry()
    ctx = RunContext(resolve(list(args), reg), pm, reg, None)
    ctx.build_swarm()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from swarm_runtime.plugins.manager import get_registry

    get_registry()  # every plugin imported once, before the forks
    import matplotlib

    import swarm_runtime.cli.main  # noqa: F401
    import swarm_runtime.learn.mpt  # noqa: F401

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401  (the run's plots)

    mode, *rest = sys.argv[1:]
    if mode == "serve":
        serve(rest)
        sys.exit(0)
    assert mode == "sweep", mode
    work, *rest = rest
    warm_up(rest)
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "sweep.json").write_text(json.dumps(sweep(work, rest)))
