"""The named choices of settings that packages above the core implement, kept in the core so that its
validation (:mod:`swarm_runtime.config.validation`) checks them without importing those packages (torch, the
engine clients): the bid losses' schemes (:mod:`swarm_runtime.learn.losses`) and the LoRA ranks a vLLM
server takes (:mod:`swarm_runtime.sampling.sync`)."""

from __future__ import annotations

from swarm_runtime.config.errors import ConfigError

#: Schemes of :func:`swarm_runtime.learn.losses.pair_weights` (``algo.bid_pair_weight``).
PAIR_WEIGHTS = ("uniform", "margin")

#: What the Bradley-Terry log-odds are measured against (``algo.bid_reference``): ``none`` (the
#: paper) or ``sft`` (the policies at the start of RL, ``checkpoints/sft``; DPO form).
BID_REFERENCES = ("none", "sft")

#: LoRA ranks vLLM allows (``--max-lora-rank`` choices: ``vllm/config/lora.py``).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def check_rank(rank: int, where: str = "model.lora.rank") -> None:
    if int(rank) not in VLLM_RANKS:
        raise ConfigError(f"{where}={rank} is not a LoRA rank vLLM allows; valid: {', '.join(map(str, VLLM_RANKS))}")
