"""``swarm serve`` at the edges a production user meets first, with real processes on
127.0.0.1: bad values in every field, agent names and URLs, health probes for a load balancer,
admission per client, overload, degraded episodes, worker crash loops, a gateway killed with -9,
SIGTERM draining, a port in use, and an ``algo=rlcr`` run's one shared policy.

One run folder (its checkpoint in the RLCR layout: one model under ``agents/Shared``) serves three
gateways: ``main`` (three workers), ``bare`` (no worker of its own, 0.0.0.0 with an API key, tight
limits) and one the journal and SIGTERM tests start and stop themselves. Every process is stopped by pid.
"""

import asyncio
import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import ROOT  # noqa: E402
from test_serve import _free_port, _kill_pid, _start, _stop, _wait_health, build_run  # noqa: E402

KEY = "edge-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
HELD_OUT = 100000  # wooden_pickaxe's first eval seed


def _post_raw(url: str, body: bytes, **kw) -> httpx.Response:
    return httpx.post(
        url,
        content=body,
        headers={"content-type": "application/json", **kw.pop("headers", {})},
        timeout=kw.pop("timeout", 30),
        **kw,
    )


def _until(fn, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout}s: {what}")


@pytest.fixture(scope="module")
def run(registry, tmp_path_factory):
    """The run folder, its checkpoint laid out as algo=rlcr saves it: one shared policy, agents/Shared."""
    out = build_run(registry, tmp_path_factory.mktemp("edges") / "run")
    agents = out / "checkpoints/final/agents"
    shutil.copytree(agents / "Smith", agents / "Shared")
    for role in ("Logger", "Miner", "Smith"):
        shutil.rmtree(agents / role)
    broken = out / "checkpoints/final/broken"  # a "role folder" whose model cannot load
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    return out


class Gateway:
    def __init__(self, run: Path, args: list[str], log: Path, **env):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = _start(["swarm_runtime.cli.main", "serve", str(run), f"serve.port={self.port}", *args], log, **env)
        self.pids: list[int] = []

    def agents(self, headers=None) -> list[dict]:
        return httpx.get(f"{self.url}/v1/swarm/agents", headers=headers, timeout=10).json()["agents"]

    def stop(self, sig=signal.SIGTERM) -> None:
        _stop(self.proc, sig)
        for pid in self.pids:
            _kill_pid(pid)


@pytest.fixture(scope="module")
def main(run, tmp_path_factory):
    """Three workers, all from agents/Shared; two client-side episodes per client; a worker restarted
    twice within a minute fails."""
    g = Gateway(
        run,
        ["serve.probe_interval_ms=200", "serve.agent_wait_s=3", "serve.client_episodes=2", "serve.max_restarts=2"],
        tmp_path_factory.mktemp("main") / "gateway.log",
    )
    try:
        _wait_health(g.url, [g.proc], 240, logs=[g.log])
        g.pids = [a["pid"] for a in g.agents() if a["pid"]]
        yield g
        g.pids += [a["pid"] for a in g.agents() if a["pid"]]
    finally:
        g.stop()


@pytest.fixture(scope="module")
def bare(run, tmp_path_factory):
    """No worker of its own, one dead agent URL; on 0.0.0.0 with a key; one episode at a time (1 s of
    queueing); agents that do not answer within 2 s fail."""
    dead = _free_port()
    g = Gateway(
        run,
        [
            "serve.host=0.0.0.0",
            "serve.replicas=0",
            f"serve.agents=[Logger=http://127.0.0.1:{dead}]",
            "serve.agent_wait_s=2",
            "serve.startup_timeout_s=2",
            "serve.max_episodes=1",
            "serve.queue_wait_s=1",
            "serve.probe_interval_ms=200",
        ],
        tmp_path_factory.mktemp("bare") / "gateway.log",
        SWARM_API_KEY=KEY,
    )
    try:
        _until(lambda: _probe(g.url + "/health/live"), 120, "bare gateway live")
        yield g
        g.pids += [a["pid"] for a in g.agents(AUTH) if a["pid"]]
    finally:
        g.stop()
    assert KEY not in g.log.read_text()


def _probe(url: str, **kw):
    try:
        return httpx.get(url, timeout=2, **kw).status_code == 200
    except httpx.HTTPError:
        return False


# ---------------------------------------------------------------------------- 1. every field validated
def test_non_finite_numbers_are_a_400_naming_the_field(main):
    """NaN, Infinity and 1e999 anywhere: 400 naming the field (was: 500, or a reset connection)."""
    u = main.url
    for raw, field in (
        (b'{"temperature": NaN}', "temperature"),
        (b'{"temperature": Infinity}', "temperature"),
        (b'{"temperature": -Infinity, "seed": 100000}', "temperature"),
        (b'{"temperature": 1e999}', "temperature"),
    ):
        r = _post_raw(f"{u}/v1/episodes", raw)
        assert r.status_code == 400, (raw, r.status_code, r.text)
        body = r.json()
        assert body["error"]["param"] == field and field in body["detail"] and "finite" in body["detail"]
        assert set(body["error"]) == {"message", "type", "param", "code"}
    # a client-side turn's reward: refused, and the episode stays readable and ends as JSON
    ep = httpx.post(f"{u}/v1/episodes", json={"env": "client"}).json()
    first = httpx.post(f"{u}/v1/episodes/{ep['id']}/turns", json={"observation": "goal wooden_pickaxe"}, timeout=60)
    assert first.status_code == 200, first.text
    bad = _post_raw(f"{u}/v1/episodes/{ep['id']}/turns", b'{"observation": "x", "reward": NaN}')
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reward"
    assert httpx.get(f"{u}/v1/episodes/{ep['id']}").status_code == 200
    end = httpx.post(f"{u}/v1/episodes/{ep['id']}/turns", json={"observation": "x", "reward": 1.5, "done": True})
    assert end.status_code == 200 and end.json()["reward"] == 1.5
    # a worker: temperature NaN is a 400 in OpenAI's error shape
    worker = main.agents()[0]["url"]
    w = _post_raw(f"{worker}/v1/completions", b'{"prompt": "goal", "temperature": NaN}')
    assert w.status_code == 400 and w.json()["error"]["param"] == "temperature", w.text
    # wrong types: booleans are not numbers, an unknown field is named with the valid ones
    r = httpx.post(f"{u}/v1/episodes", json={"temperature": True})
    assert r.status_code == 422 and r.json()["error"]["param"] == "temperature"
    r = httpx.post(f"{u}/v1/episodes", json={"sede": 1})
    assert r.status_code == 422 and "sede" in r.json()["detail"] and "seed" in r.json()["detail"]
    r = _post_raw(f"{u}/v1/episodes", b"[1, 2]")
    assert r.status_code == 400 and "object" in r.json()["detail"]


def test_noise_out_of_range_and_bodies_that_are_not_json_are_refused_not_rewritten(bare):
    """A negative noise is a 422 naming the field and its range (was: wrapped to 2**64 - 1); a body sent as
    text/plain or a form is a 415 (was: read as JSON whatever its Content-Type said)."""
    u = bare.url
    for noise in (-1, "-1", 2**64, str(2**64)):
        r = httpx.post(f"{u}/v1/episodes", json={"noise": noise, "env": "client"}, headers=AUTH, timeout=30)
        assert r.status_code == 422, (noise, r.text)
        assert r.json()["error"]["param"] == "noise" and "[0, 2**64 - 1]" in r.json()["detail"], r.json()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "text/json"):
        r = _post_raw(f"{u}/v1/episodes", b'{"sede": 1}', headers={**AUTH, "content-type": ctype})
        assert r.status_code == 415, (ctype, r.text)
        assert ctype in r.json()["detail"] and "Content-Type: application/json" in r.json()["detail"]
    for ctype in ("application/json; charset=utf-8", "application/vnd.api+json"):  # JSON: read and validated
        r = _post_raw(f"{u}/v1/episodes", b'{"sede": 1}', headers={**AUTH, "content-type": ctype})
        assert r.status_code == 422 and "sede" in r.json()["detail"], (ctype, r.text)


def test_episodes_jsonl_stays_json(run, main):
    path = run / "serve/episodes.jsonl"
    lines = path.read_text().splitlines()
    assert lines
    for line in lines:
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in {path}"))


def test_seeds_outside_the_held_out_split_are_refused(main):
    u = main.url
    for seed, why in (
        (-5, "greater than or equal"),
        (2**70, "less than"),
        (10**400, "less than"),
        (5, "not in the eval split"),
        (True, "integer"),
        (1.5, "integer"),
        ("100000", "integer"),
    ):
        r = httpx.post(f"{u}/v1/episodes", json={"seed": seed, "env": "client"})
        assert r.status_code == 422, (seed, r.text)
        assert r.json()["error"]["param"] == "seed" and why in r.json()["detail"], (seed, r.json())
    assert "split" in httpx.post(f"{u}/v1/episodes", json={"seed": 5, "env": "client"}).json()["detail"]
    ok = [
        httpx.post(f"{u}/v1/episodes", json={"env": "client", **body})
        for body in ({"seed": 5, "split": "train"}, {"seed": HELD_OUT})
    ]
    assert [r.status_code for r in ok] == [200, 200], [r.text for r in ok]
    for r in ok:
        assert httpx.delete(f"{u}/v1/episodes/{r.json()['id']}").status_code == 200
    r = httpx.post(f"{u}/v1/episodes", json={"split": "nope"})
    assert r.status_code == 422 and "eval" in r.json()["detail"]


def test_worker_prompt_lists_rows_and_context(main):
    from swarm_runtime.serve.protocol import MAX_PROMPTS, MAX_ROWS

    worker = main.agents()[0]["url"]

    def ask(**body):
        return httpx.post(f"{worker}/v1/completions", json={"max_tokens": 2, **body}, timeout=60)

    r = ask(prompt=[])
    assert r.status_code == 422 and r.json()["error"]["param"] == "prompt"
    r = ask(prompt=["goal"] * (MAX_PROMPTS + 1))
    assert r.status_code == 422 and r.json()["error"]["param"] == "prompt"
    r = ask(prompt=["goal"] * MAX_PROMPTS, n=MAX_ROWS // MAX_PROMPTS + 1)
    assert r.status_code == 400 and str(MAX_ROWS) in r.json()["error"]["message"]
    r = ask(prompt=["goal wooden_pickaxe", "goal " * 2000])  # the model's context is 512 positions
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt[1]" and err["code"] == "context_length_exceeded"
    assert "512" in err["message"]
    r = ask(prompt=["goal wooden_pickaxe", "goal " * 300])  # within the context, over model.max_prompt_tokens
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt[1]" and "max_prompt_tokens=256" in err["message"]
    assert ask(prompt="goal wooden_pickaxe", seed=True).status_code == 422
    assert ask(prompt="goal wooden_pickaxe").status_code == 200
    # a model without a chat template: chat completions are a clear 400, not a guess
    chat = httpx.post(f"{worker}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "chat template" in chat.json()["error"]["message"]


# ---------------------------------------------------------------------------- 2. agent names and URLs
def test_agent_names_are_safe_unique_and_url_safe(run, main):
    u = main.url
    outside = run.parent / "outside"
    for name in (
        "../../../../../outside/traversal",
        str(outside / "abs"),
        "a/b",
        "Smith#2",
        "..",
        ".hidden",
        "x" * 65,
        "sp ace",
    ):
        r = httpx.post(f"{u}/v1/swarm/agents", json={"role": "Smith", "name": name})
        assert r.status_code == 422 and r.json()["error"]["param"] == "name", (name, r.text)
    assert not outside.exists() and not list(run.parent.glob("**/traversal.log"))
    # a replica's name needs no escaping: Smith@2, deleted by the name as typed
    r = httpx.post(f"{u}/v1/swarm/agents", json={"role": "Smith"})
    assert r.status_code == 201 and r.json()["name"] == "Smith@2", r.text
    main.pids.append(r.json()["pid"])
    _until(lambda: (run / "serve/workers/Smith@2.log").exists(), 60, "the worker's log, named as the agent")
    dup = httpx.post(f"{u}/v1/swarm/agents", json={"role": "Smith", "name": "Smith@2"})
    assert dup.status_code == 409
    gone = httpx.delete(f"{u}/v1/swarm/agents/Smith@2", timeout=60)
    assert gone.status_code == 200 and gone.json()["name"] == "Smith@2" and gone.json()["status"] == "removed"
    assert next(a for a in main.agents() if a["name"] == "Smith")["status"] == "up"
    # a checkpoint outside the run folder is refused
    r = httpx.post(f"{u}/v1/swarm/agents", json={"role": "Smith", "checkpoint": str(run.parent)})
    assert r.status_code == 422 and r.json()["error"]["param"] == "checkpoint"


def test_agent_urls_http_loopback_or_allowed(main):
    u = main.url
    for url, why in (
        ("file:///etc/passwd", "http(s)"),
        ("not a url", "http(s)"),
        ("http://10.1.2.3:8001", "allow_hosts"),
        ("http://169.254.169.254", "allow_hosts"),
        ("http://u:p@127.0.0.1:1", "base URL"),
        ("http://127.0.0.1:1/admin", "base URL"),
    ):
        r = httpx.post(f"{u}/v1/swarm/agents", json={"role": "Smith", "url": url})
        assert r.status_code == 422 and r.json()["error"]["param"] == "url" and why in r.json()["detail"], (url, r.text)
    assert all(a["url"].startswith("http://127.0.0.1") for a in main.agents())


def test_silent_agent_url_fails_instead_of_starting_forever(bare):
    """An agent URL that never answers is failed after serve.startup_timeout_s, with the reason."""
    a = _until(
        lambda: next((a for a in bare.agents(AUTH) if a["name"] == "Logger" and a["status"] == "failed"), None),
        30,
        "dead Logger URL failed",
    )
    assert "within 2s" in a["error"]
    metrics = httpx.get(f"{bare.url}/metrics", headers=AUTH).text
    assert 'swarm_agent_state{agent="Logger",role="Logger",state="failed"} 1' in metrics
    assert httpx.delete(f"{bare.url}/v1/swarm/agents/Logger", headers=AUTH).json()["status"] == "removed"


def test_crash_looping_worker_backs_off_then_gives_up(main):
    """A worker that cannot load is restarted with growing waits and failed after serve.max_restarts."""
    u = main.url
    t0 = time.time()
    r = httpx.post(
        f"{u}/v1/swarm/agents", json={"role": "Miner", "name": "Miner-broken", "checkpoint": "checkpoints/final/broken"}
    )
    assert r.status_code == 201, r.text
    a = _until(
        lambda: next((x for x in main.agents() if x["name"] == "Miner-broken" and x["status"] == "failed"), None),
        180,
        "crash-looping worker failed",
    )
    assert a["restarts"] == 2 and "serve.max_restarts=2" in a["error"]
    assert time.time() - t0 > 1.5  # waited 0.5 s, then 1 s, between restarts
    time.sleep(1.0)
    assert next(x for x in main.agents() if x["name"] == "Miner-broken")["restarts"] == 2  # no more
    swarm = httpx.get(f"{u}/v1/swarm").json()
    assert swarm["restart_policy"]["max_restarts"] == 2 and swarm["ready"]
    metrics = httpx.get(f"{u}/metrics").text
    assert 'swarm_agent_restarts_total{agent="Miner-broken"} 2' in metrics
    assert 'swarm_agent_state{agent="Miner-broken",role="Miner",state="failed"} 1' in metrics
    assert httpx.delete(f"{u}/v1/swarm/agents/Miner-broken").status_code == 200


# ---------------------------------------------------------------------------- 3. health
def test_health_probes_for_a_load_balancer(main, bare):
    assert httpx.get(f"{bare.url}/health").status_code == 401  # the full health needs the key
    live = httpx.get(f"{bare.url}/health/live")
    ready = httpx.get(f"{bare.url}/health/ready")
    assert live.status_code == 200 and live.json() == {"status": "live"}
    assert ready.status_code == 503 and ready.json() == {"status": "not_ready"}  # no agent of any role
    full = httpx.get(f"{bare.url}/health", headers=AUTH)
    assert full.status_code == 503 and full.json()["status"] == "no_agents" and not full.json()["ready"]
    assert httpx.get(f"{main.url}/health/ready").json() == {"status": "ready"}
    assert httpx.get(f"{main.url}/health").json()["ready"]
    models = httpx.get(f"{main.url}/v1/models").json()
    assert models["object"] == "list" and {m["id"] for m in models["data"]} >= {"Logger", "Miner", "Smith"}


def test_metrics_count_answers_states_and_durations(main):
    httpx.post(f"{main.url}/v1/episodes", json={"seed": -1})
    text = httpx.get(f"{main.url}/metrics").text
    for name in (
        'swarm_http_responses_total{code="422"}',
        "swarm_http_client_errors_total",
        "swarm_http_throttled_total",
        'swarm_agent_restarts_total{agent="Logger"} 0',
        'swarm_agent_state{agent="Logger",role="Logger",state="up"} 1',
        "swarm_episode_duration_seconds_count",
    ):
        assert name in text, name
    errors = next(float(l.split()[-1]) for l in text.splitlines() if l.startswith("swarm_http_client_errors_total "))
    assert errors >= 1


# ---------------------------------------------------------------------------- 4. admission
def test_client_episode_cap_per_client_and_cancel(main):
    u = main.url
    mine = [httpx.post(f"{u}/v1/episodes", json={"env": "client"}) for _ in range(2)]
    assert all(r.status_code == 200 for r in mine)
    third = httpx.post(f"{u}/v1/episodes", json={"env": "client"})
    assert third.status_code == 429 and "serve.client_episodes=2" in third.json()["detail"]
    assert int(third.headers["retry-after"]) >= 1
    # another client (another key) is not locked out by this one
    other = httpx.post(f"{u}/v1/episodes", json={"env": "client"}, headers={"Authorization": "Bearer someone-else"})
    assert other.status_code == 200
    assert httpx.delete(f"{u}/v1/episodes/{other.json()['id']}").status_code == 403  # not yours
    eid = mine[0].json()["id"]
    c = httpx.delete(f"{u}/v1/episodes/{eid}")
    assert c.status_code == 200 and c.json()["status"] == "cancelled"
    assert httpx.get(f"{u}/v1/episodes/{eid}").json()["status"] == "cancelled"
    assert httpx.post(f"{u}/v1/episodes/{eid}/turns", json={"observation": "x"}).status_code == 409
    again = httpx.post(f"{u}/v1/episodes", json={"env": "client"})
    assert again.status_code == 200
    for e in (mine[1], again):
        assert httpx.delete(f"{u}/v1/episodes/{e.json()['id']}").status_code == 200
    assert (
        httpx.delete(
            f"{u}/v1/episodes/{other.json()['id']}", headers={"Authorization": "Bearer someone-else"}
        ).status_code
        == 200
    )


def test_overload_waits_a_bounded_time_then_429(bare):
    u = bare.url
    held = httpx.post(f"{u}/v1/episodes", json={"env": "client"}, headers=AUTH)
    assert held.status_code == 200
    t0 = time.time()
    r = httpx.post(f"{u}/v1/episodes", json={"env": "client"}, headers=AUTH, timeout=30)
    waited = time.time() - t0
    assert r.status_code == 429 and "serve.max_episodes=1" in r.json()["detail"] and r.headers["retry-after"]
    assert 0.9 < waited < 10
    from swarm_runtime.serve.client import SwarmClient

    async def cancel():
        async with SwarmClient(u, api_key=KEY) as c:
            return await c.cancel(held.json()["id"])

    assert asyncio.run(cancel())["status"] == "cancelled"


def test_episode_losing_turns_to_faults_is_degraded(run, bare, tmp_path):
    """Every action of the only agent fails: no turn is acted on, so the episode is degraded, not done."""
    port = _free_port()
    w = _start(
        [
            "swarm_runtime.serve.worker",
            "--model",
            str(run / "checkpoints/final/agents/Shared"),
            "--name",
            "Smith-broken",
            "--port",
            str(port),
            "--fault-act-error-after",
            "0",
        ],
        tmp_path / "w.log",
    )
    try:
        _wait_health(f"http://127.0.0.1:{port}", [w], 240, logs=[tmp_path / "w.log"])
        r = httpx.post(
            f"{bare.url}/v1/swarm/agents",
            headers=AUTH,
            json={"role": "Smith", "url": f"http://127.0.0.1:{port}", "name": "Smith-broken"},
        )
        assert r.status_code == 201 and r.json()["status"] == "up", r.text
        body = httpx.post(
            f"{bare.url}/v1/episodes",
            headers=AUTH,
            timeout=120,
            json={"seed": HELD_OUT, "noise": "3", "max_decisions": 4},
        ).json()
        assert body["status"] == "degraded", body
        assert "serve.degraded_share" in body["error"] and body["decisions"] == 4
        assert 'swarm_episodes_total{status="degraded"} 1' in httpx.get(f"{bare.url}/metrics", headers=AUTH).text
        httpx.delete(f"{bare.url}/v1/swarm/agents/Smith-broken", headers=AUTH, timeout=30)
    finally:
        _stop(w)


# ---------------------------------------------------------------------------- 5. crash, drain, port
@pytest.fixture(scope="module")
def slow_worker(run, tmp_path_factory):
    """An external worker that takes 150 ms per answer (so an episode is still running when we stop
    things); the light gateways below serve it as every role."""
    port = _free_port()
    log = tmp_path_factory.mktemp("slow") / "w.log"
    w = _start(
        [
            "swarm_runtime.serve.worker",
            "--model",
            str(run / "checkpoints/final/agents/Shared"),
            "--name",
            "Smith",
            "--port",
            str(port),
            "--fault-delay-ms",
            "150",
        ],
        log,
    )
    try:
        _wait_health(f"http://127.0.0.1:{port}", [w], 240, logs=[log])
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(w)


def _light(run, worker, log, **env):
    return Gateway(
        run,
        [
            "serve.replicas=0",
            f"serve.agents=[Logger={worker},Miner={worker},Smith={worker}]",
            "serve.probe_interval_ms=200",
            "serve.shutdown_grace_s=60",
        ],
        log,
        **env,
    )


def test_gateway_killed_mid_episode_reports_it_interrupted(run, slow_worker, tmp_path):
    # a journal over 1 byte is compacted every second: the running episode must survive compaction too
    g = _light(run, slow_worker, tmp_path / "g1.log", SWARM_JOURNAL_COMPACT_BYTES="1")
    try:
        _until(lambda: _probe(g.url + "/health/ready"), 120, "gateway ready")
        done = httpx.post(f"{g.url}/v1/episodes", json={"env": "client"}).json()
        httpx.post(f"{g.url}/v1/episodes/{done['id']}/turns", json={"observation": "x", "done": True})
        ep = httpx.post(f"{g.url}/v1/episodes", json={"env": "client", "noise": "77"}).json()
        for r in (0.0, 1.0):
            assert (
                httpx.post(
                    f"{g.url}/v1/episodes/{ep['id']}/turns",
                    timeout=60,
                    json={"observation": "goal wooden_pickaxe", "reward": r},
                ).status_code
                == 200
            )
        _until(lambda: "journal compacted to the 1 running" in g.log.read_text(), 30, "a compaction")
        journal = (run / "serve/journal.jsonl").read_text()
        assert ep["id"] in journal and done["id"] not in journal  # only what is still running
        g.proc.kill()  # kill -9: no shutdown code runs
        g.proc.wait(30)
    finally:
        g.stop()
    g2 = _light(run, slow_worker, tmp_path / "g2.log")
    try:
        _until(lambda: _probe(g2.url + "/health/ready"), 120, "restarted gateway ready")
        r = httpx.get(f"{g2.url}/v1/episodes/{ep['id']}")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "interrupted" and body["decisions"] == 2 and [t["t"] for t in body["turns"]] == [0, 1]
        assert body["turns"][0]["reward"] == 1.0 and body["noise"] == "77" and body["seed"] == HELD_OUT
        listed = httpx.get(f"{g2.url}/v1/episodes", params={"status": "interrupted"}).json()["episodes"]
        assert [e["id"] for e in listed] == [ep["id"]] and "turns" not in listed[0]
        t = httpx.post(f"{g2.url}/v1/episodes/{ep['id']}/turns", json={"observation": "x"})
        assert t.status_code == 410 and "interrupted" in t.json()["detail"] and "noise 77" in t.json()["detail"]
        lines = [json.loads(x) for x in (run / "serve/episodes.jsonl").read_text().splitlines()]
        assert [x["status"] for x in lines if x["id"] == ep["id"]] == ["interrupted"]
        kept = next(x for x in lines if x["id"] == ep["id"])["samples"]  # its turns' token ids, from the journal
        assert len(kept) == 2 and all(s["action"] is None or s["action"]["token_ids"] for s in kept), kept
    finally:
        g2.stop()


def test_sigterm_drains_with_503_and_finishes_running_episodes(run, slow_worker, tmp_path):
    g = _light(run, slow_worker, tmp_path / "g.log")
    try:
        _until(lambda: _probe(g.url + "/health/ready"), 120, "gateway ready")
        lines = []
        with httpx.stream(
            "POST",
            f"{g.url}/v1/episodes",
            timeout=120,
            json={"seed": HELD_OUT, "noise": "5", "stream": True, "max_decisions": 8},
        ) as r:
            for line in r.iter_lines():
                lines.append(json.loads(line))
                if len(lines) == 2:
                    g.proc.send_signal(signal.SIGTERM)
                    time.sleep(0.3)
                    refused = httpx.post(f"{g.url}/v1/episodes", json={"env": "client"})
                    assert refused.status_code == 503 and refused.headers["retry-after"]
                    assert "shutting down" in refused.json()["detail"]
                    assert httpx.get(f"{g.url}/health/ready").status_code == 503
                    assert httpx.get(f"{g.url}/health/live").status_code == 200
        assert lines[-1]["final"] and lines[-1]["status"] == "done" and lines[-1]["decisions"] == 8
        assert g.proc.wait(60) in (0, -signal.SIGTERM)
    finally:
        g.stop()
    assert "swarm serve stopped" in (tmp_path / "g.log").read_text()


def test_port_in_use_is_reported_before_any_model_loads(run):
    from conftest import swarm

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t0 = time.time()
        r = swarm("serve", str(run), f"serve.port={port}", "serve.replicas=1", cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and f"serve.port={port}" in err[0] and "in use" in err[0] and "Traceback" not in r.stderr
    assert time.time() - t0 < 60


def test_bad_settings_at_start_are_a_config_error(run, warm_swarm, tmp_path):
    """What ``swarm serve`` refuses at start, ``swarm config`` refuses too (one validation system), in one line."""
    swarm = warm_swarm  # what serve does with the settings: the warm CLI (the port test above is cold)

    for args, word in (
        (["serve.agents=[Smith=http://10.9.9.9:8001]"], "serve.allow_hosts"),
        (["serve.degraded_share=2"], "serve.degraded_share"),
        (["serve.client_episodes=0"], "serve.client_episodes"),
        (["serve.queue_wait_s=-1"], "serve.queue_wait_s"),
        (["serve.max_restarts=0"], "serve.max_restarts"),
    ):
        r = swarm("serve", str(run), "serve.replicas=0", *args, cwd=ROOT, timeout=120)
        assert r.returncode == 2 and word in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        c = swarm("config", "domain=minecraft", "task=wooden_pickaxe", *args, cwd=tmp_path, timeout=120)
        assert c.returncode == 2 and word in c.stderr and "Traceback" not in c.stderr, c.stderr
        assert len(c.stderr.strip().splitlines()) == 1
    with socket.socket() as s:  # allowed: the URL passes, and the next check (the port, held here) speaks
        s.bind(("127.0.0.1", 0))
        s.listen()
        ok = swarm(
            "serve",
            str(run),
            "serve.replicas=0",
            "serve.agents=[Smith=http://10.9.9.9:8001]",
            "serve.allow_hosts=[10.9.9.9]",
            f"serve.port={s.getsockname()[1]}",
            cwd=ROOT,
            timeout=120,
        )
    assert ok.returncode == 2 and "in use" in ok.stderr and "allow_hosts" not in ok.stderr, ok.stderr


def test_a_truncated_model_is_one_line_naming_the_file_before_any_worker_starts(run, warm_swarm, tmp_path):
    """As ``swarm eval`` refuses it (was: exit 3 and uvicorn's traceback, "worker ... exited with 1 while
    starting")."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True, ignore=shutil.ignore_patterns("serve"))  # not the other gateways'
    weights = copy / "checkpoints/final/agents/Shared/model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    r = warm_swarm("serve", str(copy), "serve.port=0", cwd=ROOT, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    err = r.stderr.strip().splitlines()
    # the checkpoint check eval, export, serve and resume share (runs/agents_check.py)
    assert len(err) == 1 and str(weights) in err[0] and "the checkpoint is damaged" in err[0], err
    assert "checkpoint=TAG" in err[0]
    assert not (copy / "serve" / "workers").exists()


def _own_address() -> str | None:
    """This machine's address on its default route (a UDP socket's; no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def test_an_agent_url_that_is_the_gateway_itself_is_refused_at_start_and_when_registered(
    run, bare, warm_swarm, tmp_path
):
    """Its own address (was: admitted, then dropped and re-admitted forever): at start one line (exit 2); registered
    later a 422; under another name of the machine (found by the gateway's id in the answer) a 422 when registered,
    and failed for good when given at start."""
    port = _free_port()
    r = warm_swarm(
        "serve", str(run), f"serve.port={port}", "serve.replicas=0", f"serve.agents=[Smith=http://localhost:{port}]",
        cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (r.returncode, r.stderr[-2000:])
    assert f"url 'http://localhost:{port}' is this gateway itself" in r.stderr
    for url in (f"http://127.0.0.1:{bare.port}", f"http://localhost:{bare.port}/v1", f"http://[::1]:{bare.port}"):
        r = httpx.post(f"{bare.url}/v1/swarm/agents", json={"role": "Smith", "url": url}, headers=AUTH, timeout=30)
        assert r.status_code == 422 and "is this gateway itself" in r.json()["detail"], (url, r.text)
    assert not [a for a in bare.agents(AUTH) if str(bare.port) in a["url"]]
    ip = _own_address()
    if ip is None:
        pytest.skip("no address but loopback here: another name of the gateway's address cannot be tried")
    port = _free_port()
    g = Gateway(
        run,
        ["serve.host=0.0.0.0", f"serve.port={port}", "serve.replicas=0", f"serve.allow_hosts=[{ip}]",
         f"serve.agents=[Miner=http://{ip}:{port}]", "serve.probe_interval_ms=200"],
        tmp_path / "gateway.log",
        SWARM_API_KEY=KEY,
    )  # fmt: skip
    g.port, g.url = port, f"http://127.0.0.1:{port}"  # the later serve.port wins
    try:
        _until(lambda: _probe(g.url + "/health/live"), 120, "gateway live")
        miner = _until(lambda: next((a for a in g.agents(AUTH) if a["status"] == "failed"), None), 30, "Miner failed")
        assert miner["name"] == "Miner" and "is this gateway itself" in miner["error"], miner
        time.sleep(1.0)  # five probe intervals: it stays failed, never re-admitted
        assert [a["status"] for a in g.agents(AUTH)] == ["failed"]
        r = httpx.post(f"{g.url}/v1/swarm/agents", json={"role": "Smith", "url": f"http://{ip}:{port}"}, headers=AUTH)
        assert r.status_code == 422 and "answered with this gateway's id" in r.json()["detail"], r.text
        assert len(g.agents(AUTH)) == 1
    finally:
        g.stop()


def test_recovery_writes_an_episode_once_when_the_gateway_died_between_its_transcript_and_its_end(tmp_path):
    """Exactly once: an episode whose transcript line was written (fsynced) but whose journal ``end`` was not (the
    gateway killed between the two) is not written again as interrupted; an episode that never ended is, with its
    turns' samples (token ids and log-probs), and the journal starts afresh."""
    from swarm_runtime.serve.journal import Journal, append_synced, recover_into

    journal, transcripts = tmp_path / "journal.jsonl", tmp_path / "episodes.jsonl"
    j = Journal(journal)
    for eid in ("ep-a", "ep-b"):
        j.write({"ev": "start", "id": eid, "seed": 1, "noise": "2", "task": "wooden_pickaxe", "env": "server"})
        j.turn(eid, {"t": 0, "reward": 1.0}, {"bids": {}, "action": {"token_ids": [3], "logprobs": [-0.5]}})
    j.close()
    append_synced(transcripts, {"id": "ep-a", "status": "done", "turns": [{"t": 0, "reward": 1.0}]})
    assert [b["id"] for b in recover_into(journal, transcripts)] == ["ep-b"]
    lines = [json.loads(x) for x in transcripts.read_text().splitlines()]
    assert [(x["id"], x["status"]) for x in lines] == [("ep-a", "done"), ("ep-b", "interrupted")]
    assert lines[1]["samples"] == [{"bids": {}, "action": {"token_ids": [3], "logprobs": [-0.5]}}]
    assert recover_into(journal, transcripts) == [] and journal.read_bytes() == b""


def test_a_checkpoint_a_live_gateway_serves_is_kept_from_pruning_and_a_dead_ones_note_is_ignored(tmp_path):
    """``serve/serving.json`` (a gateway's versions): a run training in the folder keeps those checkpoints past
    ``keep_checkpoints``; the note of a gateway that is gone protects nothing, and only its writer removes it."""
    import subprocess
    import sys

    from swarm_runtime.runs.checkpoint import _prune
    from swarm_runtime.runs.runfiles import SERVING, clear_serving, serving_checkpoints, write_serving

    ck = tmp_path / "checkpoints"
    for i in range(4):
        (ck / f"iter-{i:06d}").mkdir(parents=True)
    write_serving(tmp_path, os.getpid(), [ck / "iter-000000"])
    _prune(ck, 2, set())
    assert sorted(p.name for p in ck.iterdir()) == ["iter-000000", "iter-000002", "iter-000003"]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_serving(tmp_path, gone.pid, [ck / "iter-000000"])
    assert serving_checkpoints(tmp_path) == set()
    _prune(ck, 2, set())
    assert sorted(p.name for p in ck.iterdir()) == ["iter-000002", "iter-000003"]
    clear_serving(tmp_path, os.getpid())  # another process's note: kept
    assert (tmp_path / SERVING).exists()
    clear_serving(tmp_path, gone.pid)
    assert not (tmp_path / SERVING).exists()
