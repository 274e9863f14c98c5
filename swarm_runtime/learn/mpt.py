"""MPT training (docs/reference/method.md, section 5): SFT cold start, then alternate ``action_steps``
REINFORCE updates with ``bid_steps`` counterfactual Bradley-Terry updates, with
held-out evaluation after SFT and after RL."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from functools import partial

import torch
from loguru import logger

from swarm_runtime.cluster import close_cluster
from swarm_runtime.cluster.placement import node_resources
from swarm_runtime.core.env import close_all
from swarm_runtime.core.loop import new_slots
from swarm_runtime.evaluation.heldout import evaluate, paired_difference
from swarm_runtime.learn.action import action_update, credit_samples_and_turns
from swarm_runtime.learn.bid import bid_update, pick_contested, run_branches
from swarm_runtime.learn.learner_actors import LearnerActors
from swarm_runtime.learn.optim import load_optimizer_state, make_optimizer
from swarm_runtime.learn.phases import PhasedTrainer
from swarm_runtime.learn.served import SERVED_IS_CAP, load_pool, served_metrics
from swarm_runtime.learn.sft import collect_demos, demo_accuracy, sft
from swarm_runtime.models.adapters import adapter_lr_scale, sft_shared_base
from swarm_runtime.models.bases import base_dir
from swarm_runtime.models.masters import restore_master_weights
from swarm_runtime.runs import checkpoint as ckpt
from swarm_runtime.runs.context import RunContext
from swarm_runtime.runs.folder import truncate_metrics
from swarm_runtime.runs.outputs import MetricsWriter, format_table, plot_training
from swarm_runtime.runs.runfiles import claim
from swarm_runtime.sampling.factory import make_sampler
from swarm_runtime.sampling.local import LocalLearner, LockedSampler, model_names
from swarm_runtime.sampling.openai import restore_sampler_rng, sampler_rng_state
from swarm_runtime.sampling.play import play


def step_kind(iteration: int, action_steps: int, bid_steps: int) -> str:
    """``action`` or ``bid`` for RL update ``iteration`` (4 action : 1 bid by default)."""
    cycle = action_steps + bid_steps
    return "action" if iteration % cycle < action_steps else "bid"


def rollout_metrics(episodes, agents) -> dict[str, float]:
    known = [e for e in episodes if not e.reward_missing]
    m = {
        "charts/episode_reward": sum(e.reward for e in known) / max(1, len(known)),
        "charts/decisions": sum(len(e.turns) for e in episodes) / max(1, len(episodes)),
        "charts/invalid_actions": float(sum(e.invalid_actions for e in episodes)),
        "charts/unparsed_bids": float(sum(e.unparsed_bids for e in episodes)),
        "charts/reward_missing": float(len(episodes) - len(known)),
    }
    if known and "success" in known[0].metrics:
        m["charts/success"] = sum(float(e.metrics.get("success", 0)) for e in known) / len(known)
    wins = Counter(agents[t.winner].name for e in episodes for t in e.turns if t.winner is not None)
    total = sum(wins.values())
    refused = Counter(agents[t.winner].name for e in episodes for t in e.turns if t.winner is not None and not t.valid)
    for a in agents:
        m[f"charts/turn_share_{a.name}"] = wins[a.name] / total if total else 0.0
        # the share of the role's actions its world refused (unparsable, or not the role's to take)
        m[f"charts/invalid_share_{a.name}"] = refused[a.name] / wins[a.name] if wins[a.name] else 0.0
    m["charts/skipped_turns"] = sum(t.winner is None for e in episodes for t in e.turns) / max(1, len(episodes))
    return m


def rollout_staleness(episodes, names: list[str], learner) -> float | None:
    """How stale a rollout's actions were: the mean, over acted turns whose response carries its version, of
    the updates of the acting model its weights lacked when this update trains (:meth:`LocalLearner.behind`;
    at most ``rollout.max_staleness``); None when no response carries a version."""
    lags = [
        learner.behind(names[t.winner], t.action_version)
        for e in episodes
        for t in e.acted
        if t.action_version is not None
    ]
    return sum(lags) / len(lags) if lags else None


def optimizer_settings(cfg) -> dict:
    """The arguments of ``learn/optim.py: make_optimizer`` (beside the parameters) of each kind of step."""
    a = cfg.algo
    cycle = int(a.action_steps) + int(a.bid_steps)
    steps = {
        "action": int(a.iterations) * int(a.action_steps) // cycle + 1,
        "bid": int(a.iterations) * int(a.bid_steps) // cycle + 1,
    }
    scale = adapter_lr_scale(cfg)
    lrs = {"action": float(a.lr) * scale, "bid": float(a.bid_lr if a.get("bid_lr") is not None else a.lr) * scale}
    # adapters: every role's moments allocated now, together (same numbers; less heap growth: optim.init_adam_state)
    eager = (cfg.model.get("adapter") or "none") == "lora"
    return {
        kind: dict(
            lr=lrs[kind],
            weight_decay=float(a.weight_decay),
            total_steps=n,
            warmup=int(a.warmup_steps),
            min_ratio=float(a.min_lr_ratio),
            eps=float(a.adam_eps),
            eager_state=eager,
        )
        for kind, n in steps.items()
    }


def role_optimizers(policies: dict, settings: dict) -> dict:
    """Per role, one AdamW for action steps and one for bid steps (``settings``: :func:`optimizer_settings`).
    Their gradients differ by ~100x in scale (advantage / reward_scale vs a Bradley-Terry log-odds), so a shared
    Adam second moment would let each bid step mute the action steps that follow it. Module level: the learner
    actors (``cluster.learners=ray``) make theirs with it."""
    return {
        kind: {role: make_optimizer(p.parameters(), **kw) for role, p in policies.items()}
        for kind, kw in settings.items()
    }


def sft_units(
    policies: dict,
    *,
    demos: dict,
    seeds: dict,
    epochs: int,
    lr: float,
    lr_scale: float,
    batch_size: int,
    action_epochs,
    seed: int,
    progress: bool,
    after=lambda: None,
    micro_batch: int | None = None,
) -> list[tuple]:
    """The SFT cold start of ``policies`` (the run's roles in process, or a learner actor's: ``cluster.learners=ray``,
    cluster/learners.py: ``LearnerWorker.sft``): each config-built shared base on its roles' demos first
    (``model.adapter=lora``: ``sft_shared_base``), then each role on its own demos (``seeds[role]``; the learning rate
    times ``lr_scale``) and its greedy demo-action accuracy. ``after()`` is called after each unit (a learner splits
    its FLOPs there). ``[(kind "base" | "role", name, metrics, the unit's first role)]`` in that order."""
    first: dict[str, str] = {}
    for role, p in policies.items():
        shared = getattr(p, "shared_base", None)
        if shared is not None and shared.trains_base:
            first.setdefault(base_dir(shared.name), role)

    def run(policy, examples, rate, at, desc):
        return sft(
            policy,
            examples,
            epochs,
            rate,
            batch_size,
            at,
            desc=desc,
            progress=progress,
            action_epochs=action_epochs,
            micro_batch=micro_batch,
        )

    def base_sft(policy, examples):
        m = run(policy, examples, lr, seed + 997, "SFT base")
        after()
        return m

    units = [("base", b, m, first[b]) for b, m in sft_shared_base(policies, demos, base_sft, seed).items()]
    for role, policy in policies.items():
        m = run(policy, demos[role], lr * lr_scale, seeds[role], f"SFT {role}")
        if demos[role]:
            m["demo_action_accuracy"] = demo_accuracy(policy, demos[role])
        after()
        units.append(("role", role, m, role))
    return units


class MPTTrainer(LearnerActors, PhasedTrainer):
    """The MPT algorithm, registered as ``algo.name=mpt`` (phases: :class:`~.phases.PhasedTrainer`; its updates in
    process or on learner actors: :class:`~swarm_runtime.learn.learner_actors.LearnerActors`)."""

    label = "MPT"  #: row name of the trained checkpoint in the held-out table
    rl_name = "MPT"

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self._reference: dict | None = None  #: frozen RL-start models (:meth:`_reference_policies`)
        self.learner: LocalLearner | None = None  #: the trainable weights (:meth:`_rollouts`)
        self.sampler = None  #: who draws bids and actions (``rollout.engine``; :meth:`_rollouts`)
        #: the engine sampler's generator state of the checkpoint resumed from, put into the sampler when it is made
        self._sampler_rng_saved = None
        self._ahead: dict | None = None  #: update -> its rollout played ahead (``rollout.max_staleness``)
        self._ahead_envs: dict[int, list] = {}  #: update -> the envs of its rollout played ahead, until it is taken
        self._pool = None
        self._envs = None  #: (domain whose envs the episodes use, its cluster or None): :meth:`env_domain`
        self._group = None  #: ``cluster.learners=ray``: the learner actors (:meth:`_learners`)
        self._group_loaded = False  #: whether they hold the driver's weights and optimizer state of now
        self.learner_options: dict = {}  #: extra Ray options of the learner actors (placement)
        self.served = None  #: ``algo.served``: the served episodes actions also train on (learn/served.py)

    def env_domain(self):
        """The domain whose ``make_env`` rollouts, evaluations and branches use: the run's own
        (``cluster.kind=local``) or one making envs on Ray env workers (``cluster.kind=ray``, started on first
        use; :mod:`swarm_runtime.cluster`)."""
        if self._envs is None:
            from swarm_runtime.cluster import env_domain

            self._envs = env_domain(self.cfg, self.ctx.domain)
        return self._envs[0]

    def _rollouts(self):
        """The sampler of rollouts and evaluations, and each agent's model name; made on first use, after
        SFT (an engine sampler loads the trained base once). Each model's version is the update count."""
        if self.sampler is None:
            self.learner = LocalLearner(self.policies)
            self.learner.set_versions({m: int(self.state.get("iteration", 0)) for m in self.policies})
            self.sampler = make_sampler(
                self.cfg,
                self.learner,
                self.ctx.run_dir,
                options=node_resources(self.cfg, "sampler"),
                placed=self._sampler_placement,
            )
            restore_sampler_rng(self.sampler, self._sampler_rng_saved)  # the unkeyed rows' seeds go on as saved
            self._sampler_rng_saved = None
            if int(self.cfg.rollout.get("max_staleness", 0) or 0) > 0:  # rollouts played ahead on a thread
                self.sampler = LockedSampler(self.sampler)
        return self.sampler, model_names(self.agents)

    def _sampler_rng(self):
        """The engine sampler's generator state (a checkpoint's): its own once made, else the one resumed from."""
        return sampler_rng_state(self.sampler) if self.sampler is not None else self._sampler_rng_saved

    def _synced(self, it: int, m: dict) -> None:
        """After update ``it``: the roles it stepped get version ``it + 1``, and the sampler takes them."""
        changed = [r for r in self.policies if f"losses/action_{r}" in m or f"losses/bid_{r}" in m]
        if changed:
            self.learner.bump(changed, version=it + 1)
            self.sampler.sync(self.learner, changed)

    def _sampler_placement(self, name: str, roles: list[str], replica: int = 0) -> dict:
        """Ray options of the engine sampler actor of base ``name`` (``cluster.samplers=ray``, ``rollout.engine=vllm``;
        ``replica``: its index of ``cluster.sampler_replicas``): with ``cluster.placement``, that replica's bundle of
        the placement group of its roles; else none."""
        spec = getattr(self._envs[1], "placement", None) if self._envs is not None else None
        if spec is None:
            return node_resources(self.cfg, "sampler")
        from swarm_runtime.cluster.placement import actor_options

        group = next((g.name for g in spec.groups if set(roles) <= set(g.roles)), None)
        if group is None:
            raise RuntimeError(f"sampler of base {name!r}: no placement group holds its roles {roles}")
        return actor_options(spec, group, "sampler", replica)

    def _stopped(self, gone, kind=None):
        """The error that ends the run when a learner actor cannot be restarted: what was lost, where the run
        stopped, and how to go on from the last checkpoint."""
        at = ckpt.latest_checkpoint(self.ctx.run_dir)
        where = f"its last checkpoint is {at.name}" if at is not None else "it has no checkpoint"
        return (kind or type(gone))(
            f"{gone}; the run stopped at update {int(self.state.get('iteration', 0)) + 1} ({where}): go on with "
            f"swarm run run_dir={self.ctx.run_dir} resume=true{self._address_arg()}"
        )

    def _address_arg(self) -> str:
        """`` cluster.address=...`` when the run joined a named Ray head: a resume must give it again (a saved address
        is not followed: ``secrets.refuse_saved_ray_head``)."""
        c = self.cfg.get("cluster")
        address = c.get("address") if c is not None and c.get("kind") == "ray" else None
        return f" cluster.address={address}" if address else ""

    def _rewind(self, lost) -> None:
        """A learner actor died and Ray restarted it: rewind the whole run to its last checkpoint, through the
        resume path (metrics rows after it dropped, weights, optimizers, RNGs, counters restored), inside this
        ``swarm run``; the next update loads the checkpoint's state into every learner actor."""
        run_dir = self.ctx.run_dir
        at = ckpt.latest_checkpoint(run_dir)
        if at is None:
            raise RuntimeError(f"{lost}, and the run has no checkpoint to rewind to")
        logger.warning(
            "learner {} lost at update {} (pid {} died; Ray restarted it as pid {}): rewinding to checkpoint {}",
            lost.name,
            int(self.state.get("iteration", 0)) + 1,
            lost.pid,
            lost.new_pid,
            at.name,
        )
        self.writer.close()
        truncate_metrics(run_dir, ckpt.load_state(at))
        self._drop_ahead()
        if self.sampler is not None:
            self.sampler.close()
        self.sampler, self.learner = None, None
        self.ctx.resume_from = at
        self._setup()
        self._group_loaded = False
        if self.state["phase"] == "done" and self.state["iteration"] < int(self.cfg.algo.iterations):
            self.state["phase"] = "rl"  # a finished run being extended (PhasedTrainer.train)

    def train(self) -> dict:
        """:meth:`PhasedTrainer.train`; the env workers (``cluster.kind=ray``) are started first (a cluster that
        cannot be reached ends the run before SFT) and closed at the end, also when it raised."""
        from swarm_runtime.cluster.env_cluster import ActorGone
        from swarm_runtime.cluster.samplers import SamplerActorError

        self.env_domain()
        try:
            return super().train()
        except (ActorGone, SamplerActorError) as gone:  # an env worker or the sampler lost for good (its node, say)
            raise self._stopped(gone, ActorGone) from None
        finally:
            if self._group is not None:
                logger.info("learners closed: {}", self._group.close())
            if self._pool is not None:  # rollouts played ahead: stop, then close the envs of those never played
                for f in (self._ahead or {}).values():
                    f.cancel()
                self._pool.shutdown(wait=True)
                self._close_unplayed()
            cluster = self._envs[1]
            if cluster is not None and (
                getattr(self.sampler, "name", None) == "ray" or getattr(self.sampler, "on_ray", False)
            ):
                self.sampler.close()  # a sampler actor lives on the env workers' Ray: closed before it stops
            close_cluster(cluster)
            if self.sampler is not None:
                self.sampler.close()

    # ------------------------------------------------------------------ setup
    def _optimizers(self, policies: dict) -> dict:
        """Per role, one AdamW for action steps and one for bid steps (:func:`role_optimizers`)."""
        return role_optimizers(policies, optimizer_settings(self.cfg))

    def _optimizer_maker(self):
        """``make(policies)``: :meth:`_optimizers` as a module-level function, which learner actors make theirs with."""
        return partial(role_optimizers, settings=optimizer_settings(self.cfg))

    def _setup(self):
        ctx = self.ctx
        if ctx.resume_from is not None:
            self.state = ckpt.load_state(ctx.resume_from)
            with ckpt.loading_models(ctx.resume_from / "agents"):
                self.agents, self.policies = ctx.build_swarm(ctx.resume_from / "agents")
            self.optimizers = self._optimizers(self.policies)
            overridden: dict = {}
            for role, policy in self.policies.items():
                ts = ckpt.load_training_state(ctx.resume_from, role)
                policy.set_rng_state(ts["policy_rng"])
                restore_master_weights(policy.parameters(), ts.get("master_weights"))
                for kind, (opt, sched) in ((k, self.optimizers[k][role]) for k in self.optimizers):
                    if f"optimizer_{kind}" in ts:
                        changed = load_optimizer_state(opt, sched, ts[f"optimizer_{kind}"], ts[f"scheduler_{kind}"])
                        overridden.update({(kind, name): v for name, v in changed.items()})
            for (kind, name), (was, now) in sorted(overridden.items()):
                logger.warning(
                    "{} steps: {} {} from the config (the checkpoint's optimizer had {})", kind, name, now, was
                )
            ckpt.restore_rng(ctx.resume_from, self.rng)
            self._sampler_rng_saved = ckpt.sampler_rng(ctx.resume_from)
            ctx.flops.load_state_dict(self.state.get("flops", {}))
            logger.info("resumed at phase {} iteration {}", self.state["phase"], self.state["iteration"])
        else:
            self.agents, self.policies = ctx.build_swarm()
            self.optimizers = self._optimizers(self.policies)
        self.coordinator = ctx.coordinator()
        self.credit = ctx.credit_fn()
        self.served = load_pool(self.ctx, self.agents)
        self.writer = MetricsWriter(
            ctx.run_dir, bool(self.cfg.tensorboard), truncate_after=self.state["iteration"] if ctx.resume_from else None
        )
        sizes = {role: p.n_params for role, p in self.policies.items()}
        if len(set(sizes.values())) == 1:
            logger.info(
                "swarm: {} agents ({}), {:.2f}M parameters each",
                len(self.agents),
                ", ".join(a.name for a in self.agents),
                next(iter(sizes.values())) / 1e6,
            )
        else:  # roles on different bases (model.role_base)
            logger.info(
                "swarm: {} agents ({}); parameters: {}",
                len(self.agents),
                ", ".join(a.name for a in self.agents),
                ", ".join(f"{r} {n / 1e6:.2f}M" for r, n in sizes.items()),
            )

    def _reference_policies(self) -> dict:
        """The reference of ``algo.bid_reference=sft`` and ``algo.kl_coef``: a frozen copy of each
        role's model as RL started (``checkpoints/sft``, after a cold start or a transfer's seed
        checkpoint), loaded once (and again after a resume)."""
        if self._reference is None:
            src = self.ctx.run_dir / "checkpoints" / "sft" / "agents"
            if not src.is_dir():
                raise FileNotFoundError(
                    f"the reference policies (algo.bid_reference=sft / algo.kl_coef > 0) "
                    f"are the RL start checkpoint {src}, which is missing"
                )
            with torch.random.fork_rng(devices=[]):  # building must not move the run's random streams
                _, self._reference = self.ctx.build_swarm(src)
            for policy in self._reference.values():
                policy.eval()
                for p in policy.parameters():
                    p.requires_grad_(False)
            logger.info("reference policies: {}", src.parent)
        return self._reference

    def _minibatch(self) -> int:
        """Rows per forward/backward chunk: ``algo.minibatch``, capped by ``hardware.micro_batch``."""
        mb = self.cfg.hardware.get("micro_batch")
        return int(self.cfg.algo.minibatch) if mb is None else min(int(self.cfg.algo.minibatch), int(mb))

    def _turn_observer(self):
        """Forward each batched turn to ``swarm_on_turn`` (only when some plugin listens)."""
        if not self.ctx.pm.hook.swarm_on_turn.get_hookimpls():
            return None

        def on_turn(live, turns):
            self.ctx.pm.hook.swarm_on_turn(
                turn=live[0].t - 1, bids=[turns[id(s)].bids for s in live], winners=[turns[id(s)].winner for s in live]
            )

        return on_turn

    # ------------------------------------------------------------------ phases
    def cold_start(self) -> None:
        """SFT of every role (and of a config-built shared base) on the expert's demonstrations, in process or on
        the learner actors; each unit's metrics logged at step 0, then the ``sft`` checkpoint."""
        ctx, s = self.ctx, self.cfg.algo.sft
        ctx.flops.category = "sft"
        train_seeds = ctx.seeds("train")
        demo_seeds = self.rng.sample(train_seeds, min(int(s.demo_episodes), len(train_seeds)))
        demos = collect_demos(
            ctx.domain,
            ctx.task,
            demo_seeds,
            list(s.owner_bids),
            list(s.other_bids),
            rng=random.Random(int(self.cfg.seed)),
        )
        t0 = time.time()
        for kind, name, m, _, events in self._sft_units(demos):
            if events is not None:
                from swarm_runtime.cluster.learners import replay_flops

                replay_flops(ctx.flops, events)
            self._log_sft_unit(kind, name, m, demos)
        logger.info("SFT done in {:.0f}s", time.time() - t0)
        self.state["phase"] = "sft_done"
        self._save("sft")

    def _sft_units(self, demos: dict) -> list[tuple]:
        """:func:`sft_units` on ``demos`` (role -> examples): in process, or on the learner actors, started now
        (the driver takes their weights); each unit with the FLOP events it counted (None in process)."""
        s = self.cfg.algo.sft
        settings = dict(
            epochs=int(s.epochs),
            lr=float(s.lr),
            lr_scale=adapter_lr_scale(self.cfg),
            batch_size=int(s.batch_size),
            action_epochs=s.action_epochs,
            seed=int(self.cfg.seed),
            progress=bool(self.cfg.progress),
            micro_batch=self.cfg.hardware.get("micro_batch"),
        )
        seeds = {role: int(self.cfg.seed) + i for i, role in enumerate(self.policies)}
        if self._ray_learners():
            return self._sft_on_learners(
                sft_units,
                lambda roles: {
                    **settings,
                    "demos": {r: demos[r] for r in roles},
                    "seeds": {r: seeds[r] for r in roles},
                },
            )
        return [(*u, None) for u in sft_units(self.policies, demos=demos, seeds=seeds, **settings)]

    def _log_sft_unit(self, kind: str, name: str, m: dict, demos: dict) -> None:
        """One SFT unit's line and metrics: a shared base (``base``, ``base-NAME``) or a role (one the expert gave
        no demonstrations in ``demos`` starts untrained)."""
        if kind == "base":  # "base" (model.*), "base-NAME" (model.bases)
            if not m.get("steps"):
                logger.warning("SFT shared {}: the expert gave its roles no demonstrations; it starts untrained", name)
                return
            logger.info(
                "SFT shared {}: {} examples (its roles), loss {:.3f} -> {:.3f}",
                name,
                m["examples"],
                m["first_loss"],
                m["loss"],
            )
            self.writer.log(0, {f"sft/{k}_{name}": v for k, v in m.items()})
            return
        if not demos[name]:
            logger.warning("SFT {}: the expert gave this role no demonstrations; it starts untrained", name)
            return
        acc = m["demo_action_accuracy"]
        logger.info(
            "SFT {}: {} examples, loss {:.3f} -> {:.3f}, greedy demo-action accuracy {}",
            name,
            m["examples"],
            m["first_loss"],
            m["loss"],
            "n/a (no action demos)" if acc != acc else f"{acc:.0%}",
        )
        self.writer.log(0, {f"sft/{k}_{name}": v for k, v in m.items()})
        self._hook("swarm_on_train_step", step=0, kind="sft", metrics={"role": name, **m})

    def held_out(self, label: str) -> dict:
        ctx = self.ctx
        ctx.flops.category = "eval"
        t0 = time.time()
        sampler, models = self._rollouts()
        res, _ = evaluate(
            self.agents,
            self.coordinator,
            self.env_domain(),
            ctx.task,
            ctx.seeds("eval"),
            int(self.cfg.eval.runs),
            int(self.cfg.seed) + 7919,
            self.cfg.eval.temperature,
            common_random_numbers=bool(self.cfg.eval.common_random_numbers),
            sampler=sampler,
            models=models,
        )
        logger.info(
            "held-out {}: reward {:.2f} ± {:.2f} over {} seeds x {} runs ({:.0f}s)",
            label,
            res["reward_mean"],
            res["reward_se"],
            res["seeds"],
            res["runs"],
            time.time() - t0,
        )
        return res

    def _rollout(self, it: int, rng: random.Random):
        """Update ``it``'s rollout: its seeds (and noise ids) drawn from the run RNG now, played with ``rng``
        (the run RNG itself when on-policy; a stream of its own for a rollout played ahead)."""
        ctx, a = self.ctx, self.cfg.algo
        kind = step_kind(it, int(a.action_steps), int(a.bid_steps))
        seeds = [self.rng.choice(ctx.seeds("train")) for _ in range(int(a.envs_per_step))]
        domain = self.env_domain()
        slots = new_slots(domain, ctx.task, seeds)
        if a.common_random_numbers:
            for s in slots:
                s.episode.noise = self.rng.getrandbits(63)
        if rng is not self.rng:
            rng = random.Random(self.rng.getrandbits(64))
        sampler, models = self._rollouts()

        def run():
            t0 = time.time()
            with torch.no_grad():
                episodes = play(
                    slots,
                    self.agents,
                    self.coordinator,
                    domain,
                    int(ctx.task.max_decisions),
                    rng,
                    record_snapshots=(kind == "bid"),
                    on_turn=self._turn_observer(),
                    sampler=sampler,
                    models=models,
                )
            return episodes, time.time() - t0

        run.envs = [s.env for s in slots]  # made and reset now: closed by play, or (never played) by train's finally
        return run

    def _episodes(self, it: int):
        """Update ``it``'s episodes and rollout seconds. ``rollout.max_staleness=k`` > 0: the rollouts of the next
        ``k`` updates are played ahead on a worker thread (on the engine's weights of their time, at most ``k``
        updates old) while this update trains; 0: played now, on-policy."""
        k = int(self.cfg.rollout.get("max_staleness", 0) or 0) if self.cfg.get("rollout") is not None else 0
        if k == 0:
            return self._rollout(it, self.rng)()
        if self._ahead is None:
            from concurrent.futures import ThreadPoolExecutor

            self._ahead, self._pool = {}, ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout")
        iterations = int(self.cfg.algo.iterations)
        for j in range(it, min(it + k + 1, iterations)):
            if j not in self._ahead:
                run = self._rollout(j, None)
                self._ahead_envs[j] = run.envs
                self._ahead[j] = self._pool.submit(run)
        self._ahead_envs.pop(it, None)
        return self._ahead.pop(it).result()

    def _drop_ahead(self) -> None:
        """Drop the rollouts played ahead (``rollout.max_staleness``) before a rewind: the ones not started are
        cancelled, the one playing is waited for (it uses the sampler about to close; what it played or raised is
        dropped), their envs closed; the rewound run makes them again from the checkpoint's RNG."""
        if not self._ahead:
            return
        from concurrent.futures import wait

        for f in self._ahead.values():
            f.cancel()
        wait(list(self._ahead.values()))
        self._close_unplayed()
        self._ahead.clear()

    def _close_unplayed(self) -> None:
        """Close the envs of rollouts made ahead and never played (a run that ended or raised before their
        update: their futures cancelled). Played ones were closed by ``play``; closing again does nothing."""
        envs = [e for j in sorted(self._ahead_envs) for e in self._ahead_envs[j]]
        self._ahead_envs.clear()
        close_all(envs, quiet=True)

    def rl_step(self, it: int) -> dict:
        """RL update ``it``: its rollout (played now, or ahead), then an action step or a bid step
        (:func:`step_kind`); the roles it stepped go to the sampler. Its metrics row."""
        ctx, a = self.ctx, self.cfg.algo
        served_only = self.served is not None and bool(a.get("served_only"))
        kind = "action" if served_only else step_kind(it, int(a.action_steps), int(a.bid_steps))
        ctx.flops.category = "rollout"
        t_step = time.time()
        episodes, m = [], {}
        if served_only:  # no rollouts of its own (and so no bid steps: learn/served.py); the sampler still syncs
            self._rollouts()
        else:
            episodes, rollout_s = self._episodes(it)
            m = self._rollout_report(episodes, rollout_s)
        served = self.served.batch(it) if self.served is not None and kind == "action" else []
        m.update(served_metrics(served))
        t1 = time.time()
        m.update(self._action_step(episodes, served) if kind == "action" else self._bid_step(episodes))
        self._synced(it, m)
        m["time/update_s"] = time.time() - t1
        # the update's wall: waiting for its rollout (played ahead or now) and training
        m["time/step_s"] = time.time() - t_step
        m["charts/lr"] = self._last_lr(kind)
        m["kind"] = kind
        m.update({f"flops/{k}": v for k, v in ctx.flops.by_category.items()})
        m["flops/total"] = ctx.flops.training_total
        return m

    def _rollout_report(self, episodes, rollout_s: float) -> dict:
        """The rollout's episodes told to ``swarm_on_episode_end``, and its metrics (with how stale its
        weights were, under ``rollout.max_staleness``)."""
        for ep in episodes:
            self._hook(
                "swarm_on_episode_end", domain=self.ctx.domain.name, seed=ep.seed, reward=ep.reward, metrics=ep.metrics
            )
        m = rollout_metrics(episodes, self.agents)
        m["time/rollout_s"] = rollout_s
        if self.cfg.rollout.get("max_staleness"):
            lag = rollout_staleness(episodes, model_names(self.agents), self.learner)
            if lag is not None:
                m["charts/staleness"] = lag
        return m

    def _action_step(self, episodes, served=()) -> dict:
        """REINFORCE on the episodes' acted turns, each with its credit (docs/reference/method.md), and on the
        served episodes' (``algo.served``), importance-weighted against the versions that served them
        (``algo.is_cap``, else :data:`~swarm_runtime.learn.served.SERVED_IS_CAP`)."""
        ctx, a = self.ctx, self.cfg.algo
        scale = float(a.reward_scale or ctx.task.reward_max)
        ctx.flops.category = "update"
        samples, turns = credit_samples_and_turns([*episodes, *served], self.credit, self.rng)
        kl_coef = float(a.kl_coef)
        is_cap = a.get("is_cap")
        if is_cap is None and served:
            is_cap = SERVED_IS_CAP
        return self._update(
            "action",
            action_update,
            samples,
            lambda s: s[0],
            reward_scale=scale,
            minibatch=self._minibatch(),
            grad_clip=float(a.grad_clip),
            reference=kl_coef > 0,
            kl_coef=kl_coef,
            behaviour=[t.action_logprobs for t in turns],
            is_cap=None if is_cap is None else float(is_cap),
        )

    def _bid_step(self, episodes) -> dict:
        """Counterfactual branches of the episodes' contested turns, and Bradley-Terry on their bid pairs
        (docs/reference/method.md, section 4)."""
        ctx, a = self.ctx, self.cfg.algo
        ctx.flops.category = "branch"
        sampler, models = self._rollouts()
        picks = pick_contested(episodes, int(a.branches_per_episode), self.rng)
        with torch.no_grad():
            pairs = run_branches(
                self.agents,
                self.coordinator,
                self.env_domain(),
                ctx.task,
                picks,
                int(a.resample_tries),
                self.rng,
                samples=int(a.branch_samples),
                horizon=None if a.branch_horizon is None else int(a.branch_horizon),
                runner_up_pairs=str(a.bid_pairs) == "both",
                sampler=sampler,
                models=models,
            )
        ctx.flops.category = "update"
        m = {"charts/contested_picked": float(len(picks))}
        m.update(
            self._update(
                "bid",
                bid_update,
                pairs,
                lambda p: p.agent,
                minibatch=self._minibatch(),
                grad_clip=float(a.grad_clip),
                pair_weight=str(a.bid_pair_weight),
                reference=str(a.bid_reference) == "sft",
                beta=float(a.bid_beta),
                is_cap=None if a.get("is_cap") is None else float(a.is_cap),
            )
        )
        return m

    # ------------------------------------------------------------------ main
    def log_eval(self, step: int, res: dict) -> None:
        self.writer.log(
            step,
            {
                "eval/reward_mean": res["reward_mean"],
                "eval/reward_se": res["reward_se"],
                "flops/total": self.ctx.flops.training_total,
            },
        )

    def postfix(self, m: dict) -> dict:
        reward = m.get("charts/episode_reward", m.get("served/reward_mean", 0.0))  # algo.served_only: no rollouts
        return {"reward": f"{reward:.1f}", "kind": m["kind"]}

    def finish(self) -> dict:
        ctx = self.ctx
        rows = []
        if "sft_eval" in self.state:
            rows.append(("SFT only", self.state["sft_eval"]))
        if not self.final_is_sft:  # with no update made, the SFT row is the final checkpoint's
            rows.append((self.label, self.state["final_eval"]))
        metrics = (
            ["reward"]
            + [
                k[:-5]
                for k in self.state["final_eval"]
                if k.endswith("_mean")
                and k not in ("reward_mean", "decisions_mean")
                and k[:-5] in ("success", "spl", "ndtw")
            ]
            + list(self.state["final_eval"].get("domain_metrics", ()))
        )
        table = format_table(rows, metrics)
        if self.state["final_eval"].get("domain_report"):  # the domain's own report of the final checkpoint
            table += f"\n\n{self.label}:\n\n{self.state['final_eval']['domain_report']}"
        results = {
            "domain": ctx.cfg.domain,
            "task": ctx.cfg.task_name,
            "seed": int(ctx.cfg.seed),
            "eval_seeds": ctx.seeds("eval"),
            "runs": int(ctx.cfg.eval.runs),
            "flops": ctx.flops.state_dict(),
            "results": {n: r for n, r in rows},
            "table": table,
        }
        if "sft_eval" in self.state and self.trained:
            pd, pse, n = paired_difference(self.state["final_eval"], self.state["sft_eval"])
            if n:
                results["mpt_minus_sft"] = {"mean": pd, "se": pse, "seeds": n}
            pd, pse, n = paired_difference(self.state["final_eval"], self.state["sft_eval"], "seed_success")
            if n:
                results["mpt_minus_sft_success"] = {"mean": pd, "se": pse, "seeds": n}
        claim(ctx.run_dir / "eval.json").write_text(json.dumps(results, indent=1, default=float))
        claim(ctx.run_dir / "eval.md").write_text(table + "\n")
        plots = plot_training(ctx.run_dir, [a.name for a in self.agents])
        self.writer.close()
        self._hook("swarm_on_run_end", config=ctx.cfg, run_dir=str(ctx.run_dir), results=results)
        print(
            f"\nHeld-out evaluation: {ctx.cfg.domain}/{ctx.cfg.task_name}, {len(ctx.seeds('eval'))} seeds x "
            f"{ctx.cfg.eval.runs} runs (mean ± standard error over seeds)\n{table}"
        )
        if "sft_eval" in self.state and self.trained:
            d = self.state["final_eval"]["reward_mean"] - self.state["sft_eval"]["reward_mean"]
            se = (self.state["final_eval"]["reward_se"] ** 2 + self.state["sft_eval"]["reward_se"] ** 2) ** 0.5
            line = f"{self.label} - SFT: {d:+.2f} reward (combined standard error {se:.2f}"
            if "mpt_minus_sft" in results:
                pair = results["mpt_minus_sft"]
                line += f"; paired over the {pair['seeds']} held-out seeds: {pair['mean']:+.2f} ± {pair['se']:.2f}"
            line += ")"
            if "mpt_minus_sft_success" in results:
                pair = results["mpt_minus_sft_success"]
                line += f"; success {pair['mean']:+.3f} ± {pair['se']:.3f} paired"
            print(line)
        print("\n".join(self.summary_lines(plots)))
        return results
