"""Engine sampler actors (``cluster.samplers=ray rollout.engine=vllm``; swarm_runtime/cluster/vllm_actors.py) on a local
Ray bound to 127.0.0.1, with a real vLLM (marked ``engine``) where one is given, else with our own serve worker standing
in for vLLM's server (marked ``ray``, no vLLM needed; ``swarm_runtime.serve.worker`` speaks vLLM's completion and
runtime-LoRA API, started by the same ``VLLMServer`` code through a ``vllm`` module that runs it): a tiny
``swarm run`` whose vLLM server a Ray actor started (the base shipped
to it through the object store, every adapter version exported by the trainer and loaded by the actor) writes the
same metrics.jsonl rows as the run that starts its server itself; kill -9 of the actor mid-run: Ray restarts it,
it stops the server the dead actor left and starts another (on another port), the trainer loads it with the last
synced versions, takes its URL and sends the unanswered requests again; the run finishes with every episode."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, TINY_RUN, shared_folder
from enginekit import needs_vllm, vllm_env, vllm_python

ARGS = [a for a in TINY_RUN if not a.startswith("tensorboard")] + [
    "tensorboard=false",
    "model.adapter=lora",
    "rollout.engine=vllm",
]
RAY = ["cluster.kind=ray", "cluster.env_workers=1", "cluster.num_cpus=2", "cluster.samplers=ray"]
#: the trainer's log line that names the actor's process and its server
STARTED = re.compile(r"vLLM sampler actor on Ray \(default\): pid (\d+), server (http://[\d.]+:\d+)")
LOG = re.compile(r"log on its node: (\S+)\)")


def _rows(run_dir):
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def _same_rows(run, reference, python: str | None = None) -> None:
    """metrics.jsonl of ``run`` and ``reference`` (but ``time/*``): every key identical except ``mismatch/*`` (the
    server's log-probs of the same tokens), within 1e-6: a server batches the requests in flight together, which
    rows share a batch depends on timing (and rows sent again after a kill go out in a batch of their own), and
    a batch's float reductions move those log-probs at float precision (seen on our worker: approx KL 1.61e-14
    against 1.68e-14). On a real vLLM (``python`` is vLLM's Python) that float move can also flip a sampled token
    where two are nearly equally likely (a tiny untrained model's distributions are nearly flat), so a reply can
    come back a few tokens longer or shorter: the FLOPs counted on the sampled tokens (``flops/*``) are compared
    within 2% there (seen in CI: ``flops/update`` 2.5217e9 against 2.5359e9, every other key identical). Every
    other key stays exact: a flip that changed a parsed bid or action would change decisions, and is not excused."""
    got, want = _rows(run), _rows(reference)
    loose = ("mismatch/", "flops/") if python is not None and python == vllm_python() else ("mismatch/",)
    exact = [{k: v for k, v in r.items() if not k.startswith(loose)} for r in got]
    assert exact == [{k: v for k, v in r.items() if not k.startswith(loose)} for r in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys() and all(abs(g[k] - w[k]) < 1e-6 for k in g if k.startswith("mismatch/")), (g, w)
        flops = [k for k in g if k.startswith("flops/") and "flops/" in loose]
        assert all(abs(g[k] - w[k]) <= 0.02 * max(abs(w[k]), 1.0) for k in flops), (g, w)


def _models(url: str, key: str | None = None) -> set[str]:
    """What the server at ``url`` lists (``key``: its bearer key); empty when it does not answer."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/models", headers=headers), timeout=2) as r:
            return {m["id"] for m in json.loads(r.read())["data"]}
    except Exception:
        return set()


def _answers(url: str) -> bool:
    """Whether anything answers ``/health`` at ``url`` (no key needed)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2):
            return True
    except Exception:
        return False


def _server_key(folder: Path) -> str | None:
    """The bearer key of the server an actor started (``VLLM_API_KEY`` in its environment, which the test reads
    as the same user: the run never logs it), from the pid file in the actor's folder."""
    pid = int((folder / "server.pid").read_text())
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = item.decode(errors="replace").partition("=")
        if name == "VLLM_API_KEY":
            return value
    return None


#: ``python -m vllm.entrypoints.openai.api_server --model BASE ... --host H --port P`` running our serve worker
API_SERVER = textwrap.dedent("""
    import sys
    from swarm_runtime.serve.worker import main
    a = sys.argv[1:]
    arg = lambda k: a[a.index(k) + 1]
    sys.exit(main(["--model", arg("--model"), "--host", arg("--host"), "--port", arg("--port"), "--enable-lora"]))
""")


def worker_python(folder) -> str:
    """A "vLLM Python" whose ``vllm`` is :data:`API_SERVER` (``rollout.vllm.python`` / ``SWARM_VLLM_PYTHON``)."""
    pkg = folder / "shim" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").touch()
    (pkg / "api_server.py").write_text(API_SERVER)
    py = folder / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH="{folder / "shim"}:{ROOT}" exec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    return str(py)


#: the server a case runs: our worker (no vLLM needed) or a real vLLM (marked ``engine``)
SERVERS = [pytest.param("worker", marks=[pytest.mark.ray, pytest.mark.slow]), pytest.param("vllm", marks=needs_vllm)]
#: the kill cases (here and in test_replicas_ray) run once, on the realest server there is: a real vLLM where one is
#: given (``SWARM_VLLM_PYTHON``; ``SWARM_REQUIRE_VLLM=1`` as .ci/run sets it: fail without one), else our worker standing
#: in for it. The worker stands in for vLLM's server only: with a real vLLM it would check nothing the vLLM case does not
KILL_SERVERS = SERVERS[1:] if vllm_python() is not None or os.environ.get("SWARM_REQUIRE_VLLM") else SERVERS[:1]


def _run(tmp_path, python: str, *extra: str, watch=None, head=None) -> tuple[int, str]:
    """``swarm run ARGS extra`` in a subprocess with vLLM's Python ``python``, on a local Ray of its own or joining
    ``head`` (a ``RayHead``, tests/conftest.py); ``watch(line)`` sees each log line as it comes."""
    joins = head.args if head else []
    cmd = [sys.executable, "-m", "swarm_runtime.cli.main", "run", *ARGS, *extra, *joins, f"run_dir={tmp_path / 'run'}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "RAY_ADDRESS": "local"}
    env.update(head.env if head else {})
    env["SWARM_VLLM_PYTHON"] = python
    lines: list[str] = []
    with subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:

        def read():
            for line in proc.stdout:
                lines.append(line)
                if watch is not None:
                    watch(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=1500)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(30)
    (tmp_path / "swarm.log").write_text("".join(lines))  # what the run said, to read when a check fails
    return proc.returncode, "".join(lines)


@pytest.fixture(scope="session", params=SERVERS)
def served_here(request, tmp_path_factory):
    """``(vLLM's Python, the run that starts its server itself: cluster.samplers=local)``, run once per session for
    this module and test_replicas_ray (tests/conftest.py ``shared_folder``)."""
    pytest.importorskip("ray")

    def make(tmp: Path) -> None:
        python = worker_python(tmp) if request.param == "worker" else vllm_env()["SWARM_VLLM_PYTHON"]
        code, out = _run(tmp, python)
        assert code == 0, out[-4000:]

    tmp = shared_folder(tmp_path_factory, f"served-here-{request.param}", make)
    return (str(tmp / "python") if request.param == "worker" else vllm_env()["SWARM_VLLM_PYTHON"]), tmp / "run"


@pytest.mark.parametrize("served_here", KILL_SERVERS, indirect=True)
def test_an_actor_started_server_killed_then_its_actor_killed_and_the_run_finishes_with_the_same_metrics(
    served_here, ray_head, tmp_path, request
):
    """A run whose vLLM server a sampler actor started: the trainer wrote the base in its run folder (as without the
    actor), the server loaded the actor's copy and the adapters were written on the actor's node. kill -9 of the
    server's process group once every role's first version is loaded (``@v0`` in its /v1/models; the evaluation
    after SFT comes next): the actor restarts it on its port and loads its versions again; once they are back, kill
    -9 of the actor: its server goes with it (SIGTERM at its parent's death), Ray restarts the actor, which starts a
    server on another port, and the trainer loads it with the synced versions and takes its URL. The run ends with
    exit 0, one actor restart, the unanswered rows sent again, the same metrics rows as the run without the actor (no
    episode lost or played twice), and the last server stopped at the close. The actor's server has a key, in no
    log: vLLM refuses its list without it (our worker standing in for vLLM takes no key)."""
    python, here = served_here
    seen: dict = {}

    first = {"Logger@v0", "Miner@v0", "Smith@v0"}  # every role's first version: the sampler's start is done

    def wait_for(names: set | None, seconds: float = 900) -> bool:
        """Until the server lists all of ``names`` (None: until it does not answer)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            served = _models(seen["url"], seen["key"])
            if (names is None and not served) or (names and names <= served):
                return True
            time.sleep(0.2)
        return False

    def killer():
        if wait_for(first):  # then the evaluation after SFT sends its rows
            seen["refused"] = not _models(seen["url"])  # the same request without the key
            os.killpg(int((seen["folder"] / "server.pid").read_text()), signal.SIGKILL)
            seen["server killed"] = True
            if wait_for(None, 30) and wait_for(first):  # down, then restarted by the actor with its versions
                os.kill(seen["pid"], signal.SIGKILL)
                seen["actor killed"] = True

    def watch(line: str) -> None:
        m = STARTED.search(line)
        if m and "pid" not in seen:
            seen["pid"], seen["url"] = int(m.group(1)), m.group(2)
            seen["folder"] = Path(LOG.search(line).group(1)).parent
            seen["key"] = _server_key(seen["folder"])
            threading.Thread(target=killer, daemon=True).start()

    code, out = _run(tmp_path, python, *RAY, watch=watch, head=ray_head)
    assert code == 0, out[-4000:]
    assert "server killed" in seen and "actor killed" in seen, (seen, out[-3000:])
    assert len(seen["key"]) >= 32 and seen["refused"] == (request.node.callspec.params["served_here"] == "vllm")
    assert seen["key"] not in out and seen["key"] not in (seen["folder"] / "vllm.log").read_text()
    assert "it answers again, the rows are sent again" in out, out[-3000:]
    restarted = [ln for ln in out.splitlines() if "sampler actor of base default restarted: pid" in ln]
    assert len(restarted) == 1, out[-3000:]
    new_url = re.search(r"server \S+ -> (\S+);", restarted[0]).group(1)
    assert new_url != seen["url"], restarted  # the new actor's server took a port of its own
    assert not _answers(seen["url"])  # the dead actor's (restarted) server went with it
    closed = next(ln for ln in out.splitlines() if "vLLM sampler actor of base default closed: {'calls'" in ln)
    assert "'restarts': 1" in closed
    _same_rows(tmp_path / "run", here, python)
    assert len(_rows(here)) >= 3
    assert (tmp_path / "run" / "engine" / "base" / "config.json").exists()
    assert not (tmp_path / "run" / "engine" / "adapters").exists()
    assert not _answers(new_url)  # closing stopped the server


def test_stop_stale_stops_only_the_server_of_its_base(tmp_path):
    """A restarted actor stops the server its dead predecessor left (the pid file's process group), and never a
    process that merely took that pid (its command does not name the base folder)."""
    from swarm_runtime.cluster.vllm_actors import stop_stale

    base = tmp_path / "base"
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(b)], start_new_session=True)
        for b in (tmp_path / "other", base)
    ]
    try:
        for p, b in zip(procs, (tmp_path / "other", base)):  # each command line readable first (bounded)
            end = time.monotonic() + 10.0
            while str(b) not in Path(f"/proc/{p.pid}/cmdline").read_bytes().decode(errors="replace"):
                assert time.monotonic() < end, f"process {p.pid} never showed its command line"
                time.sleep(0.05)
        pidfile = tmp_path / "server.pid"
        assert not stop_stale(pidfile, base)  # no pid file
        pidfile.write_text(str(procs[0].pid))
        assert not stop_stale(pidfile, base) and procs[0].poll() is None  # another base's: left alone
        pidfile.write_text(str(procs[1].pid))
        assert stop_stale(pidfile, base)
        assert procs[1].wait(10) is not None
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.ray
@pytest.mark.slow
def test_a_vllm_python_missing_on_the_node_is_one_line(tmp_path):
    """The actor's node has no such vLLM Python: the run stops with exit 2 and one line naming the setting, what
    the actor said, and the valid input, as it does when the trainer starts the server itself."""
    pytest.importorskip("ray")
    code, out = _run(tmp_path, str(tmp_path / "no-python"), *RAY)
    assert code == 2 and "Traceback" not in out, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("swarm: error: the sampler actor of base 'default' could not start its vLLM server:"), last
    assert "SWARM_VLLM_PYTHON=" in last and "cannot be run" in last and "virtualenv with vLLM" in last, last


@pytest.mark.parametrize("bad", ["/etc/passwd", "../outside", "a/../../outside", "a/..", ""])
def test_write_folder_refuses_paths_outside_its_folder_before_writing(tmp_path, bad):
    """The files a node writes come through the object store: an absolute path or a ``..`` part (one that would
    land outside the folder) is refused naming it, before anything is written or the old folder removed."""
    from swarm_runtime.cluster.base_shipping import read_folder, write_folder

    folder = tmp_path / "base"
    write_folder({"config.json": b"{}", "sub/w.bin": b"x"}, folder)
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        write_folder({"first.json": b"1", bad: b"2"}, folder)
    assert read_folder(folder) == {"config.json": b"{}", "sub/w.bin": b"x"}  # the old folder, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]


class _FakeRay:
    """What ``wait_restarted`` asks of Ray: ``get`` (an exception in the script is raised) and its two errors."""

    class exceptions:  # noqa: N801 - ray.exceptions
        class RayActorError(Exception):
            pass

        class GetTimeoutError(Exception):
            pass

    def get(self, ref, timeout=None):
        assert timeout is not None and timeout > 0
        if isinstance(ref, Exception):
            raise ref
        return ref


class _ScriptedActor:
    """An actor whose ``hello`` (and ``pid``) answer from a script: the next item each call."""

    def __init__(self, *script):
        self.script, self.asked = list(script), []

    def _next(self, method):
        self.asked.append(method)
        return self.script.pop(0)

    def __getattr__(self, method):  # actor.hello.remote(), actor.pid.remote()
        return SimpleNamespace(remote=lambda: self._next(method))


def test_wait_restarted_asks_the_method_it_is_given_and_returns_its_answer():
    """One wait for a restarted actor (cluster/actors.py): ``call`` picks what is asked, ``pid_of`` reads the
    answering process from its answer; an answer from the dead process (not seen dead yet) is passed over."""
    from swarm_runtime.cluster.actors import wait_restarted

    ray = _FakeRay()
    actor = _ScriptedActor(ray.exceptions.RayActorError(), {"pid": 5}, {"pid": 7, "url": "u"})
    got = wait_restarted(ray, actor, 5, 30, call=lambda a: a.hello.remote(), pid_of=lambda h: h["pid"])
    assert got == {"pid": 7, "url": "u"} and actor.asked == ["hello"] * 3
    actor = _ScriptedActor(ray.exceptions.GetTimeoutError(), 9)
    assert wait_restarted(ray, actor, 5, 30) == 9 and actor.asked == ["pid", "pid"]  # the default: pid()
    with pytest.raises(TimeoutError, match=r"did not come back within 0 s \(cluster.restart_wait_s; RayActorError\)"):
        wait_restarted(ray, _ScriptedActor(ray.exceptions.RayActorError()), 5, 0, call=lambda a: a.hello.remote())


def test_the_engine_actors_hello_waits_through_wait_restarted(monkeypatch):
    """``EngineActor._hello``: the actor's hello from whichever process answers first, its errors as one
    ``EngineSamplerError`` each (restarts spent; no answer in time)."""
    from swarm_runtime.cluster import actors
    from swarm_runtime.cluster import vllm_actors as engine

    ray = _FakeRay()
    actor = object.__new__(engine.EngineActor)
    actor.ray, actor.name, actor.max_restarts = ray, "default", 2
    actor.actor = _ScriptedActor(ray.exceptions.GetTimeoutError(), {"pid": 11})
    assert actor._hello(30) == {"pid": 11}
    actor.actor = _ScriptedActor(*[ray.exceptions.RayActorError()] * 3)
    with pytest.raises(engine.EngineSamplerError, match=r"'default' did not answer: it did not come back within 0 s"):
        actor._hello(0)
    monkeypatch.setattr(actors, "actor_state", lambda a: "DEAD")
    with pytest.raises(engine.EngineSamplerError, match=r"restarts are spent \(cluster.sampler_restarts=2\)"):
        actor._hello(30)


def test_the_base_is_used_in_place_or_shipped_once_per_node(tmp_path):
    """``place_base`` (how an engine actor finds the base on its node): the trainer's folder when this node sees the
    same files there (nothing shipped); else shipped once into this run's folder on the node and used again by a
    restarted actor (nothing shipped again); a folder at the trainer's path with other files is not used. Stopping
    removes the node's copy and the link to the base, never the trainer's folder."""
    from swarm_runtime.cluster.base_shipping import files_digest, place_base, read_folder, write_folder
    from swarm_runtime.cluster.vllm_actors import EngineWorker

    files = {"config.json": b'{"a": 1}', "model.safetensors": bytes(range(256)) * 64}
    trainer = write_folder(files, tmp_path / "run" / "engine" / "base")
    shipped = {"path": str(trainer), "digest": files_digest(files), "files": ["ref"]}
    fetched = []

    def fetch(ref):
        fetched.append(ref)
        return dict(files)

    node = tmp_path / "node"
    node.mkdir()
    assert place_base(shipped, node, fetch) == (trainer, "in place") and not fetched
    elsewhere = {**shipped, "path": str(tmp_path / "not-on-this-node")}
    where, how = place_base(elsewhere, node, fetch)
    assert how == "shipped" and fetched == ["ref"] and read_folder(where) == files and where.parent == node
    assert place_base(elsewhere, node, fetch) == (where, "cached") and fetched == ["ref"]  # a restarted actor
    (trainer / "config.json").write_bytes(b'{"a": 2}')  # another base at that path
    assert place_base(shipped, node, fetch) == (where, "cached")

    worker = object.__new__(EngineWorker)
    worker.server, worker.folder = None, node
    (node / "base").symlink_to(trainer, target_is_directory=True)
    (node / "adapters").mkdir()
    worker.stop()
    assert sorted(p.name for p in node.iterdir()) == [] and read_folder(trainer)["model.safetensors"]
