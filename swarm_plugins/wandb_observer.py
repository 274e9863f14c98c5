"""Weights & Biases observer: mirrors a run's training metrics, episode rewards and held-out
results to W&B through the observer hooks (``swarm_on_run_start`` / ``swarm_on_train_step`` /
``swarm_on_episode_end`` / ``swarm_on_run_end``), as verl and TRL users expect.

Registered as the ``wandb`` entry point of the ``swarm_runtime`` group, it does nothing unless the
environment variable ``SWARM_WANDB`` is set: ``SWARM_WANDB=1`` (project ``swarm-runtime``) or
``SWARM_WANDB=<project>``. W&B's own variables apply (``WANDB_MODE=offline`` writes the run under
``<run_dir>/wandb/`` for ``wandb sync`` later; ``WANDB_ENTITY``, ``WANDB_API_KEY``). ``wandb`` is
imported only then; without it the run stops at its start with the install command
(``pip install 'swarm-runtime[wandb]'``). Skip the plugin altogether with
``SWARM_DISABLE_PLUGINS=wandb``.

What is logged: every ``swarm_on_train_step`` metric that is a number (``losses/...``,
``charts/...``, ``flops/...``; SFT steps as ``sft/<role>/<key>``) at the update's step; episode
rewards as ``rollout/episode_reward`` (a running count as the x axis); the held-out table's
numbers into the run summary (``eval/...``); the resolved config as the run config.
"""

from __future__ import annotations

import os
from numbers import Number
from typing import Any

from swarm_runtime import hookimpl

#: The environment variable that turns the observer on (``1`` or a W&B project name).
ENV = "SWARM_WANDB"
DEFAULT_PROJECT = "swarm-runtime"

_state: dict[str, Any] = {"run": None, "episodes": 0}


def _project() -> str | None:
    value = os.environ.get(ENV, "").strip()
    if not value or value.lower() in ("0", "false", "no", "off"):
        return None
    return DEFAULT_PROJECT if value.lower() in ("1", "true", "yes", "on") else value


def _wandb():
    try:
        import wandb
    except ImportError as exc:
        raise ImportError(
            f"{ENV} is set but the wandb package is not installed: pip install 'swarm-runtime[wandb]' "
            f"(or unset {ENV}, or SWARM_DISABLE_PLUGINS=wandb)"
        ) from exc
    return wandb


def numbers(metrics: dict, prefix: str = "") -> dict[str, float]:
    """The numeric entries of ``metrics`` (nested dicts flattened with ``/``), as floats."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            out.update(numbers(v, f"{prefix}{k}/"))
        elif isinstance(v, Number) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
    return out


@hookimpl
def swarm_on_run_start(config: Any, run_dir: str) -> None:
    project = _project()
    if project is None:
        return
    wandb = _wandb()
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else dict(config)
    if _state["run"] is not None:  # a previous run in this process (an experiment's trainings)
        _state["run"].finish()
    _state["run"] = wandb.init(
        project=project,
        dir=str(run_dir),
        config=cfg,
        reinit=True,
        name=os.path.basename(os.path.normpath(str(run_dir))),
        group=str(cfg.get("experiment", {}).get("name") or "") or None,
    )
    _state["episodes"] = 0


@hookimpl
def swarm_on_train_step(step: int, kind: str, metrics: dict) -> None:
    run = _state["run"]
    if run is None:
        return
    if kind == "sft":
        role = str(metrics.get("role", "model"))
        run.log({f"sft/{role}/{k}": v for k, v in numbers(metrics).items()}, commit=True)
    else:
        run.log({**numbers(metrics), "update": int(step)}, commit=True)


@hookimpl
def swarm_on_episode_end(domain: str, seed: int, reward: float, metrics: dict) -> None:
    run = _state["run"]
    if run is None:
        return
    _state["episodes"] += 1
    run.log({"rollout/episode_reward": float(reward), "rollout/episode": _state["episodes"]})


@hookimpl
def swarm_on_run_end(config: Any, run_dir: str, results: dict) -> None:
    run = _state["run"]
    if run is None:
        return
    final = {f"eval/{k}": v for k, v in numbers(results).items()}
    run.log(final)
    run.summary.update(final)
    run.finish()
    _state["run"] = None
