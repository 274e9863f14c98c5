"""Secrets in configs (API keys, tokens): a key whose last name part is ``api_key``, ``secret``,
``password`` or ``token`` (alone or as ``hf_token``, ``api_token``, ``access_token`` ...) (``task.llm_judge.api_key``, ``serve.hf_token`` ...) holds a secret. Give such a value
through its environment variable (``OPENAI_API_KEY`` for the LLM judge): a value given on the
command line is used by this process but written nowhere: config.yaml, ``swarm config``, logs,
error messages and eval file names show :data:`REDACTED` instead (and a saved ``<redacted>``
reads back as null, so a resumed or evaluated run takes the key from the environment)."""

from __future__ import annotations

import re

from omegaconf import DictConfig, ListConfig, OmegaConf

#: What a secret value is replaced by wherever it would be written or shown.
REDACTED = "<redacted>"
_SECRET_NAME = re.compile(
    r"(^|_)(api_key|apikey|secret|password)$|^((hf|api|auth|access|bearer)_)?token$", re.IGNORECASE
)  # ``token`` alone or with a credential prefix: not ``seconds_per_token``
#: Secret values seen in this process (command-line arguments), scrubbed from every log line.
_SEEN: set[str] = set()


def is_secret_key(key: str) -> bool:
    """Whether the dotted config ``key`` names a secret."""
    return bool(_SECRET_NAME.search(str(key).rsplit(".", 1)[-1]))


def _strings(value, secret: bool):
    """The strings a secret holds in ``value`` (a YAML value): all of it under a secret key
    (``secret``), else those under secret keys of its mappings, at any depth of lists and mappings."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, secret or is_secret_key(str(k)))
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, secret)
    elif secret and value is not None and not isinstance(value, bool):
        yield str(value)


def note_args(args) -> None:
    """Remember the secret values among ``key=value`` arguments, to scrub them from logs: a secret
    key's value (a string, or each string of a list or mapping given as its value) and the strings
    under secret keys of a mapping given to another key (``task.llm_judge={api_key: ...}``)."""
    import yaml

    for a in args or ():
        k, eq, v = str(a).partition("=")
        if not eq:
            continue
        try:
            parsed = yaml.safe_load(v)
        except yaml.YAMLError:
            parsed = v
        found = list(_strings(parsed, is_secret_key(k)))
        if is_secret_key(k):
            found.append(v)
        _SEEN.update(x for x in found if len(x) >= 4 and x != REDACTED)


def scrub(text: str) -> str:
    """``text`` with every secret value seen in this process replaced by :data:`REDACTED`."""
    for v in sorted(_SEEN, key=len, reverse=True):
        text = text.replace(v, REDACTED)
    return text


def redact_args(args) -> list[str]:
    """``key=value`` arguments with secret values replaced (for file names and saved arguments)."""
    out = []
    for a in args or ():
        k, eq, v = str(a).partition("=")
        out.append(f"{k}={REDACTED}" if eq and is_secret_key(k) and v not in ("", "null", "None") else scrub(str(a)))
    return out


def _walk(node, fn) -> None:
    """``fn(mapping, key)`` on every key of ``node`` that holds a plain value or names a secret (whatever
    it holds: a list or mapping under ``api_key`` is one secret), through mappings and lists at any depth."""
    if isinstance(node, DictConfig):
        for k in list(node.keys()):
            child = node._get_node(k)
            value = node[k] if not OmegaConf.is_missing(node, k) and not _is_interp(child) else None
            if isinstance(value, (DictConfig, ListConfig)) and not is_secret_key(str(k)):
                _walk(value, fn)
            else:
                fn(node, k)
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            if not OmegaConf.is_missing(node, i) and not _is_interp(node._get_node(i)):
                _walk(node[i], fn)


def _is_interp(child) -> bool:
    try:
        return child._is_interpolation()
    except AttributeError:
        return False


def redacted(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` with every secret-named key that holds a value set to :data:`REDACTED`."""
    out = cfg.copy()

    def fix(node, k):
        value = node._get_node(k)
        empty = (
            value is None
            or value._is_none()
            or (not isinstance(value, (DictConfig, ListConfig)) and node[k] in ("", REDACTED))
        )
        if is_secret_key(str(k)) and not empty:
            flag = node._get_flag("struct")
            OmegaConf.set_struct(node, False)
            node[k] = REDACTED
            OmegaConf.set_struct(node, flag)

    _walk(out, fix)
    return out


def unredact(cfg: DictConfig) -> DictConfig:
    """A saved config's :data:`REDACTED` values read back as null (the key comes from the environment)."""

    def fix(node, k):
        if is_secret_key(str(k)) and not isinstance(node[k], (DictConfig, ListConfig)) and node[k] == REDACTED:
            node[k] = None

    _walk(cfg, fix)
    return cfg


def save_config(cfg: DictConfig, path) -> None:
    """``OmegaConf.save`` with secrets redacted, written atomically."""
    import os
    from pathlib import Path

    from swarm_runtime.runs.runfiles import claim

    path = claim(Path(path))
    tmp = path.with_name(f".{path.name}.tmp")
    OmegaConf.save(redacted(cfg), tmp)
    os.replace(tmp, path)


def install_log_scrubber() -> None:
    """Scrub secret values seen on the command line from every loguru message."""
    from loguru import logger

    def patch(record):
        if _SEEN:
            record["message"] = scrub(record["message"])

    logger.configure(patcher=patch)


# ---------------------------------------------------------------- endpoints a run folder names
_ENDPOINT_NAME = re.compile(r"(^|_)(base_url|url|endpoint)$", re.IGNORECASE)
#: Endpoints (URL -> (key, file)) a run folder's saved config names that neither the command line nor the
#: shipped defaults give (:func:`note_saved_endpoints`): no key is sent to them (:func:`check_endpoint`).
_FOREIGN_ENDPOINTS: dict[str, tuple[str, str]] = {}


def is_endpoint_key(key: str) -> bool:
    """Whether the dotted config ``key`` names a network endpoint (``base_url``, ``url``, ``*_endpoint``, and each
    base's server ``rollout.urls.NAME``)."""
    return bool(_ENDPOINT_NAME.search(str(key).rsplit(".", 1)[-1])) or str(key).startswith("rollout.urls.")


def _leaves(node, prefix: str = ""):
    if isinstance(node, DictConfig):
        for k in node.keys():
            child = node._get_node(k)
            if OmegaConf.is_missing(node, k) or _is_interp(child):
                continue
            value = node[k]
            if isinstance(value, DictConfig):
                yield from _leaves(value, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", value


def note_saved_endpoints(cfg: DictConfig, shipped: DictConfig | None, given_keys, source) -> list[str]:
    """Remember the endpoints ``cfg`` (a run folder's saved config, the command line applied) names that
    came with the folder: not among ``given_keys`` (the full keys the command line set) and not the
    shipped default (``shipped``: the same domain and task resolved with nothing else; None = unknown).
    Replaces what an earlier call noted; returns the keys noted."""
    _FOREIGN_ENDPOINTS.clear()
    given = set(given_keys)
    for key, value in _leaves(cfg):
        if not is_endpoint_key(key) or value in (None, "") or key in given:
            continue
        if shipped is not None and OmegaConf.select(shipped, key, default=None) == value:
            continue
        _FOREIGN_ENDPOINTS[str(value).rstrip("/")] = (key, str(source))
    return [k for k, _ in _FOREIGN_ENDPOINTS.values()]


def trust_endpoint(url) -> None:
    """Send keys to ``url`` although a saved config named it (:func:`note_saved_endpoints`): what giving its key on
    the command line does, for a program that loads a run folder's config itself
    (:func:`swarm_runtime.config.load.load_saved`)."""
    _FOREIGN_ENDPOINTS.pop(str(url).rstrip("/"), None)


def check_endpoint(url, what: str) -> None:
    """Before sending ``what`` (a key: ``the key in OPENAI_API_KEY``) to ``url``: refuse an endpoint a run
    folder named that neither the command line nor the shipped defaults give (a folder from elsewhere
    could name any server), naming the key that holds it and how to trust it."""
    from swarm_runtime.config.errors import ConfigError

    hit = _FOREIGN_ENDPOINTS.get(str(url).rstrip("/")) if url else None
    if hit is not None:
        key, source = hit
        raise ConfigError(
            f"{key}={url!r} comes from {source}, not from the command line or the shipped defaults; "
            f"swarm does not send {what} to an endpoint a run folder names: give {key}={url} on the "
            "command line if you trust it (a program: secrets.trust_endpoint), or another endpoint"
        )


# ---------------------------------------------------------------- Ray clusters a run folder names
def refuse_saved_ray_head(cfg: DictConfig, key: str, given_keys, source) -> None:
    """A Ray head's address at ``key`` (``cluster.address``, ``serve.address``) that ``cfg`` (a saved run's
    config, the command line applied) joins but that came with the folder (the command line, ``given_keys``
    its full keys, does not give it or a section holding it): refused before anything connects. Joining it
    would ship the run's models to whatever answers there and unpickle what it sends back."""
    from swarm_runtime.config.errors import ConfigError

    address = OmegaConf.select(cfg, key, default=None)
    if address in (None, "") or any(key == g or key.startswith(f"{g}.") for g in given_keys):
        return
    raise ConfigError(
        f"{key}={address!r} comes from {source}, not from the command line; swarm does not join a Ray cluster "
        f"a run folder names (it would ship the run's models there and run what it answers): give "
        f"{key}={address} on the command line if you trust it, or {key}=null for a local Ray"
    )


# ---------------------------------------------------------------- programs, servers and flags a saved config names
def _engine(cfg) -> str:
    return str(OmegaConf.select(cfg, "rollout.engine", default="local") or "local")


#: Keys whose value chooses a program this machine runs, the flags of a server it starts, or the server the run's
#: prompts (and keys) go to, each with whether a config uses it. Like a Ray head (:func:`refuse_saved_ray_head`) they
#: come from the command line (or the user's environment: ``$SWARM_VLLM_PYTHON``, ``$OPENAI_BASE_URL``); a value a
#: run folder's ``config.yaml`` or a ``recipe=PATH`` file holds is refused unless the command line gives it too.
CHOSEN_ON_THE_COMMAND_LINE = {
    "rollout.vllm.python": lambda cfg: _engine(cfg) == "vllm",
    "rollout.vllm.args": lambda cfg: _engine(cfg) == "vllm",
    "rollout.url": lambda cfg: _engine(cfg) == "openai",
    "rollout.urls": lambda cfg: _engine(cfg) == "openai",
    "task.llm_judge.base_url": lambda cfg: OmegaConf.select(cfg, "task.judge", default=None) == "llm",
}


#: Ray heads a run joins (``cluster.address`` for ``swarm run`` and ``swarm eval``, ``serve.address`` for
#: ``swarm serve``): joining one ships the run's models there and unpickles what it answers. Like the keys of
#: :data:`CHOSEN_ON_THE_COMMAND_LINE` they come from the command line: a run folder's saved one is refused by
#: :func:`refuse_saved_ray_head` (``runs/folder.py: RAY_HEADS`` says which command joins which), a ``recipe=PATH``
#: file's by :func:`recipe_choices` (``cli/recipes.py``).
RAY_HEAD_KEYS = ("cluster.address", "serve.address")


def gives(key: str, given_keys) -> bool:
    """Whether the command line (``given_keys``, full keys) gives ``key``: itself or a section holding it."""
    return any(key == g or key.startswith(f"{g}.") for g in given_keys)


def _empty(value) -> bool:
    if isinstance(value, (DictConfig, ListConfig)):
        return len(value) == 0
    return value in (None, "") or value == [] or value == {}


def shown_value(value) -> str:
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    return " ".join(str(value).split())[:200]


def refuse_saved_choices(cfg: DictConfig, given_keys, source, keys=None) -> None:
    """Refuse a key of :data:`CHOSEN_ON_THE_COMMAND_LINE` (or ``keys``, a subset of it) that ``cfg`` (a saved run's
    config, the command line applied) uses and holds a value for that came with ``source`` (its ``config.yaml``):
    the command line (``given_keys``, its full keys) does not give it. One line naming the key, the value, the file
    and both ways on, before anything runs or connects."""
    from swarm_runtime.config.errors import ConfigError

    for name in keys or CHOSEN_ON_THE_COMMAND_LINE:
        value = OmegaConf.select(cfg, name, default=None)
        if _empty(value) or not CHOSEN_ON_THE_COMMAND_LINE[name](cfg):
            continue
        each = {f"{name}.{k}": v for k, v in value.items()} if isinstance(value, DictConfig) else {name: value}
        for key, v in each.items():  # a mapping (rollout.urls) key by key: the command line may give some
            if _empty(v) or gives(key, given_keys):
                continue
            raise ConfigError(
                f"{key}={shown_value(v)!r} comes from {source}, not from the command line; swarm does not run a "
                "program, pass server flags or send the run's prompts and keys where a saved file says: give "
                f"{key}=... on the command line if you trust it"
            )


def recipe_choices(data: dict, known_top: set[str]) -> list[tuple[str, object]]:
    """The ``(full key, value)`` of :data:`CHOSEN_ON_THE_COMMAND_LINE` and :data:`RAY_HEAD_KEYS` keys a recipe's
    mapping ``data`` sets to a value (a section given as a mapping, ``rollout: {vllm: {python: ...}}``, read key by
    key; a bare task key, ``llm_judge``, as ``task.llm_judge``). ``known_top``: the config's top-level keys."""
    out = []
    for key, value in _flat(data):
        if key.split(".", 1)[0] not in known_top:
            key = f"task.{key}"
        chosen = (*CHOSEN_ON_THE_COMMAND_LINE, *RAY_HEAD_KEYS)
        hit = next((k for k in chosen if key == k or key.startswith(f"{k}.")), None)
        if hit is not None and not _empty(value):
            out.append((key, value))
    return out


def _flat(data: dict, prefix: str = ""):
    for k, v in data.items():
        if isinstance(v, dict) and v:
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v
