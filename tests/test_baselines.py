"""Baselines registered through the public hooks: the Graph-of-Agents and AgentNet coordinators
(hand-made inputs and a real batch of episodes), the monolithic REINFORCE trainer (its SFT matching
and a real gradient step) and the bid/action split policy."""
import random

import pytest
import torch

from conftest import run_context
from swarm_runtime.config import resolve
from swarm_runtime.coordinators import (AgentNetCoordinator, GraphOfAgentsCoordinator, most_relevant, route,
                                        vote)
from swarm_runtime.episode import SINGLE_ACTOR, TurnInfo, new_slots, play
from swarm_runtime.policy.split import SplitPolicy
from swarm_runtime.run import RunContext
from swarm_runtime.train.monolithic import MONOLITHIC, build_monolithic, matched_sft_plan, reward_to_go_credit
from swarm_runtime.train.sft import collect_demos


# ---------------------------------------------------------------------- pure choice rules
def test_most_relevant_takes_the_highest_bids_and_skips_absent():
    assert most_relevant([0.2, None, 0.8, 0.4], 2, random.Random(0)) == [2, 3]
    assert most_relevant([0.2, None, 0.8, 0.4], 9, random.Random(0)) == [2, 3, 0]
    # ties at the top: both orders occur over seeds
    firsts = {most_relevant([0.6, 0.6, 0.0], 1, random.Random(s))[0] for s in range(20)}
    assert firsts == {0, 1}


def test_vote_majority_then_relevance():
    bids = [0.2, 0.4, 0.8]
    # two agents agree (case/space-insensitive): majority wins over the most relevant agent
    assert vote(bids, {0: "chop tree", 1: "Chop  tree", 2: "craft planks"}, random.Random(0)) in (0, 1)
    assert vote(bids, {0: "chop tree", 1: "chop tree", 2: "craft planks"}, random.Random(0)) == 1  # higher bid of the pair
    # all different: the most relevant proposer
    assert vote(bids, {0: "a", 1: "b", 2: "c"}, random.Random(0)) == 2
    assert vote(bids, {}, random.Random(0)) is None


def test_route_never_skips_and_breaks_ties_randomly():
    assert route([0.0, 0.0, None], random.Random(0)) in (0, 1)  # all-zero: still someone acts
    assert route([None, None], random.Random(0)) is None
    assert {route([0.4, 0.4, 0.2], random.Random(s)) for s in range(20)} == {0, 1}


def test_coordinator_objects_on_hand_made_turns():
    goa = GraphOfAgentsCoordinator()
    assert goa.uses_bids and goa.uses_proposals and goa.wants_info
    assert goa.proposers([0.0, 0.8, 0.4], random.Random(0), 0) == [1, 2]
    res = goa.select([0.0, 0.8, 0.4], random.Random(0), 0, info=TurnInfo(None, {1: "mine stone", 2: "craft stick"}))
    assert (res.winner, res.winning_bid, res.runner_up, res.contested) == (1, 0.8, None, False)
    assert goa.select([None, None], random.Random(0), 0, info=TurnInfo(None, {})).winner is None
    net = AgentNetCoordinator()
    assert net.bid_scorer(2, None) == 2 and net.bid_scorer(2, 0) == 0  # the last actor routes
    assert net.select([0.2, 0.6, None], random.Random(0), 3, info=TurnInfo(0, {})).winner == 1


# ---------------------------------------------------------------------- real episodes
@pytest.fixture(scope="module")
def ctx(registry):
    return run_context(registry, "domain=minecraft", "task=iron_pickaxe", "task.max_decisions=6")


@pytest.mark.parametrize("name", ["graph_of_agents", "agentnet"])
def test_baseline_coordinators_play_real_episodes(ctx, name):
    agents, _ = ctx.build_swarm()
    coord = ctx.coordinator(name)
    calls = []
    orig = coord.select

    def spy(bids, rng, turn, info=None):
        calls.append((list(bids), info))
        return orig(bids, rng, turn, info=info)

    coord.select = spy
    with torch.no_grad():
        eps = play(new_slots(ctx.domain, ctx.task, [0, 1]), agents, coord, ctx.domain, 6, random.Random(0))
    assert all(len(e.turns) == 6 for e in eps) or any(e.metrics.get("success") for e in eps)
    assert all(t.winner is not None for e in eps for t in e.turns)  # neither baseline skips
    assert all(t.action_tokens for e in eps for t in e.turns)
    if name == "graph_of_agents":
        # every turn had two proposals; the executed action is the winner's proposal
        assert all(len(info.proposals) == 2 for _, info in calls)
        assert all(t.winner in info.proposals and info.proposals[t.winner] == t.action_text
                   for (_, info), t in zip(calls, [t for tt in zip(*[e.turns for e in eps]) for t in tt]))
    else:
        # after the first turn, the router is the previous actor of that episode
        lasts = [info.last_actor for _, info in calls]
        assert lasts[:2] == [None, None] and all(a is not None for a in lasts[2:])


def test_split_policy_routes_bids_and_actions(ctx):
    _, pa = ctx.build_swarm()
    bid_model, act_model = pa["Logger"], pa["Miner"]
    sp = SplitPolicy(bid_model, act_model)
    called = []
    bid_model.bid = lambda prompts, f=bid_model.bid: called.append("bid") or f(prompts)
    act_model.act = lambda prompts, f=act_model.act: called.append("act") or f(prompts)
    sp.gen.manual_seed(3)
    sp.temperature = 0.5
    assert bid_model.temperature == act_model.temperature == 0.5
    assert len(sp.bid(["you are Logger . bid :"])) == 1 and len(sp.act(["you are Logger . action :"])) == 1
    assert called == ["bid", "act"]
    state = sp.rng_state()
    sp.set_rng_state(state)


def test_split_policy_saves_both_models(ctx, tmp_path):
    from transformers import AutoModelForCausalLM

    _, pa = ctx.build_swarm()
    SplitPolicy(pa["Logger"], pa["Miner"]).save(tmp_path / "split")
    for sub, pol in (("bid", pa["Logger"]), ("action", pa["Miner"])):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "split" / sub)
        ref = dict(pol.model.named_parameters())
        assert all(torch.equal(p, ref[n]) for n, p in loaded.named_parameters())


# ---------------------------------------------------------------------- monolithic
def test_matched_sft_plan():
    # 100 expert steps, 3 roles, 2 epochs: the swarm trains 100 * (3 bid + 1 action) * 2 = 800 examples
    epochs, steps = matched_sft_plan(100, 3, 2, 64)
    assert epochs == 8 and steps == 13  # ceil(800 / 64)
    # with algo.sft.action_epochs=10 the action demos get 10 passes: 100 * (3 * 2 + 10) = 1600 examples
    epochs, steps = matched_sft_plan(100, 3, 2, 64, action_epochs=10)
    assert epochs == 16 and steps == 25


def test_monolithic_acts_every_turn_on_single_prompts_and_learns(ctx):
    agents, policies = build_monolithic(ctx)
    assert len(agents) == 1 and agents[0].prompt_kind == "single" and agents[0].env_role is None
    demos = collect_demos(ctx.domain, ctx.task, [0], single=True)["single"]
    assert demos and all(" log : " in e.prompt and not e.prompt.startswith("you are") for e in demos)
    assert all(SINGLE_ACTOR in e.prompt for e in demos[1:])  # its own turns are logged as "you"
    rng = random.Random(0)
    with torch.no_grad():
        eps = play(new_slots(ctx.domain, ctx.task, [0, 1, 2]), agents, ctx.coordinator("round_robin"), ctx.domain,
                   6, rng)
    assert all(t.winner == 0 for e in eps for t in e.turns)
    assert all(t.action_prompt == ctx.domain.single_prompt(*_obs_log(t)) for e in eps for t in e.turns[:1])
    from swarm_runtime.train.action import action_update, credit_samples
    from swarm_runtime.train.optim import make_optimizer

    samples = credit_samples(eps, reward_to_go_credit, rng)
    samples[0] = (*samples[0][:3], samples[0][3] + 10.0)  # a non-zero advantage
    pol = policies[MONOLITHIC]
    before = [p.detach().clone() for p in pol.parameters()]
    m = action_update(agents, samples, {MONOLITHIC: make_optimizer(pol.parameters(), 1e-3, 0.0, 5)}, 55.0, 64, 1.0)
    assert f"losses/action_{MONOLITHIC}" in m
    assert any(not torch.equal(a, b) for a, b in zip(before, pol.parameters()))


def _obs_log(turn):
    # the first turn's single prompt: the observation text is inside the prompt, the log is empty
    obs = turn.action_prompt.split(" . log : ")[0]
    return obs, []


def test_reward_to_go_credit_ignores_bids():
    assert reward_to_go_credit([0, 10, 5], [0.4, 0.6, 0.2], random.Random(0)) == [15.0, 15.0, 5.0]


def test_monolithic_trainer_rl_step_updates_the_model(registry, tmp_path):
    from swarm_runtime.train.monolithic import MonolithicTrainer

    pm, reg = registry
    cfg = resolve(["domain=minecraft", "task=wooden_pickaxe", "algo=monolithic", "task.max_decisions=6",
                   "algo.envs_per_step=2", "algo.iterations=2", "tensorboard=false", "progress=false"], reg)
    trainer = MonolithicTrainer(RunContext(cfg, pm, reg, tmp_path))
    trainer._setup()
    assert [a.name for a in trainer.agents] == [MONOLITHIC] and trainer.coordinator.uses_bids is False
    assert trainer.credit is reward_to_go_credit
    # an untrained model earns no reward in 6 turns; a credit that varies by turn gives a real gradient
    trainer.credit = lambda rewards, bids, rng: [float(i) for i in range(len(rewards))]
    pol = trainer.policies[MONOLITHIC]
    before = [p.detach().clone() for p in pol.parameters()]
    m = trainer.rl_step(0)
    assert m["kind"] == "action" and m["flops/update"] > 0 and m["charts/decisions"] == 6
    assert any(not torch.equal(a, b) for a, b in zip(before, pol.parameters()))


@pytest.mark.parametrize("arg", ["algo.sft.match=flops", "experiment.monolithic_sft=[compute,flops]"])
def test_bad_sft_match_names_the_valid_ones(registry, arg):
    from swarm_runtime.config import ConfigError

    with pytest.raises(ConfigError, match=r"'flops'\]? is not valid: must be .*one of compute, data"):
        resolve(["domain=minecraft", "task=wooden_pickaxe", arg], registry[1])


@pytest.mark.parametrize("arg, key", [("algo.sft.action_epochs=0", "action_epochs"), ("algo.sft.epochs=0", "epochs")])
def test_sft_passes_must_be_positive(registry, arg, key):
    from swarm_runtime.config import ConfigError

    with pytest.raises(ConfigError, match=rf"algo.sft.{key}=0 is not valid: must be an integer in \[1, "):
        resolve(["domain=minecraft", "task=wooden_pickaxe", arg], registry[1])


def test_bad_bid_pair_weight_names_the_valid_ones(registry):
    from swarm_runtime.config import ConfigError

    with pytest.raises(ConfigError, match="algo.bid_pair_weight='median' is not valid: must be one of uniform, margin"):
        resolve(["domain=minecraft", "task=wooden_pickaxe", "algo.bid_pair_weight=median"], registry[1])
