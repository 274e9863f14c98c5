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
_SECRET_NAME = re.compile(r"(^|_)(api_key|apikey|secret|password)$|^((hf|api|auth|access|bearer)_)?token$",
                          re.IGNORECASE)  # ``token`` alone or with a credential prefix: not ``seconds_per_token``
#: Secret values seen in this process (command-line arguments), scrubbed from every log line.
_SEEN: set[str] = set()


def is_secret_key(key: str) -> bool:
    """Whether the dotted config ``key`` names a secret."""
    return bool(_SECRET_NAME.search(str(key).rsplit(".", 1)[-1]))


def note_args(args) -> None:
    """Remember the secret values among ``key=value`` arguments, to scrub them from logs."""
    for a in args or ():
        k, eq, v = str(a).partition("=")
        if eq and is_secret_key(k) and len(v) >= 4 and v != REDACTED:
            _SEEN.add(v)


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
    if isinstance(node, DictConfig):
        for k in list(node.keys()):
            child = node._get_node(k)
            value = node[k] if not OmegaConf.is_missing(node, k) and not _is_interp(child) else None
            if isinstance(value, (DictConfig, ListConfig)):
                _walk(value, fn)
            else:
                fn(node, k)


def _is_interp(child) -> bool:
    try:
        return child._is_interpolation()
    except AttributeError:
        return False


def redacted(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` with every secret-named key that holds a value set to :data:`REDACTED`."""
    out = cfg.copy()

    def fix(node, k):
        if is_secret_key(str(k)) and node[k] not in (None, "", REDACTED):
            flag = node._get_flag("struct")
            OmegaConf.set_struct(node, False)
            node[k] = REDACTED
            OmegaConf.set_struct(node, flag)
    _walk(out, fix)
    return out


def unredact(cfg: DictConfig) -> DictConfig:
    """A saved config's :data:`REDACTED` values read back as null (the key comes from the environment)."""
    def fix(node, k):
        if is_secret_key(str(k)) and node[k] == REDACTED:
            node[k] = None
    _walk(cfg, fix)
    return cfg


def save_config(cfg: DictConfig, path) -> None:
    """``OmegaConf.save`` with secrets redacted, written atomically."""
    import os
    from pathlib import Path

    path = Path(path)
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
