"""The gateway's FastAPI app (:func:`make_app`): its state (:class:`~swarm_runtime.serve.state.Gateway`), its
start and stop (:func:`~swarm_runtime.serve.lifecycle.lifespan`), the routes (:mod:`swarm_runtime.serve.routes`),
errors in one shape (``detail`` and OpenAI's ``error`` object: :func:`~swarm_runtime.serve.guard.error_body`) and
the guard in front (:class:`~swarm_runtime.serve.guard.Guard`)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from swarm_runtime.serve.guard import Guard, error_body
from swarm_runtime.serve.lifecycle import lifespan
from swarm_runtime.serve.resolved import GatewaySetup
from swarm_runtime.serve.routes import agents, episodes, health, intercept, swap, turns
from swarm_runtime.serve.state import Gateway
from swarm_runtime.serve.validate import BadRequest


async def bad_request(_request, exc: BadRequest):
    return JSONResponse(error_body(exc.message, exc.status, exc.param, exc.code), status_code=exc.status)


async def http_error(_request, exc):
    return JSONResponse(
        error_body(str(exc.detail), exc.status_code), status_code=exc.status_code, headers=getattr(exc, "headers", None)
    )


async def invalid(_request, exc):  # path parameters (bodies are read by validate.validated)
    err = exc.errors()[0]
    return JSONResponse(error_body(f"{'.'.join(map(str, err.get('loc', ())))}: {err.get('msg')}", 422), status_code=422)


def make_app(setup: GatewaySetup) -> FastAPI:
    """The gateway for ``setup`` (its journal recovered now; its agents start with the app's lifespan).
    ``app.state.gateway``: its state; ``app.state.drain()``: refuse new work, let running episodes finish."""
    gw = Gateway(setup)
    app = FastAPI(title="swarm serve", lifespan=lifespan)
    app.state.gateway = gw
    app.state.drain = gw.drain
    app.add_exception_handler(BadRequest, bad_request)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    for module in (health, agents, swap, episodes, turns, intercept):
        app.include_router(module.router)
    app.add_middleware(
        Guard,
        max_bytes=int(setup.cfg.serve.max_body_bytes),
        api_key=setup.api_key,
        metrics=gw.metrics,
        gateway_id=gw.pop.opts.gateway_id,
    )
    return app
