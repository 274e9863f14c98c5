"""The Policy protocol: one model per agent that both bids and acts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass
class Response:
    """A sampled response: its text, the token ids the policy scores it by, the sampler's per-token
    log-probabilities of those tokens (``log softmax(logits / T)`` over the vocabulary, before any
    constraint; ``None`` where the sampler gives none) and the weight version that sampled it."""

    text: str
    tokens: list[int]
    logprobs: list[float] | None = None
    version: int | None = None


@dataclass
class Bid(Response):
    """A sampled bid: the parsed level (0 when unparsable) and whether it parsed."""

    level: float = 0.0
    parsed: bool = True


@runtime_checkable
class Policy(Protocol):
    """What the episode loop and the trainers need from an agent's model."""

    n_params: int
    bid_levels: Sequence[float]

    def bid(self, prompts: list[str]) -> list[Bid]:
        """Sample one sealed bid per prompt. With ``algo.common_random_numbers`` the episode loop
        also passes ``keys=`` (one tuple of ints per prompt): the row's noise must then depend on
        its key alone (:mod:`swarm_runtime.policy.noise`)."""

    def act(self, prompts: list[str]) -> list[Response]:
        """Sample one action response per prompt (``keys=`` as in :meth:`bid`)."""

    def logprobs(self, prompts: list[str], responses: list[list[int]]) -> torch.Tensor:
        """``log pi(response | prompt)`` summed over response tokens (differentiable). The RL
        losses call it with ``temperature=T`` when the policy samples at ``T`` != 1
        (:func:`sampled_logprobs`): score ``softmax(logits / T)`` then. A backend that supports
        ``model.constrained_actions`` has ``constrain_actions(texts)`` and an ``action_trie``, and
        takes ``actions=True`` to score action responses under that constraint."""

    def bid_target(self, level: float) -> list[int]:
        """Token ids of the response that states bid ``level`` (for SFT and counterfactuals)."""

    def action_target(self, text: str) -> list[int]:
        """Token ids of ``text`` as an action response (for SFT demos)."""

    def parameters(self): ...

    def save(self, path: str) -> None:
        """Write a Hugging Face–format checkpoint (``from_pretrained`` can load it)."""


def sampled_logprobs(
    policy: Policy,
    prompts: list[str],
    responses: list[list[int]],
    actions: bool = False,
    per_token_out: list | None = None,
) -> torch.Tensor:
    """``log pi_T(response | prompt)`` at the temperature ``T`` the policy samples at: the
    on-policy log-probabilities REINFORCE and Bradley-Terry need (``softmax(logits / T)``; at
    ``T`` = 1, the default, or greedy ``T`` = 0, plain ``logprobs``). ``actions=True``: the
    responses are action texts, scored under the policy's action constraint if it has one
    (``model.constrained_actions``). ``per_token_out``: a list that gets each response's per-token
    log-probs (the sampler-learner mismatch, :mod:`swarm_runtime.rollout.mismatch`). Backends are
    passed only the arguments that differ from their defaults (``temperature``, ``actions``,
    ``per_token_out``)."""
    t = float(getattr(policy, "temperature", 1.0) or 0.0)
    kw: dict = {} if t <= 0 or t == 1.0 else {"temperature": t}
    if actions and getattr(policy, "action_trie", None) is not None:
        kw["actions"] = True
    if per_token_out is not None:
        kw["per_token_out"] = per_token_out
    return policy.logprobs(prompts, responses, **kw)


@torch.no_grad()
def logprobs_in_chunks(
    policy: Policy, prompts: list[str], responses: list[list[int]], minibatch: int, actions: bool = False
) -> list[float]:
    """:func:`sampled_logprobs` without gradients, ``minibatch`` rows at a time, as floats: the
    reference and behaviour log-probs the DPO-form bid loss and the KL charge need."""
    out: list[float] = []
    for i in range(0, len(prompts), minibatch):
        out += sampled_logprobs(policy, prompts[i : i + minibatch], responses[i : i + minibatch], actions).tolist()
    return out
