"""Counterfactual branches' glue (``swarm_runtime/learn/bid.py``) and a branch's horizon stop
(``swarm_runtime/core/loop.py: settle``), checked by value."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from swarm_runtime import StepResult
from swarm_runtime.core.auction import AuctionResult
from swarm_runtime.core.domain import Event
from swarm_runtime.core.episode import Episode, ForcedTurn, Slot, Turn
from swarm_runtime.core.loop import make_env, settle
from swarm_runtime.core.noise import key_hash
from swarm_runtime.core.protocols import Bid
from tests.test_core_edges import Counter as CoreCounter


class World:
    """Stands in for a slot's env in :func:`settle`: it reads ``done`` and, at the end, ``metrics()``."""

    def __init__(self, done: bool = False):
        self.done = done

    def metrics(self) -> dict:
        return {"steps": 7.0}


def turn(t: int, winner: int | None) -> Turn:
    return Turn(t, [0.5, 0.3], [[1], [2]], ["p0", "p1"], AuctionResult(winner, None), action_text=f"a{t}")


def play(slot: Slot, winners: list[int | None], max_decisions: int, pay: float = 2.0) -> list[bool]:
    """Settle one turn per winner with a world paying ``pay``; per turn, whether the slot had finished after it."""
    out = []
    for w in winners:
        settle(
            slot,
            turn(slot.t, w),
            StepResult(f"obs {slot.t}", reward=pay),
            "R" if w is not None else None,
            max_decisions,
        )
        out.append(slot.finished)
    return out


@pytest.mark.parametrize("start", [0, 2])
def test_a_branch_stops_at_its_horizon_exactly(start):
    """A branch restored at turn ``start`` with ``stop_at = start + 2`` ends after two decisions, well before
    ``max_decisions``; its return is the two turns' rewards and its metrics the world's."""
    slot = Slot(World(), Episode(5), [], t=start, stop_at=start + 2)
    assert play(slot, [0, 1], max_decisions=10) == [False, True]
    assert slot.t == start + 2 and slot.episode.reward == 4.0 and slot.episode.metrics == {"steps": 7.0}
    assert [u.t for u in slot.episode.turns] == [start, start + 1]


def test_without_a_horizon_a_slot_runs_to_max_decisions_exactly():
    slot = Slot(World(), Episode(5), [], t=0)
    assert play(slot, [0, None, 1], max_decisions=3) == [False, False, True]
    assert slot.episode.reward == 6.0  # a skipped turn counts toward the cap; its world's reward is kept


def test_a_world_that_is_done_ends_the_slot_before_its_horizon():
    slot = Slot(World(done=True), Episode(5), [], t=0, stop_at=3)
    assert play(slot, [1], max_decisions=10) == [True]
    assert slot.episode.reward == 2.0 and slot.t == 1


def test_settle_records_the_turn_its_actor_and_the_log():
    """The winner becomes the slot's last actor (a skipped turn leaves it); the log gets the acted turn's event
    and a skipped turn's empty one; the episode's counters follow the world's result."""
    slot = Slot(World(), Episode(5), [], t=0)
    settle(slot, turn(0, 1), StepResult("o", reward=1.5, valid=False, info={"reward_missing": True}), "R", 10)
    assert (slot.last_actor, slot.t, slot.finished) == (1, 1, False)
    assert (slot.episode.invalid_actions, slot.episode.reward_missing) == (1, True)
    settle(slot, turn(1, None), StepResult("o", reward=0.25), None, 10)
    assert slot.last_actor == 1 and slot.t == 2
    assert slot.log == [Event(0, "R", "a0", False, 1.5), Event(1, None, "")]
    assert [u.reward for u in slot.episode.turns] == [1.5, 0.25] and slot.episode.turns[0].valid is False


class TablePolicy(torch.nn.Module):
    """Stands in for a policy in :func:`bid_update`: one learnable distribution over the bid tokens, whatever
    the prompt (a response's log-prob is the sum of its tokens')."""

    temperature = 1.0

    def __init__(self, logits: list[float]):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(logits, dtype=torch.float64))

    def logprobs(self, prompts, responses, per_token_out=None):
        lp = torch.log_softmax(self.table, -1)
        rows = [lp[torch.tensor(r)] for r in responses]
        if per_token_out is not None:
            per_token_out += [x.detach() for x in rows]
        return torch.stack([x.sum() for x in rows])


class PlainSGD:
    """Gradient descent at learning rate 1, with the optimizer calls :func:`clip_and_step` makes (a torch optimizer
    would do, but its first construction costs seconds of imports)."""

    def __init__(self, params):
        self.params = list(params)

    def step(self) -> None:
        with torch.no_grad():
            for p in self.params:
                p -= p.grad

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def optimizer(policy) -> tuple:
    """An optimizer and a scheduler for ``bid_update``'s ``optimizers`` (role -> both)."""
    return PlainSGD(policy.parameters()), SimpleNamespace(step=lambda: None)


def by_hand(logits: list[float], rows: list[tuple], beta: float = 1.0, ref=None) -> tuple[float, torch.Tensor]:
    """The Bradley-Terry loss of ``rows`` (winner token, loser token, weight) on a table's logits, and its
    gradient; ``ref``: the reference table's logits (DPO form)."""
    x = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    lp = torch.log_softmax(x, -1)
    r = torch.log_softmax(torch.tensor(ref, dtype=torch.float64), -1) if ref is not None else torch.zeros_like(lp)
    terms = [w * F.logsigmoid(beta * ((lp[a] - lp[b]) - (r[a] - r[b]))) for a, b, w in rows]
    loss = -torch.stack(terms).mean()
    loss.backward()
    return float(loss.detach()), x.grad


def stepped(logits: list[float], grad: torch.Tensor, clip: float) -> list[float]:
    """One SGD step at learning rate 1 of ``grad`` clipped to norm ``clip``."""
    scale = min(1.0, clip / (float(grad.norm()) + 1e-6))
    return (torch.tensor(logits, dtype=torch.float64) - scale * grad).tolist()


LOW, MID = [0.0, 1.0, -1.0], [0.5, 0.0, 0.0]  #: the two roles' tables' logits (bid tokens 0, 1, 2)


def test_bid_update_steps_each_roles_policy_on_its_decisive_pairs_weighted_by_margin_and_importance():
    """Two roles: Low's two decisive pairs (margin-weighted, one with the sampler's log-probs of its original bid,
    importance-weighted at ``is_cap``) and a tie; Mid's only pair a tie, so Mid neither steps nor reports."""
    from swarm_runtime.learn.bid import BranchPair, bid_update

    low, mid = TablePolicy(LOW), TablePolicy(MID)
    agents = [SimpleNamespace(policy=mid, role="Mid", name="mid"), SimpleNamespace(policy=low, role="Low", name="low")]
    lp = torch.log_softmax(torch.tensor(LOW, dtype=torch.float64), -1)
    sampler = float(lp[1]) - math.log(3.0)  # the learner's ratio on the original bid [1]: 3, under the cap 4
    pairs = [
        BranchPair(1, "a", [1], [2], 1.0, 4.0, original_logprobs=[sampler]),  # the branch won by 3: [2] over [1]
        BranchPair(1, "b", [0], [2], 2.0, 1.0, original_logprobs=[float(lp[0]) - math.log(2.0)]),  # the original won
        BranchPair(1, "c", [0], [1], 2.0, 2.0),  # a tie: dropped
        BranchPair(0, "d", [0], [1], 5.0, 5.0),  # Mid's tie (Mid first: the agents after it still step)
    ]
    opts = {"Low": optimizer(low), "Mid": optimizer(mid)}
    m = bid_update(agents, pairs, opts, minibatch=1, grad_clip=0.05, pair_weight="margin", is_cap=4.0)
    # margin weights: margins 3 and 1 over their mean 2; importance weights 3 and 2 (each of the original bid: the
    # loser of the first row, the winner of the second)
    loss, grad = by_hand(LOW, [(2, 1, 1.5 * 3.0), (0, 2, 0.5 * 2.0)])
    assert m["losses/bid_Low"] == pytest.approx(loss, rel=1e-9)
    assert m["charts/bid_grad_norm_Low"] == pytest.approx(float(grad.norm()), rel=1e-9) and grad.norm() > 0.05
    assert low.table.tolist() == pytest.approx(stepped(LOW, grad, 0.05), rel=1e-9)
    assert mid.table.tolist() == MID and not any(k.endswith("_Mid") for k in m)
    d = [math.log(3.0), math.log(2.0)]  # two tracked tokens: past the report cap 2's log or at it, within the cap 4's
    assert {k: v for k, v in m.items() if k.startswith("mismatch/")} == pytest.approx(
        {
            "mismatch/bid_approx_kl_Low": sum(math.exp(x) - 1 - x for x in d) / 2,
            "mismatch/bid_max_abs_dlogp_Low": d[0],
            "mismatch/bid_past_cap_Low": 0.0,
            "mismatch/bid_is_weight_mean_Low": 2.5,
        }
    )
    assert (m["charts/bid_pairs"], m["charts/bid_pairs_higher_won"]) == (2.0, 1.0)
    assert "charts/bid_ref_logodds_Low" not in m


def test_bid_update_against_a_reference_takes_the_dpo_form_at_beta_and_reports_the_shift():
    """``reference`` (role -> frozen policy): each row's log-odds are measured against the reference's, scaled by
    ``beta``; without ``is_cap`` the pairs are not importance-weighted but the mismatch is still reported."""
    from swarm_runtime.learn.bid import BranchPair, bid_update

    low, ref = TablePolicy(LOW), TablePolicy(MID)
    agents = [SimpleNamespace(policy=low, role="Low", name="low")]
    lp = torch.log_softmax(torch.tensor(LOW, dtype=torch.float64), -1)
    pairs = [
        BranchPair(0, "a", [1], [2], 1.0, 4.0, original_logprobs=[float(lp[1]) - 1.0]),  # ratio e: past 2
        BranchPair(0, "b", [0], [2], 2.0, 1.0),
    ]
    m = bid_update(agents, pairs, {"Low": optimizer(low)}, 1, 100.0, reference={"Low": ref}, beta=0.5)
    loss, grad = by_hand(LOW, [(2, 1, 1.0), (0, 2, 1.0)], beta=0.5, ref=MID)
    # the reference's log-probs are carried as float32 (bid.py: _bradley_terry_chunk)
    assert m["losses/bid_Low"] == pytest.approx(loss, rel=1e-6)
    assert low.table.tolist() == pytest.approx(stepped(LOW, grad, 100.0), rel=1e-6)
    rp = torch.log_softmax(torch.tensor(MID, dtype=torch.float64), -1)
    shifts = [float((lp[a] - lp[b]) - (rp[a] - rp[b])) for a, b in ((2, 1), (0, 2))]  # the rows' log-odds shifts
    assert m["charts/bid_ref_logodds_Low"] == pytest.approx(sum(shifts) / 2, rel=1e-6) and shifts[0] != shifts[1]
    assert m["mismatch/bid_past_cap_Low"] == 1.0 and "mismatch/bid_is_weight_mean_Low" not in m


class ScriptedBids:
    """Stands in for a policy in :func:`resample_lower`: each prompt's bids come from a script, in order (a level,
    or ``(level, False)`` for one that did not parse); every call's prompts are recorded."""

    def __init__(self, script: dict[str, list]):
        self.script, self.calls = {p: list(v) for p, v in script.items()}, []

    def bid(self, prompts: list[str]) -> list[Bid]:
        self.calls.append(list(prompts))
        out = []
        for p in prompts:
            level, parsed = (lambda x: x if isinstance(x, tuple) else (x, True))(self.script[p].pop(0))
            out.append(Bid(f"{level}", [int(level * 100)], level=level, parsed=parsed))
        return out


def pick(t: int, winner: int, runner_up: int, bids: tuple[float, float]) -> tuple[Episode, Turn]:
    """A contested turn ``t`` (its own episode, seed ``t``) won by ``winner`` at ``bids[0]`` over ``runner_up`` at
    ``bids[1]``; agent ``a``'s bid prompt is ``f"{t}{a}"``."""
    auction = AuctionResult(winner, runner_up, *bids)
    return Episode(t), Turn(t, [0.0] * 3, [[a] for a in range(3)], [f"{t}{a}" for a in range(3)], auction)


def test_resample_lower_asks_each_policy_once_per_try_for_its_pending_picks_only():
    """Agents 0 and 1 share a policy, agent 2 has its own. A re-sampled bid counts when it parsed and lies strictly
    below the runner-up's; a pick found drops out of the later tries; after ``tries`` tries the rest get None."""
    from swarm_runtime.learn.bid import resample_lower

    shared = ScriptedBids({"00": [0.5, 0.3], "21": [0.9, 0.8, 0.7], "30": [0.1]})
    own = ScriptedBids({"12": [(0.1, False), 0.2]})
    agents = [SimpleNamespace(policy=shared), SimpleNamespace(policy=shared), SimpleNamespace(policy=own)]
    picks = [pick(0, 0, 1, (0.8, 0.5)), pick(1, 2, 0, (0.6, 0.4)), pick(2, 1, 2, (0.9, 0.6)), pick(3, 0, 2, (0.7, 0.5))]
    found = resample_lower(agents, picks, tries=3)
    assert [None if b is None else b.level for b in found] == [0.3, 0.2, None, 0.1]
    assert shared.calls == [["00", "21", "30"], ["00", "21"], ["21"]] and own.calls == [["12"], ["12"]]
    assert resample_lower(agents, [], tries=3) == [] and len(shared.calls) == 3


def test_resample_higher_asks_the_runner_up_for_a_bid_strictly_above_the_winning_one():
    from swarm_runtime.learn.bid import resample_higher

    pol = ScriptedBids({"01": [0.8, (0.95, False)], "12": [0.4, 0.6]})
    agents = [SimpleNamespace(policy=object()), SimpleNamespace(policy=pol), SimpleNamespace(policy=pol)]
    found = resample_higher(agents, [pick(0, 0, 1, (0.8, 0.5)), pick(1, 0, 2, (0.6, 0.3))], tries=2)
    assert found == [None, None]  # 0.8 and 0.6 tie with the winning bids, 0.95 did not parse, 0.4 is lower
    assert pol.calls == [["01", "12"], ["01", "12"]]
    pol = ScriptedBids({"01": [0.85]})
    agents[1].policy = pol
    (b,) = resample_higher(agents, [pick(0, 0, 1, (0.8, 0.5))], tries=1)
    assert (b.level, b.tokens) == (0.85, [85])


class Counter(CoreCounter):
    pays, steps = 1.0, 9


COUNTING = SimpleNamespace(name="counting", make_env=lambda task: Counter())
TASK = OmegaConf.create({"name": "count", "max_decisions": 9, "reward_max": 9.0})


def snapshot_turn(t: int) -> Turn:
    """Turn ``t`` of a counting episode, with the snapshot taken before its action (the world counted ``t``)."""
    env = make_env(COUNTING, TASK)
    env.reset(4)
    for _ in range(t):
        env.step("add")
    turn = pick(t, 0, 1, (0.8, 0.5))[1]
    turn.snapshot = (env.snapshot(), [Event(u, "R", "add") for u in range(t)])
    return turn


@pytest.mark.parametrize(
    "noise, sample, want", [(None, 0, None), (None, 2, None), (77, 0, 77), (77, 2, key_hash(77, 3, 2))]
)
def test_a_forced_slot_starts_from_the_turns_snapshot_with_its_noise_and_stop(noise, sample, want):
    """The slot's world is a fresh one restored to the snapshot, its log a copy of the snapshot's, its first turn
    the forced one; continuation 0 keeps the original episode's noise, continuation j > 0 gets its own."""
    from swarm_runtime.learn.bid import forced_slot

    turn, forced = snapshot_turn(3), ForcedTurn([0.1, 0.5], [[1], [2]], ["a", "b"], winner=1)
    for horizon, stop in ((None, None), (2, 5)):
        slot = forced_slot(COUNTING, TASK, Episode(4, noise=noise), turn, forced, sample, horizon)
        assert (slot.t, slot.stop_at, slot.forced, slot.finished) == (3, stop, forced, False)
        assert (slot.episode.seed, slot.episode.noise, slot.episode.turns) == (4, want, [])
        assert (slot.env.t, slot.env.env.n, slot.env.observation()) == (3, 3, "count 3")
        assert slot.log == turn.snapshot[1] and slot.log is not turn.snapshot[1]


def test_branch_slots_skip_the_picks_without_a_new_bid_and_own_each_slot():
    """Three picks, the middle one without a re-sampled bid; two samples: per branched pick two branches (side 1)
    and one re-roll (side 0), each continuation with its noise; each branched pick keeps its re-sampled tokens and
    its window's original score."""
    from swarm_runtime.learn.bid import branch_slots

    picks = []
    for t in (1, 2, 3):
        ep = Episode(4, turns=[pick(u, 0, 1, (0.8, 0.5))[1] for u in range(5)], noise=77)
        for u, turn in enumerate(ep.turns):
            turn.reward = float(2**u)
        ep.turns[t] = snapshot_turn(t)
        ep.turns[t].reward = float(2**t)
        picks.append((ep, ep.turns[t]))
    low = [Bid("l", [11], level=0.1), None, Bid("l", [13], level=0.2)]
    high = [Bid("h", [21], level=0.9), Bid("h", [22], level=0.9), None]
    branched, slots, owner = branch_slots(COUNTING, TASK, picks, low, high, 2, 2)
    assert owner == [(0, 1), (0, 1), (0, 0), (1, 1), (1, 1), (1, 0)]
    got = [(k.turn.t, k.lower, k.higher, k.original_score) for k in branched]
    assert got == [(1, [11], [21], 2.0 + 4.0), (3, [13], None, 8.0 + 16.0)]
    assert [(s.t, s.stop_at, s.forced.winner) for s in slots] == [(1, 3, 1)] * 2 + [(1, 3, 0)] + [(3, 5, 1)] * 2 + [
        (3, 5, 0)
    ]
    assert [s.forced.bids[0] for s in slots] == [0.1, 0.1, 0.0, 0.2, 0.2, 0.0]  # branches carry the lower bid
    # under common random numbers: the first branch the original's noise, the j-th branch and re-roll their own
    want = [n for t in (1, 3) for n in (77, key_hash(77, t, 1), key_hash(77, t, 1))]
    assert [s.episode.noise for s in slots] == want


def test_run_branches_without_any_lower_bid_plays_nothing_and_makes_no_pair():
    from swarm_runtime.learn.bid import run_branches

    pol = ScriptedBids({"00": [0.6, 0.7], "01": [0.9, 0.9]})
    agents = [SimpleNamespace(policy=pol), SimpleNamespace(policy=pol), SimpleNamespace(policy=pol)]
    picks = [pick(0, 0, 1, (0.8, 0.5))]
    assert run_branches(agents, None, COUNTING, TASK, picks, 2, random.Random(0), runner_up_pairs=True) == []
    assert pol.calls == [["00"], ["00"]]  # no higher bid asked for a pick that is not branched


def test_run_branches_plays_the_picks_slots_once_with_its_arguments_and_pairs_what_they_paid(monkeypatch):
    """One pick (turn 1 of an episode whose turns paid 1, 2, 4), two samples, a horizon of 1, the runner-up's pairs:
    one batch of three slots goes to ``play`` with the caller's coordinator, rng, presence, sampler and models;
    the pairs score the original's window (2) averaged with its re-roll (8) against the branches' mean (10, 20)."""
    import swarm_runtime.learn.bid as bid_mod
    from swarm_runtime.learn.bid import BranchPair, run_branches

    calls = []

    def play(slots, agents, coordinator, domain, max_decisions, rng, **kw):
        calls.append((slots, agents, coordinator, domain, max_decisions, rng, kw))
        return [Episode(s.episode.seed, reward=r) for s, r in zip(slots, (10.0, 20.0, 8.0))]

    monkeypatch.setattr(bid_mod, "play", play)
    ep = Episode(4, turns=[snapshot_turn(u) for u in range(3)])
    for u, r in enumerate((1.0, 2.0, 4.0)):
        ep.turns[u].reward = r
    pol = ScriptedBids({"10": [0.3], "11": [0.9]})
    agents = [SimpleNamespace(policy=pol) for _ in range(3)]
    coordinator, rng, presence, sampler, models = object(), random.Random(0), object(), object(), ["m0", "m1", "m2"]
    pairs = run_branches(
        agents,
        coordinator,
        COUNTING,
        TASK,
        [(ep, ep.turns[1])],
        1,
        rng,
        presence=presence,
        samples=2,
        horizon=1,
        runner_up_pairs=True,
        sampler=sampler,
        models=models,
    )
    assert pairs == [
        BranchPair(0, "10", [0], [30], 5.0, 15.0),
        BranchPair(1, "11", [1], [90], 5.0, 15.0, runner_up=True),
    ]
    ((slots, *args, kw),) = calls
    assert args == [agents, coordinator, COUNTING, 9, rng] and args[-1] is rng and args[1] is coordinator
    assert kw == {"presence": presence, "sampler": sampler, "models": models}
    assert [(s.t, s.stop_at, s.forced.winner) for s in slots] == [(1, 2, 1), (1, 2, 1), (1, 2, 0)]


def test_run_branches_by_default_plays_one_branch_a_pick_to_the_end_and_pairs_only_the_selected_agent(monkeypatch):
    import swarm_runtime.learn.bid as bid_mod
    from swarm_runtime.learn.bid import BranchPair, run_branches

    calls = []

    def play(slots, *args, **kw):
        calls.append(slots)
        return [Episode(s.episode.seed, reward=10.0) for s in slots]

    monkeypatch.setattr(bid_mod, "play", play)
    ep = Episode(4, turns=[snapshot_turn(u) for u in range(3)])
    for u, r in enumerate((1.0, 2.0, 4.0)):
        ep.turns[u].reward = r
    agents = [SimpleNamespace(policy=ScriptedBids({"10": [0.3]})) for _ in range(3)]
    pairs = run_branches(agents, object(), COUNTING, TASK, [(ep, ep.turns[1])], 1, random.Random(0))
    assert pairs == [BranchPair(0, "10", [0], [30], 6.0, 10.0)]
    assert [(s.t, s.stop_at, s.forced.winner) for s in calls[0]] == [(1, None, 1)]


def test_bid_update_hands_a_sharded_policy_its_step_with_the_lists_the_chunks_fill():
    """A policy with a ``shard`` (a rank of a sharded learner) takes the step itself (``learn/optim.py:
    accumulate_and_step``), given the log-odds shifts and the mismatch sums its chunks fill, to merge across ranks."""
    from swarm_runtime.learn.bid import BranchPair, bid_update
    from swarm_runtime.sampling.mismatch import Mismatch

    low, steps = TablePolicy(LOW), []
    low.shard = SimpleNamespace(step=lambda *args: steps.append(args) or (0.25, 0.5))
    agents = [SimpleNamespace(policy=low, role="Low", name="low")]
    m = bid_update(agents, [BranchPair(0, "a", [1], [2], 1.0, 4.0)], {"Low": optimizer(low)}, 1, 100.0)
    ((policy, batch, minibatch, _, _, _, clip, side),) = steps
    assert (policy, len(batch), minibatch, clip) == (low, 1, 1, 100.0)
    assert isinstance(side, tuple) and side[0] == [] and isinstance(side[1], Mismatch)
    assert (m["losses/bid_Low"], m["charts/bid_grad_norm_Low"]) == (0.25, 0.5)
