"""Sampler replicas in a placement, with GPUs (``cluster.sampler_replicas=2``, ``cluster.placement=split`` on a CUDA
profile; swarm_runtime/cluster/placement.py, sampling/replicas.py, cluster/vllm_actors.py), on a local Ray that declares
3 GPUs (Ray accepts a GPU count a machine does not have, and hands out their ids as if it had them) and our serve
worker standing in for vLLM: each replica's engine actor in a bundle of its own holding one CPU and one GPU (Ray's
per-bundle accounts), the two given different GPU ids, each server started with its actor's id as
``CUDA_VISIBLE_DEVICES``; a changed adapter version put in the object store ONCE for both replicas, and loaded on
both; a replica whose actor is killed and whose restarted actor's server cannot start is dropped (its rows go to the
other) instead of stopping the run; the last one, whose server dies and cannot start again under a sync, stops it with
the resumable line."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from enginekit import PROMPTS, learner_for, step_adapter
from omegaconf import OmegaConf
from test_engine_actor import _answers, worker_python

from swarm_runtime.core.protocols import Row
from swarm_runtime.sampling.http import EngineGone

#: 6 keyed rows over the three roles (3 per replica)
ROWS = [Row(m, p, (9, i, 0, 1)) for i, (m, p) in enumerate(list(PROMPTS.items()) * 2)]


def _environ(pid: int) -> dict:
    out = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = item.decode(errors="replace").partition("=")
        out[name] = value
    return out


def _failing_python(folder: Path, flag: Path) -> str:
    """:func:`worker_python`, whose server exits at once (code 3) while ``flag`` exists."""
    python = worker_python(folder)
    api = folder / "shim" / "vllm" / "entrypoints" / "openai" / "api_server.py"
    api.write_text(f"import os, sys\nif os.path.exists({str(flag)!r}):\n    sys.exit(3)\n" + api.read_text())
    return python


@pytest.fixture
def gpu_ray():
    """A local Ray of 4 CPUs and 3 (declared) GPUs on loopback, our own (``RAY_ADDRESS=local``)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray is already running in this process")
    was = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = "local"
    try:
        ray.init(
            address="local",
            num_cpus=4,
            num_gpus=3,
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    finally:
        os.environ.pop("RAY_ADDRESS") if was is None else os.environ.__setitem__("RAY_ADDRESS", was)
    yield ray
    ray.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_replicas_in_their_bundles_with_their_gpus_one_put_per_version_and_a_failed_restart_dropped(
    registry, gpu_ray, tmp_path, monkeypatch
):
    ray = gpu_ray
    from swarm_runtime.cluster.placement import (
        PlacementSpec,
        actor_options,
        bundles_in_use,
        engine_actor_options,
        make_placement,
        release,
        reserve,
    )
    from swarm_runtime.sampling.factory import replicated_sampler

    flag = tmp_path / "fail-the-next-start"
    cfg, learner = learner_for(registry)
    cfg = OmegaConf.merge(
        cfg,
        {
            "hardware": {"device": "cuda"},  # the profile the placement and the actors' GPUs are planned for
            "rollout": {"engine": "vllm", "vllm": {"python": _failing_python(tmp_path, flag)}},
            "cluster": {
                "kind": "ray",
                "samplers": "ray",
                "sampler_replicas": 2,
                "placement": "split",
                "sampler_restarts": 1,
            },
        },
    )
    whole = make_placement(cfg, learner.models())
    group = whole.group("default")  # the base's group: the learner's bundle, then one per replica
    assert group.bundles == ({"CPU": 1, "GPU": 1},) * 3 and group.actors["sampler"] == (1, 2)
    spec = PlacementSpec(whole.kind, [group])  # the env workers' group is not needed here
    reserve(spec, 60.0)
    rep = None
    try:
        options = [engine_actor_options(cfg, actor_options(spec, "default", "sampler", j)) for j in range(2)]
        assert [o["num_gpus"] for o in options] == [1.0, 1.0]  # the bundle's GPU, asked once (not twice)
        rep = replicated_sampler(cfg, learner, tmp_path / "run", 2, options=lambda j: options[j])
        actors = [s.server for s in rep.replicas]

        # 1. a bundle each: the learner's holds nothing here, each replica's its CPU and GPU
        end = time.monotonic() + 15.0
        while (held := bundles_in_use(spec, "default"))[1:] != [{"CPU": 1.0, "GPU": 1.0}] * 2:
            assert time.monotonic() < end, held
            time.sleep(0.2)
        assert held[0] == {"CPU": 0.0, "GPU": 0.0}, held

        # 2. different GPU ids, each server started with its actor's as CUDA_VISIBLE_DEVICES
        ids = [a.gpus for a in actors]
        assert all(len(i) == 1 for i in ids) and ids[0] != ids[1], ids
        for a in actors:
            pid = int((Path(a.log).parent / "server.pid").read_text())
            assert _environ(pid).get("CUDA_VISIBLE_DEVICES") == a.gpus[0], (a.gpus, pid)

        # 3. a changed version: one object in the store for both replicas, loaded on both
        puts = []
        real_put = ray.put
        monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(1) or real_put(value, **kw))
        step_adapter(learner, "Smith")
        rep.sync(learner, learner.models())
        assert len(puts) == 1, puts
        v = learner.version("Smith")
        assert [s.adapters.loaded["Smith"][-1] for s in rep.replicas] == [v, v]
        assert actors[0].kept["Smith"][-1][1] == actors[1].kept["Smith"][-1][1]  # the same ref
        monkeypatch.undo()
        before = rep.act(ROWS)

        # 4. replica 1's actor killed; Ray restarts it (cluster.sampler_restarts=1), and its server cannot start
        flag.touch()
        os.kill(actors[1].pid, signal.SIGKILL)
        end = time.monotonic() + 30.0  # its server goes with it (SIGTERM on its parent's death): rows then fail there
        while _answers(actors[1].url):
            assert time.monotonic() < end, "the killed actor's server still answers after 30 s"
            time.sleep(0.2)
        after = rep.act(ROWS)
        assert rep.live == [0] and list(rep.dropped) == [1], rep.dropped
        why = rep.dropped[1]
        assert "the restarted sampler actor of base 'default#1' could not start its vLLM server" in why, why
        assert "exited with code 3" in why and "resume=true" in why, why
        assert [a.tokens for a in after] == [a.tokens for a in before]  # keyed rows: the same answers on replica 0

        # 5. the last replica's server killed, and it cannot start again: the sync that finds it dead stops the run
        pid = int((Path(actors[0].log).parent / "server.pid").read_text())
        os.killpg(pid, signal.SIGKILL)
        end = time.monotonic() + 30.0
        while _answers(actors[0].url):
            assert time.monotonic() < end, "the killed server still answers after 30 s"
            time.sleep(0.2)
        step_adapter(learner, "Miner")
        with pytest.raises(EngineGone) as e:
            rep.sync(learner, learner.models())
        msg = str(e.value)
        assert msg.startswith("every sampler replica of base 'default' is gone (2 dropped: replica 0: "), msg
        assert "base 'default#0' died while loading Miner and did not come back" in msg, msg
        assert msg.endswith("resume it from its last checkpoint (swarm run resume=true)"), msg
    finally:
        if rep is not None:
            rep.close()
        release(spec)
