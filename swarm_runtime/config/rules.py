"""A config key's rule: the :class:`Rule` type, the value specs rules are made of, and checking a value.

A value spec is a pair ``(ok, valid)``: ``ok(value)`` is True for a valid value and ``valid`` says in words what
is valid, for the error message (:func:`ints`, :func:`floats`, :func:`choices`, :func:`lists`, :data:`BOOL`,
:data:`STR`, :data:`DEVICE`). :func:`rule` turns a key and a spec into a :class:`Rule`; every key's rule is in
:mod:`swarm_runtime.config.keys`. :func:`check_rule` raises a :class:`ConfigError` naming the key, the bad value
and what is valid; :func:`check_name` does the same for a name that must be one of a table's (a preset, a domain,
a plugin's coordinator).

This module imports nothing of the config but its error: it is the bottom of the validation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from swarm_runtime.config.errors import ConfigError

#: Loguru levels (``log_level``).
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
#: Weight dtypes (``model.dtype``).
DTYPES = ("float32", "float16", "bfloat16")
#: Torch devices the runtime places models on (``model.device``, ``hardware.device``).
DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?|mps")
#: A bound on run lengths: beyond it a value is a typo, not a plan.
MAX_COUNT = 10_000_000
#: Largest run seed: seeds are combined (``seed * 100 + role``, ``seed + 7919``) and must stay a torch seed.
MAX_SEED = 2**31 - 1
#: Most workers per role ``swarm serve`` starts (each a process holding a model).
MAX_REPLICAS = 64


@dataclass(frozen=True)
class Rule:
    """A key's valid values: ``ok(value)`` is True for a valid (non-null) value; ``valid`` says
    what is valid in words; ``nullable``: null is valid too (with ``null_means``); ``lazy``: the
    rule imports something heavy (torch), so a check of the command line before the plugins load
    (:func:`swarm_runtime.config.load.precheck`) leaves it to :func:`swarm_runtime.config.validation.validate`."""

    key: str
    ok: Callable[[Any], bool]
    valid: str | Callable[[], str]
    nullable: bool = False
    null_means: str = ""
    lazy: bool = False


def rule(key: str, spec: tuple[Callable, str], **kw) -> Rule:
    """The :class:`Rule` of ``key`` from a value spec ``(ok, valid)``; ``kw``: the rest of :class:`Rule`'s fields."""
    ok, valid = spec
    return Rule(key, ok, valid, **kw)


# ---------------------------------------------------------------- value specs
def is_number(v) -> bool:
    """An int or a float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def ints(lo: int, hi: int = MAX_COUNT) -> tuple[Callable, str]:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi, f"an integer in [{lo}, {hi}]")


def floats(
    lo: float = -math.inf, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False
) -> tuple[Callable, str]:
    def ok(v):
        if not is_number(v) or not math.isfinite(v):
            return False
        return (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)

    lo_s = "" if lo == -math.inf else f"{'>' if lo_open else '>='} {lo:g}"
    hi_s = "" if hi == math.inf else f"{'<' if hi_open else '<='} {hi:g}"
    return ok, "a finite number " + " and ".join(s for s in (lo_s, hi_s) if s)


def choices(*values) -> tuple[Callable, str]:
    return (lambda v: v in values), "one of " + ", ".join(str(v) for v in values)


def lists(item: tuple[Callable, str], nonempty: bool = True) -> tuple[Callable, str]:
    ok, what = item
    return (
        (lambda v: isinstance(v, (list, ListConfig)) and (len(v) > 0 or not nonempty) and all(ok(x) for x in v)),
        f"a {'non-empty ' if nonempty else ''}list, each item {what}",
    )


def at_least(lo: int, hi: int) -> tuple[Callable, str]:
    """:func:`ints`, worded ``at least lo and at most hi``."""
    return ints(lo, hi)[0], f"an integer, at least {lo} and at most {hi}"


def is_http(v) -> bool:
    """An ``http://`` or ``https://`` URL with something after the scheme."""
    return isinstance(v, str) and v.startswith(("http://", "https://")) and v.partition("://")[2] != ""


BOOL = ((lambda v: isinstance(v, bool)), "true or false")
STR = ((lambda v: isinstance(v, str) and v != ""), "a non-empty string")
DEVICE = ((lambda v: isinstance(v, str) and DEVICE_RE.fullmatch(v) is not None), "cpu, cuda, cuda:N or mps")


# ---------------------------------------------------------------- checking a value
def lazy_ok(registry) -> bool:
    """Whether the lazy rules (which import torch) run: not with the light registry of a precheck
    (:func:`swarm_runtime.config.load.light_registry`)."""
    return not getattr(registry, "light", False)


def fmt(v) -> str:
    """A value as an error message shows it: strings quoted, config nodes as plain lists and mappings."""
    if isinstance(v, (DictConfig, ListConfig)):
        v = OmegaConf.to_container(v)
    return repr(v) if isinstance(v, str) else str(v)


def value_at(cfg: DictConfig, key: str):
    """``key``'s value (``KeyError`` when absent), interpolations resolved (an error naming the key)."""
    node = cfg
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node, DictConfig) or p not in node:
            raise KeyError(key)
        node = node[p]
    if not isinstance(node, DictConfig) or parts[-1] not in node:
        raise KeyError(key)
    if OmegaConf.is_missing(node, parts[-1]):
        raise ConfigError(f"{key} must be set (it has no default here)")
    try:
        return node[parts[-1]]
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{key}: {str(exc).splitlines()[0]}") from exc


def _valid(r: Rule) -> str:
    return r.valid() if callable(r.valid) else r.valid


def check_rule(r: Rule, value) -> None:
    """Raise a :class:`ConfigError` naming ``r.key``, ``value`` and what is valid unless ``value`` is."""
    if value is None:
        if r.nullable:
            return
        raise ConfigError(f"{r.key}=null is not valid: must be {_valid(r)}")
    if isinstance(value, (ListConfig, DictConfig)):
        value = OmegaConf.to_container(value)
    if not r.ok(value):
        null = f" (or null: {r.null_means})" if r.nullable and r.null_means else (" or null" if r.nullable else "")
        raise ConfigError(f"{r.key}={fmt(value)} is not valid: must be {_valid(r)}{null}")


def check_name(key: str, value, valid, where: str = "") -> None:
    """``value`` is one of ``valid`` (listed in the message in their order), else ``unknown KEY 'VALUE'WHERE; valid:
    ...``: the one wording of a name that must be a registered or shipped one (``where``: more about the key, e.g.
    `` for domain 'minecraft'``)."""
    if value not in valid:
        raise ConfigError(f"unknown {key} {value!r}{where}; valid: {', '.join(valid) or '(none)'}")
