"""Env workers on Ray (``cluster.kind=ray``, swarm_runtime/cluster/): rollout step throughput against 1, 2 and 4
workers for a domain whose step waits, and a real tiny ``swarm run`` with ``cluster.kind=ray`` against in process.

1. Throughput. ``sleepy``, a domain registered by this module as a plugin (in the workers too, through
   ``EnvCluster(plugins=...)``), is the minecraft world whose every step first waits ``--latency`` seconds (a
   simulator or a judge call with real latency; the wait holds no CPU). ``--envs`` envs are reset and stepped
   ``--turns`` turns, each turn as ``episode.play`` steps them: every step sent to the workers first
   (``episode.prefetch_steps``), then collected. Steps per second for 1, 2 and 4 workers on one local Ray, and
   the same envs stepped in process one after another.
   ``--latency 0`` (``--overhead``): a step that does not wait, so what is measured is the driver's overhead per
   turn: turns per second, milliseconds per turn and the remote calls the driver sent per turn
   (``EnvCluster.calls``), in process and for 1, 2 and 4 workers.
2. A job. ``swarm run`` with the test suite's tiny arguments (tests/conftest.py: ``TINY_RUN``; ``--job main``:
   README's main command, full size, plus ``--job-args``), in process and with ``cluster.kind=ray`` (a local Ray
   started by the run, 2 workers; ``--sides`` runs one of them), wall seconds of each (subprocesses; the Ray
   run's seconds include starting Ray, printed apart from its log).

    python benchmarks/env_workers.py                       # both (the tiny job)
    python benchmarks/env_workers.py --skip-job --latency 0.05
    python benchmarks/env_workers.py --skip-job --overhead    # the driver's overhead per turn (latency 0)
    python benchmarks/env_workers.py --skip-throughput
    python benchmarks/env_workers.py --skip-throughput --job main --sides local   # README's main job, in process
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarm_runtime import hookimpl
from swarm_runtime.core.env import DomainEnv

ROOT = Path(__file__).resolve().parent.parent


class SleepyEnv(DomainEnv):
    """Another domain's env whose ``step`` first waits ``latency`` seconds."""

    def __init__(self, inner: DomainEnv, latency: float):
        self.inner, self.latency = inner, latency

    def reset(self, seed):
        return self.inner.reset(seed)

    def step(self, action, role=None):
        time.sleep(self.latency)
        return self.inner.step(action, role)

    def observation(self):
        return self.inner.observation()

    def snapshot(self):
        return self.inner.snapshot()

    def restore(self, snapshot):
        self.inner.restore(snapshot)

    def metrics(self):
        return self.inner.metrics()

    def close(self):
        self.inner.close()


def sleepy_domain():
    from swarm_runtime.plugins.manager import get_registry

    base = type(get_registry()[1].domains["minecraft"])

    class SleepyDomain(base):
        name = "sleepy"

        def make_env(self, task):
            return SleepyEnv(super().make_env(task), float(task.get("step_latency_s", 0.05)))

    return SleepyDomain()


@hookimpl
def swarm_register_domains(register) -> None:
    register(sleepy_domain())


def _task(latency: float):
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import resolve
    from swarm_runtime.plugins.manager import get_registry

    task = resolve(["domain=minecraft", "task=wooden_pickaxe"], get_registry()[1]).task
    plain = OmegaConf.to_container(task, resolve=True)
    return OmegaConf.create({**plain, "step_latency_s": latency})


def step_turns(domain, task, n_envs: int, turns: int, role: str) -> tuple[int, int, float]:
    """Reset ``n_envs`` envs of ``domain`` and step them ``turns`` turns as ``episode.play`` does (the
    observation read, every step sent first, then collected; each env's metrics at the end); (steps, turns
    played, seconds of the turns)."""
    from swarm_runtime.core.engine import prefetch_steps
    from swarm_runtime.core.env import close_all
    from swarm_runtime.core.loop import make_env

    envs = [make_env(domain, task) for _ in range(n_envs)]
    for i, env in enumerate(envs):
        env.reset(i)
    steps, played, t0 = 0, 0, time.perf_counter()
    for _ in range(turns):
        live = [e for e in envs if not e.done]
        if not live:
            break
        for e in live:
            e.observation()
        prefetch_steps([(e, "chop tree", role) for e in live])
        for e in live:
            e.step("chop tree", role)
            steps += 1
        played += 1
    for e in envs:
        e.metrics()
    seconds = time.perf_counter() - t0
    close_all(envs)
    return steps, played, seconds


def throughput(args) -> None:
    import ray

    from swarm_runtime.cluster.env_cluster import ClusterDomain, EnvCluster

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # the workers'
    task, domain = _task(args.latency), sleepy_domain()
    role = domain.roles[0].name
    t0 = time.perf_counter()
    ray.init(
        address="local",
        num_cpus=args.num_cpus,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    print(f"local Ray started in {time.perf_counter() - t0:.1f} s (num_cpus={args.num_cpus})")
    steps, played, s = step_turns(domain, task, args.envs, args.turns, role)
    base = steps / s
    what = f"latency {args.latency * 1e3:.0f} ms, {args.envs} envs x {args.turns} turns"
    print(
        f"in process: {steps} steps in {s:.3f} s = {base:.1f} steps/s, {played / s:.1f} turns/s, "
        f"{s / played * 1e3:.2f} ms per turn ({what})"
    )
    rates = {}
    for n in args.workers:
        cluster = EnvCluster("sleepy", task, n, plugins=("benchmarks.env_workers",))
        step_turns(ClusterDomain(domain, cluster), task, args.envs, 1, role)  # warm: the envs made, the pools full
        calls = getattr(cluster, "calls", None)  # None: a commit before the count (a before/after comparison)
        steps, played, s = step_turns(ClusterDomain(domain, cluster), task, args.envs, args.turns, role)
        sent = "" if calls is None else f", {(cluster.calls - calls) / played:.1f} remote calls per turn"
        rates[n] = steps / s
        cluster.close()
        print(
            f"{n} env worker(s): {steps} steps in {s:.3f} s = {rates[n]:.1f} steps/s "
            f"({rates[n] / rates[min(rates)]:.2f}x {min(rates)} worker, {rates[n] / base:.2f}x in process), "
            f"{played / s:.1f} turns/s, {s / played * 1e3:.2f} ms per turn{sent}"
        )
    ray.shutdown()


#: README's main command (the default main job, full size)
MAIN_JOB = ["domain=minecraft", "task=iron_pickaxe"]


def job(args) -> None:
    """``swarm run`` of ``--job`` (tiny: tests/conftest.py ``TINY_RUN``; main: README's main command, plus
    ``--job-args``), in process and with ``cluster.kind=ray`` (``--sides`` picks either), wall seconds of each."""
    sys.path.insert(0, str(ROOT))
    from tests.conftest import TINY_RUN

    argv = [*(TINY_RUN if args.job == "tiny" else MAIN_JOB), *args.job_args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    sides = {
        "local": ("in process", []),
        "ray": ("cluster.kind=ray", ["cluster.kind=ray", "cluster.env_workers=2", f"cluster.num_cpus={args.num_cpus}"]),
    }
    walls, start = {}, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for side in args.sides:
            name, extra = sides[side]
            t0 = time.perf_counter()
            r = subprocess.run(
                [sys.executable, "-m", "swarm_runtime.cli.main", "run", *argv, *extra, f"run_dir={tmp}/{side}"],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
            )
            walls[name] = time.perf_counter() - t0
            if r.returncode:
                raise SystemExit(f"{name}: exit {r.returncode}: {r.stderr[-2000:]}")
            log = (Path(tmp) / side / "run.log").read_text()
            up = re.search(r"env workers on Ray: .* up in ([0-9.]+) s", log)
            start = float(up.group(1)) if up else start
            results = json.loads((Path(tmp) / side / "eval.json").read_text())["results"]
            reward = ", ".join(f"{k} {v['reward_mean']:.2f}" for k, v in results.items())
            print(
                f"{args.job} job {name}: {walls[name]:.1f} s wall"
                + (f", of which {start:.1f} s starting Ray and the workers" if up else "")
                + f"; held-out reward {reward}",
                flush=True,
            )
    if len(walls) == 2:
        ray_s, local_s = walls["cluster.kind=ray"], walls["in process"]
        print(
            f"ratio cluster.kind=ray / in process: {ray_s / local_s:.2f}; without the start: "
            f"{(ray_s - start) / local_s:.2f}"
        )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.05, help="seconds each step waits")
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--overhead", action="store_true", help="--latency 0: the driver's overhead per turn")
    ap.add_argument("--skip-job", action="store_true", help="only the throughput part")
    ap.add_argument("--skip-throughput", action="store_true", help="only the job")
    ap.add_argument("--job", choices=["tiny", "main"], default="tiny", help="the job to time: tiny or README's main")
    ap.add_argument("--job-args", nargs="*", default=[], help="more key=value arguments for the job")
    ap.add_argument("--sides", nargs="+", choices=["local", "ray"], default=["local", "ray"])
    args = ap.parse_args(argv)
    if args.overhead:
        args.latency = 0.0
    if not args.skip_throughput:
        throughput(args)
    if not args.skip_job:
        job(args)


if __name__ == "__main__":
    main()
