"""Sharded learners in the memory plan and placement groups per agent group (docs/reference/cluster.md,
"Placement and sizing"): the sharding term with hand-computed numbers for a Qwen3-8B shape, the placement spec
(colocated and split), the plan and placement printed by the real ``swarm config --plan``, ``swarm run`` refusing a
sharded engine before anything is written, and on a local Ray (num_cpus=2): a placement reserved with env workers
in its bundles, a learner outside its bundle caught, and one that cannot be satisfied refused with the bundles asked
and what Ray has (with sharded learners too); on a local Ray declaring the CPUs asked, a real fsdp run's ranks in
their bundles, colocated and split."""

from __future__ import annotations

import os
import re
import time

import pytest
from omegaconf import OmegaConf

from tests.conftest import TINY_RUN, held_ray, run_rows, swarm

#: TINY_RUN's two updates with each learner two FSDP ranks on a local Ray and one env worker
SHARDED = ["cluster.kind=ray", "cluster.env_workers=1", "cluster.learners=ray", "train.engine=fsdp", "train.shards=2"]
#: Qwen3-8B (its config.json; the recipe minecraft-qwen3-8b-h200's model.arch).
QWEN3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
#: By hand: a block is q 4096x4096 + k, v 4096x1024 + o 4096x4096 + gate, up, down 4096x12288 + 2 norms of 4096
#: = 2*16,777,216 + 2*4,194,304 + 3*50,331,648 + 8,192 = 192,946,176; the root is the embeddings and the untied
#: head, 2 * 151,936 * 4,096, + the final norm 4,096 = 1,244,663,808; N = 36 * 192,946,176 + 1,244,663,808.
BLOCK, ROOT = 192_946_176, 1_244_663_808
N = 36 * BLOCK + ROOT  # 8,190,726,144


def _arch():
    from swarm_runtime.models.memory_plan import Arch

    return Arch.from_hf(QWEN3_8B)


def test_qwen3_8b_units_by_hand():
    a = _arch()
    assert (a.block_params(), a.root_params(), a.n_params()) == (BLOCK, ROOT, N)
    assert a.unit_params() == ROOT  # the root (embeddings + untied head) is the largest unit


def test_learner_rows_divide_by_shards_and_add_the_gathered_unit():
    from swarm_runtime.models.memory_plan import learner_rows

    rows = {w: b for w, b, _ in learner_rows(_arch(), "bfloat16", 1, 0, 4, reference=False)}
    # bf16 (2 bytes) over 4 shards: weights and gradients N * 2 / 4 = 4,095,363,072 each; AdamW: 2 optimizers x 2
    # moments x 4 bytes + 4 bytes of fp32 masters = 20 bytes per parameter, / 4 = 40,953,630,720; the gathered unit:
    # the root's parameters and gradient whole, 2 * 1,244,663,808 * 2 = 4,978,655,232
    assert rows == {
        "weights": 4_095_363_072,
        "gradients": 4_095_363_072,
        "optimizer states": 40_953_630_720,
        "gathered unit": 4_978_655_232,
    }
    one = {w: b for w, b, _ in learner_rows(_arch(), "bfloat16", 1, 0, 1, reference=True)}
    # unsharded: nothing gathered; the reference copy (kl_coef > 0) is a whole bf16 copy, 16,381,452,288
    assert one == {
        "weights": 16_381_452_288,
        "gradients": 16_381_452_288,
        "optimizer states": 163_814_522_880,
        "reference models": 16_381_452_288,
    }


def test_adapter_group_and_sampler_rows():
    from swarm_runtime.models.memory_plan import learner_rows, sampler_rows

    a = _arch()
    A = a.n_lora(16, ["q_proj", "v_proj"])  # 36 * 16 * ((4096 + 4096) + (4096 + 1024)) = 7,667,712
    assert A == 7_667_712
    rows = {w: b for w, b, _ in learner_rows(a, "bfloat16", 3, A, 2, reference=False)}
    # one base over 2 shards (8,190,726,144); 3 adapters fp32 / 2 = 46,006,272; one adapter's gradient / 2 =
    # 15,335,424; 3 roles x 16 bytes / 2 = 184,025,088
    assert rows["weights"] == 8_190_726_144 and rows["adapters"] == 46_006_272
    assert rows["gradients"] == 15_335_424 and rows["optimizer states"] == 184_025_088
    kv = ("KV cache", 1.0, "")
    s = {w: b for w, b, _ in sampler_rows(a, "bfloat16", 3, A, kv)}
    assert s == {"sampler weights": 16_381_452_288 + 3 * A * 4, "KV cache": 1.0}  # the base whole + adapters
    assert {w for w, _, _ in sampler_rows(a, "bfloat16", 1, 0, kv, own_weights=False)} == {"KV cache"}


def _cfg(*args):
    """The resolved config; the ``cluster.*`` and ``train.*`` keys set after (``cluster.kind=ray`` is checked for Ray
    installed, ``train.engine=fsdp`` for ``cluster.learners=ray``, which these pure functions do not need)."""
    from swarm_runtime.config.load import _parse, light_registry, resolve

    cfg = resolve([a for a in args if not a.startswith(("cluster.", "train."))], light_registry())
    for a in args:
        if a.startswith(("cluster.", "train.")):
            k, _, v = a.partition("=")
            OmegaConf.update(cfg, k, _parse(v), merge=False)
    return cfg


H200_8B = [
    "domain=minecraft",
    "task=iron_pickaxe",
    "model=local",
    "hardware=h200",
    "model.adapter=none",
    "model.arch=" + str(QWEN3_8B).replace("'", "").replace("False", "false"),
    "algo.envs_per_step=16",
    "algo.branches_per_episode=2",
]


def test_the_plan_is_unchanged_at_the_defaults():
    from swarm_runtime.models.memory_plan import MemoryPlan, make_plan, placed

    cfg = _cfg(*H200_8B, "model.adapter=lora")
    assert not placed(cfg)
    assert type(make_plan(cfg, 3, 3)) is MemoryPlan


def test_placed_plan_per_device_rows_split_and_colocated():
    from swarm_runtime.models.memory_plan import GiB, PlacedPlan, make_plan

    names = ["Logger", "Miner", "Smith"]
    cfg = _cfg(*H200_8B, "train.engine=fsdp", "train.shards=4", "cluster.kind=ray", "cluster.placement=split")
    plan = make_plan(cfg, 3, 3, roles=names)
    assert isinstance(plan, PlacedPlan)
    labels = {label: count for label, count, _ in plan.devices}
    assert labels == {
        "group Logger (and Miner, Smith, alike): learner shard (1 of 4)": 12,
        "group Logger (and Miner, Smith, alike): sampler": 3,
    }
    learner = {w: b for w, b, _ in plan.devices[0][2].rows}
    assert learner["weights"] == N * 2 / 4 and learner["optimizer states"] == N * 20 / 4
    assert learner["gathered unit"] == 4 * ROOT
    sampler = {w: b for w, b, _ in plan.devices[1][2].rows}
    # the sampler holds one full bf16 copy, and the KV cache of its one agent: 16 envs x 2 branches x 1 agent x
    # (2048 prompt + 4 action tokens: model=local, the task's max_action_tokens) x 2 (k, v) x 36 layers x 8 heads
    # x 128 x 2 bytes = 9,682,550,784
    assert sampler["sampler weights"] == N * 2 and sampler["KV cache"] == 9_682_550_784
    assert plan.fits and plan.total < 141e9
    assert set(plan.per_group) == set(names) and plan.per_group["Miner"]["learner"] == plan.devices[0][2].total
    colo = make_plan(
        _cfg(*H200_8B, "train.engine=fsdp", "train.shards=4", "cluster.kind=ray", "cluster.placement=colocated"),
        3,
        3,
        roles=names,
    )
    first, rest = colo.devices
    assert first[1] == 3 and rest[1] == 9 and "+ sampler" in first[0]
    assert abs(first[2].total - (rest[2].total + (N * 2 + 9_682_550_784) * 1.1)) < 1e-3 * GiB
    one = make_plan(_cfg(*H200_8B, "train.engine=fsdp", "train.shards=1"), 3, 3, roles=names)
    assert not one.fits and one.total > 141e9  # a whole 8B learner with AdamW: ~196 GB on one device
    assert any("train.shards" in f for f in one.fixes)


def test_make_placement_colocated_split_and_adapters():
    from swarm_runtime.cluster.placement import make_placement
    from swarm_runtime.models.memory_plan import make_plan

    names = ["Logger", "Miner", "Smith"]
    args = [*H200_8B, "train.engine=fsdp", "train.shards=2", "cluster.kind=ray", "cluster.env_workers=3"]
    cfg = _cfg(*args, "cluster.placement=colocated")
    spec = make_placement(cfg, names, make_plan(cfg, 3, 3, roles=names))
    assert [g.name for g in spec.groups] == [*names, "envs"]
    g = spec.group("Smith")
    assert g.bundles == ({"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}) and g.actors == {
        "learner": (0, 1),
        "sampler": (0,),
    }
    assert g.share(0) == 2 and g.share(1) == 1 and g.gib[0] > g.gib[1] > 0
    assert spec.group("envs").bundles == ({"CPU": 1},) * 3 and spec.group("envs").strategy == "SPREAD"
    assert spec.totals() == {"CPU": 9, "GPU": 6}
    split = make_placement(_cfg(*args, "cluster.placement=split", "cluster.cpus_per_bundle=4"), names)
    g = split.group("Miner")
    assert len(g.bundles) == 3 and g.actors == {"learner": (0, 1), "sampler": (2,)} and g.bundles[2]["CPU"] == 4
    assert split.totals() == {"CPU": 4 * 9 + 4 * 3, "GPU": 9}
    lora = make_placement(_cfg(*args, "model.adapter=lora", "cluster.placement=split"), names)
    assert [(g.name, g.roles) for g in lora.groups] == [("default", tuple(names)), ("envs", ())]
    assert make_placement(_cfg(*H200_8B), names) is None  # cluster.placement=none
    assert "Smith: 2 x {CPU: 1, GPU: 1}" in spec.asked() and "envs: 3 x {CPU: 1}" in spec.asked()


def test_sampler_replicas_get_a_bundle_each_with_their_servers_gpus():
    """``cluster.sampler_replicas=N`` in a placement: N sampler slots per group (``split``: N bundles after the
    shards'; ``colocated``: replica j in shard j's bundle, the rest in bundles of their own); on a CUDA profile a
    sampler's own bundle holds its vLLM server's GPUs (tensor x pipeline x data parallel sizes of
    ``rollout.vllm.args``), which a colocated placement refuses beyond one; the engine actor's options ask them
    unless its bundle holds them."""
    pytest.importorskip("ray")
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from swarm_runtime.cluster.placement import engine_actor_options, make_placement, sampler_gpus
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.validation import server_gpus

    names = ["Logger", "Miner", "Smith"]
    base = [*H200_8B, "model.adapter=lora", "rollout.engine=vllm", "train.engine=fsdp", "train.shards=2"]
    ray = ["cluster.kind=ray", "cluster.env_workers=1", "cluster.samplers=ray", "cluster.sampler_replicas=3"]
    split = make_placement(_cfg(*base, *ray, "cluster.placement=split"), names).group("default")
    assert split.bundles == ({"CPU": 1, "GPU": 1},) * 5 and split.actors == {"learner": (0, 1), "sampler": (2, 3, 4)}
    assert split.share(2) == split.share(4) == 1 and len(split.gib) == 5
    co = make_placement(_cfg(*base, *ray, "cluster.placement=colocated"), names)
    g = co.group("default")
    assert len(g.bundles) == 3 and g.actors["sampler"] == (0, 1, 2) and [g.share(i) for i in range(3)] == [2, 2, 1]
    assert "bundle 2: {CPU: 1, GPU: 1}     sampler 2" in co.format() and "learner 1, sampler 1" in co.format()
    tp2 = _cfg(*base, *ray, "cluster.placement=split", "rollout.vllm.args=[--tensor-parallel-size=2]")
    assert sampler_gpus(tp2) == 2
    assert make_placement(tp2, names).group("default").bundles[2:] == ({"CPU": 1, "GPU": 2},) * 3
    with pytest.raises(ConfigError, match="colocated with a vLLM server of 2 GPUs.*valid: cluster.placement=split"):
        make_placement(_cfg(*base, *ray, "cluster.placement=colocated", "rollout.vllm.args=[-tp=2]"), names)
    assert server_gpus([]) == 1 and server_gpus(["--tensor-parallel-size=4", "-pp", "2"]) == 8
    assert server_gpus(["--data-parallel-size", "2", "--max-model-len", "64"]) == 2
    for bad in (["-tp", "two"], ["--tensor-parallel-size=0"], ["-tp"]):
        with pytest.raises(ConfigError, match="is not valid; valid: a positive integer"):
            server_gpus(bad)
    on_cpu = _cfg(*[a for a in base if not a.startswith("hardware=")], "rollout.vllm.args=[-tp=2]")
    assert sampler_gpus(on_cpu) == 0  # no CUDA profile: no GPU asked
    assert engine_actor_options(tp2, {"resources": {"a": 1.0}}) == {"resources": {"a": 1.0}, "num_gpus": 2}
    assert engine_actor_options(on_cpu, None) == {}
    in_bundle = {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=None), "num_gpus": 2}
    assert engine_actor_options(tp2, in_bundle) == in_bundle  # the bundle holds them: not asked twice


def test_swarm_config_plan_shows_a_bundle_per_sampler_replica(tmp_path):
    """The real ``swarm config --plan``: each replica's bundle with its server's GPUs; a colocated server of 2 GPUs
    refused in one line (exit 2)."""
    pytest.importorskip("ray")
    args = ["config", *H200_8B, "model.adapter=lora", "rollout.engine=vllm", "cluster.kind=ray", "cluster.samplers=ray"]
    args += ["cluster.sampler_replicas=2", "rollout.vllm.args=[--tensor-parallel-size=2]"]
    r = swarm(*args, "cluster.placement=split", "--plan", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^    bundle 1: \{CPU: 1, GPU: 2\} +sampler 0 ", r.stdout, re.M), r.stdout
    assert re.search(r"^    bundle 2: \{CPU: 1, GPU: 2\} +sampler 1 ", r.stdout, re.M), r.stdout
    r = swarm(*args, "cluster.placement=colocated", "--plan", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "colocated with a vLLM server of 2 GPUs" in r.stderr and "valid: cluster.placement=split" in r.stderr


@pytest.mark.parametrize(
    "arg, valid",
    [
        ("train.engine=megatron", "one of local, fsdp, deepspeed"),
        ("train.shards=0", "an integer in [1, 1024]"),
        ("train.shards=4", "valid: train.engine=fsdp or deepspeed, or train.shards=1"),
        ("cluster.placement=spread", "one of none, colocated, split"),
        ("cluster.placement=split", "needs cluster.kind=ray"),
        ("cluster.placement_wait_s=0", "> 0"),
    ],
)
def test_bad_keys_are_one_line(arg, valid, tmp_path):
    r = swarm("config", "domain=minecraft", arg, cwd=tmp_path)
    assert r.returncode == 2 and valid in r.stderr and arg.partition("=")[2] in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_swarm_config_plan_prints_devices_and_placement(tmp_path):
    pytest.importorskip("ray")  # cluster.kind=ray is checked for Ray
    args = ["config", *H200_8B, "cluster.kind=ray", "cluster.learners=ray", "train.engine=fsdp", "train.shards=4"]
    r = swarm(*args, "cluster.placement=split", "--plan", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "memory plan per device (h200, 3 agents, 3 agent groups; train.engine=fsdp, train.shards=4" in out
    assert "learner shard (1 of 4) (x12)" in out and "sampler (x3)" in out and "gathered unit" in out
    assert "placement (split): 4 placement groups, {CPU: 17, GPU: 15} in all" in out
    assert "bundle 4: {CPU: 1, GPU: 1}     sampler" in out and "learner 3" in out
    r = swarm(*args[:-1], "train.shards=1", "--plan", cwd=tmp_path)  # a whole 8B learner: over 141 GB
    assert r.returncode == 2 and "does not fit" in r.stderr and "train.shards" in r.stderr, r.stderr
    assert "learner (x3)" in r.stdout


def test_swarm_config_plan_sizes_each_ranks_bundle(tmp_path):
    """fsdp with a colocated placement: each rank's bundle is shown with its device's planned size (rank 0 with the
    sampler: the busiest device; rank 1: a learner shard's), the same numbers as the per-device plan above it; the
    env workers' bundles hold no model (no size); a device over the hardware's memory fails (exit 2)."""
    pytest.importorskip("ray")
    args = [
        "config",
        *H200_8B,
        "train.engine=fsdp",
        "train.shards=2",
        "cluster.kind=ray",
        "cluster.learners=ray",
        "cluster.placement=colocated",
    ]
    r = swarm(*args, "--plan", cwd=tmp_path)
    assert r.returncode == 2 and "does not fit: ~138.5 GiB on the busiest device" in r.stderr, r.stderr
    totals = re.findall(r"^    total +([\d.]+) GiB", r.stdout, re.M)
    assert len(totals) == 2  # learner shard + sampler, learner shard
    bundles = re.findall(
        r"^    bundle (\d): \{CPU: 1, GPU: 1\} +(learner \d(?:, sampler)?) +~([\d.]+) GiB planned$", r.stdout, re.M
    )
    assert (
        bundles
        == [("0", "learner 0, sampler", f"{float(totals[0]):.1f}"), ("1", "learner 1", f"{float(totals[1]):.1f}")] * 3
    )
    assert re.search(r"^    bundle 1: \{CPU: 1\} +env 1$", r.stdout, re.M), r.stdout


# ---------------------------------------------------------------- on a local Ray
@pytest.fixture(scope="module")
def local_ray():
    pytest.importorskip("ray")
    import ray

    from swarm_runtime.cluster.ray_helpers import connect

    # RAY_ADDRESS=local: a Ray of our own, even where another process on this machine ran `ray start` (ray.init
    # would join that one, and refuse num_cpus)
    was = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = "local"
    try:
        started = connect(None, num_cpus=2)
    finally:
        os.environ.pop("RAY_ADDRESS") if was is None else os.environ.__setitem__("RAY_ADDRESS", was)
    yield ray
    if started:
        ray.shutdown()


def _cpus_back(ray, timeout: float = 15.0) -> bool:
    """Whether the local Ray's 2 CPUs are all free again within ``timeout`` (removal is asynchronous)."""
    end = time.monotonic() + timeout
    while ray.available_resources().get("CPU") != 2:
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


def _cpu_spec(*args):
    from swarm_runtime.cluster.placement import make_placement

    cfg = _cfg("domain=minecraft", "task=wooden_pickaxe", "cluster.kind=ray", *args)
    return make_placement(cfg, ["Logger", "Miner", "Smith"])


@pytest.mark.ray
def test_an_unsatisfiable_placement_names_asked_and_available(local_ray):
    from swarm_runtime.cluster.placement import reserve
    from swarm_runtime.config.errors import ConfigError

    spec = _cpu_spec("cluster.placement=split", "cluster.env_workers=1")  # 3 x 2 + 1 = 7 CPUs on a Ray of 2
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        reserve(spec, 2.0)
    msg = str(e.value)
    assert time.monotonic() - t0 < 20
    assert "Logger: 2 x {CPU: 1}" in msg and "envs: 1 x {CPU: 1}" in msg and "(in all {CPU: 7})" in msg
    assert "available of {CPU: 2}" in msg and "\n" not in msg
    assert spec.pgs == {}
    assert _cpus_back(local_ray)  # removed again (Ray frees them shortly after): the next reservation has them


@pytest.mark.ray
def test_a_learner_outside_its_bundle_is_caught(local_ray):
    """check_learners_placed against what Ray says: a learner's actor in its slot passes (its bundle holds its
    share, half of bundle 0 beside the sampler's); a rank reporting no placement group, or a bundle not holding the
    rank's share (no actor in it), is a RuntimeError naming the learner and the rank."""
    from swarm_runtime.cluster.placement import actor_options, check_learners_placed, release, reserve

    spec = _cpu_spec("cluster.placement=colocated", "cluster.env_workers=1", "model.adapter=lora")
    roles = {"base-default": ["Logger", "Miner", "Smith"]}
    reserve(spec, 20)
    try:

        @local_ray.remote
        class Rank:
            def placement_group(self):
                return local_ray.get_runtime_context().get_placement_group_id()

        with pytest.raises(RuntimeError, match="'base-default' rank 0: its bundle 0 .* holds {CPU: 0}, less than"):
            check_learners_placed(spec, {"base-default": [spec.pgs["default"].id.hex()]}, roles, wait_s=1)
        rank = Rank.options(**actor_options(spec, "default", "learner", 0)).remote()
        pg = local_ray.get(rank.placement_group.remote())
        assert pg == spec.pgs["default"].id.hex()
        lines = check_learners_placed(spec, {"base-default": [pg]}, roles)
        assert lines == [
            f"learner base-default: ranks 0 in placement group default ({pg}); bundle 0 holds {{CPU: 0.5}} of {{CPU: 1}}"
        ]
        with pytest.raises(RuntimeError, match="'base-default' rank 0 runs in placement group None"):
            check_learners_placed(spec, {"base-default": [None]}, roles)
        local_ray.kill(rank)
    finally:
        release(spec)
    assert _cpus_back(local_ray)


@pytest.mark.ray
def test_env_workers_start_in_their_bundles(local_ray):
    from swarm_runtime.cluster.env_cluster import EnvCluster
    from swarm_runtime.cluster.placement import actor_options
    from swarm_runtime.config.errors import ConfigError

    spec = _cpu_spec("cluster.placement=colocated", "cluster.env_workers=1", "model.adapter=lora")
    assert spec.totals() == {"CPU": 2}  # one bundle for the base's group (learner + sampler), one for the worker
    cfg = _cfg("domain=minecraft", "task=wooden_pickaxe")
    cluster = EnvCluster("minecraft", cfg.task, 1, placement=spec, placement_wait_s=20)
    try:
        from ray.util import placement_group_table

        assert len(spec.pgs) == 2 and all(placement_group_table(pg)["state"] == "CREATED" for pg in spec.pgs.values())
        opts = actor_options(spec, "default", "sampler")
        assert opts["num_cpus"] == 0.5 and opts["scheduling_strategy"].placement_group_bundle_index == 0
        with pytest.raises(ConfigError, match="has 1 env slot"):
            actor_options(spec, "envs", "env", 1)
        env = cluster.new_env()
        assert isinstance(env.reset(3), str)  # the worker runs inside its bundle
        env.close()
        assert local_ray.available_resources().get("CPU", 0) == 0  # both CPUs reserved
    finally:
        cluster.close()
    assert spec.pgs == {} and _cpus_back(local_ray)  # released at close


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize(
    "sharded, learner, total",
    [((), "Logger: 1 x {CPU: 1}", 5), (SHARDED[2:], "Logger: 2 x {CPU: 1}", 8)],
    ids=["local", "fsdp"],
)
def test_swarm_run_refuses_a_placement_ray_cannot_hold(sharded, learner, total, ray_head, tmp_path):
    """The real run's path (config -> plan -> placement -> EnvCluster reserving it) up to the reservation; env
    workers in their bundles past it: test_env_workers_start_in_their_bundles; learner ranks:
    test_sharded_learners_run_in_their_bundles_colocated_and_split."""
    # 3 roles with full copies (3 bundles; fsdp with 2 ranks: 6) + 2 env workers = 5 (8) CPUs; the session's local
    # Ray of 2 (tests/conftest.py ``ray_head``, joined) cannot hold them
    r = swarm(
        "run",
        *TINY_RUN,
        *sharded,
        "cluster.kind=ray",
        "cluster.env_workers=2",
        "cluster.placement=colocated",
        "cluster.placement_wait_s=2",
        *ray_head.args,
        f"run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
        env=ray_head.env,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = r.stderr.strip().splitlines()[-1]
    assert "could not reserve" in line and learner in line and "envs: 2 x {CPU: 1}" in line
    assert f"(in all {{CPU: {total}}})" in line and "available of {CPU: 2}" in line
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before SFT


#: the run's line per learner (mpt: placement.check_learners_placed): the group its ranks report from inside, and
#: what each bundle of the group holds by Ray's accounts
PLACED = re.compile(r"placement: learner (\w+): ranks 0, 1 in placement group (\w+) \((\w+)\); (.*)$", re.M)


@pytest.mark.ray
@pytest.mark.slow
def test_sharded_learners_run_in_their_bundles_colocated_and_split(tiny_run, tmp_path):
    """A real ``swarm run`` (TINY_RUN, fsdp with 2 ranks per learner) under each placement, both on one local Ray that
    has the CPUs the larger asks (colocated 3 x 2 + 1, split 3 x 3 + 1): every rank reports its group's placement group
    from inside its actor, the bundles hold the ranks' shares (colocated: rank 0 half of bundle 0, beside the sampler's
    share, which stays free with the sampler in the trainer; rank 1 all of bundle 1; split: a bundle per rank and the
    sampler's empty), and the metrics are the same under both placements, and the in-process run's within
    test_sharded_learners' tolerance (FSDP sums gradients in another order; ``same_as``), eval.json too."""
    from tests.test_sharded_learners import same_as

    held = {
        "colocated": "bundle 0 holds {CPU: 0.5} of {CPU: 1}, bundle 1 holds {CPU: 1} of {CPU: 1}",
        "split": "bundle 0 holds {CPU: 1} of {CPU: 1}, bundle 1 holds {CPU: 1} of {CPU: 1}, bundle 2 holds "
        "{CPU: 0} of {CPU: 1}",
    }
    rows = {}
    # one Ray for both runs, as large as the larger asks (split: 10 CPUs), joined by each run (cluster.address): a
    # Ray start and stop less than each run starting its own (the cluster stage's cost)
    with held_ray(tmp_path / "ray-head.log", 10) as head:
        for kind in ("colocated", "split"):
            run = tmp_path / kind
            r = swarm(
                "run",
                *TINY_RUN,
                *SHARDED,
                f"cluster.placement={kind}",
                *head.args,
                f"run_dir={run}",
                cwd=tmp_path,
                env=head.env,
            )
            assert r.returncode == 0, r.stderr[-3000:]
            assert f"placement ({kind}) reserved" in r.stderr and "2 ranks each (fsdp)" in r.stderr, r.stderr[-3000:]
            placed = {m.group(1): m.groups()[1:] for m in PLACED.finditer(r.stderr)}
            assert set(placed) == {"Logger", "Miner", "Smith"}, r.stderr[-3000:]
            assert all(group == name for name, (group, _, _) in placed.items())  # a full copy's group is its role
            assert len({pg for _, pg, _ in placed.values()}) == 3  # a placement group each
            assert all(line == held[kind] for _, _, line in placed.values()), placed
            rows[kind] = run_rows(run)
            same_as(run, tiny_run[0])
    assert rows["colocated"] == rows["split"]


def test_a_run_folder_of_config_version_6_loads_without_the_new_keys(tmp_path):
    """Config version 7 added train.* and cluster.placement/cpus_per_bundle/placement_wait_s: a version-6 run
    gets the behaviour it had (local learner, no placement groups); a version-7 file without them is truncated."""
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import light_registry, load_saved, resolve
    from swarm_runtime.config.schema import CONFIG_VERSION

    d = OmegaConf.to_container(resolve(["domain=minecraft"], light_registry()))
    del d["train"]
    for k in ("placement", "cpus_per_bundle", "placement_wait_s"):
        del d["cluster"][k]
    path = tmp_path / "config.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create({**d, "config_version": 6})))
    cfg = load_saved(path)
    assert (cfg.train.engine, cfg.train.shards, cfg.cluster.placement) == ("local", 1, "none")
    assert cfg.config_version == CONFIG_VERSION  # saved again as the current version
    path.write_text(OmegaConf.to_yaml(OmegaConf.create({**d, "config_version": 7})))
    with pytest.raises(ConfigError, match="lacks cluster.placement"):
        load_saved(path)


def test_a_run_checks_the_device_it_trains_on_whatever_the_placement():
    """A run's learners are in its own process today: check_plan plans that one device even with a placement
    (the per-device plan would say a group's share fits where the trainer holds every role)."""
    from swarm_runtime.models.memory_plan import MemoryPlan, PlacedPlan, check_plan, make_plan

    cfg = _cfg(*H200_8B, "model.adapter=lora", "cluster.kind=ray", "cluster.placement=split")
    assert isinstance(make_plan(cfg, 3, 3), PlacedPlan)
    plan = check_plan(cfg, 3, n_roles=3)
    assert type(plan) is MemoryPlan and plan.total == make_plan(_cfg(*H200_8B, "model.adapter=lora"), 3, 3).total
