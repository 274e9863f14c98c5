"""The memory plan: what a run will hold on its device, estimated before anything loads.

Rows (bytes; ``N`` base parameters, ``A`` adapter parameters of one role, ``R`` roles, ``b`` bytes per
weight of the dtype):

- **weights**: full copies ``R N b``; adapters one base ``N b``.
- **adapters**: ``R A 4`` (PEFT keeps LoRA weights in fp32).
- **gradients**: one role is updated at a time and its gradients are freed after its step:
  ``N b`` (full copy) or ``A 4``.
- **optimizer states**: every role has two AdamW (action and bid steps, two moments each):
  ``R N 16`` (+ ``R N 4`` fp32 masters for bf16/fp16 weights) or ``R A 16``.
- **reference models** (``algo.bid_reference=sft`` or ``algo.kl_coef`` > 0): a frozen copy of the
  weights (and adapters) as RL started.
- **activations** of one update chunk: ``m`` rows (``algo.minibatch`` capped by
  ``hardware.micro_batch``) of ``S`` tokens (``model.max_prompt_tokens + max_action_tokens``), per layer
  ``b (10 h + 4 i)`` per token (block inputs, norms, q/k/v/o, MLP gate/up/product; sdpa or flash
  attention keep no ``S x S`` matrix), or ``b h`` per layer plus one layer's worth with
  ``hardware.gradient_checkpointing``; plus the fp32 logits, their log-softmax and its gradient (``12 V`` bytes
  per position) of the positions scored at once (models/scoring.py): a chunk whose ``m S V`` logits fit
  ``LOGITS_BUDGET`` is scored whole (``12 m S V``), a larger one at its scored positions only (``m`` rows of
  ``model.max_action_tokens``), at most ``LOGITS_BUDGET / V`` of them at a time (a head whose logits are not its
  plain output, e.g. a soft cap, is scored whole: not counted here).
- **KV cache** of the largest rollout batch: a bid turn of every agent in every env of a branch step,
  ``E B G`` rows (``algo.envs_per_step``, ``algo.branches_per_episode``, agents) of ``S`` tokens,
  ``2 L k d b`` per token (``k`` key/value heads of width ``d``).
- **runtime**: 2 GiB (CUDA context, kernels) + 10% of the rest for allocator fragmentation.

Sharded learners and placement (``train.engine=fsdp|deepspeed``, ``train.shards`` = ``S``,
``cluster.placement``): the plan is per device (:func:`placed_plan`). Per agent group (a role with its full copy,
or a base with its roles' adapters) a learner device holds the rows above for that group alone, each divided by
``S`` (weights, adapters, gradients, fp32 masters, AdamW moments, reference copy: FSDP2 and ZeRO-3 keep one
shard of each per process), plus the **gathered unit**: the largest unit (a block, or the root: embeddings and
an untied head) whole, ``2 U b`` (its parameters, and its gradient before the reduce-scatter), plus the
activations of one chunk. A sampler device holds the group's weights whole and the KV cache of the group's
agents; ``colocated`` puts it on the learner's first device (rows added), ``split`` on its own.

With several bases (``model.bases`` + ``model.role_base``) each base is planned with the roles on it and the rows
are added up, so each base is counted once (activations and gradients: the largest base's, one role at a time).

An estimate, not a measurement: ``benchmarks/gpu_adapters.py`` prints it beside the measured peak.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.models.logits_budget import LOGITS_BUDGET, chunk_positions

GiB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Arch:
    """The shape of a decoder-only transformer (Qwen2/3, Llama): what the plan needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = True
    qkv_bias: bool = False  #: biases on q/k/v (Qwen2 has them; Qwen3 and Llama do not)

    @classmethod
    def from_hf(cls, d: dict) -> Arch:
        heads = int(d.get("num_attention_heads", 1))
        hidden = int(d["hidden_size"])
        return cls(
            int(d["vocab_size"]),
            hidden,
            int(d.get("intermediate_size", 4 * hidden)),
            int(d["num_hidden_layers"]),
            heads,
            int(d.get("num_key_value_heads") or heads),
            int(d.get("head_dim") or hidden // heads),
            bool(d.get("tie_word_embeddings", False)),
            bool(d.get("attention_bias", d.get("model_type") == "qwen2")),
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection of one block."""
        h, i, q, kv = (
            self.hidden_size,
            self.intermediate_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def block_params(self) -> int:
        """One transformer block: its projections (q/k/v biases where the model has them) and two norms."""
        shapes = self.linear_shapes()
        block = sum(a * b for a, b in shapes.values()) + 2 * self.hidden_size
        if self.qkv_bias:
            block += sum(shapes[k][1] for k in ("q_proj", "k_proj", "v_proj"))
        return block

    def root_params(self) -> int:
        """What is not in a block: the embeddings, an untied output head, the final norm (the root unit FSDP2
        shards last, ``learn/sharded.py``)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    def unit_params(self) -> int:
        """The largest unit a sharded learner gathers whole at once: a block or the root."""
        return max(self.block_params(), self.root_params())

    def n_params(self) -> int:
        return self.num_layers * self.block_params() + self.root_params()

    def n_lora(self, rank: int, targets) -> int:
        shapes = self.linear_shapes()
        return self.num_layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets if t in shapes)


@dataclass
class MemoryPlan:
    rows: list[tuple[str, float, str]] = field(default_factory=list)  #: (what, bytes, how)
    budget: float | None = None  #: device bytes (hardware.memory_gb), None = unchecked
    device: str = "cpu"
    fixes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(b for _, b, _ in self.rows)

    @property
    def fits(self) -> bool:
        return self.budget is None or self.total <= self.budget

    def format(self) -> str:
        lines = [f"memory plan ({self.device}):"]
        for what, b, how in self.rows:
            lines.append(f"  {what:<18} {b / GiB:9.2f} GiB  {how}")
        budget = "unchecked" if self.budget is None else f"{self.budget / GiB:.1f} GiB on the device"
        lines.append(f"  {'total':<18} {self.total / GiB:9.2f} GiB  ({budget})")
        return "\n".join(lines)


def arch_of(cfg: DictConfig, vocab: int | None = None) -> tuple[Arch, str]:
    """The architecture and where it came from: ``model.arch``, ``model.path``'s config.json, or the
    fields of the model built from the config (``vocab``: its tokenizer's size, if known)."""
    m = cfg.model
    if m.get("arch"):
        return Arch.from_hf(OmegaConf.to_container(m.arch)), "model.arch"
    path = None if OmegaConf.is_missing(m, "path") else m.get("path")
    if path and (Path(path) / "config.json").exists():
        d = json.loads((Path(path) / "config.json").read_text())
        d = d.get("text_config", d)
        return Arch.from_hf(d), f"{path}/config.json"
    if path or OmegaConf.is_missing(m, "path"):
        raise ConfigError(
            f"the memory plan needs the model's shape: model.path={path or '???'} has no config.json; "
            "give model.path=<a Hugging Face folder> or model.arch={hidden_size: ..., ...}"
        )
    heads = int(m.num_heads)
    return Arch(
        int(vocab or 1024),
        int(m.hidden_size),
        int(m.intermediate_size),
        int(m.num_layers),
        heads,
        int(m.num_kv_heads),
        int(m.hidden_size) // heads,
        True,
        True,
    ), "model.* (built from the config)"


def base_counts(cfg: DictConfig, n_roles: int) -> dict[str, int]:
    """Roles per base (``model.role_base``; the roles it does not name sit on ``default``, ``model.*``)."""
    from swarm_runtime.models.bases import DEFAULT, role_bases

    counts: dict[str, int] = {DEFAULT: 0}
    named = role_bases(cfg.model)
    for name in named.values():
        counts[name] = counts.get(name, 0) + 1
    rest = int(n_roles) - sum(n for b, n in counts.items() if b != DEFAULT) - counts.get(DEFAULT, 0)
    counts[DEFAULT] = counts.get(DEFAULT, 0) + max(0, rest)
    return {b: n for b, n in counts.items() if n > 0}


def make_plan(
    cfg: DictConfig,
    n_roles: int,
    n_agents: int,
    vocab: int | None = None,
    roles: list[str] | None = None,
    per_device: bool | None = None,
) -> MemoryPlan | PlacedPlan:
    """The plan of a run with ``n_roles`` models (roles) and ``n_agents`` agents (replicas included). With
    several bases (``model.role_base``) each base is counted once, with the roles on it: the rows of each
    base's plan are added up (the activations of one update chunk are the largest base's: one role is
    updated at a time). A sharded learner or a placement (:func:`placed`; ``per_device`` None) or
    ``per_device=True``: the plan per device (:func:`placed_plan`; ``roles``, the roles' names, name its groups)."""
    from swarm_runtime.models.bases import base_cfg, multi

    if placed(cfg) if per_device is None else per_device:
        return placed_plan(cfg, list(roles) if roles else int(n_roles), n_agents, vocab)
    if not multi(cfg.model):
        return _plan(cfg, n_roles, n_agents, vocab)
    plans = []
    for name, r in base_counts(cfg, n_roles).items():
        sub = OmegaConf.merge(cfg, {"model": base_cfg(cfg.model, name)})
        plans.append((name, _plan(sub, r, max(1, n_agents * r // max(1, int(n_roles))), vocab)))
    rows: dict[str, list] = {}
    for name, p in plans:
        for what, b, how in p.rows:
            if what == "runtime":
                continue
            row = rows.setdefault(what, [what, 0.0, []])
            row[1] = max(row[1], b) if what in ("activations", "gradients") else row[1] + b
            row[2].append(f"{name}: {how}")
    first = plans[0][1]
    device = f"{cfg.hardware.get('name', cfg.hardware.get('device', 'cpu'))}, {n_agents} agents, {len(plans)} bases"
    plan = MemoryPlan(
        [(w, b, "; ".join(h)) for w, b, h in rows.values()],
        first.budget,
        device,
        list(dict.fromkeys(f for _, p in plans for f in p.fixes)),
    )
    if str(cfg.hardware.get("device", "cpu")).startswith("cuda"):
        plan.rows.append(("runtime", 2 * GiB + 0.1 * plan.total, "CUDA context + 10% allocator fragmentation"))
    return plan


def _plan(cfg: DictConfig, n_roles: int, n_agents: int, vocab: int | None = None) -> MemoryPlan:
    """The plan of ``n_roles`` models on one base (``cfg.model``)."""
    arch, source = arch_of(cfg, vocab)
    m, hw, a = cfg.model, cfg.hardware, cfg.algo
    loaded = source != "model.* (built from the config)"
    dtype = str(hw.get("dtype") or m.get("dtype") or "float32") if loaded else "float32"
    b = DTYPE_BYTES[dtype]
    N = arch.n_params()
    lora = str(m.get("adapter", "none")) == "lora"
    A = arch.n_lora(int(m.lora.rank), list(m.lora.target_modules)) if lora else 0
    R = int(n_roles)
    rows = []
    if lora:
        rows.append(("weights", N * b, f"one base of {N / 1e9:.3g}B parameters in {dtype} ({source})"))
        rows.append(("adapters", R * A * 4, f"{R} x {A / 1e6:.3g}M LoRA parameters (rank {int(m.lora.rank)}), fp32"))
        rows.append(("gradients", A * 4, "one adapter's at a time"))
        rows.append(("optimizer states", R * A * 16, f"{R} roles x 2 AdamW x 2 moments, fp32"))
    else:
        rows.append(("weights", R * N * b, f"{R} full copies of {N / 1e9:.3g}B parameters in {dtype} ({source})"))
        rows.append(("gradients", N * b, "one role's at a time"))
        master = 4 if b < 4 else 0
        rows.append(
            (
                "optimizer states",
                R * N * (16 + master),
                f"{R} roles x 2 AdamW x 2 moments fp32" + (" + fp32 masters" if master else ""),
            )
        )
    if str(a.get("bid_reference", "none")) == "sft" or float(a.get("kl_coef", 0.0)) > 0:
        rows.append(("reference models", (N * b + R * A * 4) if lora else R * N * b, "frozen RL-start copy"))
    rows.append(_activations(cfg, arch, b))
    rows.append(_kv_cache(cfg, arch, b, n_agents))
    device = str(hw.get("device", "cpu"))
    _add_runtime(rows, device)
    plan = MemoryPlan(rows, _budget(cfg), f"{hw.get('name', device)}, {n_agents} agents")
    if not lora:
        plan.fixes.append("model.adapter=lora (one shared base, one small adapter per role)")
    big = max(rows, key=lambda r: r[1])[0]
    if big == "KV cache":
        plan.fixes.append(f"a smaller algo.envs_per_step (now {int(a.envs_per_step)}) or algo.branches_per_episode")
    if big == "activations":
        plan.fixes.append("hardware.gradient_checkpointing=true or a smaller hardware.micro_batch")
    plan.fixes.append("a smaller model")
    return plan


def _tokens(cfg: DictConfig) -> int:
    return int(cfg.model.max_prompt_tokens) + int(cfg.model.max_action_tokens)


def _budget(cfg: DictConfig) -> float | None:
    return None if cfg.hardware.get("memory_gb") is None else float(cfg.hardware.memory_gb) * 1e9


def _activations(cfg: DictConfig, arch: Arch, b: int) -> tuple[str, float, str]:
    """The activations of one update chunk (the module docstring's formula)."""
    hw, a, S = cfg.hardware, cfg.algo, _tokens(cfg)
    mb = int(a.minibatch) if hw.get("micro_batch") is None else min(int(a.minibatch), int(hw.micro_batch))
    mb = max(1, mb)
    per_layer = b * (10 * arch.hidden_size + 4 * arch.intermediate_size)
    if hw.get("gradient_checkpointing"):
        layers = arch.num_layers * b * arch.hidden_size + per_layer
        how = "gradient checkpointing"
    else:
        layers = arch.num_layers * per_layer
        how = f"{arch.num_layers} layers"
    positions, scoring = scored_positions(mb, S, int(cfg.model.max_action_tokens), arch.vocab_size)
    return (
        "activations",
        mb * S * layers + 12 * positions * arch.vocab_size,
        f"update chunk of {mb} rows x {S} tokens, {how}, fp32 logits of {positions} positions ({scoring})",
    )


def scored_positions(rows: int, tokens: int, scored: int, vocab: int) -> tuple[int, str]:
    """Positions whose full-vocabulary logits one update chunk holds at once, and how they are scored: every
    position of ``rows`` x ``tokens`` where their logits fit ``LOGITS_BUDGET``, else the ``scored`` response
    tokens of each row, at most ``chunk_positions(vocab)`` at a time (models/scoring.py)."""
    if rows * tokens * vocab <= LOGITS_BUDGET:
        return rows * tokens, "whole"
    return min(rows * max(1, scored), chunk_positions(vocab)), "chunked"


def _kv_cache(cfg: DictConfig, arch: Arch, b: int, n_agents: int) -> tuple[str, float, str]:
    """The KV cache of the largest rollout batch of ``n_agents`` agents."""
    a, S = cfg.algo, _tokens(cfg)
    kv_rows = int(a.envs_per_step) * max(1, int(a.get("branches_per_episode", 1))) * int(n_agents)
    kv = kv_rows * S * 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * b
    return ("KV cache", kv, f"{kv_rows} rollout rows (envs x branches x {n_agents} agents) x {S} tokens")


def _add_runtime(rows: list, device: str) -> None:
    if device.startswith("cuda"):
        rest = sum(r[1] for r in rows)
        rows.append(("runtime", 2 * GiB + 0.1 * rest, "CUDA context + 10% allocator fragmentation"))


# ---------------------------------------------------------------- sharded learners and placement
#: Learner engines (``train.engine``): ``local`` in the trainer's process; ``fsdp`` (FSDP2) and ``deepspeed``
#: (ZeRO-3) shard a learner group's weights, gradients, fp32 masters and optimizer moments over ``train.shards``.
ENGINES = ("local", "fsdp", "deepspeed")
#: Where an agent group's learner and sampler sit (``cluster.placement``): ``none`` (no placement groups: the
#: one-device plan above), ``colocated`` (the sampler on the learner's first device), ``split`` (its own device).
PLACEMENTS = ("none", "colocated", "split")


def learner_rows(
    arch: Arch, dtype: str, roles: int, adapter_params: int, shards: int, reference: bool
) -> list[tuple[str, float, str]]:
    """One device of a learner group of ``shards`` processes holding ``roles`` roles of one base: with full
    copies (``adapter_params`` 0) each group holds one role; with adapters, one base and ``roles`` adapters.
    Everything the optimizer owns is divided by ``shards`` (FSDP2 and ZeRO-3 keep one shard of each tensor per
    process); a sharded learner also gathers one unit (a block, or the root: embeddings and head) whole at a
    time, its parameters and, in the backward pass, its gradient before the reduce-scatter. The activations
    are the caller's (every rank runs chunks of the same size, ``learn/sharded.py``)."""
    b, N, A, R, S = DTYPE_BYTES[dtype], arch.n_params(), adapter_params, int(roles), max(1, int(shards))
    per = f" / {S} shards" if S > 1 else ""
    rows = []
    if A:
        rows.append(("weights", N * b / S, f"one base of {N / 1e9:.3g}B parameters in {dtype}{per}"))
        rows.append(("adapters", R * A * 4 / S, f"{R} x {A / 1e6:.3g}M LoRA parameters, fp32{per}"))
        rows.append(("gradients", A * 4 / S, f"one adapter's at a time{per}"))
        rows.append(("optimizer states", R * A * 16 / S, f"{R} roles x 2 AdamW x 2 moments, fp32{per}"))
    else:
        master = 4 if b < 4 else 0
        rows.append(("weights", R * N * b / S, f"{R} full copy of {N / 1e9:.3g}B parameters in {dtype}{per}"))
        rows.append(("gradients", N * b / S, f"one role's{per}"))
        rows.append(
            (
                "optimizer states",
                R * N * (16 + master) / S,
                f"{R} role x 2 AdamW x 2 moments fp32" + (" + fp32 masters" if master else "") + per,
            )
        )
    if reference:
        rows.append(("reference models", (N * b + R * A * 4 if A else R * N * b) / S, f"frozen RL-start copy{per}"))
    if S > 1:
        U = arch.unit_params()
        what = "the root (embeddings, head)" if U == arch.root_params() else "a block"
        rows.append(
            ("gathered unit", 2 * U * b, f"the largest unit whole, {what}: {U / 1e6:.4g}M parameters + its gradient")
        )
    return rows


def sampler_rows(
    arch: Arch, dtype: str, roles: int, adapter_params: int, kv: tuple[str, float, str], own_weights: bool = True
) -> list[tuple[str, float, str]]:
    """One sampler's device: the group's full weights (never sharded: every decode step reads all of them), its
    adapters, and the KV cache of the group's agents' rollouts (``kv``). ``own_weights`` False: the sampler is
    the learner's own modules (``train.engine=local``, ``rollout.engine=local``), nothing more than its cache."""
    b, N, A, R = DTYPE_BYTES[dtype], arch.n_params(), adapter_params, int(roles)
    rows = []
    if own_weights:
        if A:
            rows.append(("sampler weights", N * b + R * A * 4, f"the base in {dtype} + {R} adapters, whole"))
        else:
            rows.append(("sampler weights", R * N * b, f"{R} full copy in {dtype}, whole"))
    rows.append(kv)
    return rows


@dataclass
class GroupShape:
    """An agent group as the plan sees it: a role with its full copy, or a base with the adapters of its roles."""

    name: str  #: the role (full copies) or the base (adapters)
    base: str  #: the base it sits on (``model.*``: ``default``)
    roles: list[str]


def agent_groups(cfg: DictConfig, roles: list[str] | int) -> list[GroupShape]:
    """The run's agent groups, each trained by one learner group and sampled by one sampler: with
    ``model.adapter=lora`` one per base (its roles' adapters on it), else one per role (its own full model).
    ``roles``: the roles' names, or how many (then named ``BASE-1``, ... after :func:`base_counts`)."""
    from swarm_runtime.models.bases import groups

    lora = str(cfg.model.get("adapter") or "none") == "lora"
    if isinstance(roles, int):
        by_base = {b: [f"{b}-{i + 1}" for i in range(n)] for b, n in base_counts(cfg, roles).items()}
    else:
        by_base = groups(cfg.model, roles)
    out = []
    for base, members in by_base.items():
        if lora:
            out.append(GroupShape(base, base, list(members)))
        else:
            out += [GroupShape(r, base, [r]) for r in members]
    return out


@dataclass
class PlacedPlan:
    """The plan per device of a placed run: one :class:`MemoryPlan` per kind of device (``count`` alike)."""

    devices: list[tuple[str, int, MemoryPlan]] = field(default_factory=list)  #: (label, how many, plan)
    budget: float | None = None
    header: str = ""
    fixes: list[str] = field(default_factory=list)
    per_group: dict = field(default_factory=dict)  #: group name -> {"learner" | "sampler" | "learner+sampler": bytes}

    @property
    def total(self) -> float:
        """The busiest device's bytes."""
        return max((p.total for _, _, p in self.devices), default=0.0)

    @property
    def fits(self) -> bool:
        return all(p.fits for _, _, p in self.devices)

    @property
    def rows(self) -> list[tuple[str, float, str]]:
        """The busiest device's rows."""
        return max(self.devices, key=lambda d: d[2].total)[2].rows if self.devices else []

    def format(self) -> str:
        lines = [self.header]
        for label, count, p in self.devices:
            lines.append(f"  {label} (x{count}):")
            lines += ["  " + line for line in p.format().splitlines()[1:]]
        n = sum(c for _, c, _ in self.devices)
        over = [label for label, _, p in self.devices if not p.fits]
        lines.append(f"  {n} devices; " + (f"over the device: {', '.join(over)}" if over else "each fits"))
        return "\n".join(lines)


def placed_plan(cfg: DictConfig, roles: list[str] | int, n_agents: int, vocab: int | None = None) -> PlacedPlan:
    """The per-device plan of ``train.engine`` / ``train.shards`` and ``cluster.placement``: per agent group
    (:func:`agent_groups`) its learner devices (:func:`learner_rows` + the activations) and its sampler, on the
    learner's first device (``colocated``) or one of its own (``split``, and ``none``: no sharing asked).
    Groups of the same shape are shown once."""
    train = cfg.get("train") or {}
    engine, shards = str(train.get("engine", "local")), int(train.get("shards", 1))
    placement = str((cfg.get("cluster") or {}).get("placement", "none"))
    hw = cfg.hardware
    device = str(hw.get("device", "cpu"))
    budget = _budget(cfg)
    out = PlacedPlan(budget=budget)
    n_groups = 0
    for names, learner, sampler, kind in _group_shapes(cfg, roles, n_agents, vocab, shards).values():
        n_groups += len(names)
        for what, label, count, rows in _group_devices(names, learner, sampler, shards, placement):
            _add_runtime(rows, device)
            plan = MemoryPlan(rows, budget, f"{label} [{kind}]")
            out.devices.append((label, count * len(names), plan))
            for name in names:
                out.per_group.setdefault(name, {})[what] = plan.total
    out.header = (
        f"memory plan per device ({hw.get('name', device)}, {n_agents} agents, {n_groups} agent groups; "
        f"train.engine={engine}, train.shards={shards}, cluster.placement={placement}):"
    )
    busiest = max(out.devices, key=lambda d: d[2].total)[0] if out.devices else ""
    if "learner" in busiest:
        out.fixes.append(f"more train.shards (now {shards}) with train.engine=fsdp or deepspeed")
    if placement == "colocated":
        out.fixes.append("cluster.placement=split (the sampler on a device of its own)")
    if str(cfg.model.get("adapter") or "none") != "lora":
        out.fixes.append("model.adapter=lora (one shared base, one small adapter per role)")
    if not hw.get("gradient_checkpointing"):
        out.fixes.append("hardware.gradient_checkpointing=true")
    out.fixes.append("a smaller hardware.micro_batch")
    return out


def _group_shapes(cfg: DictConfig, roles: list[str] | int, n_agents: int, vocab: int | None, shards: int) -> dict:
    """The agent groups by shape (their base and number of roles): ``[group names, a learner shard's rows (with
    the activations), the sampler's rows, what the base is]``, in the order of their first group."""
    from swarm_runtime.models.bases import base_cfg, multi

    hw, a = cfg.hardware, cfg.algo
    reference = str(a.get("bid_reference", "none")) == "sft" or float(a.get("kl_coef", 0.0)) > 0
    lora = str(cfg.model.get("adapter") or "none") == "lora"
    engine = str((cfg.get("train") or {}).get("engine", "local"))
    in_process = engine == "local" and str((cfg.get("rollout") or {}).get("engine", "local")) == "local"
    seen: dict[tuple, list] = {}
    n_roles = roles if isinstance(roles, int) else len(roles)
    for g in agent_groups(cfg, roles):
        sub = OmegaConf.merge(cfg, {"model": base_cfg(cfg.model, g.base)}) if multi(cfg.model) else cfg
        arch, source = arch_of(sub, vocab)
        loaded = source != "model.* (built from the config)"
        dtype = str(hw.get("dtype") or sub.model.get("dtype") or "float32") if loaded else "float32"
        m = sub.model
        A = arch.n_lora(int(m.lora.rank), list(m.lora.target_modules)) if lora else 0
        agents = max(1, int(n_agents) * len(g.roles) // max(1, n_roles))
        learner = learner_rows(arch, dtype, len(g.roles), A, shards, reference) + [
            _activations(sub, arch, DTYPE_BYTES[dtype])
        ]
        sampler = sampler_rows(
            arch, dtype, len(g.roles), A, _kv_cache(sub, arch, DTYPE_BYTES[dtype], agents), not in_process
        )
        key = (g.base, len(g.roles))
        if key in seen:
            seen[key][0].append(g.name)
            continue
        kind = f"{arch.n_params() / 1e9:.3g}B {dtype}, {source}"
        seen[key] = [[g.name], learner, sampler, kind]
    return seen


def _group_devices(names: list[str], learner: list, sampler: list, shards: int, placement: str) -> list[tuple]:
    """The devices of one shape's groups: ``(what, label, how many per group, rows)``; ``colocated``: the sampler on
    the learner's first device, else on one of its own."""
    who = f"group {names[0]}" + (f" (and {', '.join(names[1:])}, alike)" if len(names) > 1 else "")
    shard = f"learner shard (1 of {shards})" if shards > 1 else "learner"
    devs = []
    if placement == "colocated":
        devs.append(("learner+sampler", f"{who}: {shard} + sampler", 1, learner + sampler))
        if shards > 1:
            devs.append(("learner", f"{who}: {shard}", shards - 1, list(learner)))
    else:
        devs.append(("learner", f"{who}: {shard}", shards, list(learner)))
        devs.append(("sampler", f"{who}: sampler", 1, list(sampler)))
    return devs


def placed(cfg: DictConfig) -> bool:
    """Whether the run is planned per device: a sharded learner engine, or a placement asked for."""
    train, cluster = cfg.get("train") or {}, cfg.get("cluster") or {}
    return str(train.get("engine", "local")) != "local" or str(cluster.get("placement", "none")) != "none"


def check_plan(
    cfg: DictConfig, n_agents: int, vocab: int | None = None, n_roles: int | None = None
) -> MemoryPlan | PlacedPlan:
    """Log the plan; raise :class:`ConfigError` naming the fixes when it exceeds ``hardware.memory_gb``."""
    from loguru import logger

    roles = n_roles if n_roles is not None else n_agents
    # a run trains every role in this process today (learner groups on Ray come later; a sharded train.engine is
    # refused): its device holds them all, whatever cluster.placement reserves
    plan = make_plan(cfg, roles, n_agents, vocab, per_device=False)
    (logger.info if plan.budget is not None else logger.debug)(plan.format())
    if not plan.fits:
        who = "the busiest device needs" if isinstance(plan, PlacedPlan) else "the run needs"
        raise ConfigError(
            f"{who} ~{plan.total / GiB:.1f} GiB but hardware {cfg.hardware.name!r} has "
            f"{plan.budget / GiB:.1f} GiB ({plan.budget / 1e9:.0f} GB); try {'; or '.join(plan.fixes)}. "
            f"`swarm config ... --plan` prints the plan"
        )
    return plan
