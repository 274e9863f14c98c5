"""One shared base model with a PEFT LoRA adapter per role (``model.adapter=lora``; docs/reference/method.md,
section 8; docs/guides/gpu.md).

The whole swarm holds one base in memory (a PEFT ``PeftModel`` with one named adapter per role;
replicas of a role share its adapter). Each role's :class:`AdapterPolicy` is a
:class:`TransformersPolicy` whose forward pass runs the base with that role's adapter, whose
``parameters()`` are that adapter's LoRA weights only (so each role's optimizers step its adapter
and nothing else), and whose ``save`` writes the adapter in PEFT format beside a pointer to the base.

One forward pass per turn: the episode loop hands the bid (or action) rows of every role sharing a
base to :class:`~swarm_runtime.models.mixed_batch.MixedBatch`, which groups them by adapter and runs them in
one batch through :class:`~swarm_runtime.models.mixed_batch.GroupedLoRA` (the base once over all rows, each
adapter's LoRA on its own contiguous rows; PEFT's ``adapter_names=`` mixed batch is the reference it is tested
against); each row is then sampled with its own policy's generator (or its keyed noise), as a per-role call
would.

Where the base comes from: ``model.path`` (any local Hugging Face causal LM, frozen); or, with no
path (the CPU default), the tiny model built from the config, which the cold start first fine-tunes
on the union of all roles' demonstrations (the monolithic SFT model) before it is frozen and each
role's adapter is fine-tuned on the role's own demonstrations (:func:`sft_shared_base`). Such a
trained base is written once per checkpoint under ``checkpoints/<tag>/base/``; a ``model.path`` base
is only pointed to (path + fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from loguru import logger

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.models.flops import FlopCounter
from swarm_runtime.models.mixed_batch import GroupedLoRA, spans_of
from swarm_runtime.models.tokenizer import build_tokenizer
from swarm_runtime.models.transformers_backend import (
    BID_ROWS,
    TransformersPolicy,
    build_tiny_model,
    cast_weights,
    load_pretrained,
    refuse_custom_code,
)

#: File beside each adapter naming its base.
POINTER = "swarm_base.json"
#: Where a trained (config-built) base is written, relative to an adapter folder ``checkpoints/<tag>/agents/<role>``
#: (the ``default`` base; another base of ``model.bases`` is written to ``../../base-NAME``: :func:`trained_base_dir`).
TRAINED_BASE = "../../base"
#: The pointer of a trained base: ``../../base`` or ``../../base-NAME``.
TRAINED_BASE_RE = re.compile(r"\.\./\.\./base(-[A-Za-z0-9_-]{1,40})?")


def trained_base_dir(name: str) -> str:
    """The pointer to base ``name``'s trained copy from an adapter folder (``../../base`` for ``default``)."""
    from swarm_runtime.models.bases import base_dir

    return f"../../{base_dir(name)}"


#: The architecture fields of a config-built base that must match the configured model.
ARCH_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


def _peft():
    import warnings

    # PEFT asks transformers 5 for a deprecated attribute on every wrap; nothing for the user to act on.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - peft is a core dependency
        raise ConfigError("model.adapter=lora needs the `peft` package: pip install peft") from exc
    return peft


def adapter_name(role: str) -> str:
    """PEFT adapter names may not contain dots (module paths)."""
    return role.replace(".", "_")


def linear_names(model) -> list[str]:
    """Leaf names of the model's linear layers (what ``model.lora.target_modules`` may name)."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return sorted(names - {"lm_head"})


def check_targets(model, targets: Sequence[str]) -> None:
    """Refuse a ``model.lora.target_modules`` name the base lacks, naming the valid ones."""
    valid = linear_names(model)
    bad = [t for t in targets if t not in valid]
    if bad:
        raise ConfigError(
            f"model.lora.target_modules names {bad[0]!r}, which the base model lacks; valid: {', '.join(valid)}"
        )


def fingerprint(folder: str | Path) -> str:
    """A hash of a Hugging Face folder's ``config.json`` and of each weight file's name, size, first
    and last MiB: cheap on a 16 GB checkpoint, and it tells two bases apart."""
    folder = Path(folder)
    h = hashlib.sha256((folder / "config.json").read_bytes())
    for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            h.update(fh.read(1 << 20))
            if size > 2 << 20:
                fh.seek(size - (1 << 20))
                h.update(fh.read(1 << 20))
    return h.hexdigest()


def arch_of(config) -> dict:
    return {k: getattr(config, k, None) for k in ARCH_KEYS}


def _clean_base_state(model) -> dict:
    """The base's own weights out of a PEFT-wrapped model (LoRA weights dropped, ``base_layer``
    names restored), tied embeddings once."""
    base = model.get_base_model()
    out = {}
    for k, v in base.state_dict().items():
        if "lora_" in k:
            continue
        out[k.replace(".base_layer.", ".")] = v.detach().contiguous().cpu()
    if getattr(base.config, "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)
    return out


class SharedBase:
    """The one base of a swarm: a ``PeftModel`` with one adapter per role, its tokenizer, and where
    the base came from (``source``: a ``model.path`` folder, or None for a base built from the
    config and trained by the cold start)."""

    def __init__(self, model, tok, source: str | None, source_fingerprint: str | None = None, name: str = "default"):
        self.model, self.tok, self.source = model, tok, source
        self.name = name  #: the base's name (``default``: ``model.*``; else a ``model.bases`` name)
        self.source_fingerprint = source_fingerprint
        self._active: str | None = None
        base_params = [p for n, p in model.named_parameters() if "lora_" not in n]
        self.n_base = sum(p.numel() for p in base_params)
        self._base_params = base_params
        #: the PEFT LoRA layers, found once (a walk over all modules costs more than a tiny model's forward pass)
        self.lora_layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
        self._saved: dict[str, str] = {}  #: base folder written -> its fingerprint

    def base_params(self) -> list[torch.nn.Parameter]:
        """The base's own parameters (every one but the adapters'), in the model's order."""
        return list(self._base_params)

    def load_base_params(self, tensors) -> None:
        """Copy ``tensors`` (:meth:`base_params`' order, e.g. a base trained in another process) into the base."""
        with torch.no_grad():
            for p, t in zip(self._base_params, tensors, strict=True):
                p.copy_(t)

    @property
    def trains_base(self) -> bool:
        """A config-built base: the cold start fine-tunes it (the monolithic SFT model) first."""
        return self.source is None

    def activate(self, name: str) -> None:
        if self._active != name:
            self.model.set_adapter(name)
            self._active = name

    def adapter_params(self, name: str) -> list[torch.nn.Parameter]:
        return [
            p for n, p in self.model.named_parameters() if "lora_" in n and (f".{name}." in n or n.endswith(f".{name}"))
        ]

    @contextmanager
    def training_base(self, policy_kw: dict):
        """A policy over the base alone (adapters disabled, base weights trainable) for the
        cold start's SFT of the base; the base is frozen again afterwards."""
        for p in self._base_params:
            p.requires_grad_(True)
        view = BasePolicy(self, **policy_kw)
        try:
            yield view
        finally:
            for p in self._base_params:
                p.requires_grad_(False)
                p.grad = None
            self._active = None
            self.model.eval()

    def save_base(self, folder: Path) -> str:
        """Write the (trained) base as a Hugging Face folder once; its fingerprint."""
        folder = Path(folder)
        key = str(folder.resolve())
        if key in self._saved and (folder / "config.json").exists():
            return self._saved[key]
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        base = self.model.get_base_model()
        base.config.save_pretrained(folder)
        save_file(_clean_base_state(self.model), str(folder / "model.safetensors"), metadata={"format": "pt"})
        self.tok.save_pretrained(folder)
        model_type = type(getattr(getattr(self.tok, "backend_tokenizer", None), "model", None)).__name__
        (folder / "swarm_policy.json").write_text(json.dumps({"word_level_tokenizer": model_type == "WordLevel"}))
        self._saved[key] = fingerprint(folder)
        return self._saved[key]

    def pointer(self, adapter_dir: Path) -> dict:
        """What an adapter folder records about its base."""
        if self.source is not None:
            return {
                "base": str(Path(self.source).resolve()),
                "fingerprint": self.source_fingerprint,
                "arch": arch_of(self.model.get_base_model().config),
                "trained_base": False,
                "bid_rows": BID_ROWS,  # how the bid tokens' rows are drawn at each load of the base
            }
        rel = trained_base_dir(self.name)
        fp = self.save_base(adapter_dir / rel)
        return {
            "base": rel,
            "fingerprint": fp,
            "arch": arch_of(self.model.get_base_model().config),
            "trained_base": True,
        }


class AdapterPolicy(TransformersPolicy):
    """One role's model: the shared base with the role's adapter (module docstring)."""

    def __init__(self, shared: SharedBase, adapter: str, **kw):
        super().__init__(shared.model, shared.tok, **kw)
        self.shared_base, self.adapter = shared, adapter
        self.route: list[str] | None = None  #: per-row adapter names of a mixed batch in progress
        self._grouped: GroupedLoRA | None = None  #: its routed layers (:meth:`routed`)
        self._params = shared.adapter_params(adapter)
        self.n_frozen = shared.n_base
        self.n_params = shared.n_base + sum(p.numel() for p in self._params)
        base = shared.model.get_base_model()
        import inspect

        self._cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"

    def _forward(self, **kw):
        if self._grouped is not None:  # a mixed batch in progress: the layers are routed (GroupedLoRA)
            return self.model(**kw)
        if self.route is not None:
            return self.model(**kw, adapter_names=self.route)
        if MIXED_IMPL == "grouped" and not self.model.training and not torch.is_grad_enabled():
            # sampling and scoring without a gradient, one adapter for every row: the same products,
            # without PEFT's set_adapter (a walk over all modules on every switch of adapter)
            alone = GroupedLoRA.build(self.shared_base.lora_layers, [(self.adapter, 0, None)])
            if alone is not None:
                with alone:
                    return self.model(**kw)
        self.shared_base.activate(self.adapter)
        return self.model(**kw)

    @contextmanager
    def routed(self, names: list[str]):
        """Route the rows of the forward passes inside to the adapters ``names`` (one per row); the
        routing is built once here and serves every decode step of the call."""
        self.route = list(names)
        grouped = None
        if MIXED_IMPL == "grouped" and not self.model.training:
            grouped = GroupedLoRA.build(self.shared_base.lora_layers, spans_of(self.route))
        try:
            if grouped is None:
                yield self
            else:
                with grouped:
                    self._grouped = grouped
                    yield self
        finally:
            self.route, self._grouped = None, None

    def parameters(self):
        return iter(self._params)

    def rebind_params(self) -> None:
        """Read the adapter's (and the base's) parameters from the model again, after something replaced them
        (FSDP2's ``fully_shard`` in a sharded learner: learn/sharded.py, ``shard_policies``)."""
        shared = self.shared_base
        shared._base_params = [p for n, p in shared.model.named_parameters() if "lora_" not in n]
        self._params = shared.adapter_params(self.adapter)

    def save(self, path: str | Path) -> None:
        """``adapter_config.json`` + ``adapter_model.safetensors`` (PEFT format: ``PeftModel.from_pretrained``
        and vLLM's ``--lora-modules`` load it), ``swarm_base.json`` (the base: path, fingerprint,
        architecture) and ``swarm_policy.json``."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        pointer = self.shared_base.pointer(path)
        # the LoRA weights only: the base's embedding, resized for the bid tokens, is frozen and drawn again from a
        # fixed seed when the base loads (PEFT would otherwise save it, and fail on the tied embedding and head)
        state = get_peft_model_state_dict(self.model, adapter_name=self.adapter, save_embedding_layers=False)
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in state.items()},
            str(path / "adapter_model.safetensors"),
            metadata={"format": "pt"},
        )
        config = self.model.peft_config[self.adapter]
        was = config.base_model_name_or_path
        config.base_model_name_or_path = pointer["base"]
        config.save_pretrained(str(path))
        config.base_model_name_or_path = was
        (path / POINTER).write_text(json.dumps(pointer, indent=1))
        (path / "swarm_policy.json").write_text(
            json.dumps(
                {
                    "bid_levels": self.bid_levels,
                    "bid_mode": self.bid_mode,
                    "word_level_tokenizer": self._word_level,
                    "adapter": self.adapter,
                    "chat_template": self.chat_template,  # how a served worker prompts it, as the run did
                },
                indent=1,
            )
        )


#: How a mixed-adapter batch routes rows: ``grouped`` (:class:`GroupedLoRA`) or ``peft`` (PEFT's
#: ``adapter_names=``, which rebuilds each adapter's row list and gathers/scatters it in every layer at every
#: decode step; the reference it is tested against).
MIXED_IMPL = "grouped"


class BasePolicy(AdapterPolicy):
    """The shared base with its adapters disabled, its weights the parameters (:meth:`SharedBase.training_base`)."""

    def __init__(self, shared: SharedBase, **kw):
        super().__init__(shared, adapter="", **kw)
        self._params = list(shared._base_params)
        self.n_frozen = 0
        self.n_params = shared.n_base

    def _forward(self, **kw):
        with self.model.disable_adapter():
            return self.model(**kw)


def lora_config(opts):
    peft = _peft()
    return peft.LoraConfig(
        r=int(opts.rank),
        lora_alpha=float(opts.alpha),
        lora_dropout=float(opts.dropout),
        target_modules=list(opts.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def read_pointer(adapter_dir: Path) -> dict:
    """An adapter folder's ``swarm_base.json``, checked: ``base`` (a path; ``../../base`` for a trained
    base, which lives in the checkpoint), ``fingerprint`` (a SHA-256), ``trained_base``, ``arch``."""
    f = Path(adapter_dir) / POINTER
    if not f.exists():
        raise ConfigError(
            f"{str(adapter_dir)!r} is not an adapter checkpoint (no {POINTER}); a run trained with "
            "model.adapter=none holds full models: evaluate it with model.adapter=none"
        )
    try:
        ptr = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{f} is not JSON ({type(exc).__name__}); the adapter checkpoint is damaged") from exc
    fp = ptr.get("fingerprint") if isinstance(ptr, dict) else None
    if (
        not isinstance(ptr, dict)
        or not isinstance(ptr.get("base"), str)
        or not ptr["base"]
        or not isinstance(fp, str)
        or not re.fullmatch(r"[0-9a-f]{64}", fp)
        or not isinstance(ptr.get("trained_base"), bool)
        or not isinstance(ptr.get("arch"), dict)
    ):
        raise ConfigError(
            f"{f} is not a base pointer (needs base, a SHA-256 fingerprint, trained_base and arch); "
            "the adapter checkpoint is damaged"
        )
    if ptr["trained_base"] and not TRAINED_BASE_RE.fullmatch(ptr["base"]):
        raise ConfigError(
            f"{f} points to the trained base {ptr['base']!r}; a trained base lives in the checkpoint "
            f"({TRAINED_BASE} or ../../base-NAME): the adapter checkpoint is damaged"
        )
    return ptr


def pointed_base(adapter_dir: Path, ptr: dict) -> Path:
    """The base folder ``ptr`` (``adapter_dir``'s :func:`read_pointer`) names: absolute, or relative to the adapter."""
    base = Path(ptr["base"])
    return base if base.is_absolute() else (Path(adapter_dir) / base).resolve()


def check_adapter_base(adapter_dir: Path, advice: str = "") -> tuple[dict, Path]:
    """An adapter folder's base pointer (:func:`read_pointer`) and the base folder it names, checked: the base is
    there and its files match the fingerprint the pointer recorded. Else a :class:`ConfigError` naming the pointer
    file, with ``advice`` (what to do) after it. The one check of a saved adapter's base: before anything loads a
    checkpoint (runs/agents_check.py), when a run builds on one (:func:`resolve_base`), and when it is exported."""
    adapter_dir = Path(adapter_dir)
    ptr = read_pointer(adapter_dir)
    base, then = pointed_base(adapter_dir, ptr), f"; {advice}" if advice else ""
    if not (base / "config.json").is_file():
        raise ConfigError(f"{adapter_dir / POINTER} names the base {str(base)!r}, which is missing{then}")
    if fingerprint(base) != ptr["fingerprint"]:
        raise ConfigError(
            f"the base {str(base)!r} of {adapter_dir.name} does not match the fingerprint {adapter_dir / POINTER} "
            f"recorded: the base was changed{then}"
        )
    if not ptr["trained_base"] and ptr.get("bid_rows") != BID_ROWS and not _has_bid_tokens(base):
        raise ConfigError(
            f"{adapter_dir / POINTER} is an adapter trained on bid-token rows drawn otherwise (bid_rows "
            f"{ptr.get('bid_rows')}, now {BID_ROWS}; before 2 every bid level had the same logit, so its bids were "
            f"uniform whatever it learned): its bids would not be its bids now; train it again{then}"
        )
    return ptr, base


def _has_bid_tokens(base: Path) -> bool:
    """Whether the base folder's tokenizer has the bid tokens already (then no rows are added when it loads)."""
    try:
        added = json.loads((Path(base) / "tokenizer.json").read_text()).get("added_tokens") or []
    except (OSError, ValueError, AttributeError):
        return False
    return any(str(t.get("content", "")).startswith("<bid_") for t in added if isinstance(t, dict))


def check_finite(folder: Path) -> None:
    """Refuse a folder whose weights (``*.safetensors``) hold a NaN or an infinite value, naming the
    file and tensor (a diverged or damaged checkpoint would otherwise be exported as a model)."""
    from safetensors import safe_open

    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                t = st.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    raise ConfigError(
                        f"{f}: tensor {name} holds NaN or infinite values; refusing to export it (the "
                        "training diverged or the checkpoint is damaged): export another checkpoint"
                    )


def _pointers(init_dir: Path, roles: Sequence[str]) -> dict:
    """The first role's base pointer, after checking that every role's names the same base (path,
    fingerprint, trained or not): the roles given share one base."""
    ptrs = {r: read_pointer(Path(init_dir) / r) for r in roles}
    first = ptrs[roles[0]]
    for role, ptr in ptrs.items():
        same = all(ptr.get(k) == first.get(k) for k in ("base", "fingerprint", "trained_base"))
        if not same:
            raise ConfigError(
                f"the adapter of {role} in {str(init_dir)!r} records the base {ptr['base']!r} "
                f"(fingerprint {ptr['fingerprint'][:12]}), but {roles[0]}'s records {first['base']!r} "
                f"({first['fingerprint'][:12]}): these roles share one base (model.role_base); the "
                "checkpoint is damaged, or was trained with other model.role_base settings"
            )
    return first


def resolve_base(
    model_cfg, init_dir: Path | None, roles: Sequence[str], name: str = "default"
) -> tuple[str | None, Path | None, str | None]:
    """Which base to load for ``roles`` (those on base ``name``; ``model_cfg``: that base's settings):
    ``(source, folder, fingerprint)``. ``source`` is ``model.path`` (or None for a config-built base);
    ``folder`` the Hugging Face folder to load (None = build from the config). An adapter checkpoint whose
    base differs from the configured one is refused here, before anything loads."""
    path = model_cfg.get("path")
    if init_dir is None:
        if path:
            return str(path), Path(path), fingerprint(path) if (Path(path) / "config.json").exists() else None
        return None, None, None
    first = Path(init_dir) / roles[0]
    ptr = _pointers(init_dir, roles)
    if ptr.get("trained_base") and ptr["base"] != trained_base_dir(name):
        raise ConfigError(
            f"the adapters of {', '.join(roles)} in {str(init_dir)!r} were trained on the base "
            f"{ptr['base']!r}, but model.role_base puts them on {name!r} ({trained_base_dir(name)}); use "
            "the run's own model.role_base"
        )
    if path:
        if (
            ptr.get("trained_base")
            or not (Path(path) / "config.json").exists()
            or fingerprint(path) != ptr["fingerprint"]
        ):
            raise ConfigError(
                f"the adapters in {str(init_dir)!r} were trained on the base {ptr['base']!r} (fingerprint "
                f"{ptr['fingerprint'][:12]}), but model.path={path!r} is another base; give "
                f"model.path={ptr['base']!r} or the run's own config"
            )
        return str(path), Path(path), ptr["fingerprint"]
    _, folder = check_adapter_base(first)
    if ptr.get("trained_base"):
        want = {
            "hidden_size": int(model_cfg.hidden_size),
            "intermediate_size": int(model_cfg.intermediate_size),
            "num_hidden_layers": int(model_cfg.num_layers),
            "num_attention_heads": int(model_cfg.num_heads),
            "num_key_value_heads": int(model_cfg.num_kv_heads),
        }
        bad = {k: (ptr["arch"].get(k), v) for k, v in want.items() if ptr["arch"].get(k) != v}
        if bad:
            k, (had, now) = next(iter(bad.items()))
            raise ConfigError(
                f"the adapters in {str(init_dir)!r} were trained on a base with {k}={had}, but the "
                f"configured model has {now}; use the run's own model settings"
            )
        return None, folder, ptr["fingerprint"]
    return ptr["base"], folder, ptr["fingerprint"]


def build_adapter_swarm(
    model_cfg,
    hardware_cfg,
    words: list[str],
    bid_levels: Sequence[float],
    roles: Sequence[str],
    seeds: Sequence[int],
    flops: FlopCounter | None = None,
    init_dir: Path | None = None,
) -> dict[str, AdapterPolicy]:
    """One base per distinct base (``model.*``, and each ``model.bases`` name ``model.role_base`` uses) + one
    LoRA adapter per role on its base: ``{role: AdapterPolicy}``. ``init_dir``: a checkpoint's ``agents/``
    folder (each ``<role>/`` a PEFT adapter with its base pointer)."""
    from swarm_runtime.models import bases as B

    seed_of = dict(zip(roles, seeds))
    out: dict[str, AdapterPolicy] = {}
    for name, members in B.groups(model_cfg, roles).items():
        out.update(
            _build_base(
                B.role_cfg(model_cfg, members[0]),
                hardware_cfg,
                words,
                bid_levels,
                members,
                [seed_of[r] for r in members],
                flops,
                init_dir,
                name,
            )
        )
    return {r: out[r] for r in roles}


def _build_base(
    model_cfg,
    hardware_cfg,
    words: list[str],
    bid_levels: Sequence[float],
    roles: Sequence[str],
    seeds: Sequence[int],
    flops: FlopCounter | None,
    init_dir: Path | None,
    base: str,
) -> dict[str, AdapterPolicy]:
    """Base ``base`` (``model_cfg``: its settings) and the adapters of ``roles`` on it."""
    peft = _peft()
    source, folder, fp = resolve_base(model_cfg, init_dir, roles, base)
    model, tok = _base_model(model_cfg, hardware_cfg, words, bid_levels, int(seeds[0]), source, folder)
    check_targets(model, list(model_cfg.lora.target_modules))
    names = [adapter_name(r) for r in roles]
    model = _with_adapters(peft, model, model_cfg.lora, roles, names, seeds, init_dir)
    for n, p in model.named_parameters():  # the base is frozen; adapters train (one at a time)
        p.requires_grad_("lora_" in n)
    model.eval()
    shared = SharedBase(model, tok, source, fp, name=base)
    device = str(model_cfg.get("device", "cpu"))
    kw = policy_kwargs(model_cfg, bid_levels, flops, device)
    policies = {
        role: AdapterPolicy(shared, name, seed=int(seed), **kw) for role, name, seed in zip(roles, names, seeds)
    }
    one = next(iter(policies.values()))
    logger.info(
        "model.adapter=lora: {} of {:.2f}M parameters{}, {} adapters of {:.3f}M parameters each (rank {}, {})",
        "one base" if base == "default" else f"base {base!r} ({', '.join(roles)})",
        shared.n_base / 1e6,
        f" from {source}" if source else "",
        len(roles),
        (one.n_params - shared.n_base) / 1e6,
        int(model_cfg.lora.rank),
        ", ".join(model_cfg.lora.target_modules),
    )
    return policies


def _base_model(model_cfg, hardware_cfg, words, bid_levels, seed: int, source: str | None, folder: Path | None):
    """The base model and tokenizer: loaded from ``folder`` (:func:`resolve_base`), else built from the config
    (seeded with ``seed``); with ``hardware.gradient_checkpointing``, set for it."""
    # a model.path base in hardware.dtype (else model.dtype); a config-built one in hardware.dtype (else fp32): built
    # and cast so, and its trained copy (a checkpoint's base/) loaded back so, to the same weights and buffers
    dtype = str(hardware_cfg.get("dtype") or model_cfg.get("dtype", "float32"))
    built = str(hardware_cfg.get("dtype") or "float32")
    if folder is not None:
        model, tok = load_pretrained(
            folder,
            bid_levels,
            dtype if source is not None else built,
            attention=hardware_cfg.get("attention"),
            seeded_resize=True,
        )
    else:
        tok = build_tokenizer(words, bid_levels)
        model = build_tiny_model(len(tok), model_cfg, seed)
        if hardware_cfg.get("dtype"):  # a GPU profile: the built base in its dtype (bf16)
            model = cast_weights(model, built)
    if hardware_cfg.get("gradient_checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model, tok


def _with_adapters(peft, model, lora_cfg, roles: Sequence[str], names: list[str], seeds: Sequence[int], init_dir):
    """``model`` as a PEFT model (``peft``: the package) with one adapter per role (``names``): loaded from
    ``init_dir/ROLE`` when given, else new (``model.lora.*``), each initialised under its role's seed."""
    with torch.random.fork_rng(devices=[]):
        for i, (role, name) in enumerate(zip(roles, names)):
            torch.manual_seed(int(seeds[i]))
            src = Path(init_dir) / role if init_dir is not None else None
            if src is not None:
                refuse_custom_code(src)  # PEFT reads adapter_config.json only; a folder asking for code is refused
            if i == 0:
                if src is not None:
                    model = peft.PeftModel.from_pretrained(model, str(src), adapter_name=name, is_trainable=True)
                else:
                    model = peft.get_peft_model(model, lora_config(lora_cfg), adapter_name=name)
            elif src is not None:
                model.load_adapter(str(src), adapter_name=name, is_trainable=True)
            else:
                model.add_adapter(name, lora_config(lora_cfg))
    return model


def policy_kwargs(model_cfg, bid_levels, flops, device) -> dict:
    return dict(
        bid_levels=bid_levels,
        bid_mode=str(model_cfg.bid_mode),
        temperature=float(model_cfg.temperature),
        max_action_tokens=int(model_cfg.max_action_tokens),
        max_bid_tokens=int(model_cfg.max_bid_tokens),
        max_prompt_tokens=int(model_cfg.max_prompt_tokens),
        flops=flops,
        device=device,
        chat_template=str(model_cfg.get("chat_template") or "none"),
    )


def adapter_lr_scale(cfg) -> float:
    """The factor on the learning rates of what a role trains: ``model.lora.lr_scale`` with
    ``model.adapter=lora``, else 1 (full copies train at the algorithm's rates)."""
    if (cfg.model.get("adapter") or "none") != "lora":
        return 1.0
    return float(cfg.model.lora.get("lr_scale", 1.0))


def sft_shared_base(policies: dict, demos: dict, run_sft, seed: int) -> dict[str, dict]:
    """The cold start's first step with config-built bases: fine-tune each base itself (adapters off) on
    the union of its roles' demonstrations (every role's, with one base), then freeze it;
    ``run_sft(policy, examples)`` runs :func:`swarm_runtime.learn.sft.sft`. The metrics of each base
    trained, by its checkpoint folder name (``base``, ``base-NAME``); a loaded checkpoint is kept frozen."""
    from swarm_runtime.models.bases import base_dir

    by_base: dict[int, tuple] = {}
    for role, p in policies.items():
        shared = getattr(p, "shared_base", None)
        if shared is not None and shared.trains_base:
            by_base.setdefault(id(shared), (shared, p, []))[2].append(role)
    out = {}
    for shared, first, roles in by_base.values():
        union = [e for role in roles for e in demos.get(role, [])]
        with shared.training_base(policy_kwargs_of(first)) as base:
            base.gen = torch.Generator().manual_seed(int(seed))
            out[base_dir(shared.name)] = run_sft(base, union)
    return out


def policy_kwargs_of(p: TransformersPolicy) -> dict:
    return dict(
        bid_levels=p.bid_levels,
        bid_mode=p.bid_mode,
        temperature=p.temperature,
        max_action_tokens=p.max_action_tokens,
        max_bid_tokens=p.max_bid_tokens,
        max_prompt_tokens=p.max_prompt_tokens,
        flops=p.flops,
        device=p.device,
        chat_template=p.chat_template,
    )


def export_adapters(
    agents_dir: Path, out_dir: Path, roles: Sequence[str], bid_levels: Sequence[float], merged: bool
) -> list[Path]:
    """``swarm export``: per role, a merged Hugging Face folder (the base with the role's adapter
    folded in; ``merged``) or the PEFT adapter folder with its base copied beside it."""
    import shutil

    peft = _peft()
    out = []
    for role in roles:
        src = Path(agents_dir) / role
        ptr, folder = check_adapter_base(src)
        dst = Path(out_dir) / role
        check_finite(src)
        refuse_custom_code(src)
        if dst.exists():
            shutil.rmtree(dst)
        if merged:
            model, tok = load_pretrained(folder, bid_levels, "float32", seeded_resize=True)
            model = peft.PeftModel.from_pretrained(model, str(src)).merge_and_unload()
            model.save_pretrained(dst)
            tok.save_pretrained(dst)
            meta = json.loads((src / "swarm_policy.json").read_text())
            meta.pop("adapter", None)
            (dst / "swarm_policy.json").write_text(json.dumps(meta, indent=1))
        else:
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("training_state.pt"))
            if ptr.get("trained_base"):  # base/ (or base-NAME/ of another model.bases base) beside the adapters
                base_dst = Path(out_dir) / Path(ptr["base"]).name
                if not base_dst.exists():
                    shutil.copytree(folder, base_dst)
                ptr["base"] = f"../{base_dst.name}"
                (dst / POINTER).write_text(json.dumps(ptr, indent=1))
        out.append(dst)
    return out
