"""Whether a checkpoint may be swapped in for the one being served (:func:`check_swappable`): the checkpoint's own
check (:func:`swarm_runtime.runs.agents_check.check_agents`: files, policy files, adapter bases, finite weights), then
that it is a checkpoint of the same swarm: the same model folders (roles), the same kind (full copies or adapters),
the same bases (an adapter's base fingerprint; a full copy's architecture), the same tokenizer and the same bid levels
and bid mode. The first difference is a :class:`~swarm_runtime.serve.validate.BadRequest` (422) naming it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from swarm_runtime.runs.checkpoint import CheckpointError
from swarm_runtime.serve.validate import BadRequest

#: The ``config.json`` fields that make a full copy's architecture: two checkpoints of one swarm agree on all of them.
ARCH_KEYS = (
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
)
#: The tokenizer files compared (those a folder has): JSON ones by content less :data:`LOADER_KEYS`, others byte for
#: byte.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")
#: Keys transformers writes into ``tokenizer_config.json`` about how the tokenizer was loaded, not what it is: a
#: resumed run's checkpoints (its tokenizer loaded from the folder) have them, the first run's do not.
LOADER_KEYS = ("is_local", "local_files_only", "name_or_path", "_commit_hash", "cache_dir")
#: Where a tokenizer's chat template is: ``tokenizer_config.json``'s ``chat_template`` (older transformers, or written
#: by hand), or this file (transformers 5 saves it there): compared as one thing, wherever it is.
TEMPLATE_FILE = "chat_template.jinja"


def _refuse(what: str) -> BadRequest:
    return BadRequest(
        f"checkpoint: {what}; give a checkpoint of the swarm being served", param="checkpoint", status=422
    )


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _digest(folder: Path, names) -> dict[str, str]:
    """Each file's sha256: a JSON object's of its content without :data:`LOADER_KEYS` and the chat template (keys
    sorted), else its bytes; and the chat template's, wherever it is (:data:`TEMPLATE_FILE`)."""
    out = {}
    for n in names:
        path = folder / n
        if not path.is_file():
            continue
        data = path.read_bytes()
        if n.endswith(".json"):
            try:
                obj = json.loads(data)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                keep = {k: v for k, v in obj.items() if k not in LOADER_KEYS and k != "chat_template"}
                data = json.dumps(keep, sort_keys=True).encode()
        out[n] = hashlib.sha256(data).hexdigest()
    template = _json(folder / "tokenizer_config.json").get("chat_template")
    if template is None and (folder / TEMPLATE_FILE).is_file():
        template = (folder / TEMPLATE_FILE).read_text()
    if template is not None:
        out["chat template"] = hashlib.sha256(json.dumps(template).encode()).hexdigest()
    return out


def model_signature(folder: Path) -> dict:
    """What must agree between two checkpoints of one swarm, for one model folder: its kind, its base (an adapter's
    base fingerprint, a full copy's architecture), its tokenizer's files and its bid levels and mode."""
    policy = _json(folder / "swarm_policy.json")
    pointer = folder / "swarm_base.json"
    if pointer.exists():
        base = {"fingerprint": _json(pointer).get("fingerprint")}
    else:
        cfg = _json(folder / "config.json")
        base = {k: cfg.get(k) for k in ARCH_KEYS}
    return {
        "kind": "adapter" if pointer.exists() else "full copy",
        "base": base,
        "tokenizer": _digest(folder, TOKENIZER_FILES),
        "bid levels": [float(b) for b in policy.get("bid_levels", [])],
        "bid mode": policy.get("bid_mode", "logits"),
    }


def _differs(served: dict, new: dict) -> str | None:
    for key in ("kind", "base", "tokenizer", "bid levels", "bid mode"):
        if served[key] != new[key]:
            if key == "base":
                was, now = served["base"], new["base"]
                diff = [f"{k} {now.get(k)!r}, served: {was.get(k)!r}" for k in was if was.get(k) != now.get(k)]
                return f"its base differs ({'; '.join(diff)})"
            if key == "tokenizer":
                files = sorted(set(served["tokenizer"]) | set(new["tokenizer"]))
                diff = [f for f in files if served["tokenizer"].get(f) != new["tokenizer"].get(f)]
                return f"its tokenizer differs ({', '.join(diff)})"
            verb = "differ" if key.endswith("s") else "differs"
            return f"its {key} {verb} ({new[key]!r}, served: {served[key]!r})"
    return None


def check_swappable(served: Path, new: Path) -> None:
    """Refuse (:class:`BadRequest`, 422) checkpoint folder ``new`` unless it is a sound checkpoint of the swarm whose
    checkpoint ``served`` is being served (module docstring)."""
    from swarm_runtime.runs.agents_check import check_agents

    have = sorted(p.name for p in (served / "agents").iterdir() if p.is_dir())
    try:
        check_agents(new, have)
    except CheckpointError as exc:
        raise _refuse(str(exc)) from None
    got = sorted(p.name for p in (new / "agents").iterdir() if p.is_dir())
    if got != have:
        raise _refuse(f"{new} holds the models {', '.join(got)}; the swarm served has {', '.join(have)}")
    for name in have:
        why = _differs(model_signature(served / "agents" / name), model_signature(new / "agents" / name))
        if why:
            raise _refuse(f"{new / 'agents' / name} is not a checkpoint of the served {name}: {why}")
