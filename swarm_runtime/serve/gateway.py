"""The gateway: ``swarm serve RUN_DIR`` — workers, the auction over whoever answers, and the HTTP API.

    GET  /health/live                 200 while the process serves (no key needed, no data)
    GET  /health/ready                200 when every role has an agent up, else 503 (no key needed, no data)
    GET  /health                      status, agents up, episodes running (503 when not ready)
    GET  /metrics                     Prometheus text
    GET  /v1/models                   the agents, in OpenAI's model list shape
    GET  /v1/swarm, /v1/swarm/agents  the population (state, restarts, errors)
    POST /v1/swarm/agents             {role, checkpoint? | url?, name?}: an agent joins (no restart);
                                      neither checkpoint nor url: the checkpoint being served
    DELETE /v1/swarm/agents/{name}    drain an agent: it finishes what it was asked, then leaves
    POST /v1/episodes                 {task?, seed?, split?, noise?, temperature?, stream?}: a whole server-side
                                      episode (JSON, or JSON lines per turn with stream=true);
                                      {"env": "client"}: an episode whose world the client owns
    POST /v1/episodes/{id}/turns      {observation, reward, valid?, done?} -> {agent, role, bid, action}
    GET  /v1/episodes[?status=S]      recent episodes without turns (those a crash interrupted included)
    GET  /v1/episodes/{id}            an episode's state and summary (``interrupted`` after a gateway crash)
    DELETE /v1/episodes/{id}          cancel an episode (its owner only)

Binds 127.0.0.1 by default; any other address needs ``SWARM_API_KEY`` (``Authorization: Bearer KEY``
on every request but the two health probes, compared in constant time, never logged). Bodies over
``serve.max_body_bytes`` get 413. Every body is read by :mod:`swarm_runtime.serve.validate`: a bad field
is a 4xx naming it, errors carry ``detail`` and OpenAI's ``error`` object. Every episode's start and
turns are journaled (:mod:`swarm_runtime.serve.journal`) before the answer leaves.

This module runs the gateway (:func:`serve`: the socket bound before any model loads, uvicorn, the drain on
SIGTERM); the app is :func:`swarm_runtime.serve.app.make_app`, its state :class:`swarm_runtime.serve.state.Gateway`,
its routes :mod:`swarm_runtime.serve.routes`.
"""

import asyncio
import socket

from loguru import logger

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.serve.resolved import GatewaySetup, role_folder
from swarm_runtime.serve.validate import is_loopback

__all__ = ["GatewaySetup", "bind", "check_bind", "role_folder", "serve"]


def bind(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, bound before any model loads: a port in use is one clear line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = "is in use by another process" if exc.errno in (98, 48) else f"cannot be bound ({exc.strerror})"
        raise ConfigError(
            f"serve.port={port}: {host}:{port} {why}; pick another serve.port (0: any free port)"
        ) from None
    return sock


def serve(setup: GatewaySetup) -> None:
    """Run the gateway in this process. SIGTERM/SIGINT drain: new episodes get 503, running ones get
    ``serve.shutdown_grace_s`` to finish, then the process exits (a second signal exits at once)."""
    import sys

    import uvicorn

    from swarm_runtime.serve.app import make_app

    s = setup.cfg.serve
    sock = bind(str(s.host), int(s.port))
    s.port = sock.getsockname()[1]  # serve.port=0: the port the system picked
    logger.add(setup.run_dir / "serve" / "gateway.log", level="DEBUG")
    app = make_app(setup)

    class Draining(uvicorn.Server):
        drain_task = None

        def handle_exit(self, sig, frame):
            loop = getattr(self, "_loop", None)
            if self.drain_task is not None or loop is None or not self.started:
                return super().handle_exit(sig, frame)
            self.drain_task = True

            def start():
                async def go():
                    await app.state.drain()
                    self.should_exit = True

                self.drain_task = asyncio.ensure_future(go())

            loop.call_soon_threadsafe(start)

        async def serve(self, sockets=None):
            self._loop = asyncio.get_running_loop()
            await super().serve(sockets)

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=int(float(s.shutdown_grace_s)) + 5
    )
    server = Draining(config)
    server.run(sockets=[sock])
    if not server.started:
        print("swarm: error: the gateway did not start (see the log above)", file=sys.stderr)
        raise SystemExit(1)


def check_bind(host: str, api_key: str | None) -> None:
    if not is_loopback(host) and not api_key:
        raise ConfigError(
            f"serve.host={host!r} is not a loopback address: set SWARM_API_KEY (every request must "
            "then send 'Authorization: Bearer $SWARM_API_KEY'), or bind serve.host=127.0.0.1"
        )
