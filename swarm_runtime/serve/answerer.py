"""The async answerer of a served episode's loop (:class:`TurnAnswerer`): the transport between the core loop
(:class:`swarm_runtime.serve.turns.ServedTurns` on :meth:`TurnEngine.arun
<swarm_runtime.core.engine.TurnEngine.arun>`) and the agents over HTTP, the population and the episode's world.

- :class:`~swarm_runtime.serve.turns.Bidders`: the agents that are up, after waiting up to ``agent_wait`` for
  one (else :class:`NoAgentsLeft`);
- ``Batch("bid")``: every agent's bid prompt at once, as an OpenAI completion with the row's keyed ``seed``;
  those that answer within ``bid_deadline`` bid, the others are absent (``None``, as a dropped-out agent in
  process);
- ``Batch("act")``: the winner's action prompt to its worker; a failure is ``None`` (the loop withdraws its bid
  and the coordinator picks again: the runner-up);
- :class:`~swarm_runtime.core.engine.Steps`: the turn is decided: its record (who bid, missed, failed, acted;
  latency and the workers' compute) is made and counted, then the world steps: a server-side env in process
  (:func:`~swarm_runtime.core.engine.play_steps`), or the client's world
  (:meth:`swarm_runtime.serve.client_world.ClientWorld.exchange`).

The core settles each turn (:func:`swarm_runtime.core.loop.settle`); :meth:`TurnAnswerer.settled` (the loop's
``on_turn``) then completes its record with the turn's reward and validity.

Every bid and action request asks for the tokens too (``return_token_ids``, ``logprobs`` 0: vLLM's completions
extensions, which our worker speaks): each answered request's :func:`sample` (its prompt's and its reply's token ids,
the reply's log-probs and whose basis they are in, the version that answered) is kept per turn in ``ep.samples`` beside ``ep.records``, for the
journal and the transcript (what training on served traffic needs), never in the API's turn answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from loguru import logger

from swarm_runtime.core.engine import Batch, Step, Steps, play_steps
from swarm_runtime.core.protocols import Bid, Response, Row
from swarm_runtime.models.bids import parse_bid
from swarm_runtime.serve.population import AgentHandle
from swarm_runtime.serve.protocol import seed_for
from swarm_runtime.serve.turns import Bidders

#: what every bid and action request asks for besides its text: the token ids (prompt and reply) and the sampled
#: tokens' log-probs (vLLM's completions extensions), in the learner's basis on our worker (``swarm_logprobs``:
#: before its masks, serve/logprobs.py, and it says so in its answer; vLLM ignores the field and answers in its
#: ``--logprobs-mode``: :func:`sample`'s ``logprobs_basis``)
TOKEN_FIELDS = {"return_token_ids": True, "logprobs": 0, "swarm_logprobs": "learner"}


def sample(
    answer: dict, version: str | None, prompt: str | None = None, messages: list | None = None, temperature=None
) -> dict:
    """What training needs of one answered request, from the server's ``answer``: a completion for the text ``prompt``
    (the gateway's bids and actions), or, with ``messages``, a chat completion (an intercepted call,
    swarm_runtime/serve/routes/intercept.py, with the ``temperature`` the harness asked for). ``{"version", "prompt",
    "text", "prompt_ids", "token_ids", "logprobs", "logprobs_basis"}`` (a chat's also ``"temperature"`` and
    ``"messages"``, and ``"prompt"`` None); a field the server did not return is None (a server without vLLM's
    extensions answers text only). ``logprobs_basis``: ``"learner"`` when the answer says its log-probs are in the
    learner's basis (our worker echoes ``"swarm_logprobs": "learner"``), else ``"sampler"`` (a vLLM agent's
    ``--logprobs-mode``, or any other server's): swarm_runtime/learn/served.py trains on those only at temperature 1."""
    choice = answer["choices"][0]
    if messages is None:
        lps = (choice.get("logprobs") or {}).get("token_logprobs")
        head = {"version": version, "prompt": prompt, "text": choice.get("text")}
        prompt_ids = choice.get("prompt_token_ids")
    else:
        content = (choice.get("logprobs") or {}).get("content")
        lps = None if content is None else [c["logprob"] for c in content]
        head = {"version": version, "temperature": float(temperature), "messages": messages, "prompt": None}
        head["text"] = (choice.get("message") or {}).get("content")
        prompt_ids = answer.get("prompt_token_ids")  # vLLM's chat answer carries them at the top level
    return {
        **head,
        "prompt_ids": prompt_ids,
        "token_ids": choice.get("token_ids"),
        "logprobs": [None if v is None else float(v) for v in lps] if lps is not None else None,
        "logprobs_basis": "learner" if choice.get("swarm_logprobs") == "learner" else "sampler",
    }


def new_samples() -> dict:
    """A turn's samples: each agent's bid by name, and the action that was taken (None: no winner acted)."""
    return {"bids": {}, "action": None}


class NoAgentsLeft(RuntimeError):
    """Every agent of the population is down, draining or removed."""


def choice(texts: list[str]) -> dict:
    """A constrained choice in both of vLLM's spellings: ``guided_choice`` (before 0.12, and our worker)
    and ``structured_outputs.choice`` (0.10.2 on; 0.12 dropped the old field and ignores it silently)."""
    return {"guided_choice": list(texts), "structured_outputs": {"choice": list(texts)}}


async def up_agents(pop, wait_s: float) -> list[AgentHandle]:
    """The agents of ``pop`` that are up, waiting up to ``wait_s`` for one; :class:`NoAgentsLeft` naming every
    agent's state after that."""
    end = time.monotonic() + wait_s
    while True:
        up = pop.bidders()
        if up:
            return up
        if time.monotonic() >= end:
            states = ", ".join(f"{a.name} {a.status}" for a in pop.agents) or "none registered"
            raise NoAgentsLeft(f"no agent left to bid: every agent has been down for {wait_s:g}s ({states})")
        await asyncio.sleep(0.05)


class TurnAnswerer:
    """Answers every request of one served episode's loop (module docstring). Bids: every row at once; those
    not answered within ``bid_deadline`` are cancelled and answered ``None`` (a missed bid: counted, and the
    agent marked down after ``drop_after_misses`` in a row), as are those whose request failed (counted as a
    failure, the agent marked down). Actions: a failed request is ``None`` (counted as a failure and a
    failover, the agent marked down). Keeps the workers' reported compute on the critical path: the slowest
    answered bid plus the action.

    ``on_turn(record)``: a turn's record joined ``ep.records`` (server-side: settled; client-side: decided, its
    outcome to come); ``on_reward(record)``: a client-side turn's record got the client's report."""

    def __init__(self, engine, ep, on_turn: Callable | None = None, on_reward: Callable | None = None):
        self.engine, self.ep, self.on_turn, self.on_reward = engine, ep, on_turn, on_reward
        #: the episode's own sampling temperature, else the run's
        self.temperature = float(engine.opts.temperature if ep.temperature is None else ep.temperature)
        self.bid_compute = 0.0  #: seconds: the slowest answered bid's compute (this turn)
        self.act_compute = 0.0  #: seconds: the answered action's compute (this turn)
        self.started = 0.0  #: perf_counter when this turn's bidders were known
        self.record: dict | None = None  #: the turn being played
        self.versions: dict[str, str | None] = {}  #: this turn: the version (``Role@vN``) that answered each agent
        self.samples = new_samples()  #: this turn: each answered request's :func:`sample`

    async def __call__(self, request) -> list:
        if isinstance(request, Bidders):
            return [await self.bidders() for _ in request.rows]
        if isinstance(request, Steps):
            return [await self.step(s) for s in request.rows]
        if isinstance(request, Batch):
            return await (self.bids(request.rows) if request.kind == "bid" else self.acts(request.rows))
        raise TypeError(f"a served episode cannot answer a {type(request).__name__} request")

    # ------------------------------------------------------------------ who bids
    async def bidders(self) -> list[AgentHandle]:
        up = await up_agents(self.engine.pop, self.engine.opts.agent_wait_s)
        self.started, self.bid_compute, self.act_compute = time.perf_counter(), 0.0, 0.0
        self.versions, self.samples = {}, new_samples()
        return up

    # ------------------------------------------------------------------ bids and actions over HTTP
    async def _post(self, row: Row, body: dict, timeout: float) -> tuple[str, float, dict]:
        """The request's text, the worker's compute (seconds) and its :func:`sample`."""
        a: AgentHandle = row.context
        body = {
            "model": a.model_id,
            "prompt": row.prompt,
            "temperature": self.temperature,
            "seed": seed_for(*row.key),
            **(TOKEN_FIELDS if self.engine.opts.journal_tokens else {}),
            **body,
        }
        url, using, label = a.url, self.engine.pop.using, a.label
        a.inflight += 1
        using[url, body["model"]] += 1
        try:
            answer, headers = await self.engine.client.post_json(url, "/v1/completions", body, timeout)
            ms = float(headers.get("x-swarm-compute-ms", 0.0))
            self.versions[a.name] = label
            return answer["choices"][0]["text"], ms / 1000, sample(answer, label, row.prompt)
        finally:
            a.inflight -= 1
            using[url, body["model"]] -= 1

    async def _bid(self, row: Row) -> tuple[Bid, float]:
        opts = self.engine.opts
        if opts.bid_mode == "logits":
            body = {"max_tokens": 1, **choice(self.engine.bid_texts)}
        else:
            body = {"max_tokens": opts.max_bid_tokens, "swarm_kind": "bid"}
        text, compute, drawn = await self._post(row, body, opts.bid_deadline_s)
        level, parsed = parse_bid(text, opts.bid_levels)
        return Bid(text, None, level=level, parsed=parsed), compute, drawn

    async def bids(self, rows: list[Row]) -> list[Bid | None]:
        eng = self.engine
        tasks = [asyncio.ensure_future(self._bid(row)) for row in rows]
        done, pending = await asyncio.wait(tasks, timeout=eng.opts.bid_deadline_s)
        for task in pending:
            task.cancel()
        answers: list[Bid | None] = []
        for task, row in zip(tasks, rows):
            a: AgentHandle = row.context
            if task in done and task.exception() is None:
                bid, compute, drawn = task.result()
                answers.append(bid)
                self.samples["bids"][a.name] = drawn
                self.bid_compute = max(self.bid_compute, compute)
                a.misses = 0
                continue
            answers.append(None)
            with eng.metrics.lock:
                eng.metrics.missed_bids[a.name] += 1
            if task in pending:
                eng.pop.note_miss(a)
            else:
                with eng.metrics.lock:
                    eng.metrics.failures[(a.name, "bid")] += 1
                eng.pop.mark_down(a, f"bid request failed: {type(task.exception()).__name__}: {task.exception()}")
        return answers

    async def acts(self, rows: list[Row]) -> list[Response | None]:
        return [await self._act(row) for row in rows]

    async def _act(self, row: Row) -> Response | None:
        eng, a = self.engine, row.context
        body = {"max_tokens": eng.opts.max_action_tokens}
        if eng.opts.constrained_actions:
            choices = eng.domain.action_choices(self.ep.task, a.role)
            if choices:
                body.update(choice(list(choices)))
        try:
            text, self.act_compute, self.samples["action"] = await self._post(row, body, eng.opts.action_timeout_s)
            return Response(text, None)
        except Exception as exc:  # the winner failed mid-action: the loop hands the turn to the next bidder
            with eng.metrics.lock:
                eng.metrics.failures[(a.name, "action")] += 1
                eng.metrics.failovers += 1
            eng.pop.mark_down(a, f"action request failed: {type(exc).__name__}: {exc}")
            logger.warning(
                "episode {} turn {}: {} failed to act ({}); next bidder",
                self.ep.id,
                self.ep.t,
                a.name,
                type(exc).__name__,
            )
            return None

    # ------------------------------------------------------------------ the decided turn, its world, its record
    def decided(self, step: Step) -> dict:
        """The record of a decided turn (``step``), before its world steps; counted in the metrics."""
        latency = time.perf_counter() - self.started
        turn, decided, res = step.turn, step.decided, step.turn.auction
        agents = self.engine.pop.agents
        winner = agents[res.winner] if res.winner is not None else None
        compute = self.bid_compute + self.act_compute
        metrics = self.engine.metrics
        with metrics.lock:
            metrics.turns += 1
            metrics.skipped_turns += int(winner is None)
            metrics.turn_latency.observe(latency)
            metrics.overhead.observe(max(0.0, latency - compute))
        return {
            "t": turn.t,
            "bids": {agents[i].name: b for i, b in enumerate(turn.bids) if b is not None},
            "missed": [agents[i].name for i in decided.missed],
            "failed": [agents[i].name for i in decided.failed],
            "agent": winner.name if winner else None,
            "role": winner.role if winner else None,
            "bid": res.winning_bid if winner else None,
            "action": turn.action_text if winner else None,
            "versions": dict(self.versions),
            "latency_ms": round(latency * 1000, 3),
            "compute_ms": round(compute * 1000, 3),
        }

    async def step(self, step: Step):
        """The decided turn's world step: a server-side env steps in process; a client-side turn is told to the
        client (its record joins the episode now, with no outcome yet) and the client's report is the result."""
        self.record = self.decided(step)
        if self.ep.env is not None:
            return play_steps([step])[0]
        self.record.update(reward=0.0, valid=True)
        self._joined(self.record)
        self.ep.pending = step.turn
        return await self.ep.world.exchange(self.record)

    def settled(self, _live, turns: dict) -> None:
        """The loop's ``on_turn``: the core settled the turn (reward, validity, log, count, the episode's end);
        its record takes the turn's reward and validity."""
        (turn,) = turns.values()
        record = self.record
        record.update(reward=turn.reward, valid=turn.valid)
        if self.ep.env is not None:
            self._joined(record)
            return
        self.ep.pending = None
        if self.on_reward is not None:
            self.on_reward(record)

    def _joined(self, record: dict) -> None:
        self.ep.records.append(record)
        self.ep.samples.append(self.samples)
        self.ep.last_used = time.monotonic()
        if self.on_turn is not None:
            self.on_turn(record)
