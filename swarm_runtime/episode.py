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

One turn of one episode is :meth:`Auction.turn` (a generator of turn-engine batches), the auction code
``swarm serve``'s gateway runs too (:class:`swarm_runtime.serve.turns.ServedTurns`); :class:`AuctionTurns`
runs one per live slot in lockstep (:func:`lockstep`), then steps the envs (:func:`step_turn`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    #: per agent: the sampler's per-token log-probs of its bid response in ``bid_tokens`` (None: no bid, or
    #: none reported); the Bradley-Terry update compares the learner's with them (``mismatch/bid_*``)
    bid_logprobs: list[list[float] | None] | None = None

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
    ok = isinstance(level, (int, float)) and not isinstance(level, bool) and any(level == float(b) for b in levels)
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


def coordinator_rng(noise: int, t: int) -> random.Random:
    """The coordinator's keyed randomness for turn ``t`` of the episode whose noise id is ``noise``
    (common random numbers: the same in process and served)."""
    return random.Random(keyed.key_hash(noise, t, keyed.COORDINATOR))


def _slot_rng(s: Slot, rng: random.Random) -> random.Random:
    """The coordinator's randomness for this slot's turn: keyed under common random numbers."""
    if s.episode.noise is None:
        return rng
    return coordinator_rng(s.episode.noise, s.t)


def accept_bid(episode: Episode, bid, levels) -> float:
    """The level ``bid`` (a :class:`~swarm_runtime.policy.base.Bid`) enters the auction with
    (:func:`checked_bid`); an unparsed one is counted on ``episode``."""
    level, parsed = checked_bid(bid.level, bid.parsed, levels)
    episode.unparsed_bids += int(not parsed)
    return level


def step_turn(
    env, episode: Episode, log: list[Event], turn: Turn, env_role: str | None = None, log_role: str | None = None
) -> None:
    """Settle a decided ``turn``: the env steps with the winner's action as ``env_role`` (the turn's
    reward and validity, the episode's invalid-action and missing-reward counters, the public log's
    event by ``log_role``), or the log records a skipped turn."""
    if turn.winner is not None:
        res = env.step(turn.action_text, env_role)
        turn.reward, turn.valid = float(res.reward), res.valid
        episode.invalid_actions += int(not res.valid)
        episode.reward_missing |= bool(res.info.get("reward_missing", False))
        log.append(Event(turn.t, log_role, turn.action_text, res.valid, turn.reward))
    else:
        log.append(Event(turn.t, None, ""))


def finish_episode(episode: Episode, env) -> None:
    """An ended episode's return (its turns' rewards) and the env's final metrics."""
    episode.reward = sum(t.reward for t in episode.turns)
    episode.metrics = dict(env.metrics())


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
    ``models[i]`` (:func:`~swarm_runtime.rollout.local.model_names`). The slots' envs are closed at the end,
    also when the batch raised (``DomainEnv.close()``)."""
    if sampler is None:
        sampler, models = LocalSampler.for_agents(agents)
    elif models is None:
        models = model_names(agents)
    turns = AuctionTurns(
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
        return TurnEngine(sampler).run(turns.rounds(slots))


@dataclass
class Decided:
    """What one auction turn decided, before the env steps: the :class:`Turn`, the agents whose bid
    did not come (an answer ``None``), in the order they were asked, and the winners whose action did not
    come, in the order they failed (each withdrawn, the coordinator picked again)."""

    turn: Turn
    missed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Scores:
    """A turn's request for proposal scores (``judge_pairs`` coordinators): entries ``((judge, proposer,
    prompt, tokens), policy)``, answered by :func:`score_entries` (no sampler: the policies score directly)."""

    entries: list


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


class Auction:
    """One auction turn of one episode as a generator of turn-engine batches (:meth:`turn`): the one auction
    code behind batched rollouts (:class:`AuctionTurns`, a lockstep of these over its slots) and ``swarm
    serve``'s gateway (:class:`swarm_runtime.serve.turns.ServedTurns`).

    How it reaches agent ``i``: ``bid_prompt(i, observation, log)`` and ``action_prompt(i, ...)``;
    ``bid_row(i, prompt, key, last_actor)`` / ``act_row(i, prompt, key)`` the sampler rows (``key``:
    ``(noise, turn, i, kind)``, ``None`` without noise); ``bid_levels(i, last_actor)`` the levels its bid
    is checked against. ``ask_bids``: ask for bids even when the coordinator does not use them (else
    present agents bid 0.0 unasked). ``proposals``: the coordinator's ``uses_proposals`` protocol (and
    ``judge``: ``(j, text) -> (tokens, policy)`` for its ``judge_pairs``); ``wants_info``: ``select``
    gets :class:`TurnInfo`."""

    def __init__(
        self,
        coordinator,
        *,
        bid_prompt: Callable,
        action_prompt: Callable,
        bid_row: Callable,
        act_row: Callable,
        bid_levels: Callable,
        ask_bids: bool = True,
        proposals: bool = False,
        wants_info: bool = False,
        judge: Callable | None = None,
    ):
        self.coordinator = coordinator
        self.bid_prompt, self.action_prompt, self.bid_row, self.act_row = bid_prompt, action_prompt, bid_row, act_row
        self.bid_levels, self.ask_bids, self.proposals, self.wants_info = bid_levels, ask_bids, proposals, wants_info
        self.judge_pairs = getattr(coordinator, "judge_pairs", None) if proposals else None
        self.judge = judge

    def _select(self, bids, rng, t, last_actor, proposals, scores):
        if self.wants_info:
            info = TurnInfo(last_actor, {a: r.text for a, r in proposals.items()}, scores)
            return self.coordinator.select(bids, rng, t, info=info)
        return self.coordinator.select(bids, rng, t)

    def turn(
        self,
        episode: Episode,
        n: int,
        t: int,
        log: list[Event],
        observation: str,
        *,
        bidders: Sequence[int],
        rng: Callable[[], random.Random],
        last_actor: int | None = None,
        forced: ForcedTurn | None = None,
        snapshot: Callable | None = None,
    ):
        """Decide turn ``t`` of ``episode`` (``n`` agents; ``bidders`` are asked, unless ``forced``): yields
        ``Batch("bid")``, ``Batch("act")`` of the proposals (``proposals``) and :class:`Scores`, then one
        ``Batch("act")`` (empty when the turn is skipped or the action is a proposal) and one more per
        failed winner; returns :class:`Decided`. ``rng()``: the coordinator's randomness (called once
        for the proposers and once for the selection, whose failovers go on drawing from it);
        ``snapshot()``: taken before a contested turn's action. Counts unparsed bids on ``episode``."""
        noise = episode.noise

        def key(i, kind):
            return None if noise is None else (noise, t, i, kind)

        bids: list = [None] * n
        btoks: list = [None] * n
        blps: list = [None] * n
        bprompts: list = [None] * n
        asked = []
        if forced is None:
            for a in bidders:
                if self.ask_bids or self.coordinator.uses_bids:
                    bprompts[a] = self.bid_prompt(a, observation, log)
                    asked.append(a)
                else:
                    bids[a] = 0.0
        answers = yield Batch("bid", [self.bid_row(a, bprompts[a], key(a, keyed.BID), last_actor) for a in asked])
        missed = []
        for a, b in zip(asked, answers):
            if b is None:
                missed.append(a)
                continue
            bids[a] = accept_bid(episode, b, self.bid_levels(a, last_actor))
            btoks[a], blps[a] = b.tokens, getattr(b, "logprobs", None)
        # proposals: the agents the coordinator names sample an action first
        proposals: dict = {}
        if self.proposals:
            preqs = []
            if forced is None:
                preqs = [
                    (a, self.action_prompt(a, observation, log)) for a in self.coordinator.proposers(bids, rng(), t)
                ]
            answers = yield Batch("act", [self.act_row(a, p, key(a, keyed.ACTION)) for a, p in preqs])
            for (a, _), r in zip(preqs, answers):
                proposals[a] = r
        # proposal scores: the pairs the coordinator names
        scores: dict = {}
        if self.judge_pairs is not None:
            prompts = {p: self.action_prompt(p, observation, log) for p in proposals}
            pairs, entries = self.judge_pairs(sorted(proposals), last_actor), []
            for j, p in pairs:
                tokens, policy = self.judge(j, proposals[p].text)
                entries.append(((j, p, prompts[p], tokens), policy))
            values = yield Scores(entries)
            scores = {(e[0][0], e[0][1]): v for e, v in zip(entries, values)}
        # the coordinator picks who acts
        if forced is not None:
            res = AuctionResult(forced.winner, None, float(forced.bids[forced.winner] or 0.0), 0.0)
            turn = Turn(t, list(forced.bids), list(forced.bid_tokens), list(forced.bid_prompts), res)
            if forced.action is not None:
                proposals[forced.winner] = forced.action
            sel_rng, live = None, None
        else:
            sel_rng, live = rng(), list(bids)
            turn = Turn(
                t,
                bids,
                btoks,
                bprompts,
                self._select(live, sel_rng, t, last_actor, proposals, scores),
                bid_logprobs=blps,
            )
        # the winner acts; a winner whose action does not come is withdrawn and the coordinator picks again
        failed = []
        while True:
            if turn.winner is None:
                yield Batch("act", [])
                break
            turn.action_prompt = self.action_prompt(turn.winner, observation, log)
            if snapshot is not None and turn.auction.contested:
                turn.snapshot = snapshot()
            proposal = proposals.get(turn.winner)
            if proposal is not None:  # the chosen proposal (or a forced action) is the action, on the same prompt
                yield Batch("act", [])
                r = proposal
            else:
                (r,) = yield Batch(
                    "act", [self.act_row(turn.winner, turn.action_prompt, key(turn.winner, keyed.ACTION))]
                )
            if r is not None:
                turn.action_text, turn.action_tokens = r.text, r.tokens
                turn.action_logprobs, turn.action_version = r.logprobs, r.version
                break
            failed.append(turn.winner)
            live[turn.winner] = None
            turn.auction = self._select(live, sel_rng, t, last_actor, proposals, scores)
            turn.action_prompt = None
        return Decided(turn, missed, failed)


def lockstep(turns: list) -> Rounds:
    """Run per-episode turn generators (:meth:`Auction.turn`) together: each step, their batches of one
    kind go out as one batch (rows in the generators' order; keyed only if every row is), :class:`Scores`
    are answered in one pass; returns their results in order."""
    results: list = [None] * len(turns)
    pending = {}
    for i, g in enumerate(turns):
        pending[i] = g.send(None)
    while pending:
        answers: dict[int, Any] = {}
        groups: dict = {}
        for i, req in pending.items():
            groups.setdefault("score" if isinstance(req, Scores) else req.kind, []).append(i)
        for kind, idx in groups.items():
            if kind == "score":
                flat = score_entries([e for i in idx for e in pending[i].entries])
            else:
                rows = [r for i in idx for r in pending[i].rows]
                if any(r.key is None for r in rows):
                    rows = [Row(r.model, r.prompt, None, r.context) for r in rows]
                flat = yield Batch(kind, rows)
            at = 0
            for i in idx:
                k = len(pending[i].entries if kind == "score" else pending[i].rows)
                answers[i], at = flat[at : at + k], at + k
        for i in list(pending):
            try:
                pending[i] = turns[i].send(answers[i])
            except StopIteration as stop:
                results[i] = stop.value
                del pending[i]
    return results


class AuctionTurns:
    """The auction's way of taking turns, as a turn-engine strategy (:mod:`swarm_runtime.rollout.engine`):
    each turn, for every live slot, all present agents bid (one batch across slots and models), the
    coordinator picks the actor, the winners act (one batch), the envs step. ``models[i]``: the weights
    agent ``i`` samples from (a row's model)."""

    def __init__(
        self,
        agents: list[Agent],
        models: Sequence[str],
        coordinator,
        domain: Domain,
        max_decisions: int,
        rng: random.Random,
        *,
        record_snapshots: bool = False,
        presence: Presence | None = None,
        on_turn: Callable | None = None,
    ):
        self.agents, self.models, self.coordinator, self.domain = agents, list(models), coordinator, domain
        self.max_decisions, self.rng = max_decisions, rng
        self.record_snapshots, self.presence, self.on_turn = record_snapshots, presence, on_turn

    def auction(self) -> Auction:
        """The auction turn over these agents: bid rows go to the model of the agent that scores the bid
        (``bid_scorer``), actions to the agent's own."""
        agents, models, coordinator, domain = self.agents, self.models, self.coordinator, self.domain
        scorer = getattr(coordinator, "bid_scorer", None)

        def judge_of(a, last_actor):
            return scorer(a, last_actor) if scorer is not None else a

        return Auction(
            coordinator,
            bid_prompt=lambda a, obs, log: domain.bid_prompt(agents[a].role, obs, log),
            action_prompt=lambda a, obs, log: agents[a].action_prompt(domain, obs, log),
            bid_row=lambda a, prompt, key, last: Row(models[judge_of(a, last)], prompt, key),
            act_row=lambda a, prompt, key: Row(models[a], prompt, key),
            bid_levels=lambda a, last: getattr(agents[judge_of(a, last)].policy, "bid_levels", None),
            ask_bids=False,
            proposals=bool(getattr(coordinator, "uses_proposals", False)),
            wants_info=bool(getattr(coordinator, "wants_info", False)),
            judge=lambda j, text: (agents[j].policy.action_target(text), agents[j].policy),
        )

    def rounds(self, slots: list[Slot]) -> Rounds:
        """Play ``slots`` to the end, yielding each turn's bid and action batches; returns their episodes."""
        agents, max_decisions, rng, presence, on_turn = (
            self.agents,
            self.max_decisions,
            self.rng,
            self.presence,
            self.on_turn,
        )
        n, auction = len(agents), self.auction()
        while True:
            live = [s for s in slots if not s.finished]
            if not live:
                break
            obs = {id(s): s.env.observation() for s in live}
            masks = {id(s): list(presence(s.episode.seed, s.t, n)) if presence else [True] * n for s in live}
            gens = []
            for s in live:
                forced, s.forced = s.forced, None
                snap = (lambda s=s: (s.env.snapshot(), list(s.log))) if self.record_snapshots else None
                gens.append(
                    auction.turn(
                        s.episode,
                        n,
                        s.t,
                        s.log,
                        obs[id(s)],
                        bidders=[a for a in range(n) if masks[id(s)][a]],
                        rng=lambda s=s: _slot_rng(s, rng),
                        last_actor=s.last_actor,
                        forced=forced,
                        snapshot=snap,
                    )
                )
            decided = yield from lockstep(gens)
            turns: dict[int, Turn] = {id(s): d.turn for s, d in zip(live, decided)}
            # the envs step; skipped turns still count toward the cap. Envs that can (remote ones) are sent their
            # step first, all at once, and collected below
            prefetch_steps(
                [
                    (s.env, turns[id(s)].action_text, agents[turns[id(s)].winner].env_role)
                    for s in live
                    if turns[id(s)].winner is not None
                ]
            )
            for s in live:
                turn = turns[id(s)]
                if turn.winner is not None:
                    actor = agents[turn.winner]
                    step_turn(s.env, s.episode, s.log, turn, actor.env_role, actor.log_role)
                    s.last_actor = turn.winner
                else:
                    step_turn(s.env, s.episode, s.log, turn)
                s.episode.turns.append(turn)
                s.t += 1
                if s.env.done or s.t >= max_decisions or (s.stop_at is not None and s.t >= s.stop_at):
                    s.finished = True
                    finish_episode(s.episode, s.env)
            if on_turn is not None:
                on_turn(live, turns)
        return [s.episode for s in slots]
