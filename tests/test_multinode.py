"""More than one Ray node, on this machine (docs/reference/cluster.md, "More than one node"): a Ray of two nodes
on loopback (a head holding the custom resource ``nodeA``, a second node holding ``nodeB``, each its own raylet, its
own ports), started with ``ray start --block`` in process groups this module owns and kills by their ids (never
``ray stop``: other jobs' Rays run on the same machine). A real ``swarm run`` joins the head with its env workers,
learners and sampler pinned to the second node (``cluster.resources``); the actors say where they ran. Then the second
node is killed mid-run: the run stops with one line naming what was lost, and ``resume=true`` without that node
ends with the in-process run's metrics and eval."""

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import TINY_RUN, in_process_twin, run_eval, run_rows, swarm

#: Every actor of the run on the second node.
ON_B = [f"cluster.resources.{kind}={{nodeB: 0.01}}" for kind in ("env", "learner", "sampler")]
RAY_ARGS = ["cluster.kind=ray", "cluster.env_workers=2", "cluster.learners=ray", "cluster.samplers=ray"]
#: Seconds a node may take to join (each raylet imports and starts its agents; more at a high load).
JOIN_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a raylet's workers: each in a process group of its own)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _in_group(pgid: int, needle: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getpgid(int(d.name)) == pgid and needle in (d / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d.name))
            except (OSError, ProcessLookupError):
                pass
    return out


#: Each node's CPUs (Ray's logical count): the placement test's five one-CPU bundles fit on neither node alone
CPUS = {"nodeA": 2, "nodeB": 3}
#: The nodes' addresses: loopback, but not 127.0.0.1, which Ray 2.60 replaces with the machine's routable address
HEAD_IP, NODE_B_IP = "127.0.0.3", "127.0.0.2"


class NodeExited(AssertionError):
    """A node's ``ray start`` exited while it was awaited."""


class TwoNodes:
    """A head (``nodeA``, on 127.0.0.3) and a second node (``nodeB``, on 127.0.0.2), each ``ray start --block`` in a session of its
    own. Token authentication as ``ray start --head`` sets it up, with a token of this fixture's own
    (``RAY_AUTH_TOKEN``), so the machine's ``~/.ray/auth_token`` is neither read nor written."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="rn", dir="/tmp")  # short: Ray's socket paths must stay under 107 bytes
        self.port = _free_port()
        self.address = f"{HEAD_IP}:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), OMP_NUM_THREADS="1")
        # a multi-node Ray needs clusters on (tests/conftest.py turns them off for one-node Rays); then Ray turns
        # 127.0.0.1 into the machine's routable address, but keeps other loopback addresses: each node gets one
        self.env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
        # the head's health checks of a node every second, a node dead after 3 failed ones (Ray 2.60: every 3 s,
        # after 5): a killed node (its checks refused at once) is marked dead in ~3 s instead of ~15 s; a node slow
        # to answer still has the default 10 s per check
        self.env.update(RAY_health_check_period_ms="1000", RAY_health_check_failure_threshold="3")
        self.nodes: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, head: bool, cpus: int) -> None:
        ports = [
            f"--node-manager-port={_free_port()}",
            f"--object-manager-port={_free_port()}",
            f"--dashboard-agent-listen-port={_free_port()}",
            f"--dashboard-agent-grpc-port={_free_port()}",
            f"--runtime-env-agent-port={_free_port()}",
            f"--metrics-export-port={_free_port()}",
        ]
        where = (
            ["--head", f"--port={self.port}", "--include-dashboard=false", f"--dashboard-port={_free_port()}",
             f"--ray-client-server-port={_free_port()}"]
            if head
            else [f"--address={self.address}"]
        )  # fmt: skip
        ray = str(Path(sys.executable).with_name("ray"))
        cmd = [ray, "start", *where, f"--node-ip-address={HEAD_IP if head else NODE_B_IP}", f"--num-cpus={cpus}", "--num-gpus=0",
               f"--resources={{\"{name}\": 1}}", "--object-store-memory=100000000", "--disable-usage-stats",
               f"--temp-dir={self.tmp}", "--block", *ports]  # fmt: skip
        log = open(f"{self.tmp}/{name}.out", "w")
        self.nodes[name] = subprocess.Popen(
            cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def start(self) -> float:
        """Start both nodes; the seconds until Ray lists two live nodes."""
        t0 = time.perf_counter()
        self._start("nodeA", True, CPUS["nodeA"])
        self._wait(lambda: self._listening(), "the head's port")
        self.start_b()
        return time.perf_counter() - t0

    def start_b(self) -> None:
        """Start the second node (again, after :meth:`kill`: a new node, the same resources) until Ray lists it live."""
        for attempt in (1, 2):  # Ray 2.60 gives a joining raylet 30 s to register (fixed): at a high load, once more
            self._start("nodeB", False, CPUS["nodeB"])
            try:
                self._wait(lambda: self.alive() == {"nodeA", "nodeB"}, "two live nodes")
                break
            except NodeExited:
                if attempt == 2:
                    raise
                self.kill("nodeB")

    def _listening(self) -> bool:
        try:
            socket.create_connection((HEAD_IP, self.port), 1).close()
            return True
        except OSError:
            return False

    def _wait(self, ok, what: str) -> None:
        end = time.monotonic() + JOIN_S
        while not ok():
            for name, p in self.nodes.items():
                if p.poll() is not None:
                    raise NodeExited(f"{name} exited: " + Path(f"{self.tmp}/{name}.out").read_text()[-2000:])
            assert time.monotonic() < end, f"no {what} within {JOIN_S:.0f} s"
            time.sleep(0.5)

    def alive(self, until: str = "len(live) >= 2") -> set[str]:
        """The ``node*`` resources of the live nodes, as a driver of this fixture's own sees them, once ``until`` (a
        Python condition on ``live``, the sorted names) holds, or ``JOIN_S`` has passed (by default: both nodes)."""
        probe = (
            "import json, sys, time, ray\n"
            f"ray.init(address={self.address!r}, log_to_driver=False, configure_logging=False)\n"
            f"end = time.monotonic() + {JOIN_S}\n"
            "while True:\n"
            "    live = sorted(k for n in ray.nodes() if n['Alive'] for k in n['Resources'] if k.startswith('node') and ':' not in k)\n"
            f"    if ({until}) or time.monotonic() > end: break\n"
            "    time.sleep(0.5)\n"
            "print('LIVE', json.dumps(live))\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", probe], env=self.env, capture_output=True, text=True, timeout=JOIN_S + 60
        )
        import json

        live = [ln[5:] for ln in r.stdout.splitlines() if ln.startswith("LIVE ")]
        return set(json.loads(live[-1])) if r.returncode == 0 and live else set()

    def kill(self, name: str) -> list[int]:
        """SIGKILL node ``name`` whole: its raylet's workers (each in a group of its own), then its process group (the
        raylet, its agents, ``ray start``); the pids killed."""
        p = self.nodes.pop(name)
        killed = []
        for raylet in _in_group(p.pid, "raylet/raylet"):
            for w in _children(raylet):
                if os.getpgid(w) != p.pid:
                    os.kill(w, signal.SIGKILL)
                    killed.append(w)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:  # its `ray start` exited and took its processes along
            pass
        p.wait(timeout=30)
        return killed

    def close(self) -> None:
        for name in list(self.nodes):
            try:
                self.kill(name)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def two_nodes():
    pytest.importorskip("ray")
    nodes = TwoNodes()
    try:
        took = nodes.start()
        print(f"two Ray nodes up in {took:.1f} s", file=sys.stderr)
        yield nodes
    finally:
        nodes.close()


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    return in_process_twin(tmp_path_factory, *TINY_RUN, "checkpoint_every=1")


def _eval(run: Path) -> dict:
    """eval.json without its provenance and versions (the commit is marked +dirty when the tree changed between runs)."""
    return {k: v for k, v in run_eval(run).items() if k != "versions"}


def _node_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if " on node" in ln]


class Killed(list):
    """The pids :meth:`TwoNodes.kill` killed; ``stopped_s``: seconds from the kill to the run's end."""

    stopped_s = 0.0


def _run_killing_b(two_nodes, tmp_path, args: list[str], then=None) -> tuple[subprocess.Popen, str, Killed]:
    """``swarm run`` (tiny, a checkpoint each update) of ``args`` on the two nodes, in ``tmp_path/run``; nodeB killed once
    update 1 is saved (update 2 under way), then ``then(stderr so far)`` called (None: nothing). Returns the
    finished process, its stderr and what the kill killed (bounded: 540 s, then the run is killed)."""
    run = tmp_path / "run"
    args = ["run", *TINY_RUN, "checkpoint_every=1", *args, f"cluster.address={two_nodes.address}", f"run_dir={run}"]
    env = {**two_nodes.env, "PYTHONUNBUFFERED": "1"}
    err = open(tmp_path / "stderr", "w")
    p = subprocess.Popen(
        [sys.executable, "-m", "swarm_runtime.cli.main", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    t0, killed = time.monotonic(), None
    try:
        while p.poll() is None and time.monotonic() - t0 < 540:
            if killed is None and (run / "checkpoints" / "iter-000001").is_dir():  # update 1 saved: update 2 starts
                killed = Killed(two_nodes.kill("nodeB"))
                t_kill = time.monotonic()
                if then is not None:
                    then((tmp_path / "stderr").read_text())
            time.sleep(0.1)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
    stderr = (tmp_path / "stderr").read_text()
    assert killed is not None, stderr[-3000:]
    killed.stopped_s = time.monotonic() - t_kill
    return p, stderr, killed


#: One node as :func:`swarm_runtime.cluster.env_cluster.node_here` writes it: its id, address and custom resource
NODE = r"([0-9a-f]{8}) at [\d.]+ \((node[AB])\)"


def _nodes(stderr: str, what: str) -> list[tuple[str, str]]:
    """``(node id, nodeA/nodeB)`` of each actor in the first log line that starts with ``what``, in order."""
    line = next(ln for ln in stderr.splitlines() if what in ln)
    return re.findall(NODE, line.split(what, 1)[1])


@pytest.mark.ray
@pytest.mark.slow
def test_the_second_node_lost_and_replaced_within_the_wait_the_run_recovers(two_nodes, in_process, tmp_path):
    """The env workers and learners placed by Ray (no cluster.resources: 0-CPU actors, each on a node Ray draws), the
    sampler pinned to nodeB; nodeB killed while update 2 is under way, and, once Ray has marked it dead, a new nodeB
    (the same resources) started within cluster.restart_wait_s. Every unpinned actor that was on nodeB is restarted
    by Ray on nodeA (its episodes replayed, the learners rewound to their checkpoint), the pinned sampler on the new
    nodeB (loaded with the synced weights), and the run ends with the in-process run's metrics and eval."""
    run = tmp_path / "run"
    before: dict = {}

    def replace_b(stderr: str) -> None:
        before.update(
            envs=_nodes(stderr, "env workers on nodes: "),
            learners=re.findall(r"(\S+)\[0\] " + NODE, stderr.split("learners on nodes: ", 1)[1].splitlines()[0]),
            sampler=_nodes(stderr, "sampler actor on node ")[0],
        )
        t0 = time.monotonic()
        gone = two_nodes.alive(until="'nodeB' not in live")  # Ray's restarts of unpinned actors start here
        assert gone == {"nodeA"}, gone
        two_nodes.start_b()
        before["b_down_s"] = time.monotonic() - t0

    args = [*RAY_ARGS, "cluster.env_workers=4", "cluster.resources.sampler={nodeB: 0.01}", "cluster.restart_wait_s=300"]
    p, stderr, killed = _run_killing_b(two_nodes, tmp_path, args, then=replace_b)
    assert p.returncode == 0, stderr[-3000:]
    envs_b = [w for w, (_, name) in enumerate(before["envs"]) if name == "nodeB"]
    learners_b = [n for n, _, name in before["learners"] if name == "nodeB"]
    old_b = before["sampler"][0]
    assert before["sampler"][1] == "nodeB", before
    first = [int(x) for x in re.search(r"env workers on Ray: \d+ \(pids ([\d, ]+)\)", stderr).group(1).split(", ")]
    last = [int(x) for x in re.findall(r"'pid': (\d+)", stderr.split("env workers closed: ", 1)[1].splitlines()[0])]
    assert [w for w in range(len(first)) if first[w] != last[w]] == envs_b, (first, last)  # restarted by Ray: those
    for w in envs_b:  # the run asked again (a worker with no env under way is not): on the surviving node
        at = re.search(rf"env worker {w} restarted: pid \d+ -> \d+ on node {NODE}", stderr)
        assert at is None or at.group(2) == "nodeA", at.group(0)
    for n in learners_b:  # asked again (an update or a checkpoint): refused from the new process, the run rewound
        at = re.search(rf"learner {n} restarted: pid \d+ -> \d+ on node {NODE}", stderr)
        assert at and at.group(2) == "nodeA", stderr[-3000:]
    again = re.search(rf"sampler actor restarted: pid \d+ -> \d+ on node {NODE}", stderr)
    assert again and again.group(2) == "nodeB" and again.group(1) != old_b, stderr[-3000:]  # the new nodeB
    assert run_rows(run) == run_rows(in_process)  # no row lost or counted twice
    assert _eval(run) == _eval(in_process)
    print(
        f"unpinned on nodeB: env workers {envs_b}, learners {learners_b}; nodeB back {before['b_down_s']:.1f} s "
        f"after the kill; the run ended {killed.stopped_s:.1f} s after it",
        file=sys.stderr,
    )


@pytest.mark.ray
@pytest.mark.slow
def test_a_placement_too_big_for_one_node_spans_both_each_actor_on_its_bundles_node(two_nodes, in_process, tmp_path):
    """cluster.placement=colocated asks five one-CPU bundles (a PACK group per role, a SPREAD group of the two env
    workers): neither node holds them all (CPUS), so Ray places them on both; each env worker and learner says, from
    inside, that it runs on the node of its bundle, and the run's metrics and eval are the in-process run's."""
    run = tmp_path / "run"
    r = swarm(
        "run", *TINY_RUN, "checkpoint_every=1", "cluster.kind=ray", "cluster.env_workers=2", "cluster.learners=ray",
        "cluster.placement=colocated", f"cluster.address={two_nodes.address}", f"run_dir={run}",
        cwd=tmp_path, env=two_nodes.env, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(ln for ln in r.stderr.splitlines() if "placement bundles on nodes: " in ln)
    bundles = {
        g.split(": ", 1)[0]: re.findall(NODE, g) for g in line.split("placement bundles on nodes: ", 1)[1].split("; ")
    }
    assert set(bundles) == {"Logger", "Miner", "Smith", "envs"}, line
    assert {name for where in bundles.values() for _, name in where} == {"nodeA", "nodeB"}, line
    assert _nodes(r.stderr, "env workers on nodes: ") == bundles["envs"], r.stderr[-3000:]
    learners = re.findall(r"(\w+)\[0\] " + NODE, r.stderr.split("learners on nodes: ", 1)[1].splitlines()[0])
    assert {n: (i, name) for n, i, name in learners} == {g: where[0] for g, where in bundles.items() if g != "envs"}
    assert run_rows(run) == run_rows(in_process)
    assert _eval(run) == _eval(in_process)
    print(f"placement: {line.split('placement bundles on nodes: ', 1)[1]}", file=sys.stderr)


@pytest.mark.ray
@pytest.mark.slow
def test_actors_pinned_to_the_second_node_run_there_and_its_loss_stops_the_run_which_resumes_without_it(
    two_nodes, in_process, tmp_path
):
    """env workers, learners and the sampler asked to run on nodeB say, from inside, that they run there. nodeB (every
    actor of the run) killed while update 2 is under way: the run stops within cluster.restart_wait_s with one line
    naming what was lost and the resume command; that resume, on the head alone (cluster.resources={}), ends with the
    in-process run's metrics (each row once, the pinned run's update 1 among them) and eval."""
    run = tmp_path / "run"
    p, stderr, killed = _run_killing_b(two_nodes, tmp_path, [*RAY_ARGS, *ON_B, "cluster.restart_wait_s=5"])
    print(f"nodeB killed ({len(killed)} workers); the run stopped {killed.stopped_s:.1f} s later", file=sys.stderr)
    lines = _node_lines(stderr)
    envs = next(ln for ln in lines if "env workers on nodes" in ln)
    learners = next(ln for ln in lines if "learners on nodes" in ln)
    sampler = next(ln for ln in lines if "sampler actor on node" in ln)
    assert envs.count("(nodeB)") == 2 and learners.count("(nodeB)") == 3 and "(nodeB)" in sampler, lines
    assert "nodeA" not in " ".join(lines)
    assert p.returncode == 2 and "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("swarm: error: ") and "was lost" in last, last
    assert "cluster.restart_wait_s" in last and f"swarm run run_dir={run} resume=true" in last, last
    assert f"cluster.address={two_nodes.address}" in last, last

    r = swarm(
        "run", f"run_dir={run}", "resume=true", f"cluster.address={two_nodes.address}", "cluster.resources={}",
        cwd=tmp_path, env=two_nodes.env, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert run_rows(run) == run_rows(in_process)  # no row lost or counted twice
    assert _eval(run) == _eval(in_process)


@pytest.mark.parametrize(
    "args, says",
    [
        (["cluster.kind=ray", "cluster.resources.envs={nodeB: 1}"], "KIND one of env, learner, sampler"),
        (["cluster.kind=ray", "cluster.resources.env={CPU: 1}"], "not CPU, GPU, memory, object_store_memory"),
        (["cluster.kind=ray", "cluster.resources.env={nodeB: 0}"], "amount > 0"),
        (["cluster.resources.env={nodeB: 1}"], "needs cluster.kind=ray"),
        (["cluster.kind=ray", "cluster.placement=split", "cluster.resources.env={nodeB: 1}"], "cluster.placement=none"),
        (["cluster.kind=ray", "cluster.restart_wait_s=0"], "cluster.restart_wait_s=0"),
    ],
)
def test_bad_node_pins_are_one_line(args, says, tmp_path):
    r = swarm("config", "domain=minecraft", "task=wooden_pickaxe", *args, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("swarm: error: ") and says in last, last


def test_a_run_folder_of_config_version_7_loads_with_actors_anywhere(registry, tmp_path):
    """A config.yaml written before cluster.resources and cluster.restart_wait_s (version 7) loads with no pins and the
    120 s wait it had; the same file claiming version 8 is truncated and refused, naming the key."""
    from omegaconf import OmegaConf

    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import load_saved, resolve

    cfg = resolve(["domain=minecraft", "task=wooden_pickaxe"], registry[1])
    saved = OmegaConf.to_container(cfg, resolve=True)
    for key in ("resources", "restart_wait_s"):
        del saved["cluster"][key]
    saved["config_version"] = 7
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    old = load_saved(tmp_path / "config.yaml")
    assert old.cluster.resources == {} and old.cluster.restart_wait_s == 120.0
    saved["config_version"] = 8
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    with pytest.raises(ConfigError, match="lacks cluster.restart_wait_s"):
        load_saved(tmp_path / "config.yaml")


def test_each_actor_wrapper_waits_the_restart_wait_it_was_given():
    """``cluster.restart_wait_s`` is passed down (``cluster.restart_wait_s(cfg)``) to the env workers, the learners and
    the sampler actor, each waiting its own value for a dead actor (here 0 s, an actor that never answers again:
    each gives up at once, naming the wait); nothing module-wide is set."""
    from omegaconf import OmegaConf

    from swarm_runtime.cluster import actors, restart_wait_s
    from swarm_runtime.cluster.env_cluster import ActorGone, EnvCluster
    from swarm_runtime.cluster.learners import LearnerGone, LearnerGroup
    from swarm_runtime.cluster.samplers import RaySampler, SamplerActorError

    assert restart_wait_s(OmegaConf.create({"cluster": {"restart_wait_s": 7}})) == 7.0
    assert restart_wait_s(OmegaConf.create({})) == actors.RESTART_WAIT_S == 120.0

    class ray:  # what a wait asks of Ray, for actors that never answer again (each call's ref: Ray's error)
        exceptions = SimpleNamespace(
            RayActorError=type("RayActorError", (Exception,), {}), GetTimeoutError=type("GetTimeout", (Exception,), {})
        )

        @staticmethod
        def get(ref, timeout=None):
            raise ref

    def dead():
        return SimpleNamespace(pid=SimpleNamespace(remote=ray.exceptions.RayActorError))

    def wrapper(cls, **attrs):
        w = cls.__new__(cls)
        w.__dict__.update(ray=ray, restart_wait_s=0.0, **attrs)
        return w

    envs = wrapper(EnvCluster, workers=[dead()], pids=[5])
    with pytest.raises(ActorGone, match=r"env worker 0 \(pid 5\) was lost: .* within 0 s \(cluster.restart_wait_s"):
        envs.wait_alive(0)
    learners = wrapper(LearnerGroup, actors={"a": dead()}, pids={"a": 5}, restarts={"a": 0}, max_restarts=4)
    learners.roles = {"a": ["a"]}
    gone = learners._recover("a")
    assert isinstance(gone, LearnerGone) and "within 0 s (cluster.restart_wait_s" in str(gone), gone
    sampler = wrapper(RaySampler, actor=dead(), pid=5, max_restarts=8)
    with pytest.raises(SamplerActorError, match=r"within 0 s \(cluster.restart_wait_s"):
        sampler._recover()
    assert not hasattr(actors, "RESTART_TIMEOUT_S")


@pytest.mark.ray
def test_a_learner_restarted_between_calls_is_lost_not_answering_from_its_first_weights():
    """A learner actor whose process dies while the driver asks it nothing (found on two nodes: the learner on the lost
    node, restarted by Ray on the head before the run's next call) is restarted by Ray from its creation arguments:
    the driver's next call is refused from the new process (LearnerWorker.checked), so the run rewinds to its
    checkpoint (LearnerLost) instead of taking the first weights' answer (before: answered, unnoticed)."""
    pytest.importorskip("ray")
    from swarm_runtime.cluster.actors import wait_restarted
    from swarm_runtime.cluster.learners import LearnerGroup, LearnerLost
    from swarm_runtime.cluster.shards import _no_optimizers

    group = LearnerGroup({"a": SimpleNamespace()}, [("x", "a")], _no_optimizers, num_cpus=1, restart_wait_s=60)
    try:
        assert group._get({"a": group._call("a", "lrs")}) == {"a": {}}
        old = group.pids["a"]
        os.kill(old, signal.SIGKILL)
        new = wait_restarted(group.ray, group.actors["a"], old, 60)  # Ray restarted it; the driver was told nothing
        with pytest.raises(LearnerLost, match=rf"learner 'a' lost \(pid {old}\); restarted as pid {new}"):
            group._get({"a": group._call("a", "lrs")})
        assert group.pids["a"] == new and group.restarts["a"] == 1
        assert group._get({"a": group._call("a", "lrs")}) == {"a": {}}  # then asked in its new process
    finally:
        group.close()
