"""One check of a saved adapter's base (swarm_runtime/models/adapters.py: ``check_adapter_base``): the checkpoint check
before anything loads it (runs/agents_check.py), a run building on the adapters (``resolve_base``) and an export
refuse a missing or changed base with the same line naming the pointer file. Hand-made folders; well under a second."""

import json
from pathlib import Path

import pytest

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.models.adapters import check_adapter_base, export_adapters, fingerprint, resolve_base
from swarm_runtime.runs.agents_check import OTHER, _base
from swarm_runtime.runs.checkpoint import CheckpointError


def _adapter(tmp_path: Path) -> tuple[Path, Path]:
    """``agents/Smith``, an adapter folder whose ``swarm_base.json`` points to the sibling folder ``base``."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "llama"}')
    smith = tmp_path / "agents" / "Smith"
    smith.mkdir(parents=True)
    ptr = {"base": "../../base", "fingerprint": fingerprint(base), "trained_base": False, "arch": {}, "bid_rows": 3}
    (smith / "swarm_base.json").write_text(json.dumps(ptr))
    return smith, base


def _refusals(smith: Path) -> list[str]:
    """What the checkpoint check, a run building on the adapter and an export say (the first with its advice)."""
    with pytest.raises(CheckpointError) as checked:
        _base(smith)
    with pytest.raises(ConfigError) as built:
        resolve_base({}, smith.parent, ["Smith"])
    with pytest.raises(ConfigError) as exported:
        export_adapters(smith.parent, smith.parent.parent / "out", ["Smith"], [0.0, 1.0], merged=False)
    assert str(checked.value).endswith(f"; {OTHER}")
    return [str(checked.value).removesuffix(f"; {OTHER}"), str(built.value), str(exported.value)]


def test_a_missing_or_changed_base_is_one_line_everywhere(tmp_path):
    smith, base = _adapter(tmp_path)
    ptr, folder = check_adapter_base(smith)
    assert folder == base.resolve() and ptr["fingerprint"] == fingerprint(base)
    _base(smith)  # as the checkpoint check passes it
    (base / "config.json").write_text('{"model_type": "qwen2"}')
    changed = _refusals(smith)
    want = f"the base {str(base.resolve())!r} of Smith does not match the fingerprint {smith / 'swarm_base.json'}"
    assert len(set(changed)) == 1 and changed[0].startswith(want) and changed[0].endswith("the base was changed")
    (base / "config.json").unlink()
    missing = _refusals(smith)  # an export used to fail with FileNotFoundError here
    assert len(set(missing)) == 1
    assert missing[0] == f"{smith / 'swarm_base.json'} names the base {str(base.resolve())!r}, which is missing"
