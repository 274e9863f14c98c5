"""``algo=rlcr``: SFT cold start from the domain's scripted collective, then REINFORCE on the collective
reward with group baselines, under a growing wall-clock limit; held-out evaluation of the collective
and of a solo agent with the same policy and ``T_max`` (docs/guides/rlcr.md)."""

from __future__ import annotations

import json
import time

import torch
from loguru import logger
from omegaconf import OmegaConf

from swarm_runtime.cluster import close_cluster
from swarm_runtime.evaluation.heldout import paired_difference
from swarm_runtime.learn.optim import load_optimizer_state, make_optimizer
from swarm_runtime.learn.phases import PhasedTrainer
from swarm_runtime.learn.rlcr.clock import t_max_at
from swarm_runtime.learn.rlcr.learn import collective_returns, flat_samples, group_advantages, reinforce_step
from swarm_runtime.learn.rlcr.loop import (
    RLCR_WORDS,
    LoopOptions,
    expert_decider,
    play_concurrent,
    policy_decider,
    turn_report,
)
from swarm_runtime.learn.rlcr.signs import (
    plot_latency,
    plot_signs,
    rollout_metrics,
    summarize_rollouts,
    team_bucket,
    useful_work_relative,
)
from swarm_runtime.learn.sft import Example, sft
from swarm_runtime.runs import checkpoint as ckpt
from swarm_runtime.runs.context import RunContext
from swarm_runtime.runs.outputs import MetricsWriter, format_table, read_metrics
from swarm_runtime.runs.runfiles import claim

#: Name (and checkpoint folder) of the one policy every agent of the collective runs.
SHARED = "Shared"
#: Every word RLCR adds to the domain's vocabulary (commands, prompt template, agent names).
#: Columns of the held-out table.
EVAL_METRICS = ["reward", "success", "minutes", "useful_work", "message_tokens"]


def make_shared_policy(ctx: RunContext, init_path=None):
    """The collective's one policy, built by the run's policy backend with the domain's vocabulary plus
    :data:`RLCR_WORDS` (so messages, hires and agent names are single tokens)."""
    factory = ctx.registry.get("policy_backends", ctx.cfg.model.backend)
    model_cfg = OmegaConf.merge(ctx.cfg.model, {"device": ctx.cfg.hardware.device})
    words = list(ctx.domain.all_words(ctx.task)) + list(RLCR_WORDS)
    return factory(
        model_cfg,
        words,
        [float(b) for b in ctx.cfg.algo.bid_levels],
        int(ctx.cfg.seed) * 100,
        flops=ctx.flops,
        init_path=str(init_path) if init_path else None,
    )


def loop_options(
    cfg, t_max: float, agents: int | None = None, org: str | None = None, token_budget: int | None = None
) -> LoopOptions:
    r = cfg.rlcr
    return LoopOptions(
        t_max=float(t_max),
        seconds_per_token=float(r.seconds_per_token),
        org=org or str(r.org),
        agents=int(agents if agents is not None else r.agents),
        max_hires=int(r.max_hires),
        max_turns_per_agent=int(r.max_turns_per_agent),
        token_budget=token_budget,
        window=int(r.window),
        tick=float(r.tick),
    )


def team_label(opts: LoopOptions) -> str:
    return "CEO + hires" if opts.org == "ceo" else ("solo" if opts.agents == 1 else f"flat team of {opts.agents}")


def demo_examples(ctx: RunContext, policy, seeds: list[int]) -> tuple[list[Example], dict]:
    """Rollouts of the scripted collective (no time limit) on ``seeds``; flat teams cycle through the
    sizes 1..``rlcr.expert_team`` so the policy also sees small teams (the solo baseline)."""
    cfg, r = ctx.cfg, ctx.cfg.rlcr
    examples: list[Example] = []
    rollouts = []
    sizes = list(range(1, int(r.expert_team) + 1)) if r.org == "flat" else [int(r.expert_team)]
    for size in sizes:
        part = seeds[sizes.index(size) :: len(sizes)]
        if not part:
            continue
        opts = loop_options(cfg, float("inf"), agents=size)
        rollouts += play_concurrent(ctx.domain, ctx.task, part, expert_decider(policy, int(r.expert_team)), opts)
    for ro in rollouts:
        examples += [Example("act", t.prompt, t.text) for t in ro.turns]
    stats = {
        "demo_rollouts": len(rollouts),
        "demo_turns": len(examples),
        "demo_return": sum(ro.progress for ro in rollouts) / max(1, len(rollouts)),
    }
    return examples, stats


def evaluate_collective(
    ctx: RunContext, policy, opts: LoopOptions, seeds, runs: int, seed: int, domain=None
) -> tuple[dict, list]:
    """Every seed, ``runs`` runs, one batch, summarised (:func:`~.signs.summarize_rollouts`); the policy's
    sampling state and temperature are restored afterwards (evaluation never perturbs training). ``domain``:
    whose ``concurrent_env`` makes the envs (default ``ctx.domain``; env workers: ``cluster.env_domain``)."""
    saved = (policy.rng_state(), policy.temperature)
    ctx.flops.category = "eval"
    try:
        policy.gen.manual_seed(int(seed))
        if ctx.cfg.eval.temperature is not None:
            policy.temperature = float(ctx.cfg.eval.temperature)
        with torch.no_grad():
            rollouts = play_concurrent(
                domain or ctx.domain, ctx.task, [s for _ in range(runs) for s in seeds], policy_decider(policy), opts
            )
    finally:
        policy.set_rng_state(saved[0])
        policy.temperature = saved[1]
    return summarize_rollouts(rollouts, runs), rollouts


def evaluate_checkpoint(ctx: RunContext, ckpt_dir, domain=None) -> tuple[dict, str]:
    """``swarm eval`` of an ``algo=rlcr`` run: the checkpoint's shared policy as the configured collective
    and (``rlcr.solo_eval``) solo, at the final ``T_max``, on the held-out seeds, the envs made by ``domain``
    (default ``ctx.domain``). Returns the results and the markdown table."""
    cfg = ctx.cfg
    policy = make_shared_policy(ctx, ckpt_dir / "agents" / SHARED)
    runs = int(cfg.eval.runs if cfg.rlcr.eval_runs is None else cfg.rlcr.eval_runs)
    conds = {"collective": loop_options(cfg, float(cfg.rlcr.t_max.end))}
    if cfg.rlcr.solo_eval:
        conds["solo"] = loop_options(cfg, float(cfg.rlcr.t_max.end), agents=1, org="flat")
    res = {
        name: evaluate_collective(ctx, policy, opts, ctx.seeds("eval"), runs, int(cfg.seed) + 7919 + i, domain)[0]
        for i, (name, opts) in enumerate(conds.items())
    }
    rows = [(f"{ckpt_dir.name}: {team_label(conds[n]) if n == 'collective' else 'solo'}", r) for n, r in res.items()]
    return res, format_table(rows, EVAL_METRICS)


class RLCRTrainer(PhasedTrainer):
    """Collective-reward RL, registered as ``algo.name=rlcr`` (preset ``algo=rlcr``); the phases (SFT,
    held-out evaluation, updates, checkpoints, resume) are :class:`~swarm_runtime.learn.phases.PhasedTrainer`'s."""

    label = "RLCR"
    rl_name = "RLCR"
    evaluate_checkpoint = staticmethod(
        evaluate_checkpoint
    )  #: ``swarm eval`` of its checkpoints (cli/main.py asks for it)
    eval_measure = "return at T_max"  #: what that evaluation's table shows

    _envs = None  #: (domain whose concurrent envs rollouts and evaluations use, its cluster or None)

    def env_domain(self):
        """The domain whose ``concurrent_env`` the rollouts and held-out evaluations use: the run's own
        (``cluster.kind=local``) or one making them on Ray env workers (``cluster.kind=ray``; the scripted
        demos of the cold start stay in process, as MPT's do)."""
        if self._envs is None:
            from swarm_runtime.cluster import env_domain

            self._envs = env_domain(self.cfg, self.ctx.domain)
        return self._envs[0]

    def train(self) -> dict:
        """:meth:`PhasedTrainer.train`, with the env workers (``cluster.kind=ray``) started first and closed at
        the end, also when it raised."""
        self.env_domain()
        try:
            return super().train()
        finally:
            close_cluster(self._envs[1])

    # ------------------------------------------------------------------ setup
    def _setup(self) -> None:
        ctx, a = self.ctx, self.cfg.algo
        init = ctx.resume_from / "agents" / SHARED if ctx.resume_from is not None else None
        self.policy = make_shared_policy(ctx, init)
        self.policies = {SHARED: self.policy}  #: what checkpoints hold
        opt = make_optimizer(
            self.policy.parameters(),
            float(a.lr),
            float(a.weight_decay),
            int(a.iterations) + 1,
            int(a.warmup_steps),
            float(a.min_lr_ratio),
            float(a.adam_eps),
        )
        self.optimizers = {"action": {SHARED: opt}}
        if ctx.resume_from is not None:
            self.state = ckpt.load_state(ctx.resume_from)
            ts = ckpt.load_training_state(ctx.resume_from, SHARED)
            self.policy.set_rng_state(ts["policy_rng"])
            if "optimizer_action" in ts:
                load_optimizer_state(opt[0], opt[1], ts["optimizer_action"], ts["scheduler_action"])
            ckpt.restore_rng(ctx.resume_from, self.rng)
            ctx.flops.load_state_dict(self.state.get("flops", {}))
            logger.info("resumed at phase {} iteration {}", self.state["phase"], self.state["iteration"])
        self.writer = MetricsWriter(
            ctx.run_dir, bool(self.cfg.tensorboard), truncate_after=self.state["iteration"] if ctx.resume_from else None
        )
        r = self.cfg.rlcr
        logger.info(
            "RLCR: one shared policy ({:.2f}M parameters), org {} ({}), T_max {:.0f}s -> {:.0f}s over {} "
            "updates, {} instances x G={} rollouts per update",
            self.policy.n_params / 1e6,
            r.org,
            f"{r.agents} agents" if r.org == "flat" else f"up to {r.max_hires} hires",
            float(r.t_max.start),
            float(r.t_max.end),
            int(r.t_max.steps),
            int(r.instances),
            int(r.group_size),
        )

    def _round_observer(self):
        """Forward each round of a training rollout to ``swarm_on_turn`` (:func:`~.loop.turn_report`: one
        entry per decision), only when some plugin listens, as ``MPTTrainer`` does for its turns."""
        hook = self.ctx.pm.hook.swarm_on_turn
        if not hook.get_hookimpls():
            return None

        def on_round(n: int, requests) -> None:
            bids, winners = turn_report(requests)
            hook(turn=n, bids=bids, winners=winners)

        return on_round

    def t_max(self, step: int) -> float:
        t = self.cfg.rlcr.t_max
        return t_max_at(step, float(t.start), float(t.end), int(t.steps))

    # ------------------------------------------------------------------ phases
    def cold_start(self) -> None:
        ctx, s = self.ctx, self.cfg.algo.sft
        ctx.flops.category = "sft"
        train_seeds = ctx.seeds("train")
        seeds = self.rng.sample(train_seeds, min(int(s.demo_episodes), len(train_seeds)))
        t0 = time.time()
        examples, stats = demo_examples(ctx, self.policy, seeds)
        m = sft(
            self.policy,
            examples,
            int(s.epochs),
            float(s.lr),
            int(s.batch_size),
            int(self.cfg.seed),
            desc="SFT shared policy",
            progress=bool(self.cfg.progress),
            action_epochs=s.action_epochs,
            micro_batch=self.cfg.hardware.get("micro_batch"),
        )
        m.update(stats)
        logger.info(
            "SFT: {} demo turns from {} scripted-collective rollouts (mean return {:.1f}), loss {:.3f} -> "
            "{:.3f} ({:.0f}s)",
            stats["demo_turns"],
            stats["demo_rollouts"],
            stats["demo_return"],
            m.get("first_loss", float("nan")),
            m["loss"],
            time.time() - t0,
        )
        self.writer.log(0, {f"sft/{k}": v for k, v in m.items()})
        self._hook("swarm_on_train_step", step=0, kind="sft", metrics=m)
        self.state["phase"] = "sft_done"
        self._save("sft")

    def play(self, seeds, opts: LoopOptions, groups=None):
        """The rollouts of one update (observers see each round through ``swarm_on_turn``)."""
        with torch.no_grad():
            return play_concurrent(
                self.env_domain(),
                self.ctx.task,
                seeds,
                policy_decider(self.policy),
                opts,
                groups,
                on_round=self._round_observer(),
            )

    def evaluate(self, opts: LoopOptions, seed_offset: int = 0) -> tuple[dict, list]:
        return evaluate_collective(
            self.ctx,
            self.policy,
            opts,
            self.ctx.seeds("eval"),
            self.eval_runs,
            int(self.cfg.seed) + 7919 + seed_offset,
            self.env_domain(),
        )

    @property
    def eval_runs(self) -> int:
        r = self.cfg.rlcr.eval_runs
        return int(self.cfg.eval.runs if r is None else r)

    def held_out(self, label: str) -> dict:
        """The collective and (``rlcr.solo_eval``) a solo agent, both at the final ``T_max``."""
        self.ctx.flops.category = "eval"
        t_max = float(self.cfg.rlcr.t_max.end)
        out = {}
        conds = [loop_options(self.cfg, t_max)]
        if self.cfg.rlcr.solo_eval and not (self.cfg.rlcr.org == "flat" and int(self.cfg.rlcr.agents) == 1):
            conds.append(loop_options(self.cfg, t_max, agents=1, org="flat"))
        for i, opts in enumerate(conds):
            t0 = time.time()
            res, _ = self.evaluate(opts, i)
            name = "collective" if i == 0 else "solo"
            out[name] = res
            logger.info(
                "held-out {} {} ({}): return at T_max {:.1f} ± {:.1f}, success {:.2f}, {:.1f} simulated min ({:.0f}s)",
                label,
                name,
                team_label(opts),
                res["reward_mean"],
                res["reward_se"],
                res["success_mean"],
                res["minutes_mean"],
                time.time() - t0,
            )
        return out

    def rl_step(self, it: int) -> dict:
        ctx, a, r = self.ctx, self.cfg.algo, self.cfg.rlcr
        t_max = self.t_max(it)
        instances = [self.rng.choice(ctx.seeds("train")) for _ in range(int(r.instances))]
        seeds = [s for s in instances for _ in range(int(r.group_size))]
        groups = [i for i in range(len(instances)) for _ in range(int(r.group_size))]
        ctx.flops.category = "rollout"
        t0 = time.time()
        rollouts = self.play(seeds, loop_options(self.cfg, t_max), groups)
        for ro in rollouts:
            self._hook(
                "swarm_on_episode_end", domain=ctx.domain.name, seed=ro.seed, reward=ro.progress, metrics=ro.metrics
            )
        returns = collective_returns(rollouts, float(r.latency_penalty), float(ctx.task.reward_max))
        for ro, ret in zip(rollouts, returns):
            ro.ret = ret
        m = rollout_metrics(rollouts)
        m["time/rollout_s"] = time.time() - t0
        m["charts/t_max"] = t_max
        # Signs of life: useful work against the env's mean rollout over the whole run so far.
        hist = self.state.setdefault("useful_work_history", [0.0, 0])
        hist[0] += sum(ro.env_tokens for ro in rollouts)
        hist[1] += len(rollouts)
        for b, v in useful_work_relative(rollouts, hist[0] / hist[1]).items():
            m[f"signs/useful_work_rel_team_{b}"] = v
        t1 = time.time()
        ctx.flops.category = "update"
        adv = group_advantages(returns, groups, bool(r.normalize_std))
        samples = flat_samples(rollouts, adv)
        scale = float(a.reward_scale or ctx.task.reward_max) if not r.normalize_std else 1.0
        opt, sched = self.optimizers["action"][SHARED]
        m.update(reinforce_step(self.policy, samples, opt, sched, scale, int(a.minibatch), float(a.grad_clip)))
        m["charts/advantage_abs"] = sum(abs(x) for x in adv) / max(1, len(adv))
        m["time/update_s"] = time.time() - t1
        m["charts/lr"] = sched.get_last_lr()[0]
        m["kind"] = "action"
        m.update({f"flops/{k}": v for k, v in ctx.flops.by_category.items()})
        m["flops/total"] = ctx.flops.training_total
        return m

    def postfix(self, m: dict) -> dict:
        return {"ret": f"{m['charts/return']:.1f}", "t_max": f"{m['charts/t_max'] / 60:.0f}m"}

    # ------------------------------------------------------------------ results
    def finish(self) -> dict:
        """The held-out results: ``eval.json`` and ``eval.md`` (the SFT and final rows, collective and solo, and
        their paired differences), the plots, and the table printed."""
        ctx, cfg = self.ctx, self.cfg
        team = team_label(loop_options(cfg, 0.0))
        rows, curves = self._eval_rows(team)
        table = format_table(rows, EVAL_METRICS)
        results = self._results(rows, table, team)
        claim(ctx.run_dir / "eval.json").write_text(json.dumps(results, indent=1, default=float))
        claim(ctx.run_dir / "eval.md").write_text(table + "\n")
        plots = [
            p
            for p in (
                plot_signs(ctx.run_dir, read_metrics(ctx.run_dir)),
                plot_latency(
                    ctx.run_dir / "performance_latency.png",
                    curves,
                    f"{cfg.domain}/{cfg.task_name}: anytime return, T_max {float(cfg.rlcr.t_max.end) / 60:.0f} min",
                ),
            )
            if p is not None
        ]
        self.writer.close()
        self._hook("swarm_on_run_end", config=cfg, run_dir=str(ctx.run_dir), results=results)
        self._print_results(results, table, team)
        print("\n".join(self.summary_lines(plots)))
        return results

    def _eval_rows(self, team: str) -> tuple[list, dict]:
        """The table's rows (``SFT: TEAM``, ``SFT: solo``, then the final checkpoint's, unless no update was made),
        and each row's anytime-return curve."""
        rows, curves = [], {}
        phases = [("sft_eval", "SFT"), ("final_eval", self.label)]
        if self.final_is_sft:  # no update made: the SFT rows are the final checkpoint's
            phases.pop()
        for phase, label in phases:
            for name, res in (self.state.get(phase) or {}).items():
                row = f"{label}: {team if name == 'collective' else 'solo'}"
                rows.append((row, res))
                curves[row] = [tuple(p) for p in res["curve"]]
        return rows, curves

    def _results(self, rows: list, table: str, team: str) -> dict:
        """``eval.json``: the run, its rows, and the paired differences collective - solo and RLCR - SFT."""
        ctx, cfg = self.ctx, self.cfg
        final = self.state["final_eval"]
        results = {
            "domain": cfg.domain,
            "task": cfg.task_name,
            "seed": int(cfg.seed),
            "algo": "rlcr",
            "org": cfg.rlcr.org,
            "team": team,
            "t_max": float(cfg.rlcr.t_max.end),
            "eval_seeds": ctx.seeds("eval"),
            "runs": self.eval_runs,
            "flops": ctx.flops.state_dict(),
            "results": {n: r for n, r in rows},
            "table": table,
        }
        if "solo" in final:
            d, se, n = paired_difference(final["collective"], final["solo"])
            results["collective_minus_solo"] = {"mean": d, "se": se, "seeds": n}
        if self.state.get("sft_eval") and self.trained:
            d, se, n = paired_difference(final["collective"], self.state["sft_eval"]["collective"])
            results["rlcr_minus_sft"] = {"mean": d, "se": se, "seeds": n}
        return results

    def _print_results(self, results: dict, table: str, team: str) -> None:
        cfg, seeds = self.cfg, len(self.ctx.seeds("eval"))
        print(
            f"\nHeld-out evaluation: {cfg.domain}/{cfg.task_name} under algo=rlcr, {seeds} seeds x "
            f"{self.eval_runs} runs, return = progress at T_max = {float(cfg.rlcr.t_max.end) / 60:.0f} simulated "
            f"minutes (mean ± standard error over seeds)\n{table}"
        )
        if "collective_minus_solo" in results:
            c = results["collective_minus_solo"]
            print(
                f"{'SFT' if self.final_is_sft else self.label} {team} - solo (same policy, same T_max): "
                f"{c['mean']:+.2f} ± {c['se']:.2f} return, paired over the {c['seeds']} held-out seeds"
            )
        if "rlcr_minus_sft" in results:
            c = results["rlcr_minus_sft"]
            print(
                f"{self.label} - SFT, {team}: {c['mean']:+.2f} ± {c['se']:.2f} return, paired over the {c['seeds']} "
                "held-out seeds"
            )


__all__ = ["RLCRTrainer", "SHARED", "RLCR_WORDS", "make_shared_policy", "loop_options", "team_bucket"]
