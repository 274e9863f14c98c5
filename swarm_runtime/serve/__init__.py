"""``swarm serve``: a trained swarm as a dropout-tolerant service (docs/guides/serve.md; docs/reference/method.md,
section 8).

- :mod:`~swarm_runtime.serve.worker`: one agent = one process speaking the subset of vLLM's
  OpenAI-compatible completions API the gateway needs (``/v1/models``, ``/v1/completions`` with
  ``guided_choice``, ``logprobs``, ``seed``), so ``vllm serve <checkpoint>`` is a drop-in worker; its app
  :mod:`~swarm_runtime.serve.worker_app`, its completions :mod:`~swarm_runtime.serve.completer` and
  :mod:`~swarm_runtime.serve.batcher`.
- :mod:`~swarm_runtime.serve.population`: the live population (who is up, joining, draining),
  the worker processes the gateway owns, health probes and restarts.
- :mod:`~swarm_runtime.serve.episodes`: served episodes on the core's one episode loop
  (:mod:`~swarm_runtime.serve.turns`), its transport :mod:`~swarm_runtime.serve.answerer` (sealed bids from
  whoever answers within the deadline, the winner's action with failover, the world's step) and a client-side
  episode's world (:mod:`~swarm_runtime.serve.client_world`).
- :mod:`~swarm_runtime.serve.gateway`: the HTTP service (episodes, turns, agents, health, metrics): its app
  :mod:`~swarm_runtime.serve.app`, state :mod:`~swarm_runtime.serve.state`, routes
  :mod:`~swarm_runtime.serve.routes`.
- :mod:`~swarm_runtime.serve.client`: an async client, and ``swarm eval RUN serve.url=...``.
- :mod:`~swarm_runtime.serve.validate`: what is accepted (finite JSON, agent names and URLs) and
  OpenAI's error shape; :mod:`~swarm_runtime.serve.journal`: the fsynced episode journal that makes
  a gateway crash leave ``interrupted`` episodes, not silence.
- :mod:`~swarm_runtime.serve.adapters`: one worker, one base, every role's LoRA adapter
  (``model.adapter=lora`` runs), with vLLM's runtime LoRA endpoints.

Needs the ``serve`` extra (fastapi, uvicorn, httpx); imports stay lazy so the core does not.
"""

from __future__ import annotations


def require_serve_extra() -> None:
    """Raise a clear error naming the missing package when the ``serve`` extra is not installed."""
    import importlib.util

    from swarm_runtime.config.errors import ConfigError

    missing = [m for m in ("fastapi", "uvicorn", "httpx") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"swarm serve needs {', '.join(missing)}: pip install 'swarm-runtime[serve]'")
