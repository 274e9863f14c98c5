"""The gateway's HTTP requests to its agents (:class:`AgentClients`): a JSON body out, a JSON body back."""

from __future__ import annotations

import json
from typing import Any


class WorkerError(RuntimeError):
    """A worker answered with an HTTP error status."""


class AgentClients:
    """The gateway's requests to its agents: one connection pool per agent URL, on httpcore (the
    HTTP engine under httpx) directly.

    Measured (docs/benchmarks.md): httpx's client layer (request building, cookies, auth and redirect
    handling) costs the gateway more CPU per request than the HTTP exchange itself, and one pool shared
    by every agent examines every connection it holds, and every request waiting for one, each time a
    request starts or ends. Agents are plain OpenAI-compatible servers, so the gateway needs none of that
    layer: a JSON body out, a JSON body back, with the same timeouts."""

    def __init__(self, max_connections: int = 256):
        self.max_connections = max_connections
        self._pools: dict[str, Any] = {}

    def pool(self, url: str):
        import httpcore

        p = self._pools.get(url)
        if p is None:
            p = self._pools[url] = httpcore.AsyncConnectionPool(
                max_connections=self.max_connections, max_keepalive_connections=self.max_connections
            )
        return p

    async def post_json(self, url: str, path: str, body: dict, timeout: float) -> tuple[dict, dict]:
        """POST ``body`` to ``url + path``; the JSON answer and its headers. Raises httpcore's
        exceptions (``ConnectError``, ``ReadTimeout``, ...) or :class:`WorkerError` for a status >= 400."""
        import httpcore

        data = json.dumps(body).encode()
        ext = {"timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}}
        for attempt in (0, 1):  # a keep-alive connection the worker closed meanwhile: once more, on a new one
            try:
                r = await self.pool(url).request(
                    "POST", url + path, content=data, extensions=ext, headers=[(b"content-type", b"application/json")]
                )
                break
            except (httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError):
                if attempt:  # keyed draws make the retry's answer the same as the first one's
                    raise
        if r.status >= 400:
            raise WorkerError(f"HTTP {r.status} from {url}{path}: {r.content[:300].decode(errors='replace')}")
        return json.loads(r.content), {k.decode().lower(): v.decode() for k, v in r.headers}

    async def forget(self, url: str) -> None:
        """Close the pool of an agent that left."""
        p = self._pools.pop(url, None)
        if p is not None:
            await p.aclose()

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            await p.aclose()
