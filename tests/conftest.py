import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Small budget for runs in tests: a few demo episodes, short episodes, two updates.
TINY_RUN = ["domain=minecraft", "task=wooden_pickaxe", "task.max_decisions=16", "algo.sft.demo_episodes=2",
            "algo.sft.epochs=1", "algo.envs_per_step=2", "algo.iterations=2", "algo.action_steps=1",
            "algo.bid_steps=1", "eval.episodes=2", "eval.runs=1", "progress=false", "tensorboard=true"]


def swarm(*args: str, cwd: Path, timeout: int = 300, env: dict | None = None, **popen) -> subprocess.CompletedProcess:
    """Run the real ``swarm`` CLI in a subprocess (``env``: variables to add or change)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "swarm_runtime.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, **popen)


@pytest.fixture(scope="session")
def registry():
    from swarm_runtime.plugins import build_registry, make_plugin_manager

    pm = make_plugin_manager()
    return pm, build_registry(pm)
