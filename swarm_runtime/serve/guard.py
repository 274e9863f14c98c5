"""The gateway's ASGI guard (:class:`Guard`: the API key, the request-size bound, the body's content type, the count
of answers by status) and its error body (:func:`error_body`: ``detail`` and OpenAI's ``error`` object); a served
worker's (:class:`JsonBodies`: the body's content type alone, the same check: :func:`not_json`)."""

from __future__ import annotations

import hmac
import json

from swarm_runtime.serve.validate import GATEWAY_HEADER, openai_error

#: Paths a load balancer probes: no key, no data.
PROBES = ("/health/live", "/health/ready")


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict:
    """The gateway's error: ``detail`` (the message) and OpenAI's ``error`` object."""
    return {"detail": message, **openai_error(message, status, param, code)}


def is_json_type(content_type: bytes) -> bool:
    """A ``Content-Type`` header of JSON: ``application/json`` or ``application/*+json``, any parameters
    (``; charset=utf-8``)."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def not_json(headers: dict) -> str | None:
    """Why a request's body is not read as JSON, or None: it has one (a ``Content-Length`` over 0, or chunked) and a
    ``Content-Type`` that is not JSON (:func:`is_json_type`). A body without a ``Content-Type`` is read as JSON.
    ``headers``: the ASGI scope's, as a mapping of lower-case bytes."""
    ctype = headers.get(b"content-type")
    try:
        length = int(headers.get(b"content-length", b"0") or 0)
    except ValueError:  # the gateway answers it first (Guard); a worker's server refuses it
        length = 0
    if ctype is None or (length <= 0 and b"transfer-encoding" not in headers) or is_json_type(ctype):
        return None
    shown = ctype.decode("latin-1")[:80]
    return f"Content-Type {shown!r} is not JSON: send the body as JSON with 'Content-Type: application/json'"


async def send_json(send, status: int, body: dict, headers=()) -> None:
    """An ASGI answer of ``body`` as JSON with ``status`` (and ``headers``, pairs of bytes)."""
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class JsonBodies:
    """ASGI middleware of a served worker (``serve/worker_app.py``): a body whose ``Content-Type`` is not JSON is a
    415 in OpenAI's error shape, not read as JSON (:func:`not_json`, the check :class:`Guard` makes)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            msg = not_json(dict(scope.get("headers") or []))
            if msg is not None:
                return await send_json(send, 415, openai_error(msg, 415))
        await self.app(scope, receive, send)


class _TooLarge(Exception):
    pass


class Guard:
    """ASGI middleware: the API key (when one is set; not for the health probes), the request-size
    bound, a body's ``Content-Type`` (JSON, or none given; any other is a 415, not read as JSON), and the count of
    answers by status code (``metrics``)."""

    def __init__(self, app, max_bytes: int, api_key: str | None, metrics=None, gateway_id: str | None = None):
        self.app, self.max_bytes, self.metrics = app, int(max_bytes), metrics
        self.key = f"Bearer {api_key}".encode() if api_key else None
        #: every answer's ``x-swarm-gateway`` header: an agent URL that reaches this gateway is known by it
        self.id_header = [(GATEWAY_HEADER.encode(), gateway_id.encode())] if gateway_id else []

    def _count(self, status: int) -> None:
        if self.metrics is not None:
            with self.metrics.lock:
                self.metrics.responses[status] += 1

    async def _reply(self, send, status: int, msg: str) -> None:
        self._count(status)
        await send_json(send, status, error_body(msg, status), self.id_header)

    def _refusal(self, scope) -> tuple[int, str] | None:
        """Why a request is refused before it is read (a wrong key, a body announced too large), or None."""
        headers = dict(scope.get("headers") or [])
        if (
            self.key is not None
            and scope.get("path") not in PROBES
            and not hmac.compare_digest(headers.get(b"authorization", b""), self.key)
        ):
            return 401, "missing or wrong API key: send 'Authorization: Bearer $SWARM_API_KEY'"
        try:
            length = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            return 400, "bad Content-Length header"
        if length > self.max_bytes:
            return 413, f"request body of {length} bytes is over the limit of {self.max_bytes}"
        msg = not_json(headers)
        return None if msg is None else (415, msg)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self._refusal(scope)
        if refusal is not None:
            return await self._reply(send, *refusal)
        seen, started = 0, False

        async def limited():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return msg

        async def tracking_send(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
                self._count(int(msg["status"]))
                if self.id_header:
                    msg = {**msg, "headers": [*msg.get("headers", []), *self.id_header]}
            await send(msg)

        try:
            await self.app(scope, limited, tracking_send)
        except _TooLarge:
            if not started:
                await self._reply(send, 413, f"request body is over the limit of {self.max_bytes} bytes")
