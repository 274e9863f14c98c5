"""A bearer key on every route of a vLLM OpenAI server but ``/health`` (docs/reference/engine.md, "Keys").

vLLM 0.32's own ``--api-key`` (``VLLM_API_KEY``) guards only paths under ``/v1``, ``/v2``, ``/inference`` and
``/cohere``: its SageMaker routes (``POST /adapters``, ``DELETE /adapters/{name}``: LoRA load and unload;
``POST /invocations``), ``/tokenize``, ``/metrics`` and the rest answer anyone. The run's servers get this ASGI
middleware (``--middleware swarm_vllm_guard.BearerGuard``, this folder on the server's ``PYTHONPATH``), which
demands ``Authorization: Bearer <key>`` (the key in ``VLLM_API_KEY``, compared in constant time) on every HTTP
and WebSocket path, every method, except ``GET /health``: the readiness probe the run itself polls while the server
starts (it says only that the server is up). ``/metrics`` is guarded too (it names the loaded adapters and counts
their traffic); a scraper sends the key.

Standalone on purpose: it runs inside vLLM's own virtualenv, which has no swarm_runtime (stdlib only). Without a
key in ``VLLM_API_KEY`` it refuses to be built (the server then fails to start instead of serving unguarded).
"""

from __future__ import annotations

import hashlib
import hmac
import os

#: The environment variable holding the key (vLLM's own, so one key guards both layers).
KEY_ENV = "VLLM_API_KEY"
#: Paths answered without the key (exact, after the ASGI ``root_path``), with the methods allowed there.
OPEN = {"/health": frozenset({"GET", "HEAD"})}
#: The body of a refusal.
REFUSED = b'{"error": "Unauthorized: this server needs Authorization: Bearer <its key>"}'


def digest(token: bytes) -> bytes:
    """What is compared (fixed length, so the comparison's time says nothing of the key's length)."""
    return hashlib.sha256(token).digest()


def bearer(headers) -> bytes | None:
    """The token of the first ``Authorization: Bearer <token>`` header of an ASGI header list, else None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = bytes(value).strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" and token.strip() else None
    return None


def route_path(scope: dict) -> str:
    """The request's path without the server's ``root_path`` (``--root-path``), as vLLM's own check reads it."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


def allowed(scope: dict, key_digest: bytes) -> bool:
    """Whether a request (an ASGI ``http`` or ``websocket`` scope) may pass: an open path and method, or the key."""
    if scope["type"] == "http" and scope.get("method", "GET") in OPEN.get(route_path(scope), ()):
        return True
    token = bearer(scope.get("headers") or ())
    return token is not None and hmac.compare_digest(digest(token), key_digest)


class BearerGuard:
    """ASGI middleware: a request without the key gets 401 (a WebSocket is closed before it is accepted)."""

    def __init__(self, app, key: str | None = None):
        key = os.environ.get(KEY_ENV, "") if key is None else key
        if not key:
            raise RuntimeError(f"swarm_vllm_guard.BearerGuard: ${KEY_ENV} is empty; it refuses to serve without a key")
        self.app, self._digest = app, digest(key.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or allowed(scope, self._digest):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return None
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(REFUSED)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": REFUSED})
        return None
