"""The records of the loop: an :class:`Agent` of the swarm, the :class:`Turn` and :class:`Episode` credit
assignment and counterfactual branches read, the :class:`Slot` an episode is played in, and the forced
first turn of a branch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swarm_runtime.core.auction import AuctionResult
from swarm_runtime.core.domain import Domain, Event
from swarm_runtime.core.env import ValidatedEnv
from swarm_runtime.core.protocols import Policy, Response


@dataclass
class Agent:
    """One member of the swarm: a name, a role and a model (replicas share the model)."""

    name: str
    role: str
    policy: Policy
    #: ``role``: bid and act on the role's prompts; ``single``: one model acting on the domain's
    #: ``single_prompt``, stepping the env with ``role=None`` (a monolithic model may do anything).
    prompt_kind: str = "role"

    def action_prompt(self, domain: Domain, observation: str, log: list[Event]) -> str:
        if self.prompt_kind == "single":
            return domain.single_prompt(observation, log)
        return domain.action_prompt(self.role, observation, log)

    @property
    def env_role(self) -> str | None:
        """The role the env is stepped with (``None`` for a single monolithic model)."""
        return None if self.prompt_kind == "single" else self.role

    @property
    def log_role(self) -> str:
        """Who the public log says acted (the monolithic model is logged as :data:`SINGLE_ACTOR`)."""
        return SINGLE_ACTOR if self.prompt_kind == "single" else self.role


#: The actor name a single monolithic model's turns carry in the public log (a core template word,
#: so every tokenizer knows it; the monolithic SFT demos use it too).
SINGLE_ACTOR = "you"


@dataclass
class Turn:
    """Everything credit assignment and counterfactual branches need about one decision."""

    t: int
    bids: list[float | None]
    bid_tokens: list[list[int] | None]
    bid_prompts: list[str | None]
    auction: AuctionResult
    action_prompt: str | None = None
    action_tokens: list[int] | None = None
    action_text: str = ""
    reward: float = 0.0
    valid: bool = True
    snapshot: Any = None  #: (env snapshot, log) taken before the action, for branching
    #: the sampler's per-token log-probs of ``action_tokens`` and the weight version that sampled them
    #: (what the learner's recomputed log-probs are compared with: :mod:`swarm_runtime.sampling.mismatch`)
    action_logprobs: list[float] | None = None
    action_version: int | None = None
    #: per agent: the sampler's per-token log-probs of its bid response in ``bid_tokens`` (None: no bid, or
    #: none reported); the Bradley-Terry update compares the learner's with them (``mismatch/bid_*``)
    bid_logprobs: list[list[float] | None] | None = None

    @property
    def winner(self) -> int | None:
        return self.auction.winner


@dataclass
class Episode:
    seed: int
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    unparsed_bids: int = 0
    invalid_actions: int = 0
    reward_missing: bool = False
    #: common random numbers: every draw of this episode (bids, actions, tie-breaks) is keyed by
    #: (noise, turn, agent, kind) instead of coming from the policies' generators; None = generators
    noise: int | None = None

    @property
    def acted(self) -> list[Turn]:
        return [t for t in self.turns if t.winner is not None]


@dataclass
class ForcedTurn:
    """A first turn whose bids and winner are given (a counterfactual branch), and optionally the
    winner's action (``None``: the winner samples it as usual)."""

    bids: list[float | None]
    bid_tokens: list[list[int] | None]
    bid_prompts: list[str | None]
    winner: int
    action: Response | None = None


@dataclass
class Slot:
    env: ValidatedEnv
    episode: Episode
    log: list[Event]
    t: int = 0
    forced: ForcedTurn | None = None
    finished: bool = False
    last_actor: int | None = None  #: index of the agent that acted last (for routing coordinators)
    stop_at: int | None = None  #: end the slot after this many decisions of its episode (a branch's horizon)


@dataclass(frozen=True)
class TurnInfo:
    """What a coordinator with ``wants_info = True`` receives besides the bids."""

    last_actor: int | None  #: index of the agent that acted last in this episode (None before anyone acted)
    proposals: dict[int, str]  #: agent index -> its proposed action text (``uses_proposals`` coordinators)
    #: (judge index, proposer index) -> judge's action model's mean per-token log-prob of the proposal
    #: on the proposer's action prompt (coordinators with ``judge_pairs``)
    scores: dict = field(default_factory=dict)
