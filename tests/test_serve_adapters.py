"""Serving a ``model.adapter=lora`` run: one worker process holds the base and every role's
adapter, each agent's requests routed to its adapter by ``model`` name, rows of several adapters in
one batch; vLLM's runtime LoRA endpoints load a PEFT adapter folder onto the base (new weights under
a loaded name replace the old ones: adapter sync) and unload one. Real processes on 127.0.0.1."""

import asyncio
import json
import random
import shutil

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("peft")
httpx = pytest.importorskip("httpx")

from test_serve import RUN_ARGS, _free_port, _kill_pid, _start, _stop, _wait_health  # noqa: E402

PROMPT = "goal wooden_pickaxe . inventory : none"


def _adapter_run(registry, out):
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import resolve
    from swarm_runtime.runs.checkpoint import save_checkpoint
    from swarm_runtime.runs.context import RunContext

    pm, reg = registry
    cfg = resolve(RUN_ARGS + ["model.adapter=lora", f"run_dir={out}"], reg)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    _, policies = RunContext(cfg, pm, reg, out).build_swarm()
    save_checkpoint(out, "final", policies, {}, {"iteration": 0}, random.Random(0))
    return out


def _perturbed(src, dst, seed: int):
    """A copy of the adapter ``src`` with random LoRA weights (a freshly initialised one is the base)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    g = torch.Generator().manual_seed(seed)
    state = {
        k: torch.randn(v.shape, generator=g) * 0.5 for k, v in load_file(str(dst / "adapter_model.safetensors")).items()
    }
    save_file(state, str(dst / "adapter_model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def served(registry, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    run = _adapter_run(registry, tmp / "run")
    port = _free_port()
    log = tmp / "gateway.log"
    g = _start(
        [
            "swarm_runtime.cli.main",
            "serve",
            str(run),
            f"serve.port={port}",
            "serve.replicas=2",
            "serve.probe_interval_ms=200",
        ],
        log,
    )
    pids = []
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, [g], 240, logs=[log])
        swarm = httpx.get(f"{url}/v1/swarm").json()
        pids = [h["pid"] for h in swarm["adapter_hosts"] if h["pid"]]
        yield run, url, swarm, tmp
    finally:
        _stop(g)
        for pid in pids:
            _kill_pid(pid)


def test_one_worker_holds_every_role_adapter(served):
    run, url, swarm, _ = served
    hosts, agents = swarm["adapter_hosts"], swarm["agents"]
    assert len(hosts) == 1 and hosts[0]["status"] == "up" and hosts[0]["pid"]
    assert sorted(a["name"] for a in agents) == ["Logger", "Logger@2", "Miner", "Miner@2", "Smith", "Smith@2"]
    assert {a["url"] for a in agents} == {hosts[0]["url"]} and all(a["pid"] is None for a in agents)
    assert {a["name"]: a["model"] for a in agents}["Smith@2"] == "Smith"
    models = httpx.get(f"{hosts[0]['url']}/v1/models").json()["data"]
    assert {m["id"] for m in models} >= {"Logger", "Miner", "Smith"}
    assert all(m["parent"] for m in models if m["id"] in ("Logger", "Miner", "Smith"))
    body = httpx.post(f"{url}/v1/episodes", json={"noise": "4"}, timeout=120).json()
    assert body["status"] == "done" and body["decisions"] == 12, body
    assert all(set(t["bids"]) <= {a["name"] for a in agents} for t in body["turns"])
    assert sum(len(t["bids"]) for t in body["turns"]) >= 6 * 10  # the six agents bid through one worker
    nope = httpx.post(f"{hosts[0]['url']}/v1/completions", json={"model": "Wizard", "prompt": PROMPT})
    assert nope.status_code == 404 and "Logger" in nope.json()["error"]["message"]


def test_runtime_lora_endpoints_load_route_and_sync(served):
    run, url, swarm, tmp = served
    worker = swarm["adapter_hosts"][0]["url"]
    agents = run / "checkpoints/final/agents"
    new = _perturbed(agents / "Smith", tmp / "smith-v2", seed=1)

    def ask(model, seed=5):
        r = httpx.post(
            f"{worker}/v1/completions",
            timeout=60,
            json={"model": model, "prompt": PROMPT, "max_tokens": 8, "seed": seed, "logprobs": 1},
        )
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model  # the adapter asked for, as OpenAI and vLLM answer (not the base's id)
        return r.json()["choices"][0]

    before = ask("Smith")
    (base_id,) = [m["id"] for m in httpx.get(f"{worker}/v1/models").json()["data"] if not m.get("parent")]
    ask(base_id)  # the base, asked for by its own id, answers with it
    streamed = httpx.post(
        f"{worker}/v1/completions",
        timeout=60,
        json={"model": "Logger", "prompt": PROMPT, "max_tokens": 4, "stream": True},
    ).text
    heads = [json.loads(x[6:]) for x in streamed.split("\n\n") if x.startswith("data: {")]
    assert heads and {h["model"] for h in heads} == {"Logger"}
    r = httpx.post(f"{worker}/v1/load_lora_adapter", json={"lora_name": "Smith-v2", "lora_path": str(new)})
    assert r.status_code == 200 and "Smith-v2" in r.text, r.text
    assert "Smith-v2" in {m["id"] for m in httpx.get(f"{worker}/v1/models").json()["data"]}
    v2 = ask("Smith-v2")
    assert v2["logprobs"]["token_logprobs"] != before["logprobs"]["token_logprobs"]  # other weights, really loaded
    assert ask("Smith") == before  # the others are untouched

    # rows of several adapters in one batch: each row gets what its adapter alone gives
    async def together():
        async with httpx.AsyncClient(timeout=60) as c:
            rs = await asyncio.gather(
                *(
                    c.post(
                        f"{worker}/v1/completions",
                        json={"model": m, "prompt": PROMPT, "max_tokens": 8, "seed": s, "logprobs": 1},
                    )
                    for m, s in [("Smith", 5), ("Smith-v2", 5), ("Logger", 6), ("Smith-v2", 7)] * 2
                )
            )
            return [r.json()["choices"][0] for r in rs]

    stats0 = httpx.get(f"{worker}/health").json()["batching"]
    mixed = asyncio.run(together())
    stats1 = httpx.get(f"{worker}/health").json()["batching"]
    for got, want in zip(mixed, [before, v2, ask("Logger", 6), ask("Smith-v2", 7)] * 2):
        assert got["text"] == want["text"]  # the same keyed draw through the same adapter
        assert got["logprobs"]["token_logprobs"] == pytest.approx(want["logprobs"]["token_logprobs"], abs=1e-4)
    assert stats1["batches"] - stats0["batches"] < stats1["requests"] - stats0["requests"]  # some were batched
    # adapter sync: new weights under a loaded name replace the old ones
    r = httpx.post(f"{worker}/v1/load_lora_adapter", json={"lora_name": "Smith", "lora_path": str(new)})
    assert r.status_code == 200, r.text
    assert ask("Smith")["text"] == v2["text"]
    assert ask("Smith")["logprobs"]["token_logprobs"] == pytest.approx(v2["logprobs"]["token_logprobs"], abs=1e-4)
    # unload, and the errors
    assert httpx.post(f"{worker}/v1/unload_lora_adapter", json={"lora_name": "Smith-v2"}).status_code == 200
    gone = httpx.post(f"{worker}/v1/completions", json={"model": "Smith-v2", "prompt": PROMPT})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    missing = httpx.post(f"{worker}/v1/unload_lora_adapter", json={"lora_name": "Smith-v2"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "lora_name"
    bad = httpx.post(f"{worker}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp)})
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    bad = httpx.post(f"{worker}/v1/load_lora_adapter", json={"lora_name": "../x", "lora_path": str(new)})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_name"
    # an agent added at runtime serves its role's adapter on the same worker
    added = httpx.post(f"{url}/v1/swarm/agents", json={"role": "Miner"})
    assert added.status_code == 201 and added.json()["url"] == worker and added.json()["model"] == "Miner"
    assert added.json()["status"] == "up"


def test_the_trainers_adapter_sync_drives_our_worker(served, registry):
    """The learner-to-engine sync of ``rollout.engine=openai|vllm`` (swarm_runtime/sampling/sync.py) against our own
    worker's runtime LoRA endpoints: each update's adapter loads as ``Role@vN``, answers under that name, and the
    version before it is unloaded (``keep=1``: on-policy)."""
    import torch

    from swarm_runtime.config.load import load_saved
    from swarm_runtime.runs.context import RunContext
    from swarm_runtime.sampling.http import Client
    from swarm_runtime.sampling.local import LocalLearner
    from swarm_runtime.sampling.sync import AdapterSync

    run, _, swarm, tmp = served
    host = swarm["adapter_hosts"][0]["url"]
    pm, reg = registry
    cfg = load_saved(run / "config.yaml")
    _, policies = RunContext(cfg, pm, reg, None).build_swarm(run / "checkpoints" / "final" / "agents")
    # the learner's base is the folder the worker serves (as a run's engine base is): its adapters point there
    from swarm_runtime.models.adapters import fingerprint

    shared = policies["Smith"].shared_base
    shared.source = str(run / "checkpoints" / "final" / "base")
    shared.source_fingerprint = fingerprint(shared.source)
    learner = LocalLearner(policies)
    sync = AdapterSync(Client(host), tmp / "engine" / "adapters", keep=1)

    def models():
        return {m["id"] for m in httpx.get(f"{host}/v1/models").json()["data"]}

    def answer(name):
        body = {"model": name, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1}
        r = httpx.post(f"{host}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    for v in (1, 2):
        with torch.no_grad():
            for w in learner.policy("Smith").parameters():
                w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(v)) * 0.5)
        learner.bump(["Smith"], version=v)
        assert sync.sync(learner, ["Smith", "Miner"]) == (["Smith@v1", "Miner@v0"] if v == 1 else ["Smith@v2"])
    held = models()
    assert {"Smith@v2", "Miner@v0"} <= held and "Smith@v1" not in held, held
    assert answer("Smith@v2")["logprobs"] != answer("Miner@v0")["logprobs"]
    assert sorted(p.name for p in (tmp / "engine" / "adapters").iterdir()) == ["Miner@v0", "Smith@v2"]
