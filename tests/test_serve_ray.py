"""``swarm serve RUN serve.cluster=ray``: every agent worker in a Ray actor, on a local Ray the gateway
starts bound to 127.0.0.1 (swarm_runtime/serve/ray_workers.py). One gateway is shared by the module: its served
episodes are the in-process ``swarm eval`` episodes turn by turn (as test_serve.py checks for forked workers); a
worker killed with -9 mid-episodes costs no episode, and Ray's restarted actor rejoins at its new URL and serves
again; an agent added at runtime is a new actor, and draining it ends the actor for good. Bad input (no Ray, an
unreachable address, a bad value) is one line and exit 2. Every process started here is stopped by pid."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import NO_RAY_CLI, ROOT  # noqa: E402
from test_serve import _env, _free_port, _kill_pid, _start, _stop, _wait_health, build_run, served_equals_in_process  # noqa: E402
from test_serve_edges import _until  # noqa: E402

HELD_OUT = 100000  # wooden_pickaxe's first eval seed


@pytest.fixture(scope="module")
def run(registry, tmp_path_factory):
    return build_run(registry, tmp_path_factory.mktemp("serve_ray") / "run")


def _agents(url: str) -> list[dict]:
    return httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Gateway:
    def __init__(self, run, url, proc, log):
        self.run, self.url, self.proc, self.log = run, url, proc, log


@pytest.fixture(scope="module")
def ray_served(run, tmp_path_factory):
    pytest.importorskip("ray")
    tmp = tmp_path_factory.mktemp("gateway")
    port = _free_port()
    log = tmp / "gateway.log"
    args = [
        "swarm_runtime.cli.main",
        "serve",
        str(run),
        f"serve.port={port}",
        "serve.cluster=ray",
        "serve.probe_interval_ms=200",
        "serve.agent_wait_s=3",
    ]
    url = f"http://127.0.0.1:{port}"
    # serve.address=null starts a Ray of its own: not the one $RAY_ADDRESS names (here: nothing listens there),
    # nor the last `ray start` on this machine (ray.init() without an address joins those)
    env = {"RAY_ADDRESS": f"127.0.0.1:{_free_port()}"}
    gateway = _start(args, log, **env)
    try:
        _wait_health(url, [gateway], 300, logs=[log])
    except AssertionError:  # another job's Ray took a port as ours started: once more
        _stop(gateway)
        gateway = _start(args, log, **env)
        _wait_health(url, [gateway], 300, logs=[log])
    pids: list[int] = []
    try:
        pids = [a["pid"] for a in _agents(url) if a["pid"]]
        yield Gateway(run, url, gateway, log)
        pids += [a["pid"] for a in _agents(url) if a["pid"]]
    finally:
        _stop(gateway, wait=60)
        ended = [p for p in pids if not _alive(p)]
        for pid in pids:  # the gateway ends its actors and its Ray; make sure
            _kill_pid(pid)
    assert gateway.returncode in (0, -signal.SIGTERM), log.read_text()[-3000:]
    assert "swarm serve stopped" in log.read_text()
    assert sorted(ended) == sorted(pids), "worker actors outlived the gateway"


@pytest.mark.ray
@pytest.mark.slow
def test_ray_workers_play_the_in_process_episodes(ray_served, registry):
    """Keyed sampling: workers in Ray actors play the in-process `swarm eval` episodes exactly, turn by turn
    (the form of test_serve.py's check of forked workers)."""

    agents = _agents(ray_served.url)
    assert [(a["name"], a["status"], a["restarts"]) for a in agents] == [
        ("Logger", "up", 0),
        ("Miner", "up", 0),
        ("Smith", "up", 0),
    ]
    gateway_pid = ray_served.proc.pid
    for a in agents:  # each worker its own Ray worker process, not a child the gateway forked
        assert a["url"].startswith("http://127.0.0.1:") and a["pid"] != gateway_pid
        assert str(gateway_pid) not in open(f"/proc/{a['pid']}/stat").read().split()[3]
    assert "(a Ray actor)" in ray_served.log.read_text()

    served_equals_in_process(registry, ray_served.run, ray_served.url)


@pytest.mark.ray
@pytest.mark.slow
def test_a_killed_actor_worker_costs_no_episode_and_rejoins(ray_served):
    """kill -9 of Logger's worker process (its actor's) three turns into a streamed episode, with two more
    episodes running: all three complete; Ray restarts the actor, which rejoins at its new URL (a restart
    counted) and bids again."""
    u = ray_served.url
    victim = next(a for a in _agents(u) if a["name"] == "Logger")
    others: list[dict] = []

    def play(seed: int):
        others.append(httpx.post(f"{u}/v1/episodes", json={"seed": seed, "noise": "3"}, timeout=180).json())

    threads = [threading.Thread(target=play, args=(HELD_OUT + k,)) for k in (1, 2)]
    lines = []
    with httpx.stream(
        "POST", f"{u}/v1/episodes", json={"seed": HELD_OUT, "noise": "8", "stream": True}, timeout=180
    ) as r:
        for line in r.iter_lines():
            lines.append(json.loads(line))
            if len(lines) == 1:
                for t in threads:
                    t.start()
            if len(lines) == 3:
                os.kill(victim["pid"], signal.SIGKILL)
    for t in threads:
        t.join(180)
    final = lines[-1]
    assert final["final"] and final["status"] == "done" and final["decisions"] == 12
    assert [t["t"] for t in lines[:-1]] == list(range(12))
    assert [(b["status"], b["decisions"]) for b in others] == [("done", 12), ("done", 12)], others
    assert not _alive(victim["pid"])

    back = _until(
        lambda: next((a for a in _agents(u) if a["name"] == "Logger" and a["status"] == "up" and a["pid"]), None),
        180,
        "Logger's actor restarted by Ray and up again",
    )
    assert back["restarts"] == 1 and back["pid"] != victim["pid"] and back["url"] != victim["url"]
    assert "worker restarted by Ray" in ray_served.log.read_text()
    after = httpx.post(f"{u}/v1/episodes", json={"seed": HELD_OUT + 1, "noise": "9"}, timeout=180).json()
    assert after["status"] == "done" and any("Logger" in t["bids"] for t in after["turns"])
    assert "Logger" not in {n for t in after["turns"] for n in t["missed"]}


@pytest.mark.ray
@pytest.mark.slow
def test_an_added_agent_is_a_new_actor_and_draining_ends_it(ray_served):
    u = ray_served.url
    added = httpx.post(f"{u}/v1/swarm/agents", json={"role": "Smith"}, timeout=30)
    assert added.status_code == 201 and added.json()["name"] == "Smith@2"
    up = _until(
        lambda: next((a for a in _agents(u) if a["name"] == "Smith@2" and a["status"] == "up"), None),
        180,
        "Smith@2 up",
    )
    body = httpx.post(f"{u}/v1/episodes", json={"seed": HELD_OUT, "noise": "5"}, timeout=180).json()
    assert body["status"] == "done" and any("Smith@2" in t["bids"] for t in body["turns"])
    gone = httpx.delete(f"{u}/v1/swarm/agents/Smith@2", timeout=60)
    assert gone.status_code == 200 and gone.json()["status"] == "removed"
    _until(lambda: not _alive(up["pid"]), 30, "the drained actor's process to end")
    time.sleep(1.0)  # Ray does not bring it back
    assert next(a for a in _agents(u) if a["name"] == "Smith@2")["status"] == "removed"
    assert not _alive(up["pid"])


@pytest.mark.ray
@pytest.mark.slow
def test_an_actor_whose_model_cannot_load_says_why(ray_served):
    """A worker's actor whose constructor raises (its model cannot load) is gone for good, not restarted by Ray:
    the agent's error says why, and the gateway restarts it as a new actor with its backoff (as a subprocess)."""
    u = ray_served.url
    broken = ray_served.run / "checkpoints/final/broken"
    broken.mkdir(exist_ok=True)
    (broken / "config.json").write_text("{not json")
    r = httpx.post(f"{u}/v1/swarm/agents", json={"role": "Miner", "name": "Miner-broken", "checkpoint": str(broken)})
    assert r.status_code == 201, r.text
    a = _until(
        lambda: next(
            (x for x in _agents(u) if x["name"] == "Miner-broken" and "its constructor raised" in (x["error"] or "")),
            None,
        ),
        180,
        "the broken actor's reason in its agent's error",
    )
    assert a["error"].startswith("worker exited with 1: its constructor raised") and a["status"] in ("down", "starting")
    assert httpx.delete(f"{u}/v1/swarm/agents/Miner-broken", timeout=60).json()["status"] == "removed"


def _serve_cli(run, *args, code: str | None = None) -> subprocess.CompletedProcess:
    prefix = [sys.executable, "-c", code] if code else [sys.executable, "-m", "swarm_runtime.cli.main"]
    return subprocess.run(
        [*prefix, "serve", str(run), f"serve.port={_free_port()}", *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_serve_cluster_ray_without_ray_names_the_extra(run):
    r = _serve_cli(run, "serve.cluster=ray", code=NO_RAY_CLI)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "swarm: error: serve.cluster=ray needs Ray, which is not installed: pip install 'swarm-runtime[ray]'"
    )


def test_bad_serve_cluster_values_name_the_valid_ones(registry):
    from test_serve import RUN_ARGS

    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import resolve

    for arg, valid in (("serve.cluster=slurm", "one of local, ray"), ("serve.address=nohost", "host:port")):
        with pytest.raises(ConfigError, match=f"{arg.split('=')[0]}.*{valid}"):
            resolve([*RUN_ARGS, arg], registry[1])


@pytest.mark.ray
def test_an_unreachable_serve_address_is_one_line(run):
    pytest.importorskip("ray")
    port = _free_port()  # nothing listens there
    r = _serve_cli(run, "serve.cluster=ray", f"serve.address=127.0.0.1:{port}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"swarm: error: serve.address='127.0.0.1:{port}': no Ray cluster answers there"), last


class _Actor:
    """What the population sees of a worker's Ray actor (:class:`RayWorker`'s interface): the answers of
    ``check`` given in order, ``terminate`` recorded."""

    def __init__(self, answers):
        self.answers, self.pid, self.returncode, self.error = list(answers), None, None, None

    def check(self):
        return self.answers.pop(0) if self.answers else None

    def poll(self):
        return self.returncode

    def terminate(self):
        self.returncode = -9

    kill = terminate

    def wait(self, timeout=None):
        return self.returncode


def test_a_ray_worker_that_keeps_dying_is_failed_as_a_subprocess_is():
    """Population.follow: the first answer is where the worker serves; each later new address is a restart by
    Ray (the agent is not asked until it answers there); more than serve.max_restarts of them within
    serve.restart_window_s fail the agent and end its actor for good."""
    from swarm_runtime.serve.population import Population, PopulationOptions
    from swarm_runtime.serve.ray_workers import LOST

    answers = [("http://10.0.0.7:4001", 11), LOST, ("http://10.0.0.8:4002", 12), ("http://10.0.0.8:4003", 13)]
    pop = Population(PopulationOptions(max_restarts=1, restart_window_s=60.0), launcher=lambda *a: _Actor(answers))
    a = pop.spawn("Smith", ROOT)
    assert (a.url, a.status) == ("", "starting")  # not probed until its actor says where it serves
    pop.follow(a)
    assert (a.url, a.restarts) == ("http://10.0.0.7:4001", 0)
    a.status = "up"
    pop.follow(a)  # its process died: not asked
    assert a.status == "down" and "Ray restarts it" in a.error and a.url == "http://10.0.0.7:4001"
    pop.follow(a)  # Ray restarted it on another node
    assert (a.url, a.restarts, a.status) == ("http://10.0.0.8:4002", 1, "down")
    pop.follow(a)  # and again, within the window: more than serve.max_restarts=1
    assert a.status == "failed" and "serve.max_restarts=1" in a.error and a.proc.returncode == -9
    pop.follow(a)  # a failed agent is no longer followed
    assert a.restarts == 2
