"""The gateway's request bodies (pydantic models, read by :func:`swarm_runtime.serve.validate.validated`): an
agent to add, a checkpoint to swap in, an episode to start, a client-side episode's turn and its reward posted
later."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from swarm_runtime.serve.validate import no_bool

#: Seed splits a request may name (``any``: any seed in [0, 2**63)).
SEED_SPLITS = ("eval", "dev", "train", "any")

Number = Annotated[float, BeforeValidator(no_bool)]  # a float, where JSON true/false is refused


class AgentRequest(BaseModel):
    """``POST /v1/swarm/agents``: an agent of ``role`` joins, from a checkpoint of the run or at a URL."""

    model_config = ConfigDict(extra="forbid")
    role: str = Field(..., max_length=200)
    checkpoint: str | None = Field(None, max_length=4096)
    url: str | None = Field(None, max_length=4096)
    name: str | None = Field(None, max_length=200)


class SwapRequest(BaseModel):
    """``POST /v1/swarm/swap``: serve ``checkpoint`` (a tag of the run, or a checkpoint folder inside it)."""

    model_config = ConfigDict(extra="forbid")
    checkpoint: str = Field(..., min_length=1, max_length=4096)


class EpisodeRequest(BaseModel):
    """``POST /v1/episodes``: an episode of ``task`` on ``seed`` (of ``split``), server- or client-side."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    task: str | None = Field(None, max_length=200)
    seed: StrictInt | None = Field(None, ge=0, le=(1 << 63) - 1)
    split: Literal[SEED_SPLITS] | None = None
    noise: StrictInt | str | None = None
    temperature: Number | None = Field(None, ge=0.0, le=100.0)
    stream: StrictBool = False
    env: Literal["server", "client", "intercept"] = "server"
    max_decisions: StrictInt | None = Field(None, ge=1, le=100_000)

    @field_validator("noise", mode="before")
    @classmethod
    def _noise(cls, v):
        if isinstance(v, bool):
            raise ValueError("an integer (or its decimal string), not a boolean")
        if isinstance(v, str):
            try:
                v = int(v)
            except ValueError:
                raise ValueError("an integer (or its decimal string)") from None
        if isinstance(v, int) and not 0 <= v < (1 << 64):
            raise ValueError("out of range: an integer in [0, 2**64 - 1]")
        return v


class TurnRequest(BaseModel):
    """``POST /v1/episodes/{id}/turns``: what the client's world did with the last action (``reward``,
    ``valid``, ``done``) and what it shows now (``observation``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    observation: str = Field(..., max_length=200_000)
    reward: Number = Field(0.0, ge=-1e12, le=1e12)
    valid: StrictBool = True
    done: StrictBool = False
    #: with ``done``: the episode's reward comes later, once (``POST /v1/episodes/{id}/reward``)
    reward_later: StrictBool = False

    @model_validator(mode="after")
    def _later_ends(self):
        if self.reward_later and not self.done:
            raise ValueError("reward_later is for the report that ends the episode: send it with done: true")
        return self


class RewardRequest(BaseModel):
    """``POST /v1/episodes/{id}/reward``: a client-side episode's reward, posted once after its last report
    (``reward_later``); added to its last turn's."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    reward: Number = Field(..., ge=-1e12, le=1e12)
