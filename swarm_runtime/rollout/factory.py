"""The sampler a run's ``rollout.engine`` asks for (docs/engine.md)."""
from __future__ import annotations

from pathlib import Path

from swarm_runtime.config import ConfigError
from swarm_runtime.rollout.base import Sampler
from swarm_runtime.rollout.local import LocalLearner, LocalSampler


def make_sampler(cfg, learner: LocalLearner, run_dir: Path | None) -> Sampler:
    """``rollout.engine=local``: in process, over the learner's own modules; ``openai`` / ``vllm``: an
    inference server (started here for ``vllm``), each model's weights loaded as a named version."""
    engine = str(cfg.rollout.engine) if cfg.get("rollout") is not None else "local"
    if engine == "local":
        return LocalSampler(learner.policies, learner)
    raise ConfigError(f"rollout.engine={engine} is not available in this build; valid: local")
