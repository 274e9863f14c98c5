"""Intercept mode: ``POST /v1/episodes/{id}/chat/completions``, an external agent harness's LLM calls recorded as an
episode's turns (docs/guides/serve.md, "Intercept mode").

The harness runs its own loop and tools and opens an episode with ``{"env": "intercept"}``; its OpenAI client then
points at ``/v1/episodes/{id}`` as its base URL, so each ``chat.completions.create(model=AGENT_OR_ROLE, ...)`` comes
here. The gateway sends it on to that agent's worker (the named agent, or an up agent of the named role), asking
also for the reply's token ids and log-probs (as for its own turns: serve/answerer.py), answers the harness with the
worker's chat completion (``model``: the name asked for; token ids and log-probs only if the harness asked for
them) and records the call as the episode's next turn: who answered (its version), the reply as the action, no bids
(the harness chose the agent, not an auction), the messages, prompt and reply token ids and log-probs as its
sample (:func:`swarm_runtime.serve.answerer.sample`, as the gateway's own turns). Calls of one episode are taken one
at a time, in the order they come. The episode ends with its reward, posted once (``POST
/v1/episodes/{id}/reward``: added to the last call's turn), or with ``DELETE``, or expires after
``serve.episode_idle_s`` without a call; what training does with its turns: swarm_runtime/learn/served.py.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from swarm_runtime.core.auction import AuctionResult
from swarm_runtime.core.episode import Turn
from swarm_runtime.serve.answerer import TOKEN_FIELDS, sample
from swarm_runtime.serve.protocol import chat_model
from swarm_runtime.serve.routes.episodes import get_episode
from swarm_runtime.serve.routes.turns import ended
from swarm_runtime.serve.validate import BadRequest, validated

router = APIRouter()


def pick_agent(pop, model: str | None):
    """The agent a call names: an agent by name, else an up agent of a role (the least busy); a 404 naming the
    agents and roles when it names neither, a 503 when none of the role is up."""
    agents = [a for a in pop.agents if a.status != "removed"]
    named = next((a for a in agents if a.name == model), None)
    if named is not None:
        if named.status != "up":
            raise HTTPException(
                503, f"agent {model} is {named.status}; retry, or name its role to take any agent of it"
            )
        return named
    of_role = [a for a in agents if a.role == model]
    if not of_role:
        raise BadRequest(
            f"model {model!r} is no agent or role of this swarm; agents: {', '.join(a.name for a in agents)}; roles: "
            f"{', '.join(dict.fromkeys(a.role for a in agents))}",
            param="model",
            status=404,
        )
    up = [a for a in of_role if a.status == "up"]
    if not up:
        raise HTTPException(
            503, f"no agent of role {model} is up ({', '.join(f'{a.name} {a.status}' for a in of_role)})"
        )
    return min(up, key=lambda a: a.inflight)


def as_asked(answer: dict, body: dict, model: str) -> dict:
    """The worker's chat completion as the harness asked for it: ``model`` its name, and token ids and log-probs only
    if it asked for them (the log-probs with the worker's word on their basis, ``swarm_logprobs``, if it gave one)."""
    out = {**answer, "model": model}
    if not body.get("return_token_ids"):
        out.pop("prompt_token_ids", None)
    unasked = {k for k, ask in (("token_ids", "return_token_ids"), ("swarm_logprobs", "logprobs")) if not body.get(ask)}
    out["choices"] = [
        {
            **{k: v for k, v in c.items() if k not in unasked},
            "logprobs": c.get("logprobs") if body.get("logprobs") else None,
        }
        for c in answer["choices"]
    ]
    return out


@router.post("/v1/episodes/{eid}/chat/completions")
async def chat(eid: str, request: Request):
    gw = request.app.state.gateway
    req = validated(chat_model(), await request.body())
    ep = get_episode(gw, eid)
    if not ep.intercept:
        raise HTTPException(409, f'episode {eid} is a {ep.kind}-side episode: open one with {{"env": "intercept"}}')
    if req.stream:
        raise BadRequest("stream is not served in intercept mode: ask without it", param="stream")
    if req.n != 1:
        raise BadRequest(f"n={req.n}: a call is one turn, ask for n=1", param="n")
    body = req.model_dump(exclude_none=True)
    async with ep.lock:
        if ep.status != "running" or not ep.reward_due:
            raise ended(ep)
        a = pick_agent(gw.pop, req.model)
        t0 = time.perf_counter()
        tokens = {**TOKEN_FIELDS, "logprobs": True, "top_logprobs": 0} if gw.opts.journal_tokens else {}
        a.inflight += 1
        try:
            answer, headers = await gw.engine.client.post_json(
                a.url, "/v1/chat/completions", {**body, **tokens, "model": a.model_id}, gw.opts.action_timeout_s
            )
        except Exception as exc:  # the worker failed or refused: the harness is told, nothing is recorded
            gw.pop.mark_down(a, f"chat request failed: {type(exc).__name__}: {exc}")
            raise HTTPException(502, f"agent {a.name} failed to answer: {type(exc).__name__}: {exc}") from None
        finally:
            a.inflight -= 1
        latency = time.perf_counter() - t0
        n = len(gw.pop.agents)
        drawn = sample(answer, a.label, messages=body["messages"], temperature=req.temperature)
        turn = Turn(
            t=len(ep.records),
            bids=[None] * n,
            bid_tokens=[None] * n,
            bid_prompts=[None] * n,
            auction=AuctionResult(a.index, None),
            action_text=drawn["text"] or "",
        )
        rec = {
            "t": turn.t,
            "bids": {},
            "missed": [],
            "failed": [],
            "agent": a.name,
            "role": a.role,
            "bid": None,
            "action": drawn["text"],
            "versions": {a.name: a.label},
            "latency_ms": round(latency * 1000, 3),
            "compute_ms": round(float(headers.get("x-swarm-compute-ms", 0.0)), 3),
            "reward": 0.0,
            "valid": True,
        }
        gw.record_call(ep, turn, rec, {"bids": {}, "action": drawn})
    return JSONResponse(as_asked(answer, body, req.model or a.name))
