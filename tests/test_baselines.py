"""Baselines registered through the public hooks: the Graph-of-Agents and AgentNet coordinators
(hand-made inputs and a real batch of episodes), the monolithic REINFORCE trainer (its SFT matching
and a real gradient step) and the bid/action split policy."""

import random

import pytest
import torch
from conftest import run_context

from swarm_runtime.config.load import resolve
from swarm_runtime.core.coordinators import (
    AgentNetCoordinator,
    GraphOfAgentsCoordinator,
    agentnet_choice,
    goa_choice,
    most_relevant,
)
from swarm_runtime.core.episode import SINGLE_ACTOR, TurnInfo
from swarm_runtime.core.loop import new_slots
from swarm_runtime.learn.monolithic import MONOLITHIC, build_monolithic, matched_sft_plan, reward_to_go_credit
from swarm_runtime.learn.sft import collect_demos
from swarm_runtime.models.split import SplitPolicy
from swarm_runtime.runs.context import RunContext
from swarm_runtime.sampling.play import play


# ---------------------------------------------------------------------- pure choice rules
def test_most_relevant_takes_the_most_confident():
    assert most_relevant({0: -2.0, 2: -0.5, 3: -1.0}, 2, random.Random(0)) == [2, 3]
    assert most_relevant({0: -2.0, 2: -0.5, 3: -1.0}, 9, random.Random(0)) == [2, 3, 0]
    # ties at the top: both orders occur over seeds
    firsts = {most_relevant({0: -1.0, 1: -1.0, 2: -3.0}, 1, random.Random(s))[0] for s in range(20)}
    assert firsts == {0, 1}


def test_goa_peer_review_picks_what_the_other_responders_rate_best():
    # self-confidence: 0 > 1 > 2; responders (k=2) are 0 and 1
    sc = {
        (0, 0): -0.1,
        (1, 1): -0.2,
        (2, 2): -0.3,
        (0, 1): -0.5,
        (1, 0): -2.0,  # agent 0 rates 1's proposal higher than 1 rates 0's
        (0, 2): -0.1,
        (2, 0): -0.1,
        (1, 2): -0.1,
        (2, 1): -0.1,
    }
    assert goa_choice(sc, [0, 1, 2], 2, random.Random(0)) == 1  # not the most confident one
    # three responders: mean of the other two
    assert goa_choice(sc, [0, 1, 2], 3, random.Random(0)) == 2  # (-0.1 -0.1)/2 beats 1's and 0's
    assert goa_choice(sc, [0, 1, 2], 1, random.Random(0)) == 0  # one responder: the most confident
    tie = {(0, 0): -0.1, (1, 1): -0.2, (0, 1): -1.0, (1, 0): -1.0}
    assert goa_choice(tie, [0, 1], 2, random.Random(0)) == 0  # peer tie -> more relevant
    assert goa_choice({}, [], 2, random.Random(0)) is None


def test_agentnet_router_routes_to_its_best_rated_proposal():
    sc = {(1, 0): -3.0, (1, 1): -1.0, (1, 2): -0.5, (0, 0): -0.1, (2, 2): -9.0}
    assert agentnet_choice(sc, [0, 1, 2], 1, random.Random(0)) == 2  # router 1 hands over to 2
    # no router yet (or absent): the most self-confident acts
    assert agentnet_choice(sc, [0, 1, 2], None, random.Random(0)) == 0
    assert agentnet_choice({(0, 0): -0.1, (2, 2): -9.0}, [0, 2], 1, random.Random(0)) == 0
    ties = {agentnet_choice({(0, 0): -1.0, (0, 1): -1.0}, [0, 1], 0, random.Random(s)) for s in range(20)}
    assert ties == {0, 1}
    assert agentnet_choice({}, [], 0, random.Random(0)) is None


def test_coordinator_objects_read_no_bids():
    goa, net = GraphOfAgentsCoordinator(), AgentNetCoordinator()
    for c in (goa, net):
        assert not c.uses_bids and c.uses_proposals and c.wants_info
        assert c.proposers([0.0, None, 0.0], random.Random(0), 0) == [0, 2]
    assert goa.judge_pairs([0, 2], None) == [(0, 0), (0, 2), (2, 0), (2, 2)]
    assert net.judge_pairs([0, 2], None) == [(0, 0), (2, 2)]
    assert net.judge_pairs([0, 2], 2) == [(2, 0), (2, 2)]
    assert net.judge_pairs([0, 2], 1) == [(0, 0), (2, 2)]  # the router dropped out
    sc = {(0, 0): -0.1, (2, 2): -0.2, (0, 2): -0.3, (2, 0): -0.4}
    res = goa.select([0.0, None, 0.0], random.Random(0), 0, info=TurnInfo(None, {0: "a", 2: "b"}, sc))
    assert (res.winner, res.winning_bid, res.contested) == (2, 0.0, False)
    assert goa.select([None, None], random.Random(0), 0, info=TurnInfo(None, {})).winner is None


# ---------------------------------------------------------------------- real episodes
@pytest.fixture(scope="module")
def ctx(registry):
    return run_context(registry, "domain=minecraft", "task=iron_pickaxe", "task.max_decisions=6")


@pytest.mark.parametrize("name", ["graph_of_agents", "agentnet"])
def test_baseline_coordinators_play_real_episodes_without_bids(ctx, name):
    agents, policies = ctx.build_swarm()
    for p in policies.values():  # any bid request fails the test: the baselines read no MPT signal
        p.bid = lambda *a, **k: (_ for _ in ()).throw(AssertionError("a baseline sampled a bid"))
    coord = ctx.coordinator(name)
    calls = []
    orig = coord.select

    def spy(bids, rng, turn, info=None):
        calls.append((list(bids), info))
        return orig(bids, rng, turn, info=info)

    coord.select = spy
    with torch.no_grad():
        eps = play(new_slots(ctx.domain, ctx.task, [0, 1]), agents, coord, ctx.domain, 6, random.Random(0))
    turns = [t for tt in zip(*[e.turns for e in eps]) for t in tt]
    assert all(len(e.turns) == 6 for e in eps) or any(e.metrics.get("success") for e in eps)
    assert all(t.winner is not None for t in turns)  # neither baseline skips
    assert all(t.action_tokens and t.bid_prompts == [None] * 3 for t in turns)
    # every turn: all three proposed, the executed action is the winner's proposal
    assert all(len(info.proposals) == 3 for _, info in calls)
    assert all(info.proposals[t.winner] == t.action_text for (_, info), t in zip(calls, turns))
    # the scores are real per-token log-probs of the action models, and the pick follows the rule
    for _, info in calls:
        assert info.scores and all(v < 0 for v in info.scores.values())
    if name == "graph_of_agents":
        assert all(len(info.scores) == 9 for _, info in calls)
        a, p = agents[0], 1
        _, info = calls[0]
        obs0 = new_slots(ctx.domain, ctx.task, [0])[0].env.observation()
        prompt = agents[p].action_prompt(ctx.domain, obs0, [])
        tok = a.policy.action_target(info.proposals[p])
        with torch.no_grad():
            ref = a.policy.logprobs([prompt], [tok]).item() / len(tok)
        assert info.scores[(0, p)] == pytest.approx(ref, rel=1e-5)
    else:
        lasts = [info.last_actor for _, info in calls]
        assert lasts[:2] == [None, None] and all(a is not None for a in lasts[2:])
        assert all(len(info.scores) == 3 for _, info in calls)
        assert all({j for j, _ in info.scores} == {info.last_actor} for _, info in calls[2:])


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
        eps = play(
            new_slots(ctx.domain, ctx.task, [0, 1, 2]), agents, ctx.coordinator("round_robin"), ctx.domain, 6, rng
        )
    assert all(t.winner == 0 for e in eps for t in e.turns)
    assert all(t.action_prompt == ctx.domain.single_prompt(*_obs_log(t)) for e in eps for t in e.turns[:1])
    from swarm_runtime.learn.action import action_update, credit_samples
    from swarm_runtime.learn.optim import make_optimizer

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
    from swarm_runtime.learn.monolithic import MonolithicTrainer

    pm, reg = registry
    cfg = resolve(
        [
            "domain=minecraft",
            "task=wooden_pickaxe",
            "algo=monolithic",
            "task.max_decisions=6",
            "algo.envs_per_step=2",
            "algo.iterations=2",
            "tensorboard=false",
            "progress=false",
        ],
        reg,
    )
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
    from swarm_runtime.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'flops'\]? is not valid: must be .*one of compute, data"):
        resolve(["domain=minecraft", "task=wooden_pickaxe", arg], registry[1])


@pytest.mark.parametrize("arg, key", [("algo.sft.action_epochs=0", "action_epochs"), ("algo.sft.epochs=0", "epochs")])
def test_sft_passes_must_be_positive(registry, arg, key):
    from swarm_runtime.config.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"algo.sft.{key}=0 is not valid: must be an integer in \[1, "):
        resolve(["domain=minecraft", "task=wooden_pickaxe", arg], registry[1])


def test_bad_bid_pair_weight_names_the_valid_ones(registry):
    from swarm_runtime.config.errors import ConfigError

    with pytest.raises(ConfigError, match="algo.bid_pair_weight='median' is not valid: must be one of uniform, margin"):
        resolve(["domain=minecraft", "task=wooden_pickaxe", "algo.bid_pair_weight=median"], registry[1])
