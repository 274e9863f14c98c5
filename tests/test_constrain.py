"""Constrained action decoding (``model.constrained_actions``): the trie, a real tiny policy
sampling and scoring under it, the run wiring, and a short real VLN-CE training run."""

import json
import math
from collections import Counter

import pytest
import torch
from conftest import run_context, swarm

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import resolve
from swarm_runtime.conformance.env import check_action_choices
from swarm_runtime.learn.logprobs import sampled_logprobs
from swarm_runtime.models.constrain import ActionTrie
from swarm_runtime.runs.context import RunContext

EOS = 3


def test_trie_forces_shared_tokens_and_rejects_foreign_actions():
    trie = ActionTrie(["a b", "a c", "d"], [[5, 6, EOS], [5, 7, EOS], [8, EOS]], vocab_size=10, eos=EOS)
    assert trie.allowed[0].nonzero().flatten().tolist() == [5, 8]
    after_a = trie.step(0, 5)
    assert trie.allowed[after_a].nonzero().flatten().tolist() == [6, 7]
    assert trie.walk([5, 7, EOS]) == [0, after_a, trie.step(after_a, 7)]
    leaf = trie.step(trie.step(0, 8), EOS)
    assert trie.allowed[leaf].nonzero().flatten().tolist() == [EOS]  # a finished row never has an empty row
    assert trie.longest == 3
    for foreign in ([5, EOS], [5, 6], [5, 6, EOS, EOS], [9, EOS], []):
        with pytest.raises(ValueError, match="not one of the role's action choices.*'a b', 'a c', 'd'"):
            trie.walk(foreign)
    with pytest.raises(ValueError, match="does not end in the end-of-sequence"):
        ActionTrie(["x"], [[5]], vocab_size=10, eos=EOS)
    with pytest.raises(ValueError, match="'y' has words the tokenizer does not know"):
        ActionTrie(["y"], [[1, EOS]], vocab_size=10, eos=EOS, invalid=[1])
    with pytest.raises(ValueError, match="empty"):
        ActionTrie([], [], vocab_size=10, eos=EOS)


@pytest.fixture(scope="module")
def ctx(registry):
    return run_context(registry, "domain=vln_ce", "task=r2r", "model.constrained_actions=true")


def test_a_constrained_policy_samples_and_scores_only_its_choices(ctx):
    agents, policies = ctx.build_swarm()
    turner = policies["Turner"]
    choices = ctx.domain.action_choices(ctx.task, "Turner")
    targets = [turner.action_target(t) for t in choices]
    prompt = ctx.domain.action_prompt("Turner", "kitchen ahead 3 m", [])
    # An untrained model puts almost no mass on the choices; under the constraint they sum to 1.
    for temperature in (1.0, 0.5):
        turner.temperature = temperature
        with torch.no_grad():
            logp = sampled_logprobs(turner, [prompt] * len(choices), targets, actions=True)
            free = sampled_logprobs(turner, [prompt] * len(choices), targets)
        assert logp.exp().sum().item() == pytest.approx(1.0, abs=1e-4)
        assert free.exp().sum().item() < 0.01
    turner.temperature = 1.0
    # Sampling follows those probabilities, and every sample is a listed action.
    outs = turner.act([prompt] * 600)
    assert {tuple(o.tokens) for o in outs} <= {tuple(t) for t in targets}
    freq = Counter(tuple(o.tokens) for o in outs)
    for t, lp in zip(targets, logp.tolist()):
        assert freq[tuple(t)] / 600 == pytest.approx(math.exp(lp), abs=0.06)
    # The forced words ("The next action is turn ... degree .") carry no gradient; the two choices do.
    turner.model.zero_grad()
    sampled_logprobs(turner, [prompt], [targets[0]], actions=True).sum().backward()
    emb = turner.model.get_input_embeddings().weight.grad  # tied with the output layer
    moved = set(emb.abs().sum(1).nonzero().flatten().tolist())
    words = {turner.tok.convert_tokens_to_ids(w) for w in ("left", "right", "1", "3", "4")}
    assert words <= moved and turner.tok.convert_tokens_to_ids("move") not in moved
    # A response that is not a choice is refused by name.
    bad = turner.action_target("The next action is move forward 25 cm.")
    with pytest.raises(ValueError, match="not one of the role's action choices"):
        sampled_logprobs(turner, [prompt], [bad], actions=True)
    # Each role samples only its own actions; the Stopper is fully forced.
    stop = policies["Stopper"].act([prompt] * 5)
    assert {o.text for o in stop} == {"The next action is stop ."}


def test_the_monolithic_model_gets_every_roles_choices(ctx):
    from swarm_runtime.learn.monolithic import build_monolithic

    _, policies = build_monolithic(ctx)
    (policy,) = policies.values()
    assert sorted(policy.action_trie.texts) == sorted(ctx.domain.action_choices(ctx.task, None))
    texts = {o.text for o in policy.act([ctx.domain.single_prompt("hall ahead 2 m", [])] * 200)}
    assert texts <= {" ".join(t.replace(".", " .").split()) for t in policy.action_trie.texts}


def test_constrained_actions_needs_a_domain_that_lists_them(registry, tmp_path):
    pm, reg = registry
    cfg = resolve(["domain=openresearcher", "task=embedded", "model.constrained_actions=true"], reg)
    with pytest.raises(ConfigError, match="lists no action choices.*set model.constrained_actions=false"):
        RunContext(cfg, pm, reg, None).build_swarm()
    cfg = resolve(["domain=vln_ce", "task=r2r", "model.constrained_actions=true", "model.max_action_tokens=5"], reg)
    with pytest.raises(ConfigError, match="tokens long, more than model.max_action_tokens=5"):
        RunContext(cfg, pm, reg, None).build_swarm()


def test_vln_choices_pass_the_conformance_check_and_bad_lists_fail_it(registry):
    _, reg = registry
    domain = reg.domains["vln_ce"]
    check_action_choices(domain, "r2r")
    assert len(domain.action_choices(domain.task_config("r2r"), None)) == 10

    class Listing(type(domain)):
        def __init__(self, extra: dict):
            self.extra = extra

        def action_choices(self, task, role):
            return super().action_choices(task, role) + self.extra.get(role, [])

    with pytest.raises(
        AssertionError,
        match=r"^vln_ce/r2r, seed 0, step 0, action 'The next action is stop\.' by "
        r"Turner: the listed action choice is not a valid action of Turner",
    ):
        check_action_choices(Listing({"Turner": ["The next action is stop."]}), "r2r")
    with pytest.raises(
        AssertionError,
        match=r"^vln_ce/r2r, seed 0, step 0, action 'zigzag' by Mover: the listed "
        r"action choice has words missing from vocabulary\(\): \['zigzag'\]",
    ):
        check_action_choices(Listing({"Mover": ["zigzag"]}), "r2r")

    class Narrow(type(domain)):
        def action_choices(self, task, role):
            return super().action_choices(task, role)[:1]  # the Turner may only turn left 15

    with pytest.raises(
        AssertionError,
        match=r"^vln_ce/r2r, seed 0, step \d+, action '[^']+' by Turner: the "
        r"expert's action is not among Turner's 1 listed action choices",
    ):
        check_action_choices(Narrow(), "r2r")


def test_a_constrained_vln_run_trains_without_invalid_actions(tmp_path):
    run = tmp_path / "run"
    res = swarm(
        "run",
        "domain=vln_ce",
        "task=r2r",
        f"run_dir={run}",
        "model.constrained_actions=true",
        "algo.sft.demo_episodes=4",
        "algo.iterations=2",
        "algo.envs_per_step=4",
        "algo.lr=1e-3",
        "eval.episodes=4",
        "eval.runs=1",
        "progress=false",
        cwd=tmp_path,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "losses/action_Turner" in r or "losses/action_Mover" in r]
    assert trained, "no action step ran"
    invalid = [r[k] for r in rows for k in r if k.endswith("invalid_actions")]
    assert invalid and max(invalid) == 0
