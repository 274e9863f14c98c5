"""A small JSON-over-HTTP client for the engine samplers (stdlib only: keep-alive connections, one per
thread, so ``rollout.concurrency`` requests can be in flight at once)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlsplit


class EngineError(RuntimeError):
    """An inference server refused or failed a request, or cannot be reached (one clear line)."""


class EngineGone(EngineError):
    """A server (or its sampler actor) that stopped answering and was not brought back: gone for good. A
    replicated sampler (:mod:`swarm_runtime.sampling.replicas`) drops such a replica; alone, the run stops."""


class Unreachable(EngineError):
    """No answer (connection refused or reset, timeout): worth a retry, maybe on a restarted server."""


class HTTPStatusError(EngineError):
    """The server answered with an error status; ``status`` and ``detail`` (its message)."""

    def __init__(self, url: str, status: int, detail: str):
        super().__init__(f"{url} answered HTTP {status}: {detail}")
        self.status, self.detail = status, detail


class NotOpenAI(EngineError):
    """A server answered, but not as an OpenAI-compatible completions server does (an HTML page, other JSON)."""


def looks_like_html(text: str) -> bool:
    head = text.lstrip()[:200].lower()
    return head.startswith(("<!doctype html", "<html", "<head", "<body", "<?xml")) or "<html" in head


def body_kind(answer) -> str:
    """What a server's answer is, in a few words, for a message: ``an HTML page ('Title')``, ``text '...'``,
    ``JSON with the keys ['detail']``, ``a JSON list``, ``nothing``."""
    import re

    if answer is None or answer == "":
        return "nothing"
    if isinstance(answer, str):
        if looks_like_html(answer):
            title = re.search(r"<title[^>]*>(.*?)</title>", answer, re.I | re.S)
            return "an HTML page" + (f" ({' '.join(title.group(1).split())[:80]!r})" if title else "")
        return f"text {' '.join(answer.split())[:80]!r}"
    if isinstance(answer, dict):
        return f"JSON with the keys {sorted(map(str, answer))[:8]}"
    return f"a JSON {type(answer).__name__.replace('dict', 'object')}"


def first_choice(answer, where: str, path: str = "POST /v1/completions") -> dict:
    """The first choice of a completions answer; :class:`NotOpenAI` naming ``where`` (``rollout.url=...``), what came
    back and what was expected, for anything else."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    raise NotOpenAI(
        f'{where} answered {path} with {body_kind(answer)}, not an OpenAI completion ({{"choices": [...]}}): '
        "give the URL of an OpenAI-compatible completions server (vLLM's)"
    )


def model_list(answer, where: str) -> list:
    """The ``data`` of a ``GET /v1/models`` answer; :class:`NotOpenAI` (as :func:`first_choice`) for anything else."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if isinstance(data, list) and all(isinstance(m, dict) for m in data):
        return data
    raise NotOpenAI(
        f'{where} answered GET /v1/models with {body_kind(answer)}, not an OpenAI model list ({{"data": [...]}}): '
        "give the URL of an OpenAI-compatible completions server (vLLM's)"
    )


def _detail(raw: bytes) -> str:
    """The error message of an OpenAI-style error body (or the body itself, cut; an HTML page by its title)."""
    text = raw.decode("utf-8", "replace")
    if looks_like_html(text):
        return body_kind(text)
    try:
        body = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:500]
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        if isinstance(err, dict):
            err = err.get("message", err)
        return " ".join(str(err).split())[:500]
    return str(body)[:500]


class Client:
    """JSON requests to one server (``url``: ``http://host:port``, an optional path prefix before ``/v1``)."""

    def __init__(self, url: str, timeout: float = 120.0, api_key: str | None = None):
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EngineError(f"{url!r} is not an http(s) URL such as http://127.0.0.1:8000")
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        if self._prefix.endswith("/v1"):  # rollout.url=http://host:8000/v1 is how OpenAI clients spell it
            self._prefix = self._prefix[:-3]
        self.timeout = float(timeout)
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            c = cls(self._host, self._port, timeout=self.timeout)
            self._local.conn = c
        return c

    def _drop(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
        self._local.conn = None

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        """The decoded JSON answer (or text) of ``method path``; :class:`Unreachable` when there is no
        answer, :class:`HTTPStatusError` for an error status."""
        data = None if body is None else json.dumps(body).encode()
        for fresh in (False, True):
            c = self._conn()
            reused = c.sock is not None  # a kept-alive connection, perhaps to a server that has since restarted
            if timeout is not None:
                c.timeout = timeout
                if c.sock is not None:
                    c.sock.settimeout(timeout)
            try:
                c.request(method, self._prefix + path, body=data, headers=self._headers)
                r = c.getresponse()
                raw = r.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if reused and not fresh and not isinstance(exc, TimeoutError):
                    continue  # once more on a new connection
                raise Unreachable(f"{self.url} did not answer {method} {path}: {type(exc).__name__}: {exc}") from exc
            finally:
                if timeout is not None and getattr(self._local, "conn", None) is not None:
                    c.timeout = self.timeout
        if r.status >= 400:
            raise HTTPStatusError(self.url, r.status, _detail(raw))
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode("utf-8", "replace")

    def post(self, path: str, body: dict, timeout: float | None = None):
        return self.request("POST", path, body, timeout)

    def get(self, path: str, timeout: float | None = None):
        return self.request("GET", path, None, timeout)

    def wait_ready(self, seconds: float, alive=lambda: True) -> bool:
        """Poll ``GET /health`` until it answers 200 (True), ``alive()`` turns False or ``seconds`` pass (False)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not alive():
                return False
            try:
                self.request("GET", "/health", timeout=5.0)
                return True
            except EngineError:
                time.sleep(0.5)
        return False
