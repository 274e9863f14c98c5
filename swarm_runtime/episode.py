"""The batched episode loop (docs/method.md, section 1; docs/architecture.md).

Every turn, for every live env: all present agents' bid prompts go to their
models in one batch per model, the coordinator (the auction) picks the actor,
the winners' action prompts go out in one batch per model, and the envs step.
Agents that share a model (replicas of a role) share one batch. A ``presence``
function gives the active-agents mask (dropout, extra replicas).

Optional coordinator capabilities (all off by default; see docs/plugins.md 3.2):
``uses_proposals`` (the agents ``coordinator.proposers(bids, rng, turn)`` names
each sample an action first, and the chosen agent's proposal is the turn's
action), ``wants_info`` (``select`` also receives ``info=TurnInfo(last_actor,
proposals, scores)``), ``judge_pairs(proposers, last_actor)`` (pairs ``(j, p)``:
agent ``j``'s action model scores proposal ``p`` on ``p``'s action prompt, mean
per-token log-probability without gradients, passed as ``info.scores``) and
``bid_scorer(agent, last_actor)`` (the index of the agent whose model scores
``agent``'s bid prompt; by default the agent's own).
An :class:`Agent` with ``prompt_kind="single"`` (one monolithic model) acts on
the domain's ``single_prompt`` and steps the env with ``role=None``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from swarm_runtime.auction import AuctionResult
from swarm_runtime.domain import Domain, Event
from swarm_runtime.env import ValidatedEnv, close_all, closing_all
from swarm_runtime.policy import noise as keyed
from swarm_runtime.policy.base import Policy, Response
from swarm_runtime.rollout.base import Row, Sampler
from swarm_runtime.rollout.engine import Batch, Rounds, TurnEngine
from swarm_runtime.rollout.local import LocalSampler, _batch, model_names


@dataclass
class Agent:
    """One member of the swarm: a name, a role and a model (replicas share the model)."""

    name: str
    role: str
    policy: Policy
    #: ``role``: bid and act on the role's prompts; ``single``: one model acting on the domain's
    #: ``single_prompt``, stepping the env with ``role=None`` (a monolithic model may do anything).
    prompt_kind: str = "role"

    def action_prompt(self, domain: Domain, observation: str, log: list[Event]) -> str:
        if self.prompt_kind == "single":
            return domain.single_prompt(observation, log)
        return domain.action_prompt(self.role, observation, log)

    @property
    def env_role(self) -> str | None:
        """The role the env is stepped with (``None`` for a single monolithic model)."""
        return None if self.prompt_kind == "single" else self.role

    @property
    def log_role(self) -> str:
        """Who the public log says acted (the monolithic model is logged as :data:`SINGLE_ACTOR`)."""
        return SINGLE_ACTOR if self.prompt_kind == "single" else self.role


#: The actor name a single monolithic model's turns carry in the public log (a core template word,
#: so every tokenizer knows it; the monolithic SFT demos use it too).
SINGLE_ACTOR = "you"


@dataclass
class Turn:
    """Everything credit assignment and counterfactual branches need about one decision."""

    t: int
    bids: list[float | None]
    bid_tokens: list[list[int] | None]
    bid_prompts: list[str | None]
    auction: AuctionResult
    action_prompt: str | None = None
    action_tokens: list[int] | None = None
    action_text: str = ""
    reward: float = 0.0
    valid: bool = True
    snapshot: Any = None  #: (env snapshot, log) taken before the action, for branching
    #: the sampler's per-token log-probs of ``action_tokens`` and the weight version that sampled them
    #: (what the learner's recomputed log-probs are compared with: :mod:`swarm_runtime.rollout.mismatch`)
    action_logprobs: list[float] | None = None
    action_version: int | None = None

    @property
    def winner(self) -> int | None:
        return self.auction.winner


@dataclass
class Episode:
    seed: int
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    unparsed_bids: int = 0
    invalid_actions: int = 0
    reward_missing: bool = False
    #: common random numbers: every draw of this episode (bids, actions, tie-breaks) is keyed by
    #: (noise, turn, agent, kind) instead of coming from the policies' generators; None = generators
    noise: int | None = None

    @property
    def acted(self) -> list[Turn]:
        return [t for t in self.turns if t.winner is not None]


@dataclass
class ForcedTurn:
    """A first turn whose bids and winner are given (a counterfactual branch), and optionally the
    winner's action (``None``: the winner samples it as usual)."""

    bids: list[float | None]
    bid_tokens: list[list[int] | None]
    bid_prompts: list[str | None]
    winner: int
    action: Response | None = None


@dataclass
class Slot:
    env: ValidatedEnv
    episode: Episode
    log: list[Event]
    t: int = 0
    forced: ForcedTurn | None = None
    finished: bool = False
    last_actor: int | None = None  #: index of the agent that acted last (for routing coordinators)
    stop_at: int | None = None  #: end the slot after this many decisions of its episode (a branch's horizon)


@dataclass(frozen=True)
class TurnInfo:
    """What a coordinator with ``wants_info = True`` receives besides the bids."""

    last_actor: int | None  #: index of the agent that acted last in this episode (None before anyone acted)
    proposals: dict[int, str]  #: agent index -> its proposed action text (``uses_proposals`` coordinators)
    #: (judge index, proposer index) -> judge's action model's mean per-token log-prob of the proposal
    #: on the proposer's action prompt (coordinators with ``judge_pairs``)
    scores: dict = field(default_factory=dict)


Presence = Callable[[int, int, int], Sequence[bool]]  # (seed, turn, n_agents) -> mask


def make_env(domain: Domain, task) -> ValidatedEnv:
    bounds = (float(task.get("reward_min", 0.0)), float(task.reward_max))
    return ValidatedEnv(domain.make_env(task), domain.name, bounds, task=task.get("name"))


def new_slots(domain: Domain, task, seeds: Sequence[int]) -> list[Slot]:
    slots = []
    try:
        for seed in seeds:
            slots.append(Slot(make_env(domain, task), Episode(seed), []))
            slots[-1].env.reset(seed)
    except BaseException:
        close_all((s.env for s in slots), quiet=True)  # a reset that raised: the envs made so far are not leaked
        raise
    return slots


def prefetch_steps(steps: list[tuple[ValidatedEnv, str, str | None]]) -> None:
    """Send each ``(env, action, role)`` step to envs that take it ahead (``prefetch_step``: an env worker's
    remote env, :mod:`swarm_runtime.cluster.remote`), so that they run concurrently; ``env.step`` collects it."""
    for env, action, role in steps:
        prefetch = getattr(getattr(env, "env", env), "prefetch_step", None)
        if prefetch is not None and not getattr(env, "closed", False) and not env.done:
            prefetch(action, role)


def checked_bid(level, parsed: bool, levels) -> tuple[float, bool]:
    """A backend's bid as the auction takes it: a configured level, else (NaN, 5.0, -0.5, a
    string...) 0.0 and counted as unparsed, never a crash or a credit from an impossible bid."""
    if levels is None:
        return level, parsed
    ok = (isinstance(level, (int, float)) and not isinstance(level, bool)
          and any(level == float(b) for b in levels))
    return (level, parsed) if ok else (0.0, False)


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


def _rows(requests: list, model_of: Callable[[tuple], str], prompt_of: Callable[[tuple], str], kind: int) -> list[Row]:
    """Sampler rows for ``requests`` (each ``(slot, agent, ...)``); when every request's slot has a
    noise id, each row carries its key ``(noise, turn, agent, kind)``."""
    keyed_rows = bool(requests) and all(r[0].episode.noise is not None for r in requests)
    return [Row(model_of(r), prompt_of(r), (r[0].episode.noise, r[0].t, r[1], kind) if keyed_rows else None)
            for r in requests]


def _slot_rng(s: Slot, rng: random.Random) -> random.Random:
    """The coordinator's randomness for this slot's turn: keyed under common random numbers."""
    if s.episode.noise is None:
        return rng
    return random.Random(keyed.key_hash(s.episode.noise, s.t, keyed.COORDINATOR))


def play(slots: list[Slot], agents: list[Agent], coordinator, domain: Domain, max_decisions: int,
         rng: random.Random, *, record_snapshots: bool = False, presence: Presence | None = None,
         on_turn: Callable | None = None, sampler: Sampler | None = None,
         models: Sequence[str] | None = None) -> list[Episode]:
    """Play every slot to the end (env done, ``max_decisions``, or the slot's ``stop_at``) and return
    their episodes: the :class:`AuctionTurns` strategy on the turn engine. Bids and actions come from
    ``sampler`` (default: in process, from the agents' own policies), agent ``i`` from the weights
    ``models[i]`` (:func:`~swarm_runtime.rollout.local.model_names`). The slots' envs are closed at the end,
    also when the batch raised (``DomainEnv.close()``)."""
    if sampler is None:
        sampler, models = LocalSampler.for_agents(agents)
    elif models is None:
        models = model_names(agents)
    turns = AuctionTurns(agents, models, coordinator, domain, max_decisions, rng, record_snapshots=record_snapshots,
                         presence=presence, on_turn=on_turn)
    with closing_all([s.env for s in slots]):  # the slots' envs end with the batch; snapshots taken stay restorable
        return TurnEngine(sampler).run(turns.rounds(slots))


class AuctionTurns:
    """The auction's way of taking turns, as a turn-engine strategy (:mod:`swarm_runtime.rollout.engine`):
    each turn, for every live slot, all present agents bid (one batch across slots and models), the
    coordinator picks the actor, the winners act (one batch), the envs step. ``models[i]``: the weights
    agent ``i`` samples from (a row's model)."""

    def __init__(self, agents: list[Agent], models: Sequence[str], coordinator, domain: Domain, max_decisions: int,
                 rng: random.Random, *, record_snapshots: bool = False, presence: Presence | None = None,
                 on_turn: Callable | None = None):
        self.agents, self.models, self.coordinator, self.domain = agents, list(models), coordinator, domain
        self.max_decisions, self.rng = max_decisions, rng
        self.record_snapshots, self.presence, self.on_turn = record_snapshots, presence, on_turn

    def rounds(self, slots: list[Slot]) -> Rounds:
        """Play ``slots`` to the end, yielding each turn's bid and action batches; returns their episodes."""
        agents, models, coordinator, domain = self.agents, self.models, self.coordinator, self.domain
        max_decisions, rng, presence, on_turn = self.max_decisions, self.rng, self.presence, self.on_turn
        record_snapshots = self.record_snapshots
        n = len(agents)
        scorer = getattr(coordinator, "bid_scorer", None)
        wants_info = bool(getattr(coordinator, "wants_info", False))
        uses_proposals = bool(getattr(coordinator, "uses_proposals", False))
        judge_pairs = getattr(coordinator, "judge_pairs", None)
        while True:
            live = [s for s in slots if not s.finished]
            if not live:
                break
            obs = {id(s): s.env.observation() for s in live}
            masks = {id(s): list(presence(s.episode.seed, s.t, n)) if presence else [True] * n for s in live}
            # 1. sealed bids, one batch per model
            bids: dict[int, list] = {id(s): [None] * n for s in live}
            btoks: dict[int, list] = {id(s): [None] * n for s in live}
            bprompts: dict[int, list] = {id(s): [None] * n for s in live}
            requests = []
            for s in live:
                if s.forced is not None:
                    continue
                for a, agent in enumerate(agents):
                    if not masks[id(s)][a]:
                        continue
                    if coordinator.uses_bids:
                        p = domain.bid_prompt(agent.role, obs[id(s)], s.log)
                        bprompts[id(s)][a] = p
                        judge = scorer(a, s.last_actor) if scorer is not None else a
                        requests.append((s, a, p, judge))
                    else:
                        bids[id(s)][a] = 0.0
            answers = yield Batch("bid", _rows(requests, lambda r: models[r[3]], lambda r: r[2], keyed.BID))
            for (s, a, _, judge), b in zip(requests, answers):
                level, parsed = checked_bid(b.level, b.parsed, getattr(agents[judge].policy, "bid_levels", None))
                bids[id(s)][a], btoks[id(s)][a] = level, b.tokens
                s.episode.unparsed_bids += int(not parsed)
            # 1b. proposals: the agents the coordinator names sample an action first (one batch per model)
            proposals: dict[int, dict] = {id(s): {} for s in live}
            if uses_proposals:
                preqs = []
                for s in live:
                    if s.forced is None:
                        for a in coordinator.proposers(bids[id(s)], _slot_rng(s, rng), s.t):
                            preqs.append((s, a, agents[a].action_prompt(domain, obs[id(s)], s.log)))
                answers = yield Batch("act", _rows(preqs, lambda r: models[r[1]], lambda r: r[2], keyed.ACTION))
                for (s, a, _), r in zip(preqs, answers):
                    proposals[id(s)][a] = r
            # 1c. proposal scores: the pairs the coordinator names, one batch per judging model
            scores: dict[int, dict] = {id(s): {} for s in live}
            if uses_proposals and judge_pairs is not None:
                sreqs = []
                for s in live:
                    props = proposals[id(s)]
                    prompts = {p: agents[p].action_prompt(domain, obs[id(s)], s.log) for p in props}
                    for j, p in judge_pairs(sorted(props), s.last_actor):
                        tokens = agents[j].policy.action_target(props[p].text)
                        sreqs.append(((s, j, p, prompts[p], tokens), agents[j].policy))
                for policy, keys in _group(sreqs):
                    with torch.no_grad():
                        lp = policy.logprobs([k[3] for k in keys], [k[4] for k in keys])
                    for (s, j, p, _, tokens), v in zip(keys, lp.tolist()):
                        scores[id(s)][(j, p)] = float(v) / max(1, len(tokens))
            # 2. the coordinator picks who acts
            turns: dict[int, Turn] = {}
            for s in live:
                if s.forced is not None:
                    f = s.forced
                    res = AuctionResult(f.winner, None, float(f.bids[f.winner] or 0.0), 0.0)
                    turns[id(s)] = Turn(s.t, list(f.bids), list(f.bid_tokens), list(f.bid_prompts), res)
                    if f.action is not None:
                        proposals[id(s)][f.winner] = f.action
                    s.forced = None
                else:
                    if wants_info:
                        info = TurnInfo(s.last_actor, {a: r.text for a, r in proposals[id(s)].items()}, scores[id(s)])
                        res = coordinator.select(bids[id(s)], _slot_rng(s, rng), s.t, info=info)
                    else:
                        res = coordinator.select(bids[id(s)], _slot_rng(s, rng), s.t)
                    turns[id(s)] = Turn(s.t, bids[id(s)], btoks[id(s)], bprompts[id(s)], res)
            # 3. the winners act, one batch per model
            acts = []
            for s in live:
                turn = turns[id(s)]
                if turn.winner is None:
                    continue
                agent = agents[turn.winner]
                turn.action_prompt = agent.action_prompt(domain, obs[id(s)], s.log)
                if record_snapshots and turn.auction.contested:
                    turn.snapshot = (s.env.snapshot(), list(s.log))
                proposal = proposals[id(s)].get(turn.winner)
                if proposal is not None:  # the chosen proposal (or a forced action) is the action, on the same prompt
                    turn.action_text, turn.action_tokens = proposal.text, proposal.tokens
                    turn.action_logprobs, turn.action_version = proposal.logprobs, proposal.version
                    continue
                acts.append((s, turn.winner, turn))
            answers = yield Batch("act", _rows(acts, lambda r: models[r[1]], lambda r: r[2].action_prompt,
                                               keyed.ACTION))
            for (s, _, turn), r in zip(acts, answers):
                turn.action_text, turn.action_tokens = r.text, r.tokens
                turn.action_logprobs, turn.action_version = r.logprobs, r.version
            # 4. envs step; skipped turns still count toward the cap. Envs that can (remote ones) are sent their
            # step first, all at once, and collected below
            prefetch_steps([(s.env, turns[id(s)].action_text, agents[turns[id(s)].winner].env_role) for s in live
                            if turns[id(s)].winner is not None])
            for s in live:
                turn = turns[id(s)]
                if turn.winner is not None:
                    actor = agents[turn.winner]
                    res = s.env.step(turn.action_text, actor.env_role)
                    turn.reward, turn.valid = float(res.reward), res.valid
                    s.episode.invalid_actions += int(not res.valid)
                    s.episode.reward_missing |= bool(res.info.get("reward_missing", False))
                    s.log.append(Event(s.t, actor.log_role, turn.action_text, res.valid, turn.reward))
                    s.last_actor = turn.winner
                else:
                    s.log.append(Event(s.t, None, ""))
                s.episode.turns.append(turn)
                s.t += 1
                if s.env.done or s.t >= max_decisions or (s.stop_at is not None and s.t >= s.stop_at):
                    s.finished = True
                    s.episode.reward = sum(t.reward for t in s.episode.turns)
                    s.episode.metrics = dict(s.env.metrics())
            if on_turn is not None:
                on_turn(live, turns)
        return [s.episode for s in slots]
