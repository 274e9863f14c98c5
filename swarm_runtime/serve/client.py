"""An async client of a served swarm, and ``swarm eval RUN serve.url=...``.

    async with SwarmClient("http://127.0.0.1:8000") as c:
        ep = await c.episode(seed=1000)                     # a whole server-side episode
        eid = (await c.open())["id"]                        # a client-side one: your world, the swarm's turns
        move = await c.turn(eid, observation="...", reward=0.0)

The held-out evaluation through a service plays the same (seed, run) grid as :func:`swarm_runtime.
evaluate.evaluate` with ``common_random_numbers`` (run ``r`` on seed ``s`` draws noise
``key_hash(eval seed, r, s)``), so a fault-free served evaluation equals the in-process
``swarm eval RUN eval.common_random_numbers=true`` episode by episode.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence


class ServeError(RuntimeError):
    """The service answered with an error (its message is kept)."""


class SwarmClient:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0):
        import httpx

        key = api_key if api_key is not None else os.environ.get("SWARM_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout, limits=httpx.Limits(max_connections=256)
        )

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.http.aclose()

    async def _json(self, method: str, path: str, **kw) -> dict:
        r = await self.http.request(method, path, **kw)
        try:
            body = r.json()
        except json.JSONDecodeError:
            body = {"detail": r.text}
        if not isinstance(body, dict):
            body = {"detail": body}
        if r.status_code >= 400 and not (path == "/v1/episodes" and "status" in body):
            raise ServeError(f"{method} {path}: HTTP {r.status_code}: {body.get('detail', body)}")
        return body

    async def health(self) -> dict:
        return await self._json("GET", "/health")

    async def agents(self) -> list[dict]:
        return (await self._json("GET", "/v1/swarm/agents"))["agents"]

    async def episode(self, **fields) -> dict:
        """A whole server-side episode (``seed``, ``noise``, ``task``, ``temperature``): its summary and turns."""
        return await self._json("POST", "/v1/episodes", json=fields)

    async def open(self, **fields) -> dict:
        return await self._json("POST", "/v1/episodes", json={"env": "client", **fields})

    async def cancel(self, episode_id: str) -> dict:
        """``DELETE /v1/episodes/ID``: end an episode this client opened (status ``cancelled``)."""
        return await self._json("DELETE", f"/v1/episodes/{episode_id}")

    async def episodes(self, status: str | None = None) -> list[dict]:
        """Recent episodes (``status="interrupted"``: those a gateway crash cut off), without turns."""
        return (await self._json("GET", "/v1/episodes", params={"status": status} if status else None))["episodes"]

    async def turn(
        self,
        episode_id: str,
        observation: str,
        reward: float = 0.0,
        valid: bool = True,
        done: bool = False,
        reward_later: bool = False,
    ) -> dict:
        """Report the last turn's outcome and what the world shows now; the next turn, or the summary once done
        (``reward_later``: with ``done``, the episode waits for :meth:`reward`)."""
        body = {"observation": observation, "reward": reward, "valid": valid, "done": done}
        return await self._json(
            "POST",
            f"/v1/episodes/{episode_id}/turns",
            json={**body, **({"reward_later": True} if reward_later else {})},
        )

    async def reward(self, episode_id: str, reward: float) -> dict:
        """A client-side episode's reward, once, after its last report said ``reward_later``."""
        return await self._json("POST", f"/v1/episodes/{episode_id}/reward", json={"reward": reward})


def to_episode(body: dict):
    """A service episode as the core's :class:`~swarm_runtime.core.episode.Episode` (what ``summarize`` reads)."""
    from swarm_runtime.core.auction import AuctionResult
    from swarm_runtime.core.episode import Episode, Turn

    index = {name: i for i, name in enumerate(body["agents"])}
    ep = Episode(
        int(body["seed"]),
        reward=float(body["reward"]),
        metrics=dict(body.get("metrics") or {}),
        unparsed_bids=int(body.get("unparsed_bids", 0)),
        invalid_actions=int(body.get("invalid_actions", 0)),
        reward_missing=bool(body.get("reward_missing", False)),
    )
    for rec in body["turns"]:
        w = index.get(rec["agent"]) if rec["agent"] is not None else None
        bids = [rec["bids"].get(n) for n in body["agents"]]
        ep.turns.append(
            Turn(
                rec["t"],
                bids,
                [None] * len(bids),
                [None] * len(bids),
                AuctionResult(w, None, float(rec["bid"] or 0.0)),
                action_text=rec["action"] or "",
                reward=float(rec.get("reward", 0.0)),
                valid=bool(rec.get("valid", True)),
            )
        )
    return ep


async def check_serves(c: SwarmClient, url: str, domain: str, task: str) -> dict:
    """The service's ``/health``, once it is known to serve ``domain``/``task`` (else a ConfigError naming both)."""
    from swarm_runtime.config.errors import ConfigError

    health = await c.health()
    if (health.get("domain"), health.get("task")) != (domain, task):
        raise ConfigError(
            f"the service at {url} serves {health.get('domain')}/{health.get('task')}, this run is {domain}/{task}"
        )
    return health


def run_against(url: str, work):
    """``asyncio.run(work)``, a coroutine talking to the service at ``url``: its errors (an error answer, no answer)
    as one ConfigError line naming the service."""
    from swarm_runtime.config.errors import ConfigError

    try:
        return asyncio.run(work)
    except ServeError as exc:
        raise ConfigError(str(exc)) from exc
    except OSError as exc:
        raise ConfigError(f"cannot reach the service at {url}: {exc}") from exc
    except Exception as exc:  # httpx transport errors
        if type(exc).__module__.startswith("httpx"):
            raise ConfigError(f"cannot reach the service at {url}: {type(exc).__name__}: {exc}") from exc
        raise


async def evaluate_served(
    url: str,
    seeds: Sequence[int],
    runs: int,
    seed: int,
    temperature: float | None,
    task: str | None,
    concurrency: int = 8,
    split: str = "any",
):
    """Play ``runs`` episodes of every held-out seed through the service; return (summary, episodes,
    bodies) as :func:`swarm_runtime.evaluation.heldout.evaluate` does, plus the service's raw answers.
    ``split``: the seeds' split as the service checks it (``any``: the caller chose them from its run's
    ``eval.split``; the service refuses seeds outside its held-out split unless told)."""
    from swarm_runtime.core.episode import Agent
    from swarm_runtime.core.noise import key_hash
    from swarm_runtime.evaluation.heldout import summarize

    grid = [(r, s) for r in range(runs) for s in seeds]
    sem = asyncio.Semaphore(max(1, int(concurrency)))
    async with SwarmClient(url) as c:

        async def one(r: int, s: int) -> dict:
            async with sem:
                fields = {"seed": int(s), "noise": str(key_hash(seed, r, s)), "split": split}
                if temperature is not None:
                    fields["temperature"] = float(temperature)
                if task is not None:
                    fields["task"] = task
                return await c.episode(**fields)

        bodies = await asyncio.gather(*(one(r, s) for r, s in grid))
    failed = [b for b in bodies if b.get("status") not in ("done", "degraded")]
    if failed:
        raise ServeError(f"{len(failed)} of {len(bodies)} served episodes did not finish: {failed[0].get('error')}")
    names = max((b["agents"] for b in bodies), key=len)
    agents = [Agent(n, n.split("@")[0].split("#")[0], None) for n in names]
    episodes = [to_episode(b) for b in bodies]
    return summarize(episodes, runs, agents), episodes, bodies
