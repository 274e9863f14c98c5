"""``swarm swap URL CHECKPOINT`` and ``swarm swap URL --rollback``: a running ``swarm serve`` moves its agents to
another checkpoint of the run (or back to the version served before), one at a time, while it serves
(swarm_runtime/serve/swap.py). Prints each agent as it moves and waits for the end: exit 0 when every agent moved,
1 when the swap failed midway (its reason printed; the agents moved stay moved), 2 when the gateway refused it (one
line: the checkpoint, a swap running, a worker down)."""

from __future__ import annotations

import os
import sys
import time

from swarm_runtime.config.errors import ConfigError


def _ask(http, method: str, path: str, **kw) -> dict:
    import httpx

    try:
        r = http.request(method, path, **kw)
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"{http.base_url}: no answer ({type(exc).__name__}: {exc}); is `swarm serve` running there?"
        ) from None
    try:
        body = r.json()
    except ValueError:
        body = {"detail": r.text}
    if r.status_code >= 400:
        raise ConfigError(f"{method} {path}: HTTP {r.status_code}: {body.get('detail', body)}")
    return body


def follow(http, job: dict, poll_s: float = 0.5, out=sys.stdout) -> dict:
    """Poll the swap ``job`` until it ends, printing each agent as it moves; its last state."""
    shown = 0
    while True:
        state = _ask(http, "GET", "/v1/swarm/swap")
        job = state["swap"] if state["swap"] and state["swap"]["id"] == job["id"] else job
        for name in job["moved"][shown:]:
            print(f"  {name} -> {state['agents'].get(name)}", file=out, flush=True)
        shown = len(job["moved"])
        if job["status"] != "running":
            return job
        time.sleep(poll_s)


def cmd_swap(args) -> int:
    import httpx

    if bool(args.checkpoint) == bool(args.rollback):
        raise ConfigError("give a CHECKPOINT (a tag of the run, or a checkpoint folder inside it) or --rollback")
    key = os.environ.get("SWARM_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=60) as http:
        if args.rollback:
            job = _ask(http, "POST", "/v1/swarm/rollback")
        else:
            job = _ask(http, "POST", "/v1/swarm/swap", json={"checkpoint": args.checkpoint})
        print(f"{job['kind']} to {job['version']} ({job['checkpoint']}): {len(job['pending'])} agents", flush=True)
        if args.no_wait:
            return 0
        job = follow(http, job)
    if job["status"] == "done":
        print(f"{job['kind']} to {job['version']}: done, {len(job['moved'])} agents moved", flush=True)
        return 0
    print(f"swarm: {job['kind']} to {job['version']} failed: {job['error']}", file=sys.stderr)
    return 1


def add_parser(sub) -> None:
    sw = sub.add_parser("swap", help="move a running `swarm serve` to another checkpoint of its run, or roll back")
    sw.add_argument("url", help="the gateway, e.g. http://127.0.0.1:8000 (SWARM_API_KEY: its key)")
    sw.add_argument("checkpoint", nargs="?", help="a tag of the run (latest, final, ...) or a checkpoint folder in it")
    sw.add_argument("--rollback", action="store_true", help="back to the version served before the last swap")
    sw.add_argument("--no-wait", action="store_true", help="return once the swap has started")
    sw.set_defaults(func=cmd_swap)
