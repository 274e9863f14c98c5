"""One worker, one base, many LoRA adapters: serving a ``model.adapter=lora`` run.

    python -m swarm_runtime.serve.worker --model RUN/checkpoints/TAG/base \\
        --lora-modules Logger=RUN/checkpoints/TAG/agents/Logger Miner=... Smith=...

The base is loaded once and every adapter onto it (PEFT), as ``vllm serve BASE --enable-lora
--lora-modules NAME=PATH`` does; each request's ``model`` names its adapter, and requests for several
adapters that arrive together run as one batch, each row through its own adapter
(:meth:`swarm_runtime.models.adapters.AdapterPolicy.routed`, the mixed batch training uses). So 12
agents of 3 roles on one base cost one base in memory. vLLM's runtime endpoints are served with vLLM's
request shapes: ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` loads a PEFT adapter folder
onto the base (replacing one of that name), ``POST /v1/unload_lora_adapter {"lora_name"}`` drops one;
``GET /v1/models`` lists the base and every adapter loaded (``parent``: the base).
"""

from __future__ import annotations

import json
from pathlib import Path

from swarm_runtime.serve.validate import NAME_RE, BadRequest


def adapter_folder(path: str | Path) -> Path:
    """``path`` if it is a PEFT adapter folder; :class:`BadRequest` naming what is missing otherwise."""
    p = Path(str(path))
    if not (p / "adapter_config.json").exists():
        raise BadRequest(
            f"lora_path {str(path)!r} is not a PEFT adapter folder (no adapter_config.json)", param="lora_path"
        )
    return p


def base_of(adapter: Path) -> Path:
    """The base folder an adapter checkpoint points to (``swarm_base.json``)."""
    from swarm_runtime.models.adapters import POINTER, pointed_base

    return pointed_base(adapter, json.loads((adapter / POINTER).read_text()))


class AdapterHost:
    """The base and its adapters: one :class:`AdapterPolicy` per adapter name, all on one model."""

    def __init__(self, base: str | Path, policy_kw: dict):
        from swarm_runtime.models.adapters import fingerprint
        from swarm_runtime.models.transformers_backend import load_pretrained

        self.base_path = Path(base)
        self.kw = dict(policy_kw)
        model, self.tok = load_pretrained(self.base_path, self.kw["bid_levels"], "float32", seeded_resize=True)
        self.base_model = model.eval()
        self.fingerprint = fingerprint(self.base_path)
        self.shared = None
        self.policies: dict = {}
        self.paths: dict[str, str] = {}

    def _check_base(self, folder: Path) -> None:
        from swarm_runtime.models.adapters import POINTER

        f = folder / POINTER
        if f.exists():
            want = json.loads(f.read_text()).get("fingerprint")
            if want and want != self.fingerprint:
                raise BadRequest(
                    f"lora_path {str(folder)!r} was trained on another base (fingerprint {want[:12]}, "
                    f"this worker's base {self.base_path} is {self.fingerprint[:12]})",
                    param="lora_path",
                )

    def load(self, name: str, path: str | Path) -> None:
        """Load the adapter folder ``path`` as ``name`` (a loaded ``name`` is replaced)."""
        import torch

        from swarm_runtime.models.adapters import AdapterPolicy, SharedBase, _peft

        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or "." in name:
            raise BadRequest(f"lora_name {name!r}: 1-64 letters, digits, '-', '_', '@' (no '.')", param="lora_name")
        folder = adapter_folder(path)
        self._check_base(folder)
        if name in self.policies and self._same_shape(name, folder):  # new weights of a loaded adapter
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            with torch.no_grad():
                result = set_peft_model_state_dict(
                    self.shared.model, load_file(str(folder / "adapter_model.safetensors")), adapter_name=name
                )
            missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
            if missing:
                raise BadRequest(
                    f"lora_path {str(folder)!r}: weights {missing[:3]} do not fit adapter {name!r}", param="lora_path"
                )
            self.paths[name] = str(folder)
            return
        if name in self.policies:
            self.unload(name)
        with torch.no_grad():
            if self.shared is None:
                model = _peft().PeftModel.from_pretrained(self.base_model, str(folder), adapter_name=name)
                self.shared = SharedBase(model, self.tok, str(self.base_path), self.fingerprint)
            else:
                self.shared.model.load_adapter(str(folder), adapter_name=name)
        self.shared.model.eval()
        for p in self.shared.model.parameters():
            p.requires_grad_(False)
        self.shared.lora_layers = [
            m for m in self.shared.model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")
        ]
        self.policies[name] = AdapterPolicy(self.shared, name, **self.kw).eval()
        self.paths[name] = str(folder)

    def _same_shape(self, name: str, folder: Path) -> bool:
        cfg = json.loads((folder / "adapter_config.json").read_text())
        have = self.shared.model.peft_config[name]
        return (
            int(cfg.get("r", -1)) == int(have.r)
            and float(cfg.get("lora_alpha", -1)) == float(have.lora_alpha)
            and set(cfg.get("target_modules") or []) == set(have.target_modules or [])
        )

    def unload(self, name: str) -> None:
        if name not in self.policies:
            raise BadRequest(
                f"lora_name {name!r} is not loaded; loaded: {', '.join(self.policies) or 'none'}",
                param="lora_name",
                status=404,
            )
        if len(self.policies) == 1:
            raise BadRequest(
                f"{name!r} is this worker's only adapter: load another before unloading it "
                "(or load new weights under the same name)",
                param="lora_name",
            )
        self.shared.model.delete_adapter(name)
        self.shared._active = None
        del self.policies[name], self.paths[name]

    def lead(self):
        return next(iter(self.policies.values()))


def parse_modules(specs) -> list[tuple[str, str]]:
    """``NAME=PATH`` items (``--lora-modules``)."""
    out = []
    for spec in specs or []:
        name, sep, path = str(spec).partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules {spec!r} is not NAME=PATH")
        out.append((name, path))
    return out
