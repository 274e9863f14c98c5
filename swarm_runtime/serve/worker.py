"""An agent worker: one role's checkpoint behind the vLLM OpenAI-compatible completions subset.

    python -m swarm_runtime.serve.worker --model RUN/checkpoints/final/agents/Smith --port 8101

Endpoints: ``GET /health`` (with the batching counts), ``GET /v1/models``, ``POST /v1/completions``
(``prompt`` (texts or token ids), ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``n``, ``logprobs``,
``stop``, ``echo``, ``stream`` (server-sent events), ``guided_choice`` or its newer name
``structured_outputs.choice``), ``POST /v1/chat/completions`` (over the model's chat template; 400
without one); with ``--lora-modules`` / ``--enable-lora``, one base with several LoRA adapters and
vLLM's ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (:mod:`swarm_runtime.serve.adapters`), and
requests naming the base (the adapters off). vLLM's token-level fields (``return_token_ids``,
``return_tokens_as_token_ids``, ``logprob_token_ids``, ``allowed_token_ids``, ``logit_bias``,
``stop_token_ids``) are answered as vLLM answers them, raw log-probs included
(:mod:`swarm_runtime.serve.vllm_fields`), so ``rollout.engine=openai`` can sample on a worker.
Bodies are read with finite numbers only; errors are OpenAI's ``{"error": {...}}``; a prompt longer
than the model's context is a 400. ``logprobs=k`` on generated text returns each token's
log-probability and the top ``k`` in the OpenAI shape (:mod:`swarm_runtime.serve.logprobs`); ``n``
samples per prompt are keyed ``protocol.sample_keys(seed, n)`` (at most ``protocol.MAX_N``).
A request whose ``guided_choice`` is the
model's bid-level texts is a bid (``model.bid_mode=logits``: one forward pass, sampled over the bid
levels, with their log-probs when ``logprobs`` is set); ``"swarm_kind": "bid"`` asks for a generated
bid (``generate`` mode). Any other request is an action: sampled among ``guided_choice`` when given
(constrained decoding over their token prefix tree), else free text (never a bid token). With a
``seed`` the draw is the keyed draw of :mod:`swarm_runtime.serve.protocol`, identical to the one
``swarm eval`` makes in process. Requests that arrive while the model is busy are batched (one forward
pass or generation per kind of request), as the in-process loop batches a turn's rows; a keyed row's
draw does not depend on its batch.

Fault injection, for tests and the chaos benchmark only: ``--fault-act-error-after N`` answers every
action after the first N with HTTP 500 (0: every action); ``--fault-bid LEVEL`` bids LEVEL without the model; ``--fault-delay-ms MS`` stalls
every answer.
"""

import argparse
import json
import os
import threading
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from swarm_runtime.serve.logprobs import StepRecorder
from swarm_runtime.serve.vllm_fields import RawRecorder, cut_at_stop, token_fields

#: ``Job.adapter`` of a request an adapter host answers with its base (``model`` names the base)
BASE = ""

#: Bid levels of a checkpoint that does not say (an external Hugging Face model).
DEFAULT_BID_LEVELS = (0.0, 0.2, 0.4, 0.6, 0.8)


@dataclass
class WorkerOptions:
    """What ``python -m swarm_runtime.serve.worker`` takes."""

    model: str  #: a role's checkpoint folder (``RUN/checkpoints/TAG/agents/ROLE``)
    name: str = ""  #: the agent's name (``/v1/models`` lists the model as this id; default: the folder name)
    host: str = "127.0.0.1"
    port: int = 8100
    max_prompt_tokens: int = 256  #: prompts are cut from the left beyond this (the run's model.max_prompt_tokens)
    device: str = "cpu"
    threads: int = 1  #: torch CPU threads
    seed: int = 0  #: the sampling generator of requests without a ``seed``
    parent_pid: int = 0  #: exit when this process is gone (a worker the gateway started)
    lora_modules: list = (
        None  #: ``NAME=PATH`` adapters to load onto the base ``model`` (:mod:`~swarm_runtime.serve.adapters`)
    )
    enable_lora: bool = False  #: serve the base with adapters loaded at runtime (``/v1/load_lora_adapter``)
    fault_act_error_after: int = -1  #: -1 = never
    fault_bid: float | None = None
    fault_delay_ms: int = 0


def load_policy(opts: WorkerOptions):
    """The role's :class:`~swarm_runtime.models.transformers_backend.TransformersPolicy`, with the bid
    levels and bid mode its checkpoint was trained with; with ``lora_modules`` or ``enable_lora``, an
    :class:`~swarm_runtime.serve.adapters.AdapterHost` (the base and its adapters)."""
    import torch

    from swarm_runtime.models.transformers_backend import TransformersPolicy, load_pretrained

    path = Path(opts.model)
    if opts.lora_modules or opts.enable_lora:
        from swarm_runtime.serve.adapters import AdapterHost, parse_modules

        modules = parse_modules(opts.lora_modules)
        first = Path(modules[0][1]) / "swarm_policy.json" if modules else path / "swarm_policy.json"
        meta = json.loads(first.read_text()) if first.exists() else {}
        torch.manual_seed(opts.seed)
        host = AdapterHost(
            path,
            dict(
                bid_levels=[float(b) for b in meta.get("bid_levels", DEFAULT_BID_LEVELS)],
                bid_mode=meta.get("bid_mode", "logits"),
                max_prompt_tokens=opts.max_prompt_tokens,
                seed=opts.seed,
                device=opts.device,
                chat_template=meta.get("chat_template", "none"),
            ),
        )
        for name, folder in modules:
            host.load(name, folder)
        return host
    meta = json.loads((path / "swarm_policy.json").read_text()) if (path / "swarm_policy.json").exists() else {}
    levels = [float(b) for b in meta.get("bid_levels", DEFAULT_BID_LEVELS)]
    model, tok = load_pretrained(path, levels)
    torch.manual_seed(opts.seed)
    policy = TransformersPolicy(
        model,
        tok,
        levels,
        bid_mode=meta.get("bid_mode", "logits"),
        chat_template=meta.get("chat_template", "none"),  # as the run trained it
        max_prompt_tokens=opts.max_prompt_tokens,
        seed=opts.seed,
        device=opts.device,
    )
    return policy.eval()


class Completer:
    """Turns completion requests into the policy's ``bid`` / ``act`` calls (one at a time)."""

    def __init__(self, policy, model_id: str, opts: WorkerOptions):
        from swarm_runtime.models.tokenizer import bid_token
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

    def plan(self, req) -> "Job":
        """Check one request (faults included) and say how it may be batched with others."""
        from swarm_runtime.serve.protocol import MAX_N, MAX_PROMPTS, MAX_ROWS, sample_keys
        from swarm_runtime.serve.validate import BadRequest

        adapter = self.adapter_of(req)
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
        vocab = len(self.policy.tok)
        for i, x in enumerate(prompts):
            where = (
                "prompt"
                if isinstance(req.prompt, str) or (req.prompt and isinstance(req.prompt[0], int))
                else f"prompt[{i}]"
            )
            if isinstance(x, list):
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
                        f"{where} is {len(x)} tokens, more than model.max_prompt_tokens="
                        f"{self.policy.max_prompt_tokens}",
                        param=where,
                        code="prompt_too_long",
                    )
            else:
                self.check_context(x, where)
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if any(not x for x in stops):
            raise BadRequest("stop: an empty string would stop before any text", param="stop")
        if req.echo and req.logprobs is not None:
            raise BadRequest("echo with logprobs is not served here (prompt log-probabilities); drop one", param="echo")
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

    def run(self, jobs: list["Job"]) -> tuple[list[dict], float]:
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
            want = j0.req.logprobs  # None, or k: the top-k alternatives per token
            logprobs = [None] * len(prompts)
            if j0.fields is not None:  # vLLM's sampling and raw log-probs (serve/vllm_fields.py)
                inner = p._pick if float(j0.req.top_p) >= 1.0 else top_p_pick(p, float(j0.req.top_p), p._pick)
                rec = RawRecorder(j0.fields, want, inner)
                outs = p._sample([self.prompt_ids(x) for x in prompts], int(j0.req.max_tokens), None, keys, pick=rec)
                outs = [cut_at_stop(o, j0.fields.stop_ids) for o in outs]
                texts = [p.decode(o) for o in outs]
                logprobs = [rec.row(r, o, t, p.decode) for r, (o, t) in enumerate(zip(outs, texts))]
            elif j0.is_bid and self.opts.fault_bid is not None:
                from swarm_runtime.models.transformers_backend import parse_bid

                level, _ = parse_bid(str(self.opts.fault_bid), p.bid_levels)
                texts = [self.bid_texts[p.bid_levels.index(level)]] * len(prompts)
                outs = [[0]] * len(prompts)
            elif j0.is_bid and p.bid_mode == "logits":
                bids = p.bid(prompts, keys=keys) if keys else p.bid(prompts)
                texts, outs = [b.text for b in bids], [b.tokens for b in bids]
                if want is not None:
                    probs = p.bid_distribution(prompts).clamp_min(1e-45).log().tolist()
                    logprobs = [
                        {
                            "tokens": [t],
                            "token_logprobs": [row[self.bid_texts.index(t)]],
                            "top_logprobs": [dict(zip(self.bid_texts, row))],
                            "text_offset": [0],
                        }
                        for t, row in zip(texts, probs)
                    ]
            else:  # generated text: a bid in generate mode, or an action
                ids = [self.prompt_ids(x) for x in prompts]
                rec = StepRecorder(p, want) if want is not None else None
                pick = rec  # top_p masks first; the recorder then scores the masked distribution
                if float(j0.req.top_p) < 1.0:
                    pick = top_p_pick(p, float(j0.req.top_p), rec or p._pick)
                if j0.is_bid:
                    outs = p._sample(ids, int(j0.req.max_tokens), None, keys, pick=pick)
                    texts = [b.text for b in p.parse_bids(outs)]
                else:
                    trie = j0.trie
                    longest = max(int(j0.req.max_tokens), trie.longest if trie is not None else 1)
                    outs = p._sample(ids, longest, p._action_ban, keys, trie, pick=pick)
                    texts = [p.decode(o) for o in outs]
                if rec is not None:
                    logprobs = [rec.row(r, o, t, p.decode) for r, (o, t) in enumerate(zip(outs, texts))]
        compute_ms = (time.perf_counter() - t0) * 1000
        bodies, i = [], 0
        for j in jobs:
            rows = range(i, i + len(j.prompts))
            i += len(j.prompts)
            choices = [finish_choice(j, n, texts[r], logprobs[r], outs[r], p) for n, r in enumerate(rows)]
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
                    "model": self.model_id,
                    "choices": choices,
                    "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
                }
            )
        return bodies, compute_ms


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


class Batcher:
    """Requests that arrive while the model is busy are answered together: each round takes every
    queued request, and runs one batch per group (bids; actions of one choice set; same temperature,
    length and keying). One request alone is a batch of one."""

    def __init__(self, completer: Completer, max_rows: int = 64):
        self.completer, self.max_rows = completer, max_rows
        self.queue: list[Job] = []
        self.wake = None
        self.task = None
        self.stats = {"requests": 0, "batches": 0, "rows": 0}  #: answered so far (``GET /health``)

    async def submit(self, job: Job):
        import asyncio

        if self.task is None:
            self.wake = asyncio.Event()
            self.task = asyncio.ensure_future(self._loop())
        job.future = asyncio.get_running_loop().create_future()
        self.queue.append(job)
        self.wake.set()
        return await job.future

    async def _loop(self):
        import asyncio

        while True:
            await self.wake.wait()
            self.wake.clear()
            await asyncio.sleep(0)  # let the requests already read join this round
            batch, self.queue = self.queue, []
            groups: dict[tuple, list[Job]] = {}
            for j in sorted(batch, key=lambda j: j.adapter or ""):  # an adapter's rows contiguous (mixed batches)
                groups.setdefault(j.group, []).append(j)
            for jobs in groups.values():
                for k in range(0, len(jobs), self.max_rows):
                    chunk = jobs[k : k + self.max_rows]
                    try:
                        bodies, ms = self.completer.run(chunk)
                    except Exception as exc:  # answer every request of the batch with the error
                        for j in chunk:
                            if not j.future.done():
                                j.future.set_exception(exc)
                        continue
                    self.stats["requests"] += len(chunk)
                    self.stats["batches"] += 1
                    self.stats["rows"] += sum(len(j.prompts) for j in chunk)
                    for j, body in zip(chunk, bodies):
                        if not j.future.done():
                            j.future.set_result((body, ms))
                    await asyncio.sleep(0)


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


class FaultInjected(RuntimeError):
    """An injected failure (``--fault-act-error-after``)."""


def make_app(policy, opts: WorkerOptions):
    """The worker's FastAPI app. Errors are in OpenAI's shape (``{"error": {"message", "type", "param",
    "code"}}``); bodies are read by :func:`~swarm_runtime.serve.validate.validated` (NaN or Infinity
    anywhere is a 400 naming the field)."""
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from swarm_runtime.serve.protocol import chat_model, completion_models, lora_models
    from swarm_runtime.serve.validate import BadRequest, openai_error, validated

    CompletionRequest = completion_models()
    ChatRequest = chat_model()
    model_id = opts.name or Path(opts.model).name
    completer = Completer(policy, model_id, opts)
    batcher = Batcher(completer)
    app = FastAPI(title=f"swarm agent {model_id}")
    started = int(time.time())

    @app.exception_handler(BadRequest)
    async def bad_request(_request, exc: BadRequest):
        return JSONResponse(openai_error(exc.message, exc.status, exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, exc):
        return JSONResponse(openai_error(str(exc.detail), exc.status_code), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request, exc):
        return JSONResponse(openai_error(str(exc.errors()[0].get("msg", "invalid request")), 422), status_code=422)

    @app.get("/health")
    def health():
        return {"status": "ok", "model": model_id, "pid": os.getpid(), "batching": dict(batcher.stats)}

    @app.get("/v1/models")
    def models():
        base = {
            "id": model_id,
            "object": "model",
            "created": started,
            "owned_by": "swarm-runtime",
            "root": str(opts.model),
            "parent": None,
            "max_model_len": int(completer.context()),
        }
        host = completer.host
        loras = (
            []
            if host is None
            else [{**base, "id": name, "root": host.paths[name], "parent": model_id} for name in host.policies]
        )
        return {"object": "list", "data": [base, *loras] if host is None or not loras else [*loras, base]}

    if completer.host is not None:  # vLLM's runtime LoRA endpoints, with vLLM's request shapes
        from fastapi.responses import PlainTextResponse

        LoadRequest, UnloadRequest = lora_models()

        @app.post("/v1/load_lora_adapter")
        async def load_lora(request: Request):
            req = validated(LoadRequest, await request.body())
            completer.host.load(req.lora_name, req.lora_path)
            return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora(request: Request):
            req = validated(UnloadRequest, await request.body())
            completer.host.unload(req.lora_name)
            return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")

    async def complete(req) -> tuple[dict, float]:
        try:
            return await batcher.submit(completer.plan(req))
        except FaultInjected as exc:
            raise HTTPException(500, str(exc)) from exc
        except BadRequest:
            raise
        except ValueError as exc:  # a guided_choice text the tokenizer cannot spell
            raise BadRequest(str(exc)) from exc

    def sse(chunks):
        async def events():
            for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):  # the model runs inline, batched across waiting requests
        req = validated(CompletionRequest, await request.body())
        body, ms = await complete(req)
        if not req.stream:
            return JSONResponse(body, headers={"x-swarm-compute-ms": f"{ms:.3f}"})
        head = {k: body[k] for k in ("id", "object", "created", "model")}
        chunks = []
        for c in body["choices"]:
            for piece in c.pop("_pieces"):
                chunks.append(
                    {
                        **head,
                        "choices": [
                            {
                                "index": c["index"],
                                "text": piece,
                                "logprobs": None,
                                "finish_reason": None,
                                "stop_reason": None,
                            }
                        ],
                    }
                )
            chunks.append(
                {
                    **head,
                    "choices": [
                        {
                            "index": c["index"],
                            "text": "",
                            "logprobs": None,
                            "finish_reason": c["finish_reason"],
                            "stop_reason": c["stop_reason"],
                        }
                    ],
                }
            )
        chunks.append({**head, "choices": [], "usage": body["usage"]})
        return sse(chunks)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        """OpenAI's chat completions over the model's chat template (a 400 when it has none)."""
        req = validated(ChatRequest, await request.body())
        template = getattr(policy.tok, "chat_template", None)
        if not template:
            raise BadRequest(
                f"model {model_id!r} has no chat template (its tokenizer_config.json has no "
                "chat_template): use /v1/completions with a prompt",
                param="messages",
            )
        try:  # token ids, so a policy that templates its text prompts (model.chat_template=auto) does not again
            prompt = policy.tok.apply_chat_template(
                [m.model_dump() for m in req.messages], tokenize=False, add_generation_prompt=True
            )
            bos = completer.policy.bos
            prompt = ([bos] if bos is not None else []) + policy.tok(prompt, add_special_tokens=False).input_ids
        except Exception as exc:  # a template that refuses these messages (roles out of order, ...)
            raise BadRequest(f"messages: the chat template refused them: {exc}", param="messages") from None
        fields = {k: getattr(req, k) for k in ("model", "temperature", "top_p", "n", "seed", "stop", "stream")}
        max_tokens = req.max_completion_tokens or req.max_tokens or 16
        body, ms = await complete(
            validated(CompletionRequest, json.dumps({**fields, "prompt": prompt, "max_tokens": max_tokens}).encode())
        )
        head = {"id": body["id"].replace("cmpl-", "chatcmpl-"), "created": body["created"], "model": body["model"]}
        if not req.stream:
            return JSONResponse(
                {
                    **head,
                    "object": "chat.completion",
                    "usage": body["usage"],
                    "choices": [
                        {
                            "index": c["index"],
                            "message": {"role": "assistant", "content": c["text"]},
                            "logprobs": None,
                            "finish_reason": c["finish_reason"],
                            "stop_reason": c["stop_reason"],
                        }
                        for c in body["choices"]
                    ],
                },
                headers={"x-swarm-compute-ms": f"{ms:.3f}"},
            )
        head["object"] = "chat.completion.chunk"
        chunks = []
        for c in body["choices"]:
            chunks.append(
                {
                    **head,
                    "choices": [
                        {"index": c["index"], "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                    ],
                }
            )
            for piece in c.pop("_pieces"):
                chunks.append(
                    {**head, "choices": [{"index": c["index"], "delta": {"content": piece}, "finish_reason": None}]}
                )
            chunks.append(
                {**head, "choices": [{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}]}
            )
        return sse(chunks)

    return app


def _watch_parent(pid: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except OSError:
            os._exit(0)


def parse_args(argv=None) -> WorkerOptions:
    ap = argparse.ArgumentParser(prog="python -m swarm_runtime.serve.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a role's checkpoint folder")
    ap.add_argument("--name", default="")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parent-pid", type=int, default=0)
    ap.add_argument(
        "--lora-modules",
        nargs="*",
        default=None,
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT folders) to serve on the base --model, each under its NAME",
    )
    ap.add_argument(
        "--enable-lora", action="store_true", help="serve adapters loaded at runtime (/v1/load_lora_adapter)"
    )
    ap.add_argument("--fault-act-error-after", type=int, default=-1)
    ap.add_argument("--fault-bid", type=float, default=None)
    ap.add_argument("--fault-delay-ms", type=int, default=0)
    a = ap.parse_args(argv)
    return WorkerOptions(**{k: v for k, v in vars(a).items()})


def main(argv=None) -> int:
    import sys

    opts = parse_args(argv)
    if opts.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"worker: error: --host {opts.host!r}: a worker binds to loopback only; put the gateway in front",
            file=sys.stderr,
        )
        return 2
    if not (Path(opts.model) / "config.json").exists():
        print(
            f"worker: error: --model {opts.model!r} is not a Hugging Face checkpoint folder (no config.json)",
            file=sys.stderr,
        )
        return 2
    import torch
    import uvicorn

    torch.set_num_threads(max(1, opts.threads))
    if opts.parent_pid:
        threading.Thread(target=_watch_parent, args=(opts.parent_pid,), daemon=True).start()
    app = make_app(load_policy(opts), opts)
    # keep-alive well beyond the gateway's pauses between turns, so it rarely meets a connection closing under it
    uvicorn.run(app, host=opts.host, port=opts.port, log_level="warning", access_log=False, timeout_keep_alive=300)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
