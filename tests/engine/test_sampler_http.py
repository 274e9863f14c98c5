"""The engine samplers' HTTP, sync and server-control code on any CPU, against a real HTTP server:
tests/engine/refserver.py (vLLM's completion and runtime-LoRA API computed with transformers + PEFT) and our
own serve worker (swarm_runtime/serve/worker.py with --enable-lora, which speaks vLLM's token-level fields).
The same checks against a real vLLM are in test_vllm.py (``-m engine``)."""

from __future__ import annotations

import json
import socket

import pytest
import torch
from enginekit import (
    PROMPTS,
    kill_mid_call,
    learner_for,
    openai_cfg,
    served_names,
    start_ref,
    start_worker,
    step_adapter,
)

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.core.protocols import Row
from swarm_runtime.sampling.factory import engine_folder, engine_sampler, write_base
from swarm_runtime.sampling.http import EngineError
from swarm_runtime.sampling.local import LocalSampler

ROWS = [Row(m, p, (5, i, 0, 1)) for i, (m, p) in enumerate(PROMPTS.items())]


@pytest.fixture(scope="module", params=["refserver", "worker"])
def ref(registry, tmp_path_factory, request):
    """A server on the run's own base (written as rollout.engine=vllm writes it): the reference server, or our
    own serve worker."""
    cfg, learner = learner_for(registry)
    run_dir = tmp_path_factory.mktemp("run")
    shared = next(iter(learner.policies.values())).shared_base
    base = write_base(shared, engine_folder(run_dir) / "base")
    start = start_ref if request.param == "refserver" else start_worker
    server = start(base, run_dir / f"{request.param}.log")
    yield cfg, learner, run_dir, server
    server.stop()


def test_sampler_matches_the_learner_and_syncs_versions(ref):
    cfg, learner, run_dir, server = ref
    s = engine_sampler(openai_cfg(cfg, server.url), learner, run_dir)
    try:
        assert served_names(server.url) == {"Logger@v0", "Miner@v0", "Smith@v0"}
        acts = s.act(ROWS)
        for r, a in zip(ROWS, acts):
            policy = learner.policy(r.model)
            assert a.tokens and all(0 <= t < len(policy.tok) for t in a.tokens)
            assert not set(a.tokens) & set(policy._action_ban.tolist())  # pad, BOS, unk, bid tokens banned
            assert a.version == 0 and a.text == policy.decode(a.tokens)
            # per token: the learner's log_softmax(logits) of each sampled token, in fp32
            ids = policy.encode_prompt(r.prompt)
            with torch.no_grad():
                logits = policy._forward(input_ids=torch.tensor([ids + a.tokens]), use_cache=False).logits[0]
            want = torch.log_softmax(logits.float(), -1)[len(ids) - 1 : -1].gather(-1, torch.tensor(a.tokens)[:, None])
            assert torch.allclose(torch.tensor(a.logprobs), want.squeeze(1), atol=1e-4)
        again = s.act(ROWS)  # keyed rows: the same seed, the same answer
        assert [a.tokens for a in again] == [a.tokens for a in acts]
        bids = s.bid(ROWS)
        local = LocalSampler(learner.policies, learner).bid(ROWS)
        assert [b.level for b in bids] == [b.level for b in local]  # keyed Gumbel noise on the same bid logits
        assert torch.allclose(
            torch.tensor([b.logprobs[0] for b in bids]), torch.tensor([b.logprobs[0] for b in local]), atol=1e-4
        )
        step_adapter(learner, "Miner")
        s.sync(learner, ["Miner"])
        assert served_names(server.url) == {"Logger@v0", "Miner@v1", "Smith@v0"}  # v0 unloaded (max_staleness=0)
        assert not (run_dir / "engine" / "adapters" / "Miner@v0").exists()
        after = s.act(ROWS)
        assert after[1].version == 1 and after[0].version == 0
        assert after[1].tokens != acts[1].tokens or after[1].logprobs != acts[1].logprobs
        assert after[0].tokens == acts[0].tokens  # Logger's adapter did not change
    finally:
        s.close()


def test_staleness_keeps_the_last_k_plus_one_versions(ref):
    cfg, learner, run_dir, server = ref
    s = engine_sampler(openai_cfg(cfg, server.url, max_staleness=1), learner, run_dir)
    try:
        v = learner.version("Smith")
        for k in range(3):
            step_adapter(learner, "Smith", seed=20 + k)
            s.sync(learner, ["Smith"])
        names = {n for n in served_names(server.url) if n.startswith("Smith@")}
        assert names == {f"Smith@v{v + 2}", f"Smith@v{v + 3}"}
        assert s.version("Smith") == v + 3
    finally:
        s.close()


def test_an_url_that_does_not_answer_is_one_clear_error(registry, tmp_path):
    cfg, learner = learner_for(registry)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens on it
    with pytest.raises(EngineError, match=rf"rollout.url=http://127.0.0.1:{port} does not answer"):
        engine_sampler(openai_cfg(cfg, f"http://127.0.0.1:{port}", retries=0), learner, tmp_path)


def test_a_server_without_runtime_lora_names_the_flags(registry, tmp_path):
    cfg, learner = learner_for(registry)
    base = write_base(next(iter(learner.policies.values())).shared_base, tmp_path / "base")
    server = start_ref(base, tmp_path / "ref.log", no_lora=True)
    try:
        with pytest.raises(EngineError, match="--enable-lora.*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            engine_sampler(openai_cfg(cfg, server.url), learner, tmp_path)
    finally:
        server.stop()


def test_a_server_on_another_base_is_refused(ref, registry):
    _, _, run_dir, server = ref
    cfg, other = learner_for(registry, "seed=5")  # another config-built base
    with pytest.raises(EngineError, match="not the run's base"):
        engine_sampler(openai_cfg(cfg, server.url), other, run_dir)


def test_a_rank_vllm_does_not_allow_is_refused_before_anything_runs(registry, tmp_path):
    from conftest import run_context

    with pytest.raises(ConfigError, match=r"model.lora.rank=4 is not a LoRA rank vLLM allows; valid: 1, 8, 16"):
        run_context(
            registry,
            "domain=minecraft",
            "model.adapter=lora",
            "model.lora.rank=4",
            "rollout.engine=openai",
            "rollout.url=http://127.0.0.1:9",
        )


def test_the_cli_refuses_a_rank_vllm_lacks_in_one_line_before_writing(tmp_path):
    from conftest import ROOT, TINY_RUN, swarm

    out = swarm(
        "run",
        *TINY_RUN,
        "model.adapter=lora",
        "model.lora.rank=4",
        "rollout.engine=vllm",
        f"run_dir={tmp_path / 'run'}",
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "model.lora.rank=4 is not a LoRA rank vLLM allows; valid: 1, 8, 16, 32, 64, 128, 256, 320, 512" in out.stderr
    assert not (tmp_path / "run").exists()


def test_a_port_in_use_is_one_clear_error(tmp_path):
    from swarm_runtime.sampling.vllm_server import VLLMServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        server = VLLMServer("python3", tmp_path, tmp_path / "log", port=port)
        with pytest.raises(ConfigError, match=rf"rollout.vllm.port={port} is in use on 127.0.0.1; give a free port"):
            server.start()
        assert server.proc is None


def test_an_unsupported_cpu_head_size_is_refused_before_the_server_starts(tmp_path):
    from swarm_runtime.sampling.vllm_server import check_cpu_shape

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 96, "num_attention_heads": 2}))
    with pytest.raises(ConfigError, match="head size 48 .* valid: 32, 64"):
        check_cpu_shape(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 128, "num_attention_heads": 4}))
    check_cpu_shape(tmp_path)  # the default tiny model: head size 32


def test_a_server_killed_mid_call_is_restarted_and_the_rows_answered_the_same(registry, tmp_path):
    cfg, learner = learner_for(registry)
    base = write_base(next(iter(learner.policies.values())).shared_base, tmp_path / "engine" / "base")
    server = start_ref(base, tmp_path / "ref.log")
    s = engine_sampler(openai_cfg(cfg, server.url), learner, tmp_path, server=server)
    rows = [Row(r.model, r.prompt, (9, i, 0, 1)) for i, r in enumerate(ROWS * 8)]
    try:
        want = s.act(rows)
        out = kill_mid_call(s, server, rows)
        assert "err" not in out, out.get("err")
        assert s.recoveries >= 1 and server.starts == 2
        assert [a.tokens for a in out["res"]] == [a.tokens for a in want]  # keyed seeds: the same answers
        assert served_names(server.url) == {"Logger@v0", "Miner@v0", "Smith@v0"}  # versions reloaded
    finally:
        s.close()
        server.stop()


def test_an_external_server_killed_mid_call_stops_with_the_url(registry, tmp_path):
    cfg, learner = learner_for(registry)
    base = write_base(next(iter(learner.policies.values())).shared_base, tmp_path / "base")
    server = start_ref(base, tmp_path / "ref.log")
    s = engine_sampler(openai_cfg(cfg, server.url, retries=1), learner, tmp_path)
    try:
        out = kill_mid_call(s, server, ROWS * 8)
        assert isinstance(out.get("err"), EngineError)
        assert f"rollout.url={server.url} does not answer after 1 retries" in str(out["err"])
    finally:
        s.close()
        server.stop()


def test_the_worker_checks_vllm_token_fields_in_one_line(ref):
    """Our worker: a token id out of the vocabulary is a 400 naming the field and the valid range, vLLM's fields
    do not mix with guided_choice, stop_token_ids end a completion after the token (kept), and return_token_ids
    gives the prompt's and the completion's ids."""
    from swarm_runtime.sampling.http import Client, HTTPStatusError

    cfg, learner, run_dir, server = ref
    if "worker" not in str(server.log):
        pytest.skip("the reference server does not validate (it is not ours)")
    policy = learner.policy("Logger")
    client, vocab, ids = Client(server.url), len(policy.tok), policy.encode_prompt(PROMPTS["Logger"])
    base = client.get("/v1/models")["data"][-1]["id"]
    for field, value, words in (
        ("allowed_token_ids", [vocab + 3], f"token id {vocab + 3} is not in [0, {vocab})"),
        ("logit_bias", {"x": -100}, "logit_bias: key 'x' is not a token id"),
        ("guided_choice", ["a"], "do not go with guided_choice"),
    ):
        body = {"model": base, "prompt": ids, "max_tokens": 2, "return_tokens_as_token_ids": True, field: value}
        with pytest.raises(HTTPStatusError) as err:
            client.post("/v1/completions", body)
        assert err.value.status == 400 and words in str(err.value.detail)
    free = client.post(
        "/v1/completions",
        {
            "model": base,
            "prompt": ids,
            "max_tokens": 6,
            "temperature": 0.0,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        },
    )["choices"][0]
    assert free["prompt_token_ids"] == ids and len(free["token_ids"]) >= 2
    assert free["logprobs"]["tokens"] == [f"token_id:{t}" for t in free["token_ids"]]
    stop = free["token_ids"][1]
    cut = client.post(
        "/v1/completions",
        {
            "model": base,
            "prompt": ids,
            "max_tokens": 6,
            "temperature": 0.0,
            "stop_token_ids": [stop],
            "return_token_ids": True,
        },
    )["choices"][0]
    assert cut["token_ids"] == free["token_ids"][: free["token_ids"].index(stop) + 1]
    assert cut["finish_reason"] == "stop"
