"""Shared pieces of the engine-sampler tests (docs/reference/engine.md); the ``registry`` fixture is tests/conftest.py's.

Tests marked ``engine`` need a real vLLM: ``SWARM_VLLM_PYTHON`` = the python of a virtualenv with vLLM
(``.ci/run`` builds one); without it they are skipped with that reason. The other tests here run on
any CPU against :mod:`refserver` (the same HTTP API, computed with transformers + PEFT)."""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/conftest.py helpers (run_context, swarm, TINY_RUN)

from conftest import run_context  # noqa: E402

from swarm_runtime.sampling.vllm_server import VLLMServer  # noqa: E402

# The tests' vLLM servers (and those their runs and Ray actors start, which inherit it) run the model in the engine
# core's process: no worker process and no subprocess to inspect the model, each importing torch again, which halves
# a server's start (CPU time of its processes: 36 s -> 20 s). Their HTTP API, runtime LoRA loading and process group
# are those a run's server has.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

#: An adapter swarm on the default tiny base (head size 32, which vLLM's CPU attention runs).
LORA = ("domain=minecraft", "task=wooden_pickaxe", "model.adapter=lora")
PROMPTS = {
    "Logger": "you are Logger . craft wooden_pickaxe . inventory : none . action :",
    "Miner": "you are Miner . inventory : none . action :",
    "Smith": "you are Smith . craft stick . action :",
}


@functools.lru_cache(maxsize=1)
def vllm_python() -> str | None:
    """``$SWARM_VLLM_PYTHON`` when it is a python with vLLM, else None."""
    from swarm_runtime.sampling.vllm_server import probe_python

    py = os.environ.get("SWARM_VLLM_PYTHON")
    if not py:
        return None
    try:
        probe_python(py)
    except Exception:
        return None
    return py


#: Marks a module's tests as needing a real vLLM (``pytest -m engine``).
needs_vllm = [
    pytest.mark.engine,  # SWARM_REQUIRE_VLLM=1 (.ci/run's cluster stage): fail instead of skipping
    pytest.mark.skipif(
        vllm_python() is None and not os.environ.get("SWARM_REQUIRE_VLLM"),
        reason="needs vLLM: set SWARM_VLLM_PYTHON to the python of a virtualenv with vllm "
        "(docs/reference/engine.md; .ci/run builds one)",
    ),
]


def perturb(policies: dict, seed: int = 1, scale: float = 0.05) -> None:
    """LoRA B starts at 0: give each role's adapter (and so its outputs) its own weights."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in policies.values():
            for w in p.parameters():
                w.add_(torch.randn_like(w) * scale)


def learner_for(registry, *extra: str, noise: int = 1):
    """``(cfg, learner)``: an adapter swarm from the config (perturbed adapters) in a LocalLearner."""
    from swarm_runtime.sampling.local import LocalLearner

    ctx = run_context(registry, *LORA, *extra)
    _, policies = ctx.build_swarm()
    perturb(policies, noise)
    return ctx.cfg, LocalLearner(policies)


def step_adapter(learner, model: str, seed: int = 7, scale: float = 0.2) -> None:
    """An "update" of ``model``: its adapter moved, its version bumped (what a trainer step does)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for w in learner.policy(model).parameters():
            w.add_(torch.randn_like(w) * scale)
    learner.bump([model])


class RefServer(VLLMServer):
    """The reference server (:mod:`refserver`) started, health-checked, stopped and restarted by the same
    code that runs a vLLM server."""

    no_lora = False

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            str(HERE / "refserver.py"),
            "--model",
            str(self.base),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-lora-rank",
            str(self.max_lora_rank),
        ]
        return cmd + (["--no-lora"] if self.no_lora else [])

    def env(self) -> dict:
        return {**os.environ, "OMP_NUM_THREADS": "1"}


def start_ref(base: Path, log: Path, no_lora: bool = False, timeout: float = 120.0) -> RefServer:
    s = RefServer(sys.executable, base, log, startup_timeout_s=timeout, max_lora_rank=64)
    s.no_lora = no_lora
    return s.start()


class WorkerServer(VLLMServer):
    """Our own serve worker (``python -m swarm_runtime.serve.worker --enable-lora``, what ``swarm serve`` runs for
    an adapter run), which speaks vLLM's token-level fields (swarm_runtime/serve/vllm_fields.py), started and
    stopped by the same code that runs a vLLM server."""

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "swarm_runtime.serve.worker",
            "--model",
            str(self.base),
            "--enable-lora",
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]

    def env(self) -> dict:
        return {**os.environ, "OMP_NUM_THREADS": "1"}


def start_worker(base: Path, log: Path, timeout: float = 120.0) -> WorkerServer:
    return WorkerServer(sys.executable, base, log, startup_timeout_s=timeout).start()


def served_names(url: str, key: str | None = None) -> set[str]:
    """The adapters the server at ``url`` lists (``key``: its bearer key, a server the run started)."""
    from swarm_runtime.sampling.http import Client

    return {m["id"] for m in Client(url, api_key=key).get("/v1/models")["data"] if m.get("parent")}


def served_key(port: int) -> str | None:
    """The bearer key of the vLLM server a run started on ``port`` (``VLLM_API_KEY`` in its environment, read as the
    same user: the run never logs it; docs/reference/engine.md, "Keys"); None while no such server runs."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            if b"vllm.entrypoints.openai.api_server" not in cmd or b"--port" not in cmd:
                continue
            if cmd[cmd.index(b"--port") + 1] != str(port).encode():
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        for item in env:
            if item.startswith(b"VLLM_API_KEY="):
                return item.split(b"=", 1)[1].decode()
    return None


def http_status(url: str, method: str, path: str, body: dict | None = None, key: str | None = None) -> int:
    """The HTTP status ``method path`` gets (with ``Authorization: Bearer key`` when ``key``)."""
    import json
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, data, headers, method=method), timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def openai_cfg(cfg, url: str, **rollout):
    from omegaconf import OmegaConf

    return OmegaConf.merge(cfg, {"rollout": {"engine": "openai", "url": url, **rollout}})


def kill_mid_call(sampler, server, rows):
    """Answer ``rows`` while the server is killed (-9) once the first request is in flight."""
    out: dict = {}

    def call():
        try:
            out["res"] = sampler.act(rows)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            out["err"] = exc

    t = threading.Thread(target=call)
    pid = server.proc.pid
    t.start()
    start = sampler.requests
    deadline = time.monotonic() + 30
    while sampler.requests == start and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(pid, signal.SIGKILL)
    t.join(180)
    return out


def vllm_env() -> dict:
    """Environment for a ``swarm run ... rollout.engine=vllm`` subprocess (tests/conftest.py ``swarm(env=...)``)."""
    return {"SWARM_VLLM_PYTHON": vllm_python() or ""}


def on_server(base, url: str) -> list[str]:
    """The run arguments of a LoRA swarm on the local base ``base`` (its folder, fp32) sampled on the
    OpenAI-compatible server at ``url`` (no SFT evaluation: the run's updates are what these tests compare)."""
    return [
        "skip_sft_eval=true",
        "model=local",
        f"model.path={base}",
        "model.dtype=float32",
        "model.adapter=lora",
        "rollout.engine=openai",
        f"rollout.url={url}",
    ]
