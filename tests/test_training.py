"""A real tiny model takes real SFT, action (REINFORCE) and bid (Bradley-Terry) steps."""

import copy
import math
import random

import pytest
import torch
from conftest import run_context

from swarm_runtime.config.load import resolve
from swarm_runtime.core.auction import AuctionResult
from swarm_runtime.core.loop import new_slots
from swarm_runtime.learn.action import action_update, credit_samples
from swarm_runtime.learn.bid import BranchPair, bid_update, pick_contested, run_branches
from swarm_runtime.learn.logprobs import sampled_logprobs
from swarm_runtime.learn.mpt import step_kind
from swarm_runtime.learn.optim import make_optimizer
from swarm_runtime.learn.sft import collect_demos, sft
from swarm_runtime.runs.context import RunContext
from swarm_runtime.sampling.play import play


@pytest.fixture(scope="module")
def ctx(registry):
    return run_context(registry, "domain=minecraft", "task=iron_pickaxe", "task.max_decisions=24")


def snapshot(policy):
    return [p.detach().clone() for p in policy.parameters()]


def changed(before, policy):
    return any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def plain_sgd(policies, lr: float) -> dict:
    """Per role, (SGD, constant schedule): a step follows the gradient itself (Adam's first step is sign-like)."""
    out = {}
    for r, p in policies.items():
        opt = torch.optim.SGD(p.parameters(), lr=lr)
        out[r] = (opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0))
    return out


def restore(policy, saved) -> None:
    with torch.no_grad():
        for p, s0 in zip(policy.parameters(), saved):
            p.copy_(s0)


def expected_credit(episodes) -> list[tuple]:
    """(agent, action prompt, action tokens, credit) of every acted turn: the bucket brigade, worked out here
    (docs/reference/method.md, section 2), over each episode's rewards (a skipped turn's added to the actor
    before it) and winning bids."""
    out = []
    for ep in episodes:
        rewards = []
        for t in ep.turns:
            if t.winner is not None:
                rewards.append(t.reward)
            elif rewards:
                rewards[-1] += t.reward
        credit, v, b_next = [], 0.0, 0.0
        for r, t in zip(reversed(rewards), reversed(ep.acted)):
            v = r + b_next * v
            credit.insert(0, (1.0 - t.auction.winning_bid) * v)
            b_next = t.auction.winning_bid
        out += [(t.winner, t.action_prompt, t.action_tokens, c) for t, c in zip(ep.acted, credit)]
    return out


def bid_mismatch(agents, pairs, policy, cap: float) -> tuple[float, float]:
    """What ``bid_update`` should report for ``policy``'s decisive pairs (docs/reference/engine.md, "Off-policy
    terms"): the mean over their original bids' tokens of ``exp(d) - 1 - d``, ``d`` = the learner's log-prob now
    minus the sampler's, and the mean of each bid's weight ``min(cap, exp(sum d))``."""
    mine = [p for p in pairs if agents[p.agent].policy is policy and p.original_score != p.branch_score]
    per_token: list = []
    with torch.no_grad():
        sampled_logprobs(policy, [p.prompt for p in mine], [p.original for p in mine], per_token_out=per_token)
    deltas = [lt.double() - torch.tensor(p.original_logprobs, dtype=torch.float64) for lt, p in zip(per_token, mine)]
    k3 = sum(float((d.exp() - 1 - d).sum()) for d in deltas) / sum(d.numel() for d in deltas)
    weights = [min(cap, math.exp(float(d.sum()))) for d in deltas]
    return k3, sum(weights) / len(weights)


def test_sft_lowers_loss_and_learns_role(ctx):
    agents, policies = ctx.build_swarm()
    demos = collect_demos(ctx.domain, ctx.task, [0, 1], rng=random.Random(0))
    assert {e.kind for e in demos["Smith"]} == {"bid", "act"}
    # each role's action demos hold only its own instructions
    assert all(e.target.split()[0] in ("craft", "smelt") for e in demos["Smith"] if e.kind == "act")
    assert all(e.target.split()[0] in ("chop", "explore") for e in demos["Logger"] if e.kind == "act")
    pol = policies["Logger"]
    before = snapshot(pol)
    m = sft(pol, demos["Logger"], epochs=10, lr=3e-3, batch_size=32, seed=0, progress=False)
    assert changed(before, pol)
    assert m["loss"] < 0.5 * m["first_loss"]


def test_sft_action_epochs_pass_over_actions_more_often(ctx):
    """algo.sft.action_epochs: action demos get their own number of passes, bids keep ``epochs``."""
    agents, policies = ctx.build_swarm()
    demos = collect_demos(ctx.domain, ctx.task, [0], rng=random.Random(0))["Logger"]
    n_act = sum(e.kind == "act" for e in demos)
    n_bid = len(demos) - n_act
    pol = policies["Logger"]
    m = sft(pol, demos, epochs=1, lr=1e-3, batch_size=16, seed=0, progress=False, action_epochs=4)
    assert m["examples_trained"] == n_bid + 4 * n_act
    # one pass at a time: a pass that holds only actions still fills whole batches
    assert m["steps"] == -(-len(demos) // 16) + 3 * -(-n_act // 16)
    m = sft(pol, demos, epochs=2, lr=1e-3, batch_size=16, seed=0, progress=False)
    assert m["examples_trained"] == 2 * len(demos)


def test_action_and_bid_steps_change_parameters(ctx):
    agents, policies = ctx.build_swarm()
    opts = {r: make_optimizer(p.parameters(), 1e-3, 0.0, 10) for r, p in policies.items()}
    rng = random.Random(0)
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [0, 1, 2]),
            agents,
            ctx.coordinator(),
            ctx.domain,
            24,
            rng,
            record_snapshots=True,
        )
    assert all(len(e.turns) == 24 or e.metrics.get("success") for e in eps)
    # the credit of every acted turn, by value: on a copy of the episodes where every turn paid a reward of its own
    # (the untrained swarm earns nothing) and two turns were skipped, the first one's reward dropped, the second's
    # added to the actor before it
    paying = copy.deepcopy(eps)
    for e in paying:
        for t in e.turns:
            t.reward = 1.0 + 0.01 * t.t + 0.1 * e.seed
    for t in (paying[0].turns[0], paying[1].turns[5]):
        t.auction = AuctionResult(None, None)
    assert credit_samples(paying, ctx.credit_fn(), rng) == expected_credit(paying)
    samples = credit_samples(eps, ctx.credit_fn(), rng)
    assert samples == expected_credit(eps)
    # give each acting agent's first sample a reward, so that every acting model's advantages are non-zero
    acting = {agents[s[0]].role for s in samples}
    for a in {s[0] for s in samples}:
        i = next(i for i, s in enumerate(samples) if s[0] == a)
        samples[i] = (*samples[i][:3], samples[i][3] + 10.0)
    before = {r: snapshot(p) for r, p in policies.items()}
    m = action_update(agents, samples, opts, reward_scale=10.0, minibatch=16, grad_clip=1.0)
    assert all(changed(before[r], policies[r]) for r in acting)
    assert set(k.split("_", 1)[1] for k in m if k.startswith("losses/action_")) == acting

    picks = pick_contested(eps, 2, rng)
    assert picks and all(t.auction.contested and t.snapshot is not None for _, t in picks)
    with torch.no_grad():
        pairs = run_branches(agents, ctx.coordinator(), ctx.domain, ctx.task, picks, 3, rng)
    for p in pairs:  # branches re-sampled a strictly lower bid for the selected agent
        assert p.counterfactual != p.original
        assert len(p.original_logprobs) == len(p.original)  # the rollout sampler's log-probs of the original bid
    # force a decisive pair so the Bradley-Terry step runs whatever the branch scores were
    ep, turn = picks[0]
    sel = turn.winner
    pol = agents[sel].policy
    pairs.append(
        BranchPair(
            sel,
            turn.bid_prompts[sel],
            turn.bid_tokens[sel],
            pol.bid_target(0.0),
            5.0,
            0.0,
            original_logprobs=turn.bid_logprobs[sel],
        )
    )
    before = snapshot(pol)
    with torch.no_grad():
        lw0 = float(pol.logprobs([turn.bid_prompts[sel]], [turn.bid_tokens[sel]]))
    # the original bids (drawn before the action update moved the weights) against the learner (docs/reference/engine.md)
    kl, weight = bid_mismatch(agents, pairs, pol, cap=2.0)
    m = bid_update(agents, pairs, opts, minibatch=16, grad_clip=1.0, is_cap=2.0)
    assert changed(before, pol) and m["charts/bid_pairs"] == sum(p.original_score != p.branch_score for p in pairs)
    role = agents[sel].role
    assert m[f"mismatch/bid_approx_kl_{role}"] == pytest.approx(kl, rel=1e-4, abs=1e-9)
    assert m[f"mismatch/bid_is_weight_mean_{role}"] == pytest.approx(weight, rel=1e-4)
    with torch.no_grad():
        lw1 = float(pol.logprobs([turn.bid_prompts[sel]], [turn.bid_tokens[sel]]))
    assert lw1 > lw0  # the winning bid became more likely


def test_counterfactual_branch_starts_from_exact_state(ctx):
    """A contested turn's snapshot, restored into a fresh env, is the world the original episode was in at that
    turn (its full state equal to a replay of the turns before it, and the public log its agents saw), and the
    turn's own action played from it earns what it earned in the original."""
    from swarm_runtime.conformance.probe import first_difference, state_of
    from swarm_runtime.core.domain import Event
    from swarm_runtime.core.loop import make_env

    agents, _ = ctx.build_swarm()
    rng = random.Random(3)
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [5]), agents, ctx.coordinator(), ctx.domain, 24, rng, record_snapshots=True
        )
    (ep,) = eps
    picks = [(e, t) for e, t in pick_contested(eps, 24, rng) if t.t >= 3]
    assert picks
    for _, turn in picks:
        restored = make_env(ctx.domain, ctx.task)
        restored.restore(turn.snapshot[0])
        replayed = make_env(ctx.domain, ctx.task)
        replayed.reset(ep.seed)
        for u in ep.turns[: turn.t]:
            if u.winner is not None:
                replayed.step(u.action_text, agents[u.winner].role)
        where = f"seed {ep.seed}, turn {turn.t}"
        assert (restored.done, restored.total_reward, restored.t) == (replayed.done, replayed.total_reward, replayed.t)
        diff = first_difference(state_of(restored.env), state_of(replayed.env))
        assert diff is None, f"{where}: the restored world differs from the replayed one at {diff}"
        log = [
            Event(u.t, agents[u.winner].role, u.action_text, u.valid, u.reward)
            if u.winner is not None
            else Event(u.t, None, "")
            for u in ep.turns[: turn.t]
        ]
        assert turn.snapshot[1] == log, where
        assert restored.observation() in turn.action_prompt, where
        res = restored.step(turn.action_text, agents[turn.winner].role)
        assert (res.reward, res.valid) == (turn.reward, turn.valid), where


def test_schedule_four_to_one():
    kinds = [step_kind(i, 4, 1) for i in range(10)]
    assert kinds == ["action"] * 4 + ["bid"] + ["action"] * 4 + ["bid"]
    assert [step_kind(i, 2, 0) for i in range(3)] == ["action"] * 3


def test_sampling_logprobs_match_scoring(ctx):
    """Left-padded cached sampling and right-padded scoring give the same log-probabilities."""
    agents, policies = ctx.build_swarm()
    pol = policies["Miner"]
    prompts = ["you are Miner . goal iron_pickaxe . log : none . action :", "you are Miner . action :", "mine"]
    seen = []
    pick = pol._pick

    def recording_pick(logits, keys=None):
        nxt = pick(logits, keys)
        seen.append(torch.log_softmax(logits.float(), -1).gather(-1, nxt[:, None]).squeeze(-1))
        return nxt

    pol._pick = recording_pick
    outs = pol._sample([pol.encode_prompt(p) for p in prompts], 5, None)  # no banned tokens: same distribution
    sampled = torch.stack([sum(seen[j][i] for j in range(len(o))) for i, o in enumerate(outs)])
    with torch.no_grad():
        scored = pol.logprobs(prompts, outs)
    assert torch.allclose(sampled, scored, atol=1e-4)
    probs = pol.bid_distribution(prompts)
    with torch.no_grad():
        lpb = pol.logprobs(prompts, [pol.bid_target(0.4)] * 3)
    assert (torch.log(probs[:, 2]) >= lpb - 1e-4).all()  # restricted softmax >= full softmax probability


def test_rl_losses_score_at_the_sampling_temperature(ctx):
    """At model.temperature T != 1 the action sampler draws from softmax(logits / T); REINFORCE and
    Bradley-Terry must score log pi_T (on-policy), not the temperature-1 log-probabilities."""
    from swarm_runtime.learn.bid import _bradley_terry_chunk, _PreferenceRow
    from swarm_runtime.learn.logprobs import sampled_logprobs
    from swarm_runtime.learn.losses import reinforce_chunk

    _, policies = ctx.build_swarm()
    pol = policies["Miner"]
    prompts = ["you are Miner . goal iron_pickaxe . log : none . action :", "you are Miner . action :"]
    pol.temperature = 0.4
    seen = []
    pick = pol._pick

    def recording_pick(logits, keys=None):
        nxt = pick(logits, keys)
        seen.append(torch.log_softmax(logits.float() / 0.4, -1).gather(-1, nxt[:, None]).squeeze(-1))
        return nxt

    pol._pick = recording_pick
    outs = pol._sample([pol.encode_prompt(p) for p in prompts], 5, None)
    sampled = torch.stack([sum(seen[j][i] for j in range(len(o))) for i, o in enumerate(outs)])
    with torch.no_grad():
        at_t = sampled_logprobs(pol, prompts, outs)
        at_1 = pol.logprobs(prompts, outs)
        assert torch.allclose(sampled, at_t, atol=1e-4) and not torch.allclose(at_t, at_1, atol=1e-2)
        # the losses use the tempered scores: REINFORCE with advantage 1 is -log pi_T
        loss = reinforce_chunk(pol, [(p, o, 1.0) for p, o in zip(prompts, outs)])
        assert float(loss) == pytest.approx(float(-at_t.mean()), rel=1e-4)
        hi, lo = pol.bid_target(0.8), pol.bid_target(0.2)
        bt = _bradley_terry_chunk(pol, [_PreferenceRow(prompts[0], hi, lo, 1.0)])
        gap = float(pol.logprobs(prompts[:1], [hi]) - pol.logprobs(prompts[:1], [lo])) / 0.4
        assert float(bt) == pytest.approx(float(torch.nn.functional.softplus(torch.tensor(-gap))), rel=1e-4)


def test_margin_weighted_bid_pairs_follow_the_mean_score_difference(ctx):
    """One large win for the higher bid against three small losses: the paper's uniform
    Bradley-Terry step sides with the majority (the lower bid), ``margin`` with the mean.
    Plain SGD, so the step follows the weighted gradient (Adam's first step is sign-like)."""
    agents, policies = ctx.build_swarm()
    pol = agents[0].policy
    start = snapshot(pol)
    prompt = "bid prompt : the wood is near"
    high, low = pol.bid_target(0.8), pol.bid_target(0.2)
    pairs = [BranchPair(0, prompt, high, low, 1.2, 0.0)] + [BranchPair(0, prompt, high, low, 0.0, 0.2)] * 3

    def gap():
        with torch.no_grad():
            return float(pol.logprobs([prompt], [high]) - pol.logprobs([prompt], [low]))

    g0, after = gap(), {}
    for scheme in ("uniform", "margin"):
        restore(pol, start)
        bid_update(agents, pairs, plain_sgd(policies, 0.05), minibatch=2, grad_clip=100.0, pair_weight=scheme)
        after[scheme] = gap()
    # BT's fixed points: sigmoid(gap) = the (weighted) share of wins for the high bid, 1/4 vs 2/3
    assert after["uniform"] < g0 and after["margin"] > after["uniform"] + 0.05


def test_a_bid_reference_keeps_confident_bids_under_noise_and_follows_a_consistent_preference(ctx):
    """algo.bid_reference=sft on a real tiny model: first make its bid confident (0.8 over 0.2), freeze a
    copy as the reference; pairs that split evenly then lower that confidence under the paper's loss
    but leave it in place against the reference, while pairs the high bid keeps winning still raise it."""
    import copy

    agents, policies = ctx.build_swarm()
    pol = agents[0].policy
    prompt = "bid prompt : the wood is near"
    high, low = pol.bid_target(0.8), pol.bid_target(0.2)

    def gap():
        with torch.no_grad():
            return float(pol.logprobs([prompt], [high]) - pol.logprobs([prompt], [low]))

    opts = plain_sgd(policies, 0.05)
    for _ in range(60):
        bid_update(agents, [BranchPair(0, prompt, high, low, 1.0, 0.0)], opts, 16, 100.0)
    confident = gap()
    assert confident > 2.0
    start = snapshot(pol)
    reference = {r: copy.deepcopy(p) for r, p in policies.items()}
    split = [BranchPair(0, prompt, high, low, 1.0, 0.0), BranchPair(0, prompt, high, low, 0.0, 1.0)]
    after = {}
    for name, ref, pairs in (
        ("paper", None, split),
        ("reference", reference, split),
        ("reference, high keeps winning", reference, split[:1] * 2),
    ):
        restore(pol, start)
        m = bid_update(agents, pairs, plain_sgd(policies, 0.05), 16, 100.0, reference=ref)
        after[name] = gap()
        if ref is not None:
            assert m[f"charts/bid_ref_logodds_{agents[0].role}"] == pytest.approx(0.0, abs=1e-5)
    assert after["paper"] < confident - 0.05
    assert after["reference"] == pytest.approx(confident, abs=1e-4)
    assert after["reference, high keeps winning"] > confident + 0.05


def test_kl_coef_charges_each_action_its_drift_from_the_reference(ctx):
    """algo.kl_coef: with equal credits REINFORCE has no signal and leaves the model alone; with the
    KL charge each action pays kl_coef * [log pi - log pi_ref], so a step moves the model back
    toward the reference on those actions. Against a reference equal to the model it changes nothing."""
    import copy

    agents, policies = ctx.build_swarm()
    pol = policies["Logger"]
    reference = {r: copy.deepcopy(p) for r, p in policies.items()}
    demos = collect_demos(ctx.domain, ctx.task, [0], rng=random.Random(0))["Logger"]
    sft(pol, demos, epochs=3, lr=3e-3, batch_size=16, seed=0, progress=False)  # the model drifts from the reference
    acts = [(e.prompt, pol.action_target(e.target)) for e in demos if e.kind == "act"][:12]
    samples = [(0, p, t, 1.0) for p, t in acts]

    def drift():
        with torch.no_grad():
            prompts, toks = [p for p, _ in acts], [t for _, t in acts]
            return float((pol.logprobs(prompts, toks) - reference["Logger"].logprobs(prompts, toks)).abs().mean())

    start, d0 = snapshot(pol), drift()
    assert d0 > 0.5
    action_update(agents, samples, plain_sgd(policies, 0.5), 1.0, 8, 100.0)
    assert not changed(start, pol)  # equal credits, no KL: zero advantages
    m = action_update(agents, samples, plain_sgd(policies, 0.5), 1.0, 8, 100.0, reference=reference, kl_coef=1.0)
    assert m["charts/kl_Logger"] > 0.5 and drift() < d0
    restore(pol, start)
    same = {r: copy.deepcopy(p) for r, p in policies.items()}
    m = action_update(agents, samples, plain_sgd(policies, 0.5), 1.0, 8, 100.0, reference=same, kl_coef=1.0)
    assert m["charts/kl_Logger"] == pytest.approx(0.0, abs=1e-5) and not changed(start, pol)


def test_branch_samples_average_several_continuations_per_side(ctx, monkeypatch):
    """algo.branch_samples=3: per pick, 3 branches where the runner-up acts and 2 re-rolls where
    the selected agent acts again, all from the turn's snapshot; each side's score is its mean."""
    import swarm_runtime.learn.bid as bid_mod

    agents, _ = ctx.build_swarm()
    rng = random.Random(1)
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [0, 1]),
            agents,
            ctx.coordinator(),
            ctx.domain,
            24,
            rng,
            record_snapshots=True,
        )
    picks = pick_contested(eps, 2, rng)
    assert picks
    seen = {}

    def spy(slots, *args, **kw):
        seen["forced"] = [(s.episode.seed, s.t, s.forced.winner) for s in slots]
        seen["episodes"] = play(slots, *args, **kw)
        return seen["episodes"]

    monkeypatch.setattr(bid_mod, "play", spy)
    with torch.no_grad():
        pairs = run_branches(agents, ctx.coordinator(), ctx.domain, ctx.task, picks, 10, rng, samples=3)
    kept = [(ep, t) for ep, t in picks if t.auction.runner_up_bid > 0]
    assert len(seen["forced"]) == 5 * len(pairs) and len(pairs) >= 1
    for k, pair in enumerate(pairs):
        forced = seen["forced"][5 * k : 5 * k + 5]
        ep, turn = next((e, t) for e, t in kept if (e.seed, t.t) == forced[0][:2])
        assert turn.winner == pair.agent
        assert [w for *_, w in forced] == [turn.auction.runner_up] * 3 + [turn.winner] * 2
        rewards = [e.reward for e in seen["episodes"][5 * k : 5 * k + 5]]
        assert pair.branch_score == pytest.approx(sum(rewards[:3]) / 3)
        original = sum(t.reward for t in ep.turns[turn.t :])
        assert pair.original_score == pytest.approx((original + rewards[3] + rewards[4]) / 3)


def test_branch_horizon_compares_the_same_window_on_both_sides(ctx, monkeypatch):
    """algo.branch_horizon=H: branches stop H decisions after the branched turn and the original
    scores its rewards over the same H decisions."""
    import swarm_runtime.learn.bid as bid_mod

    agents, _ = ctx.build_swarm()
    rng = random.Random(2)
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [0, 1, 2]),
            agents,
            ctx.coordinator(),
            ctx.domain,
            24,
            rng,
            record_snapshots=True,
        )
    picks = [(e, t) for e, t in pick_contested(eps, 3, rng) if t.t + 3 < len(e.turns)]
    assert picks
    seen = {}

    def spy(slots, *args, **kw):
        seen["starts"] = [(s.episode.seed, s.t) for s in slots]
        seen["episodes"] = play(slots, *args, **kw)
        return seen["episodes"]

    monkeypatch.setattr(bid_mod, "play", spy)
    with torch.no_grad():
        pairs = run_branches(agents, ctx.coordinator(), ctx.domain, ctx.task, picks, 10, rng, horizon=3)
    assert pairs and len(seen["episodes"]) == len(pairs)
    assert all(len(br.turns) <= 3 for br in seen["episodes"]) and any(len(br.turns) == 3 for br in seen["episodes"])
    for pair, (seed, t0), br in zip(pairs, seen["starts"], seen["episodes"]):
        ep = next(e for e in eps if e.seed == seed)
        assert pair.branch_score == pytest.approx(br.reward)
        assert pair.original_score == pytest.approx(sum(t.reward for t in ep.turns[t0 : t0 + 3]))


def test_runner_up_pairs_train_the_runner_ups_bid_on_the_same_two_outcomes(ctx, monkeypatch):
    """algo.bid_pairs=both: each selected pair is followed by one of the runner-up's bids, its original
    (lower) bid with the original score and a re-sampled bid above the winner's with the branch's;
    no extra rollouts. A Bradley-Terry step then moves the runner-up's bid toward the better side."""
    import swarm_runtime.learn.bid as bid_mod

    agents, policies = ctx.build_swarm()
    rng = random.Random(4)
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [0, 1, 2]),
            agents,
            ctx.coordinator(),
            ctx.domain,
            24,
            rng,
            record_snapshots=True,
        )
    picks = pick_contested(eps, 3, rng)
    calls = []
    real_play = bid_mod.play
    monkeypatch.setattr(bid_mod, "play", lambda slots, *a, **k: calls.append(len(slots)) or real_play(slots, *a, **k))
    with torch.no_grad():
        pairs = run_branches(agents, ctx.coordinator(), ctx.domain, ctx.task, picks, 10, rng, runner_up_pairs=True)
    selected = [p for p in pairs if not p.runner_up]
    assert calls == [len(selected)]  # one rollout per pick, as without runner-up pairs
    ups = [p for p in pairs if p.runner_up]
    assert ups

    def level(p):
        pol = agents[p.agent].policy
        return pol.bid_levels[pol.bid_ids.index(p.counterfactual[0])]

    for i, p in enumerate(pairs):
        if not p.runner_up:
            continue
        sel = pairs[i - 1]  # its selected agent's pair comes first
        assert not sel.runner_up and (p.original_score, p.branch_score) == (sel.original_score, sel.branch_score)
        assert any(
            (p.agent, p.prompt, p.original)
            == (t.auction.runner_up, t.bid_prompts[t.auction.runner_up], t.bid_tokens[t.auction.runner_up])
            and level(p) > t.auction.winning_bid
            and t.bid_prompts[t.winner] == sel.prompt
            for _, t in picks
        )
    # the branch (runner-up acting) scored better: the runner-up's higher bid becomes more likely
    p = ups[0]
    pol = agents[p.agent].policy
    forced = BranchPair(p.agent, p.prompt, p.original, p.counterfactual, 0.0, 1.0, runner_up=True)
    opts = {r: make_optimizer(q.parameters(), 1e-3, 0.0, 10) for r, q in policies.items()}
    with torch.no_grad():
        before = float(pol.logprobs([p.prompt], [p.counterfactual]))
    m = bid_update(agents, [forced], opts, minibatch=16, grad_clip=1.0)
    with torch.no_grad():
        assert float(pol.logprobs([p.prompt], [p.counterfactual])) > before
    assert m["charts/bid_pairs_runner_up"] == 1 and m["charts/bid_pairs_higher_won"] == 0


def test_bad_bid_pair_options_name_the_valid_ones(registry):
    from swarm_runtime.config.errors import ConfigError

    with pytest.raises(ConfigError, match="algo.bid_pairs='all' is not valid: must be one of selected, both"):
        resolve(["domain=minecraft", "algo.bid_pairs=all"], registry[1])
    with pytest.raises(ConfigError, match=r"algo.branch_horizon=0 is not valid: must be an integer in \[1, "):
        resolve(["domain=minecraft", "algo.branch_horizon=0"], registry[1])
    with pytest.raises(ConfigError, match="algo.bid_reference='init' is not valid: must be one of none, sft"):
        resolve(["domain=minecraft", "algo.bid_reference=init"], registry[1])
    with pytest.raises(ConfigError, match="algo.kl_coef=-0.1 is not valid: must be a finite number >= 0"):
        resolve(["domain=minecraft", "algo.kl_coef=-0.1"], registry[1])
    with pytest.raises(ConfigError, match="algo.bid_beta=0.0 is not valid: must be a finite number > 0"):
        resolve(["domain=minecraft", "algo.bid_beta=0"], registry[1])
    assert resolve(["domain=minecraft", "algo.branch_horizon=8"], registry[1]).algo.branch_horizon == 8


def test_common_random_numbers_make_a_branch_differ_only_by_its_forced_decision(ctx):
    """algo.common_random_numbers: a continuation forced to the decision the original made, with
    the original's noise id, replays the original exactly; with the policies' generators it does not."""
    from swarm_runtime.core.episode import ForcedTurn
    from swarm_runtime.learn.bid import forced_slot

    agents, _ = ctx.build_swarm()

    def replays(noise: int | None) -> list[bool]:
        rng = random.Random(3)
        slots = new_slots(ctx.domain, ctx.task, [0, 1, 2])
        for k, s in enumerate(slots):
            s.episode.noise = None if noise is None else noise + k
        with torch.no_grad():
            eps = play(slots, agents, ctx.coordinator(), ctx.domain, 24, rng, record_snapshots=True)
        picks = pick_contested(eps, 3, rng)
        assert len(picks) >= 3
        again = [
            forced_slot(ctx.domain, ctx.task, ep, t, ForcedTurn(t.bids, t.bid_tokens, t.bid_prompts, t.winner), 0)
            for ep, t in picks
        ]
        with torch.no_grad():
            reruns = play(again, agents, ctx.coordinator(), ctx.domain, 24, rng)
        return [
            [x.action_text for x in r.turns] == [x.action_text for x in ep.turns[t.t :]]
            and r.reward == pytest.approx(sum(x.reward for x in ep.turns[t.t :]))
            for r, (ep, t) in zip(reruns, picks)
        ]

    assert all(replays(1000))
    assert not all(replays(None))


def test_a_forced_turn_can_also_force_the_winners_action(ctx):
    """ForcedTurn(action=...): the winner takes the given action at the restored turn instead of sampling."""
    from swarm_runtime.core.episode import ForcedTurn
    from swarm_runtime.core.protocols import Response
    from swarm_runtime.learn.bid import forced_slot

    agents, _ = ctx.build_swarm()
    rng = random.Random(3)
    with torch.no_grad():
        eps = play(
            new_slots(ctx.domain, ctx.task, [0, 1]),
            agents,
            ctx.coordinator(),
            ctx.domain,
            24,
            rng,
            record_snapshots=True,
        )
    ep, t = pick_contested(eps, 1, rng)[0]
    action = Response("craft planks", agents[t.winner].policy.action_target("craft planks"))
    forced = ForcedTurn(t.bids, t.bid_tokens, t.bid_prompts, t.winner, action=action)
    with torch.no_grad():
        (again,) = play(
            [forced_slot(ctx.domain, ctx.task, ep, t, forced, 0, horizon=2)],
            agents,
            ctx.coordinator(),
            ctx.domain,
            24,
            rng,
        )
    first = again.turns[0]
    assert (first.winner, first.action_text, first.action_tokens) == (t.winner, "craft planks", action.tokens)
    assert first.action_prompt == t.action_prompt and len(again.turns) <= 2


def test_mpt_bid_step_passes_noise_ids_to_its_branches(registry, tmp_path, monkeypatch):
    """With algo.common_random_numbers=true every rollout episode gets its own noise id; with
    branch_samples=2 the 0-th branch reuses it and the 1-st branch shares a fresh one with the re-roll."""
    import swarm_runtime.learn.bid as bid_mod
    import swarm_runtime.learn.mpt as mpt_mod

    pm, reg = registry
    cfg = resolve(
        [
            "domain=minecraft",
            "task=iron_pickaxe",
            "task.max_decisions=16",
            "algo.envs_per_step=3",
            "algo.action_steps=1",
            "algo.bid_steps=1",
            "algo.branch_samples=2",
            "algo.common_random_numbers=true",
            "tensorboard=false",
            "progress=false",
        ],
        reg,
    )
    trainer = mpt_mod.MPTTrainer(RunContext(cfg, pm, reg, tmp_path))
    trainer._setup()
    seen = {}

    def spy(name, real):
        def wrapped(slots, *args, **kw):
            seen.setdefault(name, []).append([(s.episode.noise, s.forced and s.forced.winner) for s in slots])
            return real(slots, *args, **kw)

        return wrapped

    monkeypatch.setattr(mpt_mod, "play", spy("rollout", play))
    monkeypatch.setattr(bid_mod, "play", spy("branch", play))
    m = trainer.rl_step(1)
    assert m["kind"] == "bid"
    rollout = [n for n, _ in seen["rollout"][0]]
    assert all(isinstance(n, int) for n in rollout) and len(set(rollout)) == 3
    branch = seen["branch"][0]
    assert branch and len(branch) % 3 == 0  # per pick: 2 runner-up branches, 1 re-roll of the selected agent
    for k in range(0, len(branch), 3):
        (cf0, w0), (cf1, w1), (again1, w_sel) = branch[k : k + 3]
        assert cf0 in rollout and cf1 == again1 and cf1 not in rollout
        assert w0 == w1 != w_sel
