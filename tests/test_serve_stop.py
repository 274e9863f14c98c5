"""Stopping a worker from the gateway's coroutines does not block its event loop (serve/population.py: ``astop``,
``mark_failed``): the other coroutines run while the worker exits, and the worker is stopped all the same (killed
when SIGTERM is not enough). Fake processes whose ``wait`` blocks as a real one does; well under a second."""

import asyncio
import subprocess
import time

from swarm_runtime.serve.population import AgentHandle, Population, PopulationOptions


class SlowExit:
    """A worker that exits ``exit_s`` after SIGTERM (never, if None, until SIGKILL); ``wait`` blocks until then,
    as ``subprocess.Popen.wait`` and ``multiprocessing.Process.join`` do."""

    def __init__(self, exit_s: float | None):
        self.exit_s, self.at, self.returncode, self.pid = exit_s, None, None, 4242
        self.signals: list[str] = []

    def poll(self):
        if self.returncode is None and self.at is not None and time.monotonic() >= self.at:
            self.returncode = -15 if self.signals[-1] == "TERM" else -9
        return self.returncode

    def terminate(self):
        self.signals.append("TERM")
        if self.at is None and self.exit_s is not None:
            self.at = time.monotonic() + self.exit_s

    def kill(self):
        self.signals.append("KILL")
        self.at = time.monotonic()

    def wait(self, timeout=None):
        left = None if self.at is None else max(0.0, self.at - time.monotonic())
        if left is None or (timeout is not None and left > timeout):
            time.sleep(timeout)
            raise subprocess.TimeoutExpired("worker", timeout)
        time.sleep(left)
        return self.poll()


def _pop(proc) -> tuple[Population, AgentHandle]:
    pop = Population(PopulationOptions())
    a = AgentHandle(0, "Smith", "Smith", "http://127.0.0.1:1", model_id="Smith", status="up", proc=proc)
    pop.agents.append(a)
    return pop, a


async def _ticking(work, seconds: float) -> tuple[int, object]:
    """``work`` run beside a coroutine that ticks every 10 ms: (ticks while ``work`` ran, its result)."""
    ticks = 0
    done = asyncio.Event()

    async def tick():
        nonlocal ticks
        while not done.is_set():
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0)
    t0 = time.monotonic()
    out = await work
    assert time.monotonic() - t0 >= seconds * 0.9  # it did wait for the exit
    done.set()
    await ticker
    return ticks, out


def test_draining_an_agent_waits_for_its_worker_without_blocking_the_loop():
    proc = SlowExit(0.3)
    pop, a = _pop(proc)
    ticks, _ = asyncio.run(_ticking(pop.drain(a), 0.3))
    assert proc.signals == ["TERM"] and proc.returncode == -15 and a.status == "removed"
    assert ticks >= 10  # ~30 in 0.3 s; a blocking wait lets none through


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace():
    proc = SlowExit(None)
    pop, a = _pop(proc)
    ticks, _ = asyncio.run(_ticking(pop.astop(a, grace_s=0.2), 0.2))
    assert proc.signals == ["TERM", "KILL"] and proc.returncode == -9 and ticks >= 5


def test_a_failed_agent_is_stopped_in_the_background_on_the_loop_and_at_once_off_it():
    async def fail_on_the_loop():
        proc = SlowExit(0.2)
        pop, a = _pop(proc)
        t0 = time.monotonic()
        pop.mark_failed(a, "no answer")  # as a probe or the watch finds it
        assert time.monotonic() - t0 < 0.1 and proc.signals == ["TERM"] and proc.returncode is None
        assert len(pop.stopping) == 1
        await asyncio.gather(*pop.stopping)
        return proc, pop

    proc, pop = asyncio.run(fail_on_the_loop())
    assert proc.returncode == -15 and not pop.stopping and pop.agents[0].status == "failed"
    proc = SlowExit(0.05)  # off the event loop: stopped before mark_failed returns
    pop, a = _pop(proc)
    pop.mark_failed(a, "no answer")
    assert proc.returncode == -15 and not pop.stopping
