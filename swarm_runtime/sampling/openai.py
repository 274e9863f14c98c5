"""The OpenAI-compatible sampler (``rollout.engine=openai``; docs/reference/engine.md): bids and actions drawn on a
completions server (a ``vllm serve``, or any server that speaks vLLM's extensions of ``/v1/completions``).

Every row becomes one ``POST /v1/completions`` with the prompt as token ids (the run's own tokenizer:
:meth:`TransformersPolicy.encode_prompt`; a word-level tokenizer's text would come back empty), the row's
current adapter version as ``model`` (``Smith@v12``, :mod:`swarm_runtime.sampling.sync`), and the
policy's sampling settings. All rows of a call go out at once (``rollout.concurrency`` in flight), so the
server batches every role's requests of a turn together, across adapters. The request fields are vLLM's
``CompletionRequest`` (``vllm/entrypoints/openai/completion/protocol.py`` in vLLM 0.32):

- actions: ``max_tokens`` = ``model.max_action_tokens``, ``logit_bias`` -100 on the tokens the in-process
  sampler bans (pad, BOS, unk, the bid tokens), ``stop_token_ids`` = [EOS];
- ``logits``-mode bids: ``max_tokens`` 1, ``logprob_token_ids`` = the bid-level tokens (their log-probs
  come back, so the bid is drawn here from ``softmax(logits[bid ids] / T)``, with the row's keyed noise
  exactly as in process), ``allowed_token_ids`` = the bid tokens;
- ``generate``-mode bids: ``max_tokens`` = ``model.max_bid_tokens``, parsed as in process;
- always: ``temperature``, ``top_p`` 1, ``top_k`` 0, ``min_p`` 0 and no penalties (a checkpoint's
  ``generation_config.json`` must not change the distribution), ``logprobs`` 0 (the sampled token's),
  ``return_token_ids`` and ``return_tokens_as_token_ids`` (ids, never re-tokenised text) and a per-row
  ``seed`` (from the row's key when it has one, so a retried row is answered the same).

Log-probabilities: vLLM returns ``log_softmax(logits)`` of the raw logits (its default ``raw_logprobs``
mode, computed before temperature, bias and allowed-token masks: ``vllm/v1/sample/sampler.py``), the
in-process basis at ``T`` = 1 and greedy. At any other temperature the in-process basis is
``log_softmax(logits / T)``, which one token's raw log-prob cannot give: the responses then carry no
sampler log-probs (``None``) and the learner's own are used.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch
from loguru import logger

from swarm_runtime.core.noise import key_hash
from swarm_runtime.core.protocols import Bid, Learner, Response, Row
from swarm_runtime.models.noise import gumbel_max
from swarm_runtime.models.tokenizer import bid_token
from swarm_runtime.sampling.http import Client, EngineError, EngineGone, HTTPStatusError, Unreachable, first_choice

#: ``logit_bias`` of a banned token (the OpenAI API's floor): exp(-100) next to any real logit
BAN = -100.0


def row_seed(key: tuple[int, ...] | None, rng: random.Random) -> int:
    """The request's ``seed``: a pure function of the row's key (a retried or replayed row is drawn the
    same), else the sampler's own generator. Non-negative and below 2**63 (vLLM takes an int64)."""
    if key is not None:
        return key_hash(*key) >> 1
    return rng.getrandbits(63)


def sampler_rng_state(sampler):
    """The state of the generator(s) an engine sampler draws the seeds of unkeyed rows from (:func:`row_seed`), for
    a checkpoint: an :class:`OpenAISampler`'s ``rng`` state, ``{base: state}`` for a sampler of several bases
    (``samplers``); None for a sampler without one (in process, the policies' generators are saved per role)."""
    subs = getattr(sampler, "samplers", None)
    if isinstance(subs, dict):
        states = {b: sampler_rng_state(s) for b, s in subs.items()}
        return {b: v for b, v in states.items() if v is not None} or None
    rng = getattr(sampler, "rng", None)
    return rng.getstate() if isinstance(rng, random.Random) else None


def _sampler_rngs(sampler) -> list[random.Random]:
    """The generators :func:`sampler_rng_state` saves, in its order (one per base of a sampler of several)."""
    subs = getattr(sampler, "samplers", None)
    if isinstance(subs, dict):
        return [rng for s in subs.values() for rng in _sampler_rngs(s)]
    rng = getattr(sampler, "rng", None)
    return [rng] if isinstance(rng, random.Random) else []


@contextmanager
def sampler_rng_seeded(sampler, seed: int):
    """Inside: the engine sampler's generator(s) of unkeyed rows' seeds (:func:`row_seed`; an
    :class:`OpenAISampler`'s, a :class:`~swarm_runtime.sampling.replicas.ReplicatedSampler`'s, each base's of a sampler
    of several) seeded from ``seed`` (the i-th from ``key_hash(seed, i)``), so what is drawn inside does not depend
    on where the stream stood; afterwards the stream put back where it was, so the draws after it are those made
    without it (held-out evaluations: :func:`swarm_runtime.evaluation.heldout.evaluate`). A sampler without one: nothing."""
    saved = sampler_rng_state(sampler)
    for i, rng in enumerate(_sampler_rngs(sampler)):
        rng.seed(key_hash(int(seed), i))
    try:
        yield
    finally:
        restore_sampler_rng(sampler, saved)


def restore_sampler_rng(sampler, state) -> None:
    """Put back what :func:`sampler_rng_state` saved (None, or a part the sampler lacks: nothing)."""
    if state is None:
        return
    subs = getattr(sampler, "samplers", None)
    if isinstance(subs, dict):
        for b, s in subs.items():
            if isinstance(state, dict) and b in state:
                restore_sampler_rng(s, state[b])
        return
    rng = getattr(sampler, "rng", None)
    if isinstance(rng, random.Random) and not isinstance(state, dict):
        version, internal, gauss = state
        rng.setstate((version, tuple(internal), gauss))


def sampling_fields(policy) -> dict:
    """The fields every request carries: the policy's temperature, the full distribution (no top-p/k,
    no penalties), ids in and out, the sampled token's log-prob."""
    return {
        "temperature": max(0.0, float(policy.temperature)),
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
    }


def action_body(policy, prompt_ids: list[int], max_tokens: int, ban: Sequence[int] | None) -> dict:
    body = {"prompt": list(prompt_ids), "max_tokens": int(max_tokens), **sampling_fields(policy)}
    if policy.eos is not None:
        body["stop_token_ids"] = [int(policy.eos)]
    if ban:
        body["logit_bias"] = {str(int(t)): BAN for t in ban}
    return body


def bid_body(policy, prompt_ids: list[int]) -> dict:
    ids = [int(t) for t in policy.bid_ids]
    return {
        "prompt": list(prompt_ids),
        "max_tokens": 1,
        **sampling_fields(policy),
        "logprobs": len(ids),
        "logprob_token_ids": ids,
        "allowed_token_ids": ids,
    }


def _token_id(s: str) -> int:
    """``token_id:17`` (``return_tokens_as_token_ids``) -> 17."""
    if not s.startswith("token_id:"):
        raise EngineError(
            f"the server returned the token {s!r}, not token_id:N: it ignores return_tokens_as_token_ids "
            "(rollout.engine=openai needs vLLM's completions extensions)"
        )
    return int(s[len("token_id:") :])


def parse_tokens(choice: dict) -> tuple[list[int], list[float]]:
    """A completion choice's token ids and their log-probs."""
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:
        ids = [_token_id(t) for t in lp.get("tokens") or []]
    lps = [float(v) if v is not None else float("nan") for v in lp.get("token_logprobs") or []]
    if len(lps) != len(ids):
        raise EngineError(f"the server returned {len(ids)} tokens but {len(lps)} log-probs")
    return [int(t) for t in ids], lps


def bid_logprobs(choice: dict, bid_ids: Sequence[int]) -> list[float]:
    """The raw log-prob of each bid-level token at the bid position (``logprob_token_ids``)."""
    top = ((choice.get("logprobs") or {}).get("top_logprobs") or [None])[0] or {}
    got = {_token_id(k): float(v) for k, v in top.items()}
    missing = [t for t in bid_ids if t not in got]
    if missing:
        raise EngineError(
            f"the server returned no log-prob for the bid tokens {missing}: it ignores logprob_token_ids "
            "(vLLM >= 0.32 returns them)"
        )
    return [got[t] for t in bid_ids]


class OpenAISampler:
    """Samples on an OpenAI-compatible completions server (module docstring). ``policies``: model name ->
    the in-process policy whose tokenizer and settings the requests follow (never run here);
    ``adapters``: the :class:`~swarm_runtime.sampling.sync.AdapterSync` that names each model's served
    version; ``recover``: called when the server stops answering (restart it and reload the adapters;
    True when it came back), None: stop with a clear error."""

    name = "openai"

    def __init__(
        self,
        client: Client,
        policies: Mapping,
        adapters,
        concurrency: int = 64,
        retries: int = 2,
        seed: int = 0,
        recover: Callable[[], bool] | None = None,
        describe: str | None = None,
    ):
        self.client, self.policies, self.adapters = client, dict(policies), adapters
        self.retries, self.recover = int(retries), recover
        self.describe = describe or f"rollout.url={client.url}"
        #: draws the seeds of rows without a key (:func:`row_seed`); saved in checkpoints (:func:`sampler_rng_state`)
        self.rng = random.Random(int(seed))
        self._pool = ThreadPoolExecutor(max_workers=max(1, int(concurrency)), thread_name_prefix="sampler")
        self.requests = 0  #: completion requests sent (retries included)
        self.recoveries = (
            0  #: times rows were sent again after :attr:`recover` (the server restarted, or answered again)
        )

    def bid_levels(self, model: str):
        return getattr(self.policies[model], "bid_levels", None)

    def version(self, model: str) -> int:
        return self.adapters.version(model)

    def sync(self, learner: Learner, models: Sequence[str]) -> None:
        self.adapters.sync(learner, models)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ transport
    def _post(self, body: dict) -> dict:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                self.requests += 1
                return self.client.post("/v1/completions", body)
            except Unreachable as exc:
                last = exc
                if self.recover is not None:
                    break  # a server we run: the batch restarts it instead of waiting here
                if attempt < self.retries:
                    time.sleep(min(0.5 * 2**attempt, 4.0))
            except HTTPStatusError as exc:
                if exc.status < 500 or attempt == self.retries:
                    raise EngineError(
                        f"{self.describe}: the completion request for {body.get('model')!r} failed: "
                        f"HTTP {exc.status}: {exc.detail}"
                    ) from None
                last = exc
                time.sleep(min(0.5 * 2**attempt, 4.0))
        raise Unreachable(str(last))

    def _complete(self, models: list[str], bodies: list[dict]) -> list[dict]:
        """One completion per body (row ``i`` for ``models[i]``), all in flight at once; a server that stops
        answering is restarted (``recover``) and the unanswered rows sent again (same version names, same
        seeds: the same answers)."""
        out: list = [None] * len(bodies)
        todo = list(range(len(bodies)))
        restarts = 0
        while todo:
            futures = {i: self._pool.submit(self._post, bodies[i]) for i in todo}
            failed, last = [], None
            for i, f in futures.items():
                try:
                    out[i] = f.result()
                except Unreachable as exc:
                    failed.append(i)
                    last = exc
            if not failed:
                break
            if self.recover is None:
                raise EngineGone(
                    f"{self.describe} does not answer after {self.retries} retries ({last}); start the "
                    "server or give rollout.url of one that runs"
                ) from None
            if restarts >= max(1, self.retries) or not self.recover():
                raise EngineGone(
                    f"{self.describe} stopped answering ({last}) and did not come back after {restarts} "
                    "restart(s); the run stops here: resume it from its last checkpoint "
                    "(swarm run resume=true)"
                ) from None
            restarts += 1
            self.recoveries += 1
            logger.warning(
                "{} stopped answering ({} of {} rows: {}); it answers again, the rows are sent again",
                self.describe,
                len(failed),
                len(bodies),
                last,
            )
            for i in failed:
                bodies[i]["model"] = self.adapters.served(models[i])
            todo = failed
        return out

    def _send(self, rows: Sequence[Row], build: Callable) -> list[dict]:
        """Each row's request (``build(policy, prompt ids)``), sent; the first choice of each answer."""
        bodies = []
        for r in rows:
            policy = self.policies[r.model]
            body = build(policy, policy.encode_prompt(r.prompt))
            body["model"] = self.adapters.served(r.model)
            body["seed"] = r.seed if getattr(r, "seed", None) is not None else row_seed(r.key, self.rng)
            bodies.append(body)
        return [first_choice(c, self.describe) for c in self._complete([r.model for r in rows], bodies)]

    # ------------------------------------------------------------------ answers
    def _responses(self, rows: Sequence[Row], choices: list[dict]) -> list[tuple[list[int], list[float] | None]]:
        out = []
        for r, c in zip(rows, choices):
            ids, lps = parse_tokens(c)
            policy = self.policies[r.model]
            keep = policy.temperature <= 0 or policy.temperature == 1.0
            out.append((ids, lps if keep else None))
        return out

    def act(self, rows: Sequence[Row]) -> list[Response]:
        if not rows:
            return []
        choices = self._send(rows, lambda p, ids: action_body(p, ids, p.max_action_tokens, p._action_ban.tolist()))
        out = []
        for r, (ids, lps) in zip(rows, self._responses(rows, choices)):
            out.append(Response(self.policies[r.model].decode(ids), ids, lps, self.version(r.model)))
        return out

    def bid(self, rows: Sequence[Row]) -> list[Bid]:
        if not rows:
            return []
        out: list = [None] * len(rows)
        gen = [i for i, r in enumerate(rows) if self.policies[r.model].bid_mode != "logits"]
        lev = [i for i, r in enumerate(rows) if self.policies[r.model].bid_mode == "logits"]
        if gen:
            sub = [rows[i] for i in gen]
            choices = self._send(sub, lambda p, ids: action_body(p, ids, p.max_bid_tokens, None))
            for i, r, (ids, lps) in zip(gen, sub, self._responses(sub, choices)):
                b = self.policies[r.model].parse_bids([ids], None if lps is None else [lps])[0]
                b.version = self.version(r.model)
                out[i] = b
        if lev:
            sub = [rows[i] for i in lev]
            choices = self._send(sub, bid_body)
            for i, r, c in zip(lev, sub, choices):
                out[i] = self._level_bid(r, c)
        return out

    def _level_bid(self, row: Row, choice: dict) -> Bid:
        """A ``logits``-mode bid drawn from the returned bid-token log-probs, as
        :meth:`TransformersPolicy.bid` draws it (greedy, the row's keyed noise, or the server's draw)."""
        policy = self.policies[row.model]
        raw = torch.tensor(bid_logprobs(choice, policy.bid_ids), dtype=torch.float64)
        t = policy.temperature if policy.temperature > 0 else 1.0
        probs = torch.softmax(raw / t, dim=-1).float()
        if policy.temperature <= 0:
            j = int(probs.argmax())
        elif row.key is not None:
            j = int(gumbel_max(probs.log()[None], [(*row.key, 0)])[0])
        else:
            ids, _ = parse_tokens(choice)
            j = policy.bid_ids.index(ids[0]) if ids and ids[0] in policy.bid_ids else int(probs.argmax())
        keep = policy.temperature <= 0 or policy.temperature == 1.0
        lp = [float(raw[j])] if keep else None
        return Bid(
            bid_token(policy.bid_levels[j]),
            [policy.bid_ids[j]],
            lp,
            self.version(row.model),
            level=policy.bid_levels[j],
        )
