"""Common random numbers: keyed Gumbel noise, Gumbel-max picks, and a real policy sampling by key."""

import math

import pytest
import torch
from conftest import run_context

from swarm_runtime.core.noise import key_hash
from swarm_runtime.models.noise import gumbel, gumbel_max


@pytest.fixture(scope="module")
def ctx(registry):
    return run_context(registry, "domain=minecraft", "task=iron_pickaxe")


def test_keyed_gumbels_are_a_function_of_the_key_alone():
    assert torch.equal(gumbel((7, 3, 1, 0), 5), gumbel((7, 3, 1, 0), 5))
    assert not torch.equal(gumbel((7, 3, 1, 0), 5), gumbel((7, 3, 0, 1), 5))
    assert key_hash(1, 2) != key_hash(2, 1)
    g = torch.cat([gumbel((42, i), 100) for i in range(200)])
    assert g.mean().item() == pytest.approx(0.5772, abs=0.02)  # Euler-Mascheroni: the Gumbel mean
    assert g.var().item() == pytest.approx(math.pi**2 / 6, rel=0.05)


def test_gumbel_max_samples_the_softmax_and_never_a_banned_token():
    logits = torch.tensor([[0.0, -math.inf, math.log(2.5), math.log(1.5), -math.inf]])  # p = .2, 0, .5, .3, 0
    n = 20_000
    picks = torch.cat([gumbel_max(logits, [(9, i)]) for i in range(n)]).tolist()
    freq = [picks.count(i) / n for i in range(5)]
    assert freq[1] == freq[4] == 0
    assert freq[0] == pytest.approx(0.2, abs=0.01) and freq[2] == pytest.approx(0.5, abs=0.01)
    # several rows at once, each with its own key: the same as one at a time
    rows = torch.randn(4, 7)
    keys = [(1, i) for i in range(4)]
    assert gumbel_max(rows, keys).tolist() == [gumbel_max(rows[i : i + 1], keys[i : i + 1]).item() for i in range(4)]
    # the coupling: a small change of the logits keeps most picks (inverse CDF would shift every boundary)
    base = torch.randn(1, 50)
    moved = base.clone()
    moved[0, 0] += 0.5
    same = sum(gumbel_max(base, [(5, i)]).item() == gumbel_max(moved, [(5, i)]).item() for i in range(2000))
    assert same / 2000 > 0.9


def test_keyed_sampling_depends_on_the_key_not_the_batch(ctx):
    _, policies = ctx.build_swarm()
    pol = policies["Logger"]
    prompts = [ctx.domain.action_prompt("Logger", f"obs {i}", []) for i in range(3)]
    bprompts = [ctx.domain.bid_prompt("Logger", f"obs {i}", []) for i in range(3)]
    keys = [(11, 0, 0, 1), (11, 0, 1, 1), (12, 5, 0, 1)]
    state = pol.rng_state().clone()
    batch = pol.act(prompts, keys=keys)
    alone = pol.act(prompts[2:], keys=keys[2:])
    assert batch[2].tokens == alone[0].tokens
    assert [r.tokens for r in pol.act(prompts[::-1], keys=keys[::-1])] == [r.tokens for r in batch[::-1]]
    assert [b.level for b in pol.bid(bprompts, keys=keys)][1:] == [
        b.level for b in pol.bid(bprompts[1:], keys=keys[1:])
    ]
    assert torch.equal(pol.rng_state(), state)  # keyed draws leave the generator alone
    # other keys, other samples (an untrained model samples nearly uniformly)
    many = {tuple(pol.act(prompts[:1], keys=[(k, 0, 0, 1)])[0].tokens) for k in range(8)}
    assert len(many) > 1


def test_keyed_bids_follow_the_bid_distribution(ctx):
    _, policies = ctx.build_swarm()
    pol = policies["Miner"]
    prompt = ctx.domain.bid_prompt("Miner", "you see stone", [])
    n = 4000
    bids = pol.bid([prompt] * n, keys=[(3, i, 0, 0) for i in range(n)])
    probs = pol.bid_distribution([prompt])[0].tolist()
    freq = [sum(b.level == lvl for b in bids) / n for lvl in pol.bid_levels]
    assert max(abs(f - p) for f, p in zip(freq, probs)) < 0.03, (freq, probs)


def test_evaluation_with_common_random_numbers_pairs_episodes_across_batches(ctx):
    """eval.common_random_numbers: a held-out episode's outcome depends on (eval seed, run, episode
    seed) alone, not on which other seeds share its batch; the generators give no such pairing."""
    from omegaconf import OmegaConf

    from swarm_runtime.evaluation.heldout import evaluate

    agents, _ = ctx.build_swarm()
    task = OmegaConf.merge(ctx.task, {"max_decisions": 12})

    def actions(seeds, crn):
        _, eps = evaluate(agents, ctx.coordinator(), ctx.domain, task, seeds, 2, 5, common_random_numbers=crn)
        return {(i // len(seeds), e.seed): [t.action_text for t in e.turns] for i, e in enumerate(eps)}

    full, alone = actions([0, 1, 2], True), actions([1], True)
    assert full[(0, 1)] == alone[(0, 1)] and full[(1, 1)] == alone[(1, 1)]
    assert full[(0, 1)] != full[(1, 1)]  # the two runs of a seed draw different noise
    full, alone = actions([0, 1, 2], False), actions([1], False)
    assert full[(0, 1)] != alone[(0, 1)] or full[(1, 1)] != alone[(1, 1)]
