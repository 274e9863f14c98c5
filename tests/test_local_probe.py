"""The base check's in-process probe (swarm_runtime/sampling/sync.py: ``local_probe``) on a PEFT-wrapped base: the
LM head runs on the last position only (``logits_to_keep=1`` reaches the base through PEFT), the adapters are off,
and the log-probs are the ones of the full pass. A tiny Qwen2 built from a config; a few seconds."""

from types import SimpleNamespace

import pytest
import torch

peft = pytest.importorskip("peft")

from swarm_runtime.models.transformers_backend import build_tiny_model  # noqa: E402
from swarm_runtime.sampling.sync import local_probe  # noqa: E402


def test_the_probe_runs_the_head_on_the_last_position_with_the_adapters_off():
    cfg = SimpleNamespace(
        hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, max_positions=64
    )
    base = build_tiny_model(50, cfg, seed=0).eval()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    torch.manual_seed(1)
    with torch.no_grad():  # adapters that change the output, so "off" is seen
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids = [2, 7, 11, 13, 17, 19, 23]
    x = torch.tensor([ids])
    with torch.no_grad():
        with model.disable_adapter():
            want = torch.log_softmax(model(input_ids=x, use_cache=False).logits[0, -1], dim=-1)
        with_adapters = torch.log_softmax(model(input_ids=x, use_cache=False).logits[0, -1], dim=-1)
    assert not torch.allclose(want, with_adapters, atol=1e-3)
    head_rows = []
    hook = base.lm_head.register_forward_hook(lambda _m, inp, _out: head_rows.append(inp[0].shape[1]))
    try:
        got = local_probe(SimpleNamespace(shared_base=SimpleNamespace(model=model), device="cpu"), ids)
    finally:
        hook.remove()
    assert head_rows == [1]  # the full pass ran the head on all 7 positions
    assert got.shape == (50,)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
