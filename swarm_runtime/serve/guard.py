"""The gateway's ASGI guard (:class:`Guard`: the API key, the request-size bound, the body's content type, the count
of answers by status) and its error body (:func:`error_body`: ``detail`` and OpenAI's ``error`` object)."""

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
        body = json.dumps(error_body(msg, status)).encode()
        self._count(status)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *self.id_header,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

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
        ctype = headers.get(b"content-type")
        if ctype is not None and (length > 0 or b"transfer-encoding" in headers) and not is_json_type(ctype):
            shown = ctype.decode("latin-1")[:80]
            return (
                415,
                f"Content-Type {shown!r} is not JSON: send the body as JSON with 'Content-Type: application/json'",
            )
        return None

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
