"""``swarm serve`` on loopback: the served swarm against the same swarm in process, under faults.

From one run on one checkpoint and the same held-out seeds (copied to a scratch run folder, so the
source run is never written to), it prints:
- held-out reward in process (``evaluate(..., common_random_numbers=True)``) and through the service
  (same (seed, run) noise ids), and how many episodes are identical turn by turn;
- throughput (decisions per second) of the served swarm (``--concurrency`` episodes in flight) and of
  the in-process batched loop;
- gateway overhead per turn beyond model compute (turn latency minus the workers' reported compute on
  the critical path: the slowest bid plus the action), p50 / p99, from episodes played one at a time;
- a fault run: ``--fault-episodes`` concurrent episodes while a chaos loop kill -9s a random worker
  every ``--chaos-interval`` seconds (the gateway restarts it), and the gateway itself once, when
  ``--kill-gateway-at`` of the run's decisions are made (``swarm serve`` is started again on the same
  run folder and port):
  every episode must end ``done``, ``degraded`` or ``interrupted`` (the restarted gateway lists those
  the kill cut off; the client replays them with the same seed and noise), none lost or duplicated;
  reward against the fault-free served run on the same noise, missed bids, failovers, p50 / p99 turn
  latency;
- dropout through the service: 3 agents (replicas 1) and 12 agents (replicas 4) with a third of the
  workers killed for good (``serve.restart_workers=false``), next to the in-process evaluation of the
  same swarm with the same agents absent (a fixed presence mask: the served episodes should be the same
  ones), with everyone present, and with per-episode dropout p = 1/3 (``deploy.dropout_presence``).

    python benchmarks/serve.py --run RUN_DIR [--checkpoint sft] [--episodes 8] [--concurrency 8]
        [--fault-episodes 16] [--chaos-interval 3] [--kill-gateway-at 0.5] [--skip-population] [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def pct(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def scratch_run(src: Path, tag: str, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.yaml", dst / "config.yaml")
    shutil.copytree(src / "checkpoints" / tag, dst / "checkpoints" / tag)
    (dst / "checkpoints" / "latest").write_text(tag)
    return dst


class Gateway:
    """``swarm serve`` in a subprocess, stopped by pid."""

    def __init__(self, run: Path, tag: str, args: list[str], log: Path):
        from swarm_runtime.serve.population import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [
            sys.executable,
            "-m",
            "swarm_runtime.cli.main",
            "serve",
            str(run),
            f"checkpoint={tag}",
            f"serve.port={self.port}",
            *args,
        ]
        self.log = log
        self.start()

    def start(self):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(self.argv, env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        return self

    def wait(self, timeout=600):
        import httpx

        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).json()["status"] == "ok":
                    return self
            except Exception:
                pass
            time.sleep(0.5)
        raise TimeoutError("gateway not up")

    def agents(self):
        import httpx

        return httpx.get(f"{self.url}/v1/swarm/agents", timeout=10).json()["agents"]

    def stop(self):
        pids = [a["pid"] for a in self.agents() if a["pid"]] if self.proc.poll() is None else []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def scrape(url) -> dict:
    """``/metrics`` samples without labels, as floats."""
    import httpx

    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            k, v = line.split()
            out[k] = float(v)
    return out


def turn_stats(bodies):
    lat = [r["latency_ms"] for b in bodies for r in b["turns"]]
    over = [r["latency_ms"] - r["compute_ms"] for b in bodies for r in b["turns"]]
    return lat, over


async def served_grid(url, seeds, runs, seed, concurrency):
    from swarm_runtime.serve.client import evaluate_served

    t0 = time.perf_counter()
    res, eps, bodies = await evaluate_served(url, seeds, runs, seed, None, None, concurrency)
    return res, eps, bodies, time.perf_counter() - t0


# Long on purpose: the chaos loop, the gateway kill and the client's replay share its state (the episodes in
# flight, the kills, the restarted gateway); its steps are in the docstring.
async def fault_run(gw: Gateway, seeds, runs, seed, concurrency, interval, max_s, kill_at=None, decisions=0):
    """The grid with a chaos loop killing a random worker every ``interval`` seconds and, once the
    gateway has made ``kill_at`` x ``decisions`` turns of it (``swarm_turns_total``), the gateway once (kill -9, then ``swarm serve`` again on the same
    folder and port). A request the gateway kill cut off is looked up in the restarted gateway's
    ``GET /v1/episodes?status=interrupted`` by (seed, noise): found, it is ``interrupted`` (and replayed
    with the same noise); not found, it never started (the client got no id) and is sent again.
    Returns (bodies, kills, wall, gateway_kill)."""
    import httpx

    from swarm_runtime.core.noise import key_hash
    from swarm_runtime.serve.client import SwarmClient

    kills = []
    stop = asyncio.Event()
    up = asyncio.Event()
    up.set()
    gk: dict = {"killed_at_s": None, "back_after_s": None, "cut": 0, "interrupted": [], "resent": 0, "replayed": []}
    t0 = time.perf_counter()

    async def chaos():
        rng = random.Random(0)
        async with httpx.AsyncClient() as c:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), interval)
                    break
                except asyncio.TimeoutError:
                    pass
                if not up.is_set():
                    continue
                try:
                    agents = [a for a in (await c.get(f"{gw.url}/v1/swarm/agents")).json()["agents"] if a["pid"]]
                except httpx.HTTPError:
                    continue
                if agents:
                    a = rng.choice(agents)
                    try:
                        os.kill(a["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    kills.append((round(time.time(), 2), a["name"]))

    async def kill_gateway():
        start = scrape(gw.url)["swarm_turns_total"]
        async with httpx.AsyncClient() as c:
            while not stop.is_set():
                text = (await c.get(f"{gw.url}/metrics")).text
                turns = next(float(x.split()[1]) for x in text.splitlines() if x.startswith("swarm_turns_total "))
                if turns - start >= kill_at * decisions:
                    break
                await asyncio.sleep(0.05)
        if stop.is_set():
            return
        gk["turns_before_kill"] = int(turns - start)
        up.clear()
        gw.proc.kill()
        gw.proc.wait()
        gk["killed_at_s"] = round(time.perf_counter() - t0, 1)
        await asyncio.sleep(1.5)  # its workers notice their parent is gone and exit
        gw.start()
        await asyncio.get_running_loop().run_in_executor(None, gw.wait)
        gk["back_after_s"] = round(time.perf_counter() - t0 - gk["killed_at_s"], 1)
        up.set()

    grid = [(r, s) for r in range(runs) for s in seeds]
    sem = asyncio.Semaphore(concurrency)
    async with SwarmClient(gw.url, timeout=max_s) as client:

        async def one(r, s):
            noise = str(key_hash(seed, r, s))
            async with sem:
                while True:
                    await up.wait()
                    try:
                        return await client.episode(seed=s, noise=noise)
                    except httpx.ConnectError:  # the gateway is down: the request never reached it
                        await asyncio.sleep(0.5)
                        continue
                    except httpx.TransportError:  # cut off by the gateway kill
                        gk["cut"] += 1
                    await asyncio.sleep(0.2)
                    await up.wait()
                    listed = await client.episodes("interrupted")
                    hit = [e for e in listed if e["seed"] == s and e["noise"] == noise]
                    if not hit:  # it had not started: no id was given, send it again
                        gk["resent"] += 1
                        continue
                    gk["interrupted"].append(hit[0]["id"])
                    replay = await client.episode(seed=s, noise=noise)
                    gk["replayed"].append((hit[0]["id"], replay["id"], replay["status"]))
                    return {**hit[0], "turns": hit[0].get("turns", []), "replay": replay}

        tasks = [asyncio.ensure_future(chaos())]
        if kill_at is not None:
            tasks.append(asyncio.ensure_future(kill_gateway()))
        try:
            bodies = await asyncio.gather(*(one(r, s) for r, s in grid), return_exceptions=True)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    return bodies, kills, time.perf_counter() - t0, gk


# Long on purpose: a measurement script's one procedure, its phases in the order the module docstring lists them,
# each printing as it goes (split a phase out when another script needs it).
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="a finished `swarm run` folder")
    ap.add_argument("--checkpoint", default="final")
    ap.add_argument("--episodes", type=int, default=8, help="held-out seeds")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--fault-episodes", type=int, default=16, help="episodes of the fault run (runs x seeds)")
    ap.add_argument(
        "--fault-concurrency",
        type=int,
        default=None,
        help="episodes of the fault run in flight at once (default: all of them)",
    )
    ap.add_argument("--chaos-interval", type=float, default=3.0)
    ap.add_argument(
        "--kill-gateway-at",
        type=float,
        default=0.5,
        help="kill -9 the gateway once when this share of the fault run's decisions is made (negative: never)",
    )
    ap.add_argument("--overhead-episodes", type=int, default=2)
    ap.add_argument("--skip-population", action="store_true")
    ap.add_argument(
        "--throughput-only",
        action="store_true",
        help="in process and the fault-free served grid only (no overhead, fault or population phase)",
    )
    ap.add_argument("--max-seconds", type=float, default=1800, help="bound on each served phase")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    from swarm_runtime.config.load import load_saved
    from swarm_runtime.evaluation.deploy import dropout_presence
    from swarm_runtime.evaluation.heldout import evaluate
    from swarm_runtime.plugins.manager import get_registry
    from swarm_runtime.runs.context import RunContext

    tmp = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    run = scratch_run(Path(a.run), a.checkpoint, tmp / "run")
    cfg = load_saved(run / "config.yaml")
    pm, reg = get_registry()
    ctx = RunContext(cfg, pm, reg, run)
    seeds = ctx.domain.episode_seeds(ctx.task, "eval")[: a.episodes]
    eval_seed = int(cfg.seed) + 7919
    out: dict = {
        "run": str(a.run),
        "checkpoint": a.checkpoint,
        "task": f"{cfg.domain}/{cfg.task_name}",
        "seeds": len(seeds),
    }

    # 1. in process
    agents, _ = ctx.build_swarm(run / "checkpoints" / a.checkpoint / "agents")
    t0 = time.perf_counter()
    res, eps = evaluate(
        agents,
        ctx.coordinator(),
        ctx.domain,
        ctx.task,
        seeds,
        1,
        eval_seed,
        cfg.eval.temperature,
        common_random_numbers=True,
    )
    wall = time.perf_counter() - t0
    out["in_process"] = {
        "reward": (res["reward_mean"], res["reward_se"]),
        "wall_s": wall,
        "decisions_per_s": sum(len(e.turns) for e in eps) / wall,
    }
    print(
        f"in process: reward {res['reward_mean']:.2f} ± {res['reward_se']:.2f} over {len(seeds)} seeds, "
        f"{out['in_process']['decisions_per_s']:.1f} decisions/s",
        flush=True,
    )

    gw = Gateway(
        run,
        a.checkpoint,
        ["serve.probe_interval_ms=200", f"serve.max_episodes={max(64, a.fault_episodes)}"],
        tmp / "gateway.log",
    ).wait()
    try:
        # 2. served, fault-free: equality and throughput
        b0, m0 = batching(gw), scrape(gw.url)
        sres, seps, bodies, swall = asyncio.run(served_grid(gw.url, seeds, 1, eval_seed, a.concurrency))
        b1, m1 = batching(gw), scrape(gw.url)
        same = sum(
            [(t.winner, t.bids, t.action_text, t.reward) for t in x.turns]
            == [(t.winner, t.bids, t.action_text, t.reward) for t in y.turns]
            for x, y in zip(eps, seps)
        )
        lat, _ = turn_stats(bodies)
        out["served"] = {
            "reward": (sres["reward_mean"], sres["reward_se"]),
            "identical_episodes": same,
            "wall_s": swall,
            "decisions_per_s": sum(len(e.turns) for e in seps) / swall,
            "concurrency": a.concurrency,
            "missed_bids": sum(b["missed_bids"] for b in bodies),
            "failovers": sum(b["failovers"] for b in bodies),
            "turn_latency_ms_p50": pct(lat, 50),
            "turn_latency_ms_p99": pct(lat, 99),
            "worker_requests": b1["requests"] - b0["requests"],
            "worker_batches": b1["batches"] - b0["batches"],
            "gateway_cpu_ms_per_turn": (m1["process_cpu_seconds_total"] - m0["process_cpu_seconds_total"])
            / max(1.0, m1["swarm_turns_total"] - m0["swarm_turns_total"])
            * 1000,
            "workers_cpu_ms_per_turn": (b1["cpu_s"] - b0["cpu_s"])
            / max(1.0, m1["swarm_turns_total"] - m0["swarm_turns_total"])
            * 1000,
        }
        print(
            f"served: reward {sres['reward_mean']:.2f} ± {sres['reward_se']:.2f}, {same}/{len(seeds)} episodes "
            f"identical to in process ({out['served']['missed_bids']} missed bids, {out['served']['failovers']} "
            f"failovers); {out['served']['decisions_per_s']:.1f} decisions/s at concurrency "
            f"{a.concurrency} ({out['served']['decisions_per_s'] / out['in_process']['decisions_per_s']:.2f}x "
            f"in process); workers answered {out['served']['worker_requests']} requests in "
            f"{out['served']['worker_batches']} batches "
            f"({out['served']['worker_requests'] / max(1, out['served']['worker_batches']):.2f} per batch); "
            f"gateway CPU {out['served']['gateway_cpu_ms_per_turn']:.1f} ms per turn, workers' CPU "
            f"{out['served']['workers_cpu_ms_per_turn']:.1f} ms per turn",
            flush=True,
        )
        if a.throughput_only:
            return finish(a, out, tmp)
        # 3. overhead, one episode at a time
        m0 = scrape(gw.url)
        _, _, ob, _ = asyncio.run(served_grid(gw.url, seeds[: a.overhead_episodes], 1, eval_seed, 1))
        m1 = scrape(gw.url)
        cpu_turn = (
            (m1["process_cpu_seconds_total"] - m0["process_cpu_seconds_total"])
            / max(1.0, m1["swarm_turns_total"] - m0["swarm_turns_total"])
            * 1000
        )
        lat1, over1 = turn_stats(ob)
        comp1 = [r["compute_ms"] for b in ob for r in b["turns"]]
        out["overhead"] = {
            "turns": len(over1),
            "overhead_ms_p50": pct(over1, 50),
            "overhead_ms_p99": pct(over1, 99),
            "turn_latency_ms_p50": pct(lat1, 50),
            "compute_ms_p50": pct(comp1, 50),
            "gateway_cpu_ms_per_turn": cpu_turn,
        }
        print(
            f"gateway overhead per turn beyond model compute (one episode at a time, {len(over1)} turns): "
            f"p50 {pct(over1, 50):.1f} ms, p99 {pct(over1, 99):.1f} ms (turn latency p50 {pct(lat1, 50):.1f} ms, "
            f"model compute p50 {pct(comp1, 50):.1f} ms); gateway CPU {cpu_turn:.1f} ms per turn "
            f"(env steps included)",
            flush=True,
        )
        # 4. fault run
        runs = max(1, -(-a.fault_episodes // len(seeds)))
        fb, kills, fwall, gk = asyncio.run(
            fault_run(
                gw,
                seeds,
                runs,
                eval_seed,
                a.fault_concurrency or a.fault_episodes,
                a.chaos_interval,
                a.max_seconds,
                a.kill_gateway_at if a.kill_gateway_at >= 0 else None,
                runs * len(seeds) * int(cfg.task.max_decisions),
            )
        )
        ok = [b for b in fb if isinstance(b, dict) and b.get("status") == "done"]
        ends = [b for b in fb if isinstance(b, dict) and b.get("status") in ("done", "degraded", "interrupted")]
        ids = [b["id"] for b in fb if isinstance(b, dict)]
        keys = [(b["seed"], b["noise"]) for b in ok]
        # every (seed, noise) of the grid ends exactly once in the transcripts (replays of interrupted
        # episodes are new episodes with their own ids), and every interrupted one was listed
        lines = [json.loads(x) for x in (run / "serve" / "episodes.jsonl").read_text().splitlines()]
        fault_ids = set(ids) | {r[1] for r in gk["replayed"]}
        logged = [x["id"] for x in lines if x["id"] in fault_ids]
        flat, _ = turn_stats(ok)
        free = {(b["seed"], b["noise"]): b["reward"] for b in bodies}
        paired = [(b["reward"], free[(b["seed"], b["noise"])]) for b in ok if (b["seed"], b["noise"]) in free]
        fr = [b["reward"] for b in ok]
        out["fault"] = {
            "episodes": len(fb),
            "completed": len(ok),
            "ended": {
                st: sum(1 for b in fb if isinstance(b, dict) and b.get("status") == st)
                for st in ("done", "degraded", "interrupted", "failed")
            },
            "lost": len(fb) - len(ends),
            "transcript_duplicates": len(logged) - len(set(logged)),
            "gateway_kill": gk,
            "errors": [
                str(b)[:200]
                for b in fb
                if not isinstance(b, dict) or b.get("status") not in ("done", "degraded", "interrupted")
            ],
            "duplicated_ids": len(ids) - len(set(ids)),
            "duplicated_episodes": len(keys) - len(set(keys)),
            "kills": len(kills),
            "wall_s": fwall,
            "reward_mean": statistics.mean(fr) if fr else None,
            "reward_fault_free_same_noise": statistics.mean(f for _, f in paired) if paired else None,
            "reward_faulty_same_noise": statistics.mean(x for x, _ in paired) if paired else None,
            "missed_bids": sum(b["missed_bids"] for b in ok),
            "failovers": sum(b["failovers"] for b in ok),
            "decisions": sum(b["decisions"] for b in ok),
            "turn_latency_ms_p50": pct(flat, 50),
            "turn_latency_ms_p99": pct(flat, 99),
        }
        f = out["fault"]
        print(
            f"fault run: of {f['episodes']} episodes {f['ended']['done']} done, {f['ended']['degraded']} degraded, "
            f"{f['ended']['interrupted']} interrupted by the gateway kill at {gk['killed_at_s']}s, after "
            f"{gk.get('turns_before_kill')} turns (listed by the "
            f"restarted gateway, back after {gk['back_after_s']}s, and replayed: "
            f"{[r[2] for r in gk['replayed']]}), {gk['resent']} not yet started and sent again, {f['lost']} lost, "
            f"{f['transcript_duplicates']} duplicated in episodes.jsonl",
            flush=True,
        )
        num = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        print(
            f"fault run: {f['completed']}/{f['episodes']} episodes completed, {f['duplicated_episodes']} duplicated, "
            f"{f['kills']} workers killed (every {a.chaos_interval:g}s, {fwall:.0f}s); reward "
            f"{num(f['reward_faulty_same_noise'])} vs {num(f['reward_fault_free_same_noise'])} fault-free on the same "
            f"{len(paired)} (seed, noise) pairs; {f['missed_bids']} missed bids, {f['failovers']} failovers in "
            f"{f['decisions']} decisions; turn latency p50 {f['turn_latency_ms_p50']:.0f} ms, "
            f"p99 {f['turn_latency_ms_p99']:.0f} ms",
            flush=True,
        )
    finally:
        gw.stop()

    # 5. dropout through the service: 3 vs 12 agents, a third of the workers killed for good
    if not a.skip_population:
        out["population"] = {}
        for k in (1, 4):
            n = 3 * k
            ag, _ = ctx.build_swarm(run / "checkpoints" / a.checkpoint / "agents", replicas=k)
            victims = sorted(random.Random(n).sample(range(n), n // 3))
            mask = [i not in victims for i in range(n)]
            r_all, _ = evaluate(
                ag,
                ctx.coordinator(),
                ctx.domain,
                ctx.task,
                seeds,
                1,
                eval_seed,
                cfg.eval.temperature,
                common_random_numbers=True,
            )
            r_abs, e_abs = evaluate(
                ag,
                ctx.coordinator(),
                ctx.domain,
                ctx.task,
                seeds,
                1,
                eval_seed,
                cfg.eval.temperature,
                presence=lambda _s, _t, _n: mask,
                common_random_numbers=True,
            )
            r_drop, _ = evaluate(
                ag,
                ctx.coordinator(),
                ctx.domain,
                ctx.task,
                seeds,
                1,
                eval_seed,
                cfg.eval.temperature,
                presence=dropout_presence(1 / 3, n, per="episode"),
                common_random_numbers=True,
            )
            g = Gateway(
                run,
                a.checkpoint,
                [f"serve.replicas={k}", "serve.restart_workers=false", "serve.probe_interval_ms=200"],
                tmp / f"gateway-{n}.log",
            ).wait()
            try:
                agents_now = g.agents()
                for i in victims:
                    os.kill(agents_now[i]["pid"], signal.SIGKILL)
                time.sleep(1.0)
                r_sv, e_sv, b_sv, _ = asyncio.run(served_grid(g.url, seeds, 1, eval_seed, a.concurrency))
            finally:
                g.stop()
            same = sum(
                [(t.winner, t.action_text, t.reward) for t in x.turns]
                == [(t.winner, t.action_text, t.reward) for t in y.turns]
                for x, y in zip(e_abs, e_sv)
            )
            out["population"][n] = {
                "killed": [agents_now[i]["name"] for i in victims],
                "served_killed": (r_sv["reward_mean"], r_sv["reward_se"]),
                "in_process_same_absent": (r_abs["reward_mean"], r_abs["reward_se"]),
                "identical_episodes": same,
                "in_process_all_present": (r_all["reward_mean"], r_all["reward_se"]),
                "in_process_dropout_episode_p1/3": (r_drop["reward_mean"], r_drop["reward_se"]),
                "missed_bids": sum(b["missed_bids"] for b in b_sv),
            }
            print(
                f"{n} agents, {n // 3} workers killed ({', '.join(out['population'][n]['killed'])}): served reward "
                f"{r_sv['reward_mean']:.2f} ± {r_sv['reward_se']:.2f}; in process with the same agents absent "
                f"{r_abs['reward_mean']:.2f} ± {r_abs['reward_se']:.2f} ({same}/{len(seeds)} episodes identical); "
                f"in process, all present {r_all['reward_mean']:.2f} ± {r_all['reward_se']:.2f}, per-episode "
                f"dropout p = 1/3 (swarm experiment dropout's draw) {r_drop['reward_mean']:.2f} ± "
                f"{r_drop['reward_se']:.2f}",
                flush=True,
            )
    finish(a, out, tmp)


def batching(gw: Gateway) -> dict:
    """Requests and batches answered so far, summed over the gateway's workers (their ``/health``)."""
    import httpx

    tot = {"requests": 0, "batches": 0, "cpu_s": 0.0}
    for ag in gw.agents():
        if ag["url"] and ag["pid"]:
            b = httpx.get(f"{ag['url']}/health", timeout=10).json().get("batching", {})
            for k in ("requests", "batches"):
                tot[k] += int(b.get(k, 0))
            stat = Path(f"/proc/{ag['pid']}/stat")
            if stat.exists():  # Linux: the worker process's CPU time
                f = stat.read_text().rsplit(")", 1)[1].split()
                tot["cpu_s"] += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return tot


def finish(a, out: dict, tmp: Path) -> None:
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
