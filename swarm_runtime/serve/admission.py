"""A new episode's admission (``POST /v1/episodes``): its task and seed checked (held-out seeds by default), the
gateway's limits (shutting down, a client's open client-side episodes, ``serve.max_episodes`` with a bounded
wait), its noise drawn, its env made (server-side), and its start journaled."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import time

from fastapi import HTTPException
from loguru import logger

from swarm_runtime.core.env import close_all
from swarm_runtime.core.loop import make_env
from swarm_runtime.core.noise import key_hash
from swarm_runtime.serve.episodes import ServedEpisode, new_id
from swarm_runtime.serve.requests import EpisodeRequest
from swarm_runtime.serve.state import Gateway
from swarm_runtime.serve.validate import BadRequest


def refuse(status: int, message: str, retry_after: float | None = None) -> HTTPException:
    """An HTTP refusal, with ``Retry-After`` (whole seconds, at least 1) when a retry may succeed."""
    headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
    return HTTPException(status, message, headers=headers)


def client_of(request) -> str:
    """Who is asking, for admission: the API key's hash when one is sent, else the peer address."""
    auth = request.headers.get("authorization")
    if auth:
        return "key:" + hashlib.sha256(auth.encode()).hexdigest()[:12]
    return "addr:" + (request.client.host if request.client else "?")


def check_seed(gw: Gateway, req: EpisodeRequest, task_name: str, task) -> int:
    """The episode's seed: the request's, which must be in its split (``eval`` by default; ``any``: any seed),
    else the split's first."""
    split = req.split or "eval"
    if req.seed is None:
        if split == "any":
            raise BadRequest("split 'any' needs a seed", param="seed", status=422)
        return gw.domain.episode_seeds(task, split)[0]
    if split == "any":
        return int(req.seed)
    key = (task_name, split)
    if key not in gw.seed_sets:
        try:
            gw.seed_sets[key] = set(gw.domain.episode_seeds(task, split))
        except ValueError as exc:
            raise BadRequest(str(exc), param="split", status=422) from None
    if req.seed not in gw.seed_sets[key]:
        seeds = sorted(gw.seed_sets[key])
        span = f"{seeds[0]}-{seeds[-1]}" if seeds else "none"
        raise BadRequest(
            f"seed {req.seed} is not in the {split} split of {task_name} ({span}); held-out "
            'seeds are the default, send "split": "train", "dev" or "any" to play another',
            param="seed",
            status=422,
        )
    return int(req.seed)


async def admit(gw: Gateway, req: EpisodeRequest, cid: str) -> None:
    """Admission: shutting down 503; a client's open client-side episodes capped; at serve.max_episodes,
    wait up to serve.queue_wait_s for a slot, then 429. Both with Retry-After."""
    s = gw.s
    if not gw.accepting:
        raise refuse(503, "the gateway is shutting down: no new episodes", retry_after=float(s.shutdown_grace_s))
    if req.env in ("client", "intercept"):
        mine = [e for e in gw.episodes.values() if e.status == "running" and e.env is None and e.client == cid]
        if len(mine) >= int(s.client_episodes):
            now = time.monotonic()
            wait = min(float(s.episode_idle_s) - (now - e.last_used) for e in mine)
            raise refuse(
                429,
                f"this client has {len(mine)} client-side episodes open, the limit is "
                f"serve.client_episodes={s.client_episodes}: end them (done, or DELETE "
                "/v1/episodes/ID) or let them expire",
                retry_after=max(1.0, wait),
            )
    end = time.monotonic() + float(s.queue_wait_s)
    while gw.running_count() >= int(s.max_episodes):
        if time.monotonic() >= end or not gw.accepting:
            raise refuse(
                429,
                f"{gw.running_count()} episodes running, the limit is serve.max_episodes="
                f"{s.max_episodes} (waited serve.queue_wait_s={s.queue_wait_s:g}s for a slot)",
                retry_after=max(1.0, float(s.queue_wait_s)),
            )
        await asyncio.sleep(0.05)


def start_env(gw: Gateway, ep: ServedEpisode) -> None:
    """A server-side episode's env, reset on its seed (a seed the env refuses is a 422 naming it)."""
    try:
        ep.env = make_env(gw.domain, ep.task)
        ep.env.reset(ep.seed)
    except BaseException as exc:
        close_all([ep.env] if ep.env is not None else [], quiet=True)
        if isinstance(exc, ValueError):
            raise BadRequest(f"seed {ep.seed}: {exc}", param="seed", status=422) from exc
        raise


async def new_episode(gw: Gateway, req: EpisodeRequest, cid: str) -> ServedEpisode:
    """The episode ``req`` asks for, admitted, registered and journaled (not started)."""
    cfg, domain = gw.cfg, gw.domain
    task_name = req.task or cfg.task_name
    if task_name not in domain.task_names():
        raise BadRequest(
            f"unknown task {task_name!r}; valid: {', '.join(domain.task_names())}", param="task", status=422
        )
    task = cfg.task if task_name == cfg.task_name else domain.task_config(task_name)
    seed = check_seed(gw, req, task_name, task)
    await admit(gw, req, cid)
    noise = (
        key_hash(seed, int.from_bytes(os.urandom(8), "little"))
        if req.noise is None
        else int(req.noise) & ((1 << 64) - 1)
    )
    max_decisions = int(req.max_decisions or task.max_decisions)
    ep = ServedEpisode(new_id(), seed, noise, task_name, task, max_decisions, temperature=req.temperature)
    ep.client = cid
    if req.env == "server":
        start_env(gw, ep)
    ep.intercept = ep.reward_due = req.env == "intercept"  # its calls are its turns, its reward ends it
    gw.episodes[ep.id] = ep
    gw.journal.start(ep, req.env, cid)
    logger.info("episode {} starts: {} seed {} ({} env)", ep.id, task_name, seed, req.env)
    return ep
