"""The episode loop (docs/reference/method.md, section 1; docs/layout.md, "The one loop"): the one loop every
episode runs, in training, counterfactual branches, held-out evaluation and ``swarm serve``.

Every turn, for every live slot: the agents that may bid are found (a ``presence`` mask: dropout, extra
replicas; or whoever is up, for a served swarm), all of them bid (one batch across slots and models), the
coordinator (the auction) picks the actor, the winners act (one batch), the worlds step (one
:class:`~swarm_runtime.core.engine.Steps` request), and each slot settles its turn (:func:`settle`: the
reward and validity, the public log, the decision count, the end of the episode). Agents that share a model
(replicas of a role) share one batch.

The loop is a turn-engine strategy (:class:`AuctionTurns`): it yields requests and never calls a model or
steps a world itself, so the same loop is driven in process (:meth:`TurnEngine.run
<swarm_runtime.core.engine.TurnEngine.run>`, :func:`swarm_runtime.sampling.play.play`), by ``swarm
serve``'s gateway over HTTP (its agents' answers, a server-side env, or a client's own world awaited
across requests).

Optional coordinator capabilities (all off by default; see docs/reference/plugins.md, 2.2):
``uses_proposals`` (the agents ``coordinator.proposers(bids, rng, turn)`` names
each sample an action first, and the chosen agent's proposal is the turn's
action), ``wants_info`` (``select`` also receives ``info=TurnInfo(last_actor,
proposals, scores)``), ``judge_pairs(proposers, last_actor)`` (pairs ``(j, p)``:
agent ``j``'s action model scores proposal ``p`` on ``p``'s action prompt, mean
per-token log-probability without gradients, passed as ``info.scores``) and
``bid_scorer(agent, last_actor)`` (the index of the agent whose model scores
``agent``'s bid prompt; by default the agent's own).
An :class:`~swarm_runtime.core.episode.Agent` with ``prompt_kind="single"`` (one monolithic model) acts on
the domain's ``single_prompt`` and steps the env with ``role=None``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from swarm_runtime.core.domain import Domain, Event
from swarm_runtime.core.engine import Rounds, Step, Steps
from swarm_runtime.core.env import ValidatedEnv, close_all
from swarm_runtime.core.episode import Agent, Episode, Slot, Turn
from swarm_runtime.core.protocols import Row
from swarm_runtime.core.turn import Auction, coordinator_rng, lockstep

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


def _slot_rng(s: Slot, rng: random.Random) -> random.Random:
    """The coordinator's randomness for this slot's turn: keyed under common random numbers."""
    if s.episode.noise is None:
        return rng
    return coordinator_rng(s.episode.noise, s.t)


def record_step(episode: Episode, log: list[Event], turn: Turn, result, log_role: str | None = None) -> None:
    """A decided ``turn``'s outcome, from its world's ``result`` (a :class:`~swarm_runtime.core.env.StepResult`):
    the turn's reward and validity, the episode's invalid-action and missing-reward counters, and the public
    log's event by ``log_role``; a skipped turn (no winner) is logged as such (its reward is the world's, where
    one reports it: a client's world may pay on a turn nobody acted)."""
    if turn.winner is not None:
        turn.reward, turn.valid = float(result.reward), result.valid
        episode.invalid_actions += int(not result.valid)
        episode.reward_missing |= bool(result.info.get("reward_missing", False))
        log.append(Event(turn.t, log_role, turn.action_text, result.valid, turn.reward))
    else:
        if result is not None:
            turn.reward = float(result.reward)
        log.append(Event(turn.t, None, ""))


def finish_episode(episode: Episode, env) -> None:
    """An ended episode's return (its turns' rewards) and the env's final metrics."""
    episode.reward = sum(t.reward for t in episode.turns)
    episode.metrics = dict(env.metrics())


def settle(slot: Slot, turn: Turn, result, log_role: str | None, max_decisions: int) -> None:
    """Settle ``slot``'s decided ``turn`` with its world's ``result`` (:func:`record_step`): the turn joins the
    episode, the decision count grows (skipped turns count toward the cap), and the episode ends when its world
    is done, at ``max_decisions`` or at the slot's ``stop_at`` (a branch's horizon)."""
    record_step(slot.episode, slot.log, turn, result, log_role)
    if turn.winner is not None:
        slot.last_actor = turn.winner
    slot.episode.turns.append(turn)
    slot.t += 1
    if slot.env.done or slot.t >= max_decisions or (slot.stop_at is not None and slot.t >= slot.stop_at):
        slot.finished = True
        finish_episode(slot.episode, slot.env)


class AuctionTurns:
    """The auction's way of taking turns, as a turn-engine strategy (:mod:`swarm_runtime.core.engine`): each
    turn, for every live slot, the agents that may bid (:meth:`bidders`) bid, the coordinator picks the actor,
    the winner acts (one :class:`~swarm_runtime.core.turn.Auction` turn per slot, in lockstep), the worlds step
    and the slots settle. ``roles(i)``: agent ``i``'s env role and log role."""

    def __init__(
        self,
        auction: Auction,
        n_agents: int,
        max_decisions: int,
        rng: random.Random,
        *,
        roles: Callable[[int], tuple[str | None, str]],
        record_snapshots: bool = False,
        presence: Presence | None = None,
        on_turn: Callable | None = None,
    ):
        self.auction, self.n, self.max_decisions, self.rng, self.roles = auction, n_agents, max_decisions, rng, roles
        self.record_snapshots, self.presence, self.on_turn = record_snapshots, presence, on_turn

    @classmethod
    def for_agents(
        cls,
        agents: list[Agent],
        models: Sequence[str],
        coordinator,
        domain: Domain,
        max_decisions: int,
        rng: random.Random,
        **kw,
    ) -> AuctionTurns:
        """The loop over a run's agents: bid rows go to the model of the agent that scores the bid
        (``bid_scorer``), actions to the agent's own; ``models[i]``: the weights agent ``i`` samples from."""
        models = list(models)
        scorer = getattr(coordinator, "bid_scorer", None)

        def judge_of(a, last_actor):
            return scorer(a, last_actor) if scorer is not None else a

        auction = Auction(
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
        return cls(
            auction, len(agents), max_decisions, rng, roles=lambda i: (agents[i].env_role, agents[i].log_role), **kw
        )

    def bidders(self, slot: Slot) -> Rounds:
        """The agents asked to bid in ``slot``'s turn: those the ``presence`` mask has (all without one). A
        generator (it asks nothing here), so that a driver whose population changes can be asked instead."""
        mask = list(self.presence(slot.episode.seed, slot.t, self.n)) if self.presence else [True] * self.n
        return [a for a in range(self.n) if mask[a]]
        yield  # a generator function: ``yield from`` takes its return value

    def turn(self, slot: Slot) -> Rounds:
        """One turn of ``slot``: decided (:meth:`Auction.turn <swarm_runtime.core.turn.Auction.turn>`), played by
        its world (one :class:`~swarm_runtime.core.engine.Steps` row), settled (:func:`settle`); returns the
        :class:`~swarm_runtime.core.episode.Turn`."""
        observation = slot.env.observation()
        bidders = yield from self.bidders(slot)
        forced, slot.forced = slot.forced, None
        snap = (lambda: (slot.env.snapshot(), list(slot.log))) if self.record_snapshots else None
        decided = yield from self.auction.turn(
            slot.episode,
            self.n,
            slot.t,
            slot.log,
            observation,
            bidders=bidders,
            rng=lambda: _slot_rng(slot, self.rng),
            last_actor=slot.last_actor,
            forced=forced,
            snapshot=snap,
        )
        turn = decided.turn
        env_role, log_role = self.roles(turn.winner) if turn.winner is not None else (None, None)
        (result,) = yield Steps([Step(slot.env, turn, env_role, decided)])
        settle(slot, turn, result, log_role, self.max_decisions)
        return turn

    def rounds(self, slots: list[Slot]) -> Rounds:
        """Play ``slots`` to the end (every live slot's turn in lockstep, :func:`~swarm_runtime.core.turn.lockstep`);
        returns their episodes. ``on_turn(live, turns)`` after each turn (``turns``: ``id(slot)`` -> its turn)."""
        while True:
            live = [s for s in slots if not s.finished]
            if not live:
                break
            turns = yield from lockstep([self.turn(s) for s in live])
            if self.on_turn is not None:
                self.on_turn(live, {id(s): t for s, t in zip(live, turns)})
        return [s.episode for s in slots]
