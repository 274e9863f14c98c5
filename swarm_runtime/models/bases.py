"""Different base models per role (``model.bases`` + ``model.role_base``; docs/guides/gpu.md, "A base per role").

A run's roles sit on one base by default: ``model.*``. ``model.bases.NAME.KEY=VALUE`` declares another
base named ``NAME`` whose settings are ``model.*`` with the keys it gives replaced (``path``, the tiny
model's shape, ``dtype``, ``arch``: :data:`BASE_KEYS`), and ``model.role_base.ROLE=NAME`` puts a role on
it. Roles on one base share it: with ``model.adapter=lora`` one copy of it in memory with an adapter per
role, and one engine server per base (``rollout.engine=openai|vllm``); with full copies each role has
its own model anyway, built from its base's settings. Pure functions over the model section.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from swarm_runtime.config.errors import ConfigError

#: The name of the base ``model.*`` describes (roles ``model.role_base`` does not name sit on it).
DEFAULT = "default"
#: The ``model.*`` keys a base of ``model.bases`` may set (the rest are the run's: sampling, adapters, ...).
BASE_KEYS = (
    "path",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "max_positions",
    "dtype",
    "arch",
)
#: A base name: it names a checkpoint folder (``base-NAME``) and a ``rollout.urls`` key.
NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,40}")


def _section(model_cfg, key: str) -> dict:
    v = model_cfg.get(key) if model_cfg is not None else None
    if v is None:
        return {}
    return OmegaConf.to_container(v, resolve=True) if isinstance(v, DictConfig) else dict(v)


def bases_of(model_cfg) -> dict[str, dict]:
    """``model.bases``: base name -> the ``model.*`` keys it replaces."""
    return _section(model_cfg, "bases")


def role_bases(model_cfg) -> dict[str, str]:
    """``model.role_base``: role -> base name (roles it does not name sit on ``model.*``)."""
    return {str(k): str(v) for k, v in _section(model_cfg, "role_base").items()}


def base_name(model_cfg, role: str) -> str:
    """The base ``role`` sits on (:data:`DEFAULT`: ``model.*``)."""
    return role_bases(model_cfg).get(role, DEFAULT)


def multi(model_cfg) -> bool:
    """Whether any role sits on a base other than ``model.*``."""
    return any(v != DEFAULT for v in role_bases(model_cfg).values())


def base_cfg(model_cfg, name: str) -> DictConfig:
    """The model settings of base ``name``: ``model.*`` with its ``model.bases.NAME`` keys, and no
    ``bases`` / ``role_base`` of its own."""
    out = OmegaConf.create(OmegaConf.to_container(model_cfg, resolve=True))
    for k in ("bases", "role_base"):
        if k in out:
            out[k] = {}
    if name != DEFAULT:
        keys = bases_of(model_cfg).get(name, {})
        if "path" in keys and "arch" not in keys:
            out["arch"] = None  # model.arch describes model.*'s checkpoint, not this one
        for k, v in keys.items():
            out[k] = v
    return out


def role_cfg(model_cfg, role: str) -> DictConfig:
    """The model settings of ``role``'s base (``model_cfg`` itself when it sits on ``model.*``)."""
    name = base_name(model_cfg, role)
    return model_cfg if name == DEFAULT else base_cfg(model_cfg, name)


def groups(model_cfg, roles: Sequence[str]) -> dict[str, list[str]]:
    """Base name -> its roles, in the order of the roles' first appearance."""
    out: dict[str, list[str]] = {}
    for r in roles:
        out.setdefault(base_name(model_cfg, r), []).append(r)
    return out


def base_dir(name: str) -> str:
    """The folder of a trained base inside a checkpoint: ``base`` (``model.*``; the one-base layout) or ``base-NAME``."""
    return "base" if name == DEFAULT else f"base-{name}"


def check(model_cfg, roles: Sequence[str] | None = None) -> None:
    """Refuse a bad ``model.bases`` / ``model.role_base`` (naming the bad base, key or role and the valid
    ones); ``roles``: the run's roles (None: not known yet, role names unchecked)."""
    bases, role_base = bases_of(model_cfg), _section(model_cfg, "role_base")
    for name, keys in bases.items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name == DEFAULT:
            raise ConfigError(
                f"model.bases.{name}: a base name is 1-40 letters, digits, '-' or '_', and not "
                f"{DEFAULT!r} (the base model.* describes)"
            )
        if not isinstance(keys, dict) or not keys:
            raise ConfigError(
                f"model.bases.{name}={keys!r} is not valid: must set some of {', '.join(BASE_KEYS)} "
                f"(e.g. model.bases.{name}.path=/models/qwen3-8b)"
            )
        bad = [k for k in keys if k not in BASE_KEYS]
        if bad:
            raise ConfigError(
                f"model.bases.{name}.{bad[0]} is not a base setting; valid: {', '.join(BASE_KEYS)} "
                "(the other model.* keys are the run's, shared by every base)"
            )
    valid = [DEFAULT, *bases]
    for role, name in role_base.items():
        if roles is not None and role not in roles:
            raise ConfigError(f"model.role_base.{role}: no role {role!r}; valid: {', '.join(roles)}")
        if str(name) not in valid:
            raise ConfigError(
                f"model.role_base.{role}={name!r}: no base {name!r}; valid: {', '.join(valid)} "
                f"(declare one with model.bases.{name}.path=... or model.bases.{name}.hidden_size=...)"
            )
    unused = [n for n in bases if n not in {str(v) for v in role_base.values()}]
    if unused:
        raise ConfigError(
            f"model.bases.{unused[0]} is given to no role; put a role on it "
            f"(model.role_base.ROLE={unused[0]}) or drop it"
        )
