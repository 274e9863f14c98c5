"""What the gateway and its workers accept: request bodies (JSON with finite numbers only, read by us
so a bad value is a 4xx naming its field, never a 500 or a reset connection), agent names (one URL
path segment, one file name), agent URLs (http(s), loopback unless allowed) and errors in OpenAI's
shape on the OpenAI-compatible paths.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from typing import Any
from urllib.parse import urlsplit

#: An agent's name: letters, digits, ``-``, ``_``, ``.``, ``@``; starts with a letter or digit; at most
#: 64 characters. It is one URL path segment as typed (nothing to escape) and one file name (no ``/``,
#: never ``.`` or ``..``).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
LOOPBACK_HOSTS = ("localhost",)
#: Addresses a gateway bound to listens on every interface of (``serve.host=0.0.0.0``).
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
#: The header every answer of a gateway carries: its id, so an agent URL that reaches the gateway itself is known.
GATEWAY_HEADER = "x-swarm-gateway"


class BadRequest(ValueError):
    """A request the service refuses: ``status`` (4xx), the message naming the field, and the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class _NonFinite(str):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a JSON body (Python's json reads them; JSON has none)."""


def _where(value: Any, path: str = "") -> str | None:
    if isinstance(value, _NonFinite):
        return path or "(body)"
    if isinstance(value, dict):
        for k, v in value.items():
            hit = _where(v, f"{path}.{k}" if path else str(k))
            if hit:
                return hit
    if isinstance(value, list):
        for i, v in enumerate(value):
            hit = _where(v, f"{path}[{i}]")
            if hit:
                return hit
    return None


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):  # 1e999
        return _NonFinite(text)
    return v


def parse_json(raw: bytes) -> Any:
    """A request body as JSON; :class:`BadRequest` (400) for malformed JSON or a non-finite number,
    naming where it is."""
    if not raw.strip():
        raise BadRequest("the request body is empty: send a JSON object")
    try:
        data = json.loads(raw, parse_constant=_NonFinite, parse_float=_finite_float)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise BadRequest(f"the request body has a number Python will not read: {exc}") from None
    where = _where(data)
    if where:
        raise BadRequest(
            f"{where}: {_find(data, where)!s} is not a finite number (JSON has no NaN or Infinity)", param=where
        )
    return data


def _find(data, where: str):
    v = data
    for part in re.findall(r"[^.\[\]]+", where):
        v = v[int(part)] if isinstance(v, list) else v.get(part) if isinstance(v, dict) else v
    return v


def validated(model, raw: bytes):
    """``raw`` parsed and checked against the pydantic ``model``; :class:`BadRequest` (422 for a field's
    value, 400 for the body) naming the first bad field and why."""
    from pydantic import ValidationError

    data = parse_json(raw)
    if not isinstance(data, dict):
        raise BadRequest(f"the request body is JSON {type(data).__name__}, not an object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err.get("loc", ())) or "(body)"
        value = err.get("input")
        shown = (
            json.dumps(value)[:80] if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__
        )
        if err.get("type") == "extra_forbidden":
            msg = f"unknown field {field!r}; valid: {', '.join(model.model_fields)}"
        else:
            msg = f"{field}: {shown} is not valid: {err.get('msg')}"
        raise BadRequest(msg, param=field, status=422) from None


def no_bool(v):
    """A pydantic before-validator: a number field refuses JSON ``true``/``false`` (pydantic reads them as 1/0)."""
    if isinstance(v, bool):
        raise ValueError("a number, not a boolean")
    return v


def check_name(name: str) -> str:
    """An agent name as given, or :class:`BadRequest` naming the rule."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or ".." in name:
        raise BadRequest(
            f"name {name!r} is not a valid agent name: 1-64 letters, digits, '-', '_', '.', '@', "
            "starting with a letter or digit, no '..' (it is a URL path segment and a file name)",
            param="name",
            status=422,
        )
    return name


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_agent_url(url: str, allow_hosts=(), gateway: tuple[str, int] | None = None) -> str:
    """An agent's base URL: ``http(s)://HOST[:PORT][/v1]``; HOST loopback, or listed in ``allow_hosts``
    (``serve.allow_hosts``; ``*`` = any); not the gateway's own address (``gateway``: its ``(host, port)``, see
    :func:`is_gateway_address`). :class:`BadRequest` naming what is wrong otherwise."""
    try:
        parts = urlsplit(str(url))
        port = parts.port
    except ValueError as exc:
        raise BadRequest(f"url {url!r} is not a valid URL ({exc})", param="url", status=422) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(
            f"url {url!r} is not an http(s) URL of a server (e.g. http://127.0.0.1:8001)", param="url", status=422
        )
    if parts.username or parts.password or parts.query or parts.fragment or parts.path.rstrip("/") not in ("", "/v1"):
        raise BadRequest(
            f"url {url!r}: give the server's base URL only (scheme, host, port; no path, query or credentials)",
            param="url",
            status=422,
        )
    allowed = [str(h).lower() for h in allow_hosts or ()]
    if not is_loopback(parts.hostname) and "*" not in allowed and parts.hostname.lower() not in allowed:
        raise BadRequest(
            f"url {url!r}: host {parts.hostname!r} is not loopback and not in serve.allow_hosts "
            f"({', '.join(allowed) or 'empty'}); start the gateway with "
            f"'serve.allow_hosts=[{parts.hostname}]' to admit it",
            param="url",
            status=422,
        )
    if port is not None and not 0 < port < 65536:
        raise BadRequest(f"url {url!r}: port {port} is out of range", param="url", status=422)
    if gateway is not None and is_gateway_address(parts.hostname, port or _DEFAULT_PORTS[parts.scheme], *gateway):
        raise BadRequest(
            f"url {url!r} is this gateway itself (serve.host={gateway[0]}, serve.port={gateway[1]}); give the URL "
            "of an agent's server (a swarm worker or vllm serve)",
            param="url",
            status=422,
        )
    return f"{parts.scheme}://{parts.netloc}"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_gateway_address(host: str, port: int, gateway_host: str, gateway_port: int) -> bool:
    """``host:port`` reaches a gateway listening on ``gateway_host:gateway_port``: the same port, and the same host,
    or both loopback, or a loopback host where the gateway listens on every interface. Other names of this machine
    are found by the gateway's probe instead (the :data:`GATEWAY_HEADER` of its answer)."""
    if int(port) != int(gateway_port):
        return False
    host, gateway_host = host.strip("[]").lower(), str(gateway_host).strip("[]").lower()
    loopback = is_loopback(host)
    return host == gateway_host or (loopback and (is_loopback(gateway_host) or gateway_host in WILDCARD_HOSTS))


def openai_error(message: str, status: int, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "invalid_request_error",
        422: "invalid_request_error",
        429: "rate_limit_error",
        503: "service_unavailable",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code or str(status)}}
