"""The real CLI in a subprocess: a smoke run, bad input, kill-and-resume, eval (``swarm``: a cold
process; ``warm_swarm``: a child forked from a warmed interpreter, for what a command does once started)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import TINY_RUN, copy_run, swarm


@pytest.fixture(scope="module")
def smoke_run(tiny_run, tmp_path_factory):
    """A copy of the session's tiny run (conftest ``tiny_run``) that this module's tests write into."""
    run, res = tiny_run
    return copy_run(run, tmp_path_factory.mktemp("cli") / "run"), res


def test_run_writes_everything(tiny_run):
    run, res = tiny_run
    assert "Held-out evaluation" in res.stdout and "SFT only" in res.stdout and "MPT" in res.stdout
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "eval.json",
        "eval.md",
        "run.log",
        "reward_vs_flops.png",
        "turn_share.png",
    ):
        assert (run / name).exists(), name
    assert list((run / "tb").glob("events.out.tfevents.*"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "charts/episode_reward" in r]
    assert steps == [1, 2]
    assert all(r["flops/total"] > 0 for r in rows if "flops/total" in r)
    # the in-process sampler's log-probs are the learner's on the same weights (docs/reference/engine.md)
    mismatch = [r for r in rows if any(k.startswith("mismatch/approx_kl_") for k in r)]
    assert mismatch and all(r.get("kind") == "action" for r in mismatch)
    for r in mismatch:
        for k, v in r.items():
            if k.startswith("mismatch/approx_kl_"):
                assert 0 <= v < 1e-9 and r[k.replace("approx_kl", "max_abs_dlogp")] < 1e-4, (k, r)
    ev = json.loads((run / "eval.json").read_text())
    assert set(ev["results"]) == {"SFT only", "MPT"}
    assert ev["results"]["MPT"]["seeds"] == 2
    assert "MPT - SFT: " in res.stdout and ev["mpt_minus_sft"]["seeds"] == 2
    assert (
        f"Run folder: {run} (eval.json, metrics.jsonl, tb/, reward_vs_flops.png, turn_share.png, checkpoints/)"
        in res.stdout
    )


def test_zero_updates_say_so_instead_of_an_empty_plot_list_and_a_difference_with_itself(tmp_path):
    """``algo.iterations=0``: the final checkpoint is the SFT one, so it is evaluated once (after SFT:
    one evaluation in the log and in the metrics), shown once (the SFT only row), with no MPT - SFT
    difference (printed or in eval.json) and no plots, each said in words; no tb/ when not written."""
    run = tmp_path / "zero"
    res = swarm("run", *TINY_RUN, "algo.iterations=0", "tensorboard=false", f"run_dir={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| SFT only |" in res.stdout and "| MPT |" not in res.stdout
    assert "MPT - SFT:" not in res.stdout
    assert (
        "MPT: 0 training updates (algo.iterations=0), so the MPT checkpoint is the SFT one, evaluated once "
        "(the SFT figures above); no MPT - SFT difference is reported"
    ) in res.stdout
    assert f"Run folder: {run} (eval.json, metrics.jsonl, checkpoints/; no plots: 0 training updates)" in res.stdout
    log = (run / "run.log").read_text()
    assert log.count("held-out after SFT: reward") == 1 and "held-out after MPT: reward" not in log
    assert "held-out after MPT: 0 training updates, so the final checkpoint is the SFT one" in log
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/reward_mean" in r] == [0]
    ev = json.loads((run / "eval.json").read_text())
    assert set(ev["results"]) == {"SFT only"} and "mpt_minus_sft" not in ev and "mpt_minus_sft_success" not in ev
    assert not list(run.glob("*.png")) and not (run / "tb").exists()
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter-000000"
    state = json.loads((run / "checkpoints" / "iter-000000" / "state.json").read_text())
    assert state["phase"] == "done" and state["final_eval"] == state["sft_eval"]  # what experiments read


def test_checkpoint_is_hugging_face_format(smoke_run, registry):
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from swarm_runtime.runs.context import RunContext

    run, _ = smoke_run
    latest = (run / "checkpoints" / "latest").read_text().strip()
    agent_dir = run / "checkpoints" / latest / "agents" / "Smith"
    assert (agent_dir / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(agent_dir)
    tok = PreTrainedTokenizerFast.from_pretrained(agent_dir)
    assert model.config.model_type == "qwen2" and "<bid_0.8>" in tok.get_vocab()
    # the swarm reloads the very same word-level tokenizer (not the model type's BPE one)
    pm, reg = registry
    ctx = RunContext(OmegaConf.load(run / "config.yaml"), pm, reg, run)
    fresh = ctx.make_policy(0)
    loaded = ctx.make_policy(0, agent_dir)
    text = "you are Smith . craft wooden_pickaxe . bid :"
    assert loaded.encode_prompt(text) == fresh.encode_prompt(text)
    assert loaded.decode(loaded.action_target("craft stick")) == "craft stick"
    for f in ("training_state.pt",):
        assert (agent_dir / f).exists()
    assert (run / "checkpoints" / latest / "rng.pt").exists()


def test_eval_command(smoke_run):
    run, _ = smoke_run
    res = swarm("eval", str(run), "eval.runs=1", cwd=run.parent)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "reward" in res.stdout and list(run.glob("eval-iter-*.json"))
    bad = swarm("eval", str(run), "checkpoint=nosuch", cwd=run.parent)
    assert bad.returncode == 2 and "valid:" in bad.stderr and "sft" in bad.stderr


def test_eval_under_other_settings_keeps_the_earlier_file():
    from swarm_runtime.cli.eval import eval_file_name

    assert eval_file_name("sft", []) == "eval-sft.json"
    assert eval_file_name("iter-000020", ["eval.temperature=0.4"]) == "eval-iter-000020--eval.temperature=0.4.json"
    assert eval_file_name("sft", ["task.view=a b/c"]) == "eval-sft--task.view=a_b_c.json"
    long = [f"task.k{i}={'x' * 20}" for i in range(8)]
    name = eval_file_name("sft", long)
    assert len(name) < 130 and name != eval_file_name("sft", long[:-1] + ["task.k7=y"])


def _copy_with_config(run, dst, old: str, new: str):
    """A copy of run folder ``run`` whose config.yaml has ``old`` replaced by ``new``."""
    import shutil

    shutil.copytree(run, dst)
    text = (dst / "config.yaml").read_text()
    assert old in text
    (dst / "config.yaml").write_text(text.replace(old, new))
    return dst


def test_eval_of_a_run_whose_config_lacks_keys_names_them(smoke_run, tmp_path, warm_swarm):
    """A run folder whose config.yaml lacks keys (truncated, or older than a key) is not silently
    completed with defaults: eval and resume stop (exit 2) naming the missing keys."""
    old = _copy_with_config(smoke_run[0], tmp_path / "old_run", "  common_random_numbers: false\n", "")
    res = warm_swarm("eval", str(old), "checkpoint=sft", "eval.runs=1", cwd=tmp_path)
    assert res.returncode == 2 and "algo.common_random_numbers" in res.stderr and "Traceback" not in res.stderr
    res = warm_swarm("run", "resume=true", f"run_dir={old}", cwd=tmp_path)
    assert res.returncode == 2 and "eval.common_random_numbers" in res.stderr and "Traceback" not in res.stderr


def _older_version(text: str) -> str:
    """config.yaml ``text`` as config version 1 wrote it: no ``config_version`` and none of the keys version 2 added."""
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import ADDED_KEYS

    cfg = OmegaConf.to_container(OmegaConf.create(text))
    cfg.pop("config_version")
    for key in ADDED_KEYS[2]:
        *parents, last = key.rstrip(".").split(".")
        node = cfg
        for p in parents:
            node = node[p]
        node.pop(last)
    return OmegaConf.to_yaml(OmegaConf.create(cfg))


#: The keys a version-1 config.yaml has (every key since is in ADDED_KEYS), frozen: a key added to the schema without
#: its version in ADDED_KEYS makes every earlier run folder unloadable ("lacks KEY: it is truncated").
VERSION_1_KEYS = """
    algo.action_steps algo.adam_eps algo.bid_beta algo.bid_levels algo.bid_lr algo.bid_pair_weight algo.bid_pairs
    algo.bid_reference algo.bid_steps algo.branch_horizon algo.branch_samples algo.branches_per_episode
    algo.common_random_numbers algo.coordinator algo.credit algo.envs_per_step algo.goa_responders algo.grad_clip
    algo.iterations algo.kl_coef algo.lr algo.min_lr_ratio algo.minibatch algo.name algo.resample_tries
    algo.reward_scale algo.sft.action_epochs algo.sft.batch_size algo.sft.demo_episodes algo.sft.epochs algo.sft.lr
    algo.sft.match algo.sft.other_bids algo.sft.owner_bids algo.warmup_steps algo.weight_decay checkpoint_every
    domain eval.common_random_numbers eval.episodes eval.runs eval.temperature experiment.base
    experiment.budget_factor experiment.coordinators experiment.dropout_p experiment.dropout_per
    experiment.dropout_replicas experiment.eval_episodes experiment.iterations experiment.milestones
    experiment.monolithic_sft experiment.name experiment.pass_k experiment.replicas experiment.sft_eval
    experiment.transfer_iterations experiment.transfer_tasks hardware.device hardware.name hardware.threads
    keep_checkpoints log_level model.backend model.bid_mode model.constrained_actions model.device model.dtype
    model.hidden_size model.intermediate_size model.max_action_tokens model.max_bid_tokens model.max_positions
    model.max_prompt_tokens model.name model.num_heads model.num_kv_heads model.num_layers model.path
    model.temperature progress seed skip_sft_eval task task_name tensorboard
""".split()


def _version_1_keys() -> list[str]:
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import ADDED_KEYS, FOLDER_KEYS, _leaf_keys
    from swarm_runtime.config.schema import RunConfig

    added = [a for keys in ADDED_KEYS.values() for a in keys]
    return sorted(
        k
        for k in _leaf_keys(OmegaConf.structured(RunConfig))
        if k not in FOLDER_KEYS
        and not k.startswith("serve.")
        and not any(k == a or (a.endswith(".") and k.startswith(a)) for a in added)
    )


def test_every_key_added_since_version_1_is_in_added_keys():
    new = sorted(set(_version_1_keys()) - set(VERSION_1_KEYS))
    assert not new, (
        f"{new} are in the schema but not in config/load.py ADDED_KEYS: bump CONFIG_VERSION and list them there "
        "with the value an earlier run folder reads, or earlier run folders stop loading"
    )
    assert sorted(VERSION_1_KEYS) == _version_1_keys()  # and none listed here went missing


def test_a_version_9_run_folder_without_the_served_and_parallel_keys_loads(tmp_path):
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import load_saved, resolve
    from swarm_runtime.config.schema import CONFIG_VERSION
    from swarm_runtime.plugins.manager import build_registry, make_plugin_manager

    cfg = OmegaConf.to_container(
        resolve(["domain=minecraft", "task=wooden_pickaxe"], build_registry(make_plugin_manager()))
    )
    cfg["config_version"] = 9
    for section, key in (("algo", "served"), ("algo", "served_only"), ("algo", "served_per_step"),
                         ("experiment", "parallel")):  # fmt: skip
        cfg[section].pop(key)
    cfg = OmegaConf.create(cfg)
    OmegaConf.save(cfg, tmp_path / "config.yaml")
    loaded = load_saved(tmp_path / "config.yaml")
    assert loaded.algo.served == [] and loaded.experiment.parallel == 1 and loaded.config_version == CONFIG_VERSION
    cfg.config_version = CONFIG_VERSION  # the same file claiming this version is truncated
    OmegaConf.save(cfg, tmp_path / "config.yaml")
    with pytest.raises(Exception, match="lacks algo.served"):
        load_saved(tmp_path / "config.yaml")


def test_a_run_folder_of_an_earlier_config_version_evaluates_with_that_versions_behaviour(
    smoke_run, tmp_path, warm_swarm
):
    """A config.yaml written before version 2's keys existed loads with the values that reproduce the
    old behaviour (one training seed in experiments, full copies); the same file claiming version 2
    is truncated and refused, naming the keys."""
    import shutil

    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import load_saved
    from swarm_runtime.config.schema import CONFIG_VERSION

    old = tmp_path / "v1_run"
    shutil.copytree(smoke_run[0], old)
    text = _older_version((old / "config.yaml").read_text())
    from omegaconf import OmegaConf

    older = OmegaConf.create(text)
    assert "train_seeds" not in older.experiment and "serve" not in older and "dev_seeds" not in older.task
    (old / "config.yaml").write_text(text)
    cfg = load_saved(old / "config.yaml")
    assert cfg.experiment.train_seeds is None and cfg.model.adapter == "none" and cfg.config_version == CONFIG_VERSION
    assert cfg.serve.port == 8000 and cfg.eval.split == "eval"
    res = warm_swarm("eval", str(old), "checkpoint=sft", "eval.runs=1", "eval.episodes=1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    (old / "config.yaml").write_text("config_version: 2\n" + text)
    with pytest.raises(ConfigError, match="lacks model.adapter, model.lora.rank"):
        load_saved(old / "config.yaml")


def test_eval_takes_bare_task_keys_and_refuses_unknown_ones(smoke_run, warm_swarm):
    """``swarm eval RUN max_decisions=3`` means ``task.max_decisions=3``, as it does for ``swarm run``."""
    run, _ = smoke_run
    res = warm_swarm("eval", str(run), "checkpoint=sft", "eval.runs=1", "max_decisions=3", cwd=run.parent)
    assert res.returncode == 0, res.stderr[-2000:]
    saved = json.loads((run / "eval-sft--eval.runs=1--max_decisions=3.json").read_text())
    assert saved["decisions_mean"] <= 3 and saved["overrides"] == ["checkpoint=sft", "eval.runs=1", "max_decisions=3"]
    bad = warm_swarm("eval", str(run), "checkpoint=sft", "nosuch=1", cwd=run.parent)
    assert bad.returncode == 2 and "nosuch" in bad.stderr and "Traceback" not in bad.stderr
    bad = warm_swarm("eval", str(run), "checkpoint=sft", "eval.runs=0", cwd=run.parent)
    assert bad.returncode == 2 and "eval.runs" in bad.stderr and "Traceback" not in bad.stderr


def test_resume_with_more_iterations_extends_a_finished_run(smoke_run, tmp_path, warm_swarm):
    """``swarm run resume=true run_dir=RUN algo.iterations=N`` trains a finished run on to N updates
    (and saves N in its config, so a later resume continues to N); fewer than done is refused."""
    run = _copy_with_config(smoke_run[0], tmp_path / "longer", "  iterations: 2\n", "  iterations: 2\n")
    res = warm_swarm(
        "run",
        "resume=true",
        f"run_dir={run}",
        "algo.iterations=3",
        "domain=minecraft",
        "task.max_decisions=16",
        "algo.lr=0.00003",
        cwd=tmp_path,
    )  # other settings as saved: fine
    assert res.returncode == 0, res.stderr[-3000:]
    log = (run / "run.log").read_text()
    assert "extending the finished run from 2 to 3 updates" in log
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "charts/episode_reward" in r] == [1, 2, 3]
    assert "  iterations: 3\n" in (run / "config.yaml").read_text()
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter-000003"
    assert "MPT" in res.stdout and json.loads((run / "eval.json").read_text())["results"]["MPT"]["seeds"] == 2
    bad = warm_swarm("run", "resume=true", f"run_dir={run}", "algo.iterations=1", cwd=tmp_path)
    assert bad.returncode == 2 and "already made 3 updates" in bad.stderr and "Traceback" not in bad.stderr


def test_a_gpu_trained_run_is_evaluated_and_resumed_on_the_cpu_by_naming_the_hardware(smoke_run, tmp_path, warm_swarm):
    """A run folder saved with ``hardware=h200``: on a machine whose torch sees no GPU, ``swarm eval``
    and ``resume=true`` stop with a message naming ``hardware=cpu``, and run with it."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    gpu_run = _copy_with_config(
        smoke_run[0], tmp_path / "gpu_run", "  name: cpu\n  device: cpu\n", "  name: h200\n  device: cuda\n"
    )
    for cmd in (["eval", str(gpu_run), "checkpoint=sft", "eval.runs=1"], ["run", "resume=true", f"run_dir={gpu_run}"]):
        bad = warm_swarm(*cmd, cwd=tmp_path)
        assert bad.returncode == 2 and "hardware 'h200' needs a CUDA GPU" in bad.stderr, bad.stderr[-2000:]
        assert "use hardware=cpu" in bad.stderr and "Traceback" not in bad.stderr
    res = warm_swarm("eval", str(gpu_run), "checkpoint=sft", "eval.runs=1", "hardware=cpu", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    bad = warm_swarm("eval", str(gpu_run), "hardware=tpu", cwd=tmp_path)
    assert bad.returncode == 2 and "unknown hardware 'tpu'" in bad.stderr and "h200" in bad.stderr


@pytest.mark.parametrize(
    "args, needle, valid",
    [
        (["domain=nosuch"], "unknown domain 'nosuch'", "minecraft"),
        (["domain=minecraft", "task=nosuch"], "unknown task 'nosuch'", "iron_pickaxe"),
        (["domain=minecraft", "algo.nosuch=1"], "unknown config key 'algo.nosuch'", "lr"),
        (["domain=minecraft", "nosuch=1"], "unknown config key 'nosuch'", "algo"),
        (["domain=minecraft", "model=nosuch"], "unknown model 'nosuch'", "tiny"),
        (["domain=minecraft", "algo.coordinator=nosuch"], "unknown algo.coordinator 'nosuch'", "auction"),
        (["domain=vln_ce", "task=r2r", "sim=gazebo"], "vln_ce task r2r: vln_ce: unknown sim 'gazebo'", "habitat"),
    ],
)
def test_bad_input_exits_2_naming_valid_values(tmp_path, args, needle, valid, warm_swarm):
    # the first case cold, the rest through the warm CLI (test_missing_backend_exits_2... is cold too)
    res = (swarm if args == ["domain=nosuch"] else warm_swarm)("run", *args, cwd=tmp_path, timeout=120)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert needle in res.stderr and "valid:" in res.stderr and valid in res.stderr
    assert not (tmp_path / "runs").exists()  # nothing written for a bad config


#: The CLI as ``python -c`` with the deepspeed package not importable (``importlib.util.find_spec("deepspeed")`` is
#: None): a machine without the deepspeed extra.
NO_DEEPSPEED_CLI = (
    "import sys; sys.modules['deepspeed'] = None; from swarm_runtime.cli.main import main; sys.exit(main(sys.argv[1:]))"
)
#: Learners on a local Ray, as a sharded engine needs.
LEARNERS_ON_RAY = ["cluster.kind=ray", "cluster.learners=ray"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["train.engine=fsdp", "train.shards=2"], "needs cluster.learners=ray"),
        (["train.engine=deepspeed", "train.shards=2"], "needs cluster.learners=ray"),
        ([*LEARNERS_ON_RAY, "train.engine=deepspeed", "model.adapter=lora"], "valid: model.adapter=none with"),
        ([*LEARNERS_ON_RAY, "train.engine=deepspeed", "hardware.dtype=float16"], "float32 or bfloat16"),
        ([*LEARNERS_ON_RAY, "train.engine=deepspeed", "NO_DEEPSPEED"], "needs the deepspeed package"),
    ],
)
def test_swarm_config_refuses_the_learner_engines_swarm_run_refuses(tmp_path, args, needle):
    """What ``swarm run`` can train with (config/checks_cluster.py: check_engine_wired) is checked with every other
    key: ``swarm config`` and ``swarm run`` give the same one line and exit 2 before anything is written."""
    if "cluster.kind=ray" in args:  # without the ray extra such a config is refused for it (validation.needs_ray)
        pytest.importorskip("ray")
    bare = "NO_DEEPSPEED" in args
    args = [*TINY_RUN, *(a for a in args if a != "NO_DEEPSPEED")]
    lines = []
    for command in (["config"], ["run", f"run_dir={tmp_path / 'run'}"]):
        if bare:
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
            cli = [sys.executable, "-c", NO_DEEPSPEED_CLI, *command, *args]
            res = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        else:
            res = swarm(*command, *args, cwd=tmp_path, timeout=120)
        assert res.returncode == 2 and res.stdout == "", (command, res.stdout, res.stderr)
        lines.append(res.stderr.strip().splitlines())
    assert lines[0] == lines[1] and len(lines[0]) == 1, lines
    assert lines[0][0].startswith("swarm: error: train.engine=") and needle in lines[0][0], lines[0]
    assert list(tmp_path.iterdir()) == []  # no run folder, no runs/


def test_missing_backend_exits_2_with_install_hint(tmp_path):
    """A task value that needs an optional package (habitat-lab here) is refused before a run
    folder exists, with the domain's message and no traceback."""
    import importlib.util

    if importlib.util.find_spec("habitat") is not None:
        pytest.skip("habitat-lab is installed here")
    res = swarm("run", "domain=vln_ce", "task=r2r", "sim=habitat", cwd=tmp_path, timeout=120)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "habitat-lab" in res.stderr and "pip install" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "runs").exists()


def test_listing_commands(tmp_path):
    res = swarm("domains", cwd=tmp_path)
    assert res.returncode == 0 and "Logger, Miner, Smith" in res.stdout
    res = swarm("plugins", cwd=tmp_path)
    assert res.returncode == 0 and "coordinator:auction" in res.stdout and "domain:minecraft" in res.stdout
    res = swarm("--help", cwd=tmp_path)
    assert res.returncode == 0 and "run" in res.stdout and "eval" in res.stdout


def test_kill_and_resume(tmp_path):
    run = tmp_path / "run"
    args = [a for a in TINY_RUN if not a.startswith("algo.iterations")] + [
        "algo.iterations=6",
        "checkpoint_every=1",
        f"run_dir={run}",
    ]
    env_cmd = [sys.executable, "-m", "swarm_runtime.cli.main", "run", *args]
    proc = subprocess.Popen(env_cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = run / "checkpoints" / "iter-000002" / "state.json"
    deadline = time.time() + 240
    while time.time() < deadline and not target.exists() and proc.poll() is None:
        time.sleep(0.2)
    assert target.exists(), "no checkpoint appeared before the deadline"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = json.loads(
        (run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip() / "state.json").read_text()
    )
    done_before = state["iteration"]
    assert 2 <= done_before < 6
    res = swarm("run", *args, "resume=true", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resumed at phase rl iteration {done_before}" in (run / "run.log").read_text()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "charts/episode_reward" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # each update logged once, none lost or repeated
    assert "MPT" in res.stdout


def test_bid_reference_is_the_sft_checkpoint_also_after_a_resume(tmp_path, warm_swarm):
    """algo.bid_reference=sft: the bid steps measure their log-odds against checkpoints/sft. With the
    action steps frozen (lr 0) the first bid step's policy is that checkpoint, so it starts at a shift
    of exactly 0; a run resumed from its middle checkpoint loads the same reference and repeats the
    uninterrupted run's last update. Two updates (action, then bid) and a checkpoint after each are
    enough: the resume from iter-000001 repeats the last update, a bid step, the one that reads the
    reference (both runs through the warm CLI; the cold resume is test_kill_and_resume's)."""
    run = tmp_path / "ref"
    args = [
        "domain=minecraft",
        "task=iron_pickaxe",
        "task.max_decisions=24",
        "algo.sft.demo_episodes=4",
        "algo.sft.epochs=2",
        "algo.envs_per_step=4",
        "algo.iterations=2",
        "algo.action_steps=1",
        "algo.bid_steps=1",
        "eval.episodes=2",
        "eval.runs=1",
        "progress=false",
        "algo.bid_reference=sft",
        "algo.lr=0",
        "checkpoint_every=1",
        f"run_dir={run}",
    ]
    res = warm_swarm("run", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]

    def rows(d):
        return {r["step"]: r for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "kind" in r}

    first = rows(run)
    assert first[2]["kind"] == "bid" and first[2]["charts/bid_pairs"] >= 1
    shifts = [v for k, v in first[2].items() if k.startswith("charts/bid_ref_logodds_")]
    assert shifts and all(abs(v) < 1e-6 for v in shifts)
    assert f"reference policies: {run / 'checkpoints'}" in (run / "run.log").read_text()
    again = _copy_with_config(run, tmp_path / "again", f"run_dir: {run}\n", f"run_dir: {tmp_path / 'again'}\n")
    (again / "checkpoints" / "latest").write_text("iter-000001")
    res = warm_swarm("run", "resume=true", f"run_dir={again}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"reference policies: {again / 'checkpoints'}" in (again / "run.log").read_text()
    second = rows(again)
    assert sorted(second) == [1, 2]
    assert {k: v for k, v in second[2].items() if not k.startswith("time/")} == {
        k: v for k, v in first[2].items() if not k.startswith("time/")
    }
