"""Different base models per role (``model.bases`` + ``model.role_base``; README, "A base per role"):
config and its errors, the swarm built with one base per distinct base (adapters and full copies), the memory
plan counting each base once, and real ``swarm run`` / ``eval`` / resume through the CLI with two tiny bases of
different shapes."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_RUN, run_context, swarm

from swarm_runtime.config.errors import ConfigError

#: Smith on a smaller base than model.* (hidden 128, 2 layers): hidden 64, 1 layer, 2 heads (head size 32).
SMALL = (
    "model.bases.small.hidden_size=64",
    "model.bases.small.intermediate_size=128",
    "model.bases.small.num_layers=1",
    "model.bases.small.num_heads=2",
    "model.bases.small.num_kv_heads=1",
    "model.role_base.Smith=small",
)
MC = ("domain=minecraft", "task=wooden_pickaxe")


def _hidden(policy) -> tuple[int, int]:
    c = policy.model.config if not hasattr(policy.model, "get_base_model") else policy.model.get_base_model().config
    return int(c.hidden_size), int(c.num_hidden_layers)


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ("model.role_base.Smithy=small", "model.bases.small.hidden_size=64"),
            "no role 'Smithy'; valid: Logger, Miner, Smith",
        ),
        (("model.role_base.Smith=big",), "no base 'big'; valid: default"),
        (("model.bases.small.hidden_size=64",), "model.bases.small is given to no role"),
        (
            ("model.bases.small.temperature=0.5", "model.role_base.Smith=small"),
            "model.bases.small.temperature is not a base setting; valid: path, hidden_size",
        ),
        (
            ("model.bases.small.hidden_size=-4", "model.role_base.Smith=small"),
            "model.bases.small.hidden_size=-4 is not valid",
        ),
        (("model.bases.default.hidden_size=64", "model.role_base.Smith=default"), "model.bases.default: a base name"),
        ((*SMALL, "rollout.urls.small=http://127.0.0.1:9"), "rollout.urls is read by rollout.engine=openai only"),
        (
            (*SMALL, "model.adapter=lora", "rollout.engine=openai", "rollout.url=http://127.0.0.1:9"),
            "give rollout.urls.small=http://host:port",
        ),
        (
            (
                *SMALL,
                "model.adapter=lora",
                "rollout.engine=openai",
                "rollout.url=http://127.0.0.1:9",
                "rollout.urls.big=http://127.0.0.1:9",
            ),
            "rollout.urls.big: no base 'big' in model.bases; valid: small",
        ),
        (
            (*SMALL, "model.adapter=lora", "rollout.engine=openai", "rollout.urls.small=http://127.0.0.1:9"),
            "rollout.engine=openai needs rollout.url (the server's base URL, e.g. http://127.0.0.1:8000): "
            "Logger, Miner sit on the default base (model.*)",
        ),
        ((*SMALL, "algo=monolithic"), "algo=monolithic trains one model"),
        (
            (*SMALL, "model.bases.small.num_heads=3"),
            "the base 'small' (model.* with model.bases.small.*): model.num_heads=3 is not valid: must divide",
        ),
    ],
)
def test_bad_bases_are_refused_naming_the_valid_ones(registry, args, says):
    with pytest.raises(ConfigError, match=None) as e:
        run_context(registry, *MC, *args)
    assert says in str(e.value), str(e.value)


def test_every_role_on_a_named_base_needs_no_rollout_url(registry, monkeypatch):
    """rollout.engine=openai: rollout.url serves the default base (model.*); with every role on a named base,
    rollout.urls alone is enough."""
    every = ("model.role_base.Logger=small", "model.role_base.Miner=small")
    ctx = run_context(
        registry, *MC, *SMALL, *every, "model.adapter=lora", "rollout.engine=openai", "rollout.urls.small=http://h:9"
    )
    assert ctx.cfg.rollout.get("url") is None and dict(ctx.cfg.rollout.urls) == {"small": "http://h:9"}
    with pytest.raises(ConfigError, match="rollout.engine=openai needs rollout.url"):
        run_context(registry, *MC, "model.adapter=lora", "rollout.engine=openai")
    # the run's one base is 'small': its sampler speaks to rollout.urls.small, in engine/small
    from types import SimpleNamespace

    from swarm_runtime.sampling import factory

    small = SimpleNamespace(shared_base=SimpleNamespace(name="small"))
    learner = SimpleNamespace(policies={r: small for r in ("Logger", "Miner", "Smith")})
    monkeypatch.setattr(factory, "engine_sampler", lambda cfg, learner, run_dir, **kw: kw)
    assert factory.make_sampler(ctx.cfg, learner, None) == {"base": "small", "port_offset": 0, "options": None}


def test_cli_refuses_a_bad_role_in_one_line(tmp_path):
    res = swarm("config", *MC, "model.bases.small.hidden_size=64", "model.role_base.Smit=small", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "model.role_base.Smit: no role 'Smit'; valid: Logger, Miner, Smith" in res.stderr + res.stdout


def test_defaults_name_no_base_and_roles_keep_model_settings(registry):
    from swarm_runtime.models import bases as B

    ctx = run_context(registry, *MC, *SMALL)
    m = ctx.cfg.model
    assert B.groups(m, ["Logger", "Miner", "Smith"]) == {"default": ["Logger", "Miner"], "small": ["Smith"]}
    assert B.role_cfg(m, "Logger") is m
    small = B.role_cfg(m, "Smith")
    assert (small.hidden_size, small.num_layers, small.temperature) == (64, 1, m.temperature)
    assert B.base_dir("default") == "base" and B.base_dir("small") == "base-small"
    assert not B.multi(run_context(registry, *MC).cfg.model)


def test_adapter_swarm_has_one_base_per_distinct_base(registry):
    from swarm_runtime.core.protocols import Row
    from swarm_runtime.sampling.local import LocalSampler

    _, policies = run_context(registry, *MC, *SMALL, "model.adapter=lora").build_swarm()
    lg, mi, sm = (policies[r] for r in ("Logger", "Miner", "Smith"))
    assert lg.shared_base is mi.shared_base is not sm.shared_base
    assert (lg.shared_base.name, sm.shared_base.name) == ("default", "small")
    assert _hidden(lg) == (128, 2) and _hidden(sm) == (64, 1)
    # a turn's rows of all three roles: one mixed batch per base, each row answered by its own base
    rows = [Row(r, f"you are {r} . inventory : none . action :", (3, i, 0, 1)) for i, r in enumerate(policies)]
    both = LocalSampler(policies).act(rows)
    alone = [LocalSampler({r.model: policies[r.model]}).act([r])[0] for r in rows]
    assert [a.tokens for a in both] == [a.tokens for a in alone]
    bids = LocalSampler(policies).bid(rows)
    assert [b.level for b in bids] == [LocalSampler({r.model: policies[r.model]}).bid([r])[0].level for r in rows]


def test_full_copies_build_each_role_from_its_base(registry):
    _, policies = run_context(registry, *MC, *SMALL).build_swarm()
    assert _hidden(policies["Logger"]) == (128, 2) and _hidden(policies["Smith"]) == (64, 1)


def test_memory_plan_counts_each_base_once(registry):
    from swarm_runtime.models.bases import role_cfg
    from swarm_runtime.models.memory_plan import arch_of, make_plan

    cfg = run_context(registry, *MC, *SMALL, "model.adapter=lora").cfg
    plan = dict((w, b) for w, b, _ in make_plan(cfg, 3, 3, vocab=100).rows)
    one = run_context(registry, *MC, "model.adapter=lora").cfg
    big = dict((w, b) for w, b, _ in make_plan(one, 3, 3, vocab=100).rows)
    n_default = arch_of(one, 100)[0].n_params()
    from omegaconf import OmegaConf

    n_small = arch_of(OmegaConf.merge(cfg, {"model": role_cfg(cfg.model, "Smith")}), 100)[0].n_params()
    assert n_small < n_default
    assert plan["weights"] == (n_default + n_small) * 4  # each base once, fp32
    assert big["weights"] == n_default * 4
    full = dict((w, b) for w, b, _ in make_plan(run_context(registry, *MC, *SMALL).cfg, 3, 3, vocab=100).rows)
    assert full["weights"] == (2 * n_default + n_small) * 4  # full copies: one per role, each of its base


@pytest.fixture(scope="module")
def two_base_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("bases")
    res = swarm(
        "run",
        *TINY_RUN,
        *SMALL,
        "model.adapter=lora",
        "skip_sft_eval=true",
        "tensorboard=false",
        "algo.sft.demo_episodes=1",
        "eval.episodes=1",
        f"run_dir={d / 'run'}",
        cwd=d,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return d, d / "run"


def test_cli_run_eval_resume_with_two_bases_and_adapters(two_base_run, warm_swarm):
    from transformers import AutoModelForCausalLM

    d, run = two_base_run
    ckpt = run / "checkpoints" / "iter-000002"
    assert AutoModelForCausalLM.from_pretrained(ckpt / "base").config.hidden_size == 128
    assert AutoModelForCausalLM.from_pretrained(ckpt / "base-small").config.num_hidden_layers == 1
    ptr = {r: json.loads((ckpt / "agents" / r / "swarm_base.json").read_text())["base"] for r in ("Logger", "Smith")}
    assert ptr == {"Logger": "../../base", "Smith": "../../base-small"}
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    keys = {k for r in rows if r.get("step") == 0 for k in r}
    assert {"sft/loss_base", "sft/loss_base-small", "sft/loss_Smith"} <= keys  # each built base fine-tuned first
    res = warm_swarm("eval", str(run), "eval.episodes=1", cwd=d)
    assert res.returncode == 0 and "iter-000002" in res.stdout, res.stderr[-2000:]
    res = warm_swarm("run", f"run_dir={run}", "resume=true", "algo.iterations=3", cwd=d)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((run / "checkpoints" / "iter-000003" / "state.json").read_text())["iteration"] == 3
    assert (run / "checkpoints" / "iter-000003" / "base-small" / "model.safetensors").exists()
    res = warm_swarm("export", str(run), "checkpoint=iter-000003", "merged=false", cwd=d)
    assert res.returncode == 0, res.stderr[-2000:]
    out = run / "export" / "iter-000003"
    assert json.loads((out / "Smith" / "swarm_base.json").read_text())["base"] == "../base-small"
    assert json.loads((out / "Miner" / "swarm_base.json").read_text())["base"] == "../base"
    assert AutoModelForCausalLM.from_pretrained(out / "base-small").config.hidden_size == 64


def test_adapters_refuse_a_checkpoint_of_other_role_bases(two_base_run, registry):
    d, run = two_base_run
    ctx = run_context(registry, *MC, "model.adapter=lora")  # every role on model.*: Smith's adapter is on base-small
    with pytest.raises(ConfigError, match="model.role_base|these roles share one base"):
        ctx.build_swarm(run / "checkpoints" / "iter-000002" / "agents")


def test_cli_run_and_eval_with_two_bases_and_full_copies(tmp_path, warm_swarm):
    from transformers import AutoModelForCausalLM

    res = warm_swarm(
        "run",
        *TINY_RUN,
        *SMALL,
        "skip_sft_eval=true",
        "tensorboard=false",
        "algo.sft.demo_episodes=1",
        "eval.episodes=1",
        "algo.iterations=1",
        f"run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    agents = tmp_path / "run" / "checkpoints" / "iter-000001" / "agents"
    assert AutoModelForCausalLM.from_pretrained(agents / "Smith").config.hidden_size == 64
    assert AutoModelForCausalLM.from_pretrained(agents / "Miner").config.hidden_size == 128
    res = warm_swarm("eval", str(tmp_path / "run"), "eval.episodes=1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]


def test_plan_prints_each_base(tmp_path):
    res = swarm("config", *MC, *SMALL, "model.adapter=lora", "--plan", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    weights = next(line for line in res.stdout.splitlines() if line.strip().startswith("weights"))
    assert "default: one base" in weights and "small: one base" in weights, weights


def test_old_one_base_layout_still_loads(registry, tmp_path):
    """A checkpoint written before model.bases (every pointer ../../base) loads as one base for all."""
    ctx = run_context(registry, *MC, "model.adapter=lora")
    _, policies = ctx.build_swarm()
    for role, p in policies.items():
        p.save(tmp_path / "agents" / role)
    assert json.loads((tmp_path / "agents" / "Smith" / "swarm_base.json").read_text())["base"] == "../../base"
    _, again = ctx.build_swarm(tmp_path / "agents")
    assert len({id(p.shared_base) for p in again.values()}) == 1
    ids = torch.tensor([[2, 5, 7]])
    with torch.no_grad():
        torch.testing.assert_close(
            again["Smith"]._forward(input_ids=ids).logits, policies["Smith"]._forward(input_ids=ids).logits
        )


def test_serve_starts_one_worker_per_base(two_base_run):
    """``swarm serve`` of a two-base adapter run: one worker per base, each holding its roles' adapters."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from test_serve import _free_port, _kill_pid, _start, _stop, _wait_health

    d, run = two_base_run
    port, log = _free_port(), d / "gateway.log"
    g = _start(["swarm_runtime.cli.main", "serve", str(run), f"serve.port={port}", "serve.probe_interval_ms=200"], log)
    pids = []
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, [g], 240, logs=[log])
        swarm_state = httpx.get(f"{url}/v1/swarm").json()
        hosts = swarm_state["adapter_hosts"]
        pids = [h["pid"] for h in hosts if h["pid"]]
        assert len(hosts) == 2 and all(h["status"] == "up" for h in hosts), hosts
        at = {a["name"]: a["url"] for a in swarm_state["agents"]}
        assert at["Logger"] == at["Miner"] != at["Smith"] and {at["Logger"], at["Smith"]} == {h["url"] for h in hosts}
        served = {
            h["url"]: {m["id"] for m in httpx.get(f"{h['url']}/v1/models").json()["data"] if m.get("parent")}
            for h in hosts
        }
        assert served[at["Smith"]] == {"Smith"} and served[at["Logger"]] == {"Logger", "Miner"}
        body = httpx.post(f"{url}/v1/episodes", json={"noise": "4"}, timeout=120).json()
        assert body["status"] == "done" and body["decisions"] > 0, body
    finally:
        _stop(g)
        for pid in pids:
            _kill_pid(pid)


def test_a_saved_base_url_is_an_endpoint_no_key_goes_to():
    from swarm_runtime.config.secrets import is_endpoint_key

    assert is_endpoint_key("rollout.urls.small") and is_endpoint_key("rollout.url")
    assert not is_endpoint_key("model.bases.small.path")


@pytest.mark.parametrize("adapter", ["lora", "none"])
def test_bases_with_different_tokenizers_each_tokenize_their_roles(registry, tmp_path, adapter):
    """A local checkpoint (byte-level BPE, its own vocabulary) for Smith beside the tiny word-level base: each
    role's prompts go through its own base's tokenizer, sampled and scored."""
    from conftest import make_local_checkpoint

    from swarm_runtime.core.protocols import Row
    from swarm_runtime.sampling.local import LocalSampler

    local = make_local_checkpoint(tmp_path / "local")
    ctx = run_context(
        registry, *MC, f"model.adapter={adapter}", f"model.bases.loc.path={local}", "model.role_base.Smith=loc"
    )
    _, policies = ctx.build_swarm()
    assert len(policies["Smith"].tok) != len(policies["Logger"].tok)
    rows = [Row(r, f"you are {r} . inventory : none . action :", (3, i, 0, 1)) for i, r in enumerate(policies)]
    acts = LocalSampler(policies).act(rows)
    for r, a in zip(rows, acts):
        p = policies[r.model]
        assert all(0 <= t < len(p.tok) for t in a.tokens) and a.text == p.decode(a.tokens)
        assert torch.isfinite(p.logprobs([r.prompt], [a.tokens])).all()  # the learner scores it the same way
    assert all(b.level in list(ctx.cfg.algo.bid_levels) for b in LocalSampler(policies).bid(rows))
