"""Engine sampler actors (``cluster.samplers=ray rollout.engine=vllm``; swarm_runtime/cluster/engine.py) on a real vLLM
and a local Ray bound to 127.0.0.1: a tiny ``swarm run`` whose vLLM server a Ray actor started (the base shipped
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
import threading
import time
import urllib.request

import pytest
from conftest import TINY_RUN
from enginekit import needs_vllm, vllm_env

pytestmark = needs_vllm

ARGS = [a for a in TINY_RUN if not a.startswith("tensorboard")] + [
    "tensorboard=false",
    "model.adapter=lora",
    "rollout.engine=vllm",
]
RAY = ["cluster.kind=ray", "cluster.env_workers=1", "cluster.num_cpus=2", "cluster.samplers=ray"]
#: the trainer's log line that names the actor's process and its server
STARTED = re.compile(r"vLLM sampler actor on Ray \(default\): pid (\d+), server (http://[\d.]+:\d+)")


def _rows(run_dir):
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def _models(url: str) -> set[str]:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as r:
            return {m["id"] for m in json.loads(r.read())["data"]}
    except Exception:
        return set()


def _run(tmp_path, *extra: str, watch=None) -> tuple[int, str]:
    """``swarm run ARGS extra`` in a subprocess; ``watch(line)`` sees each log line as it comes."""
    cmd = [sys.executable, "-m", "swarm_runtime.cli", "run", *ARGS, *extra, f"run_dir={tmp_path / 'run'}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "RAY_ADDRESS": "local", **vllm_env()}
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
    return proc.returncode, "".join(lines)


@pytest.fixture(scope="module")
def served_here(tmp_path_factory):
    """The run that starts its vLLM server itself (``cluster.samplers=local``)."""
    pytest.importorskip("ray")
    tmp = tmp_path_factory.mktemp("local")
    code, out = _run(tmp)
    assert code == 0, out[-4000:]
    return tmp / "run"


def test_an_actor_started_server_writes_the_same_metrics(served_here, tmp_path):
    code, out = _run(tmp_path, *RAY)
    assert code == 0, out[-4000:]
    m = STARTED.search(out)
    assert m, out[-3000:]
    assert "vLLM sampler actor of base default closed: {'calls'" in out
    assert _rows(tmp_path / "run") == _rows(served_here) and len(_rows(served_here)) >= 3
    # the trainer wrote the base in its run folder (as without the actor); the server loaded the actor's copy
    assert (tmp_path / "run" / "engine" / "base" / "config.json").exists()
    assert not (tmp_path / "run" / "engine" / "adapters").exists()  # adapters are written on the actor's node
    assert not _models(m.group(2))  # closing stopped the server


def test_a_killed_actor_is_restarted_with_a_new_server_and_the_run_finishes(served_here, tmp_path):
    """kill -9 of the actor once the first update's versions are loaded (``@v1`` in the server's /v1/models): the
    run ends with exit 0, one restart, a server on another port, and the same metrics rows as the run without
    the actor (no episode lost or played twice)."""
    seen: dict = {}

    def watch(line: str) -> None:
        m = STARTED.search(line)
        if m and "pid" not in seen:
            seen["pid"], seen["url"] = int(m.group(1)), m.group(2)

            def killer():
                end = time.monotonic() + 900
                while time.monotonic() < end:
                    if any(name.endswith("@v1") for name in _models(seen["url"])):
                        os.kill(seen["pid"], signal.SIGKILL)
                        seen["killed"] = time.monotonic()
                        return
                    time.sleep(0.2)

            threading.Thread(target=killer, daemon=True).start()

    code, out = _run(tmp_path, *RAY, watch=watch)
    assert code == 0, out[-4000:]
    assert "killed" in seen, out[-3000:]
    restarted = [ln for ln in out.splitlines() if "sampler actor of base default restarted: pid" in ln]
    assert len(restarted) == 1, out[-3000:]
    new_url = re.search(r"server \S+ -> (\S+);", restarted[0]).group(1)
    assert new_url != seen["url"], restarted  # the new actor's server took a port of its own
    assert not _models(seen["url"])  # the dead actor's server was stopped by its successor
    assert "'restarts': 1" in next(ln for ln in out.splitlines() if "sampler actor of base default closed" in ln)
    assert _rows(tmp_path / "run") == _rows(served_here)
