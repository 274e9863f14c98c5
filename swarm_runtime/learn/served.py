"""Served episodes as training data (``algo.served``; docs/guides/serve.md, "Training on served traffic").

``swarm serve`` writes every episode it served to ``RUN/serve/episodes.jsonl`` once, with ``samples``: per turn,
each answered request's prompt, reply token ids, the sampler's log-probs and the version that answered
(:func:`swarm_runtime.serve.answerer.sample`). :func:`load_served` reads such transcripts (files, or served run
folders) into the core's :class:`~swarm_runtime.core.episode.Episode` records the action update takes
(:func:`swarm_runtime.learn.action.credit_samples_and_turns`): each acted turn's winner (the run's first agent of
its role), the winning bid (the credit scheme passes reward through bids), its action prompt and tokens, the
turn's reward, and the sampler's per-token log-probs as the behaviour policy of the truncated importance weight
(``algo.is_cap``; :data:`SERVED_IS_CAP` when unset).

Only what can be trained on honestly is used; the rest is counted in the :class:`ServedReport`:

- episodes that ended ``done`` or ``degraded`` (not ``interrupted``, ``expired``, ``failed``, ``cancelled``: their
  return is incomplete);
- with token ids and log-probs for every action (``serve.journal_tokens=false`` leaves them out);
- sampled at the run's temperature (the learner scores at ``model.temperature``; a sampler's log-probs at another
  temperature are another distribution's, and would bias the weight);
- with log-probs in the learner's basis (each sample's ``logprobs_basis``: ``"learner"`` when the agent said so, as
  our worker does), or, in the sampler's own (``"sampler"``: a vLLM agent's ``--logprobs-mode``, any other server's),
  only when the run samples at temperature 1, where vLLM's default (``raw_logprobs``) is the learner's basis; a
  sample without the field was written before it existed, by the gateway asking our worker for the learner's basis,
  and is read as ``"learner"``;
- of the run's task, and, played on the server's env, not on one of its held-out seeds (its ``eval`` and ``dev``
  splits): ``swarm eval serve.url=`` plays those, and training on them would leak the evaluation into training
  (a client-side episode's seed names no world of ours, so it is not held out).

A line that is not JSON (a transcript cut mid-record) is skipped and reported; the complete lines are used. A
transcript is data: nothing in it is executed, and nothing is written next to it. A role the run does not have,
or prompt token ids that this run's tokenizer does not reproduce, is a transcript of another swarm: refused with
a :class:`~swarm_runtime.config.errors.ConfigError` naming the file and line.

An intercepted call (intercept mode, swarm_runtime/serve/routes/intercept.py) is a turn whose prompt is chat
messages: its action prompt is the served prompt token ids, checked against the run's chat template of the
messages; it has no bid, so under the bucket brigade it keeps its own turn's reward (a reward posted at the end
credits the last call; ``algo.credit=reward_to_go`` gives every call the reward that followed it).

Bids learn only from the run's own rollouts: a bid is trained on counterfactual branches, which replay a
contested turn from a snapshot of the env before it; a served episode keeps no snapshot (and a client-side one
has no env here at all).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.core.auction import AuctionResult
from swarm_runtime.core.episode import Episode, Turn
from swarm_runtime.models.chat import template_ids
from swarm_runtime.runs.runfiles import check_link, check_links

#: The importance-weight cap served actions are trained with when ``algo.is_cap`` is unset (served episodes were
#: sampled by the versions that served them, not by the learner as it is now).
SERVED_IS_CAP = 2.0
#: Episode statuses whose return is complete.
USABLE = ("done", "degraded")


@dataclass
class ServedReport:
    """What :func:`load_served` read: lines, episodes used, and why the others were not."""

    files: list[str] = field(default_factory=list)
    lines: int = 0
    used: int = 0
    unreadable: list[str] = field(default_factory=list)  #: ``FILE:LINE`` of each line that is not JSON
    skipped: Counter = field(default_factory=Counter)  #: reason -> episodes

    def summary(self) -> str:
        parts = [f"{self.used} of {self.lines} served episodes used ({', '.join(self.files)})"]
        if self.unreadable:
            shown = ", ".join(self.unreadable[:5]) + (" ..." if len(self.unreadable) > 5 else "")
            parts.append(f"{len(self.unreadable)} unreadable line(s), skipped: {shown}")
        parts += [f"{n} {why}" for why, n in sorted(self.skipped.items())]
        return "; ".join(parts)


def transcript_file(path: str | Path) -> Path:
    """``path`` itself (a transcript), or a served run folder's ``serve/episodes.jsonl``."""
    p = Path(path).expanduser()
    if p.is_dir():  # a run folder: its transcript must not lead out of it (the run-folder rules: runs/runfiles.py)
        check_links(p)
        for inner in (p / "serve", p / "serve" / "episodes.jsonl"):
            check_link(p, inner)
        p = p / "serve" / "episodes.jsonl"
    if not p.is_file():
        raise ConfigError(
            f"algo.served: {path} is not a served transcript (a file like RUN/serve/episodes.jsonl, or a run folder "
            "that swarm serve has served: it writes serve/episodes.jsonl)"
        )
    return p


def read_lines(path: Path, report: ServedReport) -> list[tuple[int, dict]]:
    """``(line number, record)`` of each JSON line of ``path``; the others are reported and skipped."""
    out = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            report.lines += 1
            try:
                rec = json.loads(raw)
            except ValueError:
                report.unreadable.append(f"{path}:{n}")
                continue
            if not isinstance(rec, dict):
                report.unreadable.append(f"{path}:{n}")
                continue
            out.append((n, rec))
    return out


def skip_reason(rec: dict, temperature: float, task: str | None = None, held_out=frozenset()) -> str | None:
    """Why the transcript line ``rec`` cannot be trained on, or None (``task``: the run's; ``held_out``: its
    held-out seeds)."""
    if rec.get("status") not in USABLE:
        return f"{rec.get('status')} (return incomplete)"
    if task is not None and rec.get("task") != task:
        return f"of another task than the run's {task}"
    if rec.get("env", "server") == "server" and rec.get("seed") in held_out:
        return "on held-out seeds (eval, dev): kept out of training"
    turns, samples = rec.get("turns"), rec.get("samples")
    if not isinstance(turns, list) or not isinstance(samples, list) or len(samples) != len(turns):
        return "without samples (served before token ids were kept)"
    for turn, drawn in zip(turns, samples):
        if turn.get("agent") is None:
            continue
        act = (drawn or {}).get("action") or {}
        ids, lps = act.get("token_ids"), act.get("logprobs")
        if not ids or lps is None or len(lps) != len(ids) or any(v is None for v in lps):
            return "without action token ids or log-probs (serve.journal_tokens=false)"
        if act.get("prompt") is None and not act.get("prompt_ids"):
            return "without the prompt's token ids"
        drawn_at = act.get("temperature", rec.get("temperature"))  # an intercepted call's own, else the episode's
        if drawn_at is None or not math.isclose(float(drawn_at), temperature, abs_tol=1e-9):
            return f"sampled at another temperature than the learner's {temperature:g}"
        # no logprobs_basis: a transcript written before the field existed, whose log-probs the gateway asked of our
        # worker in the learner's basis (swarm_logprobs: "learner"); read as such
        if act.get("logprobs_basis", "learner") != "learner" and not math.isclose(temperature, 1.0, abs_tol=1e-9):
            return f"log-probs not in the learner's basis at temperature {temperature:g}"
    return None


def served_episode(rec: dict, where: str, agent_of: dict[str, int], n_agents: int, encode) -> Episode:
    """The core :class:`Episode` of the usable transcript line ``rec`` (``where``: ``FILE:LINE``, for errors).
    ``agent_of``: role -> the run's agent index that stands for it; ``encode(role, prompt)``: the run's token ids of
    ``prompt`` for ``role``'s model."""
    turns = []
    for t, (r, s) in enumerate(zip(rec["turns"], rec["samples"])):
        role = r.get("role")
        winner = None
        act: dict = {}
        if r.get("agent") is not None:
            if role not in agent_of:
                raise ConfigError(
                    f"{where}: turn {t} was played by role {role!r}, which this run does not have "
                    f"({', '.join(agent_of)}): a transcript of another swarm"
                )
            winner, act = agent_of[role], s["action"]
            # a text prompt (the gateway's own turns) or chat messages (an intercepted call): the run's tokenizer must
            # make the served prompt token ids of it
            made = encode(role, act["prompt"] if act.get("prompt") is not None else act.get("messages"))
            if act.get("prompt_ids") is not None and made != list(act["prompt_ids"]):
                raise ConfigError(
                    f"{where}: turn {t}: the served prompt's token ids are not what this run's {role} tokenizer makes "
                    "of its text: a transcript of another swarm (another base or tokenizer)"
                )
        none = [None] * n_agents
        turns.append(
            Turn(
                t=int(r.get("t", t)),
                bids=list(none),
                bid_tokens=list(none),
                bid_prompts=list(none),
                auction=AuctionResult(winner, None, float(r.get("bid") or 0.0) if winner is not None else 0.0),
                action_prompt=act["prompt"] if act.get("prompt") is not None else act.get("prompt_ids"),
                action_tokens=[int(x) for x in act["token_ids"]] if winner is not None else None,
                action_text=act.get("text") or "",
                reward=float(r.get("reward") or 0.0),
                valid=bool(r.get("valid", True)),
                action_logprobs=[float(x) for x in act["logprobs"]] if winner is not None else None,
            )
        )
    noise = rec.get("noise")
    return Episode(
        int(rec.get("seed") or 0),
        turns=turns,
        reward=sum(t.reward for t in turns),
        noise=int(noise) if noise is not None else None,
    )


def load_served(
    paths, agents, temperature: float, task: str | None = None, held_out=frozenset()
) -> tuple[list[Episode], ServedReport]:
    """The usable episodes of the served transcripts ``paths`` (module docstring) for the swarm ``agents`` (the
    run's :class:`~swarm_runtime.core.episode.Agent` list: each role stands for its served replicas) of ``task``
    (None: any) with the held-out seeds ``held_out``, and what was read."""
    report = ServedReport()
    agent_of: dict[str, int] = {}
    for i, a in enumerate(agents):
        agent_of.setdefault(a.role, i)

    def encode(role: str, prompt) -> list[int]:
        """The run's token ids of a text prompt, or of chat messages through its chat template (none: no ids)."""
        policy = agents[agent_of[role]].policy
        if isinstance(prompt, str):
            return list(policy.encode_prompt(prompt))
        if not getattr(policy.tok, "chat_template", None):
            return []
        return template_ids(policy.tok, list(prompt))

    episodes = []
    for path in paths:
        f = transcript_file(path)
        report.files.append(str(f))
        for n, rec in read_lines(f, report):
            why = skip_reason(rec, temperature, task, held_out)
            if why is not None:
                report.skipped[why] += 1
                continue
            episodes.append(served_episode(rec, f"{f}:{n}", agent_of, len(agents), encode))
            report.used += 1
    return episodes, report


class ServedPool:
    """The served episodes a run trains on, ``per_step`` per action update, in an order shuffled once by ``seed``
    and cycled: update ``it``'s batch is a pure function of ``it`` (a resumed run takes the same batches)."""

    def __init__(self, episodes: list[Episode], per_step: int, seed: int):
        import random

        self.episodes = episodes
        self.per_step = min(int(per_step), len(episodes))
        self.order = list(range(len(episodes)))
        random.Random(seed).shuffle(self.order)

    def batch(self, it: int) -> list[Episode]:
        n, k = len(self.order), self.per_step
        return [self.episodes[self.order[(it * k + j) % n]] for j in range(k)] if n else []


def served_metrics(batch: list[Episode]) -> dict[str, float]:
    """The metrics row's ``served/*`` of an update that trained on ``batch``."""
    if not batch:
        return {}
    return {
        "served/episodes": float(len(batch)),
        "served/reward_mean": sum(e.reward for e in batch) / len(batch),
        "served/actions": float(sum(len(e.acted) for e in batch)),
    }


def load_pool(ctx, agents) -> ServedPool | None:
    """``algo.served``'s pool for the run ``ctx``'s swarm ``agents`` (None without it), its report logged; no usable
    episode with ``algo.served_only`` is a :class:`ConfigError` (there would be nothing to train on)."""
    from loguru import logger

    cfg, a = ctx.cfg, ctx.cfg.algo
    paths = list(a.get("served") or [])
    if not paths:
        return None
    held_out = {s for split in ("eval", "dev") for s in ctx.domain.episode_seeds(ctx.task, split)}
    episodes, report = load_served(paths, agents, float(cfg.model.temperature), str(cfg.task_name), held_out)
    if not episodes and a.get("served_only"):
        raise ConfigError(f"algo.served_only=true, but no served episode can be trained on: {report.summary()}")
    (logger.info if episodes else logger.warning)("algo.served: {}", report.summary())
    per_step = a.get("served_per_step") or a.envs_per_step
    return ServedPool(episodes, int(per_step), int(cfg.seed))
