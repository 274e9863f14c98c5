"""Policy backend on Hugging Face ``transformers`` causal LMs.

Default: a tiny Qwen2-style model built from a config, with the word-level
tokenizer made in process from the domain's vocabulary (no download). Or any
local Hugging Face checkpoint loaded by path (``model.path=/path/to/ckpt``).

Bids: ``logits`` mode reads the next-token distribution over the bid-level
tokens after the bid prompt (one forward pass); ``generate`` mode samples a
response and parses the bid it ends with (an unparsable bid counts as 0).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from loguru import logger
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()  # per-shard bars on every checkpoint drown the run's own progress bar

from swarm_runtime.core.protocols import Bid, Response
from swarm_runtime.models.allocator import fix_mmap_threshold
from swarm_runtime.models.bids import bid_token, parse_bid
from swarm_runtime.models.chat import prompt_ids
from swarm_runtime.models.constrain import ActionTrie
from swarm_runtime.models.flops import FlopCounter
from swarm_runtime.models.noise import gumbel_max
from swarm_runtime.models.scoring import LOGITS_BUDGET, Scored, chunk_positions, plain_head, scoring_head
from swarm_runtime.models.tokenizer import build_tokenizer

_DIGIT_GAP = re.compile(r"(?<=\d) (?=\d)")


#: What a prompt longer than ``max_prompt_tokens`` does (environment variable ``SWARM_PROMPT_OVERFLOW``):
#: ``error`` (the default) stops with :class:`PromptOverflowError`; ``warn`` cuts it from the left, counts it
#: (``TransformersPolicy.prompt_overflows``) and logs a warning at the 1st, 2nd, 4th, 8th ... one.
PROMPT_OVERFLOW_ENV = "SWARM_PROMPT_OVERFLOW"
PROMPT_OVERFLOW_MODES = ("error", "warn")
_ROLE_LINE = re.compile(r"^\s*you are (\S+)")


class PromptOverflowError(ValueError):
    """A prompt is longer than ``model.max_prompt_tokens`` (the message names the role and the lengths)."""


def prompt_overflow_mode(value: str | None = None) -> str:
    """``value``, or ``$SWARM_PROMPT_OVERFLOW``, or ``error``; anything else is a ``ValueError`` naming it."""
    mode = value if value is not None else (os.environ.get(PROMPT_OVERFLOW_ENV) or "error")
    if mode not in PROMPT_OVERFLOW_MODES:
        raise ValueError(
            f"{PROMPT_OVERFLOW_ENV}={mode!r} is not valid: must be one of {', '.join(PROMPT_OVERFLOW_MODES)} "
            "(error: a prompt longer than model.max_prompt_tokens stops the run; warn: it is cut from the "
            "left and counted)"
        )
    return mode


def build_tiny_model(vocab_size: int, cfg, seed: int):
    """A Qwen2-style causal LM of a few million parameters, randomly initialised."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=int(cfg.hidden_size),
        intermediate_size=int(cfg.intermediate_size),
        num_hidden_layers=int(cfg.num_layers),
        num_attention_heads=int(cfg.num_heads),
        num_key_value_heads=int(cfg.num_kv_heads),
        max_position_embeddings=int(cfg.max_positions),
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    model = Qwen2ForCausalLM(config)
    return model


def cast_weights(model, dtype: str):
    """``model`` with its parameters and saved buffers in ``dtype``; the buffers a checkpoint does not hold
    (non-persistent: the rotary embedding's ``inv_freq``) kept as built (fp32), as ``from_pretrained(dtype=...)``
    leaves them: a model built from the config and cast computes as the same model saved and loaded back (a resumed
    run as the run it resumes); ``model.to`` would round them to ``dtype`` too."""
    kept = [
        (m, name, m._buffers[name])
        for m in model.modules()
        for name in m._non_persistent_buffers_set
        if m._buffers.get(name) is not None
    ]
    model = model.to(getattr(torch, dtype))
    for m, name, buf in kept:
        m._buffers[name] = buf
    return model


class TransformersPolicy:
    """One agent's model: bids and acts by sampling; scores responses for training."""

    def __init__(
        self,
        model,
        tokenizer,
        bid_levels: Sequence[float],
        bid_mode: str = "logits",
        temperature: float = 1.0,
        max_action_tokens: int = 12,
        max_bid_tokens: int = 6,
        max_prompt_tokens: int = 256,
        seed: int = 0,
        flops: FlopCounter | None = None,
        device: str = "cpu",
        chat_template: str = "none",
        prompt_overflow: str | None = None,
    ):
        if bid_mode not in ("logits", "generate"):
            raise ValueError(f"bid_mode {bid_mode!r} is not one of: logits, generate")
        self.model, self.tok = model.to(device), tokenizer
        self.device = device
        self.bid_levels = list(bid_levels)
        self.bid_mode, self.temperature = bid_mode, float(temperature)
        self.max_action_tokens, self.max_bid_tokens = int(max_action_tokens), int(max_bid_tokens)
        self.max_prompt_tokens = int(max_prompt_tokens)
        if chat_template not in ("auto", "none"):
            raise ValueError(f"chat_template {chat_template!r} is not one of: auto, none")
        #: ``model.chat_template=auto`` and the tokenizer has a template: each prompt is one user turn in it
        self.chat_template = chat_template
        self.templated = chat_template == "auto" and bool(getattr(tokenizer, "chat_template", None))
        self.prompt_overflow = prompt_overflow_mode(prompt_overflow)  #: ``error`` or ``warn`` (PROMPT_OVERFLOW_ENV)
        self.prompt_overflows = 0  #: distinct prompts cut from the left (``warn`` mode)
        self.role: str | None = None  #: the role this model acts for, when known (named in overflow messages)
        self.flops = flops or FlopCounter()
        self.gen = torch.Generator().manual_seed(int(seed))
        self.n_params = sum(p.numel() for p in model.parameters())
        self.n_frozen = 0  #: parameters scored in the forward pass that receive no gradient (a shared adapter base)
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        #: logits (rows x tokens x vocabulary) :meth:`logprobs` holds at once at most (models/scoring.py)
        self.logits_budget = LOGITS_BUDGET
        self._plain_head = plain_head(model)  #: the head's output is the logits: chunked scoring applies
        self.bid_ids = [self.tok.convert_tokens_to_ids(bid_token(b)) for b in self.bid_levels]
        if any(i is None or i == self.tok.unk_token_id for i in self.bid_ids):
            raise ValueError("tokenizer lacks the bid-level tokens; build it with build_tokenizer()")
        self.eos, self.pad = self.tok.eos_token_id, self.tok.pad_token_id
        self.bos = self.tok.bos_token_id
        banned = {self.pad, self.bos, self.tok.unk_token_id} - {None, self.eos}
        self._action_ban = torch.tensor(sorted(banned | set(self.bid_ids)), dtype=torch.long, device=device)
        self._prompt_cache: dict[str, list[int]] = {}
        self.action_trie: ActionTrie | None = None
        # Our in-process word-level tokenizer has no decoder: join words with spaces, glue digits.
        model_type = type(getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)).__name__
        self._word_level = model_type == "WordLevel"
        # transformers >= 5.x names the KV cache ``cache``; older releases ``past_key_values``.
        import inspect

        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    # ------------------------------------------------------------------ encoding
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        """The prompt's token ids (beginning of sequence first; a list of token ids is taken as it is). A prompt longer than
        ``max_prompt_tokens`` is a :class:`PromptOverflowError`, or, with ``SWARM_PROMPT_OVERFLOW=warn``,
        cut from the left (losing its opening: the role line and the start of the state) and counted."""
        if isinstance(prompt, list):  # token ids already (a served chat call's prompt: learn/served.py)
            return [int(t) for t in prompt][-self.max_prompt_tokens :]
        ids = self._prompt_cache.get(prompt)
        if ids is None and self.templated:  # the template places its own special tokens
            ids = prompt_ids(self.tok, prompt)  # role card as the system message, the rest as the user turn
            if len(ids) > self.max_prompt_tokens:
                self._overflow(prompt, len(ids))
                ids = ids[-self.max_prompt_tokens :]
            self._prompt_cache[prompt] = ids
        if ids is None:
            ids = self.tok(prompt, add_special_tokens=False).input_ids
            keep = self.max_prompt_tokens - (1 if self.bos is not None else 0)
            if len(ids) > keep:
                self._overflow(prompt, len(ids) + (1 if self.bos is not None else 0))
                ids = ids[-keep:] if keep > 0 else []
            ids = ([self.bos] if self.bos is not None else []) + ids
            if len(self._prompt_cache) > 50_000:
                self._prompt_cache.clear()
            self._prompt_cache[prompt] = ids
        return ids

    def _overflow(self, prompt: str, n: int) -> None:
        """A prompt of ``n`` tokens (beginning of sequence included) does not fit ``max_prompt_tokens``."""
        m = _ROLE_LINE.match(prompt)
        role = self.role or (m.group(1) if m else None)
        what = (
            f"a prompt{f' of role {role}' if role else ''} is {n} tokens long (bos included), more than "
            f"model.max_prompt_tokens={self.max_prompt_tokens}"
        )
        head = " ".join(prompt.split()[:6])
        if self.prompt_overflow == "error":
            raise PromptOverflowError(
                f"{what}: raise it (and model.max_positions), shorten the domain's observation or log_window, or set "
                f"{PROMPT_OVERFLOW_ENV}=warn to cut it from the left; it begins {head!r}"
            )
        self.prompt_overflows += 1
        k = self.prompt_overflows
        if k & (k - 1) == 0:  # the 1st, 2nd, 4th, 8th ...
            logger.warning(
                "prompt overflow #{} ({}=warn): {}; cut from the left, losing {!r}...",
                k,
                PROMPT_OVERFLOW_ENV,
                what,
                head,
            )

    def decode(self, ids: list[int]) -> str:
        ids = [t for t in ids if t != self.eos]
        if not self._word_level:
            return self.tok.decode(ids, skip_special_tokens=False).strip()
        return _DIGIT_GAP.sub("", " ".join(self.tok.convert_ids_to_tokens(ids))).strip()

    def action_target(self, text: str) -> list[int]:
        return self.tok(" " + text.strip(), add_special_tokens=False).input_ids + [self.eos]

    def bid_target(self, level: float) -> list[int]:
        ids = [self.tok.convert_tokens_to_ids(bid_token(level))]
        return ids if self.bid_mode == "logits" else ids + [self.eos]

    def constrain_actions(self, texts: Sequence[str]) -> None:
        """Sample actions only among ``texts`` from now on (``model.constrained_actions``;
        :mod:`swarm_runtime.models.constrain`). Raises ``ValueError`` naming a text the
        tokenizer cannot spell or one longer than ``max_action_tokens``."""
        texts = list(dict.fromkeys(str(t) for t in texts))
        seqs = [self.action_target(t) for t in texts]
        # EOS ends every choice, even where it doubles as the pad token (a local tokenizer without one)
        invalid = {self.tok.unk_token_id, self.pad, self.bos, *self.bid_ids} - {None, self.eos}
        trie = ActionTrie(texts, seqs, self.model.get_input_embeddings().weight.shape[0], self.eos, sorted(invalid))
        if trie.longest > self.max_action_tokens:
            longest = max(zip(seqs, texts), key=lambda st: len(st[0]))[1]
            raise ValueError(
                f"action choice {longest!r} is {trie.longest} tokens long, more than "
                f"model.max_action_tokens={self.max_action_tokens}; raise model.max_action_tokens"
            )
        trie.allowed = trie.allowed.to(self.device)
        self.action_trie = trie

    def _left_pad(self, seqs: list[list[int]]):
        L = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), L), self.pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), L), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, L - len(s) :] = torch.tensor(s)
            mask[i, L - len(s) :] = 1
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        return ids.to(self.device), mask.to(self.device), pos.to(self.device)

    # ------------------------------------------------------------------ sampling
    def _pick(self, logits: torch.Tensor, keys: list[tuple[int, ...]] | None = None) -> torch.Tensor:
        """Sample one index per row: from ``self.gen``, or by Gumbel-max with each row's keyed
        noise (:mod:`swarm_runtime.core.noise`)."""
        if self.temperature <= 0:
            return logits.argmax(-1)
        if keys is not None:
            return gumbel_max(logits.float() / self.temperature, keys)
        probs = F.softmax(logits.float() / self.temperature, dim=-1)
        return torch.multinomial(probs.cpu(), 1, generator=self.gen).squeeze(1).to(logits.device)

    def _forward(self, **kw):
        """The model's forward pass (an adapter policy routes it to its adapters here)."""
        return self.model(**kw)

    @torch.no_grad()
    def _sample(
        self,
        prompt_ids: list[list[int]],
        max_new: int,
        ban: torch.Tensor | None,
        keys: list[tuple[int, ...]] | None = None,
        trie: ActionTrie | None = None,
        pick=None,
        logprobs_out: list | None = None,
    ) -> list[list[int]]:
        """Sampled token ids per row. ``logprobs_out`` (a list): filled with each row's per-token
        ``log softmax(logits / T)`` of the sampled tokens over the whole vocabulary, before any ban or
        constraint (``T`` = 1 when greedy): the basis the learner scores them on (:meth:`logprobs`)."""
        ids, mask, pos = self._left_pad(prompt_ids)
        B = len(prompt_ids)
        next_pos = mask.sum(1)
        out: list[list[int]] = [[] for _ in range(B)]
        finished = torch.zeros(B, dtype=torch.bool, device=self.device)
        past, cur, cur_pos = None, ids, pos
        n_tok = int(mask.sum())
        nodes = [0] * B  # trie node of each row (constrained decoding)
        lps: list[list[float]] = [[] for _ in range(B)]
        for step in range(max_new):
            res = self._forward(
                input_ids=cur,
                attention_mask=mask,
                position_ids=cur_pos,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kw: past},
            )
            past = getattr(res, self._cache_kw)
            logits = res.logits[:, -1, :]
            if logprobs_out is not None:
                t = self.temperature if self.temperature > 0 and self.temperature != 1.0 else 1.0
                step_lp = torch.log_softmax(logits.float() / t, dim=-1)
            if trie is not None:
                logits = logits.masked_fill(~trie.allowed[nodes], float("-inf"))
            elif ban is not None:
                logits[:, ban] = float("-inf")
            nxt = (pick or self._pick)(logits, None if keys is None else [(*k, step) for k in keys])
            chosen = (
                step_lp.gather(1, nxt[:, None].to(step_lp.device)).squeeze(1).tolist()
                if logprobs_out is not None
                else None
            )
            for i in torch.nonzero(~finished).flatten().tolist():
                out[i].append(int(nxt[i]))
                if chosen is not None:
                    lps[i].append(chosen[i])
                if trie is not None:
                    nodes[i] = trie.step(nodes[i], int(nxt[i]))
            finished |= nxt == self.eos
            if bool(finished.all()):
                break
            n_tok += int((~finished).sum())
            cur = torch.where(finished, torch.full_like(nxt, self.pad), nxt).unsqueeze(1)
            mask = torch.cat([mask, (~finished).long().unsqueeze(1)], dim=1)
            cur_pos = next_pos.unsqueeze(1)
            next_pos = next_pos + 1
        self.flops.forward(self.n_params, n_tok)
        if logprobs_out is not None:
            logprobs_out[:] = lps
        return out

    def act(self, prompts: list[str], keys: list[tuple[int, ...]] | None = None) -> list[Response]:
        """One sampled response per prompt. ``keys`` (one tuple of ints per prompt): draw each
        token from keyed noise, so a row's sample depends on its key, not on the batch."""
        if not prompts:
            return []
        lps: list = []
        outs = self._sample(
            [self.encode_prompt(p) for p in prompts],
            self.max_action_tokens,
            self._action_ban,
            keys,
            self.action_trie,
            logprobs_out=lps,
        )
        return [Response(self.decode(o), o, lp) for o, lp in zip(outs, lps)]

    @torch.no_grad()
    def bid_distribution(self, prompts: list[str], logprobs_out: list | None = None) -> torch.Tensor:
        """Probabilities over the bid levels (``logits`` mode), one row per prompt. ``logprobs_out`` (a
        list): gets a tensor of each bid token's ``log softmax(logits / T)`` over the whole vocabulary
        (the basis the learner scores a bid on)."""
        ids, mask, pos = self._left_pad([self.encode_prompt(p) for p in prompts])
        # use_cache=False: one pass needs no KV cache (transformers builds one by default: 2 x layers x rows x
        # tokens x KV width, ~80 MiB for 48 rows of a 100M model, alive until the pass returns)
        logits = self._forward(
            input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1, use_cache=False
        ).logits[:, -1, :]
        self.flops.forward(self.n_params, int(mask.sum()))
        t = self.temperature if self.temperature > 0 else 1.0
        if logprobs_out is not None:
            logprobs_out[:] = [torch.log_softmax(logits.float() / t, dim=-1)[:, self.bid_ids]]
        return F.softmax(logits[:, self.bid_ids].float() / t, dim=-1)

    def bid(self, prompts: list[str], keys: list[tuple[int, ...]] | None = None) -> list[Bid]:
        if not prompts:
            return []
        if self.bid_mode == "logits":
            return self.logit_bids(prompts, keys)[0]
        lps: list = []
        outs = self._sample([self.encode_prompt(p) for p in prompts], self.max_bid_tokens, None, keys, logprobs_out=lps)
        return self.parse_bids(outs, lps)

    def logit_bids(
        self, prompts: list[str], keys: list[tuple[int, ...]] | None = None
    ) -> tuple[list[Bid], torch.Tensor]:
        """``logits``-mode bids, and each row's probabilities over the bid levels they were drawn from (rows x
        levels). Replicas of a role in one env send the same bid prompt: each distinct prompt is scored once, then
        every row sampled independently (same draws, a 1/k of the forward pass and its memory)."""
        distinct = list(dict.fromkeys(prompts))
        row = {p: i for i, p in enumerate(distinct)}
        full: list = []
        probs = self.bid_distribution(distinct, logprobs_out=full)[[row[p] for p in prompts]]
        full_lp = full[0][[row[p] for p in prompts]]
        if self.temperature <= 0:
            idx = probs.argmax(-1).tolist()
        elif keys is not None:
            idx = gumbel_max(probs.log(), [(*k, 0) for k in keys]).tolist()
        else:
            idx = torch.multinomial(probs.cpu(), 1, generator=self.gen).squeeze(1).tolist()
        return self.level_bids(idx, full_lp), probs

    def level_bids(self, idx: list[int], full_lp: torch.Tensor) -> list[Bid]:
        """``logits``-mode bids: row ``i`` bid level ``idx[i]``, with its log-prob from ``full_lp`` (rows x levels)."""
        return [
            Bid(bid_token(self.bid_levels[j]), [self.bid_ids[j]], [float(full_lp[i, j])], level=self.bid_levels[j])
            for i, j in enumerate(idx)
        ]

    def parse_bids(self, outs: list[list[int]], lps: list | None = None) -> list[Bid]:
        """Generated bid responses (``generate`` mode) as bids: each parsed strictly (:func:`parse_bid`)."""
        bids = []
        for i, o in enumerate(outs):
            text = self.decode(o)
            level, ok = parse_bid(text, self.bid_levels)
            bids.append(Bid(text, o, None if lps is None else lps[i], level=level, parsed=ok))
        return bids

    # ------------------------------------------------------------------ scoring
    def logprobs(
        self,
        prompts: list[str],
        responses: list[list[int]],
        temperature: float = 1.0,
        actions: bool = False,
        per_token_out: list | None = None,
    ) -> torch.Tensor:
        """Summed ``log softmax(logits / temperature)`` of each response's tokens (differentiable).

        ``actions=True`` says the responses are action texts: with :meth:`constrain_actions` in
        force each token is then scored among the tokens the constraint allowed there, the
        distribution :meth:`act` sampled it from. ``per_token_out`` (a list): gets each response's
        per-token log-probs, detached, unconstrained (the basis a sampler reports them on).

        A batch whose logits (rows x tokens x vocabulary) fit ``logits_budget`` is scored whole; a larger one
        applies the output head only to the positions that predict response tokens, in chunks
        (:mod:`swarm_runtime.models.scoring`): the same values, memory bounded by the budget."""
        seqs = [self.encode_prompt(p) + list(r) for p, r in zip(prompts, responses)]
        L = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), L), self.pad, dtype=torch.long)
        resp = torch.zeros((len(seqs), L), dtype=torch.bool)
        for i, (s, r) in enumerate(zip(seqs, responses)):
            ids[i, : len(s)] = torch.tensor(s)
            resp[i, len(s) - len(r) : len(s)] = True
        mask = (torch.arange(L)[None, :] < torch.tensor([len(s) for s in seqs])[:, None]).long()
        ids, mask, resp = ids.to(self.device), mask.to(self.device), resp.to(self.device)
        constrained = actions and self.action_trie is not None
        if not self._plain_head or len(seqs) * L * self.vocab_size <= self.logits_budget:
            logp = self._whole_logprobs(ids, mask, seqs, responses, temperature, constrained, per_token_out)
        else:
            logp = self._chunked_logprobs(ids, mask, seqs, responses, temperature, constrained, per_token_out)
        tokens = int(mask.sum())
        if torch.is_grad_enabled():
            self.flops.train(self.n_params, tokens, frozen=self.n_frozen)
        else:
            self.flops.forward(self.n_params, tokens)
        return (logp * resp[:, 1:]).sum(1)

    @staticmethod
    def _per_token(logp: torch.Tensor, seqs: list[list[int]], responses: list[list[int]]) -> list[torch.Tensor]:
        """Each response's slice of ``logp`` (rows x positions; position ``j`` predicts token ``j + 1``), detached."""
        flat = logp.detach()
        return [flat[i, len(s) - len(r) - 1 : len(s) - 1] for i, (s, r) in enumerate(zip(seqs, responses))]

    def _whole_logprobs(self, ids, mask, seqs, responses, temperature, constrained, per_token_out) -> torch.Tensor:
        """Rows x positions log-probs of the next tokens, from the logits of every position of the batch."""
        logits = self._forward(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1, :].float()
        if temperature > 0 and temperature != 1.0:
            logits = logits / float(temperature)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        if per_token_out is not None:
            per_token_out[:] = self._per_token(logp, seqs, responses)
        if constrained:
            logp = self._constrained(logp, logits, ids, seqs, responses)
        return logp

    def _chunked_logprobs(self, ids, mask, seqs, responses, temperature, constrained, per_token_out) -> torch.Tensor:
        """As :meth:`_whole_logprobs` at the response positions (zero elsewhere), the head applied to those
        positions only, ``logits_budget`` logits at a time (:func:`~swarm_runtime.models.scoring.scoring_head`)."""
        rows: list[int] = []
        cols: list[int] = []
        nodes: list[int] = []
        for i, (s, r) in enumerate(zip(seqs, responses)):
            start = len(s) - len(r) - 1  # the hidden state at column j predicts token j + 1
            walk = self.action_trie.walk(r, decode=self.decode) if constrained else [0] * len(r)
            for k, node in enumerate(walk):
                if start + k >= 0:  # a first token with nothing before it is not scored
                    rows.append(i)
                    cols.append(start + k)
                    nodes.append(node)
        rows_t = torch.tensor(rows, dtype=torch.long, device=self.device)
        cols_t = torch.tensor(cols, dtype=torch.long, device=self.device)
        spec = Scored(
            rows_t,
            cols_t,
            ids[rows_t, cols_t + 1],
            float(temperature),
            chunk_positions(self.vocab_size, self.logits_budget),
            torch.tensor(nodes, dtype=torch.long, device=self.device) if constrained else None,
            self.action_trie.allowed if constrained else None,
        )
        with scoring_head(self.model.get_output_embeddings(), spec):
            out = self._forward(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]
        if per_token_out is not None:
            per_token_out[:] = self._per_token(out[..., 0], seqs, responses)
        return out[..., 1] if constrained else out[..., 0]

    def _constrained(
        self,
        logp: torch.Tensor,
        logits: torch.Tensor,
        ids: torch.Tensor,
        seqs: list[list[int]],
        responses: list[list[int]],
    ) -> torch.Tensor:
        """``logp`` with each response token rescored among the tokens the action trie allowed
        there (only the response positions are touched: a large vocabulary stays cheap)."""
        trie = self.action_trie
        rows, cols, nodes = [], [], []
        for i, (s, r) in enumerate(zip(seqs, responses)):
            start = len(s) - len(r) - 1  # logits[j] predicts token j + 1
            nodes += trie.walk(r, decode=self.decode)
            rows += [i] * len(r)
            cols += range(start, start + len(r))
        if not rows:
            return logp
        rows_t = torch.tensor(rows, device=logits.device)
        cols_t = torch.tensor(cols, device=logits.device)
        seg = logits[rows_t, cols_t].masked_fill(~trie.allowed[nodes], float("-inf"))
        scored = torch.log_softmax(seg, dim=-1).gather(-1, ids[rows_t, cols_t + 1, None]).squeeze(-1)
        return logp.index_put((rows_t, cols_t), scored)

    # ------------------------------------------------------------------ plumbing
    def parameters(self):
        return self.model.parameters()

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tok.save_pretrained(path)
        (path / "swarm_policy.json").write_text(
            json.dumps(
                {
                    "bid_levels": self.bid_levels,
                    "bid_mode": self.bid_mode,
                    "word_level_tokenizer": self._word_level,
                    "chat_template": self.chat_template,
                },
                indent=1,
            )
        )

    def rng_state(self) -> torch.Tensor:
        return self.gen.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.gen.set_state(state)


#: Files of a Hugging Face folder that may ask for the folder's own Python code (``auto_map``).
CODE_MAPS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def refuse_custom_code(path: str | Path) -> None:
    """Refuse a Hugging Face folder that asks to run its own Python code (an ``auto_map`` in its
    ``config.json`` or tokenizer config): swarm loads weights and configs only
    (``trust_remote_code=False`` everywhere), never code that came with a checkpoint."""
    from swarm_runtime.config.errors import ConfigError

    for name in CODE_MAPS:
        f = Path(path) / name
        if not f.is_file():
            continue
        try:
            data = json.loads(f.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{f} is not JSON ({type(exc).__name__}); the model folder is damaged") from exc
        if isinstance(data, dict) and data.get("auto_map"):
            raise ConfigError(
                f"{f} asks for custom code (auto_map: {', '.join(map(str, data['auto_map']))[:120]}); "
                f"swarm never runs code that comes with a model folder: refusing to load {str(path)!r} "
                "(use a checkpoint of a built-in transformers architecture)"
            )


#: How the bid-token rows added to a pretrained vocabulary are drawn; adapters record it (``swarm_base.json``'s
#: ``bid_rows``). 3: each row the vocabulary's per-dimension mean plus its own seeded draw of
#: :data:`BID_ROW_SCALE` x the per-dimension standard deviation (:func:`distinct_new_rows`). Before (unrecorded),
#: transformers' mean resizing drew them from a covariance it shrinks so far that the five rows were alike to 1e-5:
#: with tied embeddings and a frozen base every bid level got the same logit whatever an adapter learned, so
#: ``logits``-mode bids were uniform on every pretrained LoRA swarm. (2, for a few commits: a whole standard
#: deviation, which made a frozen SmolLM2 bid one level with probability 0.8-0.98 before any training.)
BID_ROWS = 3

#: The spread of the added rows around the vocabulary's mean, in per-dimension standard deviations. On SmolLM2-135M
#: (hidden states of norm ~57) 0.1 leaves the untrained bid nearly uniform over five levels (largest probability
#: 0.32-0.37) with rows 0.33 apart, which an adapter separates; 1.0 gave 0.8-0.98 on one level before training.
BID_ROW_SCALE = 0.1


def distinct_new_rows(model, old_rows: int, seed: int = 0, scale: float = BID_ROW_SCALE) -> None:
    """Draw the embedding rows from ``old_rows`` on (the added bid tokens), in the input embedding and in an untied
    output head, each from ``N(mean, (scale * std)^2)`` of the existing rows per dimension, with a generator of its
    own seeded with ``seed``: distinct rows near the vocabulary's centre, the same on every load. The statistics are
    taken in chunks, so a 150k-row vocabulary is never copied whole."""
    weights = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight.data_ptr() != weights[0].data_ptr():
        weights.append(head.weight)
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for w in weights:
            if w.shape[0] <= old_rows:
                continue
            total = torch.zeros(w.shape[1], dtype=torch.float64)
            squares = torch.zeros(w.shape[1], dtype=torch.float64)
            for i in range(0, old_rows, 8192):
                part = w[i : min(old_rows, i + 8192)].to(torch.float64)
                total += part.sum(0)
                squares += (part * part).sum(0)
            mean = total / old_rows
            std = (squares / old_rows - mean * mean).clamp_min(0).sqrt()
            noise = torch.randn(w.shape[0] - old_rows, w.shape[1], generator=gen, dtype=torch.float64)
            w[old_rows:] = (mean + float(scale) * std * noise).to(w.dtype)


def load_pretrained(
    path: str | Path,
    bid_levels: Sequence[float],
    dtype: str = "float32",
    attention: str | None = None,
    seeded_resize: bool = False,
):
    """Load a local Hugging Face checkpoint (model + tokenizer) by path, adding the
    bid-level tokens (and a pad token) when the tokenizer lacks them. ``attention``: the
    attention implementation (``hardware.attention``; None = transformers' default).
    ``seeded_resize``: draw the added embedding rows from a fixed seed, so a frozen base
    shared by adapters is the same base every time it is loaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"model.path {str(path)!r} does not exist (give a local Hugging Face checkpoint folder)"
        )
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model.path {str(path)!r} has no config.json: not a Hugging Face checkpoint")
    refuse_custom_code(path)
    meta = path / "swarm_policy.json"
    if meta.exists() and json.loads(meta.read_text()).get("word_level_tokenizer"):
        # Our in-process word-level tokenizer: AutoTokenizer (transformers 5) would pick the tokenizer
        # class from the model type (Qwen2Tokenizer, BPE) and silently re-tokenise everything.
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(path, trust_remote_code=False)
    else:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
        fix_mmap_threshold()  # a pretrained base: freed activation and logits buffers go back to the system
        if not getattr(tok, "chat_template", None):  # model.chat_template=auto means the raw prompt for it
            logger.info("{} has no chat template: model.chat_template=auto prompts it with the raw prompt", path)
    kw = {"attn_implementation": attention} if attention else {}
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), trust_remote_code=False, local_files_only=True, **kw
    )
    wanted = [bid_token(b) for b in bid_levels]
    missing = [t for t in wanted if t not in tok.get_vocab()]
    if missing:
        tok.add_tokens(missing, special_tokens=True)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    old_rows = model.get_input_embeddings().weight.shape[0]
    if len(tok) > old_rows:
        # the added rows are ours (distinct_new_rows), not transformers' mean resizing: its draws are alike to 1e-5
        if seeded_resize:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model.resize_token_embeddings(len(tok), mean_resizing=False)
        else:
            model.resize_token_embeddings(len(tok), mean_resizing=False)
        distinct_new_rows(model, old_rows)
        logger.info("resized embeddings of {} to {} tokens for the bid levels", path, len(tok))
    tok.padding_side = "left"
    return model, tok


def make_transformers_policy(
    model_cfg,
    words: list[str],
    bid_levels: Sequence[float],
    seed: int,
    flops: FlopCounter | None = None,
    init_path: str | None = None,
) -> TransformersPolicy:
    """Factory registered as the ``transformers`` backend."""
    path = init_path or model_cfg.get("path")
    if path:
        # a model built from the config (no model.path) trains in fp32 whatever the dtype says: its checkpoints load
        # so (a resumed run computes as the run it resumes); a model.path checkpoint's in the dtype it was run in
        dtype = str(model_cfg.get("dtype", "float32")) if model_cfg.get("path") else "float32"
        model, tok = load_pretrained(path, bid_levels, dtype, attention=model_cfg.get("attention"))
    else:
        tok = build_tokenizer(words, bid_levels)
        model = build_tiny_model(len(tok), model_cfg, seed)
    return TransformersPolicy(
        model,
        tok,
        bid_levels,
        bid_mode=str(model_cfg.bid_mode),
        temperature=float(model_cfg.temperature),
        max_action_tokens=int(model_cfg.max_action_tokens),
        max_bid_tokens=int(model_cfg.max_bid_tokens),
        max_prompt_tokens=int(model_cfg.max_prompt_tokens),
        seed=seed,
        flops=flops,
        device=str(model_cfg.get("device", "cpu")),
        chat_template=str(model_cfg.get("chat_template") or "none"),
    )
