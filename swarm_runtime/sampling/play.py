"""Playing episodes in this process: the core loop (:class:`~swarm_runtime.core.loop.AuctionTurns`) driven by
the turn engine over a sampler (in process by default, or an inference server), the proposals of judging
coordinators scored by their models here (:func:`score_entries`), the slots' envs stepped here or on their env
workers."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from swarm_runtime.core.domain import Domain
from swarm_runtime.core.engine import TurnEngine
from swarm_runtime.core.env import closing_all
from swarm_runtime.core.episode import Agent, Episode, Slot
from swarm_runtime.core.loop import AuctionTurns, Presence
from swarm_runtime.core.protocols import Sampler
from swarm_runtime.sampling.local import LocalSampler, _batch, model_names


def _group(pairs):
    """Group (key, policy) pairs by policy object identity, keeping order. Policies sharing one base
    (``model.adapter=lora``: ``policy.shared_base``) form one group, served by one mixed-adapter batch."""
    groups: dict[int, tuple[list, list]] = {}
    for key, policy in pairs:
        shared = getattr(policy, "shared_base", None)
        g = groups.setdefault(id(policy) if shared is None else id(shared), ([], []))
        g[0].append(key)
        g[1].append(policy)
    return [(_batch(policies), keys) for keys, policies in groups.values()]


def play(
    slots: list[Slot],
    agents: list[Agent],
    coordinator,
    domain: Domain,
    max_decisions: int,
    rng: random.Random,
    *,
    record_snapshots: bool = False,
    presence: Presence | None = None,
    on_turn: Callable | None = None,
    sampler: Sampler | None = None,
    models: Sequence[str] | None = None,
) -> list[Episode]:
    """Play every slot to the end (env done, ``max_decisions``, or the slot's ``stop_at``) and return
    their episodes: the :class:`AuctionTurns` strategy on the turn engine. Bids and actions come from
    ``sampler`` (default: in process, from the agents' own policies), agent ``i`` from the weights
    ``models[i]`` (:func:`~swarm_runtime.sampling.local.model_names`). The slots' envs are closed at the end,
    also when the batch raised (``DomainEnv.close()``)."""
    if sampler is None:
        sampler, models = LocalSampler.for_agents(agents)
    elif models is None:
        models = model_names(agents)
    turns = AuctionTurns.for_agents(
        agents,
        models,
        coordinator,
        domain,
        max_decisions,
        rng,
        record_snapshots=record_snapshots,
        presence=presence,
        on_turn=on_turn,
    )
    with closing_all([s.env for s in slots]):  # the slots' envs end with the batch; snapshots taken stay restorable
        return TurnEngine(sampler, score_entries).run(turns.rounds(slots))


def score_entries(entries: list) -> list[float]:
    """Each entry's judge's mean per-token log-probability of the proposal on the proposer's prompt,
    without gradients; one batch per judging model (policies sharing a base together), in order."""
    out: dict[int, float] = {}
    for policy, keys in _group([((i, *e[0]), e[1]) for i, e in enumerate(entries)]):
        with torch.no_grad():
            lp = policy.logprobs([k[3] for k in keys], [k[4] for k in keys])
        for k, v in zip(keys, lp.tolist()):
            out[k[0]] = float(v) / max(1, len(k[4]))
    return [out[i] for i in range(len(entries))]
