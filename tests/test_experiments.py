"""`swarm experiment ...` at smoke scale: the real CLI in a subprocess for `heldout` (which also
trains the tiny MPT swarm the other experiments reuse through experiment.base), every other
experiment in process, resuming, and bad input."""

import json
import re

import pytest
from conftest import swarm

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.experiments.runner import run_experiment

#: Smoke budget: tiny episodes, two updates per training, 2 held-out seeds x 1 run.
SMOKE = [
    "domain=minecraft",
    "task=wooden_pickaxe",
    "task.max_decisions=12",
    "algo.sft.demo_episodes=2",
    "algo.sft.epochs=1",
    "algo.envs_per_step=2",
    "experiment.iterations=2",
    "algo.action_steps=1",
    "algo.bid_steps=1",
    "eval.episodes=2",
    "eval.runs=1",
    "progress=false",
    "tensorboard=false",
    "hardware.threads=1",
    "experiment.train_seeds=null",
]


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    d = tmp_path_factory.mktemp("exp")
    res = swarm("experiment", "heldout", *SMOKE, f"run_dir={d / 'heldout'}", cwd=d)
    assert res.returncode == 0, res.stderr[-3000:]
    return d / "heldout", res


@pytest.fixture(scope="module")
def base(heldout):
    return ["experiment.base=" + str(heldout[0] / "trainings" / "mpt")]


def run(registry, name, tmp_path, *args):
    pm, reg = registry
    out = run_experiment(name, [*SMOKE, *args, f"run_dir={tmp_path / name}"], pm, reg)
    return out, json.loads((out / "results.json").read_text())


def test_heldout_cli_writes_table_json_plot_and_matches_flops(heldout):
    d, res = heldout
    assert "Held-out: MPT vs monolithic REINFORCE" in res.stdout and "| monolithic REINFORCE |" in res.stdout
    assert "| equal FLOPs | rollout reward at equal FLOPs |" in res.stdout  # one column name for any budget
    for name in ("results.md", "results.json", "heldout_reward_vs_flops.png", "experiment.json", "run.log"):
        assert (d / name).stat().st_size > 0, name
    out = json.loads((d / "results.json").read_text())
    assert out["eval_seeds"] == [100000, 100001] and out["runs"] == 1
    labels = [r["label"] for r in out["rows"]]
    assert labels == ["MPT", "monolithic REINFORCE"]
    mpt, mono = out["trainings"]["MPT"], out["trainings"]["monolithic REINFORCE"]
    assert mono["curve"] and mpt["curve"] and mono["final_eval"]["seeds"] == 2
    # matched compute: the monolithic run stops near the MPT run's training FLOPs
    assert abs(mono["flops"] - mpt["flops"]) < 0.35 * mpt["flops"]
    # the monolithic run: matched SFT, then action (REINFORCE) updates only
    rows = [json.loads(x) for x in (d / "trainings" / "monolithic" / "metrics.jsonl").read_text().splitlines()]
    sft = next(r for r in rows if "sft/loss_Monolithic" in r)
    assert sft["sft/loss_Monolithic"] < sft["sft/first_loss_Monolithic"]
    assert {r["kind"] for r in rows if "kind" in r} == {"action"}
    # `swarm eval` evaluates a monolithic run's checkpoint too
    from swarm_runtime.cli.main import main

    assert main(["eval", str(d / "trainings" / "monolithic"), "eval.runs=1"]) == 0
    assert list((d / "trainings" / "monolithic").glob("eval-iter-*.json"))
    # library versions and commit beside every figure: results.json, results.md, the footer,
    # each training's eval.json and a `swarm eval` file
    from swarm_runtime.runs.provenance import versions

    def libs(v):  # the commit may move (a commit while the tests run), the libraries do not
        assert (v["commit"] is None) == (versions()["commit"] is None)
        return {k: x for k, x in v.items() if k != "commit"}

    assert libs(out["versions"]) == libs(versions()) and out["versions"]["torch"] != "not installed"
    line = f"versions: python {versions()['python']}, torch {versions()['torch']}, "
    assert line in res.stdout and line in (d / "results.md").read_text()
    assert libs(json.loads((d / "trainings" / "mpt" / "eval.json").read_text())["versions"]) == libs(versions())
    ev = next((d / "trainings" / "monolithic").glob("eval-iter-*.json"))
    assert libs(json.loads(ev.read_text())["versions"]) == libs(versions())


def test_heldout_matches_monolithic_sft_in_compute_and_in_data(registry, base, tmp_path):
    out, res = run(registry, "heldout", tmp_path, *base, "experiment.monolithic_sft=[compute,data]")
    labels = [r["label"] for r in res["rows"]]
    assert labels == ["MPT", "monolithic REINFORCE (SFT matched compute)", "monolithic REINFORCE (SFT matched data)"]

    def sft_row(key):
        rows = [json.loads(x) for x in (out / "trainings" / key / "metrics.jsonl").read_text().splitlines()]
        return next(r for r in rows if "sft/steps_Monolithic" in r)

    compute, data = sft_row("monolithic"), sft_row("monolithic-data")
    # the same demos: matched data takes the swarm's epochs, matched compute (n_roles + 1) x as many examples
    assert data["sft/examples_Monolithic"] == compute["sft/examples_Monolithic"]
    assert data["sft/steps_Monolithic"] < compute["sft/steps_Monolithic"]


def test_resume_continues_a_killed_training(heldout, registry):
    d, _ = heldout
    mono = d / "trainings" / "monolithic"
    # as if killed after SFT: its cell is missing and its latest checkpoint is the SFT one
    (d / "cells" / "train-monolithic.json").unlink()
    (mono / "checkpoints" / "latest").write_text("sft")
    pm, reg = registry
    run_experiment("heldout", ["resume=true", f"run_dir={d}"], pm, reg)
    log = (d / "run.log").read_text().split("(resuming)")[-1]
    assert "cell train-mpt: done before, skipped" in log and "resuming from sft" in log
    rows = [json.loads(x) for x in (mono / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "kind" in r]
    assert steps == list(range(1, len(steps) + 1))  # RL rows rewritten once, no duplicates
    assert json.loads((d / "results.json").read_text())["rows"][1]["label"] == "monolithic REINFORCE"


def test_unknown_experiment_exits_2_listing_valid_ones(tmp_path):
    res = swarm("experiment", "nosuch", "domain=minecraft", cwd=tmp_path)
    assert res.returncode == 2 and "unknown experiment 'nosuch'" in res.stderr
    assert "heldout" in res.stderr and "participation" in res.stderr


def test_list(capsys):
    from swarm_runtime.cli.main import main

    assert main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out
    for name in (
        "heldout",
        "coordination",
        "bid_action_ablation",
        "credit_ablation",
        "population",
        "dropout",
        "transfer",
        "participation",
        "arms",
    ):
        assert f"{name}:" in out


def test_coordination_and_resume(registry, tmp_path, base):
    out, res = run(registry, "coordination", tmp_path, *base)
    assert [r["label"] for r in res["rows"]] == ["auction", "graph_of_agents", "round_robin", "agentnet"]
    assert (out / "coordination.png").stat().st_size > 0
    cells = sorted(p.name for p in (out / "cells").iterdir())
    assert cells == sorted(f"coordination-{c}.json" for c in ("auction", "graph_of_agents", "round_robin", "agentnet"))
    # a killed run: one cell and the results are missing; resume=true recomputes only that cell
    (out / "cells" / "coordination-agentnet.json").unlink()
    (out / "results.json").unlink()
    kept = (out / "cells" / "coordination-auction.json").read_text()
    pm, reg = registry
    import torch

    machine = []
    if not torch.cuda.is_available():  # as if started on a GPU machine: resumed here by naming hardware=cpu
        saved = json.loads((out / "experiment.json").read_text())
        (out / "experiment.json").write_text(json.dumps({**saved, "args": saved["args"] + ["hardware=h200"]}))
        with pytest.raises(ConfigError, match="use hardware=cpu"):
            run_experiment("coordination", ["resume=true", f"run_dir={out}"], pm, reg)
        machine = ["hardware=cpu"]
    run_experiment("coordination", ["resume=true", f"run_dir={out}", *machine], pm, reg)
    assert (out / "cells" / "coordination-agentnet.json").exists()
    assert (out / "cells" / "coordination-auction.json").read_text() == kept
    again = json.loads((out / "results.json").read_text())
    assert again["rows"][0] == res["rows"][0] and len(again["rows"]) == 4
    log = (out / "run.log").read_text()
    assert "cell coordination-auction: done before, skipped" in log
    assert "cell coordination-agentnet: running" in log.split("(resuming)")[-1]


def test_bid_action_ablation(registry, tmp_path, base):
    out, res = run(registry, "bid_action_ablation", tmp_path, *base)
    assert [r["label"] for r in res["rows"]] == [
        "trained bids x trained actions",
        "initial bids x trained actions",
        "trained bids x initial actions",
        "initial bids x initial actions",
    ]
    assert (out / "bid_action_ablation.png").exists()


def test_population_pass_at_k(registry, tmp_path, base):
    out, res = run(registry, "population", tmp_path, *base, "experiment.replicas=[1,4]")
    assert res["runs"] == 3  # eval.runs=1 raised to k=3
    big = res["cells"]["12 agents (4 per role)"]
    assert len(big["agents"]) == 12 and big["runs"] == 3
    assert set(big["pass_at_k"]) == {"log", "planks", "stick", "crafting_table", "wooden_pickaxe"}
    assert all(0.0 <= v[0] <= 1.0 for v in big["pass_at_k"].values())
    assert (out / "population.png").exists()


def test_dropout_per_episode(registry, tmp_path, base):
    out, res = run(
        registry, "dropout", tmp_path, *base, "experiment.dropout_p=[0,0.9]", "experiment.dropout_per=episode"
    )
    labels = [r["label"] for r in res["rows"]]
    assert labels == ["3 agents, p=0", "3 agents, p=0.9", "12 agents, p=0", "12 agents, p=0.9"]
    skipped = {r["label"]: r["skipped turns / episode"] for r in res["rows"]}
    assert skipped["3 agents, p=0"] == 0 and skipped["3 agents, p=0.9"] > 0  # everyone absent -> skipped turns
    assert res["per"] == "episode" and (out / "dropout.png").exists()
    with pytest.raises(ConfigError, match="turn"):
        run(registry, "dropout", tmp_path / "bad", *base, "experiment.dropout_per=week")


def test_participation(registry, tmp_path, base):
    out, res = run(registry, "participation", tmp_path, *base)
    series = res["cells"]["after MPT"]["participation"]
    assert set(series) == {"Logger", "Miner", "Smith", "skipped"} and len(series["Logger"]) == 12
    assert abs(sum(v[0] for v in series.values()) - 1.0) < 1e-9
    assert (out / "participation.png").exists() and "by decision index" in (out / "results.md").read_text()


def test_credit_ablation(registry, tmp_path, base):
    out, res = run(registry, "credit_ablation", tmp_path, *base)
    assert [r["label"] for r in res["rows"]] == ["MPT (bucket brigade)", "random-bid credit", "round-robin"]
    from omegaconf import OmegaConf

    rr = OmegaConf.load(out / "trainings" / "round_robin_rtg" / "config.yaml")
    # round-robin is trained as a round-robin MARL baseline: REINFORCE on reward-to-go, not myopic credit
    assert rr.algo.coordinator == "round_robin" and rr.algo.bid_steps == 0 and rr.algo.credit == "reward_to_go"
    assert OmegaConf.load(out / "trainings" / "random_bids" / "config.yaml").algo.credit == "random_bids"
    assert (out / "trainings" / "random_bids" / "metrics.jsonl").exists()
    assert (out / "credit_reward_vs_flops.png").exists()


def test_arms_mpt_monolithic_round_robin_and_sft_only(registry, tmp_path, base):
    from omegaconf import OmegaConf

    out, res = run(registry, "arms", tmp_path, *base, "experiment.sft_eval=true")
    assert [r["label"] for r in res["rows"]] == ["MPT", "monolithic REINFORCE", "round-robin"]
    assert all("after SFT only" in r for r in res["rows"][1:])  # the SFT-only arm: each training's SFT checkpoint
    mono = OmegaConf.load(out / "trainings" / "monolithic" / "config.yaml")
    assert mono.algo.name == "monolithic" and (mono.model.adapter or "none") == "none"
    rr = OmegaConf.load(out / "trainings" / "round_robin_rtg" / "config.yaml")
    assert rr.algo.coordinator == "round_robin" and rr.algo.credit == "reward_to_go"
    assert (out / "arms_reward_vs_flops.png").exists()


def test_arms_on_a_lora_swarm_fine_tunes_the_whole_base_for_the_monolithic_arm(monkeypatch):
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from swarm_runtime.experiments import compare

    trained = {}
    x = SimpleNamespace(
        cfg=OmegaConf.create({"model": {"adapter": "lora"}}),
        plan=lambda n: None,
        swarm_summary=lambda: {"flops": 1.0},
        train=lambda key, extra, budget: trained.setdefault(key, list(extra)),
    )
    monkeypatch.setattr(compare, "_matched_report", lambda x, title, runs, plot, notes: (list(runs), notes))
    labels, notes = compare.arms(x)
    assert labels == ["MPT", "monolithic REINFORCE", "round-robin"]
    assert trained["monolithic"] == ["algo=monolithic", "model.adapter=none"] and "whole base" in notes[0]
    assert "model.adapter=none" not in trained["round_robin_rtg"]  # the round-robin swarm keeps its adapters


def test_transfer_needs_tasks_then_adapts(registry, tmp_path, base):
    with pytest.raises(ConfigError, match="experiment.transfer_tasks is empty"):
        run(registry, "transfer", tmp_path / "none", *base)
    with pytest.raises(ConfigError, match="unknown transfer task"):
        run(registry, "transfer", tmp_path / "bad", *base, "experiment.transfer_tasks=[nosuch]")
    out, res = run(
        registry, "transfer", tmp_path, *base, "experiment.transfer_tasks=[torch]", "experiment.transfer_iterations=1"
    )
    assert [r["label"] for r in res["rows"]] == ["torch: MPT swarm", "torch: monolithic REINFORCE"]
    sw = res["tasks"]["torch"]["MPT"]
    assert sw["final_eval"]["seeds"] == 2 and sw["flops_by_category"]["sft"] == 0  # adapted, no SFT counted
    state = json.loads((out / "trainings" / "torch-mpt" / "checkpoints" / "sft" / "state.json").read_text())
    assert state["initialised_from"].endswith("agents")


def greedy(x):
    """Held-out reward of the trained swarm at temperature 0."""
    from swarm_runtime.experiments.context import Report

    x.plan(2)
    run = x.trained_swarm()
    x.cfg.eval.temperature = 0.0
    cell = x.evaluate("greedy", lambda: x.load_swarm(run))
    s = cell["summary"]
    return Report("Greedy decoding", [{"label": "greedy", "reward": (s["reward_mean"], s["reward_se"])}])


def test_third_party_experiment_of_the_docs(tmp_path, base):
    import swarm_runtime
    from swarm_runtime.plugins.manager import build_registry, make_plugin_manager

    class GreedyPlugin:
        @swarm_runtime.hookimpl
        def swarm_register_experiments(self, register):
            register("greedy", greedy)

    pm = make_plugin_manager(extra_plugins=[(GreedyPlugin(), "greedy_plugin")])
    reg = build_registry(pm)
    assert "experiment:greedy" in reg.provenance["greedy_plugin"]
    out, res = run((pm, reg), "greedy", tmp_path, *base)
    assert res["rows"][0]["label"] == "greedy" and (out / "cells" / "greedy.json").exists()


# ---------------------------------------------------------------------- replication over training seeds
def test_coordination_over_training_seeds_with_paired_differences(registry, tmp_path):
    """Two training seeds run side by side (experiment.parallel=2, each seed a `swarm experiment` process of its own):
    the same cells as one seed run in this process, then combined as always."""
    args = ("experiment.coordinators=[auction,round_robin]",)
    out, res = run(registry, "coordination", tmp_path, "experiment.train_seeds=[0,1]", "experiment.parallel=2", *args)
    alone, _ = run(registry, "coordination", tmp_path / "alone", "experiment.train_seeds=[1]", *args)
    for cell in ("train-mpt", "coordination-auction", "coordination-round_robin"):
        a, b = ({**json.loads((d / "seed-1/cells" / f"{cell}.json").read_text()), "wall_s": 0} for d in (out, alone))
        assert json.dumps(a).replace(str(out), "X") == json.dumps(b).replace(str(alone), "X"), cell
    assert (out / "seed-0" / "experiment.out").exists() and "training seed 1 started" in (out / "run.log").read_text()
    assert res["train_seeds"] == [0, 1]
    for s in (0, 1):  # every arm trained and evaluated per training seed, in its own folder
        saved = json.loads((out / f"seed-{s}" / "cells" / "train-mpt.json").read_text())
        assert saved["run_dir"].endswith(f"seed-{s}/trainings/mpt")
        from omegaconf import OmegaConf

        assert OmegaConf.load(out / f"seed-{s}" / "trainings" / "mpt" / "config.yaml").seed == s
    per = {s: {r["label"]: r["held-out reward"] for r in res["per_seed"][str(s)]["rows"]} for s in ("0", "1")}
    auction = [per[s]["auction"][0] for s in ("0", "1")]
    rr = [per[s]["round_robin"][0] for s in ("0", "1")]
    row = {r["label"]: r for r in res["rows"]}
    # mean over training seeds, SE over training seeds (sd / sqrt(2) = |a - b| / 2)
    assert row["auction"]["held-out reward"][0] == pytest.approx(sum(auction) / 2)
    assert row["auction"]["held-out reward"][1] == pytest.approx(abs(auction[0] - auction[1]) / 2)
    assert row["auction"]["training seeds"] == 2
    d = [r - a for r, a in zip(rr, auction)]
    p = res["paired"]["round_robin"]
    assert p["mean"] == pytest.approx(sum(d) / 2) and p["se"] == pytest.approx(abs(d[0] - d[1]) / 2) and p["n"] == 2
    md = (out / "results.md").read_text()
    assert "training seeds [0, 1]" in md and "Paired differences against auction" in md
    assert "Per training seed: held-out reward" in md and "seed-0/coordination.png" in md
    assert res["commit"] and res["eval_split"] == "eval"
    # every row of the markdown table has as many cells as its header (per-seed texts joined without "|")
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| label |"))
    table = lines[start : lines.index("", start)]
    assert len({ln.count("|") for ln in table}) == 1, table


def test_one_training_seed_pairs_over_heldout_seeds(registry, tmp_path, base):
    _, res = run(
        registry,
        "coordination",
        tmp_path,
        "experiment.train_seeds=[0]",
        *base,
        "experiment.coordinators=[auction,round_robin]",
    )
    p = res["paired"]["round_robin"]
    assert p["n"] == 2 and "held-out seeds" in p["how"]  # eval.episodes=2 shared held-out seeds
    sr = res["per_seed"]["0"]["seed_rewards"]
    assert p["mean"] == pytest.approx(sum(sr["round_robin"][k] - sr["auction"][k] for k in sr["auction"]) / 2)


def test_base_must_give_one_swarm_per_training_seed(registry, tmp_path, base):
    with pytest.raises(ConfigError, match=r"1 run folder\(s\) but experiment.train_seeds has 3 seed\(s\)"):
        run(registry, "coordination", tmp_path / "a", "experiment.train_seeds=[0,1,2]", *base)
    with pytest.raises(ConfigError, match="was trained with seed 0, but it stands for training seed 1"):
        run(registry, "coordination", tmp_path / "b", "experiment.train_seeds=[1]", *base)


@pytest.mark.parametrize(
    "arg,match",
    [
        ("experiment.train_seeds=[0,0]", "distinct non-negative"),
        (
            "experiment.train_seeds=[-1]",
            "experiment.train_seeds=[-1] is not valid: must be a non-empty list, each item an integer in [0,",
        ),
        ("eval.split=test", "eval.split='test' is not valid: must be one of eval, dev"),
    ],
)
def test_bad_train_seeds_and_split_are_refused(registry, tmp_path, arg, match):
    pm, reg = registry
    with pytest.raises(ConfigError, match=re.escape(match)):
        run_experiment("coordination", [arg, f"run_dir={tmp_path / 'x'}"], pm, reg)
    assert not (tmp_path / "x").exists()


def test_bad_train_seeds_exit_2_on_the_cli(tmp_path):
    res = swarm("experiment", "coordination", "experiment.train_seeds=[0,0]", f"run_dir={tmp_path / 'x'}", cwd=tmp_path)
    assert res.returncode == 2 and "distinct non-negative" in res.stderr and "Traceback" not in res.stderr


def test_notes_of_several_training_seeds_say_which_seed_wrote_a_per_seed_note():
    from swarm_runtime.experiments.replicate import seed_notes

    notes = seed_notes(
        {
            0: ["T_max 25", "team 2: useful work 0.65"],
            1: ["T_max 25", "team 2: useful work 0.63"],
            2: ["T_max 25", "team 2: useful work 0.65"],
        }
    )
    assert notes == [
        "T_max 25",
        "training seeds 0, 2: team 2: useful work 0.65",
        "training seed 1: team 2: useful work 0.63",
    ]
    assert seed_notes({3: ["a", "b"]}) == ["a", "b"]


# ---------------------------------------------------------------------- experiment.parallel
def test_parallel_seed_commands_share_the_threads_and_resume_a_started_seed(tmp_path):
    from swarm_runtime.experiments.parallel import seed_command, threads_each

    assert threads_each(0, 2) == max(1, (__import__("os").cpu_count() or 1) // 2)
    assert threads_each(8, 3) == 2 and threads_each(1, 4) == 1
    given = ["domain=minecraft", "seed=7", "hardware.threads=8", "experiment.parallel=2", "base=/x", "progress=true"]
    cmd = seed_command("arms", given, 1, "/runs/b1", tmp_path, 4)
    assert cmd[2:5] == ["swarm_runtime.cli.main", "experiment", "arms"] and "domain=minecraft" in cmd
    for dropped in ("seed=7", "hardware.threads=8", "experiment.parallel=2", "base=/x", "progress=true"):
        assert dropped not in cmd
    for own in ("seed=1", "experiment.train_seeds=null", "hardware.threads=4", "experiment.base=/runs/b1"):
        assert own in cmd
    assert cmd[-1] == f"run_dir={tmp_path}"  # a first start
    (tmp_path / "experiment.json").write_text("{}")
    assert seed_command("arms", given, 1, None, tmp_path, 4)[-1] == "resume=true"  # started before: resumed


def test_a_failed_seed_process_is_named_after_the_others_finish(tmp_path, monkeypatch):
    import sys
    from types import SimpleNamespace

    from swarm_runtime.experiments import parallel

    def fake(name, args, seed, base, sub, threads):
        if seed == 1:
            return [sys.executable, "-c", "print('swarm: error: the disk is full'); raise SystemExit(2)"]
        return [
            sys.executable,
            "-c",
            f"import pathlib, time; time.sleep(0.5); pathlib.Path({str(sub)!r}, 'results.json').write_text('{{}}')",
        ]

    monkeypatch.setattr(parallel, "seed_command", fake)
    (tmp_path / "seed-2").mkdir()
    (tmp_path / "seed-2" / "results.json").write_text("{}")  # finished before: not started again
    x = SimpleNamespace(name="arms", run_dir=tmp_path, args=[], xcfg=SimpleNamespace(parallel=2),
                        cfg=SimpleNamespace(hardware=SimpleNamespace(threads=2)))  # fmt: skip
    with pytest.raises(RuntimeError) as err:
        parallel.run_seeds_apart(x, [0, 1, 2, 3], [None] * 4)
    msg = str(err.value)
    assert "training seed 1 (exit 2" in msg and "the disk is full" in msg and "resume=true" in msg, msg
    assert "seed 0" not in msg and "seed 3" not in msg
    assert all((tmp_path / f"seed-{s}" / "results.json").exists() for s in (0, 3))  # the others ran to the end
    assert not (tmp_path / "seed-2" / "experiment.out").exists()


def test_sigterm_stops_the_seed_processes_and_names_the_resume(tmp_path):
    """SIGTERM to `swarm experiment ... experiment.parallel=2` while its seeds train: every seed process stops too, and
    the one line names the experiment and its folder."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "x"
    args = [*SMOKE, "experiment.train_seeds=[0,1]", "experiment.parallel=2", "experiment.coordinators=[auction]"]
    cmd = [sys.executable, "-m", "swarm_runtime.cli.main", "experiment", "coordination", *args, f"run_dir={out}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob("seed-*/trainings/mpt/checkpoints/sft")) and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the experiment ended before its first SFT checkpoint"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"swarm: stopped by SIGTERM; continue with: swarm experiment coordination resume=true run_dir={out}"
    )
    pids = [int(p) for p in re.findall(r"started \(pid (\d+),", err)]
    assert len(pids) == 2
    for pid in pids:  # each seed's process stopped with it (its own resume line in its output)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not (out / "results.json").exists()
