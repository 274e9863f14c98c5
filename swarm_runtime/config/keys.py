"""Every config key's rule (:data:`RULES`), by section, and the check of one key on its own (:func:`check_key`).

A rule says what a key may hold (:class:`~swarm_runtime.config.rules.Rule`, made of the value specs of
:mod:`swarm_runtime.config.rules`); a key without a rule (a section another version adds, a task key a domain
checks in ``make_env``) is not checked here. :func:`register_rules` adds or replaces rules, e.g. a new section's.
What involves several keys is a cross-key check (:mod:`swarm_runtime.config.validation`, ``CHECKS``).

The table's order is the order :func:`~swarm_runtime.config.validation.validate` checks the keys in: the first bad
key of a config is the one named.
"""

from __future__ import annotations

import re

from omegaconf import DictConfig

from swarm_runtime.config.rules import (
    BOOL,
    DEVICE,
    DTYPES,
    LOG_LEVELS,
    MAX_REPLICAS,
    MAX_SEED,
    STR,
    Rule,
    at_least,
    check_rule,
    choices,
    floats,
    ints,
    is_http,
    is_number,
    lists,
    rule,
    value_at,
)
from swarm_runtime.config.schemes import BID_REFERENCES, PAIR_WEIGHTS

# ---------------------------------------------------------------- value specs of single keys
#: ``model.arch``: the keys the memory plan reads, each a whole number in its range (required / optional).
ARCH_REQUIRED = {"vocab_size": 1 << 24, "hidden_size": 1 << 17, "num_hidden_layers": 1024}
ARCH_OPTIONAL = {
    "intermediate_size": 1 << 20,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 1 << 14,
}


def _arch_ok(v) -> bool:
    if not isinstance(v, dict):
        return False
    for k, hi in {**ARCH_REQUIRED, **ARCH_OPTIONAL}.items():
        if (k in ARCH_REQUIRED or v.get(k) is not None) and not ints(1, hi)[0](v.get(k)):
            return False
    return all(isinstance(v[k], bool) for k in ("tie_word_embeddings", "attention_bias") if k in v)


def _replicas_ok(v) -> bool:
    one = ints(0, MAX_REPLICAS)[0]
    return one(v) or (isinstance(v, dict) and bool(v) and all(isinstance(k, str) and one(n) for k, n in v.items()))


#: A folder path as given (``run_dir``): no control characters (a newline, a tab), which would name another folder
#: than the one the user sees.
PATH = (
    (lambda v: isinstance(v, str) and v != "" and re.search(r"[\x00-\x1f\x7f]", v) is None),
    "a non-empty path without control characters (newlines, tabs)",
)
#: Who samples rollouts (``rollout.engine``; docs/reference/engine.md).
ROLLOUT_ENGINES = ("local", "openai", "vllm")
#: URLs the engine samplers speak to.
HTTP_URL = (
    (lambda v: isinstance(v, str) and re.fullmatch(r"https?://[^\s/]+(/\S*)?", v) is not None),
    "an http(s) URL such as http://127.0.0.1:8000",
)
#: A Ray head's address (``cluster.address``, ``serve.address``).
RAY_ADDRESS = (
    (lambda v: isinstance(v, str) and re.fullmatch(r"(ray://)?[^\s:/]+:\d{1,5}", v) is not None),
    "host:port of a Ray head (or ray://host:port)",
)
#: ``cluster.sampler_replicas``: engine sampler actors per base (sampling/replicas.py).
SAMPLER_REPLICAS = (
    (lambda v: v == "per_node" or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024)),
    "an integer in [1, 1024] or per_node",
)
#: ``model.bases``, ``model.role_base``, ``rollout.urls``: mappings whose keys the user names
#: (docs/guides/gpu.md, "A base per role").
MAPPING = ((lambda v: isinstance(v, dict)), "a mapping of NAME: value (set one entry as model.bases.NAME.KEY=VALUE)")
#: The actor kinds ``cluster.resources`` names.
RESOURCE_KINDS = ("env", "learner", "sampler")
#: Resources Ray counts itself (asked with ``num_cpus`` / ``num_gpus`` or a placement, not ``resources``).
RAY_OWN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def _node_resources_ok(v) -> bool:
    return isinstance(v, dict) and all(
        k in RESOURCE_KINDS
        and isinstance(r, dict)
        and all(isinstance(n, str) and n and n not in RAY_OWN_RESOURCES and _positive(a) for n, a in r.items())
        for k, r in v.items()
    )


def _positive(a) -> bool:
    return is_number(a) and 0 < a <= 1e6


# ---------------------------------------------------------------- the table
RULES: dict[str, Rule] = {
    r.key: r
    for r in [
        # model
        rule("model.backend", STR),
        rule("model.name", STR),
        rule("model.path", STR, nullable=True, null_means="build the tiny model from this config"),
        rule("model.hidden_size", ints(1, 1 << 16)),
        rule("model.intermediate_size", ints(1, 1 << 18)),
        rule("model.num_layers", ints(1, 1024)),
        rule("model.num_heads", ints(1, 1024)),
        rule("model.num_kv_heads", ints(1, 1024)),
        rule("model.max_positions", ints(2, 1 << 22)),
        rule("model.bid_mode", choices("logits", "generate")),
        rule("model.temperature", floats(0.0, 100.0)),
        rule("model.max_action_tokens", ints(1, 1 << 16)),
        rule("model.max_bid_tokens", ints(1, 1 << 16)),
        rule("model.max_prompt_tokens", ints(1, 1 << 22)),
        rule("model.constrained_actions", BOOL),
        rule("model.dtype", choices(*DTYPES)),
        rule("model.device", DEVICE),
        # algo
        rule("algo.name", STR),
        rule("algo.coordinator", STR),
        rule("algo.credit", STR),
        rule("algo.bid_levels", lists(floats(0.0, 1.0, hi_open=True))),
        rule("algo.iterations", ints(0)),
        rule("algo.envs_per_step", ints(1, 1_000_000)),
        rule("algo.action_steps", ints(1, 1_000_000)),
        rule("algo.bid_steps", ints(0, 1_000_000)),
        rule("algo.lr", floats(0.0, 10.0)),  # 0 freezes the action steps (a control)
        rule("algo.bid_lr", floats(0.0, 10.0), nullable=True, null_means="algo.lr"),
        rule("algo.weight_decay", floats(0.0, 10.0)),
        rule("algo.adam_eps", floats(0.0, 1.0, lo_open=True)),
        rule("algo.grad_clip", floats(0.0, lo_open=True)),
        rule("algo.warmup_steps", ints(0)),
        rule("algo.min_lr_ratio", floats(0.0, 1.0)),
        rule("algo.minibatch", ints(1)),
        rule("algo.branches_per_episode", ints(1, 1_000_000)),
        rule("algo.resample_tries", ints(1, 1000)),
        rule("algo.branch_samples", ints(1, 1000)),
        rule("algo.branch_horizon", ints(1), nullable=True, null_means="to the end of the episode"),
        rule("algo.bid_pairs", choices("selected", "both")),
        rule("algo.kl_coef", floats(0.0)),
        rule("algo.bid_beta", floats(0.0, lo_open=True)),
        rule("algo.bid_reference", choices(*BID_REFERENCES)),
        rule("algo.bid_pair_weight", choices(*PAIR_WEIGHTS)),
        rule("algo.common_random_numbers", BOOL),
        rule("algo.reward_scale", floats(0.0, lo_open=True), nullable=True, null_means="task.reward_max"),
        rule("algo.goa_responders", ints(1, 1000)),
        rule("algo.sft.demo_episodes", ints(1, 1_000_000)),
        rule("algo.sft.epochs", ints(1, 100_000)),
        rule("algo.sft.action_epochs", ints(1, 100_000), nullable=True, null_means="algo.sft.epochs"),
        rule("algo.sft.lr", floats(0.0, 10.0)),
        rule("algo.sft.batch_size", ints(1)),
        rule("algo.sft.owner_bids", lists(floats(0.0, 1.0, hi_open=True))),
        rule("algo.sft.other_bids", lists(floats(0.0, 1.0, hi_open=True))),
        rule("algo.sft.match", choices("compute", "data")),
        # hardware, eval
        rule("hardware.name", STR),
        rule("hardware.device", DEVICE),
        rule("hardware.threads", ints(0, 4096)),
        rule("eval.runs", ints(1, 100_000)),
        rule("eval.episodes", ints(1), nullable=True, null_means="all held-out seeds"),
        rule("eval.temperature", floats(0.0, 100.0), nullable=True, null_means="model.temperature"),
        rule("eval.common_random_numbers", BOOL),
        # experiment
        rule("experiment.name", STR, nullable=True),
        Rule(
            "experiment.base",
            lambda v: STR[0](v) or lists(STR)[0](v),
            "a run folder, or a list of them (one per experiment.train_seeds)",
            nullable=True,
            null_means="train one",
        ),
        rule("experiment.train_seeds", lists(ints(0, MAX_SEED)), nullable=True, null_means="the run's seed alone"),
        rule("eval.split", choices("eval", "dev")),
        rule("experiment.parallel", ints(1, 64)),
        rule("experiment.iterations", ints(0)),
        rule("experiment.eval_episodes", ints(1), nullable=True),
        rule("experiment.sft_eval", BOOL),
        rule("experiment.budget_factor", floats(1.0, 1000.0)),
        rule("experiment.coordinators", lists(STR)),
        rule("experiment.replicas", lists(ints(1, 1000))),
        rule("experiment.pass_k", ints(1, 10_000)),
        rule("experiment.milestones", lists(STR), nullable=True),
        rule("experiment.dropout_p", lists(floats(0.0, 1.0, hi_open=True))),
        rule("experiment.dropout_replicas", lists(ints(1, 1000))),
        rule("experiment.dropout_per", choices("turn", "episode")),
        rule("experiment.monolithic_sft", lists(choices("compute", "data"))),
        rule("experiment.transfer_tasks", lists(STR, nonempty=False)),
        rule("experiment.transfer_iterations", ints(1)),
        # adapters (model.adapter=lora) and the memory plan
        rule("model.lora.rank", ints(1, 4096)),
        rule("model.lora.alpha", floats(0.0, 1e6, lo_open=True)),
        rule("model.lora.dropout", floats(0.0, 1.0, hi_open=True)),
        rule("model.lora.lr_scale", floats(0.0, 1000.0, lo_open=True)),
        rule("model.lora.target_modules", lists(STR)),
        Rule(
            "model.arch",
            _arch_ok,
            "a mapping of the model's config values with vocab_size, hidden_size and "
            "num_hidden_layers (whole numbers >= 1; intermediate_size, num_attention_heads, num_key_value_heads and "
            "head_dim too when given)",
            nullable=True,
            null_means="model.path's config.json or the built model",
        ),
        rule("hardware.memory_gb", floats(0.0, 1e6, lo_open=True), nullable=True, null_means="not checked"),
        rule("hardware.micro_batch", ints(1), nullable=True, null_means="algo.minibatch"),
        rule("hardware.tf32", BOOL),
        rule("hardware.gradient_checkpointing", BOOL),
        # rlcr (algo=rlcr; refused under the other algorithms: rlcr_only)
        rule("rlcr.org", choices("flat", "ceo")),
        rule("rlcr.agents", ints(1, 9)),
        rule("rlcr.max_hires", ints(0, 8)),
        rule("rlcr.expert_team", ints(1, 9)),
        rule("rlcr.seconds_per_token", floats(0.0, 3600.0, lo_open=True)),
        rule("rlcr.t_max.start", floats(0.0, 1e8, lo_open=True)),
        rule("rlcr.t_max.end", floats(0.0, 1e8, lo_open=True)),
        rule("rlcr.t_max.steps", ints(1)),
        rule("rlcr.latency_penalty", floats(0.0, 1000.0)),
        rule("rlcr.group_size", ints(2, 1024)),
        rule("rlcr.instances", ints(1, 100_000)),
        rule("rlcr.normalize_std", BOOL),
        rule("rlcr.max_turns_per_agent", ints(1, 1_000_000)),
        rule("rlcr.window", ints(0, 1000)),
        rule("rlcr.tick", floats(0.0, 1e8)),
        rule("rlcr.solo_eval", BOOL),
        rule("rlcr.teams", lists(ints(1, 9))),
        rule("rlcr.eval_runs", ints(1, 100_000), nullable=True, null_means="eval.runs"),
        # serve (swarm serve, swarm eval serve.url=...): checked by every command, so swarm run saves none bad
        rule("serve.host", STR),
        rule("serve.port", ints(0, 65535)),
        Rule(
            "serve.replicas",
            _replicas_ok,
            f"a whole number >= 0 and at most {MAX_REPLICAS}, or one per role (serve.replicas.ROLE=N)",
        ),
        rule(
            "serve.agents",
            (
                (
                    lambda v: (
                        isinstance(v, list)
                        and all(isinstance(a, str) and "=" in a and is_http(a.partition("=")[2]) for a in v)
                    )
                ),
                "a list of ROLE=URL entries, each URL http(s)",
            ),
        ),
        rule("serve.bid_deadline_ms", at_least(1, 3_600_000)),
        rule("serve.action_timeout_ms", at_least(1, 3_600_000)),
        rule("serve.drop_after_misses", at_least(1, 1_000_000)),
        rule("serve.probe_interval_ms", at_least(1, 3_600_000)),
        rule("serve.restart_workers", BOOL),
        rule("serve.worker_threads", at_least(1, 1024)),
        rule("serve.max_episodes", at_least(1, 1_000_000)),
        rule("serve.max_body_bytes", at_least(1, 1 << 30)),
        rule("serve.concurrency", at_least(1, 10_000)),
        *(
            rule(f"serve.{k}", floats(0.0, 1e7))
            for k in ("agent_wait_s", "startup_timeout_s", "episode_idle_s", "shutdown_grace_s")
        ),
        Rule(
            "serve.url",
            is_http,
            "an http(s) URL (e.g. http://127.0.0.1:8000)",
            nullable=True,
            null_means="evaluate in process",
        ),
        # top level
        rule("domain", STR),
        rule("task_name", STR),
        rule("seed", ints(0, MAX_SEED)),
        rule("run_dir", PATH, nullable=True, null_means="runs/<domain>-<task>-<time>"),
        rule("resume", BOOL),
        rule("overwrite", BOOL),
        rule("checkpoint_every", ints(1)),
        rule("keep_checkpoints", ints(0, 1_000_000)),
        rule("skip_sft_eval", BOOL),
        rule("progress", BOOL),
        rule("tensorboard", BOOL),
        rule("log_level", choices(*LOG_LEVELS)),
        # the task keys the core reads (domains check their own in make_env)
        rule("task.max_decisions", ints(1, 1_000_000)),
        rule("task.reward_max", floats(0.0, lo_open=True)),
        # rollout and cluster (docs/reference/engine.md, docs/guides/ray.md)
        rule("model.chat_template", choices("auto", "none")),
        rule("algo.is_cap", floats(1.0, 1e6), nullable=True, null_means="off: the plain on-policy loss"),
        rule("algo.served", lists(PATH, nonempty=False)),
        rule("algo.served_only", BOOL),
        rule("algo.served_per_step", ints(1, 1_000_000), nullable=True, null_means="algo.envs_per_step"),
        rule("rollout.engine", choices(*ROLLOUT_ENGINES)),
        rule("rollout.url", HTTP_URL, nullable=True, null_means="none (rollout.engine=openai needs one)"),
        rule("rollout.api_key_env", STR, nullable=True, null_means="no bearer key"),
        rule("rollout.timeout_s", floats(0.0, 86400.0, lo_open=True)),
        rule("rollout.concurrency", ints(1, 4096)),
        rule("rollout.retries", ints(0, 100)),
        rule("rollout.max_staleness", ints(0, 64)),
        rule("cluster.kind", choices("local", "ray")),
        rule(
            "cluster.address",
            RAY_ADDRESS,
            nullable=True,
            null_means="start a local Ray for the run (127.0.0.1)",
        ),
        rule("cluster.env_workers", ints(1, 1024)),
        rule("cluster.num_cpus", ints(1, 4096), nullable=True, null_means="Ray's count of this machine's CPUs"),
        rule("cluster.samplers", choices("local", "ray")),
        rule("cluster.sampler_restarts", ints(0, 1000)),
        rule("cluster.sampler_replicas", SAMPLER_REPLICAS),
        rule("cluster.learners", choices("local", "ray")),
        rule("cluster.learner_restarts", ints(0, 1000)),
        rule("rollout.vllm.python", STR, nullable=True, null_means="$SWARM_VLLM_PYTHON, else python3 on PATH"),
        rule("rollout.vllm.host", choices("127.0.0.1", "localhost", "0.0.0.0", "::1")),
        rule("rollout.vllm.port", ints(0, 65535)),
        rule("rollout.vllm.args", lists(STR, nonempty=False)),
        rule("rollout.vllm.startup_timeout_s", floats(1.0, 86400.0)),
        rule("rollout.vllm.dtype", choices("float32", "float16", "bfloat16", "auto")),
        # a base per role (docs/guides/gpu.md, "A base per role")
        Rule(
            "model.bases",
            MAPPING[0],
            "a mapping NAME -> model settings (model.bases.NAME.path=..., model.bases.NAME.hidden_size=...)",
        ),
        Rule(
            "model.role_base",
            (lambda v: isinstance(v, dict) and all(isinstance(n, str) for n in v.values())),
            "a mapping ROLE -> base name (model.role_base.ROLE=NAME)",
        ),
        Rule(
            "rollout.urls",
            (lambda v: isinstance(v, dict) and all(HTTP_URL[0](u) for u in v.values())),
            "a mapping base NAME -> http(s) URL (rollout.urls.NAME=http://host:port)",
        ),
        # train.* and cluster placement (docs/guides/sharded-learners.md, "Placement and sizing")
        rule("train.engine", choices("local", "fsdp", "deepspeed")),
        rule("train.shards", ints(1, 1024)),
        rule("cluster.placement", choices("none", "colocated", "split")),
        rule("cluster.cpus_per_bundle", ints(1, 1024)),
        rule("cluster.placement_wait_s", floats(0.0, 3600.0, lo_open=True)),
        # serve.cluster: agent workers on Ray
        rule("serve.cluster", choices("local", "ray")),
        rule("serve.address", RAY_ADDRESS, nullable=True, null_means="start a local Ray for the gateway (127.0.0.1)"),
        # cluster.resources: actors pinned to nodes
        Rule(
            "cluster.resources",
            _node_resources_ok,
            f"a mapping KIND -> {{NAME: amount > 0}}, KIND one of {', '.join(RESOURCE_KINDS)}, NAME a custom resource "
            f"of a node (ray start --resources='{{\"NAME\": 1}}'; not {', '.join(RAY_OWN_RESOURCES)}), e.g. "
            "cluster.resources.env={nodeB: 0.01}",
        ),
        rule("cluster.restart_wait_s", floats(0.0, 86400.0, lo_open=True)),
    ]
}


def register_rules(*rules: Rule) -> None:
    """Add (or replace) the rules of keys, e.g. a new config section's."""
    for r in rules:
        RULES[r.key] = r


def check_key(cfg: DictConfig, key: str) -> None:
    """``key``'s rule alone on ``cfg`` (a key without a rule, or with a lazy one, passes): the command
    line's keys, each on its own, before the plugins load (:func:`swarm_runtime.config.load.precheck`)."""
    r = RULES.get(key)
    if r is not None and not r.lazy:
        check_rule(r, value_at(cfg, key))


# ---- serve: the gateway's limits (``swarm serve``; ``swarm config`` refuses the same)
register_rules(
    rule("serve.allow_hosts", lists(STR, nonempty=False)),
    rule("serve.client_episodes", at_least(1, 1_000_000)),
    rule("serve.max_restarts", at_least(1, 1_000_000)),
    *(rule(f"serve.{k}", floats(0.0, 1e7)) for k in ("queue_wait_s", "restart_window_s", "restart_backoff_max_s")),
    rule("serve.degraded_share", floats(0.0, 1.0)),
    rule("serve.journal_tokens", BOOL),
)
