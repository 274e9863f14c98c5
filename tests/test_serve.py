"""``swarm serve`` with real processes: a gateway and its agent workers on 127.0.0.1.

One tiny checkpoint is built in process (no training: the service's job is to serve whatever was
trained), one gateway with three workers is shared by the module, and a fourth worker with injected
faults is started by the tests themselves. Every process started here is stopped by pid.
"""

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from conftest import ROOT  # noqa: E402

RUN_ARGS = [
    "domain=minecraft",
    "task=wooden_pickaxe",
    "task.max_decisions=12",
    "eval.episodes=2",
    "eval.runs=1",
    "hardware.threads=1",
    "progress=false",
]


def _free_port() -> int:
    from swarm_runtime.serve.population import free_port

    return free_port()


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


def _start(args: list[str], log: Path, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", *args], cwd=ROOT, env=_env(**env), stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM, wait: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_health(url: str, procs, timeout: float, headers=None, logs=()) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        for p, log in zip(procs, logs):
            if p.poll() is not None:
                raise AssertionError(f"process exited with {p.returncode}:\n{log.read_text()[-3000:]}")
        try:
            r = httpx.get(f"{url}/health", headers=headers, timeout=2)
            if r.status_code in (200, 503) and r.json().get("status") in ("ok", "no_agents", "degraded"):
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} not healthy after {timeout}s:\n" + "\n".join(l.read_text()[-2000:] for l in logs))


@contextlib.contextmanager
def worker_on(ckpt: Path, log: Path, name: str = "bpe"):
    """The URL of one ``python -m swarm_runtime.serve.worker`` on ``ckpt`` (127.0.0.1, a free port), up until the
    block ends; its output in ``log``."""
    port = _free_port()
    proc = _start(["swarm_runtime.serve.worker", "--model", str(ckpt), "--name", name, "--port", str(port)], log)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, [proc], 240, logs=[log])
        yield url
    finally:
        _stop(proc)


def build_run(registry, out: Path) -> Path:
    """A run folder with a ``final`` checkpoint of three freshly initialised role models."""
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import resolve
    from swarm_runtime.runs.checkpoint import save_checkpoint
    from swarm_runtime.runs.context import RunContext

    pm, reg = registry
    cfg = resolve(RUN_ARGS + [f"run_dir={out}"], reg)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    _, policies = RunContext(cfg, pm, reg, out).build_swarm()
    save_checkpoint(out, "final", policies, {}, {"iteration": 0}, random.Random(0))
    return out


class Served:
    def __init__(self, run, url, gateway, faulty_url, faulty):
        self.run, self.url, self.gateway, self.faulty_url, self.faulty = run, url, gateway, faulty_url, faulty

    def agents(self) -> list[dict]:
        return httpx.get(f"{self.url}/v1/swarm/agents", timeout=10).json()["agents"]


@pytest.fixture(scope="module")
def served(registry, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    run = build_run(registry, tmp / "run")
    port, wport = _free_port(), _free_port()
    glog, wlog = tmp / "gateway.log", tmp / "faulty.log"
    gateway = _start(
        [
            "swarm_runtime.cli.main",
            "serve",
            str(run),
            f"serve.port={port}",
            "serve.probe_interval_ms=200",
            "serve.agent_wait_s=3",
        ],
        glog,
    )
    # a Smith that always bids 0.8 and fails every action after its first two: joins the swarm later by URL
    faulty = _start(
        [
            "swarm_runtime.serve.worker",
            "--model",
            str(run / "checkpoints/final/agents/Smith"),
            "--name",
            "Smith-faulty",
            "--port",
            str(wport),
            "--fault-bid",
            "0.8",
            "--fault-act-error-after",
            "2",
        ],
        wlog,
    )
    pids: list[int] = []
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, [gateway], 240, logs=[glog])
        _wait_health(f"http://127.0.0.1:{wport}", [faulty], 240, logs=[wlog])
        s = Served(run, url, gateway, f"http://127.0.0.1:{wport}", faulty)
        pids = [a["pid"] for a in s.agents() if a["pid"]]
        yield s
        pids += [a["pid"] for a in s.agents() if a["pid"]]
    finally:
        _stop(gateway)
        _stop(faulty)
        for pid in pids:  # the gateway stops its workers; make sure
            _kill_pid(pid)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal
    assert gateway.returncode in (0, -signal.SIGTERM), glog.read_text()[-3000:]
    assert "swarm serve stopped" in glog.read_text()


def served_equals_in_process(registry, run, url) -> dict:
    """Keyed sampling: the swarm served at ``url`` plays the in-process `swarm eval` episodes of ``run``'s final
    checkpoint exactly, turn by turn (asserted); returns the in-process result."""
    import torch

    from swarm_runtime.config.load import load_saved
    from swarm_runtime.evaluation.heldout import evaluate
    from swarm_runtime.runs.context import RunContext
    from swarm_runtime.serve.client import evaluate_served

    pm, reg = registry
    cfg = load_saved(run / "config.yaml")
    ctx = RunContext(cfg, pm, reg, run)
    agents, _ = ctx.build_swarm(run / "checkpoints/final/agents")
    seeds = ctx.seeds("eval")
    torch.set_num_threads(1)
    res, eps = evaluate(
        agents,
        ctx.coordinator(),
        ctx.domain,
        ctx.task,
        seeds,
        1,
        int(cfg.seed) + 7919,
        cfg.eval.temperature,
        common_random_numbers=True,
    )
    sres, seps, bodies = asyncio.run(evaluate_served(url, seeds, 1, int(cfg.seed) + 7919, None, None))
    assert [b["status"] for b in bodies] == ["done"] * len(seeds), [
        (b["error"], [(r["missed"], r["bids"], r["latency_ms"]) for r in b["turns"]]) for b in bodies
    ]
    for a, b in zip(eps, seps):
        assert [(t.winner, t.bids, t.action_text, t.reward, t.valid) for t in a.turns] == [
            (t.winner, t.bids, t.action_text, t.reward, t.valid) for t in b.turns
        ]
        assert a.metrics == b.metrics
    assert sres["reward_mean"] == res["reward_mean"] and sres["turn_share"] == res["turn_share"]
    return res


def test_served_episode_equals_in_process(served, registry, capsys):
    """Keyed sampling: the served swarm plays the in-process `swarm eval` episodes exactly, turn by turn."""
    from swarm_runtime.cli.main import main

    res = served_equals_in_process(registry, served.run, served.url)
    # the CLI branch: the same table through the service
    assert main(["eval", str(served.run), f"serve.url={served.url}"]) == 0
    out = capsys.readouterr().out
    assert "served checkpoint final" in out
    saved = json.loads(next(served.run.glob("eval-served-final*.json")).read_text())
    assert saved["reward_mean"] == res["reward_mean"] and saved["served_by"] == served.url


def test_client_side_episode_and_bad_requests(served):
    u = served.url
    ep = httpx.post(f"{u}/v1/episodes", json={"env": "client", "seed": 5, "split": "train"}).json()
    assert ep["status"] == "running" and ep["agents"] == ["Logger", "Miner", "Smith"]
    moves = [
        httpx.post(
            f"{u}/v1/episodes/{ep['id']}/turns",
            timeout=30,
            json={"observation": "goal wooden_pickaxe . inventory : none", "reward": r},
        ).json()
        for r in (0.0, 1.0, 2.0)
    ]
    assert [m["t"] for m in moves] == [0, 1, 2]
    assert all(set(m) >= {"agent", "role", "bid", "action"} for m in moves)
    assert all(m["role"] in (None, "Logger", "Miner", "Smith") for m in moves)
    end = httpx.post(f"{u}/v1/episodes/{ep['id']}/turns", json={"observation": "x", "reward": 4.0, "done": True}).json()
    assert end["status"] == "done" and end["reward"] == 7.0 and end["decisions"] == 3
    again = httpx.post(f"{u}/v1/episodes/{ep['id']}/turns", json={"observation": "x"})
    assert again.status_code == 409 and "done" in again.json()["detail"]
    # malformed JSON, a wrong field, an unknown episode, an oversized body, an unknown role or task
    bad = httpx.post(f"{u}/v1/episodes", content=b'{"seed": 1', headers={"content-type": "application/json"})
    assert (
        bad.status_code == 400
        and "JSON" in bad.json()["detail"]
        and bad.json()["error"]["type"] == "invalid_request_error"
    )
    assert httpx.post(f"{u}/v1/episodes", json={"sede": 1}).status_code == 422
    missing = httpx.post(f"{u}/v1/episodes/ep-nope/turns", json={"observation": "x"})
    assert missing.status_code == 404 and "ep-nope" in missing.json()["detail"]
    big = httpx.post(f"{u}/v1/episodes/{ep['id']}/turns", json={"observation": "a" * 1_100_000})
    assert big.status_code == 413 and "limit" in big.json()["detail"]
    role = httpx.post(f"{u}/v1/swarm/agents", json={"role": "Wizard", "checkpoint": "final"})
    assert role.status_code == 422 and "Logger, Miner, Smith" in role.json()["detail"]
    task = httpx.post(f"{u}/v1/episodes", json={"task": "nope"})
    assert task.status_code == 422 and "wooden_pickaxe" in task.json()["detail"]
    metrics = httpx.get(f"{u}/metrics").text
    for name in (
        "swarm_turns_total",
        "swarm_bids_missed_total",
        "swarm_agent_failures_total",
        'swarm_turn_latency_seconds_bucket{le="+Inf"}',
        "swarm_agents_up 3",
    ):
        assert name in metrics


def test_added_worker_gets_turns_and_failing_winner_hands_over(served):
    """An agent joins by URL while the swarm runs; it wins turns (it bids 0.8), and once its actions
    fail the turn goes to the runner-up in the same turn; the episode completes. Then it is drained."""
    u = served.url
    added = httpx.post(f"{u}/v1/swarm/agents", json={"role": "Smith", "url": served.faulty_url, "name": "Smith-faulty"})
    assert added.status_code == 201 and added.json()["status"] == "up" and added.json()["index"] == 3
    body = httpx.post(f"{u}/v1/episodes", json={"seed": 100000, "noise": "7"}, timeout=120).json()
    assert body["status"] == "done" and body["decisions"] == 12
    acted = [r for r in body["turns"] if r["agent"] == "Smith-faulty"]
    assert len(acted) == 2 and all(r["bid"] == 0.8 for r in acted)
    handed = [r for r in body["turns"] if "Smith-faulty" in r["failed"]]
    assert handed and all(r["agent"] not in (None, "Smith-faulty") for r in handed)
    assert body["failovers"] == len(handed)
    assert "swarm_failovers_total" in httpx.get(f"{u}/metrics").text
    gone = httpx.delete(f"{u}/v1/swarm/agents/Smith-faulty", timeout=60)
    assert gone.status_code == 200 and gone.json()["status"] == "removed"
    assert httpx.delete(f"{u}/v1/swarm/agents/Smith-faulty").status_code == 404
    after = httpx.post(f"{u}/v1/episodes", json={"seed": 100001, "noise": "7"}, timeout=120).json()
    assert after["status"] == "done" and not any("Smith-faulty" in r["bids"] for r in after["turns"])


def test_worker_killed_mid_episode_does_not_fail_it(served):
    u = served.url
    victim = next(a for a in served.agents() if a["name"] == "Logger")
    lines = []
    with httpx.stream(
        "POST", f"{u}/v1/episodes", json={"seed": 100001, "noise": "8", "stream": True}, timeout=120
    ) as r:
        for line in r.iter_lines():
            lines.append(json.loads(line))
            if len(lines) == 3:
                os.kill(victim["pid"], signal.SIGKILL)
    final = lines[-1]
    assert final["final"] and final["status"] == "done" and final["decisions"] == 12
    turns = lines[:-1]
    assert [t["t"] for t in turns] == list(range(12))
    after = turns[4:]
    assert any("Logger" in t["missed"] for t in turns[3:]) or all("Logger" not in t["bids"] for t in after)
    assert all(t["agent"] != "Logger" for t in after[:3])


PROMPT = "goal wooden_pickaxe . inventory : none"


def _token_scores(policy, prompt: str | list[int], resp: list[int], temperature: float, allowed=None):
    """In process, teacher-forced: log softmax(logits / T) at each of ``resp``'s positions after ``prompt`` (text, or
    its token ids), with the worker's mask (``allowed``: one bool row per position; else the ban on bid and special
    tokens)."""
    import torch

    ids = (list(prompt) if isinstance(prompt, list) else policy.encode_prompt(prompt)) + resp
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([ids])).logits[0, len(ids) - len(resp) - 1 : -1].float()
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    else:
        logits[:, policy._action_ban] = float("-inf")
    return torch.log_softmax(logits / temperature, dim=-1)


def test_worker_logprobs_are_the_models_token_scores(served, registry):
    """`logprobs=k` on generated text: each token's log-probability and the top k, in the OpenAI
    completions shape, equal an in-process teacher-forced scoring of the same tokens (free text, and
    guided choices scored as training scores them)."""
    import torch

    from swarm_runtime.config.load import load_saved
    from swarm_runtime.runs.context import RunContext
    from swarm_runtime.serve.worker import WorkerOptions, load_policy

    torch.set_num_threads(1)
    url = next(a["url"] for a in served.agents() if a["name"] == "Miner")
    policy = load_policy(WorkerOptions(model=str(served.run / "checkpoints/final/agents/Miner")))
    ctx = RunContext(load_saved(served.run / "config.yaml"), *registry, served.run)
    choices = list(ctx.domain.action_choices(ctx.task, "Miner"))
    free = httpx.post(
        f"{url}/v1/completions",
        timeout=60,
        json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0.7, "seed": 11, "logprobs": 3},
    ).json()["choices"][0]
    guided = httpx.post(
        f"{url}/v1/completions",
        timeout=60,
        json={
            "prompt": PROMPT,
            "max_tokens": 12,
            "temperature": 1.3,
            "seed": 12,
            "logprobs": 2,
            "guided_choice": choices,
        },
    ).json()["choices"][0]
    assert guided["text"] in choices and guided["finish_reason"] == "stop"
    policy.constrain_actions(choices)
    for ch, T, k in ((free, 0.7, 3), (guided, 1.3, 2)):
        lp = ch["logprobs"]
        resp = policy.action_target(ch["text"])[: len(lp["tokens"])]  # the eos too, when it stopped
        assert len(resp) == len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
        assert "".join(lp["tokens"]) == ch["text"]
        assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(resp))]
        allowed = None if ch is free else policy.action_trie.allowed[policy.action_trie.walk(resp)]
        scores = _token_scores(policy, PROMPT, resp, T, allowed)
        want = scores.gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(lp["token_logprobs"]), want, atol=1e-4), (lp["token_logprobs"], want)
        for row, top, tok in zip(scores, lp["top_logprobs"], lp["tokens"]):
            finite = row[torch.isfinite(row)]
            best = finite.topk(min(k, len(finite))).values
            assert torch.allclose(torch.tensor(sorted(top.values(), reverse=True)[: len(best)]), best, atol=1e-4)
            assert tok in top and len(top) <= k + 1 and all(v > float("-inf") for v in top.values())
    # the score the training losses give the guided action is the sum of its token log-probs
    with torch.no_grad():
        total = policy.logprobs([PROMPT], [resp], temperature=1.3, actions=True)
    assert abs(float(total) - sum(guided["logprobs"]["token_logprobs"])) < 1e-4
    # a bid (logits mode) still carries every level's log-probability
    bid = httpx.post(
        f"{url}/v1/completions",
        timeout=60,
        json={
            "prompt": PROMPT,
            "max_tokens": 1,
            "seed": 3,
            "logprobs": 1,
            "guided_choice": policy.tok.convert_ids_to_tokens(policy.bid_ids),
        },
    ).json()["choices"][0]
    assert len(bid["logprobs"]["top_logprobs"][0]) == len(policy.bid_ids)


def _transcript(run: Path, eid: str) -> dict:
    """The episodes.jsonl line of episode ``eid``."""
    lines = (run / "serve/episodes.jsonl").read_text().splitlines()
    return next(json.loads(x) for x in lines if x.startswith(f'{{"id": "{eid}"'))


def test_a_served_episode_is_kept_with_its_token_ids_and_log_probs(served):
    """What training on served traffic needs: the transcript line of a served episode (serve/episodes.jsonl) holds,
    per turn, every answered bid's and the action's prompt and reply token ids, the sampler's log-probs and the
    version that answered; the action's log-probs are the learner's scores of its tokens at the episode's
    temperature (in process, teacher-forced, over the whole vocabulary: the basis the importance weight compares).
    The API's answer carries none of it."""
    import torch

    from swarm_runtime.serve.worker import WorkerOptions, load_policy

    torch.set_num_threads(1)
    body = httpx.post(
        f"{served.url}/v1/episodes", json={"seed": 100003, "noise": "21", "temperature": 0.9}, timeout=120
    ).json()
    assert body["status"] == "done" and "samples" not in body and all("samples" not in t for t in body["turns"])
    line = _transcript(served.run, body["id"])
    assert line["turns"] == body["turns"] and len(line["samples"]) == body["decisions"]
    policies, checked = {}, 0
    for rec, drawn in zip(line["turns"], line["samples"]):
        assert set(drawn["bids"]) == set(rec["bids"]), (rec, drawn)
        for name, bid in drawn["bids"].items():
            assert bid["version"] == rec["versions"][name] and bid["prompt_ids"] and len(bid["token_ids"]) == 1
            assert len(bid["logprobs"]) == 1 and bid["logprobs"][0] <= 0.0
        act = drawn["action"]
        if rec["agent"] is None:
            assert act is None
            continue
        assert act["text"] == rec["action"] and act["version"] == rec["versions"][rec["agent"]]
        if rec["role"] not in policies:
            folder = served.run / "checkpoints/final/agents" / rec["role"]
            policies[rec["role"]] = load_policy(WorkerOptions(model=str(folder)))
        policy = policies[rec["role"]]
        assert policy.encode_prompt(act["prompt"]) == act["prompt_ids"]  # what training re-encodes
        per: list = []  # the learner's per-token basis: log softmax(logits / T) over the whole vocabulary
        with torch.no_grad():
            policy.logprobs([act["prompt"]], [act["token_ids"]], temperature=0.9, per_token_out=per)
        assert torch.allclose(torch.tensor(act["logprobs"]), per[0], atol=1e-4), (act, per)
        checked += 1
    assert checked >= 3


def test_a_client_side_reward_posted_later_once(served):
    """A client-side episode whose last report says ``reward_later`` waits for its reward: one
    ``POST /v1/episodes/{id}/reward`` adds it to the last turn's and ends the episode (in the transcript with it);
    a second post, a post for an episode still playing or ended, or for an unknown one, is refused."""
    u = served.url
    ep = httpx.post(f"{u}/v1/episodes", json={"env": "client", "seed": 7, "split": "train"}).json()
    turn = f"{u}/v1/episodes/{ep['id']}/turns"
    first = httpx.post(turn, json={"observation": "x", "reward_later": True, "done": True})
    assert first.status_code == 422 and "first" in first.json()["detail"]  # nothing played yet to credit
    early = httpx.post(turn, json={"observation": "x", "reward_later": True})
    assert early.status_code == 422 and "done" in early.json()["detail"]
    for r in (0.0, 1.0):
        assert httpx.post(turn, timeout=30, json={"observation": "goal wooden_pickaxe", "reward": r}).status_code == 200
    playing = httpx.post(f"{u}/v1/episodes/{ep['id']}/reward", json={"reward": 1.0})
    assert playing.status_code == 409 and "still playing" in playing.json()["detail"]
    due = httpx.post(turn, timeout=30, json={"observation": "x", "reward": 0.5, "done": True, "reward_later": True})
    assert due.status_code == 200 and due.json()["status"] == "running" and due.json()["reward_due"], due.text
    assert due.json()["reward"] == 1.5
    more = httpx.post(turn, json={"observation": "x"})
    assert more.status_code == 409 and "reward is due" in more.json()["detail"]
    got = httpx.post(f"{u}/v1/episodes/{ep['id']}/reward", json={"reward": 2.0})
    assert got.status_code == 200, got.text
    assert got.json()["status"] == "done" and got.json()["reward"] == 3.5 and got.json()["turns"][-1]["reward"] == 2.5
    again = httpx.post(f"{u}/v1/episodes/{ep['id']}/reward", json={"reward": 2.0})
    assert again.status_code == 409 and "done already" in again.json()["detail"]
    assert httpx.post(f"{u}/v1/episodes/ep-nope/reward", json={"reward": 1.0}).status_code == 404
    assert httpx.post(f"{u}/v1/episodes/{ep['id']}/reward", json={"reward": "x"}).status_code == 422
    line = _transcript(served.run, ep["id"])
    assert line["status"] == "done" and line["reward"] == 3.5 and len(line["samples"]) == 2


def test_a_swarm_trains_its_actions_on_the_episodes_it_served(served, registry, tmp_path):
    """``algo.served`` (learn/served.py): the usable episodes of a served transcript become action samples with the
    sampler's log-probs; on the weights that served them the learner's log-probs are the sampler's (importance
    weights 1, mismatch ~0) and an update moves the weights. A transcript cut mid-record is used up to its last
    complete line (the rest reported); one of another swarm (a role the run does not have, prompt token ids its
    tokenizer does not make) is refused naming the file and line; episodes at another temperature are skipped; a
    run folder whose transcript is a link out of it is refused."""
    import torch

    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import load_saved
    from swarm_runtime.learn.action import action_update, credit_samples_and_turns
    from swarm_runtime.learn.mpt import optimizer_settings, role_optimizers
    from swarm_runtime.learn.served import load_served
    from swarm_runtime.runs.context import RunContext

    torch.set_num_threads(1)
    for seed, more in ((3, {}), (4, {}), (5, {"temperature": 0.9})):
        body = {"seed": seed, "split": "train", **more}
        assert httpx.post(f"{served.url}/v1/episodes", json=body, timeout=120).json()["status"] == "done"
    ep = httpx.post(f"{served.url}/v1/episodes", json={"env": "client", "seed": 6, "split": "train"}).json()
    for r, done in ((0.0, False), (1.0, False), (2.0, True)):  # rewards: the tiny swarm earns none on its own
        report = {"observation": "goal wooden_pickaxe . inventory : none", "reward": r, "done": done}
        assert httpx.post(f"{served.url}/v1/episodes/{ep['id']}/turns", json=report, timeout=30).status_code == 200
    cfg = load_saved(served.run / "config.yaml")
    ctx = RunContext(cfg, *registry, served.run)
    agents, policies = ctx.build_swarm(served.run / "checkpoints/final/agents")
    T = float(cfg.model.temperature)
    episodes, report = load_served([served.run], agents, T)
    lines = (served.run / "serve/episodes.jsonl").read_text().splitlines()
    assert report.lines == len(lines) and report.used == len(episodes) >= 2, report.summary()
    assert any("temperature" in why for why in report.skipped), report.summary()  # the one played at 0.9
    samples, turns = credit_samples_and_turns(episodes, ctx.credit_fn(), random.Random(0))
    assert samples and all(t.action_logprobs and len(t.action_logprobs) == len(t.action_tokens) for t in turns)
    before = {r: [q.detach().clone() for q in p.parameters()] for r, p in policies.items()}
    m = action_update(
        agents,
        samples,
        role_optimizers(policies, optimizer_settings(cfg))["action"],
        float(ctx.task.reward_max),
        8,
        1.0,
        behaviour=[t.action_logprobs for t in turns],
        is_cap=2.0,
    )
    weights = {k: v for k, v in m.items() if k.startswith("mismatch/is_weight_mean_")}
    assert weights and all(abs(v - 1.0) < 1e-3 for v in weights.values()), m
    assert all(v < 1e-6 for k, v in m.items() if k.startswith("mismatch/approx_kl_")), m
    moved = [r for r, p in policies.items() if any(not torch.equal(a, b) for a, b in zip(before[r], p.parameters()))]
    assert moved, m
    # a transcript cut mid-record: its complete lines are used, the rest reported
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines) + "\n" + lines[-1][: len(lines[-1]) // 2])
    _, rep = load_served([cut], agents, T)
    assert rep.used == report.used and rep.unreadable == [f"{cut}:{len(lines) + 1}"], rep.summary()
    # another swarm: a role this run does not have, or prompt ids its tokenizer does not make
    line = next(json.loads(x) for x in lines if json.loads(x)["id"] == episodes_id(lines, T))
    acted = next(i for i, r in enumerate(line["turns"]) if r["agent"] is not None)
    for change, says in (("role", "does not have"), ("ids", "another base or tokenizer")):
        bad = json.loads(json.dumps(line))
        if change == "role":
            bad["turns"][acted]["role"] = "Wizard"
        else:
            bad["samples"][acted]["action"]["prompt_ids"][-1] += 1
        path = tmp_path / f"{change}.jsonl"
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(ConfigError, match=says) as err:
            load_served([path], agents, T)
        assert f"{path}:1" in str(err.value)
    # a run folder whose transcript leads out of it: refused by the run-folder rules, nothing read through the link
    linked = tmp_path / "linked"
    (linked / "serve").mkdir(parents=True)
    (linked / "serve/episodes.jsonl").symlink_to(served.run / "serve/episodes.jsonl")
    with pytest.raises(ConfigError, match="outside the run folder"):
        load_served([linked], agents, T)


def episodes_id(lines: list[str], temperature: float) -> str:
    """The id of a transcript line (of ``lines``) that training can use: done, sampled at ``temperature``."""
    for x in lines:
        rec = json.loads(x)
        if rec["status"] == "done" and rec.get("temperature") == temperature and rec.get("samples"):
            if any(r["agent"] is not None for r in rec["turns"]):
                return rec["id"]
    raise AssertionError("no usable served episode")


def test_worker_n_samples_keyed_and_bounded(served):
    """`n` samples per prompt, each its own choice index; with a seed, sample i is the keyed draw
    `sample_keys(seed, n)[i]` in process: the same whatever n, and the first of n is the n=1 draw."""
    import torch

    from swarm_runtime.serve.protocol import MAX_N, key_from_seed, sample_keys
    from swarm_runtime.serve.worker import WorkerOptions, load_policy

    torch.set_num_threads(1)
    url = next(a["url"] for a in served.agents() if a["name"] == "Miner")

    def ask(**kw):
        r = httpx.post(
            f"{url}/v1/completions",
            timeout=60,
            json={"prompt": [PROMPT, "goal stick"], "max_tokens": 5, "temperature": 1.0, **kw},
        )
        assert r.status_code == 200, r.text
        return [c["text"] for c in r.json()["choices"]], r.json()

    three, body = ask(n=3, seed=42)
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert ask(n=3, seed=42)[0] == three  # reproducible
    five = ask(n=5, seed=42)[0]
    assert five[:3] == three[:3] and five[5:8] == three[3:]  # sample i does not depend on n
    assert ask(n=1, seed=42)[0] == [three[0], three[3]]
    assert len(set(three[:3])) > 1  # independent samples
    policy = load_policy(WorkerOptions(model=str(Path(served.run) / "checkpoints/final/agents/Miner")))
    policy.temperature, policy.max_action_tokens = 1.0, 5
    assert [r.text for r in policy.act([PROMPT] * 3, keys=sample_keys(42, 3))] == three[:3]
    assert sample_keys(42, 2)[0] == key_from_seed(42)
    assert len(ask(n=2)[0]) == 4  # unkeyed: drawn from the worker's generator
    too_many = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "n": MAX_N + 1})
    err = too_many.json()["error"]
    assert too_many.status_code == 400 and f"n={MAX_N + 1}" in err["message"] and err["param"] == "n"
    assert str(MAX_N) in err["message"].split("limit")[1] and err["type"] == "invalid_request_error"


def test_logprob_pieces_with_a_byte_level_tokenizer(tmp_path):
    """With a byte-level BPE checkpoint (tokens that split characters), the pieces still concatenate
    to the text and the offsets follow them; n rows per prompt, one logprobs object each."""
    import torch
    from conftest import make_local_checkpoint

    from swarm_runtime.serve.protocol import completion_models
    from swarm_runtime.serve.worker import Completer, WorkerOptions, load_policy

    torch.set_num_threads(1)
    opts = WorkerOptions(model=str(make_local_checkpoint(tmp_path / "bpe")))
    completer = Completer(load_policy(opts), "bpe", opts)
    req = completion_models()(
        prompt="you are Logger . goal wooden_pickaxe . action :", max_tokens=8, seed=5, logprobs=2, n=3
    )
    (body,), _ = completer.run([completer.plan(req)])
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    n_tokens = 0
    for c in body["choices"]:
        lp = c["logprobs"]
        assert "".join(lp["tokens"]) == c["text"] and len(lp["token_logprobs"]) == len(lp["tokens"])
        assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
        assert all(t <= 0 for t in lp["token_logprobs"]) and all(
            tok in top for tok, top in zip(lp["tokens"], lp["top_logprobs"])
        )
        n_tokens += len(lp["tokens"])
    assert body["usage"]["completion_tokens"] == n_tokens
    # a generated bid (model.bid_mode=generate) is the policy's own keyed bid, with its token log-probs
    from swarm_runtime.serve.protocol import key_from_seed

    policy = completer.policy
    policy.bid_mode, policy.max_bid_tokens = "generate", 4
    req = completion_models()(prompt="you are Logger . bid :", max_tokens=4, seed=7, logprobs=1, swarm_kind="bid")
    (body,), _ = completer.run([completer.plan(req)])
    want = policy.bid(["you are Logger . bid :"], keys=[key_from_seed(7)])[0]
    choice = body["choices"][0]
    assert choice["text"] == want.text and len(choice["logprobs"]["tokens"]) == len(want.tokens)
    assert "".join(choice["logprobs"]["tokens"]) == want.text


@pytest.fixture(scope="module")
def bare(served, tmp_path_factory):
    """A second gateway on the same run with no worker (one dead agent URL), bound to 0.0.0.0 with an
    API key, and client-side episodes that expire after 1 s without a turn: (url, auth headers)."""
    port, dead = _free_port(), _free_port()
    log = tmp_path_factory.mktemp("bare") / "gateway.log"
    gateway = _start(
        [
            "swarm_runtime.cli.main",
            "serve",
            str(served.run),
            "serve.host=0.0.0.0",
            f"serve.port={port}",
            "serve.replicas=0",
            f"serve.agents=[Logger=http://127.0.0.1:{dead}]",
            "serve.agent_wait_s=1",
            "serve.episode_idle_s=1",
        ],
        log,
        SWARM_API_KEY="s3cret-key",
    )
    try:
        url, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer s3cret-key"}
        health = _wait_health(url, [gateway], 120, headers=auth, logs=[log])
        assert health["status"] == "no_agents"
        yield url, auth
    finally:
        _stop(gateway)
    assert "s3cret-key" not in log.read_text()


def test_auth_on_non_loopback_bind_and_no_agents_left(served, bare, monkeypatch, capsys):
    from swarm_runtime.cli.main import main

    run = served.run
    monkeypatch.delenv("SWARM_API_KEY", raising=False)
    assert main(["serve", str(run), "serve.host=0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "SWARM_API_KEY" in err and len(err.strip().splitlines()) == 1
    assert main(["serve", str(run), "serve.replicas.Wizard=2"]) == 2
    assert "Logger, Miner, Smith" in capsys.readouterr().err
    url, auth = bare
    assert httpx.get(f"{url}/health").status_code == 401
    assert httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    t0 = time.time()
    r = httpx.post(f"{url}/v1/episodes", json={"seed": 3, "split": "train"}, headers=auth, timeout=60)
    assert r.status_code == 503 and r.json()["status"] == "failed"
    assert "no agent left" in r.json()["error"] and "Logger" in r.json()["error"]
    assert time.time() - t0 < 30


def test_idle_client_episode_expires(served, bare):
    """A client-side episode with no turn for serve.episode_idle_s expires: its next turn gets 410
    naming the episode and why; its state, transcript and /metrics say expired."""
    url, auth = bare
    ep = httpx.post(f"{url}/v1/episodes", json={"env": "client", "seed": 2, "split": "train"}, headers=auth).json()
    eid = ep["id"]
    assert httpx.get(f"{url}/v1/episodes/{eid}", headers=auth).json()["status"] == "running"
    end, state = time.time() + 20, None
    while time.time() < end:  # the gateway sweeps every second
        state = httpx.get(f"{url}/v1/episodes/{eid}", headers=auth).json()
        if state["status"] != "running":
            break
        time.sleep(0.2)
    assert state["status"] == "expired" and "serve.episode_idle_s" in state["error"]
    r = httpx.post(f"{url}/v1/episodes/{eid}/turns", json={"observation": "x", "reward": 1.0}, headers=auth)
    assert r.status_code == 410, r.text
    assert eid in r.json()["detail"] and "expired" in r.json()["detail"]
    assert "no turn for more than serve.episode_idle_s=1" in r.json()["detail"]
    lines = [json.loads(x) for x in (served.run / "serve/episodes.jsonl").read_text().splitlines()]
    assert [x["status"] for x in lines if x["id"] == eid] == ["expired"]
    assert 'swarm_episodes_total{status="expired"} 1' in httpx.get(f"{url}/metrics", headers=auth).text
    missing = httpx.post(f"{url}/v1/episodes/ep-gone/turns", json={"observation": "x"}, headers=auth)
    assert missing.status_code == 404 and "ep-gone" in missing.json()["detail"]


def test_seed_carries_the_keyed_draw():
    """The request seed continues the in-process key's hash chain: same Gumbel noise, token by token."""
    from swarm_runtime.core.noise import _splitmix64, key_hash
    from swarm_runtime.models.noise import gumbel
    from swarm_runtime.serve.protocol import key_from_seed, seed_for, unsplitmix64

    rng = random.Random(0)
    for _ in range(200):
        x = rng.getrandbits(64)
        assert unsplitmix64(_splitmix64(x)) == x
    for parts in [(0, 0, 0, 0), (2**64 - 1, 119, 11, 1), (12345678901234567890, 3, 2, 0)]:
        seed = seed_for(*parts)
        assert -(2**63) <= seed < 2**63  # vLLM's range
        key = key_from_seed(seed)
        for step in (0, 1, 7):
            assert key_hash(*key, step) == key_hash(*parts, step)
        assert gumbel((*key, 3), 5).tolist() == gumbel((*parts, 3), 5).tolist()


def test_serve_config_errors_name_the_valid_values(registry):
    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import resolve
    from swarm_runtime.config.validation import serve_roles

    roles = ["Logger", "Miner", "Smith"]
    for args, words in (
        (["serve.replicas=-1"], ">= 0"),
        (["serve.agents=[Wizard=http://x]"], "Logger, Miner, Smith"),
        (["serve.agents=[Smith=ftp://x]"], "http(s)"),
        (["serve.url=localhost:8000"], "http(s) URL"),
        (["serve.bid_deadline_ms=0"], "at least 1"),
    ):
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            resolve(RUN_ARGS + args, registry[1])  # ranges and roles: every command validates serve.*
    cfg = resolve(RUN_ARGS, registry[1])
    cfg.serve.replicas = {"Smith": 6, "Logger": 0}
    serve_roles(cfg, roles)
