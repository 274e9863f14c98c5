"""Atomic checkpoints: each is written to a temporary folder, renamed into place,
and only then does the ``latest`` pointer (itself replaced atomically) move to it.
A crash at any point leaves the previous checkpoint intact."""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch
from loguru import logger

from swarm_runtime.train.optim import master_weights


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(run_dir: Path, tag: str, agents_by_role: dict, optimizers: dict, state: dict,
                    run_rng: random.Random, keep: int = 2) -> Path:
    """Write ``checkpoints/<tag>/`` with one Hugging Face folder per agent model
    (``agents/<role>/``), optimizer/scheduler/RNG state, and ``state.json``."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / tag
    tmp = root / f".tmp-{tag}"
    shutil.rmtree(tmp, ignore_errors=True)
    for role, policy in agents_by_role.items():
        d = tmp / "agents" / role
        policy.save(d)
        extra = {"policy_rng": policy.rng_state()}
        masters = master_weights(policy.parameters())
        if masters is not None:  # bf16/fp16 weights: their fp32 masters, for an exact resume
            extra["master_weights"] = masters
        for kind, table in optimizers.items():  # {"action": {role: (opt, sched)}, "bid": {...}}
            if role in table:
                opt, sched = table[role]
                extra[f"optimizer_{kind}"], extra[f"scheduler_{kind}"] = opt.state_dict(), sched.state_dict()
        torch.save(extra, d / "training_state.pt")
    torch.save({"run": run_rng.getstate(), "python": random.getstate(), "torch": torch.get_rng_state()},
               tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=1, default=float))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_atomic(root / "latest", tag)
    _prune(root, keep, protect={tag, "sft"})
    logger.debug("checkpoint {} written", final)
    return final


def _prune(root: Path, keep: int, protect: set[str]) -> None:
    tags = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("iter-")), key=lambda p: p.name)
    for p in tags[:-keep] if keep > 0 else []:
        if p.name not in protect:
            shutil.rmtree(p, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not (path / "state.json").exists():
        raise FileNotFoundError(f"checkpoint pointer {pointer} names {path}, which is incomplete or missing")
    return path


def load_state(ckpt: Path) -> dict:
    return json.loads((ckpt / "state.json").read_text())


def load_training_state(ckpt: Path, role: str) -> dict:
    # Onto the CPU: a run trained on a GPU resumes or evaluates on a machine without one;
    # ``Optimizer.load_state_dict`` then moves the state to each parameter's device.
    return torch.load(ckpt / "agents" / role / "training_state.pt", weights_only=False, map_location="cpu")


def restore_rng(ckpt: Path, run_rng: random.Random) -> None:
    st = torch.load(ckpt / "rng.pt", weights_only=False, map_location="cpu")
    run_rng.setstate(st["run"])
    random.setstate(st["python"])
    torch.set_rng_state(st["torch"])
