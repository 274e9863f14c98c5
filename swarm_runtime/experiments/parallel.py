"""``experiment.parallel=N``: the training seeds of an experiment run N at a time, each as ``swarm experiment NAME
... seed=S experiment.train_seeds=null`` in a process of its own in ``seed-<S>/`` (the folder the seed has when
the seeds run one after another), with the machine's threads shared out among them. When they are done, the
usual pass over the seeds (:func:`swarm_runtime.experiments.runner._replicated`) finds every cell finished and
combines them, so the table, ``results.json`` and a later ``resume=true`` are the same as with one process.

A seed whose process fails leaves its finished cells and checkpoints; the others run on, then the experiment stops
naming the seed, its log and its last lines, and ``resume=true`` continues each seed where it stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from loguru import logger

#: What each seed's process sets itself: the arguments the parent's own pass reads per seed are dropped from the
#: ones handed down, so the child's command line gives each key once.
_SET_HERE = ("seed", "experiment.train_seeds", "experiment.parallel", "experiment.base", "hardware.threads", "progress")

#: How long a seed's process has, after SIGTERM, to stop at its next safe point before it is killed.
STOP_WAIT_S = 120.0


def threads_each(threads: int, parallel: int) -> int:
    """Torch threads of each of ``parallel`` processes on a machine given ``hardware.threads`` (0 = every core)."""
    cores = int(threads) if int(threads) > 0 else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(parallel)))


def seed_command(name: str, args: list[str], seed: int, base: str | None, sub: Path, threads: int) -> list[str]:
    """The command line of training seed ``seed``'s own experiment in ``sub`` (resumed when it was started before)."""
    from swarm_runtime.config.load import parse_overrides

    parse_overrides(args)
    kept = [a for a in args if _key(a) not in _SET_HERE]
    own = [f"seed={seed}", "experiment.train_seeds=null", "experiment.parallel=1", f"hardware.threads={threads}"]
    own += [f"experiment.base={base}"] if base is not None else []
    again = ["resume=true"] if (sub / "experiment.json").exists() else []
    return [sys.executable, "-m", "swarm_runtime.cli.main", "experiment", name, *kept, *own, "progress=false",
            f"run_dir={sub}", *again]  # fmt: skip


def _key(arg: str) -> str:
    key = arg.partition("=")[0].strip()
    return "experiment.base" if key == "base" else key


def _tail(path: Path) -> str:
    """What a seed's process said last: its ``swarm: ...`` line (the CLI's one-line error), else its last line."""
    try:
        text = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no output)"
    said = [line for line in text if line.startswith("swarm: ")]
    return (said or text or ["(no output)"])[-1]


def run_seeds_apart(x, seeds: list[int], bases: list[str | None]) -> None:
    """Run each unfinished seed's experiment in a process of its own, ``x.xcfg.parallel`` at a time. Raises
    ``RuntimeError`` naming every seed whose process failed (after the others finished)."""
    todo = [(s, b) for s, b in zip(seeds, bases) if not (x.run_dir / f"seed-{s}" / "results.json").exists()]
    if not todo:
        return
    width = min(int(x.xcfg.parallel), len(todo))
    threads = threads_each(x.cfg.hardware.threads, width)
    logger.info(
        "experiment {}: {} training seed(s) {} at most {} at a time, {} thread(s) each",
        x.name,
        len(todo),
        [s for s, _ in todo],
        width,
        threads,
    )
    running: dict[int, tuple[subprocess.Popen, Path, float]] = {}
    failed: list[str] = []
    try:
        while todo or running:
            while todo and len(running) < width:
                s, b = todo.pop(0)
                sub = x.run_dir / f"seed-{s}"
                sub.mkdir(parents=True, exist_ok=True)
                out = sub / "experiment.out"
                with open(out, "ab") as f:
                    cmd = seed_command(x.name, x.args, s, b, sub, threads)
                    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                running[s] = (proc, out, time.time())
                logger.info("experiment {}: training seed {} started (pid {}, output {})", x.name, s, proc.pid, out)
            time.sleep(1.0)
            for s, (proc, out, t0) in list(running.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                del running[s]
                took = time.time() - t0
                if rc == 0:
                    logger.info("experiment {}: training seed {} done in {:.0f}s", x.name, s, took)
                else:
                    logger.error("experiment {}: training seed {} failed (exit {}); output {}", x.name, s, rc, out)
                    failed.append(f"training seed {s} (exit {rc}; {out}: {_tail(out)})")
    finally:
        _stop(running)
    if failed:
        raise RuntimeError(
            f"experiment {x.name}: " + "; ".join(failed) + f"; the other seeds' cells are kept: fix the cause and "
            f"continue with swarm experiment {x.name} resume=true run_dir={x.run_dir}"
        )


def _stop(running: dict) -> None:
    """SIGTERM to every seed process still running (each stops at a safe point, resumable), SIGKILL after
    :data:`STOP_WAIT_S`."""
    for proc, _, _ in running.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.time() + STOP_WAIT_S
    for proc, _, _ in running.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
