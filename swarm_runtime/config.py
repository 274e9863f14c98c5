"""Configuration: documented dataclasses turned into OmegaConf structured configs,
plus group resolution for ``domain=``, ``task=``, ``model=``, ``algo=``, ``hardware=``.

Resolution order (later wins): dataclass defaults -> ``swarm_runtime/configs/<group>/<name>.yaml``
presets -> the task YAML's ``overrides:`` block -> ``key=value`` arguments.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import DictConfig, OmegaConf

from swarm_runtime.domain import REQUIRED_TASK_KEYS

#: Core presets: ``swarm_runtime/configs/<group>/<name>.yaml``, shipped inside the package.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
GROUPS = ("domain", "task", "model", "algo", "hardware")


class ConfigError(ValueError):
    """A bad config value; the CLI prints it and exits with code 2."""


@dataclass
class ModelConfig:
    backend: str = "transformers"  #: policy backend (see ``swarm plugins``)
    name: str = "tiny"  #: preset name
    path: Optional[str] = None  #: local Hugging Face checkpoint; None = build the tiny model from this config
    hidden_size: int = 128  #: tiny model width
    intermediate_size: int = 256  #: tiny model MLP width
    num_layers: int = 2  #: tiny model depth
    num_heads: int = 4  #: attention heads
    num_kv_heads: int = 2  #: key/value heads (grouped-query attention, as Qwen2/3)
    max_positions: int = 512  #: longest prompt + response
    bid_mode: str = "logits"  #: ``logits`` (score the bid tokens, fast) or ``generate`` (parse a generated bid)
    temperature: float = 1.0  #: sampling temperature for bids and actions (0 = greedy)
    max_action_tokens: int = 12  #: cap on a generated action
    constrained_actions: bool = False  #: sample each role's action only among the texts its domain lists for it
    #: (``Domain.action_choices``; guided ``choice`` decoding). Needs a domain that lists them; SFT still trains the
    #: full next-token distribution, REINFORCE and the KL charge score actions under the same constraint.
    max_bid_tokens: int = 6  #: cap on a generated bid (``generate`` mode)
    max_prompt_tokens: int = 256  #: prompts are cut from the left beyond this
    dtype: str = "float32"  #: weights dtype when loading a checkpoint
    device: str = "cpu"  #: torch device


@dataclass
class SFTConfig:
    demo_episodes: int = 16  #: scripted-expert episodes (train seeds) for the cold start
    epochs: int = 2  #: passes over each agent's demos (paper: 2)
    action_epochs: Optional[int] = None  #: passes over the action demos (None = ``epochs``; bid demos always get
    #: ``epochs``). Raise it where imitating the actions needs far more passes than the bids do: a tiny model from
    #: scratch learns to copy names from its prompt (OpenResearcher queries) only after ~10k action examples.
    lr: float = 2e-3  #: SFT learning rate (tiny models from scratch need far more than the paper's 1e-5)
    batch_size: int = 64  #: examples per SFT step
    owner_bids: list = field(default_factory=lambda: [0.6, 0.8])  #: demo bids of the role owning the expert's action (one drawn per example)
    other_bids: list = field(default_factory=lambda: [0.0, 0.2, 0.4])  #: demo bids of the other roles (spread, so turns are contested and lower bids can be re-sampled)
    match: str = "compute"  #: monolithic baseline only: ``compute`` = the swarm's SFT examples x epochs (bids included; DESIGN 2.5), ``data`` = the same demos for the same epochs


@dataclass
class AlgoConfig:
    name: str = "mpt"  #: training algorithm (see ``swarm plugins``)
    coordinator: str = "auction"  #: who acts each turn
    credit: str = "bucket_brigade"  #: credit scheme
    bid_levels: list = field(default_factory=lambda: [0.0, 0.2, 0.4, 0.6, 0.8])  #: allowed bids, all < 1
    iterations: int = 25  #: RL updates after SFT (action and bid steps together)
    envs_per_step: int = 32  #: episodes rolled out per update
    action_steps: int = 4  #: action-learning steps per cycle
    bid_steps: int = 1  #: bid-learning steps per cycle
    lr: float = 3e-5  #: RL learning rate (paper: 1e-6 for 4-8B models; on the tiny model 1e-4 degrades the swarm, 3e-4+ collapses it)
    bid_lr: Optional[float] = 3e-4  #: learning rate of the bid (Bradley-Terry) steps; None = ``lr``. Ten times
    #: ``lr``: the action steps' REINFORCE gradient is noisy at every token, while a bid step's pairs are few
    #: (~30 decisive per step) but each is a whole-branch comparison; 1e-3 overshoots (one step hands ~90% of
    #: the turns to one role), 3e-5 leaves the bids where SFT put them (docs/results.md).
    weight_decay: float = 0.0  #: AdamW weight decay
    adam_eps: float = 1e-4  #: AdamW epsilon of the RL optimizers. Larger than the usual 1e-8 on purpose: an agent
    #: whose credits are nearly uniform has a near-zero, pure-noise REINFORCE gradient, which Adam with a tiny eps
    #: would still turn into full lr-sized (sign-like) steps; eps ~ the gradient scale damps those steps.
    grad_clip: float = 1.0  #: max gradient norm
    warmup_steps: int = 0  #: linear warm-up before the cosine decay
    min_lr_ratio: float = 0.1  #: cosine floor as a fraction of lr
    minibatch: int = 256  #: samples per forward/backward chunk (gradients accumulate)
    branches_per_episode: int = 4  #: contested turns branched per episode in a bid step
    resample_tries: int = 3  #: bid re-samples to get below the runner-up (DESIGN 2.4)
    branch_samples: int = 1  #: continuations per side of a branch pair: 1 = the paper (one branch against the
    #: original episode); k > 1 = k branches against the original and k - 1 re-rolls where the selected agent
    #: acts again, scores averaged (~1/k of the noise, 2k - 1 branch rollouts per pick)
    branch_horizon: Optional[int] = None  #: decisions a branch pair compares from the branched turn on: None = to
    #: the end of the episode (the paper); H = the rewards of the next H decisions on both sides (branches stop
    #: there): a shorter, cheaper comparison whose score is not drowned by the sampling of the rest of the episode.
    #: Measured on VLN-CE (H = 8): a faster collapse into early stops (docs/results.md)
    bid_pairs: str = "selected"  #: whose bid a branch pair trains: ``selected`` (the paper: the agent that won
    #: the turn, its winning bid against a re-sampled lower one) or ``both`` (also the runner-up, its own bid
    #: against a re-sampled one above the winner's; the same two rollouts, no extra branches). Measured on
    #: VLN-CE: within the noise of single runs (docs/results.md)
    kl_coef: float = 0.0  #: action steps: each action's credit is charged ``kl_coef * [log pi(a|h) - log
    #: pi_ref(a|h)]`` (reward units), pi_ref = the models as RL started (``checkpoints/sft``): the KL-penalised
    #: reward of RLHF, meant to keep a higher ``lr`` from drifting into degenerate actions (no gain measured on
    #: VLN-CE, docs/results.md). 0 = the paper
    bid_reference: str = "none"  #: what a bid pair's log-odds are measured against: ``none`` (the paper:
    #: ``log pi(y_w) - log pi(y_l)``, whose optimum sets the bid odds to the pairs' win odds, so pairs that split
    #: by noise flatten the bids toward uniform) or ``sft`` (minus the same log-odds under the policies at the
    #: start of RL, ``checkpoints/sft``: the DPO form; noise leaves those bids in place). One frozen copy of
    #: each role's model more in memory (docs/architecture.md)
    bid_beta: float = 1.0  #: scale of the Bradley-Terry log-odds (``-log sigmoid(beta * z)``; 1 = the paper). With
    #: ``bid_reference=sft`` a preference of win rate p moves the bid odds by ``(p / (1 - p)) ** (1 / beta)``
    bid_pair_weight: str = "uniform"  #: weight of each decisive branch pair in the Bradley-Terry loss: ``uniform``
    #: (the paper: bids follow how often the higher bid's branch scored better) or ``margin`` (|score difference|,
    #: normalised to mean 1: bids follow the mean score difference, so rare large wins count; docs/results.md VLN-CE)
    common_random_numbers: bool = False  #: key every sampling draw of an episode by (episode noise id, turn,
    #: agent, kind) and give each counterfactual branch its original's noise id, so the two differ only through
    #: the forced decision; False = the policies' generators (the paper). Measured: no lower branch-pair variance
    #: on VLN-CE or Minecraft (benchmarks/branch_noise.py, docs/benchmarks.md)
    reward_scale: Optional[float] = None  #: advantages are divided by this (None = task.reward_max)
    goa_responders: int = 2  #: ``graph_of_agents`` coordinator: how many of the agents most confident in their own proposal respond (their proposals are peer-scored)
    sft: SFTConfig = field(default_factory=SFTConfig)


@dataclass
class HardwareConfig:
    name: str = "cpu"  #: preset name
    device: str = "cpu"  #: torch device
    threads: int = 0  #: torch CPU threads (0 = all cores)


@dataclass
class EvalConfig:
    runs: int = 3  #: sampled runs per held-out seed
    episodes: Optional[int] = None  #: held-out seeds used (None = all of the task's eval seeds)
    temperature: Optional[float] = None  #: sampling temperature at evaluation (None = model.temperature)
    split: str = "eval"  #: episode seeds held-out evaluations use: ``eval`` (reported numbers) or ``dev`` (tuning; disjoint from train and eval)
    common_random_numbers: bool = False  #: key each held-out episode's draws by (eval seed, run, episode seed), so
    #: the SFT and the trained swarm meet the same noise and their paired difference is tighter


@dataclass
class ExperimentConfig:
    """Settings of ``swarm experiment NAME`` (docs/experiments.md); ignored by ``swarm run``."""

    name: Optional[str] = None  #: the experiment (set by ``swarm experiment NAME``)
    base: Any = None  #: a ``swarm run`` folder whose final checkpoint is the trained MPT swarm (its ``sft`` checkpoint the initial one), or a list of them, one per training seed (experiment.train_seeds); None = train one
    train_seeds: Optional[list] = field(default_factory=lambda: [0, 1, 2])  #: training seeds: every arm is trained and evaluated once per seed (run seed = training seed, in ``seed-<s>/``); tables show the mean over seeds ± SE over seeds, plus paired differences; null = the run's ``seed`` alone, in the folder itself
    iterations: int = 10  #: RL updates of each training inside an experiment (overrides algo.iterations there)
    eval_episodes: Optional[int] = 16  #: held-out seeds per evaluated condition (eval.episodes wins when set; None = all)
    sft_eval: bool = False  #: also evaluate each training's SFT checkpoint (one more held-out evaluation per training)
    budget_factor: float = 3.0  #: a FLOPs-matched training (monolithic, round-robin) may run up to this x iterations before reaching its budget; its cosine schedule spans that cap
    coordinators: list = field(default_factory=lambda: ["auction", "graph_of_agents", "round_robin", "agentnet"])  #: ``coordination``: compared over the same trained action policies
    replicas: list = field(default_factory=lambda: [1, 2, 3, 4])  #: ``population``: replicas per role at inference (1..4 = 3..12 agents with 3 roles)
    pass_k: int = 3  #: ``population``: k of pass@k (eval.runs is raised to k when lower)
    milestones: Optional[list] = None  #: ``population``: milestones scored with pass@k (None = the keys of task.milestones)
    dropout_p: list = field(default_factory=lambda: [0.0, 0.3, 0.6, 0.9])  #: ``dropout``: absence probabilities
    dropout_replicas: list = field(default_factory=lambda: [1, 4])  #: ``dropout``: replicas per role (1 and 4 = 3 and 12 agents with 3 roles)
    dropout_per: str = "turn"  #: ``dropout``: ``turn`` (a fresh draw every turn) or ``episode`` (one draw per episode and agent)
    monolithic_sft: list = field(default_factory=lambda: ["compute"])  #: ``heldout``: one monolithic training per SFT matching (``compute``, ``data``; algo.sft.match)
    transfer_tasks: list = field(default_factory=list)  #: ``transfer``: tasks of the same domain to adapt to (set in a task's ``overrides:``)
    transfer_iterations: int = 6  #: ``transfer``: RL updates of the swarm's adaptation (the monolithic one is matched in FLOPs)


@dataclass
class RunConfig:
    domain: str = "minecraft"  #: domain plugin (``swarm domains`` lists them)
    task_name: str = "iron_pickaxe"  #: task of the domain (set with ``task=``)
    task: Any = None  #: the task's YAML (domain-specific keys included)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    seed: int = 0  #: run seed (model init, sampling, auction tie-breaks, seed order)
    run_dir: Optional[str] = None  #: output folder (None = runs/<domain>-<task>-<time>)
    resume: bool = False  #: continue the run in run_dir (or the latest matching one) from its last checkpoint
    checkpoint_every: int = 5  #: RL updates between checkpoints
    keep_checkpoints: int = 2  #: older checkpoints are pruned
    skip_sft_eval: bool = False  #: do not evaluate the SFT checkpoint
    progress: bool = True  #: show progress bars
    tensorboard: bool = True  #: write TensorBoard event files
    log_level: str = "INFO"  #: loguru level on the console


#: Whose bids a branch pair trains (``algo.bid_pairs``).
BID_PAIRS = ("selected", "both")

#: Splits a held-out evaluation may use (``eval.split``): ``eval`` for reported numbers, ``dev`` for tuning.
EVAL_SPLITS = ("eval", "dev")

#: How the monolithic baseline's SFT is matched to the swarm's (``algo.sft.match``).
SFT_MATCHES = ("compute", "data")


def presets(group: str) -> list[str]:
    d = CONFIG_DIR / group
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _valid_keys(node: DictConfig) -> str:
    return ", ".join(sorted(str(k) for k in node.keys()))


def parse_overrides(args: list[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Split ``key=value`` arguments into group choices and dotted overrides."""
    groups: dict[str, str] = {}
    dotted: list[tuple[str, str]] = []
    for a in args:
        if "=" not in a:
            raise ConfigError(f"argument {a!r} is not key=value (groups: {', '.join(GROUPS)}; or dotted keys like algo.lr=1e-4)")
        k, v = a.split("=", 1)
        (groups.__setitem__(k, v) if k in GROUPS else dotted.append((k, v)))
    return groups, dotted


def _set(cfg: DictConfig, key: str, value: str) -> None:
    parts = key.split(".")
    node = cfg
    for i, p in enumerate(parts):
        if not isinstance(node, DictConfig) or p not in node:
            where = ".".join(parts[:i]) or "the top level"
            valid = _valid_keys(node) if isinstance(node, DictConfig) else "(not a section)"
            raise ConfigError(f"unknown config key {key!r}: {p!r} is not in {where}; valid: {valid}")
        if i < len(parts) - 1:
            node = node[p]
    try:  # YAML typing: 16 -> int, 1e-4 -> float, [0, 0.5] -> list, null -> None
        parsed = yaml.safe_load(value) if value != "" else ""
    except yaml.YAMLError:
        parsed = value
    if isinstance(parsed, str) and parsed.lower() == "none":
        parsed = None
    if isinstance(parsed, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", parsed):
        parsed = float(parsed)  # YAML 1.1 reads 1e-4 as a string
    try:
        OmegaConf.update(cfg, key, parsed, merge=False)
    except Exception as exc:  # omegaconf validation error: wrong type
        raise ConfigError(f"bad value {value!r} for {key!r}: {exc}") from exc


def load_saved(path) -> DictConfig:
    """A run folder's ``config.yaml`` on top of this version's defaults, so a run written before a
    key existed resumes and evaluates with that key's default (new keys default to the old behaviour)."""
    saved = OmegaConf.load(path)
    try:
        return OmegaConf.merge(OmegaConf.structured(RunConfig), saved)
    except Exception as exc:  # a key this version no longer has, or a value of the wrong type
        raise ConfigError(f"{str(path)!r} does not fit this version's config: {exc}") from exc


def resolve(args: list[str], registry) -> DictConfig:
    """Build the run config from CLI arguments; raises :class:`ConfigError` on bad input."""
    groups, dotted = parse_overrides(args)
    cfg = OmegaConf.structured(RunConfig)
    for group in ("model", "algo", "hardware"):
        name = groups.get(group, getattr(RunConfig(), group).name if group != "algo" else "mpt")
        valid = presets(group)
        if name not in valid:
            raise ConfigError(f"unknown {group} {name!r}; valid: {', '.join(valid) or '(none)'}")
        cfg[group] = OmegaConf.merge(cfg[group], OmegaConf.load(CONFIG_DIR / group / f"{name}.yaml"))
    domain_name = groups.get("domain", cfg.domain)
    if domain_name not in registry.domains:
        raise ConfigError(f"unknown domain {domain_name!r}; valid: {', '.join(sorted(registry.domains)) or '(none)'}")
    domain = registry.domains[domain_name]
    tasks = domain.task_names()
    task_name = groups.get("task", tasks[0] if "task" not in groups and cfg.task_name not in tasks else cfg.task_name)
    if task_name not in tasks:
        raise ConfigError(f"unknown task {task_name!r} for domain {domain_name!r}; valid: {', '.join(tasks)}")
    task = domain.task_config(task_name)
    missing = [k for k in REQUIRED_TASK_KEYS if k not in task]
    if missing:
        raise ConfigError(f"task {task_name!r} of {domain_name!r} lacks required keys {missing}")
    overrides = task.pop("overrides", None)
    cfg.domain, cfg.task_name = domain_name, task_name
    OmegaConf.set_struct(cfg, False)
    cfg.task = task
    OmegaConf.set_struct(cfg, True)
    if overrides is not None:
        for key, value in _flatten(OmegaConf.to_container(overrides)):
            _set(cfg, key, value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n..."))
    for key, value in dotted:
        override(cfg, key, value)
    validate(cfg, registry)
    return cfg


def override(cfg: DictConfig, key: str, value: str) -> None:
    """Set ``key=value`` from the command line; a bare key of the task YAML (``sim=habitat``,
    ``judge=llm``) means ``task.<key>``; ``hardware=NAME`` loads that preset (the machine, which
    a saved run may change when it is evaluated or resumed elsewhere)."""
    if key == "hardware":
        valid = presets("hardware")
        if value not in valid:
            raise ConfigError(f"unknown hardware {value!r}; valid: {', '.join(valid)}")
        cfg.hardware = OmegaConf.merge(OmegaConf.structured(HardwareConfig),
                                       OmegaConf.load(CONFIG_DIR / "hardware" / f"{value}.yaml"))
        return
    if "." not in key and key not in cfg and cfg.get("task") is not None and key in cfg.task:
        key = f"task.{key}"
    _set(cfg, key, value)


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def validate(cfg: DictConfig, registry) -> None:
    """Check values that only make sense from a fixed set; name the valid ones."""
    checks = [("algo.coordinator", cfg.algo.coordinator, registry.coordinators),
              ("algo.credit", cfg.algo.credit, registry.credit_schemes),
              ("algo.name", cfg.algo.name, registry.algorithms),
              ("model.backend", cfg.model.backend, registry.policy_backends)]
    for key, value, table in checks:
        if value not in table:
            raise ConfigError(f"unknown {key} {value!r}; valid: {', '.join(sorted(table)) or '(none)'}")
    if cfg.model.bid_mode not in ("logits", "generate"):
        raise ConfigError(f"unknown model.bid_mode {cfg.model.bid_mode!r}; valid: generate, logits")
    levels = list(cfg.algo.bid_levels)
    if not levels or any(not (0.0 <= float(b) < 1.0) for b in levels) or 0.0 not in [float(b) for b in levels]:
        raise ConfigError(f"algo.bid_levels {levels} must be values in [0, 1) and include 0")
    for key in ("iterations", "envs_per_step", "action_steps", "checkpoint_every", "branch_samples"):
        node = cfg.algo if key != "checkpoint_every" else cfg
        if int(node[key]) < (0 if key == "iterations" else 1):
            raise ConfigError(f"{key} must be positive, got {node[key]}")
    for key, value in (("algo.sft.match", [cfg.algo.sft.match]), ("experiment.monolithic_sft", cfg.experiment.monolithic_sft)):
        bad = [v for v in value if v not in SFT_MATCHES]
        if bad or not value:
            raise ConfigError(f"{key} {bad[0] if bad else list(value)!r} is not valid; valid: {', '.join(SFT_MATCHES)}")
    if cfg.algo.bid_pairs not in BID_PAIRS:
        raise ConfigError(f"unknown algo.bid_pairs {cfg.algo.bid_pairs!r}; valid: {', '.join(BID_PAIRS)}")
    if cfg.algo.branch_horizon is not None and int(cfg.algo.branch_horizon) < 1:
        raise ConfigError(f"algo.branch_horizon must be at least 1 (or null: to the end), got {cfg.algo.branch_horizon}")
    from swarm_runtime.train.losses import BID_REFERENCES, PAIR_WEIGHTS  # torch: import only when validating

    if cfg.algo.bid_pair_weight not in PAIR_WEIGHTS:
        raise ConfigError(f"unknown algo.bid_pair_weight {cfg.algo.bid_pair_weight!r}; valid: {', '.join(PAIR_WEIGHTS)}")
    if cfg.algo.bid_reference not in BID_REFERENCES:
        raise ConfigError(f"unknown algo.bid_reference {cfg.algo.bid_reference!r}; valid: {', '.join(BID_REFERENCES)}")
    if float(cfg.algo.kl_coef) < 0:
        raise ConfigError(f"algo.kl_coef must be >= 0, got {cfg.algo.kl_coef}")
    if not float(cfg.algo.bid_beta) > 0:
        raise ConfigError(f"algo.bid_beta must be > 0, got {cfg.algo.bid_beta}")
    if cfg.eval.split not in EVAL_SPLITS:
        raise ConfigError(f"unknown eval.split {cfg.eval.split!r}; valid: {', '.join(EVAL_SPLITS)}")
    if cfg.get("task") is not None and cfg.task.get(f"{cfg.eval.split}_seeds") is None:
        raise ConfigError(f"eval.split={cfg.eval.split}, but task {cfg.task_name!r} of {cfg.domain!r} defines no "
                          f"{cfg.eval.split}_seeds; valid here: "
                          f"{', '.join(s for s in EVAL_SPLITS if cfg.task.get(f'{s}_seeds') is not None)}")
    seeds = cfg.experiment.train_seeds
    if seeds is not None and (not len(seeds) or len(set(int(s) for s in seeds)) != len(seeds)
                              or any(int(s) < 0 for s in seeds)):
        raise ConfigError(f"experiment.train_seeds {list(seeds)} must be distinct non-negative integers "
                          "(or null: the run's seed alone)")
    for key in ("runs", "episodes"):
        value = cfg.eval[key]
        if value is not None and int(value) < 1:
            raise ConfigError(f"eval.{key} must be >= 1{' or null (= all held-out seeds)' if key == 'episodes' else ''}, got {value}")
    if int(cfg.algo.bid_steps) < 0:
        raise ConfigError(f"algo.bid_steps must be >= 0, got {cfg.algo.bid_steps}")
    for key in ("epochs", "action_epochs"):
        value = cfg.algo.sft[key]
        if value is not None and int(value) < 1:
            raise ConfigError(f"algo.sft.{key} must be >= 1{' or null (= algo.sft.epochs)' if key == 'action_epochs' else ''}, got {value}")
