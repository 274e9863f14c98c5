"""``swarm experiment NAME [key=value ...]``: pick the run folder (or the one to resume), run the
registered experiment and write ``results.md`` / ``results.json`` (plots are the experiment's)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from loguru import logger
from omegaconf import OmegaConf

from swarm_runtime.config.errors import ConfigError, Stopped
from swarm_runtime.config.load import parse_overrides, resolve
from swarm_runtime.config.secrets import refuse_saved_choices
from swarm_runtime.experiments.context import ExperimentContext, Report, _atomic_json
from swarm_runtime.experiments.parallel import run_seeds_apart
from swarm_runtime.experiments.replicate import combine
from swarm_runtime.experiments.report import markdown_table
from swarm_runtime.runs.context import check_hardware, check_task
from swarm_runtime.runs.folder import config_key, refuse_resume_conflicts, refuse_saved_ray_heads, resume_conflicts
from swarm_runtime.runs.provenance import NOT_A_CHECKOUT, commit_text, versions, versions_line

_RUN_KEYS = ("run_dir", "resume")


def _split_run_args(args: list[str]) -> tuple[list[str], str | None, bool]:
    """Separate ``run_dir=`` / ``resume=`` (they pick the folder) from the experiment's arguments;
    ``base=DIR`` is short for ``experiment.base=DIR``."""
    _, dotted = parse_overrides(args)  # validates key=value shape
    run_dir, resume, rest = None, False, []
    for a in args:
        k, _, v = a.partition("=")
        if k == "run_dir":
            run_dir = v or None
        elif k == "resume":
            resume = v.strip().lower() in ("true", "1", "yes")
        elif k == "base":  # shorthand of experiment.base
            rest.append(f"experiment.base={v}")
        else:
            rest.append(a)
    return rest, run_dir, resume


def _find_run_dir(name: str, args: list[str], registry, run_dir: str | None, resume: bool) -> tuple[Path, list[str]]:
    if run_dir and resume:
        path = Path(run_dir)
        saved = path / "experiment.json"
        if not saved.exists():
            raise ConfigError(f"resume=true but {str(path)!r} is not an experiment folder (no experiment.json)")
        return path, _saved_args(saved, name)
    if run_dir:
        saved = Path(run_dir) / "experiment.json"
        changed = _argument_changes(_saved_args(saved, name), args, registry) if saved.exists() else []
        if changed:
            raise ConfigError(
                f"{run_dir!r} already holds this experiment run with other arguments ("
                + "; ".join(changed)
                + "); continue it with resume=true or pick another run_dir"
            )
        return Path(run_dir), args
    cfg = resolve(args, registry)
    prefix = f"experiment-{name}-{cfg.domain}-{cfg.task_name}-"
    if resume:
        found = sorted(
            (p for p in Path("runs").glob(prefix + "*") if (p / "experiment.json").exists()),
            key=lambda p: p.stat().st_mtime,
        )
        if not found:
            raise ConfigError(f"resume=true but no folder runs/{prefix}* exists; give run_dir=...")
        return found[-1], _saved_args(found[-1] / "experiment.json", name)
    return Path("runs") / (prefix + time.strftime("%Y%m%d-%H%M%S")), args


def _argument_changes(saved: list[str], given: list[str], registry) -> list[str]:
    """Where the ``given`` arguments would run another experiment than the ``saved`` ones, each as
    ``key: saved V, given W``. Values are compared resolved (:func:`~swarm_runtime.runs.folder.resume_conflicts`)
    both ways, so ``x=1`` and ``x=1.0`` of a float key, ``[ 0 ]`` and ``[0]``, ``max_decisions=12`` and
    ``task.max_decisions=12`` or another order are the same run; a saved argument left off counts when
    the value without it differs (``key: saved V, not given, so W``). Secrets (never saved)
    are not compared."""
    now = resolve(given, registry)

    def key(arg: str) -> str:
        return config_key(now, arg.partition("=")[0])

    out = [f"{k}: saved {was}, given {v}" for k, was, v in resume_conflicts(resolve(saved, registry), given)]
    typed = {key(a) for a in given}
    rest = [a for a in saved if key(a) not in typed]
    return out + [f"{k}: saved {was}, not given, so {v}" for k, v, was in resume_conflicts(now, rest)]


def _saved_args(path: Path, name: str) -> list[str]:
    saved = json.loads(path.read_text())
    if saved.get("experiment") != name:
        raise ConfigError(f"{str(path.parent)!r} holds experiment {saved.get('experiment')!r}, not {name!r}")
    from swarm_runtime.config.secrets import REDACTED, is_secret_key

    # a secret was saved as <redacted>: drop it, so the environment variable (or the value given again) applies
    return [a for a in saved["args"] if not (is_secret_key(a.partition("=")[0]) and a.partition("=")[2] == REDACTED)]


def resume_applies(run_dir: Path, saved_args: list[str], given: list[str], registry) -> list[str]:
    """What a resume's command line adds to the saved arguments: the machine (``hardware=``,
    ``hardware.*``), the display and secrets (saved redacted, so given again). Any other setting that
    would change the saved run is refused (:func:`~swarm_runtime.runs.folder.refuse_resume_conflicts`, as for
    ``swarm run resume=true``): resuming reruns the saved arguments."""
    applied = refuse_resume_conflicts(resolve(saved_args, registry), given, run_dir / "experiment.json")
    return [f"{k}={v}" for k, v in applied]


def run_experiment(name: str, args: list[str], pm, registry) -> Path:
    """Run experiment ``name``; returns its folder. A killed run continues with ``resume=true``
    (``run_dir=...`` or the newest matching folder), skipping the cells it finished, with the
    arguments it was started with (a setting that would change them is refused: :func:`resume_applies`)."""
    from swarm_runtime.runs.provenance import pin

    pin()  # the code's commit as it is now, not when the results are written
    if name not in registry.experiments:
        raise ConfigError(f"unknown experiment {name!r}; valid: {', '.join(sorted(registry.experiments))}")
    args, run_dir_arg, resume = _split_run_args(list(args))
    given = list(args)
    run_dir, args = _find_run_dir(name, args, registry, run_dir_arg, resume)
    if resume:  # the saved arguments, on the machine the command line names (hardware=cpu, ...)
        args = args + [a for a in resume_applies(run_dir, args, given, registry) if a not in args]
    cfg = resolve(args, registry)
    if resume:  # a Ray head the saved arguments name is joined only when the command line gives it again
        given_keys = [config_key(cfg, a.partition("=")[0]) for a in given if "=" in a]
        refuse_saved_ray_heads(cfg, given_keys, run_dir / "experiment.json")
        refuse_saved_choices(cfg, given_keys, run_dir / "experiment.json")  # a program, server flags, a server
    cfg.experiment.name, cfg.run_dir, cfg.resume = name, str(run_dir), bool(resume)
    check_hardware(cfg)
    check_task(registry.domains[cfg.domain], cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    from swarm_runtime.config.secrets import redact_args, save_config
    from swarm_runtime.runs.runlock import RunLock

    lock = RunLock(run_dir, "experiment").acquire()
    try:
        command = "swarm experiment " + " ".join(shlex.quote(a) for a in [name, *redact_args(args)])
        if not (run_dir / "experiment.json").exists():
            _atomic_json(
                run_dir / "experiment.json", {"experiment": name, "args": redact_args(args), "command": command}
            )
            save_config(cfg, run_dir / "config.yaml")
        logger.remove()
        logger.add(
            sys.stderr,
            level=cfg.log_level,
            format="<green>{time:HH:mm:ss}</green> <level>{level: <7}</level> {message}",
        )
        logger.add(run_dir / "run.log", level="DEBUG")
        logger.info("experiment {} in {}{}", name, run_dir, " (resuming)" if resume else "")
        x = ExperimentContext(name, cfg, pm, registry, run_dir, args)
        t0 = time.time()
        seeds = train_seeds(cfg)
        if seeds is None:
            report: Report = registry.experiments[name](x)
            if x.bar is not None:
                x.bar.close()
        else:
            report = _replicated(x, seeds)
        write_results(x, report, command, time.time() - t0)
    except Stopped as exc:  # SIGTERM: the resume line names this folder
        exc.run_dir = run_dir
        raise
    finally:
        lock.release()
    return run_dir


def train_seeds(cfg) -> list[int] | None:
    """``experiment.train_seeds`` as ints, or ``None`` (the run's seed alone, the folder itself)."""
    seeds = cfg.experiment.train_seeds
    return None if seeds is None else [int(s) for s in seeds]


def bases_per_seed(base, seeds: list[int]) -> list[str | None]:
    """``experiment.base`` spread over the training seeds: none, one folder per seed (a list of the
    same length), or a single folder when there is one seed; anything else is refused."""
    if base is None or base == "":
        return [None] * len(seeds)
    bases = [str(b) for b in base] if not isinstance(base, str) and hasattr(base, "__len__") else [str(base)]
    if len(bases) != len(seeds):
        raise ConfigError(
            f"experiment.base gives {len(bases)} run folder(s) but experiment.train_seeds has "
            f"{len(seeds)} seed(s) {seeds}: give one trained swarm per training seed "
            f"(base=[DIR_seed{seeds[0]},...], in the order of train_seeds) or experiment.train_seeds=[S] "
            "with the seed that base was trained with"
        )
    return bases


def _replicated(x: ExperimentContext, seeds: list[int]) -> Report:
    """Run the experiment once per training seed (run seed = training seed) in ``seed-<s>/`` and combine."""
    bases = bases_per_seed(x.cfg.experiment.base, seeds)
    for s, b in zip(seeds, bases):  # a base trained with another seed would mislabel the table: refuse early
        if b is not None and (Path(b) / "config.yaml").exists():
            trained = int(OmegaConf.load(Path(b) / "config.yaml").get("seed", 0))
            if trained != s:
                raise ConfigError(
                    f"experiment.base {b!r} was trained with seed {trained}, but it stands for "
                    f"training seed {s} in experiment.train_seeds={seeds}; reorder the lists"
                )
    if int(x.xcfg.parallel) > 1 and len(seeds) > 1:  # each seed in a process of its own; the pass below combines
        run_seeds_apart(x, seeds, bases)
    reports: dict[int, Report] = {}
    for s, b in zip(seeds, bases):
        args = x.args + [f"seed={s}"] + ([f"experiment.base={b}"] if b is not None else [])
        cfg = resolve(args, x.registry)
        sub = x.run_dir / f"seed-{s}"
        cfg.experiment.name, cfg.run_dir, cfg.resume = x.name, str(sub), bool(x.cfg.resume)
        sub.mkdir(parents=True, exist_ok=True)
        logger.info("experiment {}: training seed {} ({} of {}) in {}", x.name, s, len(reports) + 1, len(seeds), sub)
        xs = ExperimentContext(x.name, cfg, x.pm, x.registry, sub, args)
        reports[s] = x.registry.experiments[x.name](xs)
        if xs.bar is not None:
            xs.bar.close()
        x.cells_done += xs.cells_done
        x._memo.update({f"seed-{s}/{k}": v for k, v in xs._memo.items()})
    return combine(reports, x.run_dir)


def write_results(x: ExperimentContext, report: Report, command: str, wall_s: float) -> None:
    cells_wall = sum(float(c.get("wall_s", 0.0)) for c in x._memo.values())
    resumed = bool(x.cfg.resume)
    seeds = x.eval_seeds()
    runs = int(report.data.get("runs_per_seed", x.cfg.eval.runs))
    table = markdown_table(report.rows)
    tseeds = report.data.get("train_seeds")
    who = f"training seeds {tseeds}" if tseeds else f"run seed {x.cfg.seed}"
    over = "mean over training seeds ± SE over training seeds; per seed: " if tseeds and len(tseeds) > 1 else ""
    head = (
        f"# {report.title}\n\n{x.cfg.domain}/{x.cfg.task_name}; held-out ({x.cfg.eval.split} split): {len(seeds)} "
        f"seeds x {runs} runs ({over}mean ± standard error over held-out seeds), seeds {seeds[0]}..{seeds[-1]}; "
        f"{who}.\n\n"
        f"Command: `{command}` ({commit_text()})\n\n{versions_line()}.\n\nWall time: {cells_wall:.0f} s summed over the {x.cells_done} cells as each "
        f"was computed (this invocation: {wall_s:.0f} s{'; cells finished by an earlier invocation were loaded' if resumed else ''}).\n"
    )
    parts = [head, table]
    for title, text in report.tables.items():
        parts += [f"\n## {title}\n", text]
    if report.notes:
        parts.append("\n" + "\n".join(f"- {n}" for n in report.notes))
    for p in report.plots:
        parts.append(f"\n![{p.stem}]({_rel(p, x.run_dir)})")
    (x.run_dir / "results.md").write_text("\n".join(parts) + "\n")
    _atomic_json(
        x.run_dir / "results.json",
        {
            "experiment": x.name,
            "domain": x.cfg.domain,
            "task": x.cfg.task_name,
            "seed": int(x.cfg.seed),
            "eval_seeds": seeds,
            "runs": runs,
            "command": command,
            "commit": _commit(),
            "wall_s": wall_s,
            "cells_wall_s": cells_wall,
            "rows": report.rows,
            "tables": report.tables,
            "plots": [_rel(p, x.run_dir) for p in report.plots],
            "eval_split": str(x.cfg.eval.split),
            "notes": report.notes,
            "versions": versions(),
            **report.data,
        },
    )
    print(
        f"\n{report.title}: {x.cfg.domain}/{x.cfg.task_name}, {len(seeds)} held-out seeds x {runs} runs "
        f"({over}mean ± standard error over held-out seeds), {who}\n{table}"
    )
    for title, text in report.tables.items():
        print(f"\n{title}\n{text}")
    print(f"\n{versions_line()}")
    print(
        f"\nExperiment folder: {x.run_dir} (results.md, results.json, "
        f"{', '.join(_rel(p, x.run_dir) for p in report.plots) or 'no plots'}, "
        f"{'seed-<s>/' if tseeds else 'cells/, trainings/'})"
    )


def _commit() -> str:
    """``git rev-parse --short HEAD`` of the code that ran (``+dirty`` with uncommitted changes to tracked
    files; ``SWARM_COMMIT`` or ``not a git checkout`` outside a git checkout of this package)."""
    return versions()["commit"] or NOT_A_CHECKOUT


def _rel(path: Path, root: Path) -> str:
    """``path`` relative to the experiment folder (plots of a training seed live in ``seed-<s>/``)."""
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return Path(path).name
