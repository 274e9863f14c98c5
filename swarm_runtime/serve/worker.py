"""An agent worker: one role's checkpoint behind the vLLM OpenAI-compatible completions subset.

    python -m swarm_runtime.serve.worker --model RUN/checkpoints/final/agents/Smith --port 8101

Endpoints: ``GET /health`` (with the batching counts), ``GET /v1/models``, ``POST /v1/completions``
(``prompt`` (texts or token ids), ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``n``, ``logprobs``,
``stop``, ``echo``, ``stream`` (server-sent events), ``guided_choice`` or its newer name
``structured_outputs.choice``), ``POST /v1/chat/completions`` (over the model's chat template; 400
without one); with ``--lora-modules`` / ``--enable-lora``, one base with several LoRA adapters and
vLLM's ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (:mod:`swarm_runtime.serve.adapters`), and
requests naming the base (the adapters off). vLLM's token-level fields (``return_token_ids``,
``return_tokens_as_token_ids``, ``logprob_token_ids``, ``allowed_token_ids``, ``logit_bias``,
``stop_token_ids``) are answered as vLLM answers them, raw log-probs included
(:mod:`swarm_runtime.serve.vllm_fields`), so ``rollout.engine=openai`` can sample on a worker.
Bodies are read with finite numbers only; errors are OpenAI's ``{"error": {...}}``; a prompt longer
than the model's context is a 400. ``logprobs=k`` on generated text returns each token's
log-probability and the top ``k`` in the OpenAI shape (:mod:`swarm_runtime.serve.logprobs`); ``n``
samples per prompt are keyed ``protocol.sample_keys(seed, n)`` (at most ``protocol.MAX_N``).
A request whose ``guided_choice`` is the
model's bid-level texts is a bid (``model.bid_mode=logits``: one forward pass, sampled over the bid
levels, with their log-probs when ``logprobs`` is set); ``"swarm_kind": "bid"`` asks for a generated
bid (``generate`` mode). Any other request is an action: sampled among ``guided_choice`` when given
(constrained decoding over their token prefix tree), else free text (never a bid token). With a
``seed`` the draw is the keyed draw of :mod:`swarm_runtime.serve.protocol`, identical to the one
``swarm eval`` makes in process. Requests that arrive while the model is busy are batched (one forward
pass or generation per kind of request), as the in-process loop batches a turn's rows; a keyed row's
draw does not depend on its batch.

The completions are :mod:`swarm_runtime.serve.completer` (checked, planned, run in batches by
:mod:`swarm_runtime.serve.batcher`), the app :mod:`swarm_runtime.serve.worker_app`; this module is the
command line and the model's loading.

Fault injection, for tests and the chaos benchmark only: ``--fault-act-error-after N`` answers every
action after the first N with HTTP 500 (0: every action); ``--fault-bid LEVEL`` bids LEVEL without the model; ``--fault-delay-ms MS`` stalls
every answer.
"""

import argparse
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from swarm_runtime.serve.batcher import Batcher
from swarm_runtime.serve.completer import (
    BASE,
    Completer,
    FaultInjected,
    Job,
    choice_field,
    finish_choice,
    top_p_pick,
)
from swarm_runtime.serve.worker_app import make_app

__all__ = [
    "BASE",
    "DEFAULT_BID_LEVELS",
    "Batcher",
    "Completer",
    "FaultInjected",
    "Job",
    "WorkerOptions",
    "choice_field",
    "finish_choice",
    "load_policy",
    "main",
    "make_app",
    "parse_args",
    "top_p_pick",
]

#: Bid levels of a checkpoint that does not say (an external Hugging Face model).
DEFAULT_BID_LEVELS = (0.0, 0.2, 0.4, 0.6, 0.8)


@dataclass
class WorkerOptions:
    """What ``python -m swarm_runtime.serve.worker`` takes."""

    model: str  #: a role's checkpoint folder (``RUN/checkpoints/TAG/agents/ROLE``)
    name: str = ""  #: the agent's name (``/v1/models`` lists the model as this id; default: the folder name)
    host: str = "127.0.0.1"
    port: int = 8100
    max_prompt_tokens: int = 256  #: prompts are cut from the left beyond this (the run's model.max_prompt_tokens)
    device: str = "cpu"
    threads: int = 1  #: torch CPU threads
    seed: int = 0  #: the sampling generator of requests without a ``seed``
    parent_pid: int = 0  #: exit when this process is gone (a worker the gateway started)
    lora_modules: list = (
        None  #: ``NAME=PATH`` adapters to load onto the base ``model`` (:mod:`~swarm_runtime.serve.adapters`)
    )
    enable_lora: bool = False  #: serve the base with adapters loaded at runtime (``/v1/load_lora_adapter``)
    fault_act_error_after: int = -1  #: -1 = never
    fault_bid: float | None = None
    fault_delay_ms: int = 0


def load_policy(opts: WorkerOptions):
    """The role's :class:`~swarm_runtime.models.transformers_backend.TransformersPolicy`, with the bid
    levels and bid mode its checkpoint was trained with; with ``lora_modules`` or ``enable_lora``, an
    :class:`~swarm_runtime.serve.adapters.AdapterHost` (the base and its adapters)."""
    import torch

    from swarm_runtime.models.transformers_backend import TransformersPolicy, load_pretrained

    path = Path(opts.model)
    if opts.lora_modules or opts.enable_lora:
        from swarm_runtime.serve.adapters import AdapterHost, parse_modules

        modules = parse_modules(opts.lora_modules)
        first = Path(modules[0][1]) / "swarm_policy.json" if modules else path / "swarm_policy.json"
        meta = json.loads(first.read_text()) if first.exists() else {}
        torch.manual_seed(opts.seed)
        host = AdapterHost(
            path,
            dict(
                bid_levels=[float(b) for b in meta.get("bid_levels", DEFAULT_BID_LEVELS)],
                bid_mode=meta.get("bid_mode", "logits"),
                max_prompt_tokens=opts.max_prompt_tokens,
                seed=opts.seed,
                device=opts.device,
                chat_template=meta.get("chat_template", "none"),
            ),
        )
        for name, folder in modules:
            host.load(name, folder)
        return host
    meta = json.loads((path / "swarm_policy.json").read_text()) if (path / "swarm_policy.json").exists() else {}
    levels = [float(b) for b in meta.get("bid_levels", DEFAULT_BID_LEVELS)]
    model, tok = load_pretrained(path, levels)
    torch.manual_seed(opts.seed)
    policy = TransformersPolicy(
        model,
        tok,
        levels,
        bid_mode=meta.get("bid_mode", "logits"),
        chat_template=meta.get("chat_template", "none"),  # as the run trained it
        max_prompt_tokens=opts.max_prompt_tokens,
        seed=opts.seed,
        device=opts.device,
    )
    return policy.eval()


def _watch_parent(pid: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except OSError:
            os._exit(0)


def parse_args(argv=None) -> WorkerOptions:
    ap = argparse.ArgumentParser(prog="python -m swarm_runtime.serve.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a role's checkpoint folder")
    ap.add_argument("--name", default="")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parent-pid", type=int, default=0)
    ap.add_argument(
        "--lora-modules",
        nargs="*",
        default=None,
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT folders) to serve on the base --model, each under its NAME",
    )
    ap.add_argument(
        "--enable-lora", action="store_true", help="serve adapters loaded at runtime (/v1/load_lora_adapter)"
    )
    ap.add_argument("--fault-act-error-after", type=int, default=-1)
    ap.add_argument("--fault-bid", type=float, default=None)
    ap.add_argument("--fault-delay-ms", type=int, default=0)
    a = ap.parse_args(argv)
    return WorkerOptions(**{k: v for k, v in vars(a).items()})


def main(argv=None) -> int:
    import sys

    opts = parse_args(argv)
    if opts.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"worker: error: --host {opts.host!r}: a worker binds to loopback only; put the gateway in front",
            file=sys.stderr,
        )
        return 2
    if not (Path(opts.model) / "config.json").exists():
        print(
            f"worker: error: --model {opts.model!r} is not a Hugging Face checkpoint folder (no config.json)",
            file=sys.stderr,
        )
        return 2
    import torch
    import uvicorn

    torch.set_num_threads(max(1, opts.threads))
    if opts.parent_pid:
        threading.Thread(target=_watch_parent, args=(opts.parent_pid,), daemon=True).start()
    app = make_app(load_policy(opts), opts)
    # keep-alive well beyond the gateway's pauses between turns, so it rarely meets a connection closing under it
    uvicorn.run(app, host=opts.host, port=opts.port, log_level="warning", access_log=False, timeout_keep_alive=300)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
