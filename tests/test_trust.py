"""A run folder, recipe or checkpoint from elsewhere cannot delete a user's files, run code or leak a
key: real run folders trained once (per module, or per session: conftest ``tiny_run``), copied per test, damaged the way a folder
from elsewhere could be, then handed to the real CLI in a subprocess (a cold ``swarm``, or ``warm_swarm``'s child forked from a
warmed interpreter where the test checks what the command does with the folder)."""

import importlib.util
import json
import shutil
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from conftest import TINY_RUN, cli_error, copy_run, heard, loopback_listener, swarm

#: An OpenResearcher run as small as it gets, trained with a secret given as a list (item 7).
RESEARCH = [
    "domain=openresearcher",
    "task=embedded",
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
    "hardware.threads=1",
]
LIST_SECRET = "sk-LISTSECRET-0123456789"


@pytest.fixture(scope="module")
def runs(tiny_run, tmp_path_factory):
    """Three run folders: full copies (minecraft: the session's tiny run, conftest ``tiny_run``), and two
    trained at once here: LoRA adapters, OpenResearcher."""
    d = tmp_path_factory.mktemp("trust")
    copy_run(tiny_run[0], d / "full")
    jobs = {
        "lora": [
            *TINY_RUN,
            "model.adapter=lora",
            "skip_sft_eval=true",
            "tensorboard=false",
            "eval.episodes=1",
            "algo.sft.demo_episodes=1",
            f"run_dir={d / 'lora'}",
        ],
        "research": [
            *RESEARCH,
            f"task.llm_judge.api_key=[{LIST_SECRET}]",
            f"task.search.cache_dir={d / 'bm25'}",
            f"run_dir={d / 'research'}",
        ],
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        done = dict(zip(jobs, pool.map(lambda a: swarm("run", *a, cwd=d, timeout=600), jobs.values())))
    for name, res in done.items():
        assert res.returncode == 0, (name, res.stderr[-3000:])
    return d, done


def _copy(runs, name: str, dst: Path) -> Path:
    shutil.copytree(runs[0] / name, dst, symlinks=True)
    return dst


def _latest(run: Path) -> Path:
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


def _tree(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------- data lost (1-4)
def test_overwrite_deletes_only_what_the_runtime_wrote(runs, tmp_path, warm_swarm):
    """1. A folder of the user's own config.yaml, plots, tb/ and eval file is never emptied: overwrite=true
    refuses it naming the files, and the error without overwrite does not suggest overwrite=true. A run
    folder the runtime wrote lists every file in its manifest, so overwrite empties it exactly; a file the
    user added to it is named and nothing is deleted."""
    from swarm_runtime.runs import runfiles
    from swarm_runtime.runs.folder import clear_run

    mine = tmp_path / "mine"
    (mine / "tb").mkdir(parents=True)
    for name in ("config.yaml", "loss.png", "tb/events", "eval-best.json"):
        (mine / name).write_text(f"the user's {name}")
    before = _tree(mine)
    cli_error(
        swarm("run", *TINY_RUN, f"run_dir={mine}", "overwrite=true", cwd=tmp_path), "config.yaml", "did not write"
    )
    cli_error(
        warm_swarm("run", *TINY_RUN, f"run_dir={mine}", cwd=tmp_path), "already holds a run", absent=("overwrite=true",)
    )
    assert _tree(mine) == before
    (mine / "config.yaml").unlink()  # no run here, but files a run would replace
    cli_error(warm_swarm("run", *TINY_RUN, f"run_dir={mine}", cwd=tmp_path), "eval-best.json", "loss.png")
    assert (mine / "loss.png").read_text() == "the user's loss.png"

    run = _copy(runs, "full", tmp_path / "run")
    assert (run / runfiles.MANIFEST).is_file() and runfiles.foreign(run) == []
    (run / "notes.txt").write_text("mine")
    cli_error(warm_swarm("run", *TINY_RUN, f"run_dir={run}", "overwrite=true", cwd=tmp_path), "notes.txt")
    assert (run / "checkpoints" / "latest").is_file()
    (run / "notes.txt").unlink()
    clear_run(run)
    assert [p.name for p in run.iterdir()] == [runfiles.MANIFEST]


def test_run_control_keys_come_from_the_command_line_only(runs, tmp_path, registry, warm_swarm):
    """2. A recipe that sets overwrite (or resume, run_dir) is refused naming the key and the recipe,
    before the run folder is touched; so is a task file's overrides block; a saved config.yaml's own
    run-control values are not read back."""
    run = _copy(runs, "full", tmp_path / "run")
    before = _tree(run / "checkpoints")
    for key, value in (("overwrite", "true"), ("resume", "true"), ("run_dir", str(tmp_path / "x"))):
        recipe = tmp_path / f"{key}.yaml"
        recipe.write_text(f"domain: minecraft\ntask: wooden_pickaxe\n{key}: {value}\n")
        cli_error(warm_swarm("run", f"recipe={recipe}", *TINY_RUN, f"run_dir={run}", cwd=tmp_path), key, str(recipe))
    assert _tree(run / "checkpoints") == before

    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import load_saved, resolve

    _, reg = registry

    class Planted:  # the minecraft domain, its task file's overrides setting overwrite
        def __init__(self, domain):
            self.d = domain

        def __getattr__(self, name):
            return getattr(self.d, name)

        def task_config(self, name):
            from omegaconf import OmegaConf

            cfg = self.d.task_config(name)
            cfg.overrides = OmegaConf.merge(cfg.get("overrides") or {}, {"overwrite": True})
            return cfg

    fake = type("Reg", (), {"domains": {"minecraft": Planted(reg.domains["minecraft"])}, "light": True})()
    with pytest.raises(ConfigError, match="sets overwrite in its overrides"):
        resolve(["domain=minecraft", "task=wooden_pickaxe"], fake)
    cfg_file = run / "config.yaml"
    cfg_file.write_text(cfg_file.read_text().replace("overwrite: false", "overwrite: true"))
    saved = load_saved(cfg_file, reg)
    assert saved.overwrite is False and saved.resume is False and saved.run_dir == str(run)


def test_no_write_follows_a_link_out_of_the_run_folder(runs, tmp_path, warm_swarm):
    """3. metrics.jsonl linked to a user's file (with metrics_rows 0, so a resume would cut it) or
    run.log linked to one: the resume exits 2 naming the link; the user's file is untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n" * 5)
    cases = []
    for name in ("metrics.jsonl", "run.log"):
        run = _copy(runs, "full", tmp_path / name)
        state = _latest(run) / "state.json"
        state.write_text(json.dumps({**json.loads(state.read_text()), "metrics_rows": 0}))
        (run / name).unlink(missing_ok=True)
        (run / name).symlink_to(victim)
        cases.append((run, name))
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(
                lambda c: warm_swarm("run", "resume=true", f"run_dir={c[0]}", "algo.iterations=3", cwd=tmp_path), cases
            )
        )
    for (_, name), res in zip(cases, results):
        cli_error(res, name, "outside the run folder")
    assert victim.read_text() == "precious\n" * 5


def test_export_never_writes_into_a_checkpoint(runs, tmp_path, warm_swarm):
    """4. out= inside the run's checkpoints (directly or through a link) is refused; the checkpoint's
    models (full copies and adapters) are untouched."""
    for name in ("full", "lora"):
        run = _copy(runs, name, tmp_path / name)
        ckpt = _latest(run)
        before = _tree(ckpt)
        (tmp_path / f"{name}-link").symlink_to(run / "checkpoints")
        outs = [ckpt / "agents"] + ([tmp_path / f"{name}-link" / ckpt.name] if name == "full" else [])
        for out in outs:
            cli_error(
                warm_swarm("export", str(run), f"checkpoint={ckpt.name}", f"out={out}", cwd=tmp_path),
                "never writes into",
            )
        assert _tree(ckpt) == before


# ------------------------------------------------------------------------------- code run, keys (5-7)
def test_a_model_folder_asking_for_custom_code_is_refused(runs, tmp_path):
    """5. An agent folder whose config.json has auto_map and a .py beside it: swarm eval (with a "y"
    waiting on stdin) exits 2 naming the folder and never imports the code."""
    run = _copy(runs, "full", tmp_path / "run")
    agent = _latest(run) / "agents" / "Logger"
    marker = tmp_path / "RAN"
    (agent / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from transformers import Qwen2Config, Qwen2ForCausalLM\n"
        "class EvilConfig(Qwen2Config):\n    model_type = 'qwen2'\n"
        "class EvilModel(Qwen2ForCausalLM):\n    config_class = EvilConfig\n"
    )
    config = json.loads((agent / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (agent / "config.json").write_text(json.dumps(config))
    res = swarm("eval", str(run), cwd=tmp_path, input="y\ny\n", env={"HF_HOME": str(tmp_path / "hf")})
    cli_error(res, "Logger", "auto_map", "custom code")
    assert not marker.exists()


class _Judge(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that records every request's Authorization header."""

    seen: list = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        type(self).seen.append(self.headers.get("authorization"))
        body = json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "correct: yes"}}
                ],
            }
        )
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *a):
        pass


def test_a_judge_endpoint_saved_in_a_run_folder_gets_no_key(runs, tmp_path):
    """6. A run folder whose config.yaml names its own judge base_url: swarm eval with OPENAI_API_KEY in the
    environment exits 2 naming task.llm_judge.base_url and the way on, and the endpoint hears nothing; given on the
    command line, the same endpoint is used."""
    server = HTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    _Judge.seen = []
    try:
        run = _copy(runs, "research", tmp_path / "run")
        text = (run / "config.yaml").read_text()
        assert "  judge: exact\n" in text and "    base_url: null\n" in text
        (run / "config.yaml").write_text(
            text.replace("  judge: exact\n", "  judge: llm\n").replace("    base_url: null\n", f"    base_url: {url}\n")
        )
        env = {"OPENAI_API_KEY": "sk-ENVKEY-0123456789"}
        res = swarm("eval", str(run), "checkpoint=sft", cwd=tmp_path, env=env)
        cli_error(res, "task.llm_judge.base_url", url, "on the command line")
        assert _Judge.seen == []
        res = swarm("eval", str(run), "checkpoint=sft", f"task.llm_judge.base_url={url}", cwd=tmp_path, env=env)
        assert res.returncode == 0, res.stderr[-2000:]
        assert all(h == "Bearer sk-ENVKEY-0123456789" for h in _Judge.seen)
    finally:
        server.shutdown()


def test_a_ray_cluster_saved_in_a_run_folder_is_not_joined(runs, tmp_path, warm_swarm):
    """6b. A run folder whose config.yaml names a Ray head (``cluster.address`` with ``cluster.kind=ray``,
    ``serve.address`` with ``serve.cluster=ray``): swarm eval, swarm run resume=true and swarm serve exit 2
    naming the saved address and both ways on, before anything connects there, and write nothing; told
    ``cluster.kind=local`` (or not joining it), the same folder evaluates."""
    from omegaconf import OmegaConf

    listener, address = loopback_listener()
    try:
        run = _copy(runs, "full", tmp_path / "run")
        cfg = OmegaConf.load(run / "config.yaml")
        cfg.cluster.kind, cfg.cluster.address = "ray", address
        cfg.serve.cluster, cfg.serve.address = "ray", address
        OmegaConf.save(cfg, run / "config.yaml")
        before = _tree(run)
        commands = {
            "cluster.address": [("eval", str(run)), ("run", "resume=true", f"run_dir={run}", "algo.iterations=3")],
            "serve.address": [("serve", str(run))],
        }
        for key, argss in commands.items():
            for args in argss:
                cli_error(
                    warm_swarm(*args, cwd=tmp_path),
                    f"{key}={address!r}",
                    str(run / "config.yaml"),
                    f"give {key}={address} on the command line",
                    f"{key}=null for a local Ray",
                )
        assert not heard(listener)
        assert _tree(run) == before
        res = warm_swarm("eval", str(run), "cluster.kind=local", cwd=tmp_path)  # serve.cluster=ray: eval serves nothing
        assert res.returncode == 0, res.stderr[-2000:]
        assert not heard(listener)
    finally:
        listener.close()


def test_each_command_asks_for_ray_only_where_it_uses_it(runs, tmp_path):
    """Without the ray extra, a run folder saved with ``serve.cluster=ray`` and ``cluster.kind=ray``: swarm eval
    with ``cluster.kind=local`` evaluates (it serves nothing), and swarm serve with ``serve.cluster=local`` goes past
    validation to the checkpoint it is asked for (its gateway steps no env); each still names the extra for the Ray
    it would use."""
    from omegaconf import OmegaConf

    run = _copy(runs, "full", tmp_path / "run")
    cfg = OmegaConf.load(run / "config.yaml")
    cfg.cluster.kind, cfg.serve.cluster = "ray", "ray"
    OmegaConf.save(cfg, run / "config.yaml")
    extra = "needs Ray, which is not installed: pip install 'swarm-runtime[ray]'"
    res = swarm("eval", str(run), "cluster.kind=local", cwd=tmp_path, without_ray=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "saved " in res.stdout
    cli_error(swarm("eval", str(run), cwd=tmp_path, without_ray=True), f"cluster.kind=ray {extra}")
    serve = ("serve", str(run), "checkpoint=nope")  # stops after validation, before a gateway starts
    cli_error(swarm(*serve, "serve.cluster=local", cwd=tmp_path, without_ray=True), "checkpoint 'nope' not found")
    cli_error(swarm(*serve, cwd=tmp_path, without_ray=True), f"serve.cluster=ray {extra}")


def test_without_ray_a_config_that_cannot_run_is_named_before_the_extra(tmp_path):
    """Without the ray extra, a Ray run whose keys cannot go together is refused for them (installing Ray would not
    make it valid), and a valid one for the extra it needs: every cross-key check comes before the Ray check
    (config/validation.py: validate)."""
    bad = ("rollout.max_staleness=1", "cluster.kind=ray", "cluster.samplers=ray")
    res = swarm("run", *TINY_RUN, *bad, f"run_dir={tmp_path / 'a'}", cwd=tmp_path, without_ray=True)
    cli_error(res, "rollout.max_staleness=1 with cluster.samplers=ray and rollout.engine=local")
    res = swarm("run", *TINY_RUN, "cluster.kind=ray", f"run_dir={tmp_path / 'b'}", cwd=tmp_path, without_ray=True)
    cli_error(res, "cluster.kind=ray needs Ray, which is not installed")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.ray
def test_a_ray_head_a_recipe_or_a_run_folder_names_is_joined_only_when_the_command_line_gives_it(tmp_path):
    """6d. A recipe (``recipe=PATH.yaml``) follows a run folder's rule: the ``cluster.address`` it sets is refused
    before anything connects or is written, unless the command line gives it too; then it is joined on a fresh run
    (nothing answers on that port here: the run says so, having tried). The same address saved in the run folder that
    run left is refused on ``resume=true`` without it on the command line, the recipe given again or not."""
    from omegaconf import OmegaConf

    pytest.importorskip("ray")
    with socket.socket() as s:  # a port on loopback where nothing listens
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    recipe = tmp_path / "cluster.yaml"
    recipe.write_text(f"cluster.kind: ray\ncluster.address: {address}\n")
    run, given = tmp_path / "run", f"cluster.address={address}"
    refused = f"recipe {str(recipe)!r} sets cluster.address={address!r}"
    cli_error(swarm("run", f"recipe={recipe}", *TINY_RUN, f"run_dir={run}", cwd=tmp_path), refused)
    assert not run.exists()
    tried = f"cluster.address={address!r}: no Ray cluster answers there"
    cli_error(swarm("run", f"recipe={recipe}", *TINY_RUN, given, f"run_dir={run}", cwd=tmp_path), tried)
    assert OmegaConf.load(run / "config.yaml").cluster.address == address  # saved with the folder
    resume = ("run", "resume=true", f"run_dir={run}")
    cli_error(swarm(*resume, cwd=tmp_path), f"cluster.address={address!r} comes from {run / 'config.yaml'}")
    cli_error(swarm(*resume, f"recipe={recipe}", cwd=tmp_path), refused)
    cli_error(swarm(*resume, given, cwd=tmp_path), tried)


def test_a_saved_ray_head_is_joined_only_when_the_command_line_gives_it(registry, tmp_path):
    """6c. In process: the address given again (as itself or inside its section), or not joined (another kind),
    passes; a resumed experiment whose saved arguments name a Ray head is refused like a run folder."""
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import resolve
    from swarm_runtime.experiments.runner import run_experiment
    from swarm_runtime.runs.folder import refuse_saved_ray_heads

    pm, reg = registry
    cfg = resolve(["cluster.address=10.0.0.9:6379"], reg)
    cfg.cluster.kind = "ray"  # set after validation: the refusal needs no Ray installed
    with pytest.raises(ConfigError, match=r"cluster.address='10.0.0.9:6379' comes from saved.yaml"):
        refuse_saved_ray_heads(cfg, ["cluster.kind", "serve.address"], "saved.yaml")
    refuse_saved_ray_heads(cfg, ["cluster.address"], "saved.yaml")
    refuse_saved_ray_heads(cfg, ["cluster"], "saved.yaml")
    cfg.cluster.kind = "local"  # the address is not used
    refuse_saved_ray_heads(cfg, [], "saved.yaml")
    cfg.serve.cluster, cfg.serve.address = "ray", "10.0.0.9:6379"
    refuse_saved_ray_heads(cfg, [], "saved.yaml")  # swarm run and eval do not join serve.address
    with pytest.raises(ConfigError, match=r"serve.address='10.0.0.9:6379'.*serve.address=null"):
        refuse_saved_ray_heads(cfg, [], "saved.yaml", ("serve.address",))

    folder = tmp_path / "exp"
    folder.mkdir()
    saved = ["domain=minecraft", "task=wooden_pickaxe", "cluster.kind=ray", "cluster.address=10.0.0.9:6379"]
    (folder / "experiment.json").write_text(json.dumps({"experiment": "heldout", "args": saved, "command": "x"}))
    # without Ray the saved arguments are refused sooner, for naming cluster.kind=ray: nothing joins either way
    refused = "comes from .*experiment.json" if importlib.util.find_spec("ray") else "needs Ray, which is not installed"
    with pytest.raises(ConfigError, match=refused):
        run_experiment("heldout", ["resume=true", f"run_dir={folder}"], pm, reg)
    assert sorted(p.name for p in folder.iterdir()) == ["experiment.json"]


def test_secrets_in_lists_and_mappings_are_written_nowhere(runs, tmp_path):
    """7. A secret given as a list (``api_key=[sk-...]``) or a mapping (``={k: sk-...}``, or the key inside
    a mapping given to its section) is redacted whole: not in config.yaml, the log, any file of the run
    folder or ``swarm config``'s output."""
    run = runs[0] / "research"
    assert "api_key: <redacted>" in (run / "config.yaml").read_text()
    for p in run.rglob("*"):
        if p.is_file():
            assert LIST_SECRET.encode() not in p.read_bytes(), p
    assert LIST_SECRET not in runs[1]["research"].stdout + runs[1]["research"].stderr
    secret = "sk-MAPSECRET-0123456789"
    for arg in (f"task.llm_judge.api_key={{k: {secret}}}", f"task.llm_judge={{api_key: [{secret}], model: m}}"):
        res = swarm("config", "domain=openresearcher", "task=embedded", arg, cwd=tmp_path)
        assert res.returncode == 0 and secret not in res.stdout + res.stderr and "<redacted>" in res.stdout, arg


# ----------------------------------------------------------------------------- silent nonsense (8-12)
def test_resume_without_its_config_is_refused(runs, tmp_path):
    """8. config.yaml deleted: resume=true exits 2 naming it, instead of resuming the weights under the
    default config and writing that config as the run's."""
    run = _copy(runs, "full", tmp_path / "run")
    (run / "config.yaml").unlink()
    cli_error(
        swarm("run", "resume=true", f"run_dir={run}", "domain=minecraft", "task=wooden_pickaxe", cwd=tmp_path),
        "config.yaml",
        "is missing",
    )
    assert not (run / "config.yaml").exists()


#: (key, damaged value, what the error names): through the CLI; the rest of the schema in process.
STATE_DAMAGE = [
    ("iteration", -7, "iteration"),
    ("phase", "banana", "phase"),
    ("flops", "lots", "flops"),
    ("metrics_rows", 999, "metrics.jsonl"),
    ("sft_eval", "garbage", "sft_eval"),
]


def test_a_damaged_state_json_is_named_before_anything_resumes(runs, tmp_path, warm_swarm):
    """9. state.json with a negative iteration, an unknown phase, or corrupt flops, metrics_rows (more rows
    than metrics.jsonl holds) or sft_eval: exit 2 naming the file and the key, nothing rewritten; the same
    schema refuses an iteration that is not the checkpoint's, infinite FLOPs, a metrics_rows of another type,
    a final_eval without a finite reward."""
    from swarm_runtime.runs.checkpoint import state_problem

    cases = []
    for i, (key, value, needle) in enumerate(STATE_DAMAGE):
        run = _copy(runs, "full", tmp_path / f"s{i}")
        state = _latest(run) / "state.json"
        state.write_text(json.dumps({**json.loads(state.read_text()), key: value}))
        cases.append((run, needle, (run / "metrics.jsonl").read_bytes()))
    with ThreadPoolExecutor(3) as pool:
        results = list(
            pool.map(
                lambda c: warm_swarm("run", "resume=true", f"run_dir={c[0]}", "algo.iterations=3", cwd=tmp_path), cases
            )
        )
    for (run, needle, metrics), res in zip(cases, results):
        cli_error(res, needle, "metrics.jsonl" if needle == "metrics.jsonl" else "state.json")
        assert (run / "metrics.jsonl").read_bytes() == metrics
    good = json.loads((_latest(runs[0] / "full") / "state.json").read_text())
    assert state_problem(good, _latest(runs[0] / "full").name) == ""
    for key, value, tag, needle in [
        ("iteration", 5, "iter-000002", "iteration 5"),
        ("flops", {"sft": 1e400}, "", "flops"),
        ("metrics_rows", "7", "", "metrics_rows"),
        ("final_eval", {"reward_mean": "high"}, "", "final_eval.reward_mean"),
        ("phase", "rl", "sft", "checkpoint sft"),
        ("iteration", True, "", "iteration"),
    ]:
        assert needle in state_problem({**good, key: value}, tag), (key, value)


def test_silent_nonsense_is_one_line(runs, tmp_path, warm_swarm):
    """10-11. A recipe that is not YAML, a memory plan of a model.arch with a negative or missing size, an
    adapter checkpoint exported with NaN weights or a tampered base pointer: exit 2, one line naming it."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("domain: [minecraft\n  task: {")
    cli_error(warm_swarm("run", f"recipe={bad}", cwd=tmp_path), str(bad), "not YAML")
    for arch in ("{hidden_size: 64}", "{hidden_size: -64, vocab_size: 100, num_hidden_layers: 2}"):
        cli_error(warm_swarm("config", "model=local", f"model.arch={arch}", "--plan", cwd=tmp_path), "model.arch")

    from safetensors.torch import load_file, save_file

    run = _copy(runs, "lora", tmp_path / "nan")
    f = _latest(run) / "agents" / "Miner" / "adapter_model.safetensors"
    weights = load_file(f)
    first = sorted(weights)[0]
    weights[first][0] = float("nan")
    save_file(weights, str(f), metadata={"format": "pt"})
    cli_error(warm_swarm("export", str(run), cwd=tmp_path), "Miner", "NaN")
    assert not (run / "export" / _latest(run).name / "Miner").exists()
    run = _copy(runs, "lora", tmp_path / "ptr")
    (_latest(run) / "agents" / "Smith" / "swarm_base.json").write_text('{"base": 3')
    cli_error(warm_swarm("export", str(run), cwd=tmp_path), "swarm_base.json")


def test_every_role_base_and_the_latest_pointer_stay_checked(runs, tmp_path, warm_swarm):
    """12. Eval checks every role's base fingerprint (not only the first role's); a ``latest`` linked to a
    file outside the run is refused without echoing it; new runs write the current config_version."""
    from swarm_runtime.config.schema import CONFIG_VERSION

    run = _copy(runs, "lora", tmp_path / "fp")
    ptr_file = _latest(run) / "agents" / "Smith" / "swarm_base.json"
    ptr = json.loads(ptr_file.read_text())
    ptr["fingerprint"] = "0" * 64
    ptr_file.write_text(json.dumps(ptr))
    cli_error(warm_swarm("eval", str(run), cwd=tmp_path), "Smith")

    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-CONTENT-0123456789")
    run = _copy(runs, "full", tmp_path / "latest")
    (run / "checkpoints" / "latest").unlink()
    (run / "checkpoints" / "latest").symlink_to(secret)
    for args in (["eval", str(run)], ["run", "resume=true", f"run_dir={run}", "algo.iterations=3"]):
        line = cli_error(warm_swarm(*args, cwd=tmp_path), "latest", absent=("TOPSECRET",))
        assert "outside the run folder" in line or "link out of the run folder" in line, line
    for name in ("full", "lora", "research"):
        assert f"config_version: {CONFIG_VERSION}\n" in (runs[0] / name / "config.yaml").read_text()


# ------------------------------------------------------------ programs, servers and flags a saved file names (13-17)
def _saved(run: Path, **keys) -> None:
    """Set dotted ``keys`` in ``run``'s config.yaml, as a folder from elsewhere would hold them."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run / "config.yaml")
    for key, value in keys.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, merge=False)
    OmegaConf.save(cfg, run / "config.yaml")


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    """A program a folder could name as its vLLM Python: it leaves a marker, then is a Python without vLLM."""
    marker = tmp_path / "ran"
    script = tmp_path / "planted.sh"
    script.write_text(f'#!/bin/sh\ntouch {marker}\nexec python3 "$@"\n')
    script.chmod(0o755)
    return script, marker


def test_a_program_a_run_folder_or_recipe_names_is_not_run(runs, tmp_path, warm_swarm):
    """13. A copied LoRA run whose config.yaml sets rollout.engine=vllm and rollout.vllm.python to a program: resume=true
    exits 2 naming the key, the program and the file, and the program never runs; so does recipe=<that config.yaml>
    for a fresh run from a recipe file that sets it. Repeated on the command line it is the user's choice: it runs, before anything trains, and is
    named as a Python without vLLM, pointing at `swarm vllm setup`."""
    script, marker = _planted(tmp_path)
    run = _copy(runs, "lora", tmp_path / "run")
    _saved(run, rollout__engine="vllm", rollout__vllm__python=str(script))
    before = _tree(run / "checkpoints")
    resume = ("run", "resume=true", f"run_dir={run}")
    cli_error(warm_swarm(*resume, cwd=tmp_path), "rollout.vllm.python=", str(script), str(run / "config.yaml"))
    planted = tmp_path / "recipe.yaml"
    planted.write_text(f"model.adapter: lora\nrollout:\n  engine: vllm\n  vllm: {{python: {script}}}\n")
    recipe = ("run", f"recipe={planted}", *TINY_RUN, f"run_dir={tmp_path / 'fresh'}")
    cli_error(warm_swarm(*recipe, cwd=tmp_path), str(planted), "rollout.vllm.python=", "on the command line")
    assert not marker.exists() and not (tmp_path / "fresh").exists()
    cli_error(warm_swarm(*resume, f"rollout.vllm.python={script}", cwd=tmp_path), "has no vllm", "swarm vllm setup")
    assert marker.exists() and _tree(run / "checkpoints") == before


def test_server_flags_that_undo_the_guard_are_refused(runs, tmp_path, warm_swarm):
    """14. rollout.vllm.args saved in a run folder are refused as a program is (13); flags that bind the server
    elsewhere, load code or replace its key are refused from anywhere: the command line (any spelling argparse takes),
    a --config file they name, and a VLLMServer made through the library."""
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.sampling.vllm_server import VLLMServer

    run = _copy(runs, "lora", tmp_path / "run")
    _saved(run, rollout__engine="vllm", rollout__vllm__args=["--max-num-seqs", "8"])
    cli_error(warm_swarm("run", "resume=true", f"run_dir={run}", cwd=tmp_path), "rollout.vllm.args=", "config.yaml")
    conf = tmp_path / "vllm.yaml"
    conf.write_text("trust-remote-code: true\n")
    engine = ("config", "rollout.engine=vllm", "model.adapter=lora")
    for args, flag in [
        ("[--trust-remote-code]", "--trust-remote-code"),
        ("[--trust_remote_code]", "--trust_remote_code"),
        ("[--host, 0.0.0.0]", "--host"),
        ("['--middleware=evil.Mw']", "--middleware"),
        ("[--worker-extension-cls, evil.W]", "--worker-extension-cls"),
        ("[--trust-rem]", "--trust-rem"),
        (f"[--config, {conf}]", f"--config {conf}"),
    ]:
        cli_error(warm_swarm(*engine, f"rollout.vllm.args={args}", cwd=tmp_path), "rollout.vllm.args gives", flag)
    res = warm_swarm(*engine, "rollout.vllm.args=[--max-num-seqs, '8', --max-model-len, '512']", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    with pytest.raises(ConfigError, match="--host"):
        VLLMServer("python3", tmp_path, tmp_path / "log", args=["--host=0.0.0.0"])


def test_a_saved_rollout_url_gets_no_prompts(runs, tmp_path, warm_swarm):
    """15. A run folder saved with rollout.engine=openai and its own rollout.url (or rollout.urls.NAME): resume=true
    exits 2 naming it before anything connects; given again on the command line, the run connects (here to a port
    where nothing answers: named before anything trains)."""
    listener, address = loopback_listener()
    url, dead = f"http://{address}", "http://127.0.0.1:9"
    run = _copy(runs, "lora", tmp_path / "run")
    resume = ("run", "resume=true", f"run_dir={run}")
    try:
        _saved(run, rollout__engine="openai", rollout__url=url)
        cli_error(warm_swarm(*resume, cwd=tmp_path), f"rollout.url={url!r}", str(run / "config.yaml"))
        _saved(run, rollout__url=dead, rollout__urls={"big": url})
        cli_error(warm_swarm(*resume, f"rollout.url={dead}", cwd=tmp_path), f"rollout.urls.big={url!r}")
        assert not heard(listener)
    finally:
        listener.close()
    _saved(run, rollout__urls={})
    before = _tree(run / "checkpoints")
    cli_error(warm_swarm(*resume, f"rollout.url={dead}", cwd=tmp_path), f"rollout.url={dead} does not answer")
    assert _tree(run / "checkpoints") == before


def test_a_judge_url_loaded_through_the_library_gets_no_key(runs, tmp_path, monkeypatch):
    """16. A program that loads a run folder's config (load_saved) and makes its judge: the judge's saved base_url
    is not sent OPENAI_API_KEY (the guard sits where the key is attached), until the program trusts it."""
    from swarm_domains.openresearcher.judge import make_judge
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import load_saved
    from swarm_runtime.config.secrets import trust_endpoint

    server = HTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    _Judge.seen = []
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ENVKEY-0123456789")
    try:
        run = _copy(runs, "research", tmp_path / "run")
        _saved(run, task__judge="llm", task__llm_judge__base_url=url)
        cfg = load_saved(run / "config.yaml")
        settings = dict(cfg.task.llm_judge)
        settings.pop("api_key", None)
        with pytest.raises(ConfigError, match="task.llm_judge.base_url"):
            make_judge("llm", None, settings)
        trust_endpoint(url)
        assert make_judge("llm", None, settings).grade("q", "a", "a").correct is not None
        assert _Judge.seen and all(h == "Bearer sk-ENVKEY-0123456789" for h in _Judge.seen)
    finally:
        server.shutdown()


def test_judge_settings_are_bounded_and_a_key_is_no_url(tmp_path, warm_swarm):
    """17. The judge's settings: a key given as base_url is refused without being shown, before any config.yaml is
    written; a base_url that is not http(s), a timeout that is not finite or over an hour, a billion attempts and a
    cache folder nothing can be written into are refused naming the key, with either command that takes them."""
    key = "sk-PASTEDKEY-0123456789abcdef"
    research = ("domain=openresearcher", "task=embedded")
    run = tmp_path / "run"
    res = warm_swarm("run", *RESEARCH, f"task.llm_judge.base_url={key}", f"run_dir={run}", cwd=tmp_path)
    line = cli_error(res, "task.llm_judge.base_url", "looks like an API key", "OPENAI_API_KEY")
    assert key not in res.stdout + res.stderr and not run.exists(), line
    for value, needle in [
        ("base_url=file:///etc/passwd", "'file:///etc/passwd' is not an http(s) URL"),
        ("timeout_s=nan", "timeout_s='nan' is not valid"),
        ("timeout_s=1e9", "timeout_s=1000000000.0 is not valid"),
        ("max_attempts=1000000000", "max_attempts=1000000000 is not valid"),
        ("cache_dir=/proc/nope", "cache_dir='/proc/nope' cannot hold the grade cache"),
    ]:
        res = warm_swarm("config", *research, "judge=llm", f"task.llm_judge.{value}", cwd=tmp_path)
        cli_error(res, needle)
    res = warm_swarm("config", *research, "judge=llm", f"task.llm_judge.cache_dir={tmp_path}/c", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (tmp_path / "c").exists()  # checked, not made


def test_a_judge_that_grades_nothing_stops_the_run(tmp_path, monkeypatch):
    """17b. A judge whose every grade fails (a wrong key: HTTP 401 from the server) stops the run after its first
    three answers, in one line naming the URL, the last error and what to check; one that grades some is warned of
    at the end (swarm run, swarm eval: cli/common.py check_graded), and one that grades none of the held-out
    episodes is an error."""
    from swarm_domains.openresearcher.judge import GIVE_UP_AFTER, make_judge
    from swarm_runtime.cli.common import check_graded
    from swarm_runtime.config.errors import ConfigError

    class Refusing(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b'{"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}'
            self.send_response(401)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-WRONG-0123456789")
    try:
        judge = make_judge("llm", None, {"base_url": url, "max_attempts": 1, "backoff_s": 0})
        for _ in range(GIVE_UP_AFTER - 1):
            assert judge.grade("q", "a", "a").missing
        with pytest.raises(ConfigError, match=f"judge at {url} graded none of the 3 .*AuthenticationError"):
            judge.grade("q", "a", "a")
    finally:
        server.shutdown()
    with pytest.raises(ConfigError, match="graded none of the 4 held-out episodes of MPT"):
        check_graded(
            {"SFT only": {"episodes": 4, "reward_missing": 0}, "MPT": {"episodes": 4, "reward_missing": 4}}, "x"
        )
    check_graded({"MPT": {"episodes": 4, "reward_missing": 1}}, "x")  # a warning, not an error


def _damage(run: Path, how: str) -> Path:
    """Damage ``run``'s latest checkpoint as ``how`` says; the file the error must name."""
    from safetensors.torch import load_file, save_file

    agents = _latest(run) / "agents"
    miner = agents / "Miner"
    if how == "copied":  # Logger's adapter over Miner's
        for f in (agents / "Logger").iterdir():
            shutil.copy(f, miner / f.name)
        return miner / "swarm_policy.json"
    if how == "garbage":
        (miner / "swarm_policy.json").write_text("{bid_levels: [")
        return miner / "swarm_policy.json"
    if how == "no-policy":
        (miner / "swarm_policy.json").unlink()
        return miner / "swarm_policy.json"
    if how == "no-adapter":
        (miner / "adapter_model.safetensors").unlink()
        return miner / "adapter_model.safetensors"
    weights = load_file(miner / "adapter_model.safetensors")  # nan
    weights[sorted(weights)[0]][0] = float("nan")
    save_file(weights, str(miner / "adapter_model.safetensors"), metadata={"format": "pt"})
    return miner / "adapter_model.safetensors"


@pytest.mark.parametrize("how", ["copied", "garbage", "no-policy", "no-adapter", "nan"])
def test_eval_export_serve_and_resume_share_one_checkpoint_check(how, runs, tmp_path, warm_swarm):
    """18. A LoRA checkpoint with one role's adapter copied over another's, a garbage or deleted swarm_policy.json, a
    deleted adapter or NaN adapter weights: swarm eval, export, serve and run resume=true each exit 2 in one line
    naming the file, before anything loads the models or rewrites the folder."""
    run = _copy(runs, "lora", tmp_path / "run")
    bad = _damage(run, how)
    metrics = (run / "metrics.jsonl").read_bytes()
    for args in (
        ("eval", str(run)),
        ("export", str(run)),
        ("serve", str(run)),
        ("run", "resume=true", f"run_dir={run}", "algo.iterations=3"),
    ):
        cli_error(warm_swarm(*args, cwd=tmp_path), str(bad), absent=("cannot be loaded",))
    assert (run / "metrics.jsonl").read_bytes() == metrics and not (run / "export").exists()


def test_a_resumed_experiments_saved_program_is_refused(registry, tmp_path):
    """13b. A resumed experiment whose saved arguments name a vLLM Python is refused like a run folder (13), before
    anything is written; given again on the command line, it passes that check."""
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.experiments.runner import run_experiment

    pm, reg = registry
    script, marker = _planted(tmp_path)
    folder = tmp_path / "exp"
    folder.mkdir()
    saved = ["domain=minecraft", "task=wooden_pickaxe", "model.adapter=lora", "rollout.engine=vllm"]
    saved.append(f"rollout.vllm.python={script}")
    (folder / "experiment.json").write_text(json.dumps({"experiment": "heldout", "args": saved, "command": "x"}))
    with pytest.raises(ConfigError, match=r"rollout.vllm.python=.*comes from .*experiment.json"):
        run_experiment("heldout", ["resume=true", f"run_dir={folder}"], pm, reg)
    assert sorted(p.name for p in folder.iterdir()) == ["experiment.json"] and not marker.exists()
