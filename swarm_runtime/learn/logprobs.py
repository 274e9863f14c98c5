"""The learner's log-probabilities: at the policy's sampling temperature (on-policy), and without
gradients in chunks (reference and behaviour log-probs).
"""

from __future__ import annotations

import torch

from swarm_runtime.core.protocols import Policy


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
    log-probs (the sampler-learner mismatch, :mod:`swarm_runtime.sampling.mismatch`). Backends are
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
