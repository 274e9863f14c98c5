"""Cross-key checks of the engine path: ``rollout.*`` (engine samplers, the vLLM servers a run starts, their
arguments) and the bases they serve (``model.bases``, ``model.role_base``, ``rollout.urls``), ``fn(cfg, registry)``
as in :mod:`swarm_runtime.config.checks`; with the helpers that read vLLM's arguments (:func:`key_arg`,
:func:`config_files`, :func:`config_key`, :func:`server_gpus`), which the cluster and the tests use too.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from swarm_runtime.config.checks import ONE_MODEL_ALGOS, model_shape
from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.keys import RULES
from swarm_runtime.config.rules import check_rule, lazy_ok
from swarm_runtime.config.schemes import check_rank

#: rollout.engine=openai with a role on the default base (``model.*``) and no server for it.
NEEDS_URL = "rollout.engine=openai needs rollout.url (the server's base URL, e.g. http://127.0.0.1:8000)"


def rollout_engine(cfg: DictConfig, registry) -> None:
    """An engine sampler needs a URL (``openai``) and adapters on one base: after each update the learner loads
    each role's new adapter into the server at run time (vLLM's runtime LoRA endpoints). Full copies would need
    the server restarted with new weights after every update (vLLM's OpenAI server cannot swap base weights at
    run time), so ``model.adapter=none`` is refused rather than silently sampling stale weights."""
    r = cfg.get("rollout")
    if r is None:
        return
    if r.get("engine", "local") == "local":
        if int(r.get("max_staleness", 0) or 0) > 0:
            c = cfg.get("cluster")
            if c is not None and c.get("samplers", "local") == "ray":  # the sampler actor of in-process policies
                raise ConfigError(
                    f"rollout.max_staleness={r.max_staleness} with cluster.samplers=ray and rollout.engine=local is "
                    "not supported: the sampler actor's forwards count into the run's FLOPs under the trainer's phase "
                    "of the moment (a rollout played ahead would count as update or branch FLOPs), and in process "
                    'this engine cannot play ahead, so no run checks it (docs/reference/cluster.md, "Rollouts played ahead on Ray"); '
                    "valid: rollout.max_staleness=0, or rollout.engine=vllm (a sampler actor runs the server)"
                )
            raise ConfigError(
                f"rollout.max_staleness={r.max_staleness} needs an engine sampler (rollouts played ahead on "
                "the server's weights while this process trains); valid: rollout.max_staleness=0, or "
                "rollout.engine=openai|vllm"
            )
        return
    from swarm_runtime.models import bases as B

    if r.engine == "openai" and not r.get("url") and not B.multi(cfg.model):  # several bases: model_bases checks
        raise ConfigError(NEEDS_URL)
    adapter = cfg.model.get("adapter") or "none"
    if adapter != "lora":
        raise ConfigError(
            f"rollout.engine={r.engine} with model.adapter={adapter}: the engine path trains adapters "
            "(each role's LoRA adapter is reloaded into the server after every update; a full copy "
            "cannot be swapped into a running vLLM server); valid: model.adapter=lora, or "
            "rollout.engine=local"
        )
    check_rank(int(cfg.model.lora.rank))  # vLLM's --max-lora-rank choices
    if cfg.model.get("constrained_actions"):
        raise ConfigError(
            f"rollout.engine={r.engine} with model.constrained_actions=true is not supported yet; "
            "valid: model.constrained_actions=false, or rollout.engine=local"
        )


def key_arg(args) -> str | None:
    """The argument of ``rollout.vllm.args`` that would set vLLM's API key (``--api-key``, ``--api_key``, an
    abbreviation argparse takes, ``=VALUE`` forms), else None."""
    for a in args or []:
        name = str(a).split("=", 1)[0].replace("_", "-")
        if len(name) >= len("--api-k") and "--api-key".startswith(name):
            return str(a).split("=", 1)[0]
    return None


def config_files(args) -> list[str]:
    """The files ``rollout.vllm.args`` names with ``--config FILE`` or ``--config=FILE`` (vLLM reads a YAML file's
    keys as more arguments: ``FlexibleArgumentParser.load_config_file``, ``key: value`` -> ``--key value``)."""
    args = [str(a) for a in args or []]
    out = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    return out + [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]


def config_key(path: str) -> tuple[str | None, str]:
    """``(key, "")``: the key of vLLM config file ``path`` that would set the API key (:func:`key_arg` on the
    arguments vLLM makes of its keys), or None; ``(None, why)`` when the file cannot be read as a YAML mapping."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return None, f"cannot be read as YAML ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]})"
    if not isinstance(data, dict):
        return None, f"holds {type(data).__name__}, not a YAML mapping of vLLM's arguments"
    bad = key_arg([f"--{k}" for k in data])
    return (bad[2:] if bad else None), ""


def vllm_key_arg(cfg: DictConfig, registry) -> None:
    """Every vLLM server a run starts demands a key the run makes for it (docs/reference/engine.md, "Keys"), given
    through ``VLLM_API_KEY``; vLLM takes an ``--api-key`` of the command line over it, so the run's own client would get
    401 on every request: refused before anything is written (and a key on a command line is one ``ps`` shows)."""
    r = cfg.get("rollout")
    if r is None or r.get("engine") != "vllm" or r.get("vllm") is None:
        return
    why = (
        "the run gives each vLLM server it starts a random key of its own (through VLLM_API_KEY, sent by its client; "
        'docs/reference/engine.md, "Keys"), and vLLM would take yours over it'
    )
    bad = key_arg(r.vllm.get("args"))
    if bad is not None:
        raise ConfigError(f"rollout.vllm.args gives {bad}: {why}; valid: rollout.vllm.args without {bad}")
    for path in config_files(r.vllm.get("args")):  # its keys are arguments too: read it before anything is written
        key, unread = config_key(path)
        if unread:
            raise ConfigError(
                f"rollout.vllm.args gives --config {path}, which {unread}; the run reads it to check that it does "
                "not set vLLM's API key: give a readable YAML file (vLLM's --config), or leave --config out"
            )
        if key is not None:
            raise ConfigError(
                f"rollout.vllm.args gives --config {path}, whose key {key!r} sets vLLM's API key: {why}; valid: "
                f"a --config file without {key!r}"
            )
    guard_args(r.vllm.get("args"))


# ---------------------------------------------------------------- vLLM flags that undo the server's guard
#: vLLM server flags a run never passes on, from ``rollout.vllm.args`` or a ``--config`` file it names: they bind the
#: server elsewhere than ``rollout.vllm.host``/``port`` (``--host``, ``--port``, ``--uds``, ``--grpc-port``), load
#: code by name (``--trust-remote-code``, ``--middleware``, plugins, worker classes), replace its key
#: (``--api-key``) or its model (``--model``: the run's base). Flag names as vLLM 0.32 spells them
#: (``vllm/entrypoints/launchers/cli_args.py``, ``vllm/engine/arg_utils.py``).
GUARD_FLAGS = {
    "--host": "binds the server to another address than rollout.vllm.host",
    "--port": "binds the server to another port than rollout.vllm.port",
    "--uds": "binds the server to a Unix socket",
    "--grpc-port": "opens a second server",
    "--api-key": "replaces the key the run gives the server",
    "--middleware": "imports code into the server",
    "--trust-remote-code": "runs Python code shipped in a model folder",
    "--tool-parser-plugin": "imports a Python file into the server",
    "--tool-server": "connects the server to tool servers",
    "--logits-processors": "imports code into the server",
    "--io-processor-plugin": "imports code into the server",
    "--reasoning-parser-plugin": "imports a Python file into the server",
    "--worker-cls": "imports code into the server",
    "--worker-extension-cls": "imports code into the server",
    "--model": "replaces the run's base",
}


def flag_name(arg) -> str:
    """The flag an argument of vLLM's command line names, as vLLM reads it: before ``=`` (and a JSON key's ``.``),
    underscores as dashes (``--trust_remote_code`` is ``--trust-remote-code``), lower case; "" for a value."""
    text = str(arg).strip().split(None, 1)[0] if str(arg).strip() else ""
    if not text.startswith("--"):
        return ""
    return text.split("=", 1)[0].split(".", 1)[0].replace("_", "-").lower()


def guard_arg(args) -> tuple[str, str] | None:
    """``(argument, what it does)`` of the first argument among ``args`` that names a flag of :data:`GUARD_FLAGS`
    (the flag, or an abbreviation argparse would take for it: ``--trust-rem``), else None."""
    for a in args or []:
        name = flag_name(a)
        hit = next((f for f in GUARD_FLAGS if len(name) >= 4 and f.startswith(name)), None)
        if hit is not None:
            return str(a).strip().split(None, 1)[0].split("=", 1)[0], GUARD_FLAGS[hit]
    return None


def guard_args(args, where: str = "rollout.vllm.args") -> None:
    """Refuse ``args`` (a vLLM server's extra arguments, from ``where``) naming a flag that undoes the run's guard of
    its server (:data:`GUARD_FLAGS`), among them or as a key of a ``--config`` file they name: one line naming the
    flag and what it would do. The check :class:`~swarm_runtime.sampling.vllm_server.VLLMServer` makes too."""
    hit = guard_arg(args)
    source = ""
    if hit is None:
        import yaml

        for path in config_files(args):
            try:
                with open(path, encoding="utf-8") as f:
                    data = yaml.safe_load(f)
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue  # vllm_key_arg names an unreadable file
            hit = guard_arg([f"--{k}" for k in data]) if isinstance(data, dict) else None
            if hit is not None:
                source = f" (in --config {path})"
                break
    if hit is not None:
        flag, why = hit
        raise ConfigError(
            f"{where} gives {flag}{source}, which {why}: a server the run starts listens on rollout.vllm.host and "
            f"rollout.vllm.port only, with its own key and no code from elsewhere; valid: {where} without "
            + ", ".join(GUARD_FLAGS)
        )


#: vLLM's flags (and short forms) whose product is the GPUs one server uses (its world size).
PARALLEL_FLAGS = (
    ("--tensor-parallel-size", "-tp"),
    ("--pipeline-parallel-size", "-pp"),
    ("--data-parallel-size", "-dp"),
)


def server_gpus(args) -> int:
    """The GPUs a vLLM server started with ``args`` (``rollout.vllm.args``) uses: its tensor-, pipeline- and
    data-parallel sizes multiplied (vLLM's defaults: 1 each), as ``--flag N``, ``--flag=N`` or the short ``-tp N``; a
    value that is not a positive integer is a :class:`ConfigError` naming it."""
    args = [str(a) for a in (args or [])]
    out = 1
    for names in PARALLEL_FLAGS:
        value = None
        for i, a in enumerate(args):
            name, eq, rest = a.partition("=")
            if name in names:
                value = rest if eq else (args[i + 1] if i + 1 < len(args) else "")
        if value is None:
            continue
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(
                f"rollout.vllm.args: {names[0]} ({names[1]}) {value!r} is not valid; valid: a positive integer"
            )
        out *= int(value)
    return out


def vllm_parallel_args(cfg: DictConfig, registry) -> None:
    """The parallel sizes of ``rollout.vllm.args`` (tensor, pipeline, data) are the GPUs an engine sampler actor
    asks Ray for (:func:`server_gpus`, cluster/placement.py): a value that is not a positive integer is refused here,
    before anything is written."""
    r = cfg.get("rollout")
    if r is None or r.get("engine") != "vllm" or r.get("vllm") is None:
        return
    server_gpus(r.vllm.get("args"))


def model_bases(cfg: DictConfig, registry) -> None:
    """``model.bases`` / ``model.role_base`` (a base per role): names, each base's keys and values (the rules of
    the ``model.*`` keys they replace), the roles (against the domain's), an algorithm that builds a swarm; and
    ``rollout.urls`` (one server per base)."""
    from dataclasses import replace

    from swarm_runtime.models import bases as B

    domains = getattr(registry, "domains", {}) if registry is not None else {}
    domain = domains.get(cfg.get("domain")) if isinstance(cfg.get("domain"), str) else None
    roles = [r.name for r in domain.roles] if domain is not None else None
    B.check(cfg.model, roles)
    for name, keys in B.bases_of(cfg.model).items():
        for k, v in keys.items():
            rule = RULES.get(f"model.{k}")
            if rule is not None and not (rule.lazy and not lazy_ok(registry)):
                check_rule(replace(rule, key=f"model.bases.{name}.{k}"), v)
        try:  # its shape, as model.*'s
            model_shape(OmegaConf.create({"model": B.base_cfg(cfg.model, name)}), registry)
        except ConfigError as exc:
            raise ConfigError(f"the base {name!r} (model.* with model.bases.{name}.*): {exc}") from None
    if B.multi(cfg.model) and cfg.algo.name in ONE_MODEL_ALGOS:
        raise ConfigError(
            f"model.role_base gives roles their own bases, but algo={cfg.algo.name} trains one model; "
            f"valid: algo=mpt, or drop model.role_base"
        )
    r = cfg.get("rollout")
    urls = dict(r.get("urls") or {}) if r is not None else {}
    if urls and r.get("engine") != "openai":
        raise ConfigError(
            f"rollout.urls is read by rollout.engine=openai only (got rollout.engine={r.get('engine')}); "
            "drop rollout.urls"
        )
    valid = list(B.bases_of(cfg.model))
    bad = [n for n in urls if n not in valid]
    if bad:
        raise ConfigError(
            f"rollout.urls.{bad[0]}: no base {bad[0]!r} in model.bases; valid: "
            f"{', '.join(valid) or '(none: declare model.bases.NAME first)'} (rollout.url serves the "
            "default base)"
        )
    if r is None or r.get("engine") != "openai":
        return
    used = B.groups(cfg.model, roles) if roles is not None else {n: [] for n in B.role_bases(cfg.model).values()}
    missing = [n for n in used if n != B.DEFAULT and n not in urls]
    if missing:
        raise ConfigError(
            f"rollout.engine=openai with several bases needs one server per base: give "
            f"rollout.urls.{missing[0]}=http://host:port (rollout.url serves the default base)"
        )
    if not r.get("url") and B.DEFAULT in used:  # every role on a named base: rollout.url serves none
        raise ConfigError(f"{NEEDS_URL}: {', '.join(used[B.DEFAULT])} sit on the default base (model.*)")
