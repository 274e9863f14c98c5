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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a role's checkpoint folder")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
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
        clients = {"httpx": via_httpx, "httpcore": via_httpcore}
        if importlib.util.find_spec("aiohttp") is not None:
            clients["aiohttp"] = via_aiohttp
        print(f"{a.requests} sequential bid requests to one {name} worker, per request:", flush=True)
        for r in range(a.rounds):
            for kind, fn in clients.items():
                asyncio.run(fn(url, body, 5))  # warm up (connections, first-call imports)
                s0, c0, w0 = proc_cpu(worker.pid), time.process_time(), time.perf_counter()
                asyncio.run(fn(url, body, a.requests))
                s1, c1, w1 = proc_cpu(worker.pid), time.process_time(), time.perf_counter()
                n = a.requests
                print(
                    f"round {r + 1} {kind:9s} client CPU {(c1 - c0) / n * 1000:.2f} ms, worker CPU "
                    f"{(s1 - s0) / n * 1000:.2f} ms, wall {(w1 - w0) / n * 1000:.2f} ms",
                    flush=True,
                )
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()


if __name__ == "__main__":
    main()
