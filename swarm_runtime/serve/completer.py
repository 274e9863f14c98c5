"""A worker's completions (:class:`Completer`): each request checked and planned as a :class:`Job` (its prompts,
keys, kind and the group it may be batched with), and a group of jobs run as one batch on the policy (bids in
one forward pass over the bid levels, or generated text; vLLM's token-level fields; ``logprobs``; ``stop``,
``echo``), answered in OpenAI's completion shape. :mod:`swarm_runtime.serve.worker` serves it."""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass

from swarm_runtime.models.bids import bid_token, parse_bid
from swarm_runtime.serve.logprobs import StepRecorder, learner_row
from swarm_runtime.serve.vllm_fields import RawRecorder, cut_at_stop, token_fields

#: ``Job.adapter`` of a request an adapter host answers with its base (``model`` names the base)
BASE = ""


@dataclass
class Job:
    """One request, checked, waiting for its batch."""

    req: object
    prompts: list
    keys: list | None
    is_bid: bool
    trie: object
    group: tuple
    n_prompts: int = 1  #: prompts of the request (``prompts`` holds ``n`` rows per prompt, prompt-major)
    adapter: str | None = None  #: the LoRA adapter its rows run through (an adapter host; :data:`BASE`: none)
    fields: object = None  #: vLLM's token-level fields (:class:`~swarm_runtime.serve.vllm_fields.TokenFields`)
    future: object = None


class FaultInjected(RuntimeError):
    """An injected failure (``--fault-act-error-after``)."""


def choice_field(structured) -> list[str] | None:
    """``structured_outputs.choice`` (vLLM >= 0.10.2's name of ``guided_choice``), validated."""
    if structured is None:
        return None
    if (
        not isinstance(structured, dict)
        or not isinstance(structured.get("choice"), list)
        or not all(isinstance(c, str) for c in structured["choice"])
        or not structured["choice"]
    ):
        raise ValueError('structured_outputs must be {"choice": [texts]} here (the only structured output served)')
    return structured["choice"]


class Completer:
    """Turns completion requests into the policy's ``bid`` / ``act`` calls (one at a time)."""

    def __init__(self, policy, model_id: str, opts):
        """``opts``: the worker's :class:`~swarm_runtime.serve.worker.WorkerOptions` (its faults)."""
        from swarm_runtime.serve.adapters import AdapterHost

        self.host = policy if isinstance(policy, AdapterHost) else None
        self._policy, self.model_id, self.opts = policy, model_id, opts
        levels = self.host.kw["bid_levels"] if self.host else policy.bid_levels
        self.bid_texts = [bid_token(b) for b in levels]
        self.lock = threading.Lock()
        self._tries: dict[tuple, object] = {}
        self.actions_answered = 0
        self._base = None

    @property
    def policy(self):
        """The policy (with an adapter host: its first adapter's, which leads mixed batches; the base before
        any adapter is loaded)."""
        if self.host is None:
            return self._policy
        if not self.host.policies:
            return self.base_policy()
        return self.host.lead()

    def base_policy(self):
        """An adapter host's base as a policy of its own (requests whose ``model`` names the base, as vLLM serves
        it: the run's base check, :func:`swarm_runtime.sampling.sync.check_base`); run with the adapters off."""
        if self._base is None:
            from swarm_runtime.models.transformers_backend import TransformersPolicy

            self._base = TransformersPolicy(self.host.base_model, self.host.tok, **self.host.kw).eval()
        return self._base

    def adapter_of(self, req) -> str | None:
        """The adapter a request's ``model`` names (an adapter host only); 404 naming the loaded ones."""
        from swarm_runtime.serve.validate import BadRequest

        if self.host is None:
            if req.model not in (None, self.model_id):
                raise BadRequest(
                    f"model {req.model!r} is not served here; valid: {self.model_id}",
                    param="model",
                    status=404,
                    code="model_not_found",
                )
            return None
        if req.model == self.model_id:
            return BASE
        if req.model not in self.host.policies:
            raise BadRequest(
                f"model {req.model!r} is not a LoRA adapter loaded here; loaded: "
                f"{', '.join(self.host.policies) or 'none'} (or the base, {self.model_id})",
                param="model",
                status=404,
                code="model_not_found",
            )
        return req.model

    def answered_model(self, job: Job) -> str:
        """The ``model`` a completion answers with: the one the request asked for (an adapter host's adapter, or its
        base), as OpenAI and vLLM answer; this worker's model when the request named none."""
        return job.req.model or self.model_id

    def context(self) -> int:
        """The model's context: its position embeddings (prompts beyond ``max_prompt_tokens`` but within
        it are cut from the left, as training cuts them)."""
        cfg = getattr(self.policy.model, "config", None)
        return int(getattr(cfg, "max_position_embeddings", 0) or 0) or 1 << 30

    def check_context(self, prompt: str, param: str) -> None:
        """A prompt longer than the model's context is a 400 (as vLLM answers), never cut silently."""
        from swarm_runtime.models.transformers_backend import PromptOverflowError
        from swarm_runtime.serve.validate import BadRequest

        ctx = self.context()
        if len(prompt.encode()) + 1 >= ctx:  # else it cannot be too long: a token spans at least one byte
            n = len(self.policy.tok(prompt, add_special_tokens=False).input_ids) + (self.policy.bos is not None)
            if n > ctx:
                raise BadRequest(
                    f"{param} is {n} tokens, more than this model's context of {ctx} tokens",
                    param=param,
                    code="context_length_exceeded",
                )
        try:  # longer than model.max_prompt_tokens: refused as training refuses it (encodings are cached)
            self.policy.encode_prompt(prompt)
        except PromptOverflowError as exc:
            raise BadRequest(f"{param}: {exc}", param=param, code="prompt_too_long") from None

    def prompt_ids(self, x) -> list[int]:
        """A prompt's token ids: a text as training encodes it, token ids cut from the left like text."""
        if isinstance(x, str):
            return self.policy.encode_prompt(x)
        return list(x)[-self.policy.max_prompt_tokens :]

    def _trie(self, choices: list[str]):
        key = tuple(sorted(set(choices)))
        if key not in self._tries:
            saved = self.policy.action_trie
            self.policy.constrain_actions(list(key))  # ValueError names a text the tokenizer cannot spell
            self._tries[key], self.policy.action_trie = self.policy.action_trie, saved
        return self._tries[key]

    def plan(self, req) -> Job:
        """Check one request (faults included) and say how it may be batched with others."""
        from swarm_runtime.serve.protocol import sample_keys

        adapter = self.adapter_of(req)
        n, prompts = self._prompts(req)
        vocab = len(self.policy.tok)
        self._check_prompts(req, prompts, vocab)
        choices, fields, is_bid = self._kind(req, prompts, vocab)
        if not is_bid and self.opts.fault_act_error_after >= 0:
            if self.actions_answered >= self.opts.fault_act_error_after:
                raise FaultInjected("action failed (--fault-act-error-after)")
            self.actions_answered += 1
        trie = None if is_bid or not choices else self._trie(choices)
        keys = None if req.seed is None else sample_keys(req.seed, n) * len(prompts)
        group = (
            is_bid,
            id(trie),
            float(req.temperature),
            int(req.max_tokens),
            keys is None,
            -1 if req.logprobs is None else int(req.logprobs),
            float(req.top_p),
            fields,
            adapter == BASE,
            req.swarm_logprobs,
        )
        return Job(
            req,
            [x for x in prompts for _ in range(n)],
            keys,
            is_bid,
            trie,
            group,
            n_prompts=len(prompts),
            adapter=adapter,
            fields=fields,
        )

    @staticmethod
    def _prompts(req) -> tuple[int, list]:
        """``n`` and the request's prompts (texts, or lists of token ids), within the worker's limits."""
        from swarm_runtime.serve.protocol import MAX_N, MAX_PROMPTS, MAX_ROWS
        from swarm_runtime.serve.validate import BadRequest

        if int(req.n) > MAX_N:
            raise BadRequest(f"n={req.n} is more than this worker's limit of {MAX_N} samples per prompt", param="n")
        n = int(req.n)
        prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
        if prompts and isinstance(prompts[0], int):  # one prompt of token ids
            prompts = [list(prompts)]
        if not 1 <= len(prompts) <= MAX_PROMPTS:
            raise BadRequest(
                f"prompt is a list of {len(prompts)} prompts; give 1 to {MAX_PROMPTS}", param="prompt", status=422
            )
        if len(prompts) * n > MAX_ROWS:
            raise BadRequest(
                f"{len(prompts)} prompts x n={n} = {len(prompts) * n} rows is more than this worker's "
                f"limit of {MAX_ROWS} rows per request",
                param="n",
            )
        return n, prompts

    def _check_prompts(self, req, prompts: list, vocab: int) -> None:
        """Each prompt within the model's vocabulary, context and ``max_prompt_tokens``; ``stop`` and ``echo``."""
        from swarm_runtime.serve.validate import BadRequest

        for i, x in enumerate(prompts):
            where = (
                "prompt"
                if isinstance(req.prompt, str) or (req.prompt and isinstance(req.prompt[0], int))
                else f"prompt[{i}]"
            )
            if isinstance(x, list):
                self._check_ids(x, where, vocab)
            else:
                self.check_context(x, where)
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if any(not x for x in stops):
            raise BadRequest("stop: an empty string would stop before any text", param="stop")
        if req.echo and req.logprobs is not None:
            raise BadRequest("echo with logprobs is not served here (prompt log-probabilities); drop one", param="echo")

    def _check_ids(self, x: list, where: str, vocab: int) -> None:
        from swarm_runtime.serve.validate import BadRequest

        if not x or any(not 0 <= t < vocab for t in x):
            raise BadRequest(f"{where}: token ids must be a non-empty list of ids in [0, {vocab})", param=where)
        if len(x) > self.context():
            raise BadRequest(
                f"{where} is {len(x)} tokens, more than this model's context of {self.context()} tokens",
                param=where,
                code="context_length_exceeded",
            )
        if len(x) > self.policy.max_prompt_tokens and getattr(self.policy, "prompt_overflow", "") == "error":
            raise BadRequest(
                f"{where} is {len(x)} tokens, more than model.max_prompt_tokens={self.policy.max_prompt_tokens}",
                param=where,
                code="prompt_too_long",
            )

    def _kind(self, req, prompts: list, vocab: int) -> tuple[list[str] | None, object, bool]:
        """The request's choices (``guided_choice`` or ``structured_outputs.choice``), vLLM's token-level fields,
        and whether it is a bid (the bid-level texts as its choices, or ``swarm_kind: bid``)."""
        from swarm_runtime.serve.validate import BadRequest

        extra = req.model_extra or {}
        choices = req.guided_choice or choice_field(extra.get("structured_outputs"))
        fields = token_fields(req, vocab)
        if fields is not None and (choices is not None or extra.get("swarm_kind") is not None):
            raise BadRequest(
                "vLLM's token-level fields (allowed_token_ids, logprob_token_ids, logit_bias, "
                "stop_token_ids, return_tokens_as_token_ids) do not go with guided_choice or swarm_kind; "
                "drop one",
                param="allowed_token_ids" if req.allowed_token_ids is not None else None,
            )
        is_bid = extra.get("swarm_kind") == "bid" or (choices is not None and set(choices) == set(self.bid_texts))
        if is_bid and any(isinstance(x, list) for x in prompts):
            raise BadRequest("a bid takes text prompts (token-id prompts are for generated text)", param="prompt")
        return choices, fields, is_bid

    def run(self, jobs: list[Job]) -> tuple[list[dict], float]:
        """One batched forward (bids) or generation (actions) over ``jobs`` of one group: each job's
        response body, and the batch's model compute time in ms. A row's keyed draw depends on its key
        alone, so batching does not change what a request gets."""
        import torch

        j0 = jobs[0]
        base = self.host is not None and j0.adapter == BASE
        p = self.base_policy() if base else self.policy
        prompts = [x for j in jobs for x in j.prompts]
        keys = None if j0.keys is None else [k for j in jobs for k in j.keys]
        if self.opts.fault_delay_ms:
            time.sleep(self.opts.fault_delay_ms / 1000)
        t0 = time.perf_counter()
        if base:  # the base alone: every adapter off (none is loaded yet, or PEFT's disable_adapter)
            routed = nullcontext() if self.host.shared is None else self.host.shared.model.disable_adapter()
        else:
            routed = nullcontext() if self.host is None else p.routed([j.adapter for j in jobs for _ in j.prompts])
        with self.lock, torch.no_grad(), routed:
            p.temperature = float(j0.req.temperature)
            texts, outs, logprobs = self._sample(p, j0, prompts, keys)
        compute_ms = (time.perf_counter() - t0) * 1000
        return self._bodies(jobs, p, prompts, texts, outs, logprobs), compute_ms

    def _sample(self, p, j0: Job, prompts: list, keys) -> tuple[list[str], list, list]:
        """The batch's texts, token ids and log-probs (``None`` each without ``logprobs``), by kind of request."""
        want = j0.req.logprobs  # None, or k: the top-k alternatives per token
        if j0.fields is not None:  # vLLM's sampling and raw log-probs (serve/vllm_fields.py)
            inner = p._pick if float(j0.req.top_p) >= 1.0 else top_p_pick(p, float(j0.req.top_p), p._pick)
            rec = RawRecorder(j0.fields, want, inner)
            outs = p._sample([self.prompt_ids(x) for x in prompts], int(j0.req.max_tokens), None, keys, pick=rec)
            outs = [cut_at_stop(o, j0.fields.stop_ids) for o in outs]
            texts = [p.decode(o) for o in outs]
            return texts, outs, [rec.row(r, o, t, p.decode) for r, (o, t) in enumerate(zip(outs, texts))]
        if j0.is_bid and self.opts.fault_bid is not None:
            level, _ = parse_bid(str(self.opts.fault_bid), p.bid_levels)
            return (
                [self.bid_texts[p.bid_levels.index(level)]] * len(prompts),
                [[0]] * len(prompts),
                [None] * len(prompts),
            )
        learner = self.learner_basis(j0)
        if j0.is_bid and p.bid_mode == "logits":
            return self._logit_bids(p, prompts, keys, want, learner)
        return self._generate(p, j0, prompts, keys, want, learner)

    def learner_basis(self, job: Job) -> bool:
        """Whether ``job``'s log-probs are answered in the learner's basis: it asked for them with
        ``swarm_logprobs: "learner"``, and the policy samples it itself (not vLLM's token-level fields, scored as vLLM
        scores them, nor an injected bid, which has none). Its choices then say so (``"swarm_logprobs": "learner"``)."""
        req = job.req
        if req.swarm_logprobs != "learner" or req.logprobs is None or job.fields is not None:
            return False
        return not (job.is_bid and self.opts.fault_bid is not None)

    def _logit_bids(self, p, prompts: list, keys, want, learner: bool = False) -> tuple[list[str], list, list]:
        """Bids in one forward pass over the bid levels (with each level's log-prob, from the same pass, when
        ``logprobs`` is set; ``learner``: the drawn level's over the whole vocabulary)."""
        bids, probs = p.logit_bids(prompts, keys or None)
        texts, outs = [b.text for b in bids], [b.tokens for b in bids]
        logprobs = [None] * len(prompts)
        if learner:
            logprobs = [learner_row(b.tokens, b.text, b.logprobs, p.decode) for b in bids]
        elif want is not None:
            probs = probs.clamp_min(1e-45).log().tolist()
            logprobs = [
                {
                    "tokens": [t],
                    "token_logprobs": [row[self.bid_texts.index(t)]],
                    "top_logprobs": [dict(zip(self.bid_texts, row))],
                    "text_offset": [0],
                }
                for t, row in zip(texts, probs)
            ]
        return texts, outs, logprobs

    def _generate(self, p, j0: Job, prompts: list, keys, want, learner: bool = False) -> tuple[list[str], list, list]:
        """Generated text: a bid in generate mode, or an action (among its choices' token prefix tree, if any).
        ``learner``: the log-probs the policy records itself, before its masks (:func:`learner_row`)."""
        ids = [self.prompt_ids(x) for x in prompts]
        rec = StepRecorder(p, want) if want is not None and not learner else None
        lps: list | None = [] if learner else None
        pick = rec  # top_p masks first; the recorder then scores the masked distribution
        if float(j0.req.top_p) < 1.0:
            pick = top_p_pick(p, float(j0.req.top_p), rec or p._pick)
        if j0.is_bid:
            outs = p._sample(ids, int(j0.req.max_tokens), None, keys, pick=pick, logprobs_out=lps)
            texts = [b.text for b in p.parse_bids(outs)]
        else:
            trie = j0.trie
            longest = max(int(j0.req.max_tokens), trie.longest if trie is not None else 1)
            outs = p._sample(ids, longest, p._action_ban, keys, trie, pick=pick, logprobs_out=lps)
            texts = [p.decode(o) for o in outs]
        if lps is not None:
            return texts, outs, [learner_row(o, t, lp, p.decode) for o, t, lp in zip(outs, texts, lps)]
        if rec is None:
            return texts, outs, [None] * len(prompts)
        return texts, outs, [rec.row(r, o, t, p.decode) for r, (o, t) in enumerate(zip(outs, texts))]

    def _bodies(self, jobs: list[Job], p, prompts: list, texts: list, outs: list, logprobs: list) -> list[dict]:
        """Each job's completion body (OpenAI's shape) from the batch's rows."""
        bodies, i = [], 0
        for j in jobs:
            rows = range(i, i + len(j.prompts))
            i += len(j.prompts)
            choices = [finish_choice(j, n, texts[r], logprobs[r], outs[r], p) for n, r in enumerate(rows)]
            if self.learner_basis(j):  # say whose log-probs these are (an extra field: OpenAI clients ignore it)
                for c in choices:
                    c["swarm_logprobs"] = "learner"
            if j.req.return_token_ids:
                for c, r in zip(choices, rows):
                    c["token_ids"], c["prompt_token_ids"] = list(outs[r]), self.prompt_ids(prompts[r])
            n_prompt = sum(len(self.prompt_ids(x)) for x in j.prompts[:: len(j.prompts) // j.n_prompts])
            n_out = sum(len(outs[r]) for r in rows)
            bodies.append(
                {
                    "id": f"cmpl-{uuid.uuid4().hex}",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": self.answered_model(j),
                    "choices": choices,
                    "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
                }
            )
        return bodies


def top_p_pick(policy, top_p: float, inner):
    """A ``pick`` that keeps the smallest set of tokens whose probability (at the request's temperature)
    reaches ``top_p`` and masks the rest, then samples as ``inner`` does (keyed draws stay keyed)."""
    import torch

    def pick(logits, keys=None):
        t = policy.temperature if policy.temperature > 0 else 1.0
        probs = torch.softmax(logits.float() / t, dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # tokens after the nucleus is full
        mask = torch.zeros_like(drop).scatter(-1, order, drop)
        return inner(logits.masked_fill(mask, float("-inf")), keys)

    return pick


def finish_choice(job, index: int, text: str, logprobs, out: list[int], policy) -> dict:
    """One choice of a completion: ``stop`` strings cut the text (and its logprobs) before the first
    one found (``finish_reason`` "stop", ``stop_reason`` the string), ``echo`` puts the prompt first."""
    req = job.req
    stop_ids = job.fields.stop_ids if job.fields is not None else ()
    finish = "stop" if job.is_bid or (out and (out[-1] == policy.eos or out[-1] in stop_ids)) else "length"
    stop_reason = None
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    hits = [(text.find(x), x) for x in stops if x and text.find(x) >= 0]
    pieces = None
    if req.stream:  # the text each generated token added, for server-sent events
        if job.is_bid:
            pieces = [text]
        else:
            from swarm_runtime.serve.logprobs import _offsets

            offs = _offsets(out, text, policy.decode)
            pieces = [p for p in (text[a:b] for a, b in zip(offs, offs[1:] + [len(text)])) if p]
    if hits:
        cut, stop_reason = min(hits)
        text, finish = text[:cut], "stop"
        if pieces is not None:
            kept, n = [], 0
            for piece in pieces:
                if n >= cut:
                    break
                kept.append(piece[: cut - n])
                n += len(piece)
            pieces = kept
        if logprobs is not None:
            keep = [k for k, off in enumerate(logprobs["text_offset"]) if off < cut]
            logprobs = {
                "tokens": [logprobs["tokens"][k] for k in keep][: len(keep)],
                "token_logprobs": [logprobs["token_logprobs"][k] for k in keep],
                "top_logprobs": [logprobs["top_logprobs"][k] for k in keep],
                "text_offset": [logprobs["text_offset"][k] for k in keep],
            }
            if keep:  # the last kept piece ends at the cut
                logprobs["tokens"][-1] = logprobs["tokens"][-1][: cut - logprobs["text_offset"][-1]]
    if req.echo:
        prompt = job.prompts[index]
        prompt = prompt if isinstance(prompt, str) else policy.tok.decode(prompt)
        text = prompt + text
        pieces = None if pieces is None else [prompt, *pieces]
    choice = {"index": index, "text": text, "logprobs": logprobs, "stop_reason": stop_reason, "finish_reason": finish}
    if pieces is not None:
        choice["_pieces"] = pieces
    return choice
