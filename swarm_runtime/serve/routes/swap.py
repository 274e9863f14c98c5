"""Live version swap (:mod:`swarm_runtime.serve.swap`): ``POST /v1/swarm/swap {"checkpoint"}`` (202: the swap runs in
the background), ``POST /v1/swarm/rollback`` (202) and ``GET /v1/swarm/swap`` (the versions and the swap's progress).

Refused before anything moves: a checkpoint that is not one of the run (422 naming the tags), one of another swarm
(422 naming what differs: :func:`swarm_runtime.serve.swap_check.check_swappable`), the checkpoint already served
by every agent (409), a swap or rollback while one runs (409), while a worker the gateway owns is starting or down
(killed, restarting: 409 naming it, with ``Retry-After``: retry once it is up), when no agent is the gateway's to move
(each served from a URL it was given, failed or draining: 409; a swap would move nothing), and while the gateway
drains (503)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from swarm_runtime.serve.requests import SwapRequest
from swarm_runtime.serve.resolved import checkpoint_tags, in_run
from swarm_runtime.serve.swap import begin, owned, unsteady
from swarm_runtime.serve.swap_check import check_swappable
from swarm_runtime.serve.validate import BadRequest, validated

router = APIRouter()


def swap_folder(setup, checkpoint: str) -> Path:
    """The checkpoint folder ``checkpoint`` names: a tag of the run (``latest`` too), or a folder inside the run."""
    path = in_run(setup, checkpoint, lambda ckpt: ckpt, lambda p: (p / "agents").is_dir())
    if path is not None:
        return path
    raise BadRequest(
        f"checkpoint {checkpoint!r} is neither a tag of the run nor a checkpoint folder (with agents/) inside the run "
        f"folder; tags: {', '.join(checkpoint_tags(setup))}",
        param="checkpoint",
        status=422,
    )


def check_steady(gw) -> None:
    """409 while a swap runs, a worker of the gateway is starting or down, or no agent is the gateway's to move;
    503 while the gateway drains."""
    if not gw.accepting:
        raise HTTPException(503, "the gateway is shutting down: no swap", headers={"Retry-After": "5"})
    if not any(owned(a) for a in gw.pop.agents):
        seen = [
            f"{a.name} ({a.url if a.version is None else a.status})" for a in gw.pop.agents if a.status != "removed"
        ]
        raise HTTPException(
            409,
            "no agent for a swap to move: a swap moves the agents on the gateway's own workers (up, or down and "
            f"restarting), and there is none: {', '.join(seen) or 'no agents'}; an agent served from a URL it was "
            "given is not the gateway's to move (POST /v1/swarm/agents with a checkpoint adds one that is)",
        )
    job = gw.versions.job
    if gw.versions.running():
        raise HTTPException(
            409,
            f"a {job.kind} to v{job.version} is running ({len(job.moved)} agents moved, {len(job.pending)} to go); "
            "see GET /v1/swarm/swap and retry when it has ended",
            headers={"Retry-After": "5"},
        )
    busy = unsteady(gw)
    if busy:
        raise HTTPException(
            409,
            f"workers are starting or down: {', '.join(busy)}; a swap waits for every worker of the gateway to be up "
            "(retry when GET /v1/swarm shows them up)",
            headers={"Retry-After": "5"},
        )


@router.get("/v1/swarm/swap")
def swap_state(request: Request):
    gw = request.app.state.gateway
    agents = {a.name: a.label for a in gw.pop.agents if a.status != "removed"}
    return {**gw.versions.public(), "agents": agents}


@router.post("/v1/swarm/swap", status_code=202)
async def swap(request: Request):
    gw = request.app.state.gateway
    req = validated(SwapRequest, await request.body())
    folder = swap_folder(gw.setup, req.checkpoint)
    served = gw.versions.folders[gw.versions.current]
    if not served.is_dir():  # deleted by hand (a run training in the folder keeps it: serve/serving.json)
        raise HTTPException(
            409, f"the checkpoint being served, {served}, is gone from disk: nothing to check a swap against"
        )
    # off the event loop: every weight is read (finite), which takes a while for a large model
    await asyncio.to_thread(check_swappable, served, folder)
    check_steady(gw)
    v = gw.versions
    n = v.version_of(folder)
    if n == v.current and not any(owned(a) and a.version != n for a in gw.pop.agents):
        raise HTTPException(409, f"every agent serves {folder} (v{n}) already")
    if n != v.current:  # a new version (or an older one, again): the next number
        n = max(v.folders) + 1
        v.folders[n] = folder
        v.previous, v.current = v.current, n
        gw.note_serving()
    return JSONResponse(begin(gw, "swap", n).public(), status_code=202)


@router.post("/v1/swarm/rollback", status_code=202)
async def rollback(request: Request):
    gw = request.app.state.gateway
    check_steady(gw)
    v = gw.versions
    if v.previous is None:
        raise HTTPException(409, f"nothing to roll back to: only v{v.current} ({v.folders[v.current]}) was served")
    v.previous, v.current = v.current, v.previous
    return JSONResponse(begin(gw, "rollback", v.current).public(), status_code=202)
