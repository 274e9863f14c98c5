"""Health and metrics: ``GET /health/live``, ``/health/ready`` (the two probes: no key, no data),
``/health`` and ``/metrics`` (Prometheus text)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

router = APIRouter()


@router.get("/health/live")
def live():
    return {"status": "live"}


@router.get("/health/ready")
def readiness(request: Request):
    ok, _ = request.app.state.gateway.ready()
    return JSONResponse({"status": "ready" if ok else "not_ready"}, status_code=200 if ok else 503)


@router.get("/health")
def health(request: Request):
    gw = request.app.state.gateway
    up = len(gw.pop.bidders())
    live_agents = [a for a in gw.pop.agents if a.status != "removed"]
    ok, missing = gw.ready()
    status = "no_agents" if not up else "role_missing" if missing else "ok" if up == len(live_agents) else "degraded"
    status = status if gw.accepting else "shutting_down"
    return JSONResponse(
        {
            "status": status,
            "ready": ok,
            "roles_missing": missing,
            "agents_up": up,
            "agents": len(live_agents),
            "episodes_running": gw.running_count(),
            "domain": gw.cfg.domain,
            "task": gw.cfg.task_name,
            "checkpoint": gw.versions.folders[gw.versions.current].name,  # the current version's, after a swap
            "version": f"v{gw.versions.current}",
        },
        status_code=200 if ok else 503,
    )


@router.get("/metrics")
def prometheus(request: Request):
    gw = request.app.state.gateway
    live_agents = [a for a in gw.pop.agents if a.status != "removed"]
    return PlainTextResponse(
        gw.metrics.render(len(gw.pop.bidders()), len(live_agents), gw.running_count(), gw.pop.agents),
        media_type="text/plain; version=0.0.4",
    )
