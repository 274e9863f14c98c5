"""The config's schema: documented dataclasses (one per section) turned into OmegaConf structured configs,
and the version a saved config carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Core presets: ``swarm_runtime/configs/<group>/<name>.yaml``, shipped inside the package.
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"  # swarm_runtime/configs


GROUPS = ("domain", "task", "model", "algo", "hardware")


#: Default LoRA target modules: every projection of a Qwen/Llama-style block (attention and MLP).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoRAConfig:
    """One PEFT LoRA adapter per role on a shared base (``model.adapter=lora``; docs/reference/method.md, section 8)."""

    rank: int = 8  #: LoRA rank r (> 0)
    alpha: float = 16.0  #: LoRA scaling numerator (the update is scaled by alpha / rank)
    dropout: float = 0.0  #: dropout on the LoRA input (0: sampling and scoring see the same function)
    target_modules: list = field(default_factory=lambda: list(LORA_TARGETS))  #: names of the base's linear
    #: layers that get an adapter (each must exist in the model; the default suits Qwen2/3 and Llama blocks)
    lr_scale: float = 1.0  #: the adapters train at this times ``algo.sft.lr`` (each role's SFT), ``algo.lr`` and


@dataclass
class ModelConfig:
    backend: str = "transformers"  #: policy backend (see ``swarm plugins``)
    name: str = "tiny"  #: preset name
    path: str | None = None  #: local Hugging Face checkpoint; None = build the tiny model from this config
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
    chat_template: str = "auto"  #: ``auto``: a tokenizer with a chat template gets each prompt as chat messages in it,
    #: the role card as the system message and the rest as the user turn (an instruct model is prompted as it was
    #: trained); ``none``: the raw prompt (a tokenizer without a template: raw)
    dtype: str = "float32"  #: weights dtype when loading a checkpoint
    device: str = "cpu"  #: torch device
    adapter: str | None = "none"  #: ``none`` (or null): one full model per role (the default); ``lora``: one
    #: shared base in memory and one PEFT LoRA adapter per role, each trained alone with its own optimizer
    #: (``model.lora.*``). With ``model=local`` the hardware profile's ``local_adapter`` is the default
    lora: LoRAConfig = field(default_factory=LoRAConfig)  #: the adapters of ``model.adapter=lora``
    arch: dict | None = None  #: Hugging Face config values (hidden_size, num_hidden_layers, vocab_size, ...)
    #: the memory plan uses when no checkpoint is on disk yet (recipes); None = ``model.path``'s config.json or
    #: the built model's fields
    bases: dict = field(default_factory=dict)  #: more base models beside the one ``model.*`` describes (named
    #: ``default``): ``model.bases.NAME.KEY=VALUE``, KEY one of path, hidden_size, intermediate_size, num_layers,
    #: num_heads, num_kv_heads, max_positions, dtype, arch (the rest of ``model.*`` is shared); a base is used by
    #: the roles ``model.role_base`` puts on it (docs/guides/gpu.md, "A base per role")
    role_base: dict = field(default_factory=dict)  #: ``model.role_base.ROLE=NAME``: the role's base (a name of


@dataclass
class SFTConfig:
    demo_episodes: int = 16  #: scripted-expert episodes (train seeds) for the cold start
    epochs: int = 2  #: passes over each agent's demos (paper: 2)
    action_epochs: int | None = None  #: passes over the action demos (None = ``epochs``; bid demos always get
    #: ``epochs``), for actions that need far more passes than the bids (docs/reference/config.md)
    lr: float = 2e-3  #: SFT learning rate (docs/reference/config.md: why far above the paper's 1e-5)
    batch_size: int = 64  #: examples per SFT step
    owner_bids: list = field(default_factory=lambda: [0.6, 0.8])  #: demo bids of the role owning the expert's
    #: action (one drawn per example)
    other_bids: list = field(default_factory=lambda: [0.0, 0.2, 0.4])  #: demo bids of the other roles (spread, so
    #: turns are contested and lower bids can be re-sampled)
    match: str = "compute"  #: monolithic baseline only: ``compute`` = the swarm's SFT examples x epochs (bids


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
    lr: float = 3e-5  #: RL learning rate (paper: 1e-6 for 4-8B models; the tiny model's range:
    #: docs/reference/config.md)
    bid_lr: float | None = 3e-4  #: learning rate of the bid (Bradley-Terry) steps; None = ``lr``
    #: (why ten times ``lr``: docs/reference/config.md)
    weight_decay: float = 0.0  #: AdamW weight decay
    adam_eps: float = 1e-4  #: AdamW epsilon of the RL optimizers (above the usual 1e-8 on purpose:
    #: docs/reference/config.md)
    grad_clip: float = 1.0  #: max gradient norm
    warmup_steps: int = 0  #: linear warm-up before the cosine decay
    min_lr_ratio: float = 0.1  #: cosine floor as a fraction of lr
    minibatch: int = 256  #: samples per forward/backward chunk (gradients accumulate)
    branches_per_episode: int = 4  #: contested turns branched per episode in a bid step
    resample_tries: int = 3  #: bid re-samples to get below the runner-up (docs/reference/method.md, section 4)
    branch_samples: int = 1  #: continuations per side of a branch pair: 1 = the paper (one branch against the
    #: original episode); k > 1 = k branches against the original and k - 1 re-rolls where the selected agent
    #: acts again, scores averaged (~1/k of the noise, 2k - 1 branch rollouts per pick)
    branch_horizon: int | None = None  #: decisions a branch pair compares from the branched turn on: None = to
    #: the end of the episode (the paper); H = the rewards of the next H decisions on both sides (branches stop
    #: there): a shorter, cheaper comparison (measured: docs/reference/config.md)
    bid_pairs: str = "selected"  #: whose bid a branch pair trains: ``selected`` (the paper: the agent that won
    #: the turn, its winning bid against a re-sampled lower one) or ``both`` (also the runner-up, its own bid
    #: against a re-sampled one above the winner's; the same two rollouts, no extra branches; docs/reference/config.md)
    kl_coef: float = 0.0  #: action steps: each action's credit is charged ``kl_coef * [log pi(a|h) - log
    #: pi_ref(a|h)]`` (reward units), pi_ref = the models as RL started (``checkpoints/sft``): the KL-penalised
    #: reward of RLHF (docs/reference/config.md). 0 = the paper
    bid_reference: str = "none"  #: what a bid pair's log-odds are measured against: ``none`` (the paper:
    #: ``log pi(y_w) - log pi(y_l)``) or ``sft`` (minus the same log-odds under the policies at the start of RL,
    #: ``checkpoints/sft``: the DPO form; one frozen copy of each role's model more in memory; docs/reference/config.md)
    bid_beta: float = 1.0  #: scale of the Bradley-Terry log-odds (``-log sigmoid(beta * z)``; 1 = the paper). With
    #: ``bid_reference=sft`` a preference of win rate p moves the bid odds by ``(p / (1 - p)) ** (1 / beta)``
    bid_pair_weight: str = "uniform"  #: weight of each decisive branch pair in the Bradley-Terry loss: ``uniform``
    #: (the paper: bids follow how often the higher bid's branch scored better) or ``margin`` (|score difference|,
    #: normalised to mean 1: bids follow the mean score difference, so rare large wins count; docs/reference/config.md)
    common_random_numbers: bool = False  #: key every sampling draw of an episode by (episode noise id, turn,
    #: agent, kind) and give each counterfactual branch its original's noise id, so the two differ only through
    #: the forced decision; False = the policies' generators (the paper; measured: docs/reference/config.md)
    reward_scale: float | None = None  #: advantages are divided by this (None = task.reward_max)
    is_cap: float | None = None  #: truncated importance weights ``min(cap, pi_learner / pi_sampler)`` on each
    #: response's REINFORCE term and bid-pair loss (off-policy rollouts; None = off, the plain on-policy loss)
    served: list = field(default_factory=list)  #: served transcripts (``RUN/serve/episodes.jsonl``, or a served run
    #: folder) whose episodes actions also train on, importance-weighted (docs/guides/serve.md)
    served_only: bool = False  #: train on ``algo.served`` instead of rollouts of its own (action updates only)
    served_per_step: int | None = None  #: served episodes per action update (None = ``algo.envs_per_step``)
    goa_responders: int = 2  #: ``graph_of_agents`` coordinator: how many of the agents most confident in their own
    #: proposal respond (their proposals are peer-scored)
    sft: SFTConfig = field(default_factory=SFTConfig)


@dataclass
class HardwareConfig:
    name: str = "cpu"  #: preset name
    device: str = "cpu"  #: torch device
    threads: int = 0  #: torch CPU threads (0 = all cores)
    memory_gb: float | None = None  #: device memory the memory plan must fit (None = not checked: the CPU)
    dtype: str | None = None  #: weights dtype of a loaded checkpoint (None = ``model.dtype``)
    attention: str | None = None  #: attention implementation of a loaded checkpoint (``sdpa``,
    #: ``flash_attention_2`` where flash-attn is installed, ``eager``; None = transformers' default)
    tf32: bool = False  #: allow TF32 matmuls on CUDA (Ampere and later)
    gradient_checkpointing: bool = False  #: recompute activations in the backward pass (less memory, ~1/3 more
    #: compute in updates); applied to loaded checkpoints
    micro_batch: int | None = None  #: rows per forward/backward chunk in updates and SFT steps (caps
    #: ``algo.minibatch`` and ``algo.sft.batch_size``, gradients summed; None = the whole batch)
    local_adapter: str | None = "none"  #: ``model.adapter`` default for ``model=local`` on this machine


@dataclass
class EvalConfig:
    runs: int = 3  #: sampled runs per held-out seed
    episodes: int | None = None  #: held-out seeds used (None = all of the task's eval seeds)
    temperature: float | None = None  #: sampling temperature at evaluation (None = model.temperature)
    split: str = "eval"  #: episode seeds held-out evaluations use: ``eval`` (reported numbers) or ``dev`` (tuning;
    #: disjoint from train and eval)
    common_random_numbers: bool = False  #: key each held-out episode's draws by (eval seed, run, episode seed), so


@dataclass
class ExperimentConfig:
    """Settings of ``swarm experiment NAME`` (docs/guides/experiments.md); ignored by ``swarm run``."""

    name: str | None = None  #: the experiment (set by ``swarm experiment NAME``)
    base: Any = None  #: a ``swarm run`` folder whose final checkpoint is the trained MPT swarm (its ``sft``
    #: checkpoint the initial one), or a list of them, one per training seed (experiment.train_seeds); None = train one
    train_seeds: list | None = field(default_factory=lambda: [0, 1, 2])  #: training seeds: every arm is trained
    #: and evaluated once per seed (run seed = training seed, in ``seed-<s>/``); tables show the mean over seeds
    #: ± SE over seeds, plus paired differences; null = the run's ``seed`` alone, in the folder itself
    parallel: int = 1  #: training seeds run at once, each in a process of its own with ``hardware.threads``
    #: shared out among them (docs/guides/experiments.md); 1 = one after another in this process
    iterations: int = 10  #: RL updates of each training inside an experiment (overrides algo.iterations there)
    eval_episodes: int | None = 16  #: held-out seeds per evaluated condition (eval.episodes wins when set;
    #: None = all)
    sft_eval: bool = False  #: also evaluate each training's SFT checkpoint (one more held-out evaluation each)
    budget_factor: float = 3.0  #: a FLOPs-matched training (monolithic, round-robin) may run up to this x
    #: iterations before reaching its budget; its cosine schedule spans that cap
    coordinators: list = field(default_factory=lambda: ["auction", "graph_of_agents", "round_robin", "agentnet"])
    #: ``coordination``: the coordinators compared over the same trained action policies
    replicas: list = field(default_factory=lambda: [1, 2, 3, 4])  #: ``population``: replicas per role at
    #: inference (1..4 = 3..12 agents with 3 roles)
    pass_k: int = 3  #: ``population``: k of pass@k (eval.runs is raised to k when lower)
    milestones: list | None = None  #: ``population``: milestones scored with pass@k (None = the keys of
    #: task.milestones)
    dropout_p: list = field(default_factory=lambda: [0.0, 0.3, 0.6, 0.9])  #: ``dropout``: absence probabilities
    dropout_replicas: list = field(default_factory=lambda: [1, 4])  #: ``dropout``: replicas per role (1 and 4 =
    #: 3 and 12 agents with 3 roles)
    dropout_per: str = "turn"  #: ``dropout``: ``turn`` (a fresh draw every turn) or ``episode`` (one draw per
    #: episode and agent)
    monolithic_sft: list = field(default_factory=lambda: ["compute"])  #: ``heldout``: one monolithic training per
    #: SFT matching (``compute``, ``data``; algo.sft.match)
    transfer_tasks: list = field(default_factory=list)  #: ``transfer``: tasks of the same domain to adapt to (set
    #: in a task's ``overrides:``)
    transfer_iterations: int = 6  #: ``transfer``: RL updates of the swarm's adaptation (the monolithic one is


@dataclass
class ServeConfig:
    """Settings of ``swarm serve RUN_DIR`` (the gateway) and of ``swarm eval RUN serve.url=...``
    (docs/guides/serve.md)."""

    host: str = "127.0.0.1"  #: gateway address; anything but loopback needs the SWARM_API_KEY environment variable
    port: int = 8000  #: gateway port
    replicas: Any = 1  #: workers per role: one number for every role, or per role (``serve.replicas.Smith=6``);
    #: 0 = none
    agents: list = field(default_factory=list)  #: external agents the gateway admits at start, ``ROLE=URL`` (an
    #: OpenAI-compatible completions server of that role's checkpoint, e.g. ``Smith=http://gpu1:8000`` from
    #: ``vllm serve``)
    bid_deadline_ms: int = 2000  #: an agent whose bid is not in by then does not bid this turn
    action_timeout_ms: int = 10000  #: a winner whose action is not in by then has failed: the turn goes to the
    #: runner-up
    drop_after_misses: int = 3  #: bid deadlines missed in a row before an agent is dropped (probed, re-admitted
    #: when it answers)
    probe_interval_ms: int = 500  #: how often dropped and starting agents are probed, dead workers restarted
    restart_workers: bool = True  #: restart a worker process the gateway started when it dies
    agent_wait_s: float = 10.0  #: with no agent up, how long a turn waits for one before the episode fails
    worker_threads: int = 1  #: torch CPU threads of each worker process
    startup_timeout_s: float = 300.0  #: the workers must all answer within this at start
    episode_idle_s: float = 300.0  #: a client-side episode with no turn for this long expires
    max_episodes: int = 64  #: episodes running at once; more are refused with 429
    max_body_bytes: int = 1048576  #: request bodies over this get 413
    shutdown_grace_s: float = 30.0  #: on SIGTERM/SIGINT, running episodes get this long to finish (the rest are
    #: reported)
    allow_hosts: list = field(default_factory=list)  #: agent URL hosts allowed besides loopback (``*``: any host)
    client_episodes: int = 16  #: client-side episodes one client (API key or address) may hold open at once
    queue_wait_s: float = 5.0  #: at serve.max_episodes, how long a new episode waits for a slot before 429
    degraded_share: float = 0.1  #: an episode with more than this share of turns lost to faults is ``degraded``
    journal_tokens: bool = True  #: ask agents for token ids and log-probs, kept in the journal and transcript
    #: (training on served traffic); false for an agent server without vLLM's completions extensions
    max_restarts: int = 5  #: restarts of one worker within serve.restart_window_s before it is marked ``failed``
    restart_window_s: float = 60.0  #: the window of serve.max_restarts
    restart_backoff_max_s: float = 30.0  #: cap of the exponential wait between restarts of one worker
    url: str | None = None  #: ``swarm eval``: evaluate through the service at this URL instead of in process
    concurrency: int = 8  #: ``swarm eval`` through a service: episodes in flight at once
    # where the agent workers run (docs/guides/serve.md, "Across machines")
    cluster: str = "local"  #: ``local``: worker processes forked on this host; ``ray``: each worker in a Ray actor,
    #: placed on any node of the cluster at ``serve.address`` (restarted by Ray when its process dies)
    address: str | None = None  #: ``serve.cluster=ray``: a running Ray cluster's head (``host:port``); None = start


@dataclass
class VLLMConfig:
    """``rollout.vllm``: the vLLM OpenAI servers ``rollout.engine=vllm`` starts, one per base (docs/guides/vllm.md)."""

    python: str | None = None  #: the Python of a virtualenv that has vLLM (e.g. ``~/.venvs/vllm/bin/python``);
    #: None = the ``SWARM_VLLM_PYTHON`` environment variable, else ``python3`` on PATH
    host: str = "127.0.0.1"  #: address the server binds to and is asked at
    port: int = 0  #: the server's port (0 = a free port picked at start); with several bases (``model.bases``)
    #: the next bases' servers take the ports after it
    args: list = field(default_factory=list)  #: extra ``vllm.entrypoints.openai.api_server`` arguments
    startup_timeout_s: float = 600.0  #: the server must answer ``/health`` within this
    dtype: str = "float32"  #: ``--dtype`` of the server (float32 on CPU: the learner's weights, no rounding)


@dataclass
class RolloutConfig:
    """Who samples the rollouts (docs/reference/engine.md)."""

    engine: str = "local"  #: ``local`` (in process, the learner's own modules), ``openai`` (an OpenAI-compatible
    #: completions server at ``rollout.url``), ``vllm`` (servers the run starts and stops)
    url: str | None = None  #: ``openai``: the server's base URL (``http://host:port``)
    urls: dict = field(default_factory=dict)  #: ``openai`` with several bases (``model.bases``): the server of each
    #: other base, ``rollout.urls.NAME=http://host:port`` (``rollout.url`` serves the ``default`` base)
    api_key_env: str | None = None  #: ``openai``: environment variable holding the server's bearer key
    #: (None: none)
    timeout_s: float = 120.0  #: one completion request's timeout
    concurrency: int = 64  #: completion requests in flight at once
    retries: int = 2  #: a failed request is retried this many times (a restarted server answers the same rows)
    max_staleness: int = 0  #: updates a rollout's weights may lag the learner (0: on-policy, every update syncs
    #: first)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class ClusterConfig:
    """Where a run's envs live (docs/guides/ray.md)."""

    kind: str = "local"  #: ``local`` (in the trainer's process) or ``ray`` (env worker actors on Ray: rollouts,
    #: evaluations and branches step their envs there; the auction, credit and learning stay in the trainer)
    address: str | None = None  #: ``ray``: a running cluster's address (``host:port``); None = start a local
    #: Ray for the run on 127.0.0.1 (its gRPC servers still listen on every interface: docs/reference/cluster.md,
    #: "Env workers", Loopback), and
    #: stop it at the end
    env_workers: int = 2  #: ``ray``: env worker actors (each owns a pool of envs, reused across episodes)
    num_cpus: int | None = None  #: ``ray`` with a local Ray: CPUs it is started with (None = Ray's count)
    # sampler actors (cluster/samplers.py, cluster/vllm_actors.py)
    samplers: str = "local"  #: ``local`` (bids and actions drawn in the trainer's process) or ``ray`` (with
    #: ``cluster.kind=ray``; ``rollout.engine=local``: a sampler actor holds a copy of the policies, synced after
    #: each update, the same draws as in process; ``rollout.engine=vllm``: per base an actor starts the vLLM server
    #: on its node and loads the adapters the trainer exports)
    sampler_restarts: int = 8  #: ``samplers=ray``: restarts Ray gives a sampler actor after its process dies
    # sampler replicas (sampling/replicas.py; docs/reference/cluster.md, "Sampler replicas")
    sampler_replicas: Any = 1  #: ``samplers=ray`` with ``rollout.engine=vllm``: engine sampler actors per base, each
    #: its own vLLM server, spread over the nodes (a call's rows split among them); an int >= 1 (1: one server per
    #: base) or ``per_node`` (one per alive Ray node); a replica gone for good is dropped, its rows go to the rest;
    #: with ``placement`` (an int only) a sampler bundle each; on a CUDA profile each asks its server's GPUs
    # learner actors (docs/reference/cluster.md, "Learner actors")
    learners: str = "local"  #: where the trainable weights and optimizers live: ``local`` (the trainer's process)
    #: or ``ray`` (needs ``kind=ray``: learner actors, one per role with a full copy, one per base of adapters;
    #: the updates run there, the trainer keeps a sampling copy synced after each; the same numbers)
    learner_restarts: int = 4  #: ``learners=ray``: times Ray restarts a learner actor whose process died (the run
    #: then rewinds to its last checkpoint); used up (or the node lost): the run stops, resumable
    # placement (docs/guides/sharded-learners.md, "Placement and sizing")
    placement: str = "none"  #: ``none`` (no placement groups: actors wherever Ray has room), ``colocated`` (per
    #: agent group one Ray placement group whose bundles, one per device, hold the learner's shards and the sampler
    #: on the first) or ``split`` (the sampler in a bundle of its own); reserved before anything trains
    cpus_per_bundle: int = 1  #: CPUs of each bundle (a device's bundle also holds 1 GPU on ``hardware.device=cuda``)
    placement_wait_s: float = 30.0  #: a placement group not reserved within this is an error naming the bundles
    #: asked and the resources Ray has
    # more than one node (docs/guides/ray.md, "More than one node")
    resources: dict = field(default_factory=dict)  #: ``cluster.resources.KIND={NAME: amount}``, KIND ``env``,
    #: ``learner`` or ``sampler``: Ray custom resources each actor of that kind asks, so that it runs on a node
    #: that has them (``ray start --resources='{"NAME": 1}'``); with ``placement=none`` only
    restart_wait_s: float = 120.0  #: how long a dead actor (env worker, learner, sampler) is waited for while Ray
    #: restarts it (its node lost: until a node that can hold it joins); then the run stops, resumable
    # the run's environment on a joined cluster (swarm_runtime/cluster/actor_env.py; docs/guides/ray.md)
    env_vars: list = field(default_factory=list)  #: names of more environment variables (a third-party domain's own)


@dataclass
class TrainConfig:
    """How a learner updates its agent group's weights (docs/guides/sharded-learners.md)."""

    engine: str = "local"  #: ``local`` (one process: the trainer's), ``fsdp`` (FSDP2 over ``shards`` processes) or
    #: ``deepspeed`` (ZeRO-3); the memory plan divides a learner's state by ``shards``. Runs train with ``local`` or
    #: ``fsdp`` (learner actors: ``cluster.learners=ray``); ``benchmarks/sharded_update.py`` runs ``deepspeed``
    shards: int = 1  #: processes (devices) per learner group (1 = unsharded; > 1 needs fsdp or deepspeed)


@dataclass
class TMaxConfig:
    """``rlcr.t_max``: the wall-clock limit's schedule (docs/reference/config.md: the seed's)."""

    start: float = 600.0  #: simulated seconds of the limit at the first update (> 0)
    end: float = 1500.0  #: limit from update ``steps`` on (>= start); held-out evaluation uses it
    steps: int = 10  #: updates over which the limit grows linearly from ``start`` to ``end`` (>= 1)


@dataclass
class RLCRConfig:
    """Settings of ``algo=rlcr`` (collective-reward RL, docs/guides/rlcr.md); ignored by the other algorithms."""

    org: str = "flat"  #: ``flat`` (``agents`` peers) or ``ceo`` (a CEO who hires and fires specialists)
    agents: int = 3  #: flat team size (1..9)
    max_hires: int = 8  #: most specialists a CEO employs at once (0..8); more hires are refused in-episode
    expert_team: int = 3  #: team size of the scripted collective whose rollouts are the SFT demos (ceo: CEO +
    #: hires)
    seconds_per_token: float = 2.0  #: simulated seconds per generated token (every action also costs the env's
    #: own time)
    t_max: TMaxConfig = field(default_factory=TMaxConfig)
    latency_penalty: float = 0.0  #: beta of ``R = R_task - beta * reward_max * mean_pass_rate(q) * T / T_max``
    #: (0 = time limit only)
    group_size: int = 4  #: G rollouts per task instance (same seed): the group baseline (>= 2)
    instances: int = 4  #: task instances (train seeds) per update
    normalize_std: bool = False  #: divide each advantage by its group's return std
    max_turns_per_agent: int = 120  #: actions an agent may take in one rollout (then it idles)
    window: int = 3  #: inbox / channel / archive-search messages shown in a prompt
    tick: float = 0.0  #: > 0: agents decide only at multiples of this many simulated seconds (an agent done
    #: between ticks waits), so more of them go to the model together; 0 = exact event times
    solo_eval: bool = True  #: also evaluate a solo agent (team of 1) with the same policy and T_max
    teams: list = field(default_factory=lambda: [1, 2, 3, 4, 6])  #: ``swarm experiment rlcr_teams``: flat team sizes
    #: trained and compared (6 stands for the seed's "5-8" bucket)
    eval_runs: int | None = 1  #: sampled runs per held-out seed under algo=rlcr (None = eval.runs; why 1:


#: The current version of the config's key set (``RunConfig.config_version``; :data:`ADDED_KEYS`).
CONFIG_VERSION = 10


@dataclass
class RunConfig:
    config_version: int = CONFIG_VERSION  #: version of the config's key set (``CONFIG_VERSION``), written first
    #: in config.yaml so that loading a run folder tells a file of an earlier version (its newer keys take the
    #: values that reproduce that version's behaviour, :data:`ADDED_KEYS`) from a truncated one (an error naming
    #: the missing keys)
    domain: str = "minecraft"  #: domain plugin (``swarm domains`` lists them)
    task_name: str = "iron_pickaxe"  #: task of the domain (set with ``task=``)
    task: Any = None  #: the task's YAML (domain-specific keys included)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)  #: ``swarm serve`` / ``swarm eval serve.url=...``
    rlcr: RLCRConfig = field(default_factory=RLCRConfig)  #: ``algo=rlcr`` settings
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  #: who samples rollouts (docs/reference/engine.md)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  #: where the envs live (docs/guides/ray.md)
    train: TrainConfig = field(default_factory=TrainConfig)  #: the learner's engine and shards
    #: (docs/guides/sharded-learners.md)
    seed: int = 0  #: run seed (model init, sampling, auction tie-breaks, seed order)
    run_dir: str | None = None  #: output folder (None = runs/<domain>-<task>-<time>)
    resume: bool = False  #: continue the run in run_dir (or the latest matching one) from its last checkpoint
    overwrite: bool = False  #: a fresh run into a run_dir that already holds a run deletes that run first (else
    #: an error)
    checkpoint_every: int = 5  #: RL updates between checkpoints
    keep_checkpoints: int = 2  #: older checkpoints are pruned
    skip_sft_eval: bool = False  #: do not evaluate the SFT checkpoint
    progress: bool = True  #: show progress bars
    tensorboard: bool = True  #: write TensorBoard event files
    log_level: str = "INFO"  #: loguru level on the console


#: Whose bids a branch pair trains (``algo.bid_pairs``).
BID_PAIRS = ("selected", "both")


#: How the monolithic baseline's SFT is matched to the swarm's (``algo.sft.match``).
SFT_MATCHES = ("compute", "data")
