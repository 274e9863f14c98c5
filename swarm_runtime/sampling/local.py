"""The in-process sampler and learner: the same modules sample and learn (``rollout.engine=local``).

:class:`LocalSampler` answers a batch of rows with one call per set of weights, and one mixed-adapter
batch per shared base (``model.adapter=lora``: :class:`~swarm_runtime.models.mixed_batch.MixedBatch`),
exactly the calls the episode loop made before samplers existed, so at the defaults a run draws the
same tokens in the same order. Its responses carry the in-process per-token log-probs and the
learner's version of each model; :meth:`LocalSampler.sync` has nothing to load (the weights are the
learner's own) and only takes the new versions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from swarm_runtime.core.protocols import Bid, Learner, Policy, Response, Row


def model_names(agents: Sequence) -> list[str]:
    """The name of each agent's weights: its role when every agent of the role shares one model (the
    usual case: replicas share), else the agent's own name."""
    by_role: dict[str, set[int]] = {}
    for a in agents:
        by_role.setdefault(a.role, set()).add(id(a.policy))
    return [a.role if len(by_role[a.role]) == 1 else a.name for a in agents]


def _batch(policies: list):
    """The policy serving a group's rows: the one policy, or a mixed batch over several adapters."""
    first = policies[0]
    if all(p is first for p in policies):
        return first
    from swarm_runtime.models.mixed_batch import MixedBatch

    return MixedBatch(policies)


class LocalSampler:
    """Samples in process from ``policies`` (model name -> policy)."""

    name = "local"

    def __init__(self, policies: Mapping[str, Policy], learner: Learner | None = None):
        self.policies = dict(policies)
        self.learner = learner
        self._versions: dict[str, int] = {m: (learner.version(m) if learner else 0) for m in self.policies}

    @classmethod
    def for_agents(cls, agents: Sequence) -> tuple[LocalSampler, list[str]]:
        """A sampler over the agents' own policies, and each agent's model name."""
        names = model_names(agents)
        return cls({n: a.policy for n, a in zip(names, agents)}), names

    def bid_levels(self, model: str):
        return getattr(self.policies[model], "bid_levels", None)

    def version(self, model: str) -> int:
        return self._versions.get(model, 0)

    def _groups(self, rows: Sequence[Row]) -> list[tuple[object, list[int]]]:
        """Row indices grouped by policy, and by shared base (one mixed batch), in first-seen order."""
        groups: dict[int, tuple[list, list[int]]] = {}
        for i, r in enumerate(rows):
            policy = self.policies[r.model]
            shared = getattr(policy, "shared_base", None)
            g = groups.setdefault(id(policy) if shared is None else id(shared), ([], []))
            g[0].append(policy)
            g[1].append(i)
        return [(_batch(policies), idx) for policies, idx in groups.values()]

    def _sample(self, method: str, rows: Sequence[Row]) -> list:
        out: list = [None] * len(rows)
        keyed = bool(rows) and all(r.key is not None for r in rows)
        for policy, idx in self._groups(rows):
            prompts = [rows[i].prompt for i in idx]
            fn = getattr(policy, method)
            res = fn(prompts, keys=[rows[i].key for i in idx]) if keyed else fn(prompts)
            for i, r in zip(idx, res):
                r.version = self.version(rows[i].model)
                out[i] = r
        return out

    def bid(self, rows: Sequence[Row]) -> list[Bid]:
        return self._sample("bid", rows)

    def act(self, rows: Sequence[Row]) -> list[Response]:
        return self._sample("act", rows)

    def sync(self, learner: Learner, models: Sequence[str]) -> None:
        for m in models:
            self._versions[m] = learner.version(m)

    def close(self) -> None:
        pass


class LocalLearner:
    """The trainable policies of a run (model name -> policy) and the version count of each."""

    def __init__(self, policies: Mapping[str, Policy]):
        self.policies = dict(policies)
        self._versions = {m: 0 for m in self.policies}
        self._history: dict[str, list[int]] = {m: [0] for m in self.policies}  #: every version each model took

    def policy(self, model: str) -> Policy:
        return self.policies[model]

    def models(self) -> list[str]:
        return list(self.policies)

    def version(self, model: str) -> int:
        return self._versions.get(model, 0)

    def bump(self, models: Sequence[str], version: int | None = None) -> None:
        """``models`` took an update: their version becomes ``version`` (the run's update count), or goes up by one."""
        for m in models:
            self._versions[m] = self._versions.get(m, 0) + 1 if version is None else int(version)
            self._history.setdefault(m, []).append(self._versions[m])

    def behind(self, model: str, version: int) -> int:
        """How many updates of ``model`` the weights of ``version`` lack (0: its current weights): the updates
        that changed it since, not the run's updates since (a role an update left alone did not move)."""
        return sum(v > int(version) for v in self._history.get(model, ()))

    def set_versions(self, versions: Mapping[str, int]) -> None:
        """Versions restored from a checkpoint (a resumed run goes on counting)."""
        self._versions.update({m: int(v) for m, v in versions.items() if m in self.policies})
        self._history.update({m: [int(v)] for m, v in versions.items() if m in self.policies})

    def export(self, model: str, folder: Path) -> Path:
        """The model's weights in the format its sampler loads: ``save`` writes a PEFT adapter folder for
        an adapter policy and a Hugging Face folder for a full copy."""
        folder = Path(folder)
        self.policies[model].save(folder)
        return folder


class LockedSampler:
    """A sampler shared by threads (rollouts played ahead while the trainer branches and syncs): one call at a
    time, each whole, so a sync never lands in the middle of a batch."""

    def __init__(self, inner):
        import threading

        self.inner, self.name, self._lock = inner, inner.name, threading.Lock()

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def bid(self, rows):
        with self._lock:
            return self.inner.bid(rows)

    def act(self, rows):
        with self._lock:
            return self.inner.act(rows)

    def sync(self, learner, models) -> None:
        with self._lock:
            self.inner.sync(learner, models)

    def version(self, model: str) -> int:
        return self.inner.version(model)

    def close(self) -> None:
        self.inner.close()
