"""A run's folder and how a run starts in it: picking the folder (:class:`RunFolder`: fresh, ``overwrite=true`` or
``resume=true``), what a resume's command line may change (:func:`resume_overrides`) and what it may not
(:func:`refuse_resume_conflicts`), the endpoints and Ray heads a saved config names (:func:`distrust_saved_endpoints`),
the metrics a resume keeps (:func:`truncate_metrics`); :func:`prepare_run` does it all before a trainer starts and
returns the run's :class:`~swarm_runtime.runs.context.RunContext`."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from loguru import logger
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import load_saved, override
from swarm_runtime.config.secrets import save_config
from swarm_runtime.config.validation import validate
from swarm_runtime.runs import runfiles
from swarm_runtime.runs.checkpoint import clean_spares, has_checkpoint, latest_checkpoint, load_state
from swarm_runtime.runs.context import RunContext, check_hardware, check_task
from swarm_runtime.runs.runlock import RunLock

#: Settings that change only what a run shows, never what it computes: a resumed run takes them from the command line.
DISPLAY_KEYS = ("progress", "log_level")


def machine_overrides(args, also: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The ``hardware=`` / ``hardware.*=`` / ``cluster.*=`` / ``train.*=`` arguments (the machine, where the run's
    envs live and how its learners are laid out, which a resumed run may change: ``cluster.kind=ray`` writes the
    in-process run's numbers, a checkpoint written under ``train.engine=fsdp`` resumes under ``local``), and those
    whose key is in ``also``."""
    out = []
    for a in args:
        k, _, v = a.partition("=")
        if k == "hardware" or k.startswith(("hardware.", "cluster.", "train.")) or k in also:
            out.append((k, v))
    return out


#: What ``swarm run resume=true`` may change besides the machine and the display: how many updates in all, and the
#: served transcripts its actions train on next (docs/guides/serve.md, "Training on served traffic").
RESUME_ALSO = ("algo.iterations", "algo.served", "algo.served_only", "algo.served_per_step")


def resume_overrides(args, also: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The command line's settings a resume applies on top of the saved run: the machine
    (``hardware=``, ``hardware.*``), the display (``DISPLAY_KEYS``), secrets (never saved, so given
    again) and the keys in ``also`` (``swarm run``: ``algo.iterations``)."""
    from swarm_runtime.config.secrets import is_secret_key

    secrets = [(k, v) for k, _, v in (a.partition("=") for a in args) if is_secret_key(k)]
    return machine_overrides(args, also=(*also, *DISPLAY_KEYS)) + secrets


def apply_resume_overrides(saved: DictConfig, applied: list[tuple[str, str]], resume_from: Path) -> bool:
    """Apply a resumed run's ``applied`` settings (:func:`refuse_resume_conflicts` returns them: its
    :func:`resume_overrides` and ``algo.iterations=N``, train up to N updates in all: a finished run
    continues, its learning-rate schedule stretched to the new total). Returns whether the iterations
    changed."""
    before = int(saved.algo.iterations)
    for k, v in applied:
        override(saved, k, v)
    n = int(saved.algo.iterations)
    done = int(load_state(resume_from).get("iteration", 0)) if resume_from is not None else 0
    if n < done:
        raise ConfigError(
            f"algo.iterations={n} on resume, but the run has already made {done} updates; give at least {done}"
        )
    return n != before


#: Config groups the command line picks by name (``task=wooden_pickaxe``), with the key that records the pick.
GROUP_PICKS = {
    "domain": "domain",
    "task": "task_name",
    "model": "model.name",
    "algo": "algo.name",
    "hardware": "hardware.name",
}


def config_key(cfg: DictConfig, k: str) -> str:
    """The full key a command-line ``k`` sets in ``cfg``: a bare task key (``max_decisions``) is
    ``task.max_decisions``; anything else as given."""
    return k if "." in k or k in cfg or k not in cfg.get("task", {}) else f"task.{k}"


#: The Ray heads a command joins: the key holding the address, and whether a config joins it (``swarm run`` and
#: ``swarm eval``: the run's cluster; ``swarm serve``: the gateway's own, ``serve.address``).
RAY_HEADS = {
    "cluster.address": lambda cfg: OmegaConf.select(cfg, "cluster.kind", default="local") == "ray",
    "serve.address": lambda cfg: OmegaConf.select(cfg, "serve.cluster", default="local") == "ray",
}


def distrust_saved_endpoints(
    cfg: DictConfig, registry, args, source: Path, joins: tuple[str, ...] = ("cluster.address",), chosen=None
) -> list[str]:
    """A run folder's config (``cfg``, loaded from ``source``, the command line ``args`` applied): note
    the endpoints it names that the command line does not give and the shipped defaults do not hold
    (:func:`swarm_runtime.config.secrets.note_saved_endpoints`), so that no key is sent to them
    (``secrets.check_endpoint``, asked by whatever sends one: the LLM judge). A Ray head among ``joins``
    (:data:`RAY_HEADS`) that the config joins and the command line does not give is refused
    (:func:`swarm_runtime.config.secrets.refuse_saved_ray_head`). So is a program, server flags or a server among
    ``chosen`` (the keys of ``secrets.CHOSEN_ON_THE_COMMAND_LINE`` the command uses; None: all) that the config uses
    and the command line does not give (:func:`swarm_runtime.config.secrets.refuse_saved_choices`). Returns the
    endpoints' keys."""
    from swarm_runtime.config.load import resolve
    from swarm_runtime.config.secrets import note_saved_endpoints, refuse_saved_choices

    given = [config_key(cfg, a.partition("=")[0]) for a in args if "=" in a]
    refuse_saved_ray_heads(cfg, given, source, joins)
    refuse_saved_choices(cfg, given, source, chosen)
    try:
        shipped = resolve([f"domain={cfg.domain}", f"task={cfg.task_name}"], registry)
    except (ConfigError, OmegaConfBaseException):
        shipped = None
    return note_saved_endpoints(cfg, shipped, given, source)


def refuse_saved_ray_heads(cfg: DictConfig, given_keys, source, joins: tuple[str, ...] = ("cluster.address",)) -> None:
    """Refuse each Ray head among ``joins`` that ``cfg`` (saved in ``source``) joins and ``given_keys`` (the
    command line's full keys) does not give (:func:`swarm_runtime.config.secrets.refuse_saved_ray_head`)."""
    from swarm_runtime.config.secrets import refuse_saved_ray_head

    for key in joins:
        if RAY_HEADS[key](cfg):
            refuse_saved_ray_head(cfg, key, given_keys, source)


def resume_conflicts(saved: DictConfig, args, applied=()) -> list[tuple[str, object, str]]:
    """The command line's ``key=value`` settings that would change a resumed run's saved config, as
    ``(key, saved value, given value as typed)``. Values are compared resolved: each setting is applied
    to a copy of ``saved``, so ``algo.lr=0.00003`` equals a saved ``3e-05`` and ``[ 0 ]`` equals ``[0]``;
    a group (``task=``, ``model=``, ``algo=``) is compared by the name it picks. Skipped: the keys in
    ``applied`` (those resuming applies: the machine, ...), ``run_dir=`` / ``resume=``, and secrets
    (never saved). ``swarm run`` and ``swarm experiment`` both ask this on ``resume=true``."""
    from swarm_runtime.config.secrets import is_secret_key

    def plain(value):
        return OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value

    out = []
    last: dict[str, str] = {}  # a key given twice (a recipe's value, then the command line's) counts as resolved: last
    for a in args:
        k = a.partition("=")[0]
        last[k if k in GROUP_PICKS else config_key(saved, k)] = a
    for a in last.values():
        k, _, v = a.partition("=")
        if k in applied or k in ("resume", "run_dir") or is_secret_key(k):
            continue
        if k in GROUP_PICKS:
            was = OmegaConf.select(saved, GROUP_PICKS[k], default=None)
            if str(was) != v:
                out.append((k, was, v))
            continue
        key = config_key(saved, k)
        was = plain(OmegaConf.select(saved, key, default=None))
        trial = saved.copy()
        try:
            override(trial, k, v)
        except (ConfigError, OmegaConfBaseException, ValueError):  # a value the run could not take anyway
            out.append((k, was, v))
            continue
        if plain(OmegaConf.select(trial, key, default=None)) != was:
            out.append((k, was, v))
    return out


def refuse_resume_conflicts(
    saved: DictConfig, args, saved_in: Path, also: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """What a resume's command line ``args`` apply on top of the run saved in ``saved_in`` (its
    ``config.yaml`` or ``experiment.json``; ``saved``: that run's resolved config):
    :func:`resume_overrides` (with the keys in ``also``). Any other setting that would change the saved
    run (:func:`resume_conflicts`) is a :class:`ConfigError` naming the key, the saved and the given
    value: resuming continues the saved run, and dropping the setting would give the user the old run
    where they asked for another. A setting equal to the saved one (``algo.lr=0.00003`` for ``3e-05``)
    is fine. ``swarm run`` and ``swarm experiment`` both call this on ``resume=true``, before anything
    in the run folder is touched."""
    applied = resume_overrides(args, also=also)
    changed = resume_conflicts(saved, args, {k for k, _ in applied})
    if changed:
        them = "it" if len(changed) == 1 else "them"
        raise ConfigError(
            f"resume=true continues the run as saved in {str(saved_in)!r}, but the command line "
            "changes "
            + "; ".join(f"{k}: saved {was}, given {v}" for k, was, v in changed)
            + f"; drop {them} to resume the run as saved, or give a new run_dir to start a run "
            f"with {them}"
        )
    return applied


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` already holds a run (its config or checkpoints)."""
    return (run_dir / "config.yaml").exists() or (run_dir / "checkpoints").exists()


def check_run_dir(run_dir: Path) -> None:
    """A folder the run can be written to: not a file, not under a file, writable."""
    for p in [run_dir, *run_dir.parents]:
        if p.exists():
            if not p.is_dir():
                where = "is a file" if p == run_dir else f"is under {str(p)!r}, which is a file"
                raise ConfigError(f"run_dir {str(run_dir)!r} {where}; give a folder")
            if not os.access(p, os.W_OK | os.X_OK):
                raise ConfigError(f"run_dir {str(run_dir)!r}: {str(p)!r} is not writable; give another run_dir")
            return


def _not_ours(run_dir: Path, others: list[str]) -> str:
    return (
        f"run_dir {str(run_dir)!r} holds {runfiles.shown(others)}, which swarm did not write (not in its "
        f"{runfiles.MANIFEST}; a run of a version before the manifest has none either)"
    )


def clear_run(run_dir: Path) -> None:
    """``overwrite=true``: delete what the previous run wrote (the names in its manifest,
    :mod:`swarm_runtime.runs.runfiles`) before a fresh start. A folder holding anything else is refused
    (naming it) before anything is deleted; a listed link is removed, never followed."""
    others = runfiles.foreign(run_dir)
    if others:
        raise ConfigError(
            _not_ours(run_dir, others) + "; overwrite=true deletes only a run's own files: move "
            "those away, or give another run_dir"
        )
    for name in sorted(runfiles.owned(run_dir)):
        p = run_dir / name
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)
    for leftover in run_dir.glob(".*.tmp"):  # temporary files of the listed ones
        if leftover.is_file() or leftover.is_symlink():
            leftover.unlink()
    runfiles.start(run_dir, empty=True)  # what the new run writes is listed as it writes it
    logger.warning("overwrite=true: deleted the previous run in {}", run_dir)


def refuse_fresh_start(run_dir: Path, overwrite: bool) -> None:
    """A fresh run into ``run_dir``: one that holds a run needs ``overwrite=true`` (and then only the
    run's own files are deleted, :func:`clear_run`); a file named like a run's that the runtime did
    not write (a user's ``metrics.jsonl``, ``run.log``, ``eval.json``, plot) is never replaced."""
    if holds_run(run_dir):
        if not overwrite:
            others = runfiles.foreign(run_dir)
            if others:
                raise ConfigError(
                    f"run_dir {str(run_dir)!r} already holds a run, and files swarm did not write "
                    f"({runfiles.shown(others)}), which it never deletes; continue the run with "
                    "resume=true or give another run_dir"
                )
            raise ConfigError(
                f"run_dir {str(run_dir)!r} already holds a run; continue it with resume=true, "
                "give another run_dir, or replace it with overwrite=true"
            )
        clear_run(run_dir)
        return
    clash = runfiles.run_named(run_dir)
    if clash:
        raise ConfigError(
            _not_ours(run_dir, clash) + "; a run would replace or append to them: move them "
            "away, or give another run_dir"
        )


def truncate_metrics(run_dir: Path, state: dict) -> None:
    """On resume: keep the ``metrics.jsonl`` rows the checkpoint covers (``metrics_rows``; older
    checkpoints: rows up to its iteration), so no row is written twice. A cut last line (a kill
    in the middle of a write) is dropped; a corrupted line the checkpoint covers is an error."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    lines = path.read_text().split("\n")
    complete, keep = lines[:-1], []  # the part after the last newline is a cut row (or empty)
    limit = state.get("metrics_rows")
    for i, ln in enumerate(complete if limit is None else complete[: int(limit)]):
        try:
            row = json.loads(ln)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path} line {i + 1} is not a JSON row ({exc.msg}); delete that line (and the ones after it) to resume"
            ) from exc
        if limit is None and row.get("step", -1) > int(state.get("iteration", 0)):
            continue
        keep.append(ln)
    if limit is not None and len(complete) < int(limit):
        raise ConfigError(
            f"{path} has {len(complete)} rows, fewer than the {limit} its checkpoint's state.json "
            "(metrics_rows) covers: one of the two is damaged; restore the file to resume"
        )
    steps = [row.get("step") for row in map(json.loads, keep)]
    if any(
        not isinstance(st, int) or isinstance(st, bool) or not 0 <= st <= int(state.get("iteration", 0)) for st in steps
    ):
        raise ConfigError(
            f"{path} holds a row whose step is not a whole number from 0 to the checkpoint's iteration "
            f"{state.get('iteration', 0)}: it does not belong to this checkpoint; restore the file to resume"
        )
    tmp = path.with_name(f".{path.name}.tmp")  # atomically: a kill here leaves the rows as they were
    tmp.write_text("".join(k + "\n" for k in keep))
    os.replace(tmp, path)


def _find_resumable(cfg: DictConfig) -> Path:
    pattern = f"{cfg.domain}-{cfg.task_name}-*"
    found = sorted((p for p in Path("runs").glob(pattern) if has_checkpoint(p)), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ConfigError(f"resume=true but no run folder runs/{pattern} has a checkpoint; give run_dir=...")
    return found[-1]


class RunFolder:
    """The folder a run writes, and how the run starts in it: ``fresh`` (an empty or new folder),
    ``overwrite`` (``overwrite=true``: the previous run's own files deleted first, :func:`clear_run`) or
    ``resume`` (``resume=true``: the saved run continued from its latest checkpoint, or started again
    as configured when it was killed before its first one)."""

    def __init__(self, path: Path, mode: str, command: str = "run"):
        self.path, self.mode, self.command = Path(path), mode, command
        self.resume_from: Path | None = None  #: the checkpoint a resumed run continues from
        self.extended = False  #: a resume changed ``algo.iterations`` (the saved config is rewritten)
        self.restarted = False  #: a resume found no checkpoint: the run starts again, as configured

    @classmethod
    def pick(cls, cfg: DictConfig, command: str = "run") -> RunFolder:
        """``run_dir`` if given; for ``resume=true`` without one, the newest run of this domain and task
        that has a checkpoint; else a new timestamped folder under ``runs/``. Checked writable."""
        mode = "resume" if cfg.resume else "overwrite" if cfg.get("overwrite") else "fresh"
        if cfg.run_dir:
            path = Path(cfg.run_dir)
        elif mode == "resume":
            path = _find_resumable(cfg)
        else:
            path = Path("runs") / f"{cfg.domain}-{cfg.task_name}-{time.strftime('%Y%m%d-%H%M%S')}"
        check_run_dir(path)
        return cls(path, mode, command)

    def create(self) -> None:
        """Make the folder (a resumed run's must exist already)."""
        if self.mode == "resume" and not self.path.is_dir():
            raise ConfigError(f"resume=true but run_dir {str(self.path)!r} does not exist")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"run_dir {str(self.path)!r} cannot be created: {exc.strerror}") from exc

    def start(self, cfg: DictConfig, registry, args=()) -> DictConfig:
        """Start the run in the (locked) folder; returns the run's config: ``cfg``, or for a resume the
        saved one with the command line's allowed settings applied (:func:`refuse_resume_conflicts`).
        Everything a start refuses is refused before anything in the folder is deleted or rewritten."""
        runfiles.check_links(self.path)  # nothing below reads or writes through a link out of the folder
        if self.mode == "resume":
            cfg = self._resume(cfg, registry, args)
        else:
            refuse_fresh_start(self.path, overwrite=self.mode == "overwrite")  # overwrite: clears the old run
            runfiles.start(self.path)
        if self.resume_from is not None:
            clean_spares(self.path)
            truncate_metrics(self.path, load_state(self.resume_from))
        elif (self.path / "metrics.jsonl").exists():
            (self.path / "metrics.jsonl").unlink()  # a fresh start: no row of an earlier attempt survives
        cfg.run_dir = str(self.path)
        return cfg

    def _resume(self, cfg: DictConfig, registry, args) -> DictConfig:
        config = self.path / "config.yaml"
        if not config.exists() and (self.path / "checkpoints").exists():
            raise ConfigError(
                f"resume=true but {str(config)!r} is missing: the run's settings "
                "are lost, and resuming its checkpoints under other settings would be another run; "
                "restore the file, or start a new run in another run_dir"
            )
        saved, applied = None, []
        if config.exists():
            # Continue the run as it was configured; the command line picks the run, the machine, the
            # display and (algo.iterations) how many updates to train in all. Any other change is
            # refused here, before anything in the folder is repaired, cut or rewritten.
            saved = load_saved(config, registry)
            saved.resume, saved.run_dir = True, str(self.path)
            applied = refuse_resume_conflicts(saved, args, config, also=RESUME_ALSO)
        self.resume_from = latest_checkpoint(self.path)
        if self.resume_from is not None:  # its models' files, before anything in the folder is cut or rewritten
            from swarm_runtime.runs.agents_check import check_agents

            check_agents(self.resume_from)
        if self.resume_from is None and saved is None:
            raise ConfigError(f"resume=true but {self.path} has no checkpoint to resume from")
        self.restarted = self.resume_from is None  # killed before its first checkpoint: start again, as configured
        if saved is not None:
            self.extended = apply_resume_overrides(saved, applied, self.resume_from)
            distrust_saved_endpoints(saved, registry, args, config)  # first: a saved Ray head is refused as such
            validate(saved, registry)
            cfg = saved
            check_hardware(cfg)
        runfiles.start(self.path)
        check_task(registry.domains[cfg.domain], cfg)
        return cfg

    def save_config(self, cfg: DictConfig) -> None:
        """The resolved config, as ``config.yaml`` (``config.<command>.yaml`` for another command); a
        resume keeps the saved one unless it trains longer (``algo.iterations``)."""
        path = self.path / ("config.yaml" if self.command == "run" else f"config.{self.command}.yaml")
        if self.extended or not (self.mode == "resume" and path.exists()):
            save_config(cfg, path)

    def log_to(self, level: str) -> None:
        """Log to the terminal at ``level`` and, everything, to the folder's ``run.log``."""
        logger.remove()
        logger.add(
            sys.stderr, level=level, format="<green>{time:HH:mm:ss}</green> <level>{level: <7}</level> {message}"
        )
        logger.add(runfiles.claim(self.path / "run.log"), level="DEBUG")
        logger.info(
            "run folder {}{}", self.path, f" (resuming from {self.resume_from.name})" if self.resume_from else ""
        )
        if self.restarted:
            logger.warning(
                "resume=true: {} has no checkpoint yet (killed before the first one); starting it again", self.path
            )


def prepare_run(cfg: DictConfig, pm, registry, command: str = "run", args=()) -> RunContext:
    """Pick (or find, for ``resume=true``) the run folder, lock it, start the run in it
    (:class:`RunFolder`: fresh, overwrite or resume), save the resolved config, set up logging.
    ``args``: the command line; when a run is resumed, its :func:`resume_overrides` and
    ``algo.iterations`` (to train longer) apply and any other change is refused
    (:func:`refuse_resume_conflicts`). The lock (``ctx.lock``) is held until the
    process ends or :meth:`RunLock.release`."""
    from swarm_runtime.cluster.actor_env import forward_env
    from swarm_runtime.runs.provenance import pin

    check_hardware(cfg)
    pin()  # the code's commit as it is now (results are stamped when the run ends)
    folder = RunFolder.pick(cfg, command)
    if folder.mode != "resume":
        check_task(registry.domains[cfg.domain], cfg)  # before anything is created
    folder.create()
    lock = RunLock(folder.path, command).acquire()
    try:
        cfg = folder.start(cfg, registry, args)
        folder.save_config(cfg)
        forward_env(cfg, registry.domains.get(cfg.domain))
    except BaseException:
        lock.release()
        raise
    folder.log_to(cfg.log_level)
    return RunContext(cfg, pm, registry, folder.path, folder.resume_from, lock=lock)
