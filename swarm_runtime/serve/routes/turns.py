"""A client-side episode's turns: ``POST /v1/episodes/{id}/turns`` ``{observation, reward, valid?, done?}``
reports what the client's world did with the last action and shows now; the answer is the next decided turn
``{agent, role, bid, action, ...}``, or the episode's summary once it ended (``done``, or ``max_decisions``). A
report that ends the episode with ``reward_later`` leaves it waiting for its reward
(``POST /v1/episodes/{id}/reward``, :mod:`swarm_runtime.serve.routes.episodes`); it ends then.

The episode's loop runs in a task of its own from the first turn on, suspended between requests at its world
step (:class:`~swarm_runtime.serve.client_world.ClientWorld`): a report is the step's result, which the core
settles."""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Request

from swarm_runtime.core.loop import finish_episode
from swarm_runtime.serve.client_world import ClientWorld
from swarm_runtime.serve.episodes import ServedEpisode
from swarm_runtime.serve.requests import TurnRequest
from swarm_runtime.serve.routes.episodes import get_episode
from swarm_runtime.serve.validate import validated

router = APIRouter()

#: What a decided turn's answer carries of its record.
TURN_FIELDS = ("t", "agent", "role", "bid", "action", "bids", "missed", "failed")


def ended(ep: ServedEpisode) -> HTTPException:
    """An episode that ended otherwise than done: 410 Gone (expired for want of turns, or interrupted), else 409."""
    return HTTPException(
        410 if ep.status in ("expired", "interrupted") else 409,
        f"episode {ep.id} is {ep.status}" + (f": {ep.error}" if ep.error else ""),
    )


async def next_turn(gw, ep: ServedEpisode, req: TurnRequest) -> dict | None:
    """The next decided turn's record after the client's report ``req``, or None when the episode ended. The
    first report starts the episode's loop on its observation (or ends the episode, when it says done)."""
    if ep.world is None:
        if req.reward_later:
            raise HTTPException(422, "reward_later needs a played turn to credit: this report is the episode's first")
        ep.world = ClientWorld(req.observation)
        if req.done:
            ep.world.done = True
            finish_episode(ep.episode, ep.world)
            gw.finish(ep, "done")
            return None
        gw.play(ep)
    else:
        ep.reward_due = req.reward_later
        ep.world.tell(req)
    return await ep.world.next_decision(ep.runner)


@router.post("/v1/episodes/{eid}/turns")
async def turn(eid: str, request: Request):
    gw = request.app.state.gateway
    req = validated(TurnRequest, await request.body())
    if eid in gw.past and eid not in gw.episodes:
        past = gw.past[eid]
        raise HTTPException(
            410, f"episode {eid} is {past['status']}: {past['error']} (seed {past['seed']}, noise {past['noise']})"
        )
    ep = get_episode(gw, eid)
    if ep.env is not None:
        raise HTTPException(409, f"episode {eid} is a server-side episode; its turns are played by the gateway")
    if ep.intercept:
        raise HTTPException(
            409,
            f"episode {eid} is an intercept episode: its turns are its chat calls (/v1/episodes/{eid}/chat/completions)",
        )
    async with ep.lock:
        if ep.status != "running":
            raise ended(ep)
        if ep.reward_due:
            raise HTTPException(409, f"episode {eid} played its last turn; its reward is due: POST it to /reward")
        ep.last_used = time.monotonic()
        rec = await next_turn(gw, ep, req)
        if rec is not None:
            return {"id": ep.id, **{k: rec[k] for k in TURN_FIELDS}}
        if ep.status in ("done", "degraded") or ep.reward_due:
            return gw.summary(ep)
        if ep.status == "failed":
            raise HTTPException(503, ep.error)
        raise ended(ep)
