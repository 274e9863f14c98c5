"""The error a bad setting raises. At the bottom of the core: the config (:mod:`swarm_runtime.config.load`),
its validation (:mod:`swarm_runtime.config.validation`) and everything else raise it without importing each
other."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value; the CLI prints it and exits with code 2."""


class Stopped(KeyboardInterrupt):
    """SIGTERM reached the command (a scheduler's preemption: SLURM, Kubernetes). Raised in the main thread by
    :func:`stop_on_sigterm`'s handler, it unwinds like Ctrl+C: every ``finally`` runs (learners, samplers, env
    workers and a run's own Ray closed, the run folder's lock released); the CLI then prints one line saying how
    to resume and exits with 143 (128 + SIGTERM). ``run_dir``: the run it stopped, when one was open."""

    run_dir = None


def stop_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Stopped` in the main thread (the CLI's ``main``). A second SIGTERM while the first
    unwinds is ignored, so the cleanup is not cut short (a SIGKILL still is). ``ray.init`` replaces the handler
    (Ray's own ends the process through its C++ failure handler, with a native stack and SIGABRT):
    :func:`swarm_runtime.cluster.ray_helpers.connect` puts back the one that was there before."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    signal.signal(signal.SIGTERM, _raise_stopped)


def _raise_stopped(signum, frame):
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stopped()


def stops_on_sigterm(handler) -> bool:
    """Whether ``handler`` (``signal.getsignal(SIGTERM)``) is :func:`stop_on_sigterm`'s."""
    return handler is _raise_stopped
