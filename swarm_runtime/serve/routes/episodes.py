"""Episodes: ``POST /v1/episodes`` (a whole server-side episode, as JSON or as JSON lines per turn with
``stream``; or a client-side episode opened, ``"env": "client"``), ``GET /v1/episodes[?status=S]``,
``GET /v1/episodes/{id}``, ``DELETE /v1/episodes/{id}`` (cancel: its owner only) and
``POST /v1/episodes/{id}/reward`` (a client-side episode's reward, posted once after its last report said
``reward_later``: its owner only)."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from swarm_runtime.serve.admission import client_of, new_episode
from swarm_runtime.serve.episodes import ServedEpisode
from swarm_runtime.serve.requests import EpisodeRequest, RewardRequest
from swarm_runtime.serve.validate import validated

router = APIRouter()


def http_status(ep: ServedEpisode) -> int:
    return {"done": 200, "degraded": 200, "cancelled": 409}.get(ep.status, 503)


def get_episode(gw, eid: str) -> ServedEpisode:
    ep = gw.episodes.get(eid)
    if ep is None:
        raise HTTPException(
            404,
            f"unknown episode {eid!r} (episodes that ended are kept "
            f"{max(60.0, float(gw.s.episode_idle_s)):g}s; every ended episode is in "
            "serve/episodes.jsonl)",
        )
    return ep


async def played(gw, ep: ServedEpisode):
    """A server-side episode played to its end (this request cut off does not stop it): its summary and turns."""
    task = gw.play(ep)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():  # this request was cancelled, not the episode
            raise
    return JSONResponse(gw.summary(ep, turns=True), status_code=http_status(ep))


def streamed(gw, ep: ServedEpisode) -> StreamingResponse:
    """A server-side episode played in the background, streamed: a JSON line per turn, then its summary."""
    queue: asyncio.Queue = asyncio.Queue()

    async def runner():
        try:
            await gw.run_episode(ep, queue.put_nowait)
        finally:
            await queue.put(None)

    ep.runner = asyncio.ensure_future(runner())

    async def lines():
        while True:
            rec = await queue.get()
            if rec is None:
                break
            yield json.dumps({"id": ep.id, **rec}, default=float) + "\n"
        yield json.dumps({**gw.summary(ep), "final": True}, default=float) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.post("/v1/episodes")
async def episodes(request: Request):
    gw = request.app.state.gateway
    req = validated(EpisodeRequest, await request.body())
    ep = await new_episode(gw, req, client_of(request))
    if req.env in ("client", "intercept"):
        body = {
            "id": ep.id,
            "status": "running",
            "task": ep.task_name,
            "seed": ep.seed,
            "noise": str(ep.noise),
            "agents": [a.name for a in gw.pop.agents],
        }  # an intercept episode's OpenAI base URL: /v1/episodes/{id} (its chat: .../chat/completions)
        return {**body, "base_url": f"/v1/episodes/{ep.id}"} if ep.intercept else body
    return streamed(gw, ep) if req.stream else await played(gw, ep)


@router.get("/v1/episodes")
def list_episodes(request: Request, status: str | None = None):
    """Recent episodes without their turns (``?status=interrupted``: those a crash interrupted)."""
    gw = request.app.state.gateway
    rows = [{k: v for k, v in b.items() if k != "turns"} for b in gw.past.values()]
    rows += [gw.summary(e) for e in gw.episodes.values()]
    return {"episodes": [r for r in rows if status is None or r["status"] == status]}


@router.get("/v1/episodes/{eid}")
def episode_state(eid: str, request: Request):
    gw = request.app.state.gateway
    if eid in gw.past and eid not in gw.episodes:
        return gw.past[eid]
    return gw.summary(get_episode(gw, eid), turns=True)


@router.delete("/v1/episodes/{eid}")
async def cancel(eid: str, request: Request):
    gw = request.app.state.gateway
    ep = get_episode(gw, eid)
    if ep.client != client_of(request):
        raise HTTPException(403, f"episode {eid} belongs to another client")
    if ep.status != "running":
        raise HTTPException(409, f"episode {eid} is {ep.status} already")
    why = "cancelled by its client (DELETE)"
    if ep.env is not None:  # a server-side episode: its task ends it
        await gw.end(ep, "cancelled", why)
    else:  # a client-side one: after the turn in progress, if any
        async with ep.lock:
            if ep.status == "running":
                await gw.end(ep, "cancelled", why)
    return gw.summary(ep, turns=True)


@router.post("/v1/episodes/{eid}/reward")
async def reward(eid: str, request: Request):
    """The reward of a client-side episode whose last report said ``reward_later``: added to its last turn's, and
    the episode ends (``done``, or ``degraded``) with it. Once: a second post, or one for an episode that did not
    ask for it (still playing, server-side, or ended), gets 409; an unknown one 404; another client's 403."""
    gw = request.app.state.gateway
    req = validated(RewardRequest, await request.body())
    if eid in gw.past and eid not in gw.episodes:
        raise HTTPException(409, f"episode {eid} is {gw.past[eid]['status']}: no reward is due")
    ep = get_episode(gw, eid)
    if ep.client != client_of(request):
        raise HTTPException(403, f"episode {eid} belongs to another client")
    async with ep.lock:
        if ep.reward_due and not ep.records:
            raise HTTPException(409, f"episode {eid} has no call recorded yet: nothing to credit the reward to")
        if not ep.reward_due:
            why = "still playing" if ep.status == "running" else f"{ep.status} already"
            raise HTTPException(
                409,
                f"episode {eid} is {why}: no reward is due (a client-side episode asks for one with "
                '"reward_later": true on the report that ends it; a reward is taken once)',
            )
        gw.give_reward(ep, req.reward)
    return gw.summary(ep, turns=True)
