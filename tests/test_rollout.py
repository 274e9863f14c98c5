"""Samplers and learners (swarm_runtime/rollout): the in-process sampler's responses carry the log-probs the
learner recomputes, importance weights and mismatch metrics from real model scores, engine settings refused
with a clear line, and the chat template of an instruct tokenizer."""

import math
import random
from dataclasses import replace

import pytest
import torch
from conftest import run_context, swarm

from swarm_runtime.core.loop import new_slots
from swarm_runtime.core.protocols import Learner, Row, Sampler
from swarm_runtime.learn.logprobs import sampled_logprobs
from swarm_runtime.sampling.local import LocalLearner, LocalSampler, model_names
from swarm_runtime.sampling.mismatch import Mismatch, importance_weight, token_deltas
from swarm_runtime.sampling.play import play


@pytest.fixture(scope="module", params=["none", "lora"])
def swarm_ctx(registry, request):
    ctx = run_context(
        registry, "domain=minecraft", "task=iron_pickaxe", "task.max_decisions=12", f"model.adapter={request.param}"
    )
    agents, policies = ctx.build_swarm(replicas=2)
    return ctx, agents, policies


def test_local_sampler_and_learner_follow_the_protocols(swarm_ctx):
    _, agents, policies = swarm_ctx
    sampler, names = LocalSampler.for_agents(agents)
    assert isinstance(sampler, Sampler) and isinstance(LocalLearner(policies), Learner)
    assert names == [a.role for a in agents]  # replicas share their role's weights


def test_model_names_tell_apart_agents_of_one_role_with_their_own_weights(swarm_ctx):
    _, agents, policies = swarm_ctx
    own = [type(a)(a.name, a.role, policies["Logger"] if a.name.endswith("#1") else policies["Miner"]) for a in agents]
    names = model_names(own)
    assert len(set(names)) == len({(a.role, id(a.policy)) for a in own})
    assert "Logger#1" in names and "Logger#2" in names


def test_sampler_logprobs_are_the_learners_on_the_same_weights(swarm_ctx):
    """Every sampled action's and bid's per-token log-probs equal what the learner scores (full copies, and
    adapters in one mixed batch across roles), and each response carries its model's version."""
    ctx, agents, policies = swarm_ctx
    learner = LocalLearner(policies)
    learner.bump(["Smith"], version=7)
    sampler = LocalSampler(policies, learner)
    slots = new_slots(ctx.domain, ctx.task, [0, 1])
    obs = [s.env.observation() for s in slots]
    rows = [Row(a.role, ctx.domain.action_prompt(a.role, o, [])) for o in obs for a in agents]
    acts = sampler.act(rows)
    bids = sampler.bid([Row(a.role, ctx.domain.bid_prompt(a.role, o, [])) for o in obs for a in agents])
    assert [r.version for r in acts] == [7 if r.model == "Smith" else 0 for r in rows]
    for kind, answers in (("act", acts), ("bid", bids)):
        for row, res in zip(rows, answers):
            pol = policies[row.model]
            prompt = (
                row.prompt
                if kind == "act"
                else ctx.domain.bid_prompt(row.model, obs[rows.index(row) // len(agents)], [])
            )
            assert res.logprobs is not None and len(res.logprobs) == len(res.tokens) > 0
            out: list = []
            with torch.no_grad():
                total = sampled_logprobs(pol, [prompt], [res.tokens], per_token_out=out)
            torch.testing.assert_close(
                out[0].double(), torch.tensor(res.logprobs, dtype=torch.float64), atol=2e-5, rtol=0
            )
            assert abs(float(total) - sum(res.logprobs)) < 1e-4


def test_keys_make_the_sampler_draw_the_same_whatever_the_batch(swarm_ctx):
    ctx, agents, policies = swarm_ctx
    sampler = LocalSampler(policies)
    o = new_slots(ctx.domain, ctx.task, [3])[0].env.observation()
    rows = [Row(a.role, ctx.domain.action_prompt(a.role, o, []), (11, 0, i, 1)) for i, a in enumerate(agents)]
    together = sampler.act(rows)
    alone = [sampler.act([r])[0] for r in rows]
    assert [r.tokens for r in together] == [r.tokens for r in alone]


def test_play_through_an_explicit_sampler_is_play_by_default(swarm_ctx):
    ctx, agents, policies = swarm_ctx

    def run(explicit):
        for i, p in enumerate(policies.values()):
            p.gen.manual_seed(100 + i)
        slots = new_slots(ctx.domain, ctx.task, [5, 6])
        kw = {}
        if explicit:
            kw["sampler"], kw["models"] = LocalSampler.for_agents(agents)
        with torch.no_grad():
            eps = play(slots, agents, ctx.coordinator(), ctx.domain, 8, random.Random(0), **kw)
        return [[(t.winner, t.bids, t.action_tokens) for t in e.turns] for e in eps], eps

    a, eps = run(False)
    b, _ = run(True)
    assert a == b
    acted = [t for e in eps for t in e.acted]
    assert acted and all(
        t.action_logprobs is not None and len(t.action_logprobs) == len(t.action_tokens) for t in acted
    )
    bidders = [
        (t.bid_tokens[a], t.bid_logprobs[a])
        for e in eps
        for t in e.turns
        for a in range(len(agents))
        if t.bid_tokens[a] is not None
    ]
    assert bidders and all(lp is not None and len(lp) == len(tok) for tok, lp in bidders)


def test_mismatch_and_importance_weights_from_real_scores(registry):
    """A sampler that reported each token one nat less likely than the learner scores it: k3 KL e - 2 per
    token, max |d| 1, every token past a 1.5 cap, and the REINFORCE loss weighted by the capped ratio."""
    from swarm_runtime.learn.losses import reinforce_chunk

    ctx = run_context(registry, "domain=minecraft", "task=iron_pickaxe")
    _, policies = ctx.build_swarm()
    pol = policies["Logger"]
    slot = new_slots(ctx.domain, ctx.task, [0])[0]
    prompt = ctx.domain.action_prompt("Logger", slot.env.observation(), [])
    pol.gen.manual_seed(0)
    res = pol.act([prompt, prompt])
    with torch.no_grad():
        out: list = []
        sampled_logprobs(pol, [prompt] * 2, [r.tokens for r in res], actions=True, per_token_out=out)
    shifted = [[float(x) - 1.0 for x in lt] for lt in out]
    plain = reinforce_chunk(pol, [(prompt, r.tokens, 1.0) for r in res])
    stats = Mismatch(cap=1.5)
    weighted = reinforce_chunk(pol, [(prompt, r.tokens, 1.0, s) for r, s in zip(res, shifted)], stats=stats, is_cap=1.5)
    torch.testing.assert_close(weighted, 1.5 * plain)
    m = stats.metrics("Logger")
    n = sum(len(r.tokens) for r in res)
    assert stats.tokens == n
    assert abs(m["mismatch/approx_kl_Logger"] - (math.e - 2)) < 1e-5
    assert abs(m["mismatch/max_abs_dlogp_Logger"] - 1.0) < 1e-5 and m["mismatch/past_cap_Logger"] == 1.0
    assert m["mismatch/is_weight_mean_Logger"] == 1.5
    # on-policy rows: weight 1 (to float precision), nothing past the cap
    d = token_deltas(out[0], [float(x) for x in out[0]])
    assert importance_weight(d, 2.0) == pytest.approx(1.0) and float(d.abs().max()) == 0.0


@pytest.mark.parametrize(
    "args, words",
    [
        (["rollout.engine=vllm"], ["rollout.engine=vllm", "model.adapter=none", "model.adapter=lora"]),
        (["rollout.engine=openai", "model.adapter=lora"], ["rollout.url"]),
        (["rollout.engine=sglang"], ["rollout.engine='sglang'", "local, openai, vllm"]),
        (["rollout.url=ftp://x"], ["rollout.url", "http(s) URL"]),
        (["algo.is_cap=0.5"], ["algo.is_cap=0.5", ">= 1"]),
        (["model.chat_template=yes"], ["model.chat_template", "auto, none"]),
    ],
)
def test_engine_settings_are_checked_before_anything_runs(tmp_path, args, words):
    res = swarm(
        "run", "domain=minecraft", "task=wooden_pickaxe", *args, f"run_dir={tmp_path / 'r'}", cwd=tmp_path, timeout=120
    )
    assert res.returncode == 2, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert all(w in line for w in words), line
    assert not (tmp_path / "r").exists()


def test_chat_template_auto_prompts_an_instruct_tokenizer_in_its_template(registry):
    from swarm_runtime.models.tokenizer import build_tokenizer
    from swarm_runtime.models.transformers_backend import TransformersPolicy, build_tiny_model

    ctx = run_context(registry, "domain=minecraft", "task=iron_pickaxe")
    tok = build_tokenizer(ctx.domain.all_words(ctx.task) + ["system", "user", "assistant"], [0.0, 0.5])
    model = build_tiny_model(len(tok), ctx.cfg.model, 0)
    raw = TransformersPolicy(model, tok, [0.0, 0.5], chat_template="auto")  # no template: the raw prompt
    assert not raw.templated
    prompt = "you are Logger . inventory : none"
    plain = raw.encode_prompt(prompt)
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant{% endif %}"
    )
    inst = TransformersPolicy(model, tok, [0.0, 0.5], chat_template="auto")
    assert inst.templated
    ids = inst.encode_prompt(prompt)
    words = tok.convert_ids_to_tokens(ids)
    # the role card as the system message, the rest of the prompt as the user turn, then the generation prompt
    assert words[0] == "system" and words[-1] == "assistant" and words[5] == "user"
    assert ids[1:5] == plain[1:5] and ids[6:-1] == plain[5:] and len(plain) == 8
    assert TransformersPolicy(model, tok, [0.0, 0.5], chat_template="none").encode_prompt(prompt) == plain
    with pytest.raises(ValueError, match="chat_template 'yes'"):
        TransformersPolicy(model, tok, [0.0, 0.5], chat_template="yes")


def _bid_rows(registry):
    """The Logger's bid prompt, two of its bids drawn in process (their sampler log-probs) and the policy."""
    ctx = run_context(registry, "domain=minecraft", "task=iron_pickaxe")
    _, policies = ctx.build_swarm()
    pol = policies["Logger"]
    prompt = ctx.domain.bid_prompt("Logger", new_slots(ctx.domain, ctx.task, [0])[0].env.observation(), [])
    pol.gen.manual_seed(0)
    return pol, prompt, pol.bid([prompt, prompt])


def test_bid_mismatch_and_importance_weights_from_real_scores(registry):
    """The Bradley-Terry loss compares each pair's original bid (drawn by the sampler) with the learner's
    scores: a sampler that reported it one nat less likely gives k3 KL e - 2, max |d| 1, every token past a
    1.5 cap, and each pair's term weighted by the capped ratio, whichever side the original bid is on."""
    from swarm_runtime.learn.bid import _bradley_terry_chunk, _PreferenceRow

    pol, prompt, bids = _bid_rows(registry)
    assert all(b.logprobs is not None and len(b.logprobs) == len(b.tokens) == 1 for b in bids)
    other = pol.bid_target(0.0)
    shifted = [[x - 1.0 for x in b.logprobs] for b in bids]
    rows = [_PreferenceRow(prompt, bids[0].tokens, other, 1.0), _PreferenceRow(prompt, other, bids[1].tokens, 0.5)]
    plain = _bradley_terry_chunk(pol, rows)
    tracked = [replace(rows[0], behaviour=shifted[0]), replace(rows[1], behaviour=shifted[1], original_won=False)]
    stats = Mismatch(cap=1.5)
    weighted = _bradley_terry_chunk(pol, tracked, stats=stats, is_cap=1.5)
    torch.testing.assert_close(weighted, 1.5 * plain)
    m = stats.metrics("Logger", prefix="bid_")
    assert stats.tokens == 2 and set(m) == {
        f"mismatch/bid_{k}_Logger" for k in ("approx_kl", "max_abs_dlogp", "past_cap", "is_weight_mean")
    }
    assert abs(m["mismatch/bid_approx_kl_Logger"] - (math.e - 2)) < 1e-5
    assert abs(m["mismatch/bid_max_abs_dlogp_Logger"] - 1.0) < 1e-5 and m["mismatch/bid_past_cap_Logger"] == 1.0
    assert m["mismatch/bid_is_weight_mean_Logger"] == 1.5
    # a sampler ten nats more sure than the learner: the ratio e^-10 is not capped from below
    low = _bradley_terry_chunk(
        pol, [replace(tracked[0], behaviour=[x + 10.0 for x in bids[0].logprobs])], stats=Mismatch(cap=1.5), is_cap=1.5
    )
    torch.testing.assert_close(low, math.exp(-10.0) * _bradley_terry_chunk(pol, rows[:1]), rtol=1e-4, atol=0)


def test_bid_loss_without_is_cap_is_the_plain_loss_exactly(registry):
    """algo.is_cap off (the default): the sampler's log-probs only feed the metrics; the loss and its
    gradient are bit for bit those of rows without them (on-policy: a mismatch of 0 to float precision)."""
    from swarm_runtime.learn.bid import _bradley_terry_chunk, _PreferenceRow

    pol, prompt, bids = _bid_rows(registry)
    rows = [_PreferenceRow(prompt, bids[0].tokens, pol.bid_target(0.0), 1.0)]

    def loss_and_grad(rows, **kw):
        for p in pol.parameters():
            p.grad = None
        loss = _bradley_terry_chunk(pol, rows, **kw)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in pol.parameters() if p.grad is not None]

    stats = Mismatch()
    a, ga = loss_and_grad(rows)
    b, gb = loss_and_grad([replace(rows[0], behaviour=bids[0].logprobs)], stats=stats, is_cap=None)
    assert torch.equal(a, b) and len(ga) == len(gb) and all(torch.equal(x, y) for x, y in zip(ga, gb))
    m = stats.metrics("Logger", prefix="bid_")
    assert m["mismatch/bid_approx_kl_Logger"] < 1e-9 and m["mismatch/bid_max_abs_dlogp_Logger"] < 1e-4
    assert "mismatch/bid_is_weight_mean_Logger" not in m


def test_staleness_counts_the_updates_that_changed_the_acting_model():
    """charts/staleness: a response drawn by version v of a model lags the learner by the updates that changed
    that model since v, not by the run's updates since (a role no update touched is current), so it stays within
    rollout.max_staleness."""
    from types import SimpleNamespace

    from swarm_runtime.learn.mpt import rollout_staleness

    learner = LocalLearner({"A": None, "B": None})
    learner.bump(["A"], version=1)  # update 0 changed A, update 1 changed B, update 2 nothing; update 3 trains now
    learner.bump(["B"], version=2)
    assert [learner.behind("A", v) for v in (0, 1)] == [1, 0] and [learner.behind("B", v) for v in (0, 2)] == [1, 0]
    turn = lambda winner, version: SimpleNamespace(winner=winner, action_version=version)  # noqa: E731
    eps = [SimpleNamespace(acted=[turn(0, 1), turn(1, 0), turn(1, None)])]
    assert rollout_staleness(eps, ["A", "B"], learner) == 0.5  # A current, B one update behind (not 3 - v)
    assert rollout_staleness([SimpleNamespace(acted=[turn(0, None)])], ["A", "B"], learner) is None
    learner.set_versions({"A": 7})  # resumed: the checkpoint's version is current
    assert learner.behind("A", 7) == 0 and learner.behind("A", 1) == 1
