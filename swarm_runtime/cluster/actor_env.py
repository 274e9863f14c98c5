"""The run's environment variables for the actors of a joined Ray cluster (``cluster.address``).

An actor's process is started by its node's raylet, with the raylet's environment, not the ``swarm run`` process's
(a local Ray the run starts itself is the run's child: its workers inherit the run's environment, and nothing is
needed). The variables the project and its domains read in code that runs in actors are given to the job when the
driver joins (``ray.init(runtime_env=...)``, job-wide: every actor of the run, whatever kind):

- :data:`FORWARDED`: what the core reads there (which plugins load, the prompt-overflow mode, the vLLM python, the
  cache folder); a domain adds its own with its ``env_vars`` attribute (:class:`swarm_runtime.core.domain.Domain`), a
  user with ``cluster.env_vars: [NAME, ...]`` (names only; one not set in the run's environment is refused).
- A variable that the driver has set travels with its value; one it has not set is not touched.
- Values of secret-named variables (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``:
  :func:`swarm_runtime.config.secrets.is_secret_key`) never go into the runtime env's ``env_vars``, which Ray shows in its
  dashboard and job table: they travel inside a worker-process setup hook (a function Ray pickles into its GCS
  and runs in each of the job's worker processes before any task; the runtime env shows only its name), which
  sets them in ``os.environ``. The other values go in ``env_vars`` (set by Ray before the process starts).
Nothing here writes a value into the run folder or a log line: the log names the variables only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

#: The variables the core reads in code that runs in actors: plugins/manager.py (SWARM_LOAD_PLUGINS, SWARM_DISABLE_PLUGINS:
#: which domains an env worker loads), models/transformers_backend.py (SWARM_PROMPT_OVERFLOW), sampling/vllm_server.py
#: (SWARM_VLLM_PYTHON: an engine sampler actor starts vLLM), and the cache folder (XDG_CACHE_HOME).
FORWARDED = (
    "SWARM_LOAD_PLUGINS",
    "SWARM_DISABLE_PLUGINS",
    "SWARM_PROMPT_OVERFLOW",
    "SWARM_VLLM_PYTHON",
    "XDG_CACHE_HOME",
)
#: The names a run forwards besides :data:`FORWARDED` (the domain's ``env_vars`` and ``cluster.env_vars``), set by
#: :func:`forward` when the run starts; read by :func:`swarm_runtime.cluster.env_cluster.connect` when it joins.
_EXTRA: list[str] = []


def forward(names: Iterable[str]) -> None:
    """Forward ``names`` too when this process joins a cluster (the run's domain's ``env_vars`` and ``cluster.env_vars``)."""
    _EXTRA[:] = [str(n) for n in names]


def forward_env(cfg, domain) -> None:
    """:func:`forward` a run's domain's ``env_vars`` and its ``cluster.env_vars`` (each set in this environment:
    config/validation.py refuses one that is not). ``swarm run`` calls it when the run starts, ``env_domain`` (every
    command with env workers) before it joins."""
    c = cfg.get("cluster")
    forward([*getattr(domain, "env_vars", ()), *((c.get("env_vars") or []) if c is not None else [])])


def names() -> list[str]:
    """Every name forwarded, in order, once each."""
    return list(dict.fromkeys([*FORWARDED, *_EXTRA]))


def split(wanted: Iterable[str], environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(plain, secret)``: the variables of ``wanted`` that ``environ`` sets, the secret-named ones apart."""
    from swarm_runtime.config.secrets import is_secret_key

    plain, secret = {}, {}
    for name in wanted:
        if name in environ:
            (secret if is_secret_key(name) else plain)[name] = environ[name]
    return plain, secret


def _setter(values: dict[str, str]):
    def swarm_actor_env():  # its name is what Ray's runtime env shows
        import os

        os.environ.update(values)

    return swarm_actor_env


def runtime_env(environ: Mapping[str, str] | None = None) -> dict:
    """The ``runtime_env`` a driver joining a cluster gives ``ray.init``: the forwarded variables set in ``environ``
    (this process's by default), plain ones in ``env_vars``, secret ones in a setup hook; ``{}`` when none is set."""
    plain, secret = split(names(), os.environ if environ is None else environ)
    out: dict = {}
    if plain:
        out["env_vars"] = plain
    if secret:
        out["worker_process_setup_hook"] = _setter(secret)
    return out


def listed(environ: Mapping[str, str] | None = None) -> str:
    """The names :func:`runtime_env` forwards, for the log: never a value."""
    plain, secret = split(names(), os.environ if environ is None else environ)
    return ", ".join([*plain, *(f"{n} (secret)" for n in secret)]) or "none"


def digests(wanted: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """``{name: sha256 of its value, or None when unset}`` for ``wanted``: what an actor answers and the driver
    compares with its own (:func:`differing`), so that a value is never sent back or shown."""
    import hashlib

    environ = os.environ if environ is None else environ
    return {n: hashlib.sha256(environ[n].encode()).hexdigest() if n in environ else None for n in wanted}


def differing(theirs: Mapping[str, str | None], environ: Mapping[str, str] | None = None) -> list[str]:
    """The names whose value in an actor (``theirs``: its :func:`digests`) is not this process's."""
    ours = digests(theirs, environ)
    return [n for n in theirs if theirs[n] != ours[n]]
