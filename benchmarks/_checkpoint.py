"""Shared by the diagnostic benchmarks that measure a trained checkpoint (``branch_noise.py``,
``action_signal.py``, ``credit_baselines.py``): the command line they have in common and the
swarm they load."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from loguru import logger

from swarm_runtime.config.load import resolve
from swarm_runtime.plugins.manager import get_registry
from swarm_runtime.runs.context import RunContext


def parser(doc: str, seed: int) -> argparse.ArgumentParser:
    """An argument parser with the checkpoint, ``--seed`` and ``--threads``; the script adds its own
    options. Unknown ``key=value`` arguments are run config overrides."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("checkpoint", help="a checkpoint folder (RUN_DIR/checkpoints/TAG)")
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--threads", type=int, default=1)
    return ap


def add_batch_options(ap: argparse.ArgumentParser, iterations: int) -> None:
    """``--iterations`` batches of ``--envs`` episodes, ``--per-episode`` turns picked from each,
    scored over ``--horizon`` decisions (the benchmarks that replay picked turns)."""
    ap.add_argument("--iterations", type=int, default=iterations, help="batches of episodes")
    ap.add_argument("--envs", type=int, default=32, help="episodes per batch")
    ap.add_argument("--per-episode", type=int, default=2, help="turns picked per episode")
    ap.add_argument(
        "--horizon", type=int, default=None, help="score H decisions from the picked turn (default: to the end)"
    )


def load(args, overrides: list[str]):
    """``(RunContext, agents)``: the config resolved from ``overrides`` (as ``swarm run`` would) and
    the checkpoint's models; warnings only on the log."""
    torch.set_num_threads(args.threads)
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    pm, reg = get_registry()
    ctx = RunContext(resolve(["progress=false", *overrides], reg), pm, reg, None)
    agents, _ = ctx.build_swarm(Path(args.checkpoint) / "agents")
    return ctx, agents
