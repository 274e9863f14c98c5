"""Bad values through the real CLI: each exits 2 with one line naming the key (no traceback), before
anything is written; most before torch is imported. Every case runs through ``cli.main`` (the function
``swarm`` runs) in one process, one call after another; every 8th case (and the last) also as a cold
``swarm`` subprocess of its own (a few at a time), so the exit code and stderr of a real process are
checked on a spread of keys without paying a ~1-5 s interpreter start for each of the ~125 cases."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from conftest import ROOT

#: (argument, what the message must name)
BAD = [
    ("algo.lr=-1", "algo.lr"),
    ("algo.lr=nan", "algo.lr"),
    ("algo.lr=inf", "algo.lr"),
    ("algo.lr=11", "algo.lr"),
    ("algo.lr=abc", "algo.lr"),
    ("algo.lr=${nosuch.key}", "algo.lr"),
    ("algo.bid_lr=-1e-4", "algo.bid_lr"),
    ("algo.sft.lr=-0.1", "algo.sft.lr"),
    ("algo.adam_eps=-1", "algo.adam_eps"),
    ("algo.adam_eps=0", "algo.adam_eps"),
    ("algo.grad_clip=-1", "algo.grad_clip"),
    ("algo.grad_clip=0", "algo.grad_clip"),
    ("algo.min_lr_ratio=-0.5", "algo.min_lr_ratio"),
    ("algo.min_lr_ratio=2", "algo.min_lr_ratio"),
    ("algo.reward_scale=-1", "algo.reward_scale"),
    ("algo.reward_scale=0", "algo.reward_scale"),
    ("algo.warmup_steps=-1", "algo.warmup_steps"),
    ("algo.weight_decay=-1", "algo.weight_decay"),
    ("algo.bid_levels=[0,0.5]", "algo.bid_levels"),
    ("algo.bid_levels=[a,b]", "algo.bid_levels"),
    ("algo.bid_levels=[0.2,0.4]", "algo.bid_levels"),
    ("algo.bid_levels=[0,1.5]", "algo.bid_levels"),
    ("algo.bid_levels=[]", "algo.bid_levels"),
    ("algo.bid_levels=[0,0.2,0.2,0.6,0.8]", "algo.bid_levels"),
    ("algo.sft.owner_bids=[0.7]", "algo.sft.owner_bids"),
    ("algo.sft.other_bids=[0.3]", "algo.sft.other_bids"),
    ("algo.iterations=-1", "algo.iterations"),
    ("algo.iterations=99999999999", "algo.iterations"),
    ("algo.envs_per_step=0", "algo.envs_per_step"),
    ("algo.action_steps=0", "algo.action_steps"),
    ("algo.bid_steps=-1", "algo.bid_steps"),
    ("algo.minibatch=0", "algo.minibatch"),
    ("algo.branches_per_episode=-1", "algo.branches_per_episode"),
    ("algo.resample_tries=-1", "algo.resample_tries"),
    ("algo.branch_samples=0", "algo.branch_samples"),
    ("algo.branch_horizon=0", "algo.branch_horizon"),
    ("algo.goa_responders=-1", "algo.goa_responders"),
    ("algo.kl_coef=-1", "algo.kl_coef"),
    ("algo.bid_beta=0", "algo.bid_beta"),
    ("algo.bid_pairs=all", "algo.bid_pairs"),
    ("algo.sft.demo_episodes=-1", "algo.sft.demo_episodes"),
    ("algo.sft.batch_size=0", "algo.sft.batch_size"),
    ("algo.sft.epochs=0", "algo.sft.epochs"),
    ("algo.sft.action_epochs=0", "algo.sft.action_epochs"),
    ("algo.sft.match=both", "algo.sft.match"),
    ("algo.nosuch=1", "algo.nosuch"),
    ("model.hidden_size=0", "model.hidden_size"),
    ("model.num_heads=3", "model.num_heads"),
    ("model.num_kv_heads=3", "model.num_kv_heads"),
    ("model.max_positions=100", "model.max_positions"),
    ("model.max_action_tokens=0", "model.max_action_tokens"),
    ("model.max_prompt_tokens=0", "model.max_prompt_tokens"),
    ("model.max_bid_tokens=0", "model.max_bid_tokens"),
    ("model.dtype=nosuch", "model.dtype"),
    ("model.bid_mode=magic", "model.bid_mode"),
    ("model.temperature=-1", "model.temperature"),
    ("model.num_layers=0", "model.num_layers"),
    ("model.intermediate_size=0", "model.intermediate_size"),
    ("model.device=tpu", "model.device"),
    ("model=nosuch", "model"),
    ("hardware.threads=-1", "hardware.threads"),
    ("hardware.device=tpu", "hardware.device"),
    ("hardware=nosuch", "hardware"),
    ("eval.episodes=0", "eval.episodes"),
    ("eval.episodes=1000", "eval.episodes"),
    ("eval.runs=0", "eval.runs"),
    ("eval.temperature=-1", "eval.temperature"),
    ("task.max_decisions=0", "task.max_decisions"),
    ("task.max_decisions=-5", "task.max_decisions"),
    ("task.reward_max=0", "task.reward_max"),
    ("checkpoint_every=0", "checkpoint_every"),
    ("keep_checkpoints=-1", "keep_checkpoints"),
    ("seed=-1", "seed"),
    ("log_level=LOUD", "log_level"),
    ("progress=maybe", "progress"),
    ("experiment.budget_factor=0.5", "experiment.budget_factor"),
    ("experiment.dropout_per=hour", "experiment.dropout_per"),
    ("experiment.pass_k=0", "experiment.pass_k"),
    ("domain=nosuch", "domain"),
    ("task=nosuch", "task"),
    # bounds where a value can exhaust the machine, finite numbers wherever a float is read, keys
    # no algorithm would read, a coordinator that makes bid steps train nothing
    ("rlcr.group_size=1000000000", "rlcr.group_size"),
    ("rlcr.instances=0", "rlcr.instances"),
    ("rlcr.max_turns_per_agent=0", "rlcr.max_turns_per_agent"),
    ("rlcr.window=-1", "rlcr.window"),
    ("rlcr.t_max.end=.inf", "rlcr.t_max.end"),
    ("rlcr.t_max.start=nan", "rlcr.t_max.start"),
    ("rlcr.tick=nan", "rlcr.tick"),
    ("rlcr.seconds_per_token=.inf", "rlcr.seconds_per_token"),
    ("rlcr.latency_penalty=nan", "rlcr.latency_penalty"),
    ("rlcr.teams=[0]", "rlcr.teams"),
    ("rlcr.eval_runs=0", "rlcr.eval_runs"),
    ("rlcr.agents=2", "rlcr.agents"),
    ("rlcr.org=ceo", "rlcr.org"),
    ("serve.replicas=100000", "serve.replicas"),
    ("serve.replicas=-1", "serve.replicas"),
    ("serve.port=-1", "serve.port"),
    ("serve.port=70000", "serve.port"),
    ("serve.worker_threads=100000", "serve.worker_threads"),
    ("serve.bid_deadline_ms=0", "serve.bid_deadline_ms"),
    ("serve.agent_wait_s=.inf", "serve.agent_wait_s"),
    ("serve.max_body_bytes=0", "serve.max_body_bytes"),
    ("serve.url=ftp://x", "serve.url"),
    ("serve.agents=[Smith=ftp://x]", "serve.agents"),
    ("model.lora.rank=1e12", "model.lora.rank"),
    ("model.lora.alpha=.inf", "model.lora.alpha"),
    ("model.lora.lr_scale=.inf", "model.lora.lr_scale"),
    ("model.lora.dropout=nan", "model.lora.dropout"),
    ("model.arch={hidden_size: 64}", "model.arch"),
    ("model.arch={hidden_size: -64, vocab_size: 10, num_hidden_layers: 2}", "model.arch"),
    ("hardware.memory_gb=.inf", "hardware.memory_gb"),
    ("hardware.micro_batch=0", "hardware.micro_batch"),
    ("seed=9223372036854775807", "seed"),
    ("experiment.train_seeds=[9223372036854775807]", "experiment.train_seeds"),
    ("algo.coordinator=round_robin", "algo.coordinator=round_robin"),
    ("algo.coordinator=graph_of_agents", "algo.bid_steps"),
]
#: Settings valid alone that are refused together (argument lists).
BAD_TOGETHER = [
    (["model.adapter=lora", "model.lora.lr_scale=1000", "algo.lr=0.1"], "model.lora.lr_scale"),
]


def _swarm(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "swarm_runtime.cli.main", "run", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


#: ``swarm run ARGS`` for each case through ``cli.main`` in this one process: [exit code, stderr] each.
IN_PROCESS = """
import contextlib, io, json, sys, traceback
from swarm_runtime.cli.main import main
out = []
for args in json.load(sys.stdin):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(["run", *args])
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            rc = 1
    out.append([rc, err.getvalue()])
json.dump(out, sys.stdout)
"""


def _in_process(cases, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-c", IN_PROCESS],
        input=json.dumps([args for args, _ in cases]),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return [
        subprocess.CompletedProcess(args, rc, "", err) for (args, _), (rc, err) in zip(cases, json.loads(res.stdout))
    ]


def test_bad_values_exit_2_naming_the_key(tmp_path):
    assert len(BAD) >= 60
    (tmp_path / "a_file").write_text("x")
    cases = [([arg, f"run_dir={tmp_path / 'never'}"], key) for arg, key in BAD]
    cases += [([f"run_dir={tmp_path / 'a_file'}"], "run_dir"), ([f"run_dir={tmp_path / 'a_file' / 'sub'}"], "run_dir")]
    cases += [([*args, f"run_dir={tmp_path / 'never'}"], key) for args, key in BAD_TOGETHER]
    cold = [*cases[::8], cases[-1]]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: _swarm(c[0], tmp_path), cold))
    results += _in_process(cases, tmp_path)
    failures = []
    for (arg, key), res in zip([*cold, *cases], results):
        arg = " ".join(arg)
        err = res.stderr.strip()
        if res.returncode != 2 or key not in err or "Traceback" in err or len(err.splitlines()) != 1:
            failures.append(f"{arg}: exit {res.returncode}: {err[-300:]}")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "never").exists()  # nothing was written
