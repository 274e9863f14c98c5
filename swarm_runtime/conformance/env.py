"""Conformance of a domain's env: fresh envs, close, invalid actions as no-ops, snapshots and their
round trip (rare paths included), reward bounds, the decision cap, the scripted expert and action choices.
"""

from __future__ import annotations

import random
from typing import Any

from omegaconf import DictConfig

from swarm_runtime.conformance.probe import (
    BRANCH_POINTS,
    EXPERT_LED,
    GARBAGE,
    GARBAGE_TEXTS,
    MOSTLY_RANDOM,
    TRAJECTORIES,
    Mix,
    Probe,
    Where,
    action_pool,
    choose,
    first_difference,
    first_mismatch,
    freeze,
    load_task,
    probe_metrics,
    role_names,
    shared_objects,
    shorten,
    state_of,
    task_label,
    trace,
)
from swarm_runtime.core.domain import Domain
from swarm_runtime.core.env import StepResult, close_env
from swarm_runtime.models.tokenizer import build_tokenizer, split_words, unknown_words


# ------------------------------------------------------------------ one env per make_env call
def check_fresh_env(domain: Domain, task: str | DictConfig, steps: int = 12) -> None:
    """Each ``make_env()`` call returns its own env: an episode played while another env of the task
    plays another seed (as the ``algo.envs_per_step`` episodes of an update do) is the same as one
    played alone. Catches a cached env handed out twice and world state kept in class attributes or
    module globals."""
    cfg = load_task(domain, task)
    name = task_label(task)
    w = Where(domain.name, name, 0, 0)
    a, b = w.call("make_env()", domain.make_env, cfg), w.call("make_env()", domain.make_env, cfg)
    if a is b:
        w.fail(
            "make_env() returned the same env object twice: parallel episodes would share one world "
            "(return a fresh env per call; share only read-only data such as a corpus)"
        )
    alone = trace(domain, cfg, 0, min(int(steps), int(cfg.max_decisions)), name)
    pa, pb = Probe(domain, cfg, name, a), Probe(domain, cfg, name, b)
    pa.reset(0)
    pb.reset(1)
    beside: list[Any] = [pa.observation()]
    roles = role_names(domain)
    for k, (action, role, *_) in enumerate(alone[1:-1]):
        res = pa.step(action, role, bounds=False)
        beside.append([action, role, res.observation, round(float(res.reward), 9), bool(res.done), bool(res.valid)])
        if not pb.done:
            exp = pb.expert()
            pb.step(exp.action if exp else GARBAGE, exp.role if exp else roles[k % len(roles)], bounds=False)
    beside.append(probe_metrics(pa))
    pa.close()
    pb.close()
    first_mismatch(
        domain,
        name,
        0,
        alone,
        beside,
        "the episode played beside another env of the task (seed 1) differs from the same episode played "
        "alone (alone vs beside): the envs share state (a cached env, class attributes, module globals)",
    )


# ------------------------------------------------------------------ close()
def check_close(domain: Domain, task: str | DictConfig, seed: int = 0, steps: int = 8) -> None:
    """``close()`` (the runtime calls it when an episode batch, evaluation or run ends; optional, the
    default does nothing) raises nothing, twice in a row, on an env never reset (an env pool may close
    one it never used) and on one mid-episode; a snapshot taken before ``close()`` restores exactly into
    another env of the task and plays on (counterfactual branches restore a closed episode's snapshots);
    and closing envs leaves the task's other envs as they were (nothing shared, such as a corpus or a
    simulator server, torn down): a seed's episode played after the closes is the one played before."""
    cfg = load_task(domain, task)
    name = task_label(task)
    n = min(int(steps), int(cfg.max_decisions))
    before_closes = trace(domain, cfg, seed, 2 * n, name)
    idle = Probe(domain, cfg, name)
    idle.close()
    idle.here().call("a second close() (of an env never reset)", close_env, idle.env)
    p, q = Probe(domain, cfg, name), Probe(domain, cfg, name)
    p.reset(seed)
    q.reset(seed)
    shared = shared_objects(p.env, q.env)
    for _ in range(n):
        exp = p.expert()
        if exp is None or p.step(exp.action, exp.role, bounds=False).done:
            break
    snap, state, obs = p.snapshot(), state_of(p.env, shared), p.observation()
    p.close()
    p.here().call("a second close()", close_env, p.env)
    q.restore(snap)
    d = first_difference(state_of(q.env, shared), state)
    if d:
        q.here().fail(
            f"a snapshot taken before close() restored into another env of the task differs from the "
            f"state it was taken in: {d} (restored vs taken); a snapshot must not share what close() "
            "drops"
        )
    if q.observation() != obs:
        q.here().fail(
            f"a snapshot taken before close() restored into another env shows {shorten(q.observation())}, "
            f"not {shorten(obs)}"
        )
    for _ in range(n):  # it plays on
        exp = q.expert()
        if exp is None or q.step(exp.action, exp.role, bounds=False).done:
            break
    q.close()
    first_mismatch(
        domain,
        name,
        seed,
        before_closes,
        trace(domain, cfg, seed, 2 * n, name),
        "the episode played after other envs of the task were closed differs from the one played before "
        "(before vs after): close() tore down something the task's envs share",
    )


# ------------------------------------------------------------------ invalid actions, snapshots, rare paths
def _bookkeeping(env: Any) -> tuple[str, ...]:
    return tuple(getattr(env, "bookkeeping", ()) or ())


def _noop(
    w: Where, p: Probe, shared: set[int], before_kept: Any, res: StepResult, what: str = "an invalid action"
) -> None:
    """After an invalid step: the state (``bookkeeping`` aside) is the one before it."""
    if res.valid or res.done:
        return
    keep = _bookkeeping(p.env)
    d = first_difference(state_of(p.env, shared, keep), before_kept)
    if d:
        w.fail(
            f"{what} changed the state (it must be a no-op; counters may be listed in the env's "
            f"`bookkeeping`): {d} (after vs before)"
        )


def check_invalid_is_noop(domain: Domain, task: str | DictConfig, seed: int = 0) -> None:
    """Every garbage text (:data:`GARBAGE_TEXTS`), sent by every role and by ``role=None`` from the
    start state, raises nothing and, when invalid, earns no reward and changes no state
    (``bookkeeping`` counters aside); :data:`GARBAGE` itself must be invalid."""
    cfg = load_task(domain, task)
    name = task_label(task)
    p, twin = Probe(domain, cfg, name), Probe(domain, cfg, name)
    p.reset(seed)
    twin.reset(seed)
    shared = shared_objects(p.env, twin.env)
    start = p.snapshot()
    before = state_of(p.env, shared, _bookkeeping(p.env))
    for role in role_names(domain) + [None]:
        for text in GARBAGE_TEXTS:
            p.restore(start)
            res = p.step(text, role)
            w = p.w.at(0, text, role)
            if res.valid and text == GARBAGE:
                w.fail(
                    "a garbage text was accepted as a valid action (any role may send any text; text that is no "
                    "action of the role must be a no-op with valid=False)"
                )
            _noop(w, p, shared, before, res, "a garbage text")
    p.restore(start)


def check_snapshots(
    domain: Domain, task: str | DictConfig, trajectories=TRAJECTORIES, max_steps: int | None = None
) -> int:
    """Snapshot / step / restore / replay at every step of each ``(seed, mix)`` trajectory (to the
    episode's end or ``max_decisions``), comparing the full state; invalid actions as no-ops, reward
    bounds, exceptions from env code and ``step()``/``observation()`` agreement on the way. Returns the
    steps checked."""
    cfg = load_task(domain, task)
    name = task_label(task)
    roles = role_names(domain)
    checked = 0
    for m, (seed, mix, *most) in enumerate(trajectories):
        mix = Mix(*mix)
        cap = min(int(max_steps or cfg.max_decisions), *(int(x) for x in most[:1]), int(cfg.max_decisions))
        pool = action_pool(domain, cfg, int(seed), name)
        p, twin = Probe(domain, cfg, name), Probe(domain, cfg, name)
        obs = p.reset(int(seed))
        twin.reset(int(seed))
        w = p.w
        shared = shared_objects(p.env, twin.env)
        keep = _bookkeeping(p.env)
        if obs != p.observation():
            w.fail(
                "reset() returned an observation that observation() does not show: "
                f"{shorten(obs)} vs {shorten(p.observation())}"
            )
        rng = random.Random(1000 * m + int(seed))
        for t in range(cap):
            if p.done:
                break
            action, role = choose(p, rng, roles, pool, mix)
            w.at(t, action, role)
            snap = p.snapshot()
            frozen_snap = freeze(snap[0], shared)
            before, obs0 = state_of(p.env, shared), p.observation()
            before_kept = _drop(before, keep)
            res = p.step(action, role)
            w.at(t, action, role)
            if res.observation != p.observation():
                w.fail(
                    "step() returned an observation that observation() then does not show: "
                    f"{shorten(res.observation)} vs {shorten(p.observation())}"
                )
            _noop(w, p, shared, before_kept, res)
            after = state_of(p.env, shared)
            d = first_difference(freeze(snap[0], shared), frozen_snap)
            if d:
                w.fail(
                    f"stepping changed the snapshot taken before it (it shares live state with the env): {d} "
                    "(after vs at snapshot time)"
                )
            p.restore(snap)
            w.at(t, action, role)
            d = first_difference(state_of(p.env, shared), before)
            if d:
                w.fail(
                    "restore() did not bring back the state of snapshot time (state kept outside the snapshot, "
                    f"or a restore that forgets part of it): {d} (after restore vs at snapshot time)"
                )
            if p.observation() != obs0:
                w.fail(f"observation after restore differs: {shorten(p.observation())} vs {shorten(obs0)}")
            res2 = p.step(action, role)
            w.at(t, action, role)
            one = (res.observation, round(float(res.reward), 9), bool(res.done), bool(res.valid))
            two = (res2.observation, round(float(res2.reward), 9), bool(res2.done), bool(res2.valid))
            if one != two:
                w.fail(
                    f"the same action from the restored snapshot gave another result: {shorten(two)} vs {shorten(one)}"
                )
            d = first_difference(state_of(p.env, shared), after)
            if d:
                w.fail(f"the same action from the restored snapshot left another state: {d} (replayed vs first)")
            d = first_difference(freeze(snap[0], shared), frozen_snap)
            if d:
                w.fail(f"restoring and stepping changed the snapshot (it must stay reusable): {d}")
            checked += 1
    return checked


def _drop(frozen: Any, names: tuple[str, ...]) -> Any:
    if not names or not isinstance(frozen, dict):
        return frozen
    return {k: v for k, v in frozen.items() if k not in names}


def _points(n_steps: int, k: int) -> list[int]:
    """``k`` steps of a trajectory to branch at: the first three and the rest spread evenly."""
    if n_steps <= k:
        return list(range(n_steps))
    first = list(range(min(3, k)))
    rest = k - len(first)
    return sorted(set(first + [3 + (n_steps - 4) * (i + 1) // rest for i in range(rest)]))


def check_rare_paths(domain: Domain, task: str | DictConfig, points=BRANCH_POINTS) -> int:
    """Paths a trained policy may take and a scripted expert never does. Along each ``(seed, mix, k,
    n)`` trajectory, at ``k`` points (its first steps and some spread over the episode), from a
    snapshot, ``n`` one-step branches in all: every listed (or expert-seen) action sent by every role and
    by ``role=None`` (cross-role actions, early stops, a monolithic model) and every garbage text by one
    sender each, spread over the points (each pair at least once when ``n`` allows). Every such step
    must return a ``StepResult`` with a finite reward without raising, keep the episode reward within
    ``[reward_min, reward_max]``, and be a no-op when invalid. Returns the branches tried."""
    cfg = load_task(domain, task)
    name = task_label(task)
    roles = role_names(domain)
    senders: list[str | None] = roles + [None]
    tried = 0
    for m, (seed, mix, k, n) in enumerate(points):
        mix = Mix(*mix)
        pool = action_pool(domain, cfg, int(seed), name)
        p, twin = Probe(domain, cfg, name), Probe(domain, cfg, name)
        p.reset(int(seed))
        twin.reset(int(seed))
        shared = shared_objects(p.env, twin.env)
        keep = _bookkeeping(p.env)
        rng = random.Random(7000 + 1000 * m + int(seed))
        path: list[tuple[str, str | None]] = []  # the trajectory first; then branch at some of its steps
        start = p.snapshot()
        while not p.done and len(path) < int(cfg.max_decisions):
            a, r = choose(p, rng, roles, pool, mix)
            p.step(a, r)
            path.append((a, r))
        at = _points(len(path), int(k))
        pairs = [(a, r) for a in pool[None] for r in senders]
        pairs += [(g, senders[i % len(senders)]) for i, g in enumerate(GARBAGE_TEXTS)]
        rng.shuffle(pairs)
        per = max(1, int(n) // max(1, len(at)))
        p.restore(start)
        for t, (a, r) in enumerate(path):
            if t in at:
                j = at.index(t)
                snap = p.snapshot()
                before_kept = state_of(p.env, shared, keep)
                for i in range(min(per, len(pairs))):
                    text, role = pairs[(j * per + i) % len(pairs)]
                    res = p.step(text, role)
                    _noop(p.w.at(t, text, role), p, shared, before_kept, res)
                    p.restore(snap)
                    tried += 1
            p.step(a, r)
    return tried


def check_snapshot_roundtrip(
    domain: Domain, task: str | DictConfig, seed: int = 0, at: int = 5, steps: int = 30
) -> None:
    """One seed of :func:`check_snapshots` (kept for callers of the earlier kit)."""
    check_snapshots(domain, task, trajectories=((seed, EXPERT_LED),), max_steps=at + steps)


def check_reward_bounds(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """Episode reward within ``[reward_min, reward_max]`` under mostly random valid actions."""
    check_snapshots(domain, task, trajectories=tuple((s, MOSTLY_RANDOM) for s in seeds))


def check_max_decisions(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """The scripted expert finishes (the episode ends, or it has nothing left to do) within
    ``max_decisions``: otherwise SFT demos are cut off and the reward cap is out of reach."""
    cfg = load_task(domain, task)
    cap = int(cfg.max_decisions)
    for seed in seeds:
        p = Probe(domain, cfg, task_label(task))
        p.reset(seed)
        for _ in range(cap):
            exp = p.expert()
            if exp is None or p.step(exp.action, exp.role, bounds=False).done:
                break
        else:
            exp = p.expert()
            if exp is not None:
                p.w.at(cap, exp.action, exp.role).fail(
                    f"max_decisions={cap} cut the expert off: it still has this action to take; raise max_decisions"
                )


def check_expert(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """The expert names known roles, its actions are valid and it earns reward; stepped with
    ``role=None`` (as ``algo=monolithic`` and ``algo=rlcr`` step the env: one model may take any
    role's action) the same actions are valid too."""
    cfg = load_task(domain, task)
    roles = set(role_names(domain))
    for monolithic in (False, True):
        for seed in seeds:
            p = Probe(domain, cfg, task_label(task))
            p.reset(seed)
            for t in range(int(cfg.max_decisions)):
                exp = p.expert()
                if exp is None or p.done:
                    break
                w = p.w.at(t, exp.action, None if monolithic else exp.role)
                if exp.role not in roles:
                    w.fail(f"the expert names role {exp.role!r}, not one of {sorted(roles)}")
                if not p.step(exp.action, None if monolithic else exp.role).valid:
                    w.at(t, exp.action, None if monolithic else exp.role).fail(
                        "the expert's action was invalid"
                        + (
                            f" when stepped with role=None (it is {exp.role}'s; algo=monolithic and algo=rlcr step "
                            "the env with role=None, and one model may take any role's action)"
                            if monolithic
                            else ""
                        )
                    )
            if p.total <= 0:
                p.w.at(None).fail(
                    "the expert earned no reward"
                    + (" when its actions were stepped with role=None" if monolithic else "")
                )


def check_action_choices(domain: Domain, task: str | DictConfig, seeds: range = range(3)) -> None:
    """Listed action choices (``Domain.action_choices``, for ``model.constrained_actions``): each
    is a non-empty text, spelled in the vocabulary and a valid action of its role (well-formed and
    the role's, from the first seed's start), and the expert acts only among its role's choices
    (and the monolithic model's, ``action_choices(task, None)``), else a constrained model could
    never take the expert's action. Failures name domain, task, seed, step, action and role."""
    cfg = load_task(domain, task)
    name = task_label(task)
    w0 = Where(domain.name, name)
    listed = {r.name: w0.call("action_choices()", domain.action_choices, cfg, r.name) for r in domain.roles}
    if not any(listed.values()):
        return
    tok = build_tokenizer(domain.all_words(cfg), (0.0,))
    env = Probe(domain, cfg, name)
    first = int(seeds[0])
    env.reset(first)
    start = env.snapshot()
    for role, choices in listed.items():
        for text in choices or ():
            w = Where(domain.name, name, first, 0, text if isinstance(text, str) else repr(text), role)
            if not isinstance(text, str) or not text.strip():
                w.fail(f"action_choices() listed {text!r} for {role}; choices must be non-empty strings")
            unk = unknown_words(tok, text)
            if unk:
                w.fail(
                    f"the listed action choice has words missing from vocabulary(): {sorted(set(unk))[:10]} "
                    "(a constrained model could not spell it)"
                )
            env.restore(start)
            res = env.step(text, role, bounds=False)
            if not res.valid:
                w.fail(
                    f"the listed action choice is not a valid action of {role} at the start of the episode "
                    "(valid means well-formed and the role's, even when it cannot succeed now); step() returned "
                    f"valid=False, observation {shorten(res.observation)}"
                )
    words = {role: {tuple(split_words(t)) for t in c} for role, c in listed.items() if c}
    mono_list = list(domain.action_choices(cfg, None) or ())
    mono = {tuple(split_words(t)) for t in mono_list}
    for seed in seeds:
        env.reset(int(seed))
        for t in range(int(cfg.max_decisions)):
            exp = env.expert()
            if exp is None or env.done:
                break
            w = Where(domain.name, name, int(seed), t, exp.action, exp.role)
            if exp.role in words and tuple(split_words(exp.action)) not in words[exp.role]:
                w.fail(
                    f"the expert's action is not among {exp.role}'s {len(words[exp.role])} listed action choices "
                    f"(e.g. {shorten(sorted(listed[exp.role])[:4])}): with model.constrained_actions=true its "
                    "model could never take it"
                )
            if mono and tuple(split_words(exp.action)) not in mono:
                w.fail(
                    f"the expert's action is not among the monolithic model's {len(mono)} listed action choices "
                    f"(action_choices(task, None), e.g. {shorten(sorted(mono_list)[:4])})"
                )
            env.step(exp.action, exp.role, bounds=False)
