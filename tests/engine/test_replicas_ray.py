"""Sampler replicas on Ray (``cluster.sampler_replicas=2``; swarm_runtime/sampling/replicas.py): a tiny ``swarm run``
whose base is served by two engine sampler actors (each its own server, the base shipped once for both) spreads
its rows over both (requests counted per replica at close) and writes the same metrics.jsonl rows as the run that
starts one server itself; kill -9 of one replica's actor mid-run: Ray restarts it and the trainer adopts it (its
rows sent again); kill -9 of its successor once its restarts are spent (``cluster.sampler_restarts=1``): the
replica is dropped with one warning, its rows go to the other, and the run finishes with the same rows. With our
serve worker standing in for vLLM (marked ``ray``); the kill case on a real vLLM instead where one is given (marked
``engine``; it also shows rows on both replicas and the same metrics; test_engine_actor.KILL_SERVERS)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest
import test_engine_actor
from test_engine_actor import KILL_SERVERS, RAY, SERVERS, _run, _same_rows

served_here = test_engine_actor.served_here  #: the fixture: (vLLM's Python, the run that starts its own server)

TWO = [*RAY, "cluster.sampler_replicas=2"]
#: the trainer's log line of replica J's actor: its process
STARTED = re.compile(r"vLLM sampler actor on Ray \(default#(\d)\): pid (\d+), server (http://[\d.]+:\d+)")
RESTARTED = re.compile(r"sampler actor of base default#1 restarted: pid (\d+) -> (\d+)")
#: the close line: rows and requests per replica
COUNTS = re.compile(r"sampler replicas of base default: rows \[(\d+), (\d+)\], requests \[(\d+), (\d+)\]")


@pytest.mark.parametrize("served_here", SERVERS[:1], indirect=True)  # worker only: a vLLM case is the one below
def test_two_replicas_share_the_rows_and_write_the_same_metrics(served_here, tmp_path):
    python, here = served_here
    code, out = _run(tmp_path, python, *TWO)
    assert code == 0, out[-4000:]
    assert sorted(m.group(1) for m in STARTED.finditer(out)) == ["0", "1"], out[-3000:]
    assert "base in place" in out  # one machine: both actors used the trainer's folder, nothing shipped
    rows = [int(v) for v in COUNTS.search(out).groups()]
    assert all(v > 0 for v in rows) and abs(rows[0] - rows[1]) <= rows[0] // 2, rows  # both drew rows
    assert len(COUNTS.findall(out)) == 1  # closed once
    _same_rows(tmp_path / "run", here, python)


@pytest.mark.parametrize("served_here", KILL_SERVERS, indirect=True)  # a real vLLM where one is given
def test_a_killed_replica_is_adopted_then_dropped_and_the_run_finishes(served_here, tmp_path):
    python, here = served_here
    seen: dict = {}

    def watch(line: str) -> None:
        m = STARTED.search(line)
        if m and m.group(1) == "1" and "first" not in seen:
            seen["first"] = int(m.group(2))
            # once the trainer has loaded its versions (the replicated sampler is made, the run goes on)
        if "2 sampler replicas of base default" in line and "first" in seen and "killed" not in seen:
            seen["killed"] = True
            threading.Timer(2.0, os.kill, (seen["first"], signal.SIGKILL)).start()
        r = RESTARTED.search(line)
        if r and "second" not in seen:
            seen["second"] = int(r.group(2))
            os.kill(seen["second"], signal.SIGKILL)  # restarts spent (cluster.sampler_restarts=1): gone for good

    code, out = _run(tmp_path, python, *TWO, "cluster.sampler_restarts=1", watch=watch)
    assert code == 0, out[-4000:]
    assert "second" in seen, (seen, out[-3000:])
    dropped = [ln for ln in out.splitlines() if "sampler replica 1 of base default is gone" in ln]
    assert len(dropped) == 1 and "dropped, its rows go to the 1 live replica(s)" in dropped[0], out[-3000:]
    assert re.search(r"rows \[\d+, \d+\], requests \[\d+, \d+\] per replica; \[1\] dropped", out), out[-3000:]
    rows = [int(v) for v in COUNTS.search(out).groups()]
    assert all(v > 0 for v in rows) and len(COUNTS.findall(out)) == 1, rows  # rows on both before the drop
    _same_rows(tmp_path / "run", here, python)


@pytest.mark.ray
def test_the_base_is_hashed_once_and_its_files_put_in_the_object_store_only_when_asked(tmp_path):
    """``ship_base`` (one record for every replica of a base): the content hash read from disk, the files read and
    put in the object store on the first ask of an actor that cannot use the trainer's folder in place, the same
    object for every later ask; a base every node sees in place is never read into memory. ``replica_options``:
    ``SPREAD``, a node each, or the replica's own bundle."""
    ray = pytest.importorskip("ray")
    from swarm_runtime.cluster.base_shipping import (
        fetch_base,
        folder_digest,
        place_base,
        ship_base,
        unship,
        write_folder,
    )
    from swarm_runtime.cluster.placement import replica_nodes, replica_options

    files = {"config.json": b'{"a": 1}', "model.safetensors": bytes(range(256)) * 64}
    trainer = write_folder(files, tmp_path / "run" / "engine" / "base")
    from swarm_runtime.cluster.ray_helpers import connect

    assert connect(None, 1)  # a local Ray on 127.0.0.1, as a run starts it
    try:
        shipped = ship_base(trainer)
        assert shipped["digest"] == folder_digest(trainer) and shipped["path"] == str(trainer.resolve())
        source = shipped["files"][0]
        assert place_base(shipped, tmp_path / "node0", fetch_base) == (trainer.resolve(), "in place")
        assert ray.get(source.asked.remote()) == (0, False)  # in place: never read, nothing in the object store
        elsewhere = {**shipped, "path": str(tmp_path / "not-here")}
        for j in range(2):  # two replicas on two nodes without the folder
            (tmp_path / f"node{j + 1}").mkdir()
            where, how = place_base(elsewhere, tmp_path / f"node{j + 1}", fetch_base)
            assert how == "shipped" and (where / "model.safetensors").read_bytes() == files["model.safetensors"]
        assert ray.get(source.asked.remote()) == (2, True)
        first, second = ray.get(source.files.remote())[0], ray.get(source.files.remote())[0]
        assert first == second  # one object for every ask
        unship(shipped)
        end = time.monotonic() + 30.0  # ray.kill is asynchronous: a call made at once may still be answered
        while True:
            try:
                ray.get(source.asked.remote(), timeout=10)
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < end, "the BaseFiles actor still answers 30 s after unship"
            time.sleep(0.2)
        node = ray.get_runtime_context().get_node_id()
        assert replica_nodes(ray.nodes()) == [node] and replica_nodes(ray.nodes(), gpus=1) == []
        # a sampler pinned by cluster.resources.sampler: only nodes holding that resource
        assert replica_nodes(ray.nodes(), resources={"nodeB": 1}) == []
        assert replica_nodes(ray.nodes(), resources={"CPU": 1}) == [node]
    finally:
        ray.shutdown()
    assert replica_options(None) == {"scheduling_strategy": "SPREAD"}
    assert replica_options({"num_cpus": 0}, node).get("scheduling_strategy").node_id == node
    bundle = {"scheduling_strategy": object(), "num_cpus": 1.0, "num_gpus": 1.0}
    assert replica_options(bundle) == bundle  # a placement: each replica its own bundle, asked whole
