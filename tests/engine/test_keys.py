"""The bearer key of the vLLM servers a run starts (docs/reference/engine.md, "Keys"), without vLLM: our guard
(``swarm_runtime/sampling/vllm_guard/swarm_vllm_guard.py``) imported by its top-level name from its folder, as vLLM's
``--middleware`` imports it, in front of a real FastAPI app on a real uvicorn server; what :class:`VLLMServer` starts
a keyed server with; a user's ``--api-key`` refused before anything is written. The same on a real vLLM:
tests/engine/test_vllm.py ``-k key``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import swarm

from swarm_runtime.config.validation import config_files, config_key, key_arg
from swarm_runtime.sampling.vllm_guard import FOLDER, MIDDLEWARE
from swarm_runtime.sampling.vllm_server import VLLMServer, free_port

KEY = "k3y-" + "x" * 40

#: An app with routes named as vLLM's (an OpenAI one, the SageMaker ones, /tokenize, /metrics, /health), the guard
#: added as vLLM adds a ``--middleware`` class (``app.add_middleware(cls)``); prints whether swarm_runtime was imported.
APP = textwrap.dedent("""
    import importlib, sys
    import uvicorn
    from fastapi import FastAPI
    app = FastAPI()
    ok = lambda: {"ok": True}
    for path in ("/v1/completions", "/invocations", "/adapters", "/tokenize"):
        app.post(path)(ok)
    app.delete("/adapters/{name}")(ok)
    app.get("/metrics")(ok)
    app.get("/health")(ok)
    module, name = sys.argv[1].rsplit(".", 1)
    app.add_middleware(getattr(importlib.import_module(module), name))
    print("swarm_runtime imported:", any(m.startswith("swarm_runtime") for m in sys.modules), flush=True)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
""")


def status(url: str, method: str, path: str, key: str | None = None, auth: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if key or auth:
        headers["Authorization"] = auth or f"Bearer {key}"
    data = b"{}" if method == "POST" else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, data, headers, method=method), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def start_app(tmp_path: Path, key: str) -> tuple[subprocess.Popen, str]:
    port = free_port("127.0.0.1")
    env = {**os.environ, "VLLM_API_KEY": key, "PYTHONPATH": str(FOLDER)}
    (tmp_path / "app.py").write_text(APP)
    log = (tmp_path / "app.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "app.py"), MIDDLEWARE, str(port)], env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 60
    while time.monotonic() < end and proc.poll() is None:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the guarded app did not start: {(tmp_path / 'app.log').read_text()[-2000:]}")


def test_the_guard_demands_the_key_on_every_route_but_health(tmp_path):
    proc, url = start_app(tmp_path, KEY)
    try:
        routes = [
            ("POST", "/v1/completions"),
            ("POST", "/invocations"),
            ("POST", "/adapters"),
            ("DELETE", "/adapters/Logger@v0"),
            ("POST", "/tokenize"),
            ("GET", "/metrics"),
            ("GET", "/health/"),  # not the open path (exact match): a redirect would be answered without the key
            ("GET", "/nothing-here"),
        ]
        for method, path in routes:
            assert status(url, method, path) == 401, (method, path)
            assert status(url, method, path, key="not-the-key") == 401, (method, path)
            assert status(url, method, path, key=KEY[:-1]) == 401, (method, path)  # a prefix of it
            assert status(url, method, path, auth=f"Basic {KEY}") == 401, (method, path)  # another scheme
        for method, path in routes[:6]:
            assert status(url, method, path, key=KEY) == 200, (method, path)
            assert status(url, method, path, auth=f"bearer  {KEY} ") == 200, (method, path)  # case, spaces
        assert status(url, "GET", "/health") == 200
        assert status(url, "POST", "/health") == 401  # open to readiness probes only (GET, HEAD)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{url}/adapters", b"{}", method="POST"), timeout=10)
        assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"] == "Bearer"
        assert "Bearer" in json.loads(refused.value.read())["error"]
    finally:
        proc.kill()
        proc.wait()
    assert "swarm_runtime imported: False" in (tmp_path / "app.log").read_text()  # it runs in vLLM's virtualenv


def test_the_guard_without_a_key_refuses_to_be_built_and_closes_an_unkeyed_websocket(monkeypatch):
    sys.path.insert(0, str(FOLDER))
    try:
        import swarm_vllm_guard as guard
    finally:
        sys.path.remove(str(FOLDER))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match=r"\$VLLM_API_KEY is empty"):
        guard.BearerGuard(lambda *a: None)
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope.get("path"))

    async def send(msg):
        sent.append(msg)

    g = guard.BearerGuard(app)
    ws = {"type": "websocket", "path": "/v1/realtime", "headers": []}
    asyncio.run(g(ws, None, send))
    assert sent == [{"type": "websocket.close", "code": 1008}] and not reached
    asyncio.run(g({**ws, "headers": [(b"authorization", f"Bearer {KEY}".encode())]}, None, send))
    asyncio.run(g({"type": "lifespan"}, None, send))
    assert reached == ["/v1/realtime", None]  # with the key, and a lifespan event (no request) passes
    # a --root-path server: the open path is /health under it
    http = {"type": "http", "method": "GET", "headers": [], "root_path": "/api"}
    assert guard.allowed({**http, "path": "/api/health"}, guard.digest(KEY.encode()))
    assert not guard.allowed({**http, "path": "/api/adapters"}, guard.digest(KEY.encode()))


def test_a_keyed_server_is_started_with_the_guard_and_the_key_only_in_its_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("VLLM_API_KEY", "a-key-of-the-shell")
    keyed = VLLMServer("python3", tmp_path, tmp_path / "log", api_key=KEY)
    cmd, env = keyed.command(), keyed.env()
    assert cmd[cmd.index("--middleware") + 1] == MIDDLEWARE == "swarm_vllm_guard.BearerGuard"
    assert KEY not in " ".join(cmd)
    assert env["VLLM_API_KEY"] == KEY
    assert env["PYTHONPATH"].split(os.pathsep) == [str(FOLDER), "/elsewhere"]
    assert (FOLDER / "swarm_vllm_guard.py").is_file()
    plain = VLLMServer("python3", tmp_path, tmp_path / "log")
    assert "--middleware" not in plain.command() and "VLLM_API_KEY" not in plain.env()
    assert plain.env()["PYTHONPATH"] == "/elsewhere"


@pytest.mark.parametrize(
    "args, bad",
    [
        (["--api-key", "abc"], "--api-key"),
        (["--enforce-eager", "--api_key=abc"], "--api_key"),
        (["--api-k", "abc"], "--api-k"),
        (["--api-server-count", "1", "--max-model-len", "64"], None),
        (["--api", "x"], None),  # ambiguous for argparse: not a key
    ],
)
def test_key_arg(args, bad):
    assert key_arg(args) == bad


def _refused(tmp_path, args: str) -> str:
    """``swarm run`` on vLLM with ``rollout.vllm.args=ARGS``: exit 2 with one line (returned), no traceback, the key's
    value never printed, nothing written."""
    run_dir = tmp_path / "run"
    r = swarm(
        "run",
        "domain=minecraft",
        "model.adapter=lora",
        "rollout.engine=vllm",
        f"rollout.vllm.args={args}",
        f"run_dir={run_dir}",
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "secret" not in r.stderr + r.stdout
    assert not run_dir.exists()
    return lines[0]


def test_a_users_api_key_is_refused_before_anything_is_written(tmp_path):
    line = _refused(tmp_path, "[--enforce-eager,--api-key=secret]")
    assert "rollout.vllm.args gives --api-key" in line and "valid: rollout.vllm.args without --api-key" in line


@pytest.mark.parametrize(
    "text, key",
    [
        ("api-key: secret\nport: 8000\n", "api-key"),
        ("enforce-eager: true\napi_key: secret\n", "api_key"),
        ("api-k: secret\n", "api-k"),  # an abbreviation argparse takes
        ("api-server-count: 1\nmax-model-len: 64\n", None),
    ],
)
def test_config_key(text, key, tmp_path):
    """vLLM's ``--config FILE``: each YAML key becomes ``--key`` (``load_config_file``), so a key argparse reads as
    ``--api-key`` is found; a file that is not a YAML mapping says why."""
    f = tmp_path / "vllm.yaml"
    f.write_text(text)
    assert config_key(str(f)) == (key, "")
    assert config_files(["--enforce-eager", "--config", str(f)]) == config_files([f"--config={f}"]) == [str(f)]
    f.write_text("- api-key\n")
    assert config_key(str(f)) == (None, "holds list, not a YAML mapping of vLLM's arguments")
    assert config_key(str(tmp_path / "missing.yaml"))[1].startswith("cannot be read as YAML (FileNotFoundError")


def test_a_config_file_setting_the_api_key_is_refused_before_anything_is_written(tmp_path):
    """``--config FILE`` in ``rollout.vllm.args`` whose YAML sets ``api-key`` would give vLLM a key over the run's:
    refused in one line naming the file and the key; a file that cannot be read, refused too (it cannot be checked)."""
    (tmp_path / "vllm.yaml").write_text("enforce-eager: true\napi-key: secret\n")
    line = _refused(tmp_path, "[--config,vllm.yaml]")
    assert "--config vllm.yaml, whose key 'api-key' sets vLLM's API key" in line, line
    assert "valid: a --config file without 'api-key'" in line, line
    line = _refused(tmp_path, "[--config,nowhere.yaml]")
    assert "--config nowhere.yaml, which cannot be read as YAML (FileNotFoundError" in line, line
