import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# ``tests`` is this folder for the test modules' ``from tests.conftest import ...``, even where a dependency
# installed a top-level package of that name (opensimplex, which the crafter extra brings, ships one): a regular
# package in site-packages would win over this folder, which has no __init__.py
if list(getattr(sys.modules.get("tests"), "__path__", [])) != [str(ROOT / "tests")]:
    import types

    sys.modules["tests"] = types.ModuleType("tests")
    sys.modules["tests"].__path__ = [str(ROOT / "tests")]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # under pytest-xdist (`-n 2`, .ci/run): one torch thread per worker, in the worker and in the processes it
    # starts, so that two workers on two cores do not each spin a pool sized for the whole machine
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Ray in tests stays on loopback. Ray 2.60 turns a node address of 127.0.0.1 (``ray.init(_node_ip_address=...)``,
# ``ray start --node-ip-address``) into the machine's routable address and advertises that; unless Ray clusters
# are off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, ray/_private/services.py: get_node_ip_address), when every
# local Ray, in a test or in a ``swarm`` it starts, listens on and advertises 127.0.0.1 only (measured: ``ss -ltn``).
# tests/test_multinode.py turns clusters back on for its two nodes, on 127.0.0.3 and 127.0.0.2.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

#: Small budget for runs in tests: a few demo episodes, short episodes, two updates.
TINY_RUN = [
    "domain=minecraft",
    "task=wooden_pickaxe",
    "task.max_decisions=16",
    "algo.sft.demo_episodes=2",
    "algo.sft.epochs=1",
    "algo.envs_per_step=2",
    "algo.iterations=2",
    "algo.action_steps=1",
    "algo.bid_steps=1",
    "eval.episodes=2",
    "eval.runs=1",
    "progress=false",
    "tensorboard=true",
]
#: The smallest ``algo=rlcr`` run: 1 instance x G=2 rollouts, ``T_max`` 2 -> 4 simulated minutes, 3 demos.
TINY_RLCR = [
    "domain=minecraft",
    "task=wooden_pickaxe",
    "algo=rlcr",
    "rlcr.instances=1",
    "rlcr.group_size=2",
    "rlcr.t_max.start=120",
    "rlcr.t_max.end=240",
    "algo.sft.demo_episodes=3",
    "algo.sft.epochs=1",
    "progress=false",
]
#: ... as an RLCR experiment (one training seed, one update per arm, 2 held-out seeds).
TINY_RLCR_EXPERIMENT = [
    *TINY_RLCR,
    "experiment.iterations=1",
    "experiment.train_seeds=[0]",
    "rlcr.t_max.steps=1",
    "experiment.eval_episodes=2",
    "hardware.threads=1",
]


#: The CLI as ``python -c`` with Ray not importable (``import ray`` fails, ``importlib.util.find_spec("ray")`` is None):
#: a machine without the ray extra.
NO_RAY_CLI = (
    "import sys; sys.modules['ray'] = None; from swarm_runtime.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def swarm(
    *args: str, cwd: Path, timeout: int = 300, env: dict | None = None, without_ray: bool = False, **popen
) -> subprocess.CompletedProcess:
    """Run the real ``swarm`` CLI in a subprocess (``env``: variables to add or change; ``without_ray``: as if the
    ray extra were not installed, :data:`NO_RAY_CLI`)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    cli = ["-c", NO_RAY_CLI] if without_ray else ["-m", "swarm_runtime.cli.main"]
    return subprocess.run(
        [sys.executable, *cli, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    elif getattr(config.option, "dist", "no") == "loadfile":
        # the files go to the workers in the order pytest_collection_modifyitems below gives them (the costliest
        # first), not xdist's own (the files with the most tests first: a file of one long test came last)
        config.option.loadscopereorder = False


#: What the costliest test files cost one worker in each stage of .ci/run (the sum of a file's setup and call times,
#: ``--durations=0``, in seconds; the stage named by ``-m``). Main suite: measured on 2 cores at a load of 4 to 12
#: (docs/benchmarks.md "CI and the test suite"). Cluster stage: measured on an idle 2-core machine at f00591c, the ray
#: tests and the engine tests in their stages then, less the two kill cases that now run on the real vLLM only
#: (tests/engine/test_engine_actor.py: KILL_SERVERS); test_replicas_ray ahead of test_engine_actor: it makes the
#: vLLM run both use (``served_here``) while the other worker has test_multinode, not a wait. Under ``-n 2 --dist
#: loadfile`` the costliest go first, so that the last file a worker takes is a short one. Only the order matters: a
#: file not listed goes after them, in collection order.
FILE_COST = {
    "ray or engine": {
        "tests/test_multinode.py": 251,
        "tests/engine/test_replicas_ray.py": 248,
        "tests/engine/test_engine_actor.py": 202,
        "tests/test_sharded_learners.py": 191,
        "tests/test_placement.py": 158,
        "tests/test_learner_actors.py": 138,
        "tests/test_learner_variants.py": 125,
        "tests/engine/test_staleness_ray.py": 122,
        "tests/test_sampler_actors.py": 115,
        "tests/engine/test_engine_run.py": 98,
        "tests/test_cluster_more.py": 88,
        "tests/test_deepspeed_bf16.py": 86,
        "tests/engine/test_vllm.py": 81,
        "tests/test_deepspeed_learners.py": 79,
        "tests/test_cluster.py": 64,
        "tests/test_serve_ray.py": 52,
        "tests/test_sigterm.py": 44,
        "tests/test_monolithic_learner.py": 31,
        "tests/engine/test_replicas_placed.py": 23,
        "tests/test_actor_env.py": 16,
        "tests/test_trust.py": 13,
    },
    "not ray and not engine": {
        "tests/test_cli.py": 525,
        "tests/test_experiments.py": 417,
        "tests/test_reliability.py": 278,
        "tests/test_bases.py": 245,
        "tests/test_smollm2.py": 245,  # with the smollm2 extra: a real 135M model trained, evaluated and served
        "tests/engine/test_seed_resume.py": 180,
        "tests/test_benchmarks.py": 208,
        "tests/test_adapters.py": 192,
        "tests/test_deploy.py": 152,
        "tests/test_trust.py": 121,
        "tests/test_env_close.py": 117,
        "tests/engine/test_sampler_http.py": 116,
        "tests/engine/test_staleness_worker.py": 108,
        "tests/test_serve_loop.py": 45,  # the closed loop: run, serve, collect, train on served, swap, eval
    },
}


@pytest.hookimpl(trylast=True)  # after ``-m`` deselected
def pytest_collection_modifyitems(config, items):
    cost = FILE_COST.get(config.option.markexpr.strip().strip("'\""), {})
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.partition("::")[0], i)
    items.sort(key=lambda item: (-cost.get(f := item.nodeid.partition("::")[0], 0), first[f]))


def shared_folder(tmp_path_factory, name: str, make) -> Path:
    """Folder ``name``, made once per session by ``make(folder)`` (which fills it or raises): by the first test that
    asks, and under pytest-xdist by the first worker (under a file lock of its own per name, in the workers' common
    temporary folder; the others wait for it and read it). Read it, never write into it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # popen-gw0, popen-gw1, ... live side by side in it
    d, lock = root / name, root / f"{name}.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not (d / ".made").is_file():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            make(d)
            (d / ".made").touch()
    return d


def shared_run(tmp_path_factory, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    """``(run folder, result)`` of one cold ``swarm run ARGS``, trained once per session for each argument tuple
    (:func:`shared_folder`). Read it, never write into it: a test that writes (eval, resume, export, a damaged file)
    works on a copy (``copy_run``)."""

    def make(d: Path) -> None:
        res = swarm("run", *args, f"run_dir={d / 'run'}", cwd=d)
        assert res.returncode == 0, res.stderr[-3000:]
        (d / "result.json").write_text(json.dumps({"args": res.args, "stdout": res.stdout, "stderr": res.stderr}))

    name = "tiny-run" if list(args) == TINY_RUN else "run-" + hashlib.sha1("\0".join(args).encode()).hexdigest()[:12]
    d = shared_folder(tmp_path_factory, name, make)
    out = json.loads((d / "result.json").read_text())
    return d / "run", subprocess.CompletedProcess(out["args"], 0, out["stdout"], out["stderr"])


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """``(run folder, result)`` of one cold ``swarm run *TINY_RUN`` for the whole session (:func:`shared_run`)."""
    return shared_run(tmp_path_factory, *TINY_RUN)


def copy_run(run: Path, dst: Path) -> Path:
    """A copy of run folder ``run`` at ``dst`` (links kept as links), for a test that writes into it."""
    shutil.copytree(run, dst, symlinks=True)
    return dst


# ------------------------------------------- Ray runs (tests/test_cluster.py, test_learner_actors.py, test_sampler_actors.py)
#: A Ray run's own local Ray, even where another process on this machine ran ``ray start`` (ray.init with no
#: address would join that one, read from /tmp/ray/ray_current_cluster).
LOCAL_RAY = {"RAY_ADDRESS": "local"}


#: A Ray head held for the session (:func:`ray_head`): ``ray.init`` of a local Ray in a process of its own, which
#: prints the head's address and holds it until its stdin closes (the fixture's end, or pytest gone).
HOLD_RAY = """
import sys
import ray
ctx = ray.init(address="local", num_cpus=int(sys.argv[1]), _node_ip_address="127.0.0.1", include_dashboard=False,
               log_to_driver=False, configure_logging=False)
print(ctx.address_info["gcs_address"], flush=True)
sys.stdin.read()
ray.shutdown()
"""


class RayHead:
    """A running Ray head that runs join (:func:`ray_head`): ``args`` (``cluster.address=``) and ``env`` (its
    token) to give a ``swarm run`` or :func:`patched_swarm`."""

    def __init__(self, address: str, token: str):
        self.address = address
        self.args = [f"cluster.address={address}"]
        # the head's own token (as tests/test_multinode.py's): the machine's ~/.ray/auth_token is neither read nor
        # written; RAY_ADDRESS the head too (ray.init prefers the address it is given: Ray 2.60, services.py)
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_ADDRESS": address}


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory):
    """One local Ray (2 CPUs, on 127.0.0.1 only: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) for the session's Ray runs
    that do not test a run's own start of a local Ray: they join it (``cluster.address=``, a user's path) and skip
    the ~7 s (idle; 10-20 s under load) of a Ray start and stop each. A run's actors are its job's: they end with
    the run's driver, whatever the run did. Under pytest-xdist, one per worker. Skipped without Ray."""
    with held_ray(tmp_path_factory.getbasetemp() / "ray-head.log", 2) as head:
        yield head


@contextlib.contextmanager
def held_ray(log: Path, cpus: int):
    """A local Ray head of ``cpus`` CPUs (:data:`HOLD_RAY`, in a process of its own, its log at ``log``, with a
    token of its own) held for the ``with`` block: its :class:`RayHead`. Skipped without Ray."""
    import secrets
    import select

    pytest.importorskip("ray")
    token = secrets.token_hex(32)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    env.pop("RAY_ADDRESS", None)
    with open(log, "w") as err:
        p = subprocess.Popen(
            [sys.executable, "-c", HOLD_RAY, str(cpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            text=True,
        )
    try:
        ready, _, _ = select.select([p.stdout], [], [], 180)
        address = p.stdout.readline().strip() if ready else ""
        assert address.startswith("127.0.0.1:"), f"no Ray head within 180 s: {log.read_text()[-2000:]}"
        yield RayHead(address, token)
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def in_process_twin(tmp_path_factory, *args: str) -> Path:
    """The folder of ``swarm run ARGS`` in process (skipped without Ray): the twin whose metrics and eval a Ray
    run of the same arguments must equal (:func:`run_rows`, :func:`run_eval`). One run per argument tuple per
    session, shared by every module and xdist worker that asks (:func:`shared_run`; TINY_RUN's is ``tiny_run``'s):
    read it, never write into it."""
    pytest.importorskip("ray")
    return shared_run(tmp_path_factory, *args)[0]


def run_rows(run_dir: Path) -> list[dict]:
    """A run's metrics.jsonl rows without their times."""
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def run_eval(run_dir: Path) -> dict:
    """A run's eval.json without its provenance and without the code's commit (``versions.commit``: a commit made
    while the tests run, or a file edited, differs between two runs of the same code; the library versions stay)."""
    out = json.loads((run_dir / "eval.json").read_text())
    out.pop("provenance", None)
    if isinstance(out.get("versions"), dict):
        out["versions"] = {k: v for k, v in out["versions"].items() if k != "commit"}
    return out


#: Metrics of a metrics.jsonl row that its episodes alone set (what was played, branched and counted; the evaluation
#: rows): equal in two runs whose rollouts drew the same tokens.
ROLLOUT_KEYS = (
    "charts/episode_reward",
    "charts/decisions",
    "charts/invalid_actions",
    "charts/unparsed_bids",
    "charts/reward_missing",
    "charts/success",
    "charts/turn_share_",
    "charts/invalid_share_",
    "charts/skipped_turns",
    "charts/contested_picked",
    "charts/bid_pairs",
    "charts/bid_higher_won_",
    "flops/rollout",
    "flops/branch",
    "flops/eval",
    "eval/",
)


def _rollout_of(row: dict) -> dict:
    return {k: v for k, v in row.items() if k.startswith(ROLLOUT_KEYS)}


def _finite(row: dict) -> bool:
    return all(not isinstance(v, float) or math.isfinite(v) for v in row.values())


def _drawn_after(row: dict) -> int:
    """The update after which a row's episodes were drawn: an update row's rollout before its update, an evaluation
    row's after the update of its step."""
    return row.get("step", 0) - 1 if "kind" in row else row.get("step", 0)


def compare_on_same_inputs(rows: list[dict], want: list[dict], close, start: int = 0, agree: bool = True) -> int | None:
    """Compare the metrics.jsonl rows (:func:`run_rows`) of two runs of one config whose arithmetic differs
    legitimately (bf16 rounding, another order of float sums: sharded against in process) from a common state after
    update ``start`` (0: the same SFT; k: a run resumed from the other's checkpoint k, its rows up to k copied).

    Both runs have the same steps and kinds in the same order, and finite numbers. Rows whose episodes the common
    weights drew (the first update after ``start`` on its samples and pairs, the evaluations before it) have equal
    rollouts (:data:`ROLLOUT_KEYS`) and are compared by ``close(got, exp)`` (asserting within that arithmetic's
    tolerance). Weights a rounding apart may draw another token, and so other samples and pairs, which is no fault:
    the later rows are compared while their rollouts agree (``agree``); from the first that does not (without
    ``agree``: from the first later row) the rows are checked for their step, kind and finite values only. ``agree``
    suits fp32, where a draw changes only when it falls within ~1e-7 of a boundary; in bf16 a weight that rounds the
    other way moves a logit by ~1e-2, and a rollout can change without any of its counts changing.
    Returns the step of the first row not compared (None: every row compared)."""
    assert [(r.get("step"), r.get("kind")) for r in rows] == [(r.get("step"), r.get("kind")) for r in want]
    assert all(map(_finite, rows)), [r for r in rows if not _finite(r)]
    for got, exp in zip(rows, want):
        if _drawn_after(exp) <= start:
            assert _rollout_of(got) == _rollout_of(exp), (exp.get("step"), _rollout_of(got), _rollout_of(exp))
        elif not agree or _rollout_of(got) != _rollout_of(exp):
            print(f"rows compared up to step {exp['step']}: the rollouts drawn after update {_drawn_after(exp)} differ")
            return exp["step"]
        close(got, exp)
    return None


def compare_evals(got: dict, want: dict, trained_apart: bool) -> None:
    """Two runs' eval.json (:func:`run_eval`): equal; ``trained_apart`` (their metrics rows were not all compared,
    :func:`compare_on_same_inputs`): the evaluation of the SFT weights (the same in both), the settings and the SFT's
    FLOPs equal, and of the trained policy's evaluation (whose episodes weights a rounding apart may play otherwise)
    the same keys and the same episode counts."""
    if not trained_apart:
        assert got == want
        return
    trained = ("results", "flops", "table", "mpt_minus_sft", "mpt_minus_sft_success")
    assert {k: v for k, v in got.items() if k not in trained} == {k: v for k, v in want.items() if k not in trained}
    assert got.keys() == want.keys() and got["flops"].keys() == want["flops"].keys()
    assert got["flops"]["sft"] == want["flops"]["sft"]
    assert got["results"].keys() == want["results"].keys() and got["results"]["SFT only"] == want["results"]["SFT only"]
    for name, res in want["results"].items():
        assert res.keys() == got["results"][name].keys()
        counts = ("episodes", "seeds", "runs")
        assert [res[k] for k in counts] == [got["results"][name][k] for k in counts]


def patched_swarm(
    script: Path, *args: str, cwd: Path, paths=(), env: dict | None = None
) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS``: a script that patches a part (to kill an actor mid-run, say) and then runs the CLI's
    ``main``, as :func:`swarm` runs the CLI, on a local Ray of its own (:data:`LOCAL_RAY`), with the repository and
    ``paths`` importable (an actor imports a patched body from there too); ``env``: variables to add (a
    :class:`RayHead`'s ``env``, with its ``args`` among ``args``: the run joins that Ray)."""
    pythonpath = os.pathsep.join([*map(str, paths), str(ROOT)])
    base = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath, **LOCAL_RAY}
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="session")
def warm_swarm():
    """``swarm(...)``'s signature and result, through one warmed interpreter that forks a child per
    command (tests/forkcli.py ``WarmCLI``): the same ``main`` in a process of its own, without the 3-5 s
    of imports. For tests of what a command does; each command keeps cold ``swarm(...)`` tests too."""
    from forkcli import WarmCLI

    cli = WarmCLI(TINY_RUN)

    def run(*args: str, cwd: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
        return cli(args, cwd=cwd, env={"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}, timeout=timeout)

    yield run
    cli.close()


@pytest.fixture(scope="session")
def registry():
    from swarm_runtime.plugins.manager import build_registry, make_plugin_manager

    pm = make_plugin_manager()
    return pm, build_registry(pm)


def run_context(registry, *args: str):
    """A ``RunContext`` (no run folder) for ``key=value`` arguments, as ``swarm run`` resolves them."""
    from swarm_runtime.config.load import resolve
    from swarm_runtime.runs.context import RunContext

    pm, reg = registry
    return RunContext(resolve(list(args), reg), pm, reg, None)


def make_local_checkpoint(out: Path) -> Path:
    """A Hugging Face checkpoint of the kind users bring to ``model=local``, built in process (no
    download): a byte-level BPE tokenizer with no pad token and no bid tokens, a 2-layer Qwen2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    text = [
        "you are Logger . goal wooden_pickaxe . inventory : none . action :",
        "chop tree craft planks stick",
        "mine stone smelt iron explore",
        "bid : 0.2 0.4 0.6 0.8",
        "The next action is turn left 30 degree.",
    ]
    bpe.train_from_iterator(
        text * 40,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    assert tok.pad_token is None and "<bid_0.2>" not in tok.get_vocab()
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def loopback_listener():
    """A socket listening on 127.0.0.1 (a stand-in Ray head) and its ``host:port``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock, f"127.0.0.1:{sock.getsockname()[1]}"


def heard(sock) -> bool:
    """Whether anything connected to ``sock`` (a connection waits in its backlog until accepted)."""
    sock.setblocking(False)
    try:
        sock.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def cli_error(res, *needles, absent=()) -> str:
    """The one ``swarm: error`` line of a command that exited 2, holding every needle."""
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, err[-2000:])
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("swarm:")]
    assert len(lines) == 1 and err.splitlines()[-1] == lines[0], err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    for n in absent:
        assert n not in lines[0], (n, lines[0])
    return lines[0]
