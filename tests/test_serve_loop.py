"""The closed loop of docs/guides/serve.md ("Training on served traffic") on the tiny default, with the real CLI in
subprocesses: ``swarm run``, ``swarm serve`` on its latest checkpoint, ``swarm eval serve.url=`` (before),
``swarm collect`` (episodes on training seeds), an intercept episode (a harness's chat calls through the OpenAI
client, its reward at the end), ``swarm run resume=true ... algo.served=[RUN] algo.served_only=true``, ``swarm swap
URL latest`` while serving, ``swarm eval serve.url=`` (after)."""

import json

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import TINY_RUN, swarm  # noqa: E402
from test_serve import _free_port, _kill_pid, _start, _stop, _wait_health  # noqa: E402

#: a chat template in the tiny word-level vocabulary, for the intercepted chat calls (the run's own prompts stay raw:
#: model.chat_template=none)
TEMPLATE = "{% for m in messages %}{{ m['content'] }} . {% endfor %}{% if add_generation_prompt %}action :{% endif %}"


def _with_template(checkpoint) -> None:
    for cfg in checkpoint.glob("agents/*/tokenizer_config.json"):
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "chat_template": TEMPLATE}))


def _intercepted(url: str) -> str:
    """An intercept episode: two chat calls through the OpenAI client (base URL: the episode), then its reward."""
    openai = pytest.importorskip("openai")
    ep = httpx.post(f"{url}/v1/episodes", json={"env": "intercept"}, timeout=30).json()
    assert ep["base_url"] == f"/v1/episodes/{ep['id']}", ep
    client = openai.OpenAI(base_url=url + ep["base_url"], api_key="none")
    messages = [{"role": "user", "content": "goal wooden_pickaxe . inventory : none"}]
    first = client.chat.completions.create(model="Logger", messages=messages, max_tokens=6)
    assert first.model == "Logger" and first.choices[0].logprobs is None  # token data only when asked
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "x"}]
    second = client.chat.completions.create(model="Smith", messages=messages, max_tokens=6, logprobs=True)
    assert second.choices[0].logprobs.content and all(c.logprob <= 0 for c in second.choices[0].logprobs.content)
    turns = httpx.post(f"{url}/v1/episodes/{ep['id']}/turns", json={"observation": "x"}, timeout=30)
    assert turns.status_code == 409 and "chat calls" in turns.json()["detail"]
    done = httpx.post(f"{url}/v1/episodes/{ep['id']}/reward", json={"reward": 1.5}, timeout=30).json()
    assert (
        done["status"] == "done"
        and done["reward"] == 1.5
        and [t["agent"] for t in done["turns"]]
        == [
            "Logger",
            "Smith",
        ]
    ), done
    return ep["id"]


def _ok(r):
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    return r


def test_serve_collect_train_swap_and_evaluate_before_and_after(tmp_path):
    run = tmp_path / "run"
    _ok(swarm("run", *TINY_RUN, "tensorboard=false", "model.chat_template=none", f"run_dir={run}", cwd=tmp_path))
    _with_template(run / "checkpoints/iter-000002")
    port, log = _free_port(), tmp_path / "gateway.log"
    url = f"http://127.0.0.1:{port}"
    g = _start(["swarm_runtime.cli.main", "serve", str(run), f"serve.port={port}"], log)
    pids: set = set()
    try:
        _wait_health(url, [g], 240, logs=[log])
        pids |= {a["pid"] for a in httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"] if a["pid"]}
        before = _ok(swarm("eval", str(run), f"serve.url={url}", cwd=tmp_path)).stdout
        assert "served checkpoint iter-000002" in before, before
        got = _ok(swarm("collect", str(run), url, "--episodes", "4", "--concurrency", "2", cwd=tmp_path)).stdout
        assert "collected 4 served episodes on training seeds" in got and "(4 done)" in got, got
        lines = [json.loads(x) for x in (run / "serve/episodes.jsonl").read_text().splitlines()]
        assert sum(x["seed"] < 100_000 for x in lines) == 4  # training seeds, next to the held-out ones of the eval
        eid = _intercepted(url)
        line = json.loads((run / "serve/episodes.jsonl").read_text().splitlines()[-1])
        assert (
            line["id"] == eid and line["env"] == "intercept" and all(s["action"]["prompt_ids"] for s in line["samples"])
        )
        trained = _ok(
            swarm(
                "run",
                "resume=true",
                f"run_dir={run}",
                "algo.iterations=6",
                f"algo.served=[{run}]",
                "algo.served_only=true",
                cwd=tmp_path,
            )
        )
        said = trained.stderr  # the eval's 2 held-out episodes are in the transcript too, and kept out of training
        assert "algo.served: 5 of 7 served episodes used" in said and "2 on held-out seeds" in said, said
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        served = [r for r in rows if "served/episodes" in r]
        assert [r["step"] for r in served] == [3, 4, 5, 6] and all(r["kind"] == "action" for r in served), served
        assert all(not any(k.startswith("charts/episode") for k in r) for r in served)  # no rollouts of its own
        assert (run / "checkpoints/latest").read_text().strip() == "iter-000006"
        # keep_checkpoints=2 keeps the newest two, and the one the gateway serves (serve/serving.json)
        kept = sorted(p.name for p in (run / "checkpoints").glob("iter-*"))
        assert kept == ["iter-000002", "iter-000005", "iter-000006"], kept
        swapped = _ok(swarm("swap", url, "latest", cwd=tmp_path)).stdout
        assert "to v2" in swapped and "iter-000006" in swapped, swapped
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["version"] == "v2" and health["checkpoint"] == "iter-000006", health
        note = json.loads((run / "serve/serving.json").read_text())
        assert note["checkpoints"] == ["iter-000002", "iter-000006"], note  # both versions: a rollback finds v1
        after = _ok(swarm("eval", str(run), f"serve.url={url}", cwd=tmp_path)).stdout
        assert "served checkpoint iter-000006" in after, after
        assert (run / "eval-served-iter-000002.json").exists() and (run / "eval-served-iter-000006.json").exists()
    finally:
        pids |= {a["pid"] for a in httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"] if a["pid"]}
        _stop(g)
        for pid in pids:
            _kill_pid(pid)
    assert not (run / "serve/serving.json").exists()  # the gateway's note goes with it
