"""Per-token log-probabilities of generated text, in the OpenAI/vLLM completions shape.

A worker asked for ``logprobs`` on generated text (an action, or a bid in ``generate`` mode)
records, at every decoding step, the log-probability of the distribution the token was drawn
from: ``log_softmax(logits / T)`` after the policy's masks (the ``guided_choice`` prefix tree, or
the ban on bid and special tokens), with ``T`` the request's temperature (1 when greedy). That is
the score the training losses give the same tokens (``policy.logprobs(..., temperature=T,
actions=True)``), and what vLLM returns with ``--logprobs-mode processed_logprobs`` (vLLM's default,
``raw_logprobs``, scores before temperature and masks). A request with our extension
``"swarm_logprobs": "learner"`` gets instead ``log_softmax(logits / T)`` over the whole vocabulary, before the
worker's masks (:func:`learner_row`): the basis the learner compares a sampler's log-probs with
(``per_token_out`` of ``policy.logprobs``, :mod:`swarm_runtime.sampling.mismatch`), and each choice says so with the
extra field ``"swarm_logprobs": "learner"`` (:meth:`~swarm_runtime.serve.completer.Completer.learner_basis`); vLLM
ignores the request's field and its choices carry none.

The answer per choice is ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``: ``tokens``
are the pieces of the returned text each token added (they concatenate to the text; the
end-of-sequence token adds ``""``), ``text_offset`` their character offsets in it, and
``top_logprobs[i]`` the ``k`` most likely tokens at step ``i`` (``logprobs=k``) plus the sampled one,
keyed by the piece each would have added. Tokens a mask forbids (log-probability ``-inf``) are
never listed.
"""

from __future__ import annotations

import torch


class StepRecorder:
    """A ``pick`` for :meth:`TransformersPolicy._sample` that samples exactly as the policy does
    and records, per step, each row's log-probability of its token and its top ``k`` tokens."""

    def __init__(self, policy, k: int):
        self.policy, self.k = policy, int(k)
        self.chosen: list[torch.Tensor] = []  # (B,) per step
        self.top: list[tuple[torch.Tensor, torch.Tensor]] = []  # (B, k) values and ids per step

    def __call__(self, logits: torch.Tensor, keys=None) -> torch.Tensor:
        nxt = self.policy._pick(logits, keys)
        t = self.policy.temperature if self.policy.temperature > 0 else 1.0
        lp = torch.log_softmax(logits.float() / t, dim=-1)
        self.chosen.append(lp.gather(-1, nxt.view(-1, 1)).squeeze(-1).cpu())
        k = min(self.k, lp.shape[-1])
        if k > 0:
            vals, ids = lp.topk(k, dim=-1)
            self.top.append((vals.cpu(), ids.cpu()))
        return nxt

    def row(self, i: int, out: list[int], text: str, decode) -> dict:
        """Row ``i``'s ``logprobs`` object for its generated ``out`` (token ids) and returned ``text``."""
        offsets = _offsets(out, text, decode)
        pieces = [text[a:b] for a, b in zip(offsets, offsets[1:] + [len(text)])]
        token_logprobs = [float(self.chosen[s][i]) for s in range(len(out))]
        top = []
        for s, tok in enumerate(out):
            entry: dict[str, float] = {}
            if self.top:
                prefix = decode(out[:s])
                vals, ids = self.top[s]
                for v, alt in zip(vals[i].tolist(), ids[i].tolist()):
                    if v == float("-inf") or alt == tok:
                        continue
                    entry.setdefault(_piece(decode, out[:s], prefix, alt), v)
            entry[pieces[s]] = token_logprobs[s]  # the sampled token is always listed, under its own piece
            top.append(dict(sorted(entry.items(), key=lambda kv: -kv[1])))
        return {"tokens": pieces, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def learner_row(out: list[int], text: str, lps: list[float], decode) -> dict:
    """The ``logprobs`` object of generated ``out`` (token ids; returned ``text``) whose per-token log-probs ``lps``
    are in the learner's basis (``swarm_logprobs: "learner"``: ``log_softmax(logits / T)`` over the whole
    vocabulary, before the worker's masks): each step lists its sampled token only."""
    offsets = _offsets(out, text, decode)
    pieces = [text[a:b] for a, b in zip(offsets, offsets[1:] + [len(text)])]
    lps = [float(v) for v in lps[: len(out)]]
    return {
        "tokens": pieces,
        "token_logprobs": lps,
        "top_logprobs": [{p: v} for p, v in zip(pieces, lps)],
        "text_offset": offsets,
    }


def _offsets(out: list[int], text: str, decode) -> list[int]:
    """Where each token's piece starts in ``text``: the length of the incremental decoding before it
    that ``text`` shares (non-decreasing, so the pieces always concatenate to ``text``)."""
    offsets, last = [], 0
    for s in range(len(out)):
        prefix = decode(out[:s])
        n = 0
        for a, b in zip(prefix, text):
            if a != b:
                break
            n += 1
        last = max(last, n)
        offsets.append(last)
    return offsets


def _piece(decode, before: list[int], prefix: str, token: int) -> str:
    """The text ``token`` would add after ``before`` (whose decoding is ``prefix``)."""
    full = decode(list(before) + [int(token)])
    return full[len(prefix) :] if full.startswith(prefix) else full
