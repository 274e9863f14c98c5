"""One forward pass for the rows of several LoRA adapters on one base (``model.adapter=lora``; module docstring of
models/adapters.py): :class:`MixedBatch` sorts a turn's rows by adapter and samples them in one routed call,
:class:`GroupedLoRA` runs each LoRA layer's base once over all rows and each adapter on its own rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from swarm_runtime.core.protocols import Bid, Response
from swarm_runtime.models.noise import gumbel_max


def spans_of(names: Sequence[str]) -> list[tuple[str, int, int | None]] | None:
    """``[(adapter, start, end)]`` when each adapter's rows are one contiguous run, else None."""
    spans: list[tuple[str, int, int]] = []
    for i, n in enumerate(names):
        if spans and spans[-1][0] == n:
            spans[-1] = (n, spans[-1][1], i + 1)
        elif any(s[0] == n for s in spans):
            return None
        else:
            spans.append((n, i, i + 1))
    return spans


class GroupedLoRA:
    """Mixed-adapter LoRA forward over rows grouped by adapter (:class:`MixedBatch` sorts its rows so
    that each adapter's rows are contiguous). In every LoRA linear layer the base runs once over the
    whole batch, and each adapter present adds ``scale * B(A(x))`` to its own slice of rows in place:
    the same products PEFT computes for one active adapter, on that adapter's rows only, with no
    per-row weight stacks, no gathers and no scatters. Built once per routed call (the spans and
    layers are reused by every decode step); eval mode only (no dropout); a context manager that
    patches the LoRA layers' ``forward`` and restores them on exit."""

    def __init__(self, layers: list, spans: list[tuple[str, int, int | None]]):
        self.layers, self.spans = layers, spans

    @classmethod
    def build(cls, layers: Sequence, spans: list[tuple[str, int, int | None]] | None) -> GroupedLoRA | None:
        """``spans``: ``[(adapter, first row, end row)]`` (:func:`spans_of`; ``[(adapter, 0, None)]``:
        every row). None when the rows are not grouped by adapter (``spans`` None), some layer lacks
        an adapter, a layer has a LoRA variant (DoRA...), or an adapter is merged: PEFT's path then."""
        from peft.tuners.lora import Linear as LoraLinear

        if spans is None:
            return None
        routed = []
        for m in layers:
            if not isinstance(m, LoraLinear):
                return None
            if getattr(m, "merged", False) or any(n not in m.lora_A or n in m.lora_variant for n, _, _ in spans):
                return None
            routed.append((m, [(s, e, m.lora_A[n], m.lora_B[n], float(m.scaling[n])) for n, s, e in spans]))
        return cls(routed, spans) if routed else None

    def __enter__(self):
        for m, parts in self.layers:
            # the LoRA Linear modules are kept and their weights read at each call: FSDP2 (a sharded learner,
            # learn/sharded.py) swaps a module's sharded weights for the gathered ones only around its forward
            def forward(x, *args, _m=m, _parts=parts, **kwargs):
                out = _m.base_layer(x, *args, **kwargs)
                if torch.is_grad_enabled():  # scored for a gradient: out of place, so autograd sees it
                    parts = []
                    for s, e, lin_a, lin_b, scale in _parts:
                        A, B = lin_a.weight, lin_b.weight
                        r = out[s:e] + F.linear(F.linear(x[s:e].to(A.dtype), A), B) * scale
                        parts.append(r.to(out.dtype))
                    return parts[0] if len(parts) == 1 else torch.cat(parts)
                for s, e, lin_a, lin_b, scale in _parts:
                    A, B = lin_a.weight, lin_b.weight
                    xs = x[s:e] if x.dtype == A.dtype else x[s:e].to(A.dtype)
                    d = F.linear(F.linear(xs, A), B) * scale
                    if d.dtype == out.dtype:
                        out[s:e] += d
                    else:  # fp32 adapters on a bf16 base: add in fp32, round once (as PEFT does)
                        out[s:e] = out[s:e] + d
                return out

            m.forward = forward
        return self

    def __exit__(self, *exc):
        for m, _ in self.layers:
            del m.forward
        return False


class MixedBatch:
    """Rows of several adapter policies on one base (:class:`~swarm_runtime.models.adapters.AdapterPolicy`, one
    per row), run as one batch: the ``bid``/``act`` of the
    episode loop for a group of rows that span several roles. The rows are run grouped by adapter
    (a stable sort: each adapter's rows keep their order) through :class:`GroupedLoRA`, and the
    results are put back in the callers' order."""

    def __init__(self, rows: list):
        self.rows, self.lead = rows, rows[0]
        self.names = [p.adapter for p in rows]
        first: dict[str, int] = {}
        for n in self.names:
            first.setdefault(n, len(first))
        self._first = first
        #: the rows' order grouped by adapter (identity when they already are)
        self.order = sorted(range(len(rows)), key=lambda i: first[self.names[i]])

    def _ready(self):
        lead = self.lead
        if lead.model.training:
            lead.eval()
        return lead

    def _pick_rows(self, rows: list):
        """A sampler for :meth:`~swarm_runtime.models.transformers_backend.TransformersPolicy._sample`: each row
        drawn from its own policy's generator."""
        lead = self.lead

        def pick(logits, keys=None):
            if lead.temperature <= 0 or keys is not None:
                return lead._pick(logits, keys)
            probs = F.softmax(logits.float() / lead.temperature, dim=-1)
            return self._draw(probs, rows)

        return pick

    @staticmethod
    def _draw(probs: torch.Tensor, rows: list) -> torch.Tensor:
        out = torch.empty(len(rows), dtype=torch.long)
        groups: dict[int, tuple] = {}
        for i, p in enumerate(rows):
            groups.setdefault(id(p), (p, []))[1].append(i)
        for p, idx in groups.values():
            out[idx] = torch.multinomial(probs[idx].cpu(), 1, generator=p.gen).squeeze(1)
        return out.to(probs.device)

    def _per_policy(self, method: str, prompts, keys):
        """Fallback: one call per policy (constrained actions: each role has its own choice trie)."""
        out: list = [None] * len(prompts)
        groups: dict[int, tuple] = {}
        for i, p in enumerate(self.rows):
            groups.setdefault(id(p), (p, []))[1].append(i)
        for p, idx in groups.values():
            res = getattr(p, method)(
                [prompts[i] for i in idx], **({} if keys is None else {"keys": [keys[i] for i in idx]})
            )
            for i, r in zip(idx, res):
                out[i] = r
        return out

    def _generate(self, prompts: list[str], keys, max_new: int, ban) -> tuple[list[list[int]], list[list[float]]]:
        """Sampled responses of every row in one routed call (rows grouped by adapter, results in
        the callers' order), with their per-token log-probs."""
        lead, order = self._ready(), self.order
        rows = [self.rows[i] for i in order]
        lps: list = []
        with lead.routed([p.adapter for p in rows]):
            outs = lead._sample(
                [lead.encode_prompt(prompts[i]) for i in order],
                max_new,
                ban,
                None if keys is None else [keys[i] for i in order],
                None,
                pick=self._pick_rows(rows),
                logprobs_out=lps,
            )
        back: list[list[int]] = [[] for _ in prompts]
        back_lp: list[list[float]] = [[] for _ in prompts]
        for j, i in enumerate(order):
            back[i], back_lp[i] = outs[j], lps[j]
        return back, back_lp

    def act(self, prompts: list[str], keys: list[tuple[int, ...]] | None = None) -> list[Response]:
        if not prompts:
            return []
        if any(p.action_trie is not None for p in self.rows):
            return self._per_policy("act", prompts, keys)
        lead = self.lead
        outs, lps = self._generate(prompts, keys, lead.max_action_tokens, lead._action_ban)
        return [Response(lead.decode(o), o, lp) for o, lp in zip(outs, lps)]

    def bid(self, prompts: list[str], keys: list[tuple[int, ...]] | None = None) -> list[Bid]:
        if not prompts:
            return []
        lead = self._ready()
        if lead.bid_mode == "logits":
            # each distinct (adapter, prompt) scored once, grouped by adapter
            distinct = sorted(dict.fromkeys(zip(self.names, prompts)), key=lambda k: self._first[k[0]])
            row = {k: i for i, k in enumerate(distinct)}
            full: list = []
            with lead.routed([n for n, _ in distinct]):
                probs = lead.bid_distribution([p for _, p in distinct], logprobs_out=full)
            pick = [row[k] for k in zip(self.names, prompts)]
            probs, full_lp = probs[pick], full[0][pick]
            if lead.temperature <= 0:
                idx = probs.argmax(-1).tolist()
            elif keys is not None:
                idx = gumbel_max(probs.log(), [(*k, 0) for k in keys]).tolist()
            else:
                idx = self._draw(probs, self.rows).tolist()
            return lead.level_bids(idx, full_lp)
        return lead.parse_bids(*self._generate(prompts, keys, lead.max_bid_tokens, None))
