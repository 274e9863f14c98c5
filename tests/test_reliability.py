"""Run folders that cannot be poisoned, lost or silently misconfigured: a kill at every
checkpoint file operation resumes to the uninterrupted run; planted pickles never run; a run folder
is locked; corrupted files are named; secrets given on the command line are written nowhere."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, swarm

#: The smallest real run: SFT, the SFT evaluation, one RL update, the final evaluation; a checkpoint
#: at every step and one kept, so the sweep meets every kind of checkpoint file operation (write,
#: replace-aside, rename-in, move `latest`, delete the old copy, prune).
KILL_RUN = [
    "domain=minecraft",
    "task=wooden_pickaxe",
    "task.max_decisions=6",
    "algo.iterations=1",
    "algo.envs_per_step=2",
    "checkpoint_every=1",
    "keep_checkpoints=1",
    "eval.episodes=1",
    "eval.runs=1",
    "algo.sft.demo_episodes=1",
    "algo.sft.epochs=1",
    "algo.action_steps=1",
    "algo.bid_steps=1",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=1",
    "hardware.threads=1",
    "progress=false",
    "tensorboard=false",
]


def _rows(run: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(ln).items() if not k.startswith("time/")}
        for ln in (run / "metrics.jsonl").read_text().splitlines()
    ]


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    return {p.parent.name: load_file(p) for p in sorted((ckpt / "agents").glob("*/model.safetensors"))}


def _results(run: Path) -> dict:
    return json.loads((run / "eval.json").read_text())["results"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    work = tmp_path_factory.mktemp("sweep")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "forkcli.py"), "sweep", str(work), *KILL_RUN],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return work, json.loads((work / "sweep.json").read_text())


def test_a_kill_at_every_checkpoint_file_operation_resumes_to_the_uninterrupted_run(sweep):
    work, out = sweep
    ref = work / "ref"
    assert out["ref"] == 0 and out["ops"] >= 15, out
    rows, weights, results = _rows(ref), _weights(ref), _results(ref)
    assert [r["step"] for r in rows if "kind" in r] == [1]
    # every operation's crash state (the run folder as a SIGKILL there leaves it, tests/forkcli.py _snapshot), and a
    # real SIGKILL of the CLI at the first operation
    assert sorted(map(int, out["cases"])) == list(range(1, out["ops"] + 1))
    assert list(out["real"]) == ["1"]
    cases = [(f"kill-{n}", f"resume-{n}", -9, resumed) for n, resumed in out["cases"].items()]
    cases += [(f"real-{n}", f"resume-real-{n}", *codes) for n, codes in out["real"].items()]
    for n, resume_log, killed, resumed in cases:
        run = work / n
        assert killed == -9, (n, (work / f"{n}.log").read_text()[-2000:])
        assert resumed == 0, (n, (work / f"{resume_log}.log").read_text()[-2000:])
        assert _rows(run) == rows, n  # every row exactly once, with the same numbers
        got = _weights(run)
        assert got.keys() == weights.keys()
        assert all(torch.equal(got[r][k], weights[r][k]) for r in weights for k in weights[r]), n
        assert _results(run) == results, n
        assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")], n


class Payload:
    """Unpickling this runs ``touch MARKER``: what a planted checkpoint file would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(path: Path, marker: Path) -> None:
    torch.save({"policy_rng": torch.zeros(3), "evil": Payload(marker)}, path)


def _copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst)
    cfg = dst / "config.yaml"
    cfg.write_text(cfg.read_text().replace(f"run_dir: {run}\n", f"run_dir: {dst}\n"))
    return dst


def _one_line_error(res, *needles):
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, err[-2000:])
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("swarm:")]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0], err  # log lines, then one error line
    err = errors[0]
    for n in needles:
        assert n in err, (n, err)
    return err


def test_planted_pickles_do_not_run_on_resume_or_eval(sweep, tmp_path, warm_swarm):
    """A pickle payload in any checkpoint file (optimizer state, RNG state, model weights) is refused
    with a message naming the file, and never runs (the resumes through the warm CLI, the eval cold)."""
    ref = sweep[0] / "ref"
    marker = tmp_path / "PWNED"
    cases = []
    for i, rel in enumerate(["agents/Logger/training_state.pt", "rng.pt"]):
        run = _copy(ref, tmp_path / f"p{i}")
        latest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
        state = json.loads((latest / "state.json").read_text())
        state["phase"] = "rl"  # so that resuming loads the optimizer and RNG state
        (latest / "state.json").write_text(json.dumps(state))
        _plant(latest / rel, marker)
        cases.append((["run", "resume=true", f"run_dir={run}", "algo.iterations=2"], rel.rsplit("/", 1)[-1]))
    run = _copy(ref, tmp_path / "w")
    agent = run / "checkpoints" / "sft" / "agents" / "Miner"
    (agent / "model.safetensors").unlink()
    _plant(agent / "pytorch_model.bin", marker)
    cases.append((["eval", str(run), "checkpoint=sft"], "sft/agents"))
    for args, needle in cases:
        res = (swarm if args[0] == "eval" else warm_swarm)(*args, cwd=tmp_path)
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert needle in res.stderr, res.stderr
        assert not marker.exists(), f"the payload ran on swarm {' '.join(args)}"


def test_corrupted_run_files_are_named(sweep, tmp_path, warm_swarm):
    """Truncated or random checkpoint files, a cut metrics line, a garbage or escaping ``latest``,
    a garbage ``state.json``, a truncated config.yaml: exit 2, one line naming the file (the resumes
    through the warm CLI, the first one and the eval cold)."""
    ref = sweep[0] / "ref"
    tag = (ref / "checkpoints" / "latest").read_text().strip()

    def case(name, damage):
        run = _copy(ref, tmp_path / name)
        damage(run, run / "checkpoints" / tag)
        return run

    def cut(path: Path, keep: float):
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * keep)])

    runs = {
        "latest-garbage": (
            case("lg", lambda r, c: (r / "checkpoints" / "latest").write_bytes(b"\x00\xffzz/..")),
            "latest",
        ),
        "latest-outside": (case("lo", lambda r, c: (r / "checkpoints" / "latest").write_text("../../..")), "latest"),
        "state-garbage": (case("sg", lambda r, c: (c / "state.json").write_text("{nope")), "state.json"),
        "config-cut": (case("cc", lambda r, c: cut(r / "config.yaml", 0.5)), "config.yaml"),
        "rng-cut": (case("rc", lambda r, c: (cut(c / "rng.pt", 0.5), _set_phase(c, "rl"))), "rng.pt"),
        "weights-cut": (
            case("wr", lambda r, c: cut(c / "agents" / "Smith" / "model.safetensors", 0.3)),
            f"{tag}/agents",
        ),
    }
    for i, (run, needle) in enumerate(runs.values()):
        args = ["run", "resume=true", f"run_dir={run}", "algo.iterations=2"]
        _one_line_error((warm_swarm if i else swarm)(*args, cwd=tmp_path), needle)
    run = case(
        "mc", lambda r, c: (r / "metrics.jsonl").write_text('{"step": 0, "a"\n' + (r / "metrics.jsonl").read_text())
    )
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.runs.outputs import read_metrics

    with pytest.raises(ConfigError, match="metrics.jsonl line 1"):
        read_metrics(run)
    weights = case("wt", lambda r, c: cut(c / "agents" / "Smith" / "model.safetensors", 0.3))
    _one_line_error(swarm("eval", str(weights), cwd=tmp_path), f"{tag}/agents")


def _set_phase(ckpt: Path, phase: str) -> None:
    state = json.loads((ckpt / "state.json").read_text())
    state["phase"] = phase
    (ckpt / "state.json").write_text(json.dumps(state))


def test_a_locked_run_folder_refuses_a_second_run_naming_the_first(sweep, tmp_path, warm_swarm):
    """While a run holds its folder, a second ``swarm run`` on it exits 2 naming the holder's pid;
    once the holder is killed (-9), its stale lock is taken over. A fresh run into a folder that
    holds a finished run is refused unless ``overwrite=true``."""
    from swarm_runtime.runs.runlock import RunLock

    run = _copy(sweep[0] / "ref", tmp_path / "locked")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from swarm_runtime.runs.runlock import RunLock; "
            f"RunLock(Path({str(run)!r}), 'run').acquire(); print('locked', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        res = warm_swarm("run", "resume=true", f"run_dir={run}", "algo.iterations=2", cwd=tmp_path)
        _one_line_error(res, f"pid {holder.pid}", "in use")
        res = warm_swarm("eval", str(run), cwd=tmp_path)
        _one_line_error(res, f"pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(run, "test").acquire()  # stale (its holder is dead): taken over
    assert json.loads((run / ".lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (run / ".lock").exists()
    res = swarm("run", *KILL_RUN, f"run_dir={run}", cwd=tmp_path)
    _one_line_error(res, "already holds a run", "overwrite=true")


def test_secrets_given_on_the_command_line_are_written_nowhere(tmp_path):
    """``task.llm_judge.api_key=...`` is used but redacted from config.yaml, logs, ``swarm config``
    and eval file names; a saved ``<redacted>`` reads back as null (the environment's key)."""
    secret = "sk-TESTSECRET-0123456789"
    args = ["domain=openresearcher", "task=embedded", f"task.llm_judge.api_key={secret}"]
    res = swarm("config", *args, cwd=tmp_path)
    assert res.returncode == 0 and secret not in res.stdout + res.stderr and "<redacted>" in res.stdout
    res = swarm("run", *args, "algo.nosuch=1", cwd=tmp_path)
    assert res.returncode == 2 and secret not in res.stderr
    run = tmp_path / "run"
    tiny = [
        "task.max_decisions=3",
        "algo.iterations=1",
        "algo.envs_per_step=1",
        "eval.episodes=1",
        "eval.runs=1",
        "algo.sft.demo_episodes=1",
        "algo.sft.epochs=1",
        "algo.sft.action_epochs=1",
        "model.hidden_size=32",
        "model.intermediate_size=64",
        "model.num_layers=1",
        "progress=false",
        "tensorboard=false",
        f"task.search.cache_dir={tmp_path / 'bm25'}",
        "hardware.threads=1",
    ]
    res = swarm("run", *args, *tiny, f"run_dir={run}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    res2 = swarm("eval", str(run), "checkpoint=sft", f"task.llm_judge.api_key={secret}", cwd=tmp_path)
    assert res2.returncode == 0, res2.stderr[-2000:]
    for out in (res, res2):
        assert secret not in out.stdout + out.stderr
    for p in tmp_path.rglob("*"):
        assert secret not in str(p)
        if p.is_file():
            assert secret.encode() not in p.read_bytes(), p
    assert list(run.glob("eval-sft--*redacted*.json"))
    from swarm_runtime.cli.eval import eval_file_name

    name = eval_file_name("iter-000002", [f"task.llm_judge.api_key={secret}", "eval.runs=2"])
    assert secret not in name and "redacted" in name
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import load_saved, resolve
    from swarm_runtime.config.secrets import save_config
    from swarm_runtime.plugins.manager import get_registry

    _, reg = get_registry()
    cfg = resolve(args, reg)
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert secret not in text and "api_key: <redacted>" in text
    assert load_saved(tmp_path / "config.yaml", reg).task.llm_judge.api_key is None
    assert OmegaConf.select(cfg, "task.llm_judge.api_key") == secret  # the running process keeps it


def test_parse_bid_is_strict():
    from swarm_runtime.models.transformers_backend import parse_bid

    levels = [0.0, 0.2, 0.4, 0.6, 0.8]
    for text in ["-0.5", "5.0.3", "0,5", "NaN", "nan", "5.0", "0.5", "1", "1e-3", "v0.4", "<bid_0.4.3>", "", "bid"]:
        assert parse_bid(text, levels) == (0.0, False), text
    for text, level in [("0.4", 0.4), ("<bid_0.8>", 0.8), ("my bid is 0.6.", 0.6), (".2", 0.2), ("0", 0.0)]:
        assert parse_bid(text, levels) == (level, True), text


def test_a_backend_bid_that_is_not_a_level_is_unparsed_not_a_crash():
    from swarm_runtime.core.turn import checked_bid

    levels = [0.0, 0.2, 0.4, 0.6, 0.8]
    for bad in [float("nan"), 5.0, -0.5, 0.5, "0.4", None, True]:
        assert checked_bid(bad, True, levels) == (0.0, False), bad
    assert checked_bid(0.4, True, levels) == (0.4, True)
    assert checked_bid(0.0, False, levels) == (0.0, False)


def test_listing_commands_survive_a_closed_pipe(tmp_path):
    for cmd in ("domains", "config"):
        res = subprocess.run(
            f"{sys.executable} -m swarm_runtime.cli.main {cmd} | head -1",
            shell=True,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr


def test_a_failed_research_tool_call_is_not_a_valid_action(registry, tmp_path):
    """OpenResearcher: a tool call the browser refuses (a link that is not on the page) is counted
    as invalid, with the browser's error in the next observation."""
    from omegaconf import OmegaConf

    _, reg = registry
    domain = reg.domains["openresearcher"]
    task = domain.task_config("embedded")
    task.pop("overrides", None)
    task.search.cache_dir = str(tmp_path)
    env = domain.make_env(task)
    env.reset(0)
    assert env.step("search kelda", "Searcher").valid
    bad = env.step("open 999", "Opener")
    assert not bad.valid and "tool_error" in bad.info and bad.info["tool_error"] in bad.observation
    assert OmegaConf.is_config(task)


def test_overwrite_deletes_only_the_previous_runs_files(tmp_path):
    """``clear_run`` deletes the names the run folder's manifest lists (what the runtime wrote) and
    refuses, before deleting anything, a folder holding anything else."""
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.runs import runfiles
    from swarm_runtime.runs.folder import check_run_dir, clear_run, holds_run

    run = tmp_path / "run"
    (run / "checkpoints" / "sft").mkdir(parents=True)
    (run / "tb").mkdir()
    runfiles.start(run)
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "run.log",
        "eval.json",
        "eval-sft--eval.runs=2.json",
        "turn_share.png",
        "notes.txt",
    ):
        (run / name).write_text("x")
    for name in (
        "checkpoints",
        "tb",
        "config.yaml",
        "metrics.jsonl",
        "run.log",
        "eval.json",
        "eval-sft--eval.runs=2.json",
        "turn_share.png",
    ):
        runfiles.claim(run / name)
    assert holds_run(run)
    with pytest.raises(ConfigError, match="notes.txt"):
        clear_run(run)
    assert len(list(run.iterdir())) == 10  # nothing deleted
    (run / "notes.txt").unlink()
    clear_run(run)
    assert sorted(p.name for p in run.iterdir()) == [runfiles.MANIFEST] and not holds_run(run)
    (tmp_path / "file").write_text("x")
    for bad, needle in [(tmp_path / "file", "is a file"), (tmp_path / "file" / "sub", "is under")]:
        with pytest.raises(ConfigError, match=needle):
            check_run_dir(bad)
