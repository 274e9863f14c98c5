"""The population: ``GET /v1/models`` (the agents in OpenAI's model list shape), ``GET /v1/swarm`` and
``/v1/swarm/agents``, ``POST /v1/swarm/agents`` (an agent joins: a worker on a checkpoint of the run, or a
server by URL) and ``DELETE /v1/swarm/agents/{name}`` (drained, then removed)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from swarm_runtime.serve.requests import AgentRequest
from swarm_runtime.serve.resolved import checkpoint_tags, in_run, role_folder
from swarm_runtime.serve.validate import BadRequest, check_agent_url, check_name, validated

router = APIRouter()


@router.get("/v1/models")
def models(request: Request):
    agents = request.app.state.gateway.pop.agents
    return {
        "object": "list",
        "data": [
            {"id": a.name, "object": "model", "owned_by": "swarm-runtime", "role": a.role, "status": a.status}
            for a in agents
            if a.status != "removed"
        ],
    }


@router.get("/v1/swarm/agents")
def list_agents(request: Request):
    return {"agents": [a.public() for a in request.app.state.gateway.pop.agents]}


@router.get("/v1/swarm")
def swarm_state(request: Request):
    gw = request.app.state.gateway
    ok, missing = gw.ready()
    return {
        "ready": ok,
        "roles": gw.roles,
        "roles_missing": missing,
        "accepting": gw.accepting,
        "episodes_running": gw.running_count(),
        "agents": [a.public() for a in gw.pop.agents],
        "adapter_hosts": [h.public() for h in gw.pop.hosts],
        "versions": gw.versions.public(),
        "restart_policy": {
            "max_restarts": int(gw.s.max_restarts),
            "window_s": float(gw.s.restart_window_s),
            "backoff_max_s": float(gw.s.restart_backoff_max_s),
        },
    }


def checkpoint_folder(setup, req: AgentRequest) -> Path:
    """The role folder an added agent serves: a checkpoint tag of the run, or a folder inside the run."""
    tag = req.checkpoint or setup.checkpoint.name
    path = in_run(setup, tag, lambda ckpt: role_folder(ckpt, req.role), lambda p: (p / "config.json").exists())
    if path is not None:
        return path
    raise BadRequest(
        f"checkpoint {req.checkpoint!r} is neither a tag of the run with a {req.role} model nor a "
        f"role folder inside the run folder; tags: {', '.join(checkpoint_tags(setup))}",
        param="checkpoint",
        status=422,
    )


def check_agent_request(gw, req: AgentRequest) -> None:
    """A known role, a checkpoint or a URL (not both), a fresh valid name."""
    if req.role not in gw.roles:
        raise BadRequest(f"unknown role {req.role!r}; valid: {', '.join(gw.roles)}", param="role", status=422)
    if req.checkpoint is not None and req.url is not None:
        raise BadRequest(
            "give checkpoint (a tag of the run, or a role folder) or url, not both; "
            "neither: the checkpoint being served",
            param="url",
            status=422,
        )
    if req.name is not None:
        check_name(req.name)
        if any(a.name == req.name for a in gw.pop.agents):
            raise BadRequest(
                f"an agent named {req.name!r} exists already (names are never reused)", param="name", status=409
            )


@router.post("/v1/swarm/agents", status_code=201)
async def add_agent(request: Request):
    gw = request.app.state.gateway
    req = validated(AgentRequest, await request.body())
    check_agent_request(gw, req)
    if req.url is not None:
        url = check_agent_url(req.url, list(gw.s.allow_hosts or []), gateway=(str(gw.s.host), int(gw.s.port)))
        if await gw.pop.reaches_this_gateway(gw.http, url):
            raise BadRequest(
                f"url {req.url!r} is this gateway itself (it answered with this gateway's id); give the URL of an "
                "agent's server (a swarm worker or vllm serve)",
                param="url",
                status=422,
            )
        a = gw.pop.add_url(req.role, url, req.name)
        await gw.pop.probe(gw.http, a)
        return JSONResponse(a.public(), status_code=201)
    if gw.adapter_run:
        host = gw.hosts.get(req.role)
        if req.checkpoint not in (None, gw.setup.checkpoint.name) or host is None or host.status == "failed":
            raise BadRequest(
                "this run's agents are LoRA adapters on one base, served by one worker: a new agent "
                "serves its role's adapter of the checkpoint being served (give no checkpoint), or "
                "join another server by url",
                param="checkpoint",
                status=422,
            )
        version, model = gw.versions.adapter_for(req.role)
        a = gw.pop.add_url(req.role, host.url, req.name, model_id=model)
        a.version = version
        await gw.pop.probe(gw.http, a)
        return JSONResponse(a.public(), status_code=201)
    folder = checkpoint_folder(gw.setup, req)
    a = gw.pop.spawn(req.role, folder, req.name)
    a.version = gw.versions.version_of(folder.parent.parent)  # a checkpoint's role folder: CKPT/agents/ROLE
    return JSONResponse(a.public(), status_code=201)


@router.delete("/v1/swarm/agents/{name}")
async def remove_agent(name: str, request: Request):
    gw = request.app.state.gateway
    a = gw.pop.by_name(name)
    if a is None:
        raise HTTPException(
            404, f"no agent {name!r}; agents: {', '.join(x.name for x in gw.pop.agents if x.status != 'removed')}"
        )
    await gw.pop.drain(a)
    if not any(x.url == a.url and x.status != "removed" for x in gw.pop.agents):
        await gw.agent_clients.forget(a.url)
    return a.public()
