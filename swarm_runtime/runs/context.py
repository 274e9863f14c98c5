"""A run's context (:class:`RunContext`): its config, the plugins' registry, its folder and the FLOP counter the
trainer, the samplers and the evaluation share, and how the swarm of agents is built from the config
(:meth:`RunContext.build_swarm`: one model per role, or one base with an adapter per role). Also the checks made
before anything loads that need more than the config: the task's env built once (:func:`check_task`) and the
machine (:func:`check_hardware`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from loguru import logger
from omegaconf import DictConfig, OmegaConf

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.core.env import close_env
from swarm_runtime.core.episode import Agent
from swarm_runtime.models.flops import FlopCounter


@dataclass
class RunContext:
    """What every part of a run reads: the resolved config, the plugin manager and registry, the run folder (and
    the checkpoint a resume continues from), the run's FLOP counter and the folder's lock."""

    cfg: DictConfig
    pm: object
    registry: object
    run_dir: Path
    resume_from: Path | None = None
    flops: FlopCounter = field(default_factory=FlopCounter)
    lock: object = None  #: the run folder's :class:`~swarm_runtime.runs.runlock.RunLock` (``prepare_run``)

    @property
    def domain(self):
        return self.registry.domains[self.cfg.domain]

    @property
    def task(self) -> DictConfig:
        return self.cfg.task

    def seeds(self, split: str) -> list[int]:
        """Episode seeds of ``split``; ``eval`` (held-out evaluation) reads ``eval.split`` (``eval`` for
        reported numbers, ``dev`` for tuning) and keeps its first ``eval.episodes``."""
        if split == "eval":
            seeds = self.domain.episode_seeds(self.task, str(self.cfg.eval.get("split", "eval")))
        else:
            seeds = self.domain.episode_seeds(self.task, split)
        if split == "eval" and self.cfg.eval.episodes:
            seeds = seeds[: int(self.cfg.eval.episodes)]
        return seeds

    def coordinator(self, name: str | None = None):
        return self.registry.get("coordinators", name or self.cfg.algo.coordinator)(self.cfg)

    def credit_fn(self, name: str | None = None):
        return self.registry.get("credit_schemes", name or self.cfg.algo.credit)

    def make_policy(self, seed: int, init_path: str | Path | None = None, role: str | None = None):
        """A full model (``role``: built from its base's settings, ``model.role_base``; None: ``model.*``)."""
        from swarm_runtime.models.bases import role_cfg

        factory = self.registry.get("policy_backends", self.cfg.model.backend)
        model = self.cfg.model if role is None else role_cfg(self.cfg.model, role)
        model_cfg = OmegaConf.merge(model, {"device": self.cfg.hardware.device})
        hw = self.cfg.hardware
        if hw.get("dtype") or hw.get("attention"):  # a GPU profile: its dtype and attention for loaded checkpoints
            model_cfg = OmegaConf.merge(
                OmegaConf.to_container(model_cfg),
                {"dtype": hw.get("dtype") or model_cfg.dtype, "attention": hw.get("attention")},
            )
        words = self.domain.all_words(self.task)
        return factory(
            model_cfg,
            words,
            [float(b) for b in self.cfg.algo.bid_levels],
            seed,
            flops=self.flops,
            init_path=str(init_path) if init_path else None,
        )

    def constrain_actions(self, policies: dict, roles: dict) -> None:
        """With ``model.constrained_actions``: restrict each policy's actions to the texts the domain
        lists for its role (``roles``: policy name -> role name, or ``None`` for the monolithic model)."""
        if not self.cfg.model.constrained_actions:
            return
        listed = {name: self.domain.action_choices(self.task, role) for name, role in roles.items()}
        if not any(listed.values()):
            raise ConfigError(
                f"model.constrained_actions=true, but domain {self.cfg.domain!r} lists no action "
                f"choices for {', '.join(str(r) for r in roles.values())} (Domain.action_choices); "
                "set model.constrained_actions=false"
            )
        for name, choices in listed.items():
            if not choices:
                logger.info("model.constrained_actions: {} has no listed action choices; it samples freely", name)
                continue
            if not hasattr(policies[name], "constrain_actions"):
                raise ConfigError(
                    f"model.backend {self.cfg.model.backend!r} cannot constrain actions; "
                    "set model.constrained_actions=false"
                )
            try:
                policies[name].constrain_actions(choices)
            except ValueError as e:
                raise ConfigError(f"model.constrained_actions ({name}): {e}") from e

    def build_swarm(self, init_dir: Path | None = None, replicas: int = 1) -> tuple[list[Agent], dict]:
        """One model per role (``replicas`` agents share it); weights from ``init_dir/<role>`` if given."""
        policies, agents = {}, []
        hw = self.cfg.hardware
        if str(hw.device).startswith("cuda") and hw.get("tf32") and torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        seeds = [int(self.cfg.seed) * 100 + i for i in range(len(self.domain.roles))]
        lora = self.cfg.model.get("adapter", "none") == "lora"
        if lora or self.cfg.hardware.get("memory_gb") is not None:  # the memory plan, before anything loads
            from swarm_runtime.models.memory_plan import check_plan

            check_plan(
                self.cfg,
                len(self.domain.roles) * replicas,
                vocab=len(self.domain.all_words(self.task)) + 16,
                n_roles=len(self.domain.roles),
            )
        if lora:  # one base, one PEFT adapter per role (docs/reference/method.md, section 8)
            from swarm_runtime.models.adapters import build_adapter_swarm

            words = self.domain.all_words(self.task)
            model_cfg = OmegaConf.merge(self.cfg.model, {"device": self.cfg.hardware.device})
            policies = build_adapter_swarm(
                model_cfg,
                self.cfg.hardware,
                words,
                [float(b) for b in self.cfg.algo.bid_levels],
                [r.name for r in self.domain.roles],
                seeds,
                self.flops,
                init_dir,
            )
        for i, role in enumerate(self.domain.roles):
            path = init_dir / role.name if init_dir is not None else None
            if role.name not in policies:
                policies[role.name] = self.make_policy(seeds[i], path, role=role.name)
            for k in range(replicas):
                name = role.name if replicas == 1 else f"{role.name}#{k + 1}"
                agents.append(Agent(name, role.name, policies[role.name]))
        self.constrain_actions(policies, {r.name: r.name for r in self.domain.roles})
        return agents, policies


def check_task(domain, cfg: DictConfig) -> None:
    """Build one env from the task config before anything is written, so a bad task value
    (``ValueError``) or a missing optional backend (``ImportError``: ``sim=habitat``,
    ``judge=llm``, ...) ends the command with the domain's own message, not a traceback."""
    try:
        close_env(domain.make_env(cfg.task))  # only the check: a simulator it started ends here
    except ConfigError:
        raise
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"{cfg.domain} task {cfg.task_name}: {exc}") from exc


def check_hardware(cfg: DictConfig) -> None:
    """Refuse a CUDA device on a machine where torch sees no GPU (a run trained on a GPU and
    evaluated or resumed elsewhere, say), naming the way out; set the CPU threads. (What the config can train
    with is validation's: :func:`swarm_runtime.config.checks_cluster.check_engine_wired`.)"""
    if cfg.hardware.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"hardware {cfg.hardware.name!r} needs a CUDA GPU (device {cfg.hardware.device!r}), "
            "but torch sees none; use hardware=cpu"
        )
    if int(cfg.hardware.threads) > 0:
        torch.set_num_threads(int(cfg.hardware.threads))
