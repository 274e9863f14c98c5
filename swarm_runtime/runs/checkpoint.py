"""Atomic checkpoints: each is written to a temporary folder, renamed into place, and only then
does the ``latest`` pointer (itself replaced atomically) move to it. Replacing a checkpoint of
the same tag never deletes the only complete copy: the old folder is renamed aside
(``.old-<tag>``), the new one renamed in, ``latest`` moved, and only then is the old one deleted.
A crash at any point leaves a complete checkpoint that :func:`latest_checkpoint` finds (and, when
``latest`` names a folder that a crash left aside, renames back into place).

Files hold no pickled objects: weights are safetensors (Hugging Face folders), ``state.json`` is
JSON, and the optimizer/scheduler/RNG state (``training_state.pt``, ``rng.pt``) holds only tensors
and plain Python values, loaded with ``torch.load(weights_only=True)``, which refuses anything else
(a planted pickle payload is an error naming the file, never run). ``state.json`` is written last:
a folder with it is complete. ``state.json`` also records ``metrics_rows``, the number of
``metrics.jsonl`` rows the checkpoint covers, so a resumed run drops the rows written after it."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch
from loguru import logger

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.models.masters import master_weights
from swarm_runtime.runs.runfiles import claim, inside, serving_checkpoints

#: A checkpoint tag as ``latest`` may name it: one plain folder name inside ``checkpoints/``.
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


class CheckpointError(ConfigError):
    """A run folder's checkpoint files are missing, corrupted or unsafe; the CLI prints the
    message (naming the file and what to do) and exits with code 2."""


@contextmanager
def loading_models(agents_dir: Path):
    """Around loading a checkpoint's models (``swarm eval``, a resume): a truncated or foreign
    weights file, or a refused pickle, becomes a :class:`CheckpointError` naming the folder."""
    try:
        yield
    except (ConfigError, ImportError):
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CheckpointError(
            f"the models in {agents_dir} cannot be loaded ({type(exc).__name__}: {first}); "
            "resume or evaluate another checkpoint (checkpoint=TAG)"
        ) from exc


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def metrics_rows(run_dir: Path) -> int:
    """Complete rows (newline-terminated lines) of ``run_dir/metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def save_checkpoint(
    run_dir: Path,
    tag: str,
    agents_by_role: dict,
    optimizers: dict,
    state: dict,
    run_rng: random.Random,
    keep: int = 2,
    training_states: dict | None = None,
    sampler_rng=None,
) -> Path:
    """Write ``checkpoints/<tag>/`` with one Hugging Face folder per agent model
    (``agents/<role>/``), optimizer/scheduler/RNG state, and ``state.json``. ``training_states``
    (role -> fp32 masters and optimizer/scheduler state, as ``training_state.pt`` holds them): given
    where they live outside ``optimizers`` (learner actors, ``cluster/learners.py``). ``sampler_rng``: the state of
    the engine sampler's own generator (:func:`swarm_runtime.sampling.openai.sampler_rng_state`), None without one."""
    root = claim(run_dir / "checkpoints")
    root.mkdir(parents=True, exist_ok=True)
    final, tmp, aside = root / tag, root / f".tmp-{tag}", root / f".old-{tag}"
    shutil.rmtree(tmp, ignore_errors=True)
    for role, policy in agents_by_role.items():
        d = tmp / "agents" / role
        policy.save(d)
        extra = {"policy_rng": policy.rng_state()}
        if training_states is not None and role in training_states:
            torch.save({**extra, **training_states[role]}, d / "training_state.pt")
            continue
        masters = master_weights(policy.parameters())
        if masters is not None:  # bf16/fp16 weights: their fp32 masters, for an exact resume
            extra["master_weights"] = masters
        for kind, table in optimizers.items():  # {"action": {role: (opt, sched)}, "bid": {...}}
            if role in table:
                opt, sched = table[role]
                extra[f"optimizer_{kind}"], extra[f"scheduler_{kind}"] = opt.state_dict(), sched.state_dict()
        torch.save(extra, d / "training_state.pt")
    save_rng(tmp / "rng.pt", run_rng, sampler_rng)
    state = {**state, "metrics_rows": metrics_rows(run_dir)}
    (tmp / "state.json").write_text(json.dumps(state, indent=1, default=float))  # last: the folder is complete
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)  # keep the old copy until the new one is in place and named
    os.replace(tmp, final)
    _write_atomic(root / "latest", tag)
    shutil.rmtree(aside, ignore_errors=True)
    _prune(root, keep, protect={tag, "sft"})
    logger.debug("checkpoint {} written", final)
    return final


def save_rng(path: Path, run_rng: random.Random, sampler_rng=None) -> None:
    """The run's, Python's and torch's random streams (plain values and a tensor), and the engine sampler's
    (``sampler``: the seeds of rows without a common-random-numbers key; absent without one)."""
    st = {"run": run_rng.getstate(), "python": random.getstate(), "torch": torch.get_rng_state()}
    if sampler_rng is not None:
        st["sampler"] = sampler_rng
    torch.save(st, path)


def _prune(root: Path, keep: int, protect: set[str]) -> None:
    """Remove the ``iter-*`` checkpoints of ``root`` but the newest ``keep``, ``protect`` and those a live ``swarm
    serve`` of the run serves (:func:`~swarm_runtime.runs.runfiles.serving_checkpoints`)."""
    protect = protect | serving_checkpoints(root.parent)
    tags = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("iter-")), key=lambda p: p.name)
    for p in tags[:-keep] if keep > 0 else []:
        if p.name not in protect:
            shutil.rmtree(p, ignore_errors=True)


def complete(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint folder (``state.json`` is written last)."""
    return (path / "state.json").is_file()


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` has a ``checkpoints/latest`` pointer (without reading or repairing it)."""
    return (Path(run_dir) / "checkpoints" / "latest").is_file()


def complete_tags(run_dir: Path) -> list[str]:
    root = Path(run_dir) / "checkpoints"
    return sorted(p.name for p in root.glob("*") if not p.name.startswith(".") and complete(p)) if root.is_dir() else []


def latest_checkpoint(run_dir: Path, repair: bool = True) -> Path | None:
    """The checkpoint ``checkpoints/latest`` names, or None when there is no pointer. A pointer
    that names a folder a crash left aside (``.tmp-<tag>``: the new copy, written completely;
    or ``.old-<tag>``: the previous one) is repaired by renaming that folder into place (with
    ``repair``); anything else wrong is a :class:`CheckpointError` saying what to do."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if not pointer.exists() and not pointer.is_symlink():
        return None
    for p in (root, pointer):
        if p.is_symlink() and not inside(run_dir, p):
            raise CheckpointError(
                f"{p} is a link out of the run folder {str(run_dir)!r}; swarm does not read through "
                f"it: delete it. {_what_to_do(run_dir)}"
            )
    try:
        tag = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{pointer} cannot be read ({exc}); {_what_to_do(run_dir)}") from exc
    if not TAG_RE.fullmatch(tag) or tag in (".", ".."):
        raise CheckpointError(
            f"{pointer} holds {tag[:60]!r}, not a checkpoint folder name inside {root}; {_what_to_do(run_dir)}"
        )
    path = root / tag
    if path.is_symlink() and not inside(run_dir, path):
        raise CheckpointError(
            f"{path} is a link out of the run folder {str(run_dir)!r}; swarm does not load "
            "checkpoints through it: delete the link"
        )
    if complete(path):
        return path
    for spare in (root / f".tmp-{tag}", root / f".old-{tag}"):
        if complete(spare) and not path.exists():
            if not repair:
                return spare
            os.replace(spare, path)
            logger.warning(
                "checkpoints/latest named {}, which a crash left at {}; renamed it back into place", tag, spare.name
            )
            return path
    raise CheckpointError(f"{pointer} names {tag!r}, but {path} is incomplete or missing; {_what_to_do(run_dir)}")


def clean_spares(run_dir: Path) -> None:
    """Delete what a crash left beside the checkpoints (``.tmp-*``, ``.old-*``, ``.latest.tmp``)
    once ``latest`` names a complete checkpoint (call it with the run folder locked)."""
    root = Path(run_dir) / "checkpoints"
    for p in list(root.glob(".tmp-*")) + list(root.glob(".old-*")) + list(root.glob(".latest.tmp")):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _what_to_do(run_dir: Path) -> str:
    tags = complete_tags(run_dir)
    if not tags:
        return "the run has no complete checkpoint: start it again with overwrite=true"
    return (
        f"complete checkpoints: {', '.join(tags)}; write one of these names into "
        f"{Path(run_dir) / 'checkpoints' / 'latest'} to continue from it"
    )


def load_state(ckpt: Path) -> dict:
    path = Path(ckpt) / "state.json"
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} is missing: {ckpt} is not a complete checkpoint") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); the checkpoint is corrupted") from exc
    problem = state_problem(state, Path(ckpt).name)
    if problem:
        raise CheckpointError(
            f"{path} is not a valid checkpoint state: {problem}; the checkpoint is damaged (resume "
            f"or evaluate another one: {_what_to_do(Path(ckpt).parent.parent)})"
        )
    return state


#: The phases a checkpoint records (:mod:`swarm_runtime.learn.phases`).
PHASES = ("init", "sft_done", "rl", "done")
#: Largest iteration (update count) a state may record: ``swarm_runtime.config.rules.MAX_COUNT``.
MAX_ITERATION = 10_000_000


def _whole(v, hi: int = MAX_ITERATION) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi


def _finite(v) -> bool:
    import math

    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _eval_problem(key: str, res) -> str:
    """An evaluation result (``sft_eval``, ``final_eval``): a mapping with finite ``reward_mean`` and
    ``reward_se``, or (``algo=rlcr``) a mapping of such results (``collective``, ``solo``)."""
    if res is None:
        return ""
    if not isinstance(res, dict) or not res:
        return f"{key} is {str(res)[:40]!r}, not an evaluation result (a mapping)"
    if "reward_mean" not in res:
        for name, sub in res.items():
            if not isinstance(sub, dict) or "reward_mean" not in sub:
                return f"{key}.{name} is not an evaluation result (no reward_mean)"
            if problem := _eval_problem(f"{key}.{name}", sub):
                return problem
        return ""
    for k in ("reward_mean", "reward_se"):
        if not _finite(res.get(k)):
            return f"{key}.{k} is {res.get(k)!r}, not a finite number"
    return ""


def state_problem(state, tag: str = "") -> str:
    """What is wrong with a ``state.json`` (empty when nothing): types and ranges of what a resume
    reads (``phase``, ``iteration``, ``flops``, ``metrics_rows``, the evaluation results), and the
    checkpoint's name (``tag``): ``sft`` holds phase ``sft_done`` at iteration 0, ``iter-N`` iteration N."""
    if not isinstance(state, dict):
        return "not a JSON object"
    phase, it = state.get("phase"), state.get("iteration", 0)
    if phase not in PHASES:
        return f"phase is {str(phase)[:40]!r}, not one of {', '.join(PHASES)}"
    if not _whole(it):
        return f"iteration is {str(it)[:40]!r}, not a whole number from 0 to {MAX_ITERATION}"
    flops = state.get("flops", {})
    if not isinstance(flops, dict) or not all(isinstance(k, str) and _finite(v) and v >= 0 for k, v in flops.items()):
        return f"flops is {str(flops)[:60]!r}, not a mapping of names to finite numbers >= 0"
    if "metrics_rows" in state and not _whole(state["metrics_rows"], 1 << 40):
        return f"metrics_rows is {str(state['metrics_rows'])[:40]!r}, not a whole number >= 0"
    for key in ("sft_eval", "final_eval"):
        if problem := _eval_problem(key, state.get(key)):
            return problem
    hist = state.get("useful_work_history", [0.0, 0])  # algo=rlcr: [useful work summed, rollouts]
    if not (isinstance(hist, list) and len(hist) == 2 and _finite(hist[0]) and _whole(hist[1], 1 << 62)):
        return f"useful_work_history is {str(hist)[:40]!r}, not [a finite number, a whole number]"
    if "stopped_at_budget" in state and not isinstance(state["stopped_at_budget"], bool):
        return "stopped_at_budget is not true or false"
    if phase == "done" and state.get("final_eval") is None:
        return "phase is done, but there is no final_eval"
    if tag == "sft" and (phase != "sft_done" or it != 0):
        return f"checkpoint sft records phase {phase!r} at iteration {it}, not sft_done at 0"
    if re.fullmatch(r"iter-\d+", tag) and (it != int(tag[5:]) or phase not in ("rl", "done")):
        return f"checkpoint {tag} records phase {phase!r} at iteration {it}, not rl or done at {int(tag[5:])}"
    return ""


def load_tensors(path: Path) -> dict:
    """A ``.pt`` state file holding only tensors and plain values (``weights_only=True``): a
    pickled object of any other kind (a planted payload) is refused, never run."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete")
    try:
        # Onto the CPU: a run trained on a GPU resumes or evaluates on a machine without one;
        # ``Optimizer.load_state_dict`` then moves the state to each parameter's device.
        out = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # UnpicklingError (unsafe object), RuntimeError/EOFError (truncated, garbage)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "weights_only" in str(exc) or "Unsupported global" in str(exc):
            raise CheckpointError(
                f"{path} holds pickled objects other than tensors and plain values; refusing "
                "to load it (it could run code). Use a checkpoint written by swarm"
            ) from exc
        raise CheckpointError(f"{path} is corrupted or truncated ({type(exc).__name__}: {first[:160]})") from exc
    if not isinstance(out, dict):
        raise CheckpointError(f"{path} does not hold a dict of training state")
    return out


def load_training_state(ckpt: Path, role: str) -> dict:
    return load_tensors(Path(ckpt) / "agents" / role / "training_state.pt")


def sampler_rng(ckpt: Path):
    """The engine sampler's generator state a checkpoint saved (:func:`save_rng`), None when it has none (a run
    without an engine sampler, or a checkpoint written before it was saved)."""
    return load_tensors(Path(ckpt) / "rng.pt").get("sampler")


def restore_rng(ckpt: Path, run_rng: random.Random) -> None:
    path = Path(ckpt) / "rng.pt"
    st = load_tensors(path)
    try:
        run_rng.setstate(st["run"])
        random.setstate(st["python"])
        torch.set_rng_state(st["torch"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path} does not hold the run's random state ({type(exc).__name__}: {exc})") from exc
