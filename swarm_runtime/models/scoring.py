"""Log-probabilities of the scored tokens only: the output head applied to the positions that predict them, in
chunks, so no tensor holds the whole vocabulary's logits over every position of a batch.

``TransformersPolicy.logprobs`` (models/transformers_backend.py) scores response tokens (actions, bids) after
their prompts. A batch of ``B`` rows of ``L`` tokens over a vocabulary of ``V`` has ``B L V`` logits, and the
log-softmax and its gradient as many again: for SmolLM2 (``V`` = 49,152) a batch of 64 rows of 150 tokens is
1.9 GB per copy. The responses are a few tokens per row, so :func:`scoring_head` makes the model's output head,
for one forward pass, return the log-probabilities of the scored tokens instead of logits: it takes the hidden
states of the positions that predict them, applies the head to at most ``chunk`` positions at a time, takes each
chunk's log-softmax, and keeps only the scored tokens' values (under gradient, each chunk is recomputed in the
backward pass rather than kept: ``torch.utils.checkpoint``). The head runs inside the model's forward pass, so a
wrapper that gathers the head's weights around it (FSDP2, DeepSpeed ZeRO-3) and the adapter routing of the
forward pass (models/adapters.py, models/mixed_batch.py) see one ordinary call.

:func:`plain_head` says whether a model returns its head's output as the logits unchanged (a Gemma's soft cap,
a Cohere's or Granite's scale would be skipped otherwise); other models keep the full-logits computation.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from swarm_runtime.models.logits_budget import LOGITS_BUDGET, chunk_positions

__all__ = ["LOGITS_BUDGET", "Scored", "chunk_positions", "plain_head", "score_hidden", "scoring_head"]


#: Config attributes of transformers models that change the head's output before returning it as the logits.
POST_HEAD = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier", "logits_soft_cap")


def plain_head(model) -> bool:
    """Whether ``model``'s logits are its output head (a plain linear layer) applied to the last hidden states
    and nothing else: no config attribute of :data:`POST_HEAD` set, no vocabulary cut (``unpadded_vocab_size``)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear:
        return False
    config = getattr(model, "config", None)
    configs = [config, getattr(config, "text_config", None), getattr(config, "decoder", None)]
    return not any(getattr(c, k, None) is not None for c in configs for k in (*POST_HEAD, "unpadded_vocab_size"))


@dataclass
class Scored:
    """The tokens to score in a batch of ``B`` rows of ``L`` tokens: ``rows[n]``, ``cols[n]`` the position whose
    hidden state predicts token ``targets[n]`` (the token at column ``cols[n] + 1``), scored at ``temperature``,
    ``chunk`` positions at a time; with ``nodes`` and ``allowed_table``, also among the tokens a constraint
    allowed there (models/constrain.py: ``ActionTrie.allowed``)."""

    rows: torch.Tensor
    cols: torch.Tensor
    targets: torch.Tensor
    temperature: float = 1.0
    chunk: int = 1
    nodes: torch.Tensor | None = None  #: per scored token, its row of ``allowed_table`` (constrained rescoring)
    allowed_table: torch.Tensor | None = None  #: (nodes x vocabulary) bool: the tokens each node allows

    @property
    def columns(self) -> int:
        """Values per scored token: the log-prob, and its constrained rescoring when a constraint is given."""
        return 1 if self.nodes is None else 2


def chunk_logprobs(head_fn, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, allowed=None):
    """``(n, 1 or 2)``: each row's ``log softmax(head(hidden) / temperature)`` at its target, and with
    ``allowed`` (n x V bool) the same among the allowed tokens only; the logits in fp32 as the full computation
    makes them (``TransformersPolicy.logprobs``)."""
    logits = head_fn(hidden).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / float(temperature)
    out = [torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])]
    if allowed is not None:
        masked = logits.masked_fill(~allowed, float("-inf"))
        out.append(torch.log_softmax(masked, dim=-1).gather(-1, targets[:, None]))
    return torch.cat(out, dim=1)


def score_hidden(head_fn, hidden: torch.Tensor, spec: Scored) -> torch.Tensor:
    """``(B, L, spec.columns)`` fp32: zero everywhere but at the scored positions, which hold
    :func:`chunk_logprobs` of their targets, computed ``spec.chunk`` positions at a time."""
    B, L = hidden.shape[0], hidden.shape[1]
    n = int(spec.rows.numel())
    if n == 0:  # nothing to score: zeros that still depend on the hidden states (a loss can backpropagate)
        return hidden[..., :1].float().mul(0).expand(B, L, spec.columns)
    rows = hidden[spec.rows, spec.cols]
    parts = []
    for s in range(0, n, spec.chunk):
        e = min(n, s + spec.chunk)
        allowed = None if spec.nodes is None else spec.allowed_table[spec.nodes[s:e]]
        args = (head_fn, rows[s:e], spec.targets[s:e], spec.temperature, allowed)
        if torch.is_grad_enabled() and rows.requires_grad:
            parts.append(checkpoint(chunk_logprobs, *args, use_reentrant=False))
        else:
            parts.append(chunk_logprobs(*args))
    vals = parts[0] if len(parts) == 1 else torch.cat(parts)
    out = torch.zeros((B, L, spec.columns), dtype=torch.float32, device=hidden.device)
    return out.index_put((spec.rows, spec.cols), vals)


@contextmanager
def scoring_head(head: torch.nn.Module, spec: Scored):
    """Inside: a forward pass of the model (in this thread) gets :func:`score_hidden` of its last hidden states
    as its logits, ``(B, L, spec.columns)``, instead of the head's ``(B, L, V)`` (pass ``logits_to_keep=0``, the
    default: every position). Other threads' calls of the head run it as usual."""
    own = head.__dict__.get("forward")  # an instance-level forward already there (kept and restored)
    original = own if own is not None else head.forward
    owner = threading.get_ident()

    def forward(x, *args, **kwargs):
        if threading.get_ident() != owner or args or kwargs:
            return original(x, *args, **kwargs)
        return score_hidden(original, x, spec)

    head.forward = forward
    try:
        yield
    finally:
        if own is not None:
            head.forward = own
        else:
            del head.forward
