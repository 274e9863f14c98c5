"""Sampler replicas (swarm_runtime/sampling/replicas.py, ``cluster.sampler_replicas``) on any CPU: two reference
servers (tests/engine/refserver.py, vLLM's HTTP API on transformers + PEFT) of the run's base, an engine sampler on
each, under one :class:`ReplicatedSampler`: rows spread over both and back in order, the same answers as one
server, sync to every replica, a replica killed for good dropped and its rows answered by the other, none left one
clear error. The same over engine actors and a real vLLM: test_replicas_ray.py (``-m engine``)."""

from __future__ import annotations

import os
import signal

import pytest
from enginekit import PROMPTS, learner_for, openai_cfg, served_names, start_ref, step_adapter

from swarm_runtime.core.protocols import Row
from swarm_runtime.sampling.factory import engine_folder, engine_sampler, write_base
from swarm_runtime.sampling.http import EngineGone
from swarm_runtime.sampling.replicas import ReplicatedSampler, spread

#: 9 keyed rows over the three roles (3 per replica of 2: 5 and 4)
ROWS = [Row(m, p, (5, i, 0, 1)) for i, (m, p) in enumerate(list(PROMPTS.items()) * 3)]


def test_spread_is_balanced_contiguous_and_covers_every_row():
    assert spread(9, 2) == [(0, 5), (5, 9)]
    assert spread(2, 3) == [(0, 1), (1, 2), (2, 2)]
    assert spread(0, 2) == [(0, 0), (0, 0)]
    for n in range(12):
        for k in range(1, 5):
            parts = spread(n, k)
            assert parts[0][0] == 0 and parts[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
            sizes = [b - a for a, b in parts]
            assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="n_replicas=0 is not valid; valid: at least 1"):
        spread(3, 0)


@pytest.fixture
def two(registry, tmp_path):
    """``(cfg, learner, run_dir, [server, server])``: two reference servers of the run's base."""
    cfg, learner = learner_for(registry)
    shared = next(iter(learner.policies.values())).shared_base
    base = write_base(shared, engine_folder(tmp_path) / "base")
    servers = [start_ref(base, tmp_path / f"ref{j}.log") for j in range(2)]
    yield cfg, learner, tmp_path, servers
    for s in servers:
        s.stop()


def replicated(cfg, learner, run_dir, servers, **rollout) -> ReplicatedSampler:
    return ReplicatedSampler(
        [engine_sampler(openai_cfg(cfg, s.url, **rollout), learner, run_dir / f"r{j}") for j, s in enumerate(servers)]
    )


def test_rows_spread_over_replicas_in_order_and_sync_reaches_every_replica(two):
    cfg, learner, run_dir, servers = two
    one = engine_sampler(openai_cfg(cfg, servers[0].url), learner, run_dir / "one")
    rep = replicated(cfg, learner, run_dir, servers)
    try:
        # unkeyed rows: the seeds one sampler's generator draws, in its order, whichever replica asks
        free = [Row(r.model, r.prompt) for r in ROWS]
        for _ in range(2):
            assert [a.tokens for a in rep.act(free)] == [a.tokens for a in one.act(free)]
            assert [b.level for b in rep.bid(free)] == [b.level for b in one.bid(free)]
        before = [s.requests for s in rep.replicas]
        acts = rep.act(ROWS)
        assert [s.requests - b for s, b in zip(rep.replicas, before)] == [5, 4]  # contiguous halves
        assert rep.rows == [5 * 5, 4 * 5]  # and 2 x (act + bid) of the unkeyed rows before
        alone = one.act(ROWS)
        assert [a.tokens for a in acts] == [a.tokens for a in alone]  # keyed seeds: the same answer on either
        assert [a.logprobs for a in acts] == [a.logprobs for a in alone]
        bids = rep.bid(ROWS)
        assert [b.level for b in bids] == [b.level for b in one.bid(ROWS)]
        step_adapter(learner, "Miner")
        rep.sync(learner, ["Miner"])
        for s in servers:  # the same version names on every replica; v0 unloaded on each (max_staleness=0)
            assert served_names(s.url) == {"Logger@v0", "Miner@v1", "Smith@v0"}
        assert rep.version("Miner") == 1 == rep.replicas[1].version("Miner")
        after = rep.act(ROWS)
        assert [a.version for a in after] == [int(r.model == "Miner") for r in ROWS]
        one.sync(learner, ["Miner"])
        assert [a.tokens for a in after] == [a.tokens for a in one.act(ROWS)]
    finally:
        rep.close()
        one.close()


def test_a_replica_gone_for_good_is_dropped_and_the_last_one_stops_the_run(two):
    cfg, learner, run_dir, servers = two
    rep = replicated(cfg, learner, run_dir, servers, retries=0)
    try:
        want = [a.tokens for a in rep.act(ROWS)]
        os.killpg(servers[1].proc.pid, signal.SIGKILL)  # no recover for a server the run did not start: gone
        servers[1].proc.wait(30)
        again = rep.act(ROWS)  # replica 1's rows failed, then went to replica 0
        assert [a.tokens for a in again] == want
        assert rep.live == [0] and list(rep.dropped) == [1]
        assert rep.rows == [5 + 9, 4]
        step_adapter(learner, "Smith")
        rep.sync(learner, ["Smith"])  # the dropped replica is not asked
        assert served_names(servers[0].url) == {"Logger@v0", "Miner@v0", "Smith@v1"}
        os.killpg(servers[0].proc.pid, signal.SIGKILL)
        servers[0].proc.wait(30)
        with pytest.raises(
            EngineGone, match=r"every sampler replica of base 'default' is gone \(2 dropped: .*resume=true"
        ):
            rep.act(ROWS)
    finally:
        rep.close()
