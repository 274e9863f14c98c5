"""``swarm experiment NAME``: the paper's experiments (docs/reference/method.md, section 6) as commands.

Experiments are registered through the ``swarm_register_experiments`` hook (the
built-in ones below by :mod:`swarm_runtime.plugins.builtins`, exactly as a plugin would):
``register(name, experiment)`` with ``experiment(x: ExperimentContext) -> Report``.
Each writes ``results.md``, ``results.json`` and PNG plots into its folder and
resumes cell by cell (docs/guides/experiments.md).
"""

from __future__ import annotations

from swarm_runtime.experiments.compare import arms, credit_ablation, heldout, transfer
from swarm_runtime.experiments.context import ExperimentContext, Report
from swarm_runtime.experiments.deployment import bid_action_ablation, coordination, dropout, participation, population

#: name -> experiment, in the order of the paper's table (docs/reference/method.md, section 6).
BUILTIN_EXPERIMENTS = {
    "heldout": heldout,
    "coordination": coordination,
    "bid_action_ablation": bid_action_ablation,
    "credit_ablation": credit_ablation,
    "population": population,
    "dropout": dropout,
    "transfer": transfer,
    "participation": participation,
    "arms": arms,
}

__all__ = ["BUILTIN_EXPERIMENTS", "ExperimentContext", "Report"]
