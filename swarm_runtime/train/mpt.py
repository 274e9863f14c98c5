"""MPT training (docs/method.md, section 5): SFT cold start, then alternate ``action_steps``
REINFORCE updates with ``bid_steps`` counterfactual Bradley-Terry updates, with
held-out evaluation after SFT and after RL."""

from __future__ import annotations

import json
import random
import time
from collections import Counter

import torch
from loguru import logger

from swarm_runtime import checkpoint as ckpt
from swarm_runtime.cluster import close_cluster
from swarm_runtime.env import close_all
from swarm_runtime.episode import new_slots, play
from swarm_runtime.evaluate import evaluate, paired_difference
from swarm_runtime.outputs import MetricsWriter, format_table, plot_training
from swarm_runtime.policy.adapters import adapter_lr_scale, sft_shared_base
from swarm_runtime.rollout.factory import make_sampler
from swarm_runtime.rollout.local import LocalLearner, LockedSampler, model_names
from swarm_runtime.run import RunContext
from swarm_runtime.runfiles import claim
from swarm_runtime.train.action import action_update, credit_samples_and_turns
from swarm_runtime.train.bid import bid_update, pick_contested, run_branches
from swarm_runtime.train.optim import load_optimizer_state, make_optimizer, restore_master_weights
from swarm_runtime.train.phases import PhasedTrainer
from swarm_runtime.train.sft import collect_demos, demo_accuracy, sft


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
    for a in agents:
        m[f"charts/turn_share_{a.name}"] = wins[a.name] / total if total else 0.0
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


class MPTTrainer(PhasedTrainer):
    """The MPT algorithm, registered as ``algo.name=mpt`` (phases: :class:`~.phases.PhasedTrainer`)."""

    label = "MPT"  #: row name of the trained checkpoint in the held-out table
    rl_name = "MPT"

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self._reference: dict | None = None  #: frozen RL-start models (:meth:`_reference_policies`)
        self.learner: LocalLearner | None = None  #: the trainable weights (:meth:`_rollouts`)
        self.sampler = None  #: who draws bids and actions (``rollout.engine``; :meth:`_rollouts`)
        self._ahead: dict | None = None  #: update -> its rollout played ahead (``rollout.max_staleness``)
        self._ahead_envs: dict[int, list] = {}  #: update -> the envs of its rollout played ahead, until it is taken
        self._pool = None
        self._envs = None  #: (domain whose envs the episodes use, its cluster or None): :meth:`env_domain`

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
            self.sampler = make_sampler(self.cfg, self.learner, self.ctx.run_dir)
            if int(self.cfg.rollout.get("max_staleness", 0) or 0) > 0:  # rollouts played ahead on a thread
                self.sampler = LockedSampler(self.sampler)
        return self.sampler, model_names(self.agents)

    def _synced(self, it: int, m: dict) -> None:
        """After update ``it``: the roles it stepped get version ``it + 1``, and the sampler takes them."""
        changed = [r for r in self.policies if f"losses/action_{r}" in m or f"losses/bid_{r}" in m]
        if changed:
            self.learner.bump(changed, version=it + 1)
            self.sampler.sync(self.learner, changed)

    def train(self) -> dict:
        """:meth:`PhasedTrainer.train`; the env workers (``cluster.kind=ray``) are started first (a cluster that
        cannot be reached ends the run before SFT) and closed at the end, also when it raised."""
        self.env_domain()
        try:
            return super().train()
        finally:
            if self._pool is not None:  # rollouts played ahead: stop, then close the envs of those never played
                for f in (self._ahead or {}).values():
                    f.cancel()
                self._pool.shutdown(wait=True)
                self._close_unplayed()
            close_cluster(self._envs[1])
            if self.sampler is not None:
                self.sampler.close()

    # ------------------------------------------------------------------ setup
    def _optimizers(self, policies: dict) -> dict:
        """Per role, one AdamW for action steps and one for bid steps. Their gradients differ by
        ~100x in scale (advantage / reward_scale vs a Bradley-Terry log-odds), so a shared Adam
        second moment would let each bid step mute the action steps that follow it."""
        a = self.cfg.algo
        cycle = int(a.action_steps) + int(a.bid_steps)
        steps = {
            "action": int(a.iterations) * int(a.action_steps) // cycle + 1,
            "bid": int(a.iterations) * int(a.bid_steps) // cycle + 1,
        }
        scale = adapter_lr_scale(self.cfg)
        lrs = {"action": float(a.lr) * scale, "bid": float(a.bid_lr if a.get("bid_lr") is not None else a.lr) * scale}
        # adapters: every role's moments allocated now, together (same numbers; less heap growth: optim.init_adam_state)
        eager = (self.cfg.model.get("adapter") or "none") == "lora"
        return {
            kind: {
                role: make_optimizer(
                    p.parameters(),
                    lrs[kind],
                    float(a.weight_decay),
                    n,
                    int(a.warmup_steps),
                    float(a.min_lr_ratio),
                    float(a.adam_eps),
                    eager_state=eager,
                )
                for role, p in policies.items()
            }
            for kind, n in steps.items()
        }

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
            ctx.flops.load_state_dict(self.state.get("flops", {}))
            logger.info("resumed at phase {} iteration {}", self.state["phase"], self.state["iteration"])
        else:
            self.agents, self.policies = ctx.build_swarm()
            self.optimizers = self._optimizers(self.policies)
        self.coordinator = ctx.coordinator()
        self.credit = ctx.credit_fn()
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
        bases_m = sft_shared_base(  # model.adapter=lora on config-built bases: each learns its roles' demos first
            self.policies,
            demos,
            lambda policy, examples: sft(
                policy,
                examples,
                int(s.epochs),
                float(s.lr),
                int(s.batch_size),
                int(self.cfg.seed) + 997,
                desc="SFT base",
                progress=bool(self.cfg.progress),
                action_epochs=s.action_epochs,
            ),
            int(self.cfg.seed),
        )
        for base, base_m in bases_m.items():  # "base" (model.*), "base-NAME" (model.bases)
            logger.info(
                "SFT shared {}: {} examples (its roles), loss {:.3f} -> {:.3f}",
                base,
                base_m["examples"],
                base_m["first_loss"],
                base_m["loss"],
            )
            self.writer.log(0, {f"sft/{k}_{base}": v for k, v in base_m.items()})
        for i, (role, policy) in enumerate(self.policies.items()):
            m = sft(
                policy,
                demos[role],
                int(s.epochs),
                float(s.lr) * adapter_lr_scale(self.cfg),
                int(s.batch_size),
                int(self.cfg.seed) + i,
                desc=f"SFT {role}",
                progress=bool(self.cfg.progress),
                action_epochs=s.action_epochs,
            )
            if not demos[role]:
                logger.warning("SFT {}: the expert gave this role no demonstrations; it starts untrained", role)
                continue
            m["demo_action_accuracy"] = demo_accuracy(policy, demos[role])
            acc = m["demo_action_accuracy"]
            logger.info(
                "SFT {}: {} examples, loss {:.3f} -> {:.3f}, greedy demo-action accuracy {}",
                role,
                m["examples"],
                m["first_loss"],
                m["loss"],
                "n/a (no action demos)" if acc != acc else f"{acc:.0%}",
            )
            self.writer.log(0, {f"sft/{k}_{role}": v for k, v in m.items()})
            self._hook("swarm_on_train_step", step=0, kind="sft", metrics={"role": role, **m})
        logger.info("SFT done in {:.0f}s", time.time() - t0)
        self.state["phase"] = "sft_done"
        self._save("sft")

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

    def _close_unplayed(self) -> None:
        """Close the envs of rollouts made ahead and never played (a run that ended or raised before their
        update: their futures cancelled). Played ones were closed by ``play``; closing again does nothing."""
        envs = [e for j in sorted(self._ahead_envs) for e in self._ahead_envs[j]]
        self._ahead_envs.clear()
        close_all(envs, quiet=True)

    def rl_step(self, it: int) -> dict:
        ctx, a = self.ctx, self.cfg.algo
        kind = step_kind(it, int(a.action_steps), int(a.bid_steps))
        ctx.flops.category = "rollout"
        t_step = time.time()
        episodes, rollout_s = self._episodes(it)
        for ep in episodes:
            self._hook(
                "swarm_on_episode_end", domain=ctx.domain.name, seed=ep.seed, reward=ep.reward, metrics=ep.metrics
            )
        m = rollout_metrics(episodes, self.agents)
        m["time/rollout_s"] = rollout_s
        if self.cfg.rollout.get("max_staleness"):
            lag = rollout_staleness(episodes, model_names(self.agents), self.learner)
            if lag is not None:
                m["charts/staleness"] = lag
        t1 = time.time()
        scale = float(a.reward_scale or ctx.task.reward_max)
        if kind == "action":
            ctx.flops.category = "update"
            samples, turns = credit_samples_and_turns(episodes, self.credit, self.rng)
            kl_coef = float(a.kl_coef)
            is_cap = a.get("is_cap")
            m.update(
                action_update(
                    self.agents,
                    samples,
                    self.optimizers["action"],
                    scale,
                    self._minibatch(),
                    float(a.grad_clip),
                    self._reference_policies() if kl_coef > 0 else None,
                    kl_coef,
                    behaviour=[t.action_logprobs for t in turns],
                    is_cap=None if is_cap is None else float(is_cap),
                )
            )
        else:
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
            m["charts/contested_picked"] = float(len(picks))
            m.update(
                bid_update(
                    self.agents,
                    pairs,
                    self.optimizers["bid"],
                    self._minibatch(),
                    float(a.grad_clip),
                    str(a.bid_pair_weight),
                    self._reference_policies() if str(a.bid_reference) == "sft" else None,
                    float(a.bid_beta),
                    is_cap=None if a.get("is_cap") is None else float(a.is_cap),
                )
            )
        self._synced(it, m)
        m["time/update_s"] = time.time() - t1
        m["time/step_s"] = (
            time.time() - t_step
        )  # the update's wall: waiting for its rollout (played ahead or now) and training
        m["charts/lr"] = next(iter(self.optimizers[kind].values()))[1].get_last_lr()[0]
        m["kind"] = kind
        m.update({f"flops/{k}": v for k, v in ctx.flops.by_category.items()})
        m["flops/total"] = ctx.flops.training_total
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
        return {"reward": f"{m['charts/episode_reward']:.1f}", "kind": m["kind"]}

    def finish(self) -> dict:
        ctx = self.ctx
        rows = []
        if "sft_eval" in self.state:
            rows.append(("SFT only", self.state["sft_eval"]))
        if not self.final_is_sft:  # with no update made, the SFT row is the final checkpoint's
            rows.append((self.label, self.state["final_eval"]))
        metrics = ["reward"] + [
            k[:-5]
            for k in self.state["final_eval"]
            if k.endswith("_mean")
            and k not in ("reward_mean", "decisions_mean")
            and k[:-5] in ("success", "spl", "ndtw")
        ]
        table = format_table(rows, metrics)
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
