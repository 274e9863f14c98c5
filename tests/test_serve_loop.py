"""The closed loop of docs/guides/serve.md ("Training on served traffic") on the tiny default, with the real CLI in
subprocesses: ``swarm run``, ``swarm serve`` on its latest checkpoint, ``swarm eval serve.url=`` (before),
``swarm collect`` (episodes on training seeds), ``swarm run resume=true ... algo.served=[RUN] algo.served_only=true``,
``swarm swap URL latest`` while serving, ``swarm eval serve.url=`` (after)."""

import json

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import TINY_RUN, swarm  # noqa: E402
from test_serve import _free_port, _kill_pid, _start, _stop, _wait_health  # noqa: E402


def _ok(r):
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    return r


def test_serve_collect_train_swap_and_evaluate_before_and_after(tmp_path):
    run = tmp_path / "run"
    _ok(swarm("run", *TINY_RUN, "tensorboard=false", f"run_dir={run}", cwd=tmp_path))
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
        trained = _ok(
            swarm(
                "run",
                "resume=true",
                f"run_dir={run}",
                "algo.iterations=4",
                f"algo.served=[{run}]",
                "algo.served_only=true",
                cwd=tmp_path,
            )
        )
        said = trained.stderr  # the eval's 2 held-out episodes are in the transcript too, and kept out of training
        assert "algo.served: 4 of 6 served episodes used" in said and "2 on held-out seeds" in said, said
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        served = [r for r in rows if "served/episodes" in r]
        assert [r["step"] for r in served] == [3, 4] and all(r["kind"] == "action" for r in served), served
        assert all(not any(k.startswith("charts/episode") for k in r) for r in served)  # no rollouts of its own
        assert (run / "checkpoints/latest").read_text().strip() == "iter-000004"
        swapped = _ok(swarm("swap", url, "latest", cwd=tmp_path)).stdout
        assert "to v2" in swapped and "iter-000004" in swapped, swapped
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["version"] == "v2" and health["checkpoint"] == "iter-000004", health
        after = _ok(swarm("eval", str(run), f"serve.url={url}", cwd=tmp_path)).stdout
        assert "served checkpoint iter-000004" in after, after
        assert (run / "eval-served-iter-000002.json").exists() and (run / "eval-served-iter-000004.json").exists()
    finally:
        pids |= {a["pid"] for a in httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"] if a["pid"]}
        _stop(g)
        for pid in pids:
            _kill_pid(pid)
