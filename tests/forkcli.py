"""Run the real ``swarm`` CLI (``swarm_runtime.cli.main``) many times from one process that has
imported everything once: each command runs in a forked child, a process of its own (exit codes,
SIGKILL, files, locks as with the ``swarm`` executable), without paying the imports again.

    python tests/forkcli.py sweep WORKDIR ARG...   # the kill-at-every-checkpoint-operation sweep

``sweep``: an uninterrupted run (``WORKDIR/ref``) counts the file operations (``os.replace``,
``os.rename``, ``shutil.rmtree``) that :mod:`swarm_runtime.checkpoint` makes; then for each N, a run
in ``WORKDIR/kill-N`` is SIGKILLed just before its N-th such operation and resumed with the plain
CLI (``resume=true``, no injection). ``WORKDIR/sweep.json`` records every exit code. No hook in the
production code: the operations are wrapped here, in the child, before ``main`` runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path


def _inject(kill_at: int | None, counter: list) -> None:
    import swarm_runtime.checkpoint as ckpt_module

    def wrap(fn):
        def op(*a, **k):
            if sys._getframe(1).f_code.co_filename == ckpt_module.__file__:
                counter[0] += 1
                if kill_at is not None and counter[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return fn(*a, **k)

        return op

    os.replace, os.rename, shutil.rmtree = wrap(os.replace), wrap(os.rename), wrap(shutil.rmtree)


def run(argv: list[str], log: Path, kill_at: int | None = None, count: bool = False) -> tuple[int, int]:
    """``swarm ARGV`` in a forked child (stdout and stderr to ``log``); returns (exit code, or
    -signal, and the number of checkpoint file operations when ``count``)."""
    ops_file = log.with_suffix(".ops")
    pid = os.fork()
    if pid == 0:  # the child: a fresh `swarm` process as far as the run folder can tell
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        counter = [0]
        if count or kill_at is not None:
            _inject(kill_at, counter)
        rc = 1
        try:
            from swarm_runtime.cli import main

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
    rc, ops = run(["run", *args, f"run_dir={work / 'ref'}"], work / "ref.log", count=True)
    out = {"ref": rc, "ops": ops, "cases": {}}
    for n in range(1, ops + 1):
        d = work / f"kill-{n}"
        killed, _ = run(["run", *args, f"run_dir={d}"], work / f"kill-{n}.log", kill_at=n)
        resumed, _ = run(["run", "resume=true", f"run_dir={d}"], work / f"resume-{n}.log")
        out["cases"][n] = [killed, resumed]
    return out


def warm_up(args: list[str]) -> None:
    """Build the run's swarm once here (no folder, nothing written), so the lazily imported model
    code is loaded before the forks and each child only trains."""
    import torch

    from swarm_runtime.config import resolve
    from swarm_runtime.plugins import get_registry
    from swarm_runtime.run import RunContext

    torch.set_num_threads(1)
    pm, reg = get_registry()
    ctx = RunContext(resolve(list(args), reg), pm, reg, None)
    ctx.build_swarm()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from swarm_runtime.plugins import get_registry

    get_registry()  # every plugin imported once, before the forks
    import matplotlib

    import swarm_runtime.cli  # noqa: F401
    import swarm_runtime.train.mpt  # noqa: F401

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401  (the run's plots)

    mode, work, *rest = sys.argv[1:]
    assert mode == "sweep", mode
    warm_up(rest)
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "sweep.json").write_text(json.dumps(sweep(work, rest)))
