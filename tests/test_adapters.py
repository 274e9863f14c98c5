"""model.adapter=lora: one shared base, one PEFT LoRA adapter per role; isolation of each
role's training, PEFT round trips, the mixed-adapter batch against per-agent calls, the memory plan,
recipes, FLOPs with a frozen base, export, and every bad input."""

import json
import random
import re

import pytest
import torch
from conftest import ROOT, TINY_RUN, make_local_checkpoint, run_context, swarm

LORA = ("domain=minecraft", "task=wooden_pickaxe", "model.adapter=lora")
PROMPTS = {
    "Logger": "you are Logger . craft wooden_pickaxe . bid :",
    "Miner": "you are Miner . inventory : none . action :",
    "Smith": "you are Smith . craft stick . action :",
}


def _swarm(registry, *extra):
    ctx = run_context(registry, *LORA, *extra)
    agents, policies = ctx.build_swarm()
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA B starts at 0: make each role's adapter (and so its outputs) its own
        for p in policies.values():
            for w in p.parameters():
                w.add_(torch.randn_like(w) * 0.05)
    return ctx, agents, policies


def _snapshot(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_a_step_on_one_role_leaves_the_other_adapters_and_the_base_bit_identical(registry):
    from swarm_runtime.learn.action import action_update
    from swarm_runtime.learn.bid import BranchPair, bid_update  # noqa: F401  (the same accumulate_and_step)
    from swarm_runtime.learn.optim import make_optimizer

    ctx, agents, policies = _swarm(registry)
    shared = policies["Miner"].shared_base
    assert all(p.shared_base is shared for p in policies.values())  # one base in memory
    optimizers = {r: make_optimizer(p.parameters(), 1e-2, 0.0, 10) for r, p in policies.items()}
    ids = {r: {id(w) for g in opt.param_groups for w in g["params"]} for r, (opt, _) in optimizers.items()}
    assert not (ids["Logger"] & ids["Miner"]) and not (ids["Miner"] & ids["Smith"])  # each role its own optimizer
    base_ids = {id(w) for w in shared._base_params}
    assert not any(i & base_ids for i in ids.values())  # ... over its adapter only
    before = _snapshot(shared.model)
    miner = next(i for i, a in enumerate(agents) if a.role == "Miner")
    act = policies["Miner"].action_target("mine stone")
    samples = [(miner, PROMPTS["Miner"], act, 1.0), (miner, PROMPTS["Smith"], act, 0.0)]
    m = action_update(agents, samples, optimizers, reward_scale=1.0, minibatch=8, grad_clip=1.0)
    assert m["charts/grad_norm_Miner"] > 0
    after = _snapshot(shared.model)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(".lora_" in n and ".Miner." in n for n in changed)
    assert all(torch.equal(before[n], after[n]) for n in before if ".Miner." not in n)  # base + other adapters


def test_save_and_load_round_trip_through_peft_and_build_swarm(registry, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from swarm_runtime.models.transformers_backend import TransformersPolicy

    ctx, _, policies = _swarm(registry)
    resp = policies["Miner"].action_target("mine stone")
    want = {r: p.logprobs([PROMPTS[r]], [resp]) for r, p in policies.items()}
    assert not torch.allclose(want["Miner"], want["Smith"])
    for r, p in policies.items():
        p.save(tmp_path / "agents" / r)
    d = tmp_path / "agents" / "Miner"
    assert (d / "adapter_config.json").exists() and (d / "adapter_model.safetensors").exists()
    ptr = json.loads((d / "swarm_base.json").read_text())
    assert ptr["trained_base"] and (tmp_path / "base" / "config.json").exists()
    # PEFT's own loader on the saved base
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    peft_model = PeftModel.from_pretrained(base, d).eval()
    plain = TransformersPolicy(peft_model, policies["Miner"].tok, policies["Miner"].bid_levels)
    torch.testing.assert_close(plain.logprobs([PROMPTS["Miner"]], [resp]), want["Miner"], atol=1e-5, rtol=1e-5)
    # and the swarm's (resume, eval, experiments all go through build_swarm(init_dir))
    _, again = ctx.build_swarm(tmp_path / "agents")
    for r, p in again.items():
        torch.testing.assert_close(p.logprobs([PROMPTS[r]], [resp]), want[r], atol=1e-6, rtol=1e-6)


def test_mixed_adapter_batch_matches_per_agent_calls(registry, monkeypatch):
    import swarm_runtime.models.adapters as adapters
    from swarm_runtime.models.mixed_batch import GroupedLoRA, MixedBatch

    _, _, policies = _swarm(registry)
    roles = ["Logger", "Miner", "Smith", "Miner", "Logger", "Smith"]  # interleaved, as the episode loop sends them
    rows = [policies[r] for r in roles]
    prompts = [PROMPTS[r] if i < 3 else PROMPTS[roles[(i + 1) % 3]] for i, r in enumerate(roles)]
    resp = [
        rows[0].action_target(t)
        for t in ("chop tree", "mine stone", "craft stick", "craft planks", "mine stone", "chop tree")
    ]
    lead, batch = rows[0], MixedBatch(rows)
    order = batch.order
    assert [roles[i] for i in order] == ["Logger", "Logger", "Miner", "Miner", "Smith", "Smith"]
    grouped = [rows[i].adapter for i in order]
    entered = []
    real_enter = GroupedLoRA.__enter__
    monkeypatch.setattr(GroupedLoRA, "__enter__", lambda self: entered.append(len(self.spans)) or real_enter(self))
    with torch.no_grad():
        with lead.routed(grouped):
            mixed = lead.logprobs([prompts[i] for i in order], [resp[i] for i in order])
            probs = lead.bid_distribution([prompts[i] for i in order])
        assert entered == [3]  # the grouped path served it: one routing, three adapters' row spans
        per = torch.cat([rows[i].logprobs([prompts[i]], [resp[i]]) for i in order])
        per_probs = torch.cat([rows[i].bid_distribution([prompts[i]]) for i in order])
        torch.testing.assert_close(mixed, per, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(probs, per_probs, atol=1e-6, rtol=1e-5)
        monkeypatch.setattr(adapters, "MIXED_IMPL", "peft")  # against PEFT's own adapter_names= (any row order)
        with lead.routed(grouped):
            torch.testing.assert_close(
                lead.logprobs([prompts[i] for i in order], [resp[i] for i in order]), mixed, atol=1e-5, rtol=1e-5
            )
        with lead.routed([p.adapter for p in rows]):
            torch.testing.assert_close(
                lead.bid_distribution(prompts), per_probs[torch.tensor(order).argsort()], atol=1e-6, rtol=1e-5
            )
        monkeypatch.setattr(adapters, "MIXED_IMPL", "grouped")
    assert not torch.allclose(per[2], per[4])  # the rows really went through different adapters
    with lead.routed(grouped):  # with a gradient: the same scores, and each adapter gets its rows' gradient
        scored = lead.logprobs([prompts[i] for i in order], [resp[i] for i in order])
    torch.testing.assert_close(scored.detach(), mixed, atol=1e-5, rtol=1e-5)
    scored.sum().backward()
    assert entered[-1] == 3 and all(
        w.grad is not None and bool(w.grad.abs().sum() > 0) for p in set(rows) for w in p.parameters()
    )
    for p in set(rows):
        for w in p.parameters():
            w.grad = None
    assert lead._grouped is None and all(type(m).forward is m.forward.__func__ for m in lead.shared_base.lora_layers)
    for p in rows:
        p.temperature = 0.0
    entered.clear()
    greedy_mixed = batch.act(prompts)  # one routed call for all decode steps, results in the callers' order
    assert entered == [3]
    greedy_per = [p.act([q])[0] for p, q in zip(rows, prompts)]
    assert [r.tokens for r in greedy_mixed] == [r.tokens for r in greedy_per]
    for p in rows:
        p.temperature = 1.0
    keys = [(7, 0, i, 1) for i in range(len(rows))]  # keyed noise: a row's draw depends on its key, not on the batch
    assert [r.tokens for r in batch.act(prompts, keys=keys)] == [
        p.act([q], keys=[k])[0].tokens for p, q, k in zip(rows, prompts, keys)
    ]


def test_the_episode_loop_makes_one_bid_call_per_turn_for_all_roles(registry, monkeypatch):
    from swarm_runtime.core.loop import new_slots
    from swarm_runtime.models.transformers_backend import TransformersPolicy
    from swarm_runtime.sampling.play import play

    ctx, agents, policies = _swarm(registry)
    calls = []
    real = TransformersPolicy.bid_distribution

    def counted(self, prompts, **kw):
        calls.append((len(prompts), tuple(self.route or [self.adapter])))
        return real(self, prompts, **kw)

    monkeypatch.setattr(TransformersPolicy, "bid_distribution", counted)
    slots = new_slots(ctx.domain, ctx.task, [0, 1])
    play(slots, agents, ctx.coordinator(), ctx.domain, 3, random.Random(0))
    assert len(calls) == 3  # one batched bid forward per turn, not one per role
    assert all(set(route) == {"Logger", "Miner", "Smith"} for _, route in calls)


def test_flops_count_the_frozen_base_honestly(registry):
    from swarm_runtime.models.flops import FlopCounter, train_flops

    assert train_flops(10, 3) == 6.0 * 10 * 3
    assert train_flops(110, 3, frozen=100) == (4.0 * 100 + 6.0 * 10) * 3
    _, _, policies = _swarm(registry)
    p = policies["Smith"]
    shared = p.shared_base
    n_adapter = sum(w.numel() for w in p.parameters())
    assert p.n_frozen == shared.n_base and p.n_params == shared.n_base + n_adapter
    assert shared.n_base == sum(w.numel() for n, w in shared.model.named_parameters() if "lora_" not in n)
    p.flops = FlopCounter(category="update")
    resp = p.action_target("craft stick")
    tokens = len(p.encode_prompt(PROMPTS["Smith"])) + len(resp)
    p.logprobs([PROMPTS["Smith"]], [resp]).sum().backward()
    assert p.flops.by_category["update"] == (4.0 * shared.n_base + 6.0 * n_adapter) * tokens
    # the plan's parameter counts are the model's
    from swarm_runtime.models.memory_plan import Arch

    cfg = shared.model.get_base_model().config
    arch = Arch.from_hf(cfg.to_dict())
    assert arch.n_params() == shared.n_base
    assert arch.n_lora(8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]) == n_adapter


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "configs").glob("*.yaml") if "-cpu" not in p.name))
def test_every_gpu_recipe_fits_its_gpu_by_the_memory_plan(registry, recipe):
    from swarm_runtime.cli.recipes import expand_recipe
    from swarm_runtime.config.load import resolve
    from swarm_runtime.models.memory_plan import make_plan

    pm, reg = registry
    cfg = resolve(expand_recipe([f"recipe={ROOT / 'configs' / recipe}"]), reg)
    assert cfg.model.adapter == "lora" and cfg.hardware.name in ("h200", "b200", "rtx_pro_6000")
    plan = make_plan(cfg, 3, 3)
    assert plan.fits and plan.budget == float(cfg.hardware.memory_gb) * 1e9
    assert 4e9 < make_plan(cfg, 3, 3).rows[0][1] / 2 < 9e9  # a 4B-8B base in bf16, held once
    full = cfg.copy()
    full.model.adapter = "none"
    assert not make_plan(full, 3, 3).fits  # three full 4-8B copies with optimizer states do not fit


def test_recipes_ship_in_the_package_and_load_by_name_from_anywhere(tmp_path, monkeypatch):
    import fnmatch
    from importlib.resources import files

    from swarm_runtime.cli.recipes import expand_recipe, recipe_names

    shipped = sorted(f.name for f in files("swarm_runtime").joinpath("recipes").iterdir() if f.name.endswith(".yaml"))
    assert shipped and shipped == sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))  # one source of truth
    assert (ROOT / "configs").resolve() == (ROOT / "swarm_runtime" / "recipes").resolve()
    globs = json.loads(re.search(r"^swarm_runtime = (\[.*?\])", (ROOT / "pyproject.toml").read_text(), re.M).group(1))
    assert all(any(fnmatch.fnmatch(f"recipes/{n}", g) for g in globs) for n in shipped)  # package data: in the wheel
    by_path = expand_recipe([f"recipe={ROOT / 'configs' / shipped[0]}", "algo.lr=1e-6"])
    monkeypatch.chdir(tmp_path)  # no configs/ here: found in the installed package
    name = shipped[0][:-5]
    assert name in recipe_names()
    for given in (name, f"{name}.yaml", f"configs/{name}.yaml"):
        assert expand_recipe([f"recipe={given}", "algo.lr=1e-6"]) == by_path
    own = tmp_path / "mine.yaml"
    own.write_text("domain: vln_ce\nalgo.lr: 0.5\n")
    assert expand_recipe([f"recipe={own}"]) == ["domain=vln_ce", "algo.lr=0.5"]


def _main(capsys, *argv) -> tuple[int, str]:
    from swarm_runtime.cli.main import main

    rc = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err[-1] if err else ""


@pytest.mark.parametrize(
    "args,needle",
    [
        (("model.lora.rank=4",), "model.adapter=none"),
        (("model.adapter=lora", "model.lora.rank=0"), "model.lora.rank=0 is not valid"),
        (
            ("model.adapter=lora", "model.lora.lr_scale=0"),
            "model.lora.lr_scale=0.0 is not valid: must be a finite number > 0",
        ),
        (("model.lora.lr_scale=10",), "model.lora.lr_scale=10.0 has no effect with model.adapter=none"),
        (("model.adapter=qlora",), "valid: none, lora"),
        (
            ("model.adapter=lora", "model.lora.target_modules=[q_proj,qkv_proj]"),
            "'qkv_proj', which the base model lacks",
        ),
        (("hardware=h200",), "use hardware=cpu"),
        (("recipe=configs/nope.yaml",), "shipped recipes: minecraft-qwen3-4b-rtx_pro_6000, "),
        (
            ("model.adapter=lora", "algo=monolithic"),
            "valid: model.adapter=lora with algo=mpt, or algo=monolithic with model.adapter=none",
        ),
        (
            ("model.adapter=lora", "algo=rlcr"),
            "model.adapter=lora is not valid with algo=rlcr, which trains one full model",
        ),
        (("hardware.attention=flash",), "valid: sdpa, flash_attention_2, eager"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(capsys, tmp_path, args, needle):
    if args == ("hardware=h200",) and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    rc, line = _main(capsys, "run", *LORA[:2], *args, f"run_dir={tmp_path / 'r'}", "progress=false")
    assert rc == 2 and needle in line and line.startswith("swarm: error:"), line


def test_a_plan_that_does_not_fit_names_the_fix(capsys):
    arch = (
        "model.arch={hidden_size: 4096, intermediate_size: 12288, num_hidden_layers: 36, num_attention_heads: 32,"
        " num_key_value_heads: 8, head_dim: 128, vocab_size: 151936}"
    )
    rc, line = _main(capsys, "config", "model=local", "hardware=rtx_pro_6000", "model.adapter=none", arch, "--plan")
    assert rc == 2 and "model.adapter=lora" in line and "rtx_pro_6000" in line and "GiB" in line
    rc, line = _main(
        capsys, "config", "model=local", "hardware=rtx_pro_6000", arch, "--plan"
    )  # adapters: the profile's
    assert rc == 2 and "algo.envs_per_step (now 32)" in line  # default; the rollout's KV cache is what is left
    rc, _ = _main(capsys, "config", "model=local", "hardware=rtx_pro_6000", arch, "algo.envs_per_step=8", "--plan")
    assert rc == 0


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    res = swarm(
        "run",
        *TINY_RUN,
        "model.adapter=lora",
        "skip_sft_eval=true",
        "tensorboard=false",
        "eval.episodes=1",
        "algo.sft.demo_episodes=1",
        f"run_dir={d / 'run'}",
        cwd=d,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return d, d / "run"


def test_cli_run_eval_resume_and_export_with_adapters(lora_run, warm_swarm):
    # eval and resume through the warm CLI (a forked child), the export as a cold `swarm`
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    d, run = lora_run
    ckpt = run / "checkpoints" / "iter-000002"
    for role in ("Logger", "Miner", "Smith"):
        assert (ckpt / "agents" / role / "adapter_model.safetensors").exists()
        assert not (ckpt / "agents" / role / "model.safetensors").exists()  # no full copy per role
    base = AutoModelForCausalLM.from_pretrained(ckpt / "base")
    PeftModel.from_pretrained(base, ckpt / "agents" / "Smith")  # PEFT loads the checkpoint as written
    res = warm_swarm("eval", str(run), "eval.episodes=1", cwd=d)
    assert res.returncode == 0 and "iter-000002" in res.stdout, res.stderr[-2000:]
    res = warm_swarm("run", "model.adapter=lora", f"run_dir={run}", "resume=true", "algo.iterations=3", cwd=d)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((run / "checkpoints" / "iter-000003" / "state.json").read_text())["iteration"] == 3
    res = swarm("export", str(run), "checkpoint=iter-000003", "merged=true", cwd=d)
    assert res.returncode == 0, res.stderr[-2000:]
    merged = AutoModelForCausalLM.from_pretrained(run / "export" / "iter-000003" / "Miner")
    src = run / "checkpoints" / "iter-000003"
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(src / "base"), src / "agents" / "Miner")
    ids = torch.tensor([[2, 5, 7, 9, 11]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, peft_model.eval()(ids).logits, atol=1e-4, rtol=1e-4)


def test_an_adapter_checkpoint_on_another_base_is_refused(lora_run, tmp_path, capsys):
    _, run = lora_run
    rc, line = _main(capsys, "eval", str(run), "model.hidden_size=64")
    assert rc == 2 and "hidden_size=128" in line and "64" in line, line
    local = make_local_checkpoint(tmp_path / "other")
    rc, line = _main(capsys, "eval", str(run), f"model.path={local}")
    assert rc == 2 and "another base" in line, line
    assert (run / "eval.json").exists() or (run / "config.yaml").exists()  # nothing written is lost


def test_the_gpu_script_exits_cleanly_without_cuda():
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: test_gpu_adapters_script runs the script")
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_adapters.py")], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and "no CUDA device" in res.stdout and "skipped" in res.stdout
    # its steps (SFT of every adapter, a mixed-batch rollout turn, a REINFORCE step per agent) on the CPU, tiny shape
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_adapters.py"),
            "--cpu-tiny",
            "--agents",
            "3",
            "--envs",
            "2",
            "--prompt",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "3 adapter agents" in out and "mixed bid batch of 6 rows" in out and "REINFORCE step per agent" in out
    assert "peak RSS of the process" in out and "the memory plan's estimate" in out


@pytest.mark.gpu
def test_gpu_adapters_script():
    import subprocess
    import sys

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_adapters.py"),
            "--agents",
            "3",
            "--envs",
            "4",
            "--prompt",
            "128",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "peak CUDA memory" in res.stdout and "memory plan's estimate" in res.stdout


def test_mixed_adapter_batch_generates_bids_as_per_agent_calls(registry):
    """``model.bid_mode=generate``: a mixed batch's sampled bid texts are parsed like each policy's own
    (greedy, so both ways generate the same tokens); every bid is a configured level or unparsed 0."""
    from swarm_runtime.models.mixed_batch import MixedBatch

    _, _, policies = _swarm(registry, "model.bid_mode=generate", "model.temperature=0")
    roles = ["Logger", "Miner", "Smith", "Smith"]
    rows = [policies[r] for r in roles]
    prompts = [PROMPTS[r] for r in roles]
    mixed = MixedBatch(rows).bid(prompts)
    per = [p.bid([q])[0] for p, q in zip(rows, prompts)]
    assert [(b.text, b.level, b.parsed) for b in mixed] == [(b.text, b.level, b.parsed) for b in per]
    levels = set(rows[0].bid_levels)
    assert all(b.level in levels and (b.parsed or b.level == 0.0) for b in mixed)


def test_grouped_mixed_batch_on_a_bf16_base_adds_like_the_training_path(registry, monkeypatch):
    """fp32 adapters on a bf16 base: the grouped batch adds each LoRA term in fp32 and rounds once,
    as PEFT's single-adapter forward (the one training scores with) does: bit for bit on the same rows.
    A mixed batch against row-by-row calls agrees within bf16 rounding only: a CPU may run a bf16
    product of 4 rows and one of 1 row through different kernels (it does on some machines)."""
    import swarm_runtime.models.adapters as adapters
    from swarm_runtime.models.mixed_batch import MixedBatch

    _, _, policies = _swarm(registry, "hardware.dtype=bfloat16")
    lead = policies["Logger"]
    assert lead.shared_base.lora_layers[0].base_layer.weight.dtype == torch.bfloat16
    assert lead.shared_base.lora_layers[0].lora_A["Logger"].weight.dtype == torch.float32  # PEFT's fp32 adapters
    rows = [policies[r] for r in ("Logger", "Miner", "Smith", "Miner")]
    prompts = [PROMPTS[r] for r in ("Logger", "Miner", "Smith", "Smith")]
    order = MixedBatch(rows).order
    same = [PROMPTS["Miner"], PROMPTS["Smith"]]  # one adapter's rows, the same batch both ways
    with torch.no_grad():
        with lead.routed([rows[i].adapter for i in order]):
            grouped = lead.bid_distribution([prompts[i] for i in order])
        with lead.routed(["Miner", "Miner"]):
            grouped_same = lead.bid_distribution(same)
        monkeypatch.setattr(adapters, "MIXED_IMPL", "peft")  # PEFT's own single-adapter forward
        peft_same = policies["Miner"].bid_distribution(same)
        single = torch.cat([rows[i].bid_distribution([prompts[i]]) for i in order])
    assert torch.equal(grouped_same, peft_same)
    assert torch.allclose(grouped, single, atol=5e-3), (grouped - single).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_adam_state_steps_exactly_as_the_lazy_one(dtype):
    from swarm_runtime.learn.optim import clip_and_step, make_optimizer

    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(dtype)
    b = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(dtype)
    b.load_state_dict(a.state_dict())
    lazy, eager = (
        make_optimizer(a.parameters(), 1e-2, 0.01, 5),
        make_optimizer(b.parameters(), 1e-2, 0.01, 5, eager_state=True),
    )
    assert not lazy[0].state and len(eager[0].state) == 4  # eager: moments before any step
    for step in range(3):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step)).to(dtype)
        for m, (opt, sched) in ((a, lazy), (b, eager)):
            m(x).float().square().mean().backward()
            clip_and_step(list(m.parameters()), opt, sched, 1.0)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    sa, sb = lazy[0].state_dict()["state"], eager[0].state_dict()["state"]
    assert sa.keys() == sb.keys() and all(
        torch.equal(sa[k][n], sb[k][n]) and sa[k][n].dtype == sb[k][n].dtype for k in sa for n in sa[k]
    )


def test_lr_scale_multiplies_the_rates_the_adapters_train_at(registry):
    """``model.lora.lr_scale``: each role's action and bid optimizers (and its SFT) run at the algorithm's
    rates times the scale with adapters; full copies ignore it (and refuse it, above)."""
    from types import SimpleNamespace

    from swarm_runtime.learn.mpt import MPTTrainer
    from swarm_runtime.models.adapters import adapter_lr_scale

    def rates(*extra):
        cfg = run_context(registry, *extra).cfg
        opts = MPTTrainer._optimizers(SimpleNamespace(cfg=cfg), {"Logger": torch.nn.Linear(2, 2)})
        return cfg, {k: opts[k]["Logger"][1].base_lrs[0] for k in ("action", "bid")}

    cfg, full = rates(*LORA[:2])
    assert adapter_lr_scale(cfg) == 1.0 and full == {"action": cfg.algo.lr, "bid": cfg.algo.bid_lr}
    cfg, lora = rates(*LORA, "model.lora.lr_scale=10")
    assert adapter_lr_scale(cfg) == 10.0
    assert lora == pytest.approx({"action": 10 * cfg.algo.lr, "bid": 10 * cfg.algo.bid_lr})
