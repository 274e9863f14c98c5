"""A vLLM server never outlives the run that started it (docs/guides/vllm.md, "Lifecycle"), tested on a stand-in vLLM:
a ``vllm`` package on ``PYTHONPATH`` whose ``vllm.entrypoints.openai.api_server`` starts an "engine core" child (as
vLLM's API server does) and answers ``/health``, started by the same code as a real server
(:class:`~swarm_runtime.sampling.vllm_server.VLLMServer`, through its watcher ``swarm_vllm_watch.py``). No real vLLM:
these run in the main suite (a few seconds each; the ``swarm run`` one about as long as a tiny LoRA run's SFT)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_RUN

#: The stand-in API server: an engine-core child, its pids in ``$FAKE_VLLM_PIDS``, ``/health`` answered, anything else
#: left hanging (a run waits there, as on a server that is still loading).
API_SERVER = """
import argparse, json, os, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, default=8000)
a, _ = ap.parse_known_args()
core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


class H(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/health":
            time.sleep(600)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer((a.host, a.port), H)
pids = os.environ["FAKE_VLLM_PIDS"]
with open(pids + ".tmp", "w") as f:
    json.dump({"api": os.getpid(), "core": core.pid, "port": a.port, "watch": os.getppid()}, f)
os.replace(pids + ".tmp", pids)
server.serve_forever()
"""


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> dict:
    """The stand-in ``vllm`` package on ``PYTHONPATH`` (this process's and its children's) and the file its server
    writes its pids to: ``{"path": folder, "pids": file}``."""
    root = tmp_path / "fake"
    pkg = root / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (root / "vllm", root / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(API_SERVER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    pids = tmp_path / "pids.json"
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(pids))
    return {"path": root, "pids": pids}


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie nobody reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(cond, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _start(tmp_path, fake_vllm):
    from swarm_runtime.sampling.vllm_server import VLLMServer

    server = VLLMServer(sys.executable, tmp_path, tmp_path / "vllm.log", api_key="k" * 32, startup_timeout_s=60)
    server.start()
    return server, json.loads(fake_vllm["pids"].read_text())


def test_stop_ends_the_group_after_the_api_server_died(tmp_path, fake_vllm):
    """7a. The API server killed (``kill -9``, as a crash): its watcher ends the engine core it leaves. With the
    watcher killed too (nothing left to end it), ``stop()`` still kills the group: the engine core is gone."""
    server, pids = _start(tmp_path, fake_vllm)
    try:
        assert alive(pids["core"]) and listening(pids["port"])
        os.kill(pids["api"], signal.SIGKILL)
        assert wait_for(lambda: not alive(pids["core"]), 10), "the watcher left the engine core running"
        assert wait_for(lambda: server.proc.poll() is not None, 10)
        assert server.proc.returncode == 128 + signal.SIGKILL  # the server's own end, passed on
    finally:
        server.stop()
    server, pids = _start(tmp_path, fake_vllm)
    try:
        os.kill(pids["watch"], signal.SIGKILL)
        os.kill(pids["api"], signal.SIGKILL)
        assert wait_for(lambda: server.proc.poll() is not None and not alive(pids["api"]), 10)
        assert alive(pids["core"])  # orphaned: only stop() can end it now
    finally:
        server.stop()
    assert wait_for(lambda: not alive(pids["core"]), 10), "stop() left the engine core of a dead API server running"


def test_a_restart_says_it_is_waiting(tmp_path, fake_vllm):
    """11. A restart prints a line when its wait starts (a real server takes about a minute to answer again)."""
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    server, pids = _start(tmp_path, fake_vllm)
    try:
        assert not any("again" in ln for ln in lines)  # the first start says nothing new
        assert server.restart()
        said = [ln for ln in lines if "starting the vLLM server" in ln]
        assert len(said) == 1 and "again" in said[0] and "waiting up to 60 s" in said[0] and "vllm.log" in said[0]
        assert not alive(pids["core"])  # the old server's engine core went with it
    finally:
        logger.remove(sink)
        server.stop()


def test_kill_9_of_swarm_run_leaves_no_server(tmp_path, fake_vllm):
    """7b. ``kill -9`` of ``swarm run`` (rollout.engine=vllm) while its server runs: within seconds the server's
    whole group (watcher, API server, engine core) is gone and its port closed."""
    args = [
        *TINY_RUN,
        "model.adapter=lora",
        "skip_sft_eval=true",
        "rollout.engine=vllm",
        f"rollout.vllm.python={sys.executable}",
        f"run_dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(
        [sys.executable, "-m", "swarm_runtime.cli.main", "run", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "run.err", "w"),  # noqa: SIM115 - closed with the process
    )
    try:
        started = wait_for(lambda: fake_vllm["pids"].exists() or run.poll() is not None, 300)
        assert started and run.poll() is None, (tmp_path / "run.err").read_text()[-3000:]
        pids = json.loads(fake_vllm["pids"].read_text())
        assert alive(pids["core"]) and listening(pids["port"])
    finally:
        run.kill()
        run.wait()
    gone = wait_for(lambda: not any(alive(pids[k]) for k in ("watch", "api", "core")), 20)
    assert gone, {k: alive(pids[k]) for k in ("watch", "api", "core")}
    assert not listening(pids["port"])
