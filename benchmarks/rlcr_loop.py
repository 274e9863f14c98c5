"""RLCR loop throughput: agent-actions per second of the concurrent loop (4 and 8 agents per rollout)
against the turn-based loop (``episode.play``) on the same model: the cheapest turn-based loop (one model
acting every turn, no auction) and today's MPT loop (an auction among the same team, then the winner acts).

Both loops get the same number of actors at once (``--actors``): the turn-based loop plays that many
envs, the concurrent loop ``actors / agents`` rollouts of ``agents`` agents each. The model is the RLCR
shared policy after a brief SFT on the scripted collective (so it emits real instructions whose
durations spread the agents over the clock); the turn-based loop uses it on the domain's single-model
prompt. Prints each loop's actions per second, the mean batch per model call, and the ratio
turn-based / concurrent per action (target <= 1.5). For each concurrent run it also prints where the
time goes and why the batches are what they are:

- the share of the wall time spent inside the model calls (the rest is the loop's Python: clocks,
  envs, prompts, messages) and the mean prompt length in tokens (what the prefill costs per row);
- the **depth bound**: at exact event times (``rlcr.tick=0``) an agent deciding at second t2 sees in
  its prompt (``team : ...``) the actions its teammates chose at earlier seconds t1 < t2, so its
  prompt cannot exist before the call that decided them returns; a rollout therefore needs at least
  as many model calls as it has distinct decision times, and a batch of rollouts at least the most
  any of them has. The loop already gathers every rollout's next decision time into each call, so
  its call count equals this bound when nothing else limits it.

It also times **today's MPT loop** (``--mpt``, on by default) at each team size: ``agents`` agents (the
domain's roles in turn, replicas as in population scaling) all serving from the same shared model, every
turn a sealed-bid auction (every agent bids, one batch; identical bid prompts scored once) and then the
winner acts (one batch), on the concurrent run's envs (same envs and team) and on ``--actors`` envs (as
many agents acting at once as the concurrent run). The bid-free loop above is the cheapest turn-based
loop there is (one model, no auction); the MPT loop is what a turn-based swarm of that size costs today.

``--rollouts N``: also run the concurrent loop with N rollouts in flight per team size (the training
batch is ``rlcr.instances x rlcr.group_size`` = 16 rollouts), labelled as such: that is the
loop at its training batch, not the equal-actors comparison the target is about.

    python benchmarks/rlcr_loop.py [--actors 32] [--decisions 60] [--threads 2] [--rollouts 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import time

import torch
from loguru import logger

from swarm_runtime.config.load import resolve
from swarm_runtime.core.episode import Agent
from swarm_runtime.core.loop import new_slots
from swarm_runtime.learn.rlcr.loop import play_concurrent, policy_decider
from swarm_runtime.learn.rlcr.trainer import demo_examples, loop_options, make_shared_policy
from swarm_runtime.learn.sft import sft
from swarm_runtime.plugins.manager import get_registry
from swarm_runtime.runs.context import RunContext
from swarm_runtime.sampling.play import play


class CountingDecider:
    """The shared policy's decider, counting calls, rows, prompt tokens and the time inside the model."""

    def __init__(self, policy, clock=time.perf_counter):
        self.policy, self.inner, self.clock = policy, policy_decider(policy), clock
        self.calls, self.rows, self.prompt_tokens, self.padded, self.model_s = 0, 0, 0, 0, 0.0

    def __call__(self, requests):
        self.calls += 1
        self.rows += len(requests)
        t0 = self.clock()
        out = self.inner(requests)
        self.model_s += self.clock() - t0
        lens = [len(self.policy.encode_prompt(r.prompt)) for r in requests]  # cached: no cost
        self.prompt_tokens += sum(lens)
        self.padded += len(lens) * max(lens)  # what the prefill runs: every row left-padded to the longest
        return out


def repeat_share(rollouts) -> float:
    """How often an agent's action is the same text as its previous one: how often the obvious guess
    of a speculative batch (decide a later agent now, assuming each teammate repeats itself, and
    redo it if not) would hold."""
    same = total = 0
    for r in rollouts:
        last: dict[str, str] = {}
        for t in r.turns:
            if t.agent in last:
                same += t.text == last[t.agent]
                total += 1
            last[t.agent] = t.text
    return same / max(1, total)


def depth_bound(rollouts) -> int:
    """The fewest model calls exact event times allow: the most distinct decision times of a rollout."""
    return max(len({t.t for t in r.turns}) for r in rollouts)


# Long on purpose: a measurement script's one procedure, its phases in the order the module docstring lists them,
# each printing as it goes (split a phase out when another script needs it).
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--actors", type=int, default=32, help="agents acting at once in each loop")
    ap.add_argument("--decisions", type=int, default=60, help="actions per actor (turn-based: decision cap)")
    ap.add_argument("--agents", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--demo-episodes", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--ticks", type=float, nargs="+", default=[0.0, 10.0], help="rlcr.tick values to measure")
    ap.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: this process's CPU seconds (time.process_time; robust to other jobs on a shared "
        "machine, and the same as wall time on an idle one with --threads 1); wall: elapsed seconds",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="time each loop this many times (interleaved) and keep its fastest run: on a shared, "
        "loaded machine the fastest is the least disturbed",
    )
    ap.add_argument(
        "--mpt",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time today's MPT loop (auction + winner acts) at each team size on the same envs",
    )
    ap.add_argument(
        "--rollouts",
        type=int,
        default=0,
        help="also run the exact loop with this many rollouts in flight per team size (0 = no)",
    )
    args = ap.parse_args()
    logger.remove()
    if args.threads:
        torch.set_num_threads(args.threads)
    pm, reg = get_registry()
    cfg = resolve(["domain=minecraft", "task=iron_pickaxe", "algo=rlcr", "progress=false"], reg)
    ctx = RunContext(cfg, pm, reg, None)
    policy = make_shared_policy(ctx)
    examples, _ = demo_examples(ctx, policy, list(range(args.demo_episodes)))
    sft(policy, examples, 2, 2e-3, 64, 0, progress=False)
    seeds = list(range(1000, 1000 + max(args.actors, args.rollouts)))

    agent = Agent("Shared", "Shared", policy, prompt_kind="single")
    coordinator = reg.get("coordinators", "round_robin")(cfg)
    auction = reg.get("coordinators", "auction")(cfg)
    runs = [(tick, k, max(1, args.actors // k)) for tick in args.ticks for k in args.agents]
    runs += [(0.0, k, args.rollouts) for k in args.agents if args.rollouts]
    mpt_runs = [("mpt", k, e) for k in args.agents for e in (max(1, args.actors // k), args.actors)] if args.mpt else []
    clock, unit = (time.process_time, "CPU s") if args.clock == "cpu" else (time.perf_counter, "s")

    def turn_based():
        calls = {"n": 0, "rows": 0, "tokens": 0, "padded": 0, "s": 0.0}
        act = policy.act

        def counted_act(prompts, *a, **kw):
            calls["n"] += 1
            calls["rows"] += len(prompts)
            t = clock()
            out = act(prompts, *a, **kw)
            calls["s"] += clock() - t
            lens = [len(policy.encode_prompt(p)) for p in prompts]
            calls["tokens"] += sum(lens)
            calls["padded"] += len(lens) * max(lens)
            return out

        policy.act = counted_act
        policy.gen.manual_seed(0)
        t0 = clock()
        eps = play(
            new_slots(ctx.domain, cfg.task, seeds[: args.actors]),
            [agent],
            coordinator,
            ctx.domain,
            args.decisions,
            random.Random(0),
        )
        dt = clock() - t0
        del policy.act
        n = sum(len(e.turns) for e in eps)
        return (
            dt,
            (
                f"turn-based loop: {args.actors} envs x 1 model acting every turn, {n} actions in {{dt:.1f}} {unit} = "
                f"{{rate:.1f}} actions/{unit} (mean batch per model call {calls['rows'] / calls['n']:.1f} over "
                f"{calls['n']} calls; {100 * calls['s'] / dt:.0f}% of the time in model calls, "
                f"{1000 * calls['s'] / calls['n']:.1f} ms per call; mean prompt "
                f"{calls['tokens'] / calls['rows']:.1f} tokens)"
            ),
            n,
            (calls["n"], calls["padded"]),
        )

    def mpt_loop(k, envs):
        """Today's MPT loop at the concurrent run's team and envs: ``k`` agents (the domain's roles in turn,
        replicas as in population scaling) all serving from the one shared model, every turn a sealed-bid
        auction (every present agent bids, one batch) and the winner acts (one batch)."""
        roles = [r.name for r in ctx.domain.roles]
        team = [
            Agent(
                roles[i % len(roles)] + (f"#{i // len(roles) + 1}" if k > len(roles) else ""),
                roles[i % len(roles)],
                policy,
            )
            for i in range(k)
        ]
        calls = {"n": 0, "s": 0.0, "bid": 0, "act": 0}
        originals = {m: getattr(policy, m) for m in ("act", "bid")}

        def counted(name):
            def call(prompts, *a, **kw):
                calls["n"] += 1
                calls[name] += 1
                t = clock()
                out = originals[name](prompts, *a, **kw)
                calls["s"] += clock() - t
                return out

            return call

        for m in originals:
            setattr(policy, m, counted(m))
        policy.gen.manual_seed(0)
        t0 = clock()
        eps = play(
            new_slots(ctx.domain, cfg.task, seeds[:envs]),
            team,
            auction,
            ctx.domain,
            args.decisions * args.actors // envs,
            random.Random(0),
        )
        dt = clock() - t0
        for m in originals:
            delattr(policy, m)
        n = sum(1 for e in eps for t in e.turns if t.auction.winner is not None)
        return (
            dt,
            (
                f"MPT turn-based loop, {k} agents: {envs} envs x {k} agents on the one model, every turn an "
                f"auction then the winner acts, {n} actions in {{dt:.1f}} {unit} = {{rate:.1f}} actions/{unit} "
                f"({calls['bid']} bid calls + {calls['act']} action calls; {100 * calls['s'] / dt:.0f}% of the "
                f"time in model calls)"
            ),
            n,
            (calls["n"], 0),
        )

    def concurrent(tick, k, envs):
        opts = loop_options(cfg, float("inf"), agents=k)
        opts = type(opts)(**{**opts.__dict__, "max_turns_per_agent": args.decisions, "tick": tick})
        dec = CountingDecider(policy, clock)
        policy.gen.manual_seed(0)
        t0 = clock()
        rs = play_concurrent(ctx.domain, cfg.task, seeds[:envs], dec, opts)
        dt = clock() - t0
        n = sum(len(r.turns) for r in rs)
        bound = (
            (
                f", depth bound {depth_bound(rs)} calls; an agent repeats its previous action in "
                f"{100 * repeat_share(rs):.0f}% of its turns"
            )
            if tick == 0
            else ""
        )
        return (
            dt,
            (
                f"concurrent loop, {k} agents, tick {tick:g}s: {envs} rollouts x {k} agents, {n} actions in "
                f"{{dt:.1f}} {unit} = {{rate:.1f}} actions/{unit} (mean batch per model call {dec.rows / dec.calls:.1f} over "
                f"{dec.calls} calls{bound}; {100 * dec.model_s / dt:.0f}% of the time in model calls, "
                f"{1000 * dec.model_s / dec.calls:.1f} ms per call; mean prompt "
                f"{dec.prompt_tokens / dec.rows:.1f} tokens; mean simulated minutes "
                f"{sum(r.duration for r in rs) / len(rs) / 60:.1f})"
            ),
            n,
            (dec.calls, dec.padded),
        )

    best: dict = {}  # key -> (fastest seconds, its line, actions, (model calls, padded prompt tokens))
    with torch.no_grad():
        for _ in range(max(1, args.repeats)):
            for key in ["turn", *mpt_runs, *runs]:
                res = (
                    turn_based() if key == "turn" else mpt_loop(key[1], key[2]) if key[0] == "mpt" else concurrent(*key)
                )
                if key not in best or res[0] < best[key][0]:
                    best[key] = res
    rates = {}
    for key, (dt, line, n, _) in best.items():
        rates[key] = n / dt
        print(line.format(dt=dt, rate=rates[key]))
    print(
        f"(times are {'this process' + chr(39) + 's CPU seconds' if args.clock == 'cpu' else 'wall-clock seconds'}"
        + (
            f"; each loop timed {args.repeats} times, interleaved, the fastest run of each shown)"
            if args.repeats > 1
            else ")"
        )
    )
    print(
        "(each ratio below: the concurrent loop's time per action over the turn-based loop's; the target is <= 1.5x, "
        "below 1x the concurrent loop is the faster)"
    )
    for tick, k, envs in runs[: len(args.ticks) * len(args.agents)]:
        print(
            f"per action, turn-based / concurrent with {k} agents, tick {tick:g}s: "
            f"{rates['turn'] / rates[(tick, k, envs)]:.2f}x (target <= 1.5x)"
        )
    for _, k, envs in mpt_runs:
        conc = (0.0, k, max(1, args.actors // k))
        same = "same envs and team" if envs == conc[2] else f"{envs} agents acting at once in both"
        print(
            f"per action, MPT turn-based ({k} agents, {envs} envs) / concurrent with {k} agents, tick 0s "
            f"({same}): {rates[('mpt', k, envs)] / rates[conc]:.2f}x (target <= 1.5x)"
        )
    # Where a ratio comes from: the prefill's work per action (prompt tokens the model runs, rows padded to
    # the longest of their call) and the model calls per action (each call pays the decode steps' fixed cost).
    (_, _, n_turn, (c_turn, p_turn)) = best["turn"]
    for tick, k, envs in runs[: len(args.ticks) * len(args.agents)]:
        _, _, n_c, (c_c, p_c) = best[(tick, k, envs)]
        print(
            f"  where it comes from, {k} agents, tick {tick:g}s: prefill tokens per action {p_c / n_c:.1f} vs "
            f"{p_turn / n_turn:.1f} ({(p_c / n_c) / (p_turn / n_turn):.2f}x), model calls per action "
            f"{c_c / n_c:.3f} vs {c_turn / n_turn:.3f} ({(c_c / n_c) / (c_turn / n_turn):.1f}x)"
        )
    for tick, k, envs in runs[len(args.ticks) * len(args.agents) :]:
        print(
            f"per action, turn-based ({args.actors} envs) / concurrent with {k} agents, tick 0s, "
            f"{envs} rollouts in flight (the training batch, not equal actors): "
            f"{rates['turn'] / rates[(tick, k, envs)]:.2f}x"
        )
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"model {policy.n_params / 1e6:.2f}M params, torch threads {torch.get_num_threads()}, commit {rev}")


if __name__ == "__main__":
    main()
