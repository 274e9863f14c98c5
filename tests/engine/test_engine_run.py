"""The whole run on a real vLLM server (marked ``engine``: ``.ci/run``'s cluster stage): ``swarm run ...
model.adapter=lora rollout.engine=vllm`` in a subprocess trains, loads each changed role's adapter as a new version
after every update (seen in ``/v1/models`` while it runs), evaluates through the server, reports a sampler-learner
mismatch within fp32 tolerance, and stops its server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

from conftest import TINY_RUN
from enginekit import needs_vllm, served_key, vllm_env

from swarm_runtime.sampling.vllm_server import free_port, port_free

pytestmark = needs_vllm


def _models(port: int) -> set[str]:
    """What the run's server on ``port`` lists, asked with its key (every route but /health needs it)."""
    headers = {"Authorization": f"Bearer {served_key(port)}"}
    try:
        url = f"http://127.0.0.1:{port}/v1/models"
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as r:
            return {m["id"] for m in json.loads(r.read())["data"]}
    except Exception:
        return set()


def test_a_run_stopped_with_sigterm_stops_its_server(tmp_path):
    """A scheduler's stop (SIGTERM) of a run on vLLM leaves no server behind: the run unwinds and stops it."""
    import signal

    port = free_port("127.0.0.1")
    args = [a for a in TINY_RUN if not a.startswith(("algo.iterations", "tensorboard"))]
    cmd = [
        sys.executable,
        "-m",
        "swarm_runtime.cli.main",
        "run",
        *args,
        "algo.iterations=50",
        "tensorboard=false",
        "model.adapter=lora",
        "rollout.engine=vllm",
        f"rollout.vllm.port={port}",
        f"run_dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **vllm_env()}
    with subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        end = time.monotonic() + 900
        while not _models(port) and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.5)
        assert _models(port), "the run's server never answered"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    end = time.monotonic() + 60
    while not port_free("127.0.0.1", port) and time.monotonic() < end:
        time.sleep(0.5)
    assert port_free("127.0.0.1", port), "the vLLM server outlived its run"


def test_a_run_with_two_bases_trains_on_a_vllm_server_each_and_syncs_every_update(tmp_path):
    """``model.role_base.Smith=small`` (README, "A base per role"): two vLLM servers, one per base, each with its
    roles' adapters (their SFT versions v0, then a version per update that changed them); the run trains on their
    rollouts with a sampler-learner mismatch within fp32 tolerance, evaluates through both and stops both."""
    port = free_port("127.0.0.1")
    run = tmp_path / "run"
    small = [
        "model.bases.small.hidden_size=64",
        "model.bases.small.intermediate_size=128",
        "model.bases.small.num_layers=1",
        "model.bases.small.num_heads=2",
        "model.bases.small.num_kv_heads=1",
        "model.role_base.Smith=small",
    ]
    args = [a for a in TINY_RUN if not a.startswith(("algo.iterations", "tensorboard"))]
    cmd = [
        sys.executable,
        "-m",
        "swarm_runtime.cli.main",
        "run",
        *args,
        *small,
        "algo.iterations=3",
        "tensorboard=false",
        "model.adapter=lora",
        "rollout.engine=vllm",
        f"rollout.vllm.port={port}",
        f"run_dir={run}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **vllm_env()}
    seen: dict[int, set[str]] = {port: set(), port + 1: set()}
    with subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        end = time.monotonic() + 1500
        while proc.poll() is None and time.monotonic() < end:
            for p in seen:
                seen[p] |= _models(p)
            time.sleep(0.3)
        if proc.poll() is None:
            proc.kill()
        out = proc.stdout.read()
    assert proc.returncode == 0, out[-4000:]
    assert {"Logger@v0", "Miner@v0"} <= seen[port] and not any(m.startswith("Smith@") for m in seen[port]), seen
    assert "Smith@v0" in seen[port + 1] and not any(m.startswith(("Logger@", "Miner@")) for m in seen[port + 1]), seen
    # every role's adapter synced as a version per update it changed, after its SFT version (v0)
    roles = ("Logger", "Miner", "Smith")
    synced = {m for p in seen for m in seen[p] if "@v" in m and not m.endswith("@v0")}
    assert synced and {m.split("@")[0] for m in synced} <= set(roles), seen
    assert (run / "engine" / "base" / "config.json").exists() and (run / "engine" / "small" / "base").is_dir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    kl = {k: v for r in rows for k, v in r.items() if k.startswith("mismatch/approx_kl_")}
    worst = [v for r in rows for k, v in r.items() if k.startswith("mismatch/max_abs_dlogp_")]
    assert kl and worst, rows
    # each role sampled on its own base's server with the learner's weights, in fp32
    assert max(kl.values()) < 1e-6 and max(worst) < 1e-3, (kl, worst)
    assert set(json.loads((run / "eval.json").read_text())["results"]) == {"SFT only", "MPT"}
    versions = sorted(p for d in ("engine", "engine/small") for p in (run / d / "adapters").glob("*@v*"))
    assert versions and all(v.name.split("@")[0] in roles for v in versions), versions
    assert port_free("127.0.0.1", port) and port_free("127.0.0.1", port + 1)  # the run stopped both servers
    print(
        f"\nversions seen in /v1/models: {sorted(seen[port] | seen[port + 1])}\nmismatch: max approx KL "
        f"{max(kl.values()):.2e}, max |d log p| {max(worst):.2e}"
    )
