"""Sampler replicas on Ray (``cluster.sampler_replicas=2``; swarm_runtime/rollout/replicas.py): a tiny ``swarm run``
whose base is served by two engine sampler actors (each its own server, the base shipped once for both) spreads
its rows over both (requests counted per replica at close) and writes the same metrics.jsonl rows as the run that
starts one server itself; kill -9 of one replica's actor mid-run: Ray restarts it and the trainer adopts it (its
rows sent again); kill -9 of its successor once its restarts are spent (``cluster.sampler_restarts=1``): the
replica is dropped with one warning, its rows go to the other, and the run finishes with the same rows. With our
serve worker standing in for vLLM (marked ``ray``, the cluster stage) and with a real vLLM (marked ``engine``)."""

from __future__ import annotations

import os
import re
import signal
import threading

from test_engine_actor import RAY, SERVERS, _rows, _run, _same_rows, served_here  # noqa: F401 - the fixture

import pytest

pytestmark = pytest.mark.parametrize("served_here", SERVERS, indirect=True)

TWO = [*RAY, "cluster.sampler_replicas=2"]
#: the trainer's log line of replica J's actor: its process
STARTED = re.compile(r"vLLM sampler actor on Ray \(default#(\d)\): pid (\d+), server (http://[\d.]+:\d+)")
RESTARTED = re.compile(r"sampler actor of base default#1 restarted: pid (\d+) -> (\d+)")
#: the close line: rows and requests per replica
COUNTS = re.compile(r"sampler replicas of base default: rows \[(\d+), (\d+)\], requests \[(\d+), (\d+)\]")


def test_two_replicas_share_the_rows_and_write_the_same_metrics(served_here, tmp_path):
    python, here = served_here
    code, out = _run(tmp_path, python, *TWO)
    assert code == 0, out[-4000:]
    assert sorted(m.group(1) for m in STARTED.finditer(out)) == ["0", "1"], out[-3000:]
    assert "base in place" in out  # one machine: both actors used the trainer's folder, nothing shipped
    rows = [int(v) for v in COUNTS.search(out).groups()]
    assert all(v > 0 for v in rows) and abs(rows[0] - rows[1]) <= rows[0] // 2, rows  # both drew rows
    assert len(COUNTS.findall(out)) == 1  # closed once
    _same_rows(tmp_path / "run", here)


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
    _same_rows(tmp_path / "run", here)
