"""The LLM judge against a real HTTP server on loopback that speaks the OpenAI
chat-completions protocol, with injected faults: answers slower than the
client timeout, 500s, 401s, garbage replies and non-JSON bodies. No grade may
be lost or invented: a grade is correct / incorrect as the server said, or
missing (and counted) when every bounded attempt failed."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from loguru import logger

pytest.importorskip("openai")

from swarm_domains.openresearcher.judge import DEFAULT_MODEL, LLMJudge, make_judge, parse_grade  # noqa: E402

KEY = "sk-test-secret-0123456789"
SLOW_S, TIMEOUT_S = 1.0, 0.25


class FakeChatServer(ThreadingHTTPServer):
    """Answers each POST with the next scripted behaviour ("ok" once the script is used up).

    "ok" grades like a careful grader: correct iff the response equals the reference."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: list[str] = []
        self.requests: list[dict] = []
        self.lock = threading.Lock()

    def next_behaviour(self) -> str:
        with self.lock:
            return self.script.pop(0) if self.script else "ok"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


def _completion(model: str, content: str) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class _Handler(BaseHTTPRequestHandler):
    server: FakeChatServer

    def log_message(self, *args):  # keep test output quiet
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        behaviour = self.server.next_behaviour()
        with self.server.lock:
            self.server.requests.append(
                {"path": self.path, "auth": self.headers.get("Authorization"), "body": body, "behaviour": behaviour}
            )
        prompt = body["messages"][0]["content"]
        if behaviour == "slow":
            time.sleep(SLOW_S)
            behaviour = "ok"
        if behaviour == "500":
            return self._send(500, b'{"error": {"message": "boom", "type": "server_error"}}')
        if behaviour == "401":
            return self._send(401, b'{"error": {"message": "bad key", "type": "auth"}}')
        if behaviour == "notjson":
            return self._send(200, b"<html>proxy error</html>", "text/html")
        if behaviour == "garbage":
            reply = _completion(body["model"], "I think... maybe? corrrect yes-ish")
            return self._send(200, json.dumps(reply).encode())
        response = re.search(r"\[response\]: (.*)", prompt).group(1).strip()
        reference = re.search(r"\[correct_answer\]: (.*)", prompt).group(1).strip()
        verdict = "yes" if response.lower() == reference.lower() else "no"
        text = f"extracted_final_answer: {response}\nreasoning: compared.\ncorrect: {verdict}"
        self._send(200, json.dumps(_completion(body["model"], text)).encode())


@pytest.fixture()
def server():
    srv = FakeChatServer()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture()
def logs():
    lines: list[str] = []
    sink = logger.add(lines.append, level="DEBUG", format="{message}")
    try:
        yield lines
    finally:
        logger.remove(sink)


def judge_for(server, tmp_path=None, **kw) -> tuple[LLMJudge, list[float]]:
    delays: list[float] = []
    cfg = dict(
        base_url=server.base_url,
        api_key=KEY,
        timeout_s=TIMEOUT_S,
        max_attempts=5,
        backoff_s=0.01,
        backoff_max_s=0.02,
        cache_dir=str(tmp_path / "grades") if tmp_path else None,
    )
    cfg.update(kw)
    return LLMJudge(sleep=delays.append, **cfg), delays


def test_parse_grade():
    assert parse_grade("extracted_final_answer: x\nreasoning: r\ncorrect: yes") is True
    assert parse_grade("correct: No\n") is False
    assert parse_grade("**correct**: yes") is True
    assert parse_grade("correct: no\n...\ncorrect: yes") is True  # the last verdict wins
    assert parse_grade("corrrect yes-ish") is None and parse_grade("") is None


def test_grades_over_http(server, logs):
    judge, delays = judge_for(server)
    ok = judge.grade("where was ada born ?", "north kelda", "North Kelda")
    bad = judge.grade("where was ada born ?", "north kelda", "south tarn")
    assert (ok.correct, ok.missing, ok.attempts) == (True, False, 1)
    assert (bad.correct, bad.missing, bad.attempts) == (False, False, 1)
    assert delays == []
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == f"Bearer {KEY}"
    assert req["body"]["model"] == DEFAULT_MODEL
    assert "[question]: where was ada born ?" in req["body"]["messages"][0]["content"]
    assert KEY not in "\n".join(logs) and KEY not in repr(judge)


def test_faults_are_retried_until_a_real_grade(server, logs):
    server.script = ["slow", "500", "garbage", "notjson"]
    judge, delays = judge_for(server)
    t0 = time.perf_counter()
    g = judge.grade("q ?", "north kelda", "north kelda")
    assert (g.correct, g.missing, g.attempts) == (True, False, 5)
    assert [r["behaviour"] for r in server.requests] == ["slow", "500", "garbage", "notjson", "ok"]
    assert delays == [0.01, 0.02, 0.02, 0.02]  # exponential, capped at backoff_max_s
    assert time.perf_counter() - t0 < SLOW_S + 3  # the slow answer was cut by the client timeout
    assert judge.stats["failures"] == 4 and judge.stats["missing"] == 0
    assert KEY not in "\n".join(logs)


@pytest.mark.parametrize("fault", ["500", "garbage", "slow", "notjson"])
def test_persistent_fault_gives_a_missing_grade_not_a_zero(server, fault, logs):
    server.script = [fault] * 3
    judge, delays = judge_for(server, max_attempts=3)
    g = judge.grade("q ?", "north kelda", "north kelda")
    assert g.missing and g.correct is None and g.attempts == 3 and g.error
    assert len(server.requests) == 3 and len(delays) == 2  # bounded: max_attempts requests, no more
    assert judge.stats["missing"] == 1
    assert any("grade missing" in line for line in logs) and KEY not in "\n".join(logs)


def test_client_errors_are_not_retried(server):
    server.script = ["401"] * 5
    judge, delays = judge_for(server)
    g = judge.grade("q ?", "a", "a")
    assert g.missing and g.correct is None and "AuthenticationError" in g.error
    assert len(server.requests) == 1 and delays == []


def test_grades_are_cached_on_disk_but_missing_ones_are_not(server, tmp_path):
    judge, _ = judge_for(server, tmp_path, max_attempts=2)
    assert judge.grade("q ?", "north kelda", "north kelda").correct is True
    again = judge.grade("q ?", "north kelda", "north kelda")
    assert again.correct is True and again.cached and len(server.requests) == 1
    fresh, _ = judge_for(server, tmp_path)  # a new process sees the same cache
    assert fresh.grade("q ?", "north kelda", "north kelda").cached and len(server.requests) == 1
    other_model, _ = judge_for(server, tmp_path, model="other-model")
    assert not other_model.grade("q ?", "north kelda", "north kelda").cached and len(server.requests) == 2
    server.script = ["500", "500"]
    assert judge.grade("q ?", "north kelda", "south tarn").missing
    n = len(server.requests)
    g = judge.grade("q ?", "north kelda", "south tarn")  # retried for real, not served a cached failure
    assert g.correct is False and not g.cached and len(server.requests) == n + 1


def test_key_and_base_url_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    judge = make_judge("llm", llm_cfg={"model": "m1", "base_url": None, "api_key": None, "timeout_s": 2})
    assert judge.grade("q ?", "x", "x").correct is True
    assert server.requests[-1]["auth"] == f"Bearer {KEY}" and server.requests[-1]["body"]["model"] == "m1"
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ValueError, match="needs an API key: set OPENAI_API_KEY"):
        make_judge("llm", llm_cfg={"base_url": server.base_url})


def test_env_with_llm_judge(server, tmp_path):
    """An episode graded over HTTP: the expert's answer earns 1; when the grader is
    down the terminal step says reward_missing and pays 0, and nothing is invented."""
    from swarm_domains.openresearcher.plugin import OpenResearcherDomain

    d = OpenResearcherDomain()
    cfg = d.task_config("embedded")
    cfg.judge = "llm"
    cfg.evidence_credit = 0.0  # the paper's binary reward: the whole 1 comes from the grade
    cfg.search.cache_dir = str(tmp_path / "bm25")
    cfg.llm_judge.update(base_url=server.base_url, api_key=KEY, timeout_s=TIMEOUT_S, max_attempts=2, backoff_s=0.0)
    env = d.make_env(cfg)
    env.reset(3)
    while not env.done:
        e = env.expert_action()
        r = env.step(e.action, e.role)
    assert r.reward == 1.0 and r.info["correct"] is True and "reward_missing" not in r.info
    server.script = ["500", "500"]
    env.reset(4)
    r = env.step(f"answer {env.question.answer}", "Finder")
    assert r.done and r.reward == 0.0 and r.info["reward_missing"] is True and "correct" not in r.info
    assert env.metrics()["reward_missing"] == 1.0
