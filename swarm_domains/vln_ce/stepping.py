"""One decision's bookkeeping, shared by the embedded simulator and the habitat adapter.

Both keep the same measure state on an object (``done``, ``decisions``, ``invalid``,
``obs``, ``stopped``, ``dist``, ``min_dist``, ``collisions``, ``bump``): the embedded
simulator on itself, the habitat adapter on its snapshot-able bookkeeping. The
simulators differ only in how they move the agent between :func:`start_decision`
and :func:`finish_decision`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarm_domains.vln_ce import actions as A
from swarm_domains.vln_ce.config import EmbeddedConfig
from swarm_domains.vln_ce.metrics import is_success, step_reward
from swarm_runtime.core.env import StepResult


def start_decision(
    state: Any, action: str, role: str | None, max_decisions: int, invalid_penalty: float = 0.0
) -> tuple[A.ParsedAction | None, StepResult | None]:
    """Count the decision and parse ``action`` for ``role``: ``(action, None)`` to carry
    out, or ``(None, result)`` when the episode had ended or the action is not allowed
    (an invalid action moves nothing and earns ``-invalid_penalty``; it ends the episode
    only at the decision cap)."""
    if state.done:
        return None, StepResult(state.obs, 0.0, True, False, {"error": "episode already ended"})
    state.decisions += 1
    act, err = A.check_action(action, role)
    if act is None:
        state.invalid += 1
        state.done = state.decisions >= max_decisions
        return None, StepResult(state.obs, -invalid_penalty, state.done, False, {"error": err})
    return act, None


def finish_decision(
    state: Any,
    act: A.ParsedAction,
    before: float,
    dist: float,
    d0: float,
    collided: bool,
    cfg: EmbeddedConfig,
    render: Callable[[], str],
    metrics: Callable[[], dict],
    over: bool = False,
) -> StepResult:
    """Update the measures after the agent moved from ``before`` to ``dist`` metres from
    the goal; the step's reward is the shaped reward of docs/domains/vln_ce.md. ``over``:
    the simulator itself ended the episode."""
    state.collisions += int(collided)
    state.bump = collided
    state.dist = dist
    state.min_dist = min(state.min_dist, dist)
    success_now = is_success(state.stopped, dist, cfg.success_distance)
    reward = step_reward(before, dist, d0, success_now, cfg.success_bonus)
    state.done = state.stopped or state.decisions >= cfg.max_decisions or over
    state.obs = render()
    info = {"distance_to_goal": dist, "collided": collided, "primitive_steps": act.n_steps}
    if state.done:
        info.update(metrics())
    return StepResult(state.obs, reward, state.done, True, info)
