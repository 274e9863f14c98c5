"""Live version swap on a real ``swarm serve`` (a subprocess, real HTTP, tiny models on 127.0.0.1): while a client
thread plays episodes without a pause, the swarm moves v1 -> v2 -> v3 (the ``swarm swap`` command, and the API), a
worker is killed, and a rollback returns it to v2. Every episode completes (done; one that overlaps the kill may end
degraded, its turns lost to the killed worker) and names the version of each agent it ran on; per episode each agent's versions only go forward, but for the rollback. The bad input is refused before
anything moves. An adapter run swaps adapters on its one base worker and keeps at most two versions loaded.

Cost on a shared, loaded 2-core machine: about 135 s for the two full-copy tests (one gateway: 70 s to build and
start it, 60 s for the swaps), 80 s for the adapter one (all ``slow``); the check before a swap on its own, well under
a second per case."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import ROOT  # noqa: E402
from test_serve import _env, _free_port, _kill_pid, _start, _stop, _wait_health, build_run  # noqa: E402


def versioned(run, tag: str, seed: int):
    """``checkpoints/TAG``: a copy of ``final`` whose every weight moved a little (another version of the swarm)."""
    import torch
    from safetensors.torch import load_file, save_file

    dst = run / "checkpoints" / tag
    shutil.copytree(run / "checkpoints" / "final", dst)
    g = torch.Generator().manual_seed(seed)
    for f in sorted(dst.glob("agents/*/*.safetensors")):
        state = {
            k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in load_file(str(f)).items()
        }
        save_file(state, str(f), metadata={"format": "pt"})
    return dst


def swap_cli(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swarm_runtime.cli.main", "swap", url, *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def wait_job(url: str, timeout: float = 240) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        state = httpx.get(f"{url}/v1/swarm/swap", timeout=10).json()
        if state["swap"] and state["swap"]["status"] != "running":
            return state
        time.sleep(0.2)
    raise AssertionError(f"swap still running after {timeout}s")


class Client(threading.Thread):
    """Plays server-side episodes one after another until stopped; keeps (started, ended, answer) of each. Seeds
    from 100000 on in ``split: any``: the task's eval split holds 32 seeds, and a fast machine plays more."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.played, self.errors = url, threading.Event(), [], []

    def run(self):
        seed = 100_000
        while not self.stop.is_set():
            t0 = time.time()
            try:
                r = httpx.post(
                    f"{self.url}/v1/episodes", json={"seed": seed, "noise": str(seed), "split": "any"}, timeout=120
                )
                self.played.append((t0, time.time(), r.status_code, r.json()))
            except Exception as exc:  # noqa: BLE001 - counted: the test asserts there were none
                self.errors.append(repr(exc))
            seed += 1


@pytest.fixture(scope="module")
def gateway(registry, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("swap")
    run = build_run(registry, tmp / "run")
    for tag, seed in (("v2", 2), ("v3", 3)):
        versioned(run, tag, seed)
    port, log = _free_port(), tmp / "gateway.log"
    g = _start(
        [
            "swarm_runtime.cli.main",
            "serve",
            str(run),
            "checkpoint=final",
            f"serve.port={port}",
            "serve.probe_interval_ms=200",
            "serve.agent_wait_s=10",
        ],
        log,
    )
    url = f"http://127.0.0.1:{port}"
    pids = set()
    try:
        _wait_health(url, [g], 240, logs=[log])
        yield run, url, pids
    finally:
        pids |= {a["pid"] for a in httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"] if a["pid"]}
        _stop(g)
        for pid in pids:
            _kill_pid(pid)


def refused(url: str, path: str, body=None) -> tuple[int, str]:
    r = httpx.post(f"{url}{path}", json=body, timeout=60)
    return r.status_code, r.json()["detail"]


@pytest.mark.slow
def test_bad_swaps_are_refused_before_anything_moves(gateway):
    run, url, _ = gateway
    foreign = run / "checkpoints" / "foreign"
    shutil.copytree(run / "checkpoints" / "final", foreign)
    tok = foreign / "agents" / "Smith" / "tokenizer.json"
    data = json.loads(tok.read_text())
    vocab = data["model"]["vocab"]
    word = next(w for w in vocab if w.isalpha())
    vocab[word + "x"] = vocab.pop(word)  # one token spelled otherwise: another tokenizer
    tok.write_text(json.dumps(data, indent=1))
    other = run / "checkpoints" / "other"
    shutil.copytree(run / "checkpoints" / "final", other)
    (other / "agents" / "Smith").rename(other / "agents" / "Baker")
    status, why = refused(url, "/v1/swarm/swap", {"checkpoint": "nope"})
    assert status == 422 and "'nope'" in why and "final" in why and "v2" in why
    status, why = refused(url, "/v1/swarm/swap", {"checkpoint": "foreign"})
    assert status == 422 and "Smith" in why and "tokenizer differs (tokenizer.json)" in why
    status, why = refused(url, "/v1/swarm/swap", {"checkpoint": "other"})
    assert status == 422 and "no folder for Smith" in why
    status, why = refused(url, "/v1/swarm/swap", {"checkpoint": "/etc"})
    assert status == 422 and "inside the run" in why
    status, why = refused(url, "/v1/swarm/swap", {"checkpoint": "final"})
    assert status == 409 and "already" in why
    status, why = refused(url, "/v1/swarm/rollback")
    assert status == 409 and "nothing to roll back to" in why
    assert refused(url, "/v1/swarm/swap", {"ckpt": "v2"})[0] == 422
    cli = swap_cli(url, "foreign")
    assert cli.returncode == 2 and "tokenizer differs" in cli.stderr and len(cli.stderr.strip().splitlines()) == 1
    agents = httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"]
    assert {a["version"] for a in agents} == {f"{a['role']}@v1" for a in agents}


def versions_seen(body: dict) -> dict[str, list[int]]:
    """Each agent's versions in an episode's turns, in turn order, repeats folded."""
    out: dict[str, list[int]] = {}
    for rec in body["turns"]:
        for name, label in rec["versions"].items():
            n = int(label.rsplit("@v", 1)[1])
            if not out.get(name) or out[name][-1] != n:
                out.setdefault(name, []).append(n)
    return out


def is_subsequence(seq: list[int], of: list[int]) -> bool:
    it = iter(of)
    return all(x in it for x in seq)


@pytest.mark.slow
def test_swaps_kill_and_rollback_while_serving(gateway):
    run, url, pids = gateway
    client = Client(url)
    client.start()
    jobs = []
    try:
        time.sleep(2)
        cli = swap_cli(url, "v2")  # the command: each agent printed as it moves
        assert cli.returncode == 0, cli.stderr
        assert "Smith -> Smith@v2" in cli.stdout and "done, 3 agents moved" in cli.stdout
        jobs.append(httpx.get(f"{url}/v1/swarm/swap", timeout=10).json()["swap"])
        # the API: a second swap while one runs is refused
        r = httpx.post(f"{url}/v1/swarm/swap", json={"checkpoint": "v3"}, timeout=60)
        assert r.status_code == 202 and r.json()["version"] == "v3"
        status, why = refused(url, "/v1/swarm/swap", {"checkpoint": "v2"})
        assert status == 409 and "running" in why
        jobs.append(wait_job(url)["swap"])
        assert jobs[-1]["status"] == "done", jobs[-1]
        time.sleep(2)
        # a worker killed: a swap is refused until it is back up; the episodes go on without it meanwhile
        victim = next(
            a for a in httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"] if a["name"] == "Logger"
        )
        pids.add(victim["pid"])
        killed = time.time()
        os.kill(victim["pid"], signal.SIGKILL)
        end = time.time() + 30
        while httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"][0]["status"] == "up":
            assert time.time() < end
            time.sleep(0.05)
        status, why = refused(url, "/v1/swarm/rollback")
        assert status == 409 and ("Logger (down" in why or "Logger (starting" in why), why
        _wait_health(url, [], 60)
        while True:
            agents = httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"]
            if all(a["status"] == "up" for a in agents):
                back = time.time()
                break
            assert time.time() < end + 60
            time.sleep(0.2)
        assert agents[0]["version"] == "Logger@v3"  # restarted on the version it served
        cli = swap_cli(url, "--rollback")
        assert cli.returncode == 0 and "rollback to v2" in cli.stdout, cli.stderr
        jobs.append(httpx.get(f"{url}/v1/swarm/swap", timeout=10).json()["swap"])
        time.sleep(2)
    finally:
        client.stop.set()
        client.join(150)
    pids |= {a["pid"] for a in httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"] if a["pid"]}
    assert not client.errors and len(client.played) >= 8
    # every episode ends; one that ran while Logger was down may lose more than serve.degraded_share of its turns
    # (a bid or an action in flight to the killed worker): degraded, not done; any other is done
    for started, ended, code, body in client.played:
        overlaps_kill = started < back and ended > killed
        ok = ("done", "degraded") if overlaps_kill else ("done",)
        assert code == 200 and body.get("status") in ok, (started - killed, ended - back, code, str(body)[:2000])
    names = {"Logger", "Miner", "Smith"}
    for started, ended, _, body in client.played:
        seen = versions_seen(body)
        assert set(seen) <= names and body["versions"].keys() == seen.keys()  # an agent down all along: absent
        assert all(is_subsequence(v, [1, 2, 3, 2]) for v in seen.values()), seen
        for job, nxt in zip(jobs, jobs[1:] + [None]):  # between two swaps: the version of the first only
            if started > job["ended"] and (nxt is None or ended < nxt["started"]):
                assert all(v == [int(job["version"][1:])] for v in seen.values()), (job, seen)
    every = {n: sorted({v for _, _, _, b in client.played for v in versions_seen(b).get(n, [])}) for n in names}
    assert every == {n: [1, 2, 3] for n in names}
    # the journal: every episode's end names the versions it ran on, as its answer does
    ends = {}
    for line in (run / "serve" / "journal.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["ev"] == "end":
            ends[ev["id"]] = ev["versions"]
    assert all(ends[b["id"]] == b["versions"] for _, _, _, b in client.played)


@pytest.mark.slow
def test_adapter_run_swaps_adapters_and_keeps_two_versions(registry, tmp_path):
    from test_serve_adapters import _adapter_run

    run = _adapter_run(registry, tmp_path / "run")
    for tag, seed in (("v2", 2), ("v3", 3)):
        versioned(run, tag, seed)
    port, log = _free_port(), tmp_path / "gateway.log"
    g = _start(["swarm_runtime.cli.main", "serve", str(run), "checkpoint=final", f"serve.port={port}"], log)
    url, pids = f"http://127.0.0.1:{port}", []
    try:
        _wait_health(url, [g], 240, logs=[log])
        host = httpx.get(f"{url}/v1/swarm", timeout=10).json()["adapter_hosts"][0]
        pids.append(host["pid"])

        def loaded() -> set[str]:
            models = httpx.get(f"{host['url']}/v1/models", timeout=10).json()["data"]
            return {m["id"] for m in models if m["parent"] is not None}

        def served() -> dict:
            return {a["name"]: (a["version"], a["model"]) for a in httpx.get(f"{url}/v1/swarm/agents").json()["agents"]}

        roles = ("Logger", "Miner", "Smith")
        for step, want in (("v2", 2), ("v3", 3), ("--rollback", 2)):
            cli = swap_cli(url, step)
            assert cli.returncode == 0, cli.stdout + cli.stderr
            assert served() == {r: (f"{r}@v{want}", f"{r}@v{want}") for r in roles}
            ep = httpx.post(f"{url}/v1/episodes", json={"seed": 100_000}, timeout=120).json()
            assert ep["status"] == "done" and ep["versions"] == {r: [f"{r}@v{want}"] for r in roles}
        # v1's adapters unloaded once v3 came: the current (v2) and previous (v3) stay, for a rollback
        end = time.time() + 30
        while loaded() != {f"{r}@v{n}" for r in roles for n in (2, 3)}:
            assert time.time() < end, loaded()
            time.sleep(0.2)
        assert pids[0] == httpx.get(f"{url}/v1/swarm", timeout=10).json()["adapter_hosts"][0]["pid"]  # no restart
    finally:
        _stop(g)
        for pid in pids:
            _kill_pid(pid)


def _fake_checkpoint(root, roles=("A", "B"), hidden=8, levels=(0.0, 0.5), vocab="v1", tok_config=None, template=None):
    """A checkpoint folder with tiny full-copy model folders (what the swap check reads, no model to load)."""
    import torch
    from safetensors.torch import save_file

    for role in roles:
        d = root / "agents" / role
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": hidden, "vocab_size": 10}))
        (d / "swarm_policy.json").write_text(json.dumps({"bid_levels": list(levels), "bid_mode": "logits"}))
        (d / "tokenizer.json").write_text(json.dumps({"vocab": vocab}))
        (d / "tokenizer_config.json").write_text(json.dumps(tok_config or {"model_max_length": 512}))
        if tok_config is None and template is not None:  # transformers 5 saves a chat template to its own file
            (d / "chat_template.jinja").write_text(template)
        save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))
    return root


@pytest.mark.parametrize(
    "change, says",
    [
        ({"hidden": 16}, "its base differs (hidden_size 16, served: 8)"),
        ({"levels": (0.0, 0.25)}, "its bid levels differ"),
        ({"vocab": "v2"}, "its tokenizer differs (tokenizer.json)"),
        ({"roles": ("A", "C")}, "no folder for B"),
        ({"tok_config": {"model_max_length": 64}}, "its tokenizer differs (tokenizer_config.json)"),
        # what transformers adds when it saves a tokenizer it loaded from a folder (a resumed run's checkpoints)
        ({"tok_config": {"model_max_length": 512, "is_local": True, "local_files_only": False}}, None),
        (
            {"tok_config": {"model_max_length": 512, "chat_template": "{{ x }}"}},
            "its tokenizer differs (chat template)",
        ),
        ({}, None),
    ],
)
def test_swap_check_names_what_differs(tmp_path, change, says):
    """The check before a swap, on its own (well under a second each): each difference named, the same swarm passes."""
    from swarm_runtime.serve.swap_check import check_swappable
    from swarm_runtime.serve.validate import BadRequest

    served = _fake_checkpoint(tmp_path / "served")
    new = _fake_checkpoint(tmp_path / "new", **change)
    if says is None:
        check_swappable(served, new)
        return
    with pytest.raises(BadRequest) as err:
        check_swappable(served, new)
    assert err.value.status == 422 and says in err.value.message, err.value.message


def test_a_chat_template_is_compared_wherever_the_tokenizer_keeps_it(tmp_path):
    """In tokenizer_config.json (as served) or in chat_template.jinja (where transformers 5 saves it: a resumed run's
    checkpoints): the same template is the same tokenizer, another is refused naming it."""
    from swarm_runtime.serve.swap_check import check_swappable
    from swarm_runtime.serve.validate import BadRequest

    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    served = _fake_checkpoint(tmp_path / "served", tok_config={"model_max_length": 512, "chat_template": template})
    check_swappable(served, _fake_checkpoint(tmp_path / "moved", template=template))
    with pytest.raises(BadRequest, match=r"its tokenizer differs \(chat template\)"):
        check_swappable(served, _fake_checkpoint(tmp_path / "other", template=template + "!"))


def test_a_swap_with_no_agent_of_the_gateways_own_to_move_is_refused():
    """Every agent joined by URL (an external server's), or failed: a swap would move nothing, so it is a 409 naming
    each agent; one agent of the gateway's own (up, or down and restarting) is enough to go on."""
    from types import SimpleNamespace

    from fastapi import HTTPException

    from swarm_runtime.serve.population import AgentHandle
    from swarm_runtime.serve.routes.swap import check_steady

    def gateway(*agents):
        versions = SimpleNamespace(job=None, running=lambda: False)
        return SimpleNamespace(accepting=True, pop=SimpleNamespace(agents=list(agents), hosts=[]), versions=versions)

    ext = AgentHandle(0, "Logger", "Logger", "http://127.0.0.1:8000", status="up")
    dead = AgentHandle(1, "Miner", "Miner", "http://127.0.0.1:8001", status="failed", version=1)
    for gw in (gateway(ext), gateway(ext, dead), gateway()):
        with pytest.raises(HTTPException) as err:
            check_steady(gw)
        assert err.value.status_code == 409 and "no agent for a swap to move" in err.value.detail
    assert "Logger (http://127.0.0.1:8000), Miner (failed)" in str(
        pytest.raises(HTTPException, check_steady, gateway(ext, dead)).value.detail
    )
    check_steady(gateway(ext, AgentHandle(2, "Smith", "Smith", "http://127.0.0.1:8002", status="down", version=1)))
