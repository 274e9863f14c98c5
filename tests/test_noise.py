"""Common random numbers: keyed uniforms, inverse-CDF picks, and a real policy sampling by key."""
import pytest
import torch

from swarm_runtime.config import resolve
from swarm_runtime.policy.noise import inverse_cdf, key_hash, uniform
from swarm_runtime.run import RunContext


@pytest.fixture(scope="module")
def ctx(registry):
    pm, reg = registry
    cfg = resolve(["domain=minecraft", "task=iron_pickaxe"], reg)
    return RunContext(cfg, pm, reg, None)


def test_uniform_is_a_function_of_its_key_alone():
    assert uniform(7, 3, 1, 0) == uniform(7, 3, 1, 0)
    assert len({uniform(7, 3, 1, 0), uniform(7, 3, 0, 1), uniform(3, 7, 1, 0), uniform(7, 3, 1)}) == 4
    assert key_hash(1, 2) != key_hash(2, 1)
    draws = [uniform(42, i) for i in range(20_000)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert sum(draws) / len(draws) == pytest.approx(0.5, abs=0.01)
    assert sum(u < 0.1 for u in draws) / len(draws) == pytest.approx(0.1, abs=0.01)


def test_inverse_cdf_follows_the_probabilities_and_never_picks_a_zero():
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3, 0.0]])
    grid = [(i + 0.5) / 1000 for i in range(1000)]
    picks = torch.cat([inverse_cdf(probs, [u]) for u in grid]).tolist()
    assert [picks.count(i) for i in range(5)] == [200, 0, 500, 300, 0]
    assert inverse_cdf(probs, [1.0 - 1e-12]).item() == 3  # rounding at the top never lands on a trailing zero
    # unnormalised rows (what a softmax in float32 may hand over) and several rows at once
    rows = torch.tensor([[2.0, 2.0], [0.0, 5.0]])
    assert inverse_cdf(rows, [0.49, 0.0]).tolist() == [0, 1]


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
    assert [b.level for b in pol.bid(bprompts, keys=keys)][1:] == [b.level for b in pol.bid(bprompts[1:], keys=keys[1:])]
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
    from swarm_runtime.evaluate import evaluate
    from omegaconf import OmegaConf

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
