"""The wire protocol between the gateway and its agent workers: the subset of vLLM's
OpenAI-compatible ``/v1/completions`` the swarm needs, and how a keyed sampling draw travels
in its ``seed`` field.

Keyed noise (:mod:`swarm_runtime.core.noise`) draws row ``(noise, turn, agent, kind)``'s token at
position ``step`` from ``gumbel(key_hash(noise, turn, agent, kind, step))``. ``key_hash`` is a chain
(``h <- splitmix64(h ^ part)``), so the gateway sends the 64-bit prefix hash
``key_hash(noise, turn, agent, kind)`` as the request's ``seed`` (as a signed 64-bit integer, the
range vLLM accepts), and the worker turns it back into a one-part key :func:`key_from_seed` whose
chain continues exactly where the prefix ended. A served draw is then the in-process draw, token
for token. An external server (``vllm serve``) uses the seed its own way: reproducible, not equal.
"""

from __future__ import annotations

from swarm_runtime.core.noise import key_hash

_MASK = (1 << 64) - 1
_C1, _C2, _GOLD = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15
_H0 = key_hash()  # the chain's start value


def _unxorshift(y: int, s: int) -> int:
    x = y
    for _ in range(64 // s + 1):
        x = y ^ (x >> s)
    return x & _MASK


def unsplitmix64(z: int) -> int:
    """The inverse of :func:`swarm_runtime.core.noise._splitmix64` (a bijection of 64-bit ints)."""
    z = _unxorshift(z & _MASK, 31)
    z = (z * pow(_C2, -1, 1 << 64)) & _MASK
    z = _unxorshift(z, 27)
    z = (z * pow(_C1, -1, 1 << 64)) & _MASK
    z = _unxorshift(z, 30)
    return (z - _GOLD) & _MASK


def seed_for(*parts: int) -> int:
    """The request ``seed`` of the keyed draw ``parts`` (e.g. ``(noise, turn, agent, kind)``):
    their prefix hash as a signed 64-bit integer."""
    h = key_hash(*parts)
    return h - (1 << 64) if h >= 1 << 63 else h


def key_from_seed(seed: int) -> tuple[int]:
    """A one-part key ``(x,)`` with ``key_hash(x, *rest) == key_hash(*parts, *rest)`` for the
    ``parts`` :func:`seed_for` was given: what the worker hands the policy as ``keys=[(x,)]``."""
    h = int(seed) & _MASK
    return ((_H0 ^ unsplitmix64(h)) & _MASK,)


#: the most samples (``n``) one request may ask per prompt
MAX_N = 16
#: the most prompts one request may carry, and the most rows (prompts x ``n``) it may ask for
MAX_PROMPTS = 64
MAX_ROWS = 256
#: the most ``stop`` strings a request may give
MAX_STOP = 4


def sample_keys(seed: int, n: int) -> list[tuple[int, ...]]:
    """The keys of a keyed request's ``n`` samples: sample 0 draws the seed's own key (so ``n=1`` and
    the first of ``n`` are the same draw), sample ``i`` the key extended by ``i``. Each depends on
    ``(seed, i)`` alone, so sample ``i`` is reproducible whatever ``n`` and the batch."""
    key = key_from_seed(seed)
    return [key] + [(*key, i) for i in range(1, int(n))]


def completion_models():
    """Pydantic models of the request (imported lazily: pydantic comes with the ``serve`` extra)."""
    from typing import Literal

    from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

    class CompletionRequest(BaseModel):
        """vLLM's ``/v1/completions`` request, the fields a swarm uses (others are accepted and ignored,
        as vLLM does)."""

        model_config = ConfigDict(extra="allow", allow_inf_nan=False)
        model: str | None = Field(None, max_length=200)
        #: a text, a list of texts, a list of token ids, or a list of such lists (1 to MAX_PROMPTS prompts,
        #: checked in the worker's plan)
        prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
        top_p: float = Field(1.0, gt=0.0, le=1.0)  #: nucleus sampling of generated text
        stop: str | list[str] | None = Field(None, max_length=MAX_STOP)  #: cut the text before any of these
        echo: StrictBool = False  #: the prompt's text before the completion
        stream: StrictBool = False  #: server-sent events, one per token piece, then ``data: [DONE]``
        max_tokens: StrictInt = Field(16, ge=1, le=4096)
        temperature: float = Field(1.0, ge=0.0, le=100.0)
        seed: StrictInt | None = Field(None, ge=-(1 << 63), le=(1 << 63) - 1)
        logprobs: StrictInt | None = Field(None, ge=0, le=64)
        guided_choice: list[str] | None = Field(None, min_length=1, max_length=4096)
        n: StrictInt = Field(1, ge=1)  # at most MAX_N: more is refused with 400 naming the limit
        #: our extension (vLLM ignores it): ``learner``: log-probs in the learner's basis (serve/logprobs.py)
        swarm_logprobs: Literal["processed", "learner"] = "processed"
        # vLLM's token-level extensions (swarm_runtime/serve/vllm_fields.py): what rollout.engine=openai sends
        return_token_ids: StrictBool = False  #: each choice carries ``token_ids`` and ``prompt_token_ids``
        return_tokens_as_token_ids: StrictBool = False  #: tokens named ``token_id:N``
        logprob_token_ids: list[StrictInt] | None = Field(None, min_length=1, max_length=4096)
        allowed_token_ids: list[StrictInt] | None = Field(None, max_length=1 << 20)
        logit_bias: dict[str, float] | None = Field(None, max_length=1 << 20)
        stop_token_ids: list[StrictInt] | None = Field(None, max_length=64)

    return CompletionRequest


def chat_model():
    """OpenAI's ``/v1/chat/completions`` request, the fields served (others accepted and ignored)."""
    from typing import Literal

    from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

    class Message(BaseModel):
        model_config = ConfigDict(extra="allow")
        role: Literal["system", "user", "assistant", "tool", "developer"]
        content: str = Field(..., max_length=200_000)

    class ChatRequest(BaseModel):
        model_config = ConfigDict(extra="allow", allow_inf_nan=False)
        model: str | None = Field(None, max_length=200)
        messages: list[Message] = Field(..., min_length=1, max_length=256)
        max_tokens: StrictInt | None = Field(None, ge=1, le=4096)
        max_completion_tokens: StrictInt | None = Field(None, ge=1, le=4096)
        temperature: float = Field(1.0, ge=0.0, le=100.0)
        top_p: float = Field(1.0, gt=0.0, le=1.0)
        n: StrictInt = Field(1, ge=1)
        seed: StrictInt | None = Field(None, ge=-(1 << 63), le=(1 << 63) - 1)
        stop: str | list[str] | None = Field(None, max_length=MAX_STOP)
        stream: StrictBool = False
        logprobs: StrictBool = False  #: each choice's ``logprobs.content``: the sampled tokens' log-probs
        top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
        return_token_ids: StrictBool = False  #: vLLM's: ``prompt_token_ids``, and each choice's ``token_ids``
        swarm_logprobs: Literal["processed", "learner"] = "processed"  #: ours, as on completions

    return ChatRequest


def lora_models():
    """vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` requests."""
    from pydantic import BaseModel, ConfigDict, Field

    class LoadLoRA(BaseModel):
        model_config = ConfigDict(extra="allow")
        lora_name: str = Field(..., max_length=64)
        lora_path: str = Field(..., max_length=4096)

    class UnloadLoRA(BaseModel):
        model_config = ConfigDict(extra="allow")
        lora_name: str = Field(..., max_length=64)

    return LoadLoRA, UnloadLoRA
