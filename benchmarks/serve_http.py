"""The gateway's HTTP client, measured: CPU per request of the client and of one real agent worker.

Starts one worker (``python -m swarm_runtime.serve.worker``) on a role's checkpoint, then sends it
``--requests`` sequential bid requests (the body the gateway sends: ``guided_choice`` = the bid levels,
a keyed ``seed``) through each client and prints, per request, the client's CPU (``time.process_time``),
the worker's CPU (``/proc/PID/stat``, Linux) and the wall time:

- ``httpx``: ``httpx.AsyncClient`` (what the gateway used before);
- ``httpcore``: ``httpcore.AsyncConnectionPool`` (the engine under httpx; what the gateway uses now,
  ``swarm_runtime.serve.transport.AgentClients``);
- ``aiohttp``: ``aiohttp.ClientSession``, only if aiohttp is installed (it is not a dependency).

    python benchmarks/serve_http.py --model RUN/checkpoints/TAG/agents/ROLE [--requests 400] [--rounds 2]

``--journal-tokens``: instead, through ``httpcore`` only, a bid and an action request each with and without what
the gateway asks every request for the journal (``return_token_ids``, ``logprobs`` 0:
``swarm_runtime.serve.answerer.TOKEN_FIELDS``), and the cost of asking as a ratio per kind.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def proc_cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


async def via_httpx(url: str, body: dict, n: int) -> None:
    import httpx

    async with httpx.AsyncClient() as c:
        for _ in range(n):
            r = await c.post(url, json=body, timeout=30)
            r.raise_for_status()
            r.json()


async def via_httpcore(url: str, body: dict, n: int) -> None:
    import httpcore

    ext = {"timeout": {"connect": 30, "read": 30, "write": 30, "pool": 30}}
    async with httpcore.AsyncConnectionPool() as pool:
        for _ in range(n):
            r = await pool.request(
                "POST",
                url,
                content=json.dumps(body).encode(),
                extensions=ext,
                headers=[(b"content-type", b"application/json")],
            )
            assert r.status == 200, r.content
            json.loads(r.content)


async def via_aiohttp(url: str, body: dict, n: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            async with s.post(url, json=body, timeout=aiohttp.ClientTimeout(total=30)) as r:
                r.raise_for_status()
                await r.json()


def measure(pid: int, fn, url: str, body: dict, n: int) -> tuple[float, float, float]:
    """Seconds per request of ``n`` sequential requests through ``fn``: the client's CPU, the worker's, the wall."""
    asyncio.run(fn(url, body, 5))  # warm up (connections, first-call imports)
    s0, c0, w0 = proc_cpu(pid), time.process_time(), time.perf_counter()
    asyncio.run(fn(url, body, n))
    s1, c1, w1 = proc_cpu(pid), time.process_time(), time.perf_counter()
    return (c1 - c0) / n, (s1 - s0) / n, (w1 - w0) / n


def show(cpu: tuple[float, float, float]) -> str:
    return f"client CPU {cpu[0] * 1000:.2f} ms, worker CPU {cpu[1] * 1000:.2f} ms, wall {cpu[2] * 1000:.2f} ms"


def journal_tokens(pid: int, url: str, bid: dict, n: int, rounds: int) -> None:
    """A bid and a 12-token action, each with and without the journal's token fields, in turn."""
    from swarm_runtime.serve.answerer import TOKEN_FIELDS

    action = {k: v for k, v in bid.items() if k != "guided_choice"} | {"max_tokens": 12, "prompt": bid["prompt"][:-6]}
    print(f"{n} sequential requests to one worker through httpcore, per request:", flush=True)
    for r in range(rounds):
        for kind, body in (("bid", bid), ("action", action)):
            plain = measure(pid, via_httpcore, url, body, n)
            tokens = measure(pid, via_httpcore, url, {**body, **TOKEN_FIELDS}, n)
            print(f"round {r + 1} {kind:6s} text only   {show(plain)}", flush=True)
            print(f"round {r + 1} {kind:6s} with tokens {show(tokens)}", flush=True)
            print(
                f"round {r + 1} {kind:6s} with/without: client CPU {tokens[0] / plain[0]:.2f}x, worker CPU "
                f"{tokens[1] / plain[1]:.2f}x, wall {tokens[2] / plain[2]:.2f}x",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a role's checkpoint folder")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--journal-tokens", action="store_true", help="with vs without the journal's token fields")
    a = ap.parse_args()
    from swarm_runtime.models.tokenizer import bid_token
    from swarm_runtime.serve.population import free_port
    from swarm_runtime.serve.protocol import seed_for

    meta = json.loads((Path(a.model) / "swarm_policy.json").read_text())
    port, name = free_port(), Path(a.model).name
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "swarm_runtime.serve.worker", "--model", a.model, "--name", name, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        import httpx

        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited with {worker.returncode}")
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/v1/completions"
        body = {
            "model": name,
            "prompt": f"you are {name} . goal iron_pickaxe . inventory : none . bid :",
            "max_tokens": 1,
            "temperature": 1.0,
            "seed": seed_for(7, 0, 0, 0),
            "guided_choice": [bid_token(b) for b in meta["bid_levels"]],
        }
        if a.journal_tokens:
            journal_tokens(worker.pid, url, body, a.requests, a.rounds)
            return
        clients = {"httpx": via_httpx, "httpcore": via_httpcore}
        if importlib.util.find_spec("aiohttp") is not None:
            clients["aiohttp"] = via_aiohttp
        print(f"{a.requests} sequential bid requests to one {name} worker, per request:", flush=True)
        for r in range(a.rounds):
            for kind, fn in clients.items():
                cpu = measure(worker.pid, fn, url, body, a.requests)
                print(f"round {r + 1} {kind:9s} {show(cpu)}", flush=True)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()


if __name__ == "__main__":
    main()
