"""An env worker: a pool of one domain's envs in its own process (a Ray actor, :mod:`.remote`).

The domain is loaded in the worker by name, through the same plugin registry as the driver's; envs are made
by the domain plugin there, kept by the id the driver gave them, put back into a free pool when the driver is
done with one (:meth:`EnvWorker.release`: the next ``open`` reuses it, its ``reset`` or ``restore`` starts it
afresh) and closed (``DomainEnv.close()``) by :meth:`EnvWorker.shutdown` at the end of the run.

Every call on an env answers ``(True, value)``, or ``(False, None)`` when the worker has no env of that id:
a worker restarted after its process died has lost its envs, and the driver replays them (:mod:`.remote`).
Plain Python, no Ray: the actor is this class under ``ray.remote``.
"""

from __future__ import annotations

import os
from typing import Any

from swarm_runtime.env import close_all

LOST = (False, None)


class EnvWorker:
    def __init__(self, domain: str, task: dict, plugins: tuple[str, ...] = ()):
        """``plugins``: modules to register besides the installed plugins (a domain not installed as a package,
        e.g. a benchmark's; importable in the worker: on its ``PYTHONPATH``)."""
        import importlib

        from omegaconf import OmegaConf

        from swarm_runtime.plugins import build_registry, get_registry, make_plugin_manager

        if plugins:
            registry = build_registry(make_plugin_manager([(importlib.import_module(m), m) for m in plugins]))
        else:
            registry = get_registry()[1]
        self.domain = registry.get("domains", domain)
        self.task = OmegaConf.create(task)
        self.envs: dict[int, Any] = {}  #: the driver's env id -> env in use
        self.free: list = []  #: envs released by the driver, reused by the next open
        self.made = 0  #: envs the domain made in this process

    def pid(self) -> int:
        return os.getpid()

    def open(self, eid: int) -> tuple:
        if eid not in self.envs:
            if self.free:
                self.envs[eid] = self.free.pop()
            else:
                self.envs[eid] = self.domain.make_env(self.task)
                self.made += 1
        return True, None

    def _env(self, eid: int):
        return self.envs.get(eid)

    def reset(self, eid: int, seed: int) -> tuple:
        env = self._env(eid)
        return LOST if env is None else (True, env.reset(seed))

    def step(self, eid: int, action: str, role: str | None) -> tuple:
        env = self._env(eid)
        return LOST if env is None else (True, env.step(action, role))

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

    def release(self, eid: int) -> tuple:
        """The driver is done with env ``eid``: back into the free pool (not closed)."""
        env = self.envs.pop(eid, None)
        if env is not None:
            self.free.append(env)
        return True, None

    def stats(self) -> dict:
        return {"pid": os.getpid(), "made": self.made, "in_use": len(self.envs), "free": len(self.free)}

    def shutdown(self) -> dict:
        """Close every env this worker holds (in use or free), each once; returns :meth:`stats` first."""
        out = self.stats()
        envs, self.envs, self.free = [*self.envs.values(), *self.free], {}, []
        close_all(envs)
        return out
