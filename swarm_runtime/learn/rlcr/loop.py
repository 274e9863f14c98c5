"""The concurrent episode loop on a simulated wall clock (docs/guides/rlcr.md).

Every agent of every rollout is an event in its rollout's :class:`~.clock.EventQueue`, keyed by the
simulated second it is free next. Each round, every live rollout pops the agents free at its earliest
time; their in-flight actions complete in order (the env sees actions in time order; ties in the order
the agents were queued), then all of them, across all rollouts, go to the shared model in one batch.
An action costs ``generated tokens * seconds_per_token`` plus the env's own ``action_seconds``; its
effect lands when it completes. A rollout stops when its task is done, when the next event lies past
``T_max`` (its return is then the env's ``progress()`` at ``T_max``: anytime return), when its token
budget is spent, or when nobody is left to act. Deterministic under a seed: the env draws in time
order and the model samples in a fixed batch order.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from swarm_runtime.core.engine import Batch, Rounds, TurnEngine
from swarm_runtime.core.env import ValidatedEnv, close_all, close_env, closing_all, has_progress
from swarm_runtime.core.protocols import Response, Row, Sampler
from swarm_runtime.learn.rlcr.clock import EventQueue, action_seconds
from swarm_runtime.learn.rlcr.messages import MESSAGE_KINDS, Board, Command, parse_command
from swarm_runtime.learn.rlcr.org import CEO, NAMES, Organisation
from swarm_runtime.sampling.local import LocalSampler

#: Words the RLCR prompts and commands use (added to the shared policy's tokenizer).
PROMPT_WORDS = (
    "you",
    "are",
    "brief",
    "none",
    "time",
    "of",
    "team",
    "idle",
    "inbox",
    "channel",
    "found",
    "action",
    "say",
    "post",
    "write",
    "search",
    "hire",
    "fire",
    ":",
    ";",
    ".",
)
#: Words the shared policy's tokenizer adds to the domain's: the prompt words, agent names and briefs.
RLCR_WORDS = (*PROMPT_WORDS, *NAMES, CEO, "lead", "done")


@dataclass(frozen=True)
class LoopOptions:
    """How rollouts run (one small dataclass instead of many arguments)."""

    t_max: float  #: simulated seconds before a rollout is stopped (``inf`` = no limit)
    seconds_per_token: float = 1.0
    org: str = "flat"
    agents: int = 3  #: flat team size
    max_hires: int = 8
    max_turns_per_agent: int = 120  #: an agent that used its turns idles
    token_budget: int | None = None  #: stop deciding once a rollout generated this many tokens
    window: int = 3  #: messages of each kind shown in a prompt
    tick: float = 0.0  #: > 0: an agent whose action ends between ticks decides at the next multiple of ``tick``
    #: seconds (it waits idle meanwhile), so more agents decide together (larger model batches); 0 = exact times


@dataclass
class Turn:
    """One generated action: who, when (decision time), on what prompt, what it cost and did."""

    agent: str
    t: float
    prompt: str
    text: str
    tokens: list[int]
    kind: str  #: ``env``, a message verb, or ``unparsed``
    seconds: float = 0.0
    ok: bool = True  #: it had its effect (a valid env action, a delivered message, an accepted hire)


@dataclass
class Rollout:
    seed: int
    group: int = 0  #: rollouts of one task instance share a group (the group baseline)
    t_max: float = math.inf
    turns: list[Turn] = field(default_factory=list)
    progress: float = 0.0  #: anytime return at the stop
    ret: float = 0.0  #: the return learning uses (progress, minus the latency penalty if any)
    duration: float = 0.0  #: simulated seconds at the stop
    done: bool = False
    curve: list[tuple[float, float]] = field(default_factory=list)  #: (second, progress) at each change
    counts: Counter = field(default_factory=Counter)
    team_peak: int = 0
    metrics: dict = field(default_factory=dict)

    @property
    def success(self) -> float:
        """The env's ``metrics()["success"]`` at the stop when it reports one (an episode can end without
        success: a give-up, a failure), else 1.0 for a finished episode (``done``) and 0.0 otherwise."""
        m = self.metrics.get("success")
        return float(m) if isinstance(m, (int, float)) else float(self.done)

    @property
    def env_tokens(self) -> int:
        """Useful work: tokens of turns that acted on the env."""
        return sum(len(t.tokens) for t in self.turns if t.kind == "env")

    @property
    def message_tokens(self) -> int:
        return sum(len(t.tokens) for t in self.turns if t.kind in MESSAGE_KINDS)

    @property
    def tokens(self) -> int:
        return sum(len(t.tokens) for t in self.turns)

    def progress_at(self, t: float) -> float:
        """The anytime return this rollout had at simulated second ``t``."""
        p = 0.0
        for s, v in self.curve:
            if s > t:
                break
            p = v
        return p


@dataclass
class Request:
    """An agent that must decide now: its prompt, and for scripted experts the live state."""

    slot: _Slot
    agent: str
    prompt: str

    @property
    def busy(self) -> dict[str, str]:
        """Other agents' actions in flight (agent -> text)."""
        return {a: turn.text for a, (turn, _) in self.slot.pending.items() if a != self.agent}


Decide = Callable[[list[Request]], list[tuple[str, list[int]]]]


def next_decision(t: float, tick: float) -> float:
    """When an agent whose action ends at ``t`` decides next: ``t``, or the next multiple of ``tick``."""
    return t if tick <= 0 else math.ceil(t / tick - 1e-9) * tick


def render_prompt(
    agent: str, brief: str, observation: str, now: float, t_max: float, busy: dict[str, str], inbox, channel, found
) -> str:
    """The prompt after which ``agent`` emits its next action (env action or command)."""
    limit = "none" if math.isinf(t_max) else str(int(t_max // 60))
    team = " ; ".join(f"{a} {text}" for a, text in busy.items()) or "idle"
    parts = [f"you are {agent} . brief {brief} . {observation} . time {int(now // 60)} of {limit}", f"team : {team}"]
    if inbox:
        parts.append("inbox : " + " ; ".join(m.render() for m in inbox))
    if channel:
        parts.append("channel : " + " ; ".join(m.render() for m in channel))
    if found:
        parts.append("found : " + " ; ".join(m.render() for m in found))
    return " . ".join(parts) + " . action :"


class _Slot:
    """One rollout in flight: env, clock, board, organisation, in-flight actions."""

    def __init__(self, domain, task, seed: int, group: int, opts: LoopOptions):
        inner = domain.concurrent_env(task)
        if not has_progress(inner):
            close_env(inner)
            raise TypeError(f"domain {domain.name!r}: its concurrent env {type(inner).__name__} has no progress()")
        bounds = (float(task.get("reward_min", 0.0)), float(task.reward_max))
        self.inner, self.env = inner, ValidatedEnv(inner, domain.name, bounds)
        try:
            self.env.reset(int(seed))
        except BaseException:
            close_all([self.env], quiet=True)
            raise
        self.opts = opts
        self.board, self.queue = Board(), EventQueue()
        self.org = Organisation(opts.org, opts.agents, opts.max_hires)
        self.pending: dict[str, tuple[Turn, Command]] = {}
        self.turns_by: Counter = Counter()
        self.rollout = Rollout(int(seed), group, opts.t_max, team_peak=len(self.org.members))
        self.rollout.curve.append((0.0, self._progress()))
        self.now, self.finished, self.tokens = 0.0, False, 0
        for a in self.org.members:
            self.queue.push(0.0, a)

    def _progress(self) -> float:
        return float(self.inner.progress())

    def prompt(self, agent: str) -> str:
        inbox, channel, found = self.board.view(agent, self.opts.window)
        busy = {a: turn.text for a, (turn, _) in self.pending.items() if a != agent}
        brief = self.org.briefs.get(agent, "lead" if agent == CEO else "none")
        return render_prompt(
            agent, brief, self.env.observation(), self.now, self.opts.t_max, busy, inbox, channel, found
        )

    def start(self, agent: str, prompt: str, text: str, tokens: list[int]) -> None:
        cmd = parse_command(text)
        env_s = float(self.inner.action_seconds(cmd.body, None)) if cmd.kind == "env" else 0.0
        seconds = action_seconds(len(tokens), self.opts.seconds_per_token, env_s)
        turn = Turn(agent, self.now, prompt, text, list(tokens), cmd.kind, seconds)
        self.rollout.turns.append(turn)
        self.pending[agent] = (turn, cmd)
        self.turns_by[agent] += 1
        self.tokens += len(tokens)
        self.queue.push(next_decision(self.now + seconds, self.opts.tick), agent)

    def complete(self, agent: str) -> list[str]:
        """Apply ``agent``'s action in flight; returns the agents it hired (they decide now too)."""
        if agent not in self.pending:
            return []
        turn, cmd = self.pending.pop(agent)
        c, k = self.rollout.counts, cmd.kind
        if k == "env":
            res = self.env.step(cmd.body, None)
            turn.ok = bool(res.valid)
            c["invalid_actions"] += int(not res.valid)
        elif k == "unparsed":
            turn.ok = False
            c["unparsed"] += 1
        elif k == "say":
            turn.ok = self.org.active(cmd.target) and cmd.target != agent
            if turn.ok:
                self.board.say(self.now, agent, cmd.target, cmd.body)
            c["bad_messages"] += int(not turn.ok)
        elif k == "post":
            self.board.post(self.now, agent, cmd.body)
        elif k == "write":
            self.board.write(self.now, agent, cmd.body)
        elif k == "search":
            c["search_hits"] += self.board.search(agent, cmd.body)
        elif k == "hire":
            name, _ = self.org.hire(agent, cmd.body)
            turn.ok = name is not None
            c["hires" if turn.ok else "refused_hires"] += 1
            c["messages"] += int(turn.ok)
            if name is not None:
                self.rollout.team_peak = max(self.rollout.team_peak, self.org.peak)
                return [name]
            return []
        elif k == "fire":
            turn.ok, _ = self.org.fire(agent, cmd.target)
            c["fires" if turn.ok else "bad_fires"] += 1
            if turn.ok:
                self.queue.drop(cmd.target)
                self.pending.pop(cmd.target, None)
        c["messages"] += int(k in MESSAGE_KINDS and turn.ok)
        return []

    def finish(self, t: float) -> None:
        r = self.rollout
        r.duration = float(min(t, self.opts.t_max))
        r.progress, r.ret = self._progress(), self._progress()
        r.done = bool(self.env.done)
        r.metrics = dict(self.inner.metrics())
        self.finished = True

    def can_decide(self, agent: str) -> bool:
        o = self.opts
        return (
            self.org.active(agent)
            and self.turns_by[agent] < o.max_turns_per_agent
            and (o.token_budget is None or self.tokens < o.token_budget)
        )


def _advance(s: _Slot) -> list[str]:
    """Move ``s`` to its next event time; complete the actions due then; return who decides now."""
    t = s.queue.peek()
    if t is None:
        s.finish(s.now)
        return []
    if t > s.opts.t_max:
        s.finish(s.opts.t_max)
        return []
    t, due = s.queue.pop_due()
    s.now = t
    deciders: list[str] = []
    before = s._progress()
    for a in due:
        if not s.org.active(a):
            continue
        hired = s.complete(a)
        deciders += [a, *hired]
        if s.env.done:
            break
    after = s._progress()
    if after != before:
        s.rollout.curve.append((t, after))
    if s.env.done:
        s.finish(t)
        return []
    return [a for a in deciders if s.can_decide(a)]


def turn_report(requests: Sequence[Request]) -> tuple[list[list[float | None]], list[int]]:
    """One round of the concurrent loop in the terms of the ``swarm_on_turn`` observer hook
    (``bids``, ``winners``): one entry per decision of the round (an agent of a rollout that decided
    now, in batch order). ``bids``: over that rollout's current team (``Organisation.members``, in
    order), ``0.0`` for every agent of the rollout deciding in this round (RLCR reads no bids, like a
    coordinator with ``uses_bids=False``), ``None`` for the others (busy); ``winners``: the deciding
    agent's index in that team. So an observer counting winners counts every RLCR action once."""
    deciding: dict[int, set[str]] = {}
    for r in requests:
        deciding.setdefault(id(r.slot), set()).add(r.agent)
    bids, winners = [], []
    for r in requests:
        team = r.slot.org.members
        bids.append([0.0 if a in deciding[id(r.slot)] else None for a in team])
        winners.append(team.index(r.agent))
    return bids, winners


def play_concurrent(
    domain,
    task,
    seeds: Sequence[int],
    decide: Decide | Sampler,
    opts: LoopOptions,
    groups: Sequence[int] | None = None,
    on_round: Callable[[int, list[Request]], None] | None = None,
) -> list[Rollout]:
    """Run one rollout per seed at once (``groups[i]``: rollout i's group) and return them in order: the
    :class:`ClockTurns` strategy on the turn engine. ``decide``: a sampler (rows of the shared policy's
    weights), or a function ``decide(requests)`` returning one ``(text, tokens)`` per request, in order
    (one model batch; the scripted experts). ``on_round(round, requests)`` is called after each round's
    actions have started (round = 0, 1, ...)."""
    sampler = decide if isinstance(decide, Sampler) else DecideSampler(decide)
    with closing_all([]) as envs:  # every rollout's env is closed at the end, also when one raised
        slots = []
        for i, s in enumerate(seeds):
            slots.append(_Slot(domain, task, s, (groups[i] if groups is not None else i), opts))
            envs.append(slots[-1].env)
        return TurnEngine(sampler).run(ClockTurns(on_round).rounds(slots))


class ClockTurns:
    """RLCR's way of taking turns, as a turn-engine strategy (:mod:`swarm_runtime.core.engine`): every
    live rollout moves to its next event time, the agents free then decide, and every decision of the
    round, across rollouts, goes out as one action batch of the shared policy's weights ``model``."""

    def __init__(self, on_round: Callable[[int, list[Request]], None] | None = None, model: str = "Shared"):
        self.on_round, self.model = on_round, model

    def rounds(self, slots: list[_Slot]) -> Rounds:
        rounds = 0
        while True:
            requests: list[Request] = []
            for s in slots:
                while not s.finished:
                    deciders = _advance(s)
                    if deciders:
                        requests += [Request(s, a, s.prompt(a)) for a in deciders]
                        break
            if not requests:
                break
            outs = yield Batch("act", [Row(self.model, r.prompt, context=r) for r in requests])
            for r, o in zip(requests, outs):
                r.slot.start(r.agent, r.prompt, o.text, list(o.tokens))
            if self.on_round is not None:
                self.on_round(rounds, requests)
            rounds += 1
        return [s.rollout for s in slots]


class DecideSampler:
    """A ``decide(requests)`` function as a sampler: each row's context is its :class:`Request`."""

    name = "decide"

    def __init__(self, decide: Decide):
        self.decide = decide

    def act(self, rows: Sequence[Row]) -> list[Response]:
        return [Response(text, list(tokens)) for text, tokens in self.decide([r.context for r in rows])]

    def bid(self, rows: Sequence[Row]):
        raise TypeError("a decide function answers actions only")

    def version(self, model: str) -> int:
        return 0

    def sync(self, learner, models) -> None:
        pass

    def close(self) -> None:
        pass


def policy_decider(policy, sampler: Sampler | None = None, model: str = "Shared") -> Decide:
    """Every request goes to the one shared policy's weights ``model``, in one batch, through ``sampler``
    (default: in process, from ``policy``; :mod:`swarm_runtime.sampling`)."""
    sampler = sampler if sampler is not None else LocalSampler({model: policy})

    def decide(requests: list[Request]) -> list[tuple[str, list[int]]]:
        outs = sampler.act([Row(model, r.prompt) for r in requests])
        return [(o.text, list(o.tokens)) for o in outs]

    return decide


def expert_decider(policy, team: int = 3) -> Decide:
    """The scripted collective of the cold start: a CEO hires specialists (brief = the first job the
    domain's concurrent expert gives them) until the team has ``team`` members, then works too; every
    agent acts as the domain's ``concurrent_expert`` says, seeing the actions already in flight and
    those decided earlier in the same batch. Token ids come from ``policy.action_target`` (the
    demonstration's length is what the model would generate)."""

    def decide(requests: list[Request]) -> list[tuple[str, list[int]]]:
        out, extra = [], {}
        for r in requests:
            busy = {**r.busy, **extra.get(id(r.slot), {})}
            busy.pop(r.agent, None)
            org = r.slot.org
            text = None
            if org.kind == "ceo" and r.agent == CEO and len(org.members) < team:
                job = r.slot.inner.concurrent_expert("new", busy) or "none"
                text = f"hire {job}"
            if text is None:
                text = r.slot.inner.concurrent_expert(r.agent, busy)
            if text is None:
                exp = r.slot.inner.expert_action()
                text = exp.action if exp is not None else "post done"
            extra.setdefault(id(r.slot), {})[r.agent] = text
            out.append((text, policy.action_target(text)))
        return out

    return decide
