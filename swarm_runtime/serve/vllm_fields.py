"""vLLM's token-level extensions of ``/v1/completions`` on our worker, as vLLM 0.32 answers them, so the
OpenAI sampler (``rollout.engine=openai``, :mod:`swarm_runtime.sampling.openai`) can sample on a worker
(docs/reference/engine.md).

A request that carries any of ``return_tokens_as_token_ids``, ``logprob_token_ids``, ``allowed_token_ids``,
``logit_bias`` or ``stop_token_ids`` is sampled as vLLM samples it: only the masks the request asks for
(``allowed_token_ids``: every other token is -inf; ``logit_bias``: added to the logits, clamped to
[-100, 100]; no ban of the worker's own), and log-probs in vLLM's default ``raw_logprobs`` mode:
``log_softmax`` of the raw logits, before temperature, bias and masks (``vllm/v1/sample/sampler.py``), the
learner's basis at ``T`` = 1. ``top_logprobs`` per token holds the sampled token and ``logprob_token_ids``
(when given) or the top ``logprobs`` tokens; with ``return_tokens_as_token_ids`` every token is named
``token_id:N``. Generation stops after a token of ``stop_token_ids`` (kept, as vLLM keeps it) or EOS.
``return_token_ids`` (on any request) adds ``token_ids`` and ``prompt_token_ids`` to each choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swarm_runtime.serve.validate import BadRequest

#: vLLM clamps each ``logit_bias`` value to this range
BIAS_LIMIT = 100.0


@dataclass(frozen=True)
class TokenFields:
    """A request's token-level fields, checked (hashable: requests with the same fields batch together)."""

    allowed: tuple[int, ...] | None = None
    bias: tuple[tuple[int, float], ...] = ()
    logprob_ids: tuple[int, ...] | None = None
    stop_ids: tuple[int, ...] = ()
    as_ids: bool = False


def _ids(values, param: str, vocab: int) -> tuple[int, ...]:
    out = tuple(int(t) for t in values)
    bad = [t for t in out if not 0 <= t < vocab]
    if bad:
        raise BadRequest(f"{param}: token id {bad[0]} is not in [0, {vocab})", param=param)
    return out


def token_fields(req, vocab: int) -> TokenFields | None:
    """The request's :class:`TokenFields`, or None when it has none (the worker's own sampling)."""
    if not (
        req.return_tokens_as_token_ids
        or req.logprob_token_ids is not None
        or req.allowed_token_ids is not None
        or req.logit_bias
        or req.stop_token_ids
    ):
        return None
    if req.allowed_token_ids is not None and not req.allowed_token_ids:
        raise BadRequest("allowed_token_ids: an empty list allows no token", param="allowed_token_ids")
    bias = []
    for k, v in (req.logit_bias or {}).items():
        try:
            t = int(k)
        except ValueError:
            raise BadRequest(f"logit_bias: key {k!r} is not a token id", param="logit_bias") from None
        bias.append((_ids([t], "logit_bias", vocab)[0], max(-BIAS_LIMIT, min(BIAS_LIMIT, float(v)))))
    return TokenFields(
        allowed=None if req.allowed_token_ids is None else _ids(req.allowed_token_ids, "allowed_token_ids", vocab),
        bias=tuple(sorted(bias)),
        logprob_ids=None if req.logprob_token_ids is None else _ids(req.logprob_token_ids, "logprob_token_ids", vocab),
        stop_ids=_ids(req.stop_token_ids or [], "stop_token_ids", vocab),
        as_ids=bool(req.return_tokens_as_token_ids),
    )


class RawRecorder:
    """A ``pick`` for :meth:`TransformersPolicy._sample`: records each row's raw log-prob of its token (and the
    ``top_logprobs`` alternatives), then applies the request's bias and allowed-token mask and draws with
    ``inner`` (the policy's own draw, keyed or not)."""

    def __init__(self, fields: TokenFields, k: int | None, inner):
        self.f, self.k, self.inner = fields, k, inner
        self.chosen: list[torch.Tensor] = []
        self.top: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, logits: torch.Tensor, keys=None) -> torch.Tensor:
        raw = torch.log_softmax(logits.float(), dim=-1)
        proc = logits.float().clone()
        for t, v in self.f.bias:
            proc[:, t] += v
        if self.f.allowed is not None:
            mask = torch.full_like(proc, float("-inf"))
            mask[:, list(self.f.allowed)] = 0.0
            proc = proc + mask
        nxt = self.inner(proc, keys)
        self.chosen.append(raw.gather(-1, nxt.view(-1, 1)).squeeze(-1).cpu())
        if self.k is not None:
            if self.f.logprob_ids is not None:
                ids = torch.tensor(self.f.logprob_ids, device=raw.device).expand(raw.shape[0], -1)
                self.top.append((raw.gather(-1, ids).cpu(), ids.cpu()))
            elif self.k > 0:
                vals, ids = raw.topk(min(self.k, raw.shape[-1]), dim=-1)
                self.top.append((vals.cpu(), ids.cpu()))
        return nxt

    def row(self, i: int, out: list[int], text: str, decode) -> dict | None:
        """Row ``i``'s ``logprobs`` object (None when the request asked for none)."""
        if self.k is None:
            return None
        from swarm_runtime.serve.logprobs import _offsets

        name = (lambda t: f"token_id:{t}") if self.f.as_ids else (lambda t: decode([t]))
        token_logprobs = [float(self.chosen[s][i]) for s in range(len(out))]
        top = []
        for s, tok in enumerate(out):
            entry = {name(tok): token_logprobs[s]}
            if self.top:
                vals, ids = self.top[s]
                entry.update({name(a): v for v, a in zip(vals[i].tolist(), ids[i].tolist()) if a != tok})
            top.append(entry)
        return {
            "tokens": [name(t) for t in out],
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": _offsets(out, text, decode),
        }


def cut_at_stop(out: list[int], stop_ids: tuple[int, ...]) -> list[int]:
    """``out`` up to and including its first token of ``stop_ids``."""
    for s, t in enumerate(out):
        if t in stop_ids:
            return out[: s + 1]
    return out
