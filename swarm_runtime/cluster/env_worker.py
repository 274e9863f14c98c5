"""An env worker: a pool of one domain's envs in its own process (a Ray actor, driven by :mod:`.env_cluster`).

The domain is loaded in the worker by name, through the same plugin registry as the driver's; envs are made
by the domain plugin there, kept by the id the driver gave them, put back into a free pool when the driver is
done with one (:meth:`EnvWorker.release`: the next ``open`` reuses it, its ``reset`` or ``restore`` starts it
afresh) and closed (``DomainEnv.close()``) by :meth:`EnvWorker.shutdown` at the end of the run.

Every call on an env answers ``(True, value)``, or ``(False, None)`` when the worker has no env of that id:
a worker restarted after its process died has lost its envs, and the driver replays them (:mod:`.env_cluster`).
Two kinds of env: ``"env"`` (``domain.make_env``: rollouts, evaluations, branches) and ``"concurrent"``
(``domain.concurrent_env``: ``algo=rlcr``'s rollouts), each with a free pool of its own.

Round trips are what the driver pays per turn, so the calls it makes every turn carry more: a step answers the
step's result and the env's metrics after it (:meth:`EnvWorker.step`), :meth:`EnvWorker.step_many` takes a
turn's steps of every env of this worker in one call, :meth:`EnvWorker.begin` opens an env and starts its
episode in one, and :meth:`EnvWorker.release_many` gives back a batch's envs in one.
Plain Python, no Ray: the actor is this class under ``ray.remote``.
"""

from __future__ import annotations

import os
from typing import Any

from swarm_runtime.cluster.actors import ActorBody
from swarm_runtime.core.env import close_all

LOST = (False, None)


class Raised:
    """The answer of one step of :meth:`EnvWorker.step_many` that raised ``exc`` (raised again on the driver)."""

    def __init__(self, exc: Exception):
        self.exc = exc


class EnvWorker(ActorBody):
    def __init__(self, domain: str, task: dict, plugins: tuple[str, ...] = ()):
        """``plugins``: modules to register besides the installed plugins (a domain not installed as a package,
        e.g. a benchmark's; importable in the worker: on its ``PYTHONPATH``)."""
        import importlib

        from omegaconf import OmegaConf

        from swarm_runtime.plugins.manager import build_registry, get_registry, make_plugin_manager

        if plugins:
            registry = build_registry(make_plugin_manager([(importlib.import_module(m), m) for m in plugins]))
        else:
            registry = get_registry()[1]
        self.domain = registry.get("domains", domain)
        self.task = OmegaConf.create(task)
        self.envs: dict[int, Any] = {}  #: the driver's env id -> env in use
        self.kinds: dict[int, str] = {}  #: the driver's env id -> its kind (``"env"`` or ``"concurrent"``)
        self.free: list = []  #: ``"env"`` envs released by the driver, reused by the next open
        self.free_concurrent: list = []  #: the same for ``"concurrent"`` envs
        self.made = 0  #: envs the domain made in this process

    def env_digests(self, names: list[str]) -> dict:
        """This process's values of ``names`` as digests (:func:`swarm_runtime.cluster.actor_env.digests`)."""
        from swarm_runtime.cluster.actor_env import digests

        return digests(names)

    def _pool(self, kind: str) -> list:
        return self.free if kind == "env" else self.free_concurrent

    def open(self, eid: int, kind: str = "env") -> tuple:
        if eid not in self.envs:
            pool = self._pool(kind)
            if pool:
                self.envs[eid] = pool.pop()
            else:
                make = self.domain.make_env if kind == "env" else self.domain.concurrent_env
                self.envs[eid] = make(self.task)
                self.made += 1
            self.kinds[eid] = kind
        return True, None

    def begin(self, eid: int, kind: str, how: str, arg) -> tuple:
        """:meth:`open` and then ``reset`` (``how="reset"``, ``arg`` the seed) or ``restore`` (``arg`` the
        snapshot) in one call: an episode that starts here has nothing to lose, so the env may be new."""
        self.open(eid, kind)
        return self.reset(eid, arg) if how == "reset" else self.restore(eid, arg)

    def _env(self, eid: int):
        return self.envs.get(eid)

    def reset(self, eid: int, seed: int) -> tuple:
        env = self._env(eid)
        return LOST if env is None else (True, env.reset(seed))

    def step(self, eid: int, action: str, role: str | None) -> tuple:
        """``(True, (StepResult, metrics after the step))``: the metrics come with it, so that an episode's end
        (``finish_episode``) needs no call of its own."""
        env = self._env(eid)
        if env is None:
            return LOST
        res = env.step(action, role)
        return True, (res, dict(env.metrics()))

    def step_many(self, steps: list[tuple[int, str, str | None]]) -> list:
        """:meth:`step` for each ``(eid, action, role)``, in order (one turn's steps of this worker's envs). A step
        that raised answers :class:`Raised` and the others still step: the error is its env's alone."""
        out = []
        for eid, action, role in steps:
            try:
                out.append(self.step(eid, action, role))
            except Exception as exc:
                out.append(Raised(exc))
        return out

    def observation(self, eid: int) -> tuple:
        env = self._env(eid)
        return LOST if env is None else (True, env.observation())

    def snapshot(self, eid: int) -> tuple:
        env = self._env(eid)
        return LOST if env is None else (True, env.snapshot())

    def restore(self, eid: int, snap) -> tuple:
        env = self._env(eid)
        if env is None:
            return LOST
        env.restore(snap)
        return True, env.observation()

    def metrics(self, eid: int) -> tuple:
        env = self._env(eid)
        return LOST if env is None else (True, dict(env.metrics()))

    def call(self, eid: int, method: str, *args) -> tuple:
        """Any other method of the env (``progress``, ``action_seconds``, ``concurrent_expert``,
        ``expert_action``: what ``algo=rlcr``'s loop asks a concurrent env)."""
        env = self._env(eid)
        return LOST if env is None else (True, getattr(env, method)(*args))

    def release(self, eid: int) -> tuple:
        """The driver is done with env ``eid``: back into its kind's free pool (not closed)."""
        env = self.envs.pop(eid, None)
        if env is not None:
            self._pool(self.kinds.pop(eid, "env")).append(env)
        return True, None

    def release_many(self, eids: list[int]) -> tuple:
        for eid in eids:
            self.release(eid)
        return True, None

    def stats(self) -> dict:
        free = len(self.free) + len(self.free_concurrent)
        return {"pid": os.getpid(), "made": self.made, "in_use": len(self.envs), "free": free}

    def shutdown(self) -> dict:
        """Close every env this worker holds (in use or free), each once; returns :meth:`stats` first."""
        out = self.stats()
        envs = [*self.envs.values(), *self.free, *self.free_concurrent]
        self.envs, self.kinds, self.free, self.free_concurrent = {}, {}, [], []
        close_all(envs)
        return out
