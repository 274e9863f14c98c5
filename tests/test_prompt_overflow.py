"""A prompt longer than ``model.max_prompt_tokens`` is never cut silently: by default it stops the run
with one line naming the role and the lengths; ``SWARM_PROMPT_OVERFLOW=warn`` cuts it from the left and
counts it. (The default runs of the three built-in domains never come near the limit: docs/reference/plugins.md.)"""

from __future__ import annotations

import pytest
from conftest import TINY_RUN, swarm
from omegaconf import OmegaConf

from swarm_runtime.config.schema import ModelConfig
from swarm_runtime.models.transformers_backend import PromptOverflowError, make_transformers_policy

WORDS = ["goal", "chop", "tree", "log", "planks"]


def tiny(limit: int):
    cfg = OmegaConf.structured(
        ModelConfig(
            max_prompt_tokens=limit, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=1
        )
    )
    return make_transformers_policy(cfg, WORDS + ["you", "are", "Miner", "."], [0.0, 0.4], seed=0)


def test_an_overflowing_prompt_is_an_error_naming_the_role_and_the_lengths(monkeypatch):
    monkeypatch.delenv("SWARM_PROMPT_OVERFLOW", raising=False)
    policy = tiny(8)
    assert len(policy.encode_prompt("you are Miner . goal chop")) == 7  # fits: bos + 6 words
    prompt = "you are Miner . goal chop tree log planks"
    with pytest.raises(
        PromptOverflowError,
        match=r"^a prompt of role Miner is 10 tokens long \(bos included\), more "
        r"than model\.max_prompt_tokens=8: raise it .*set "
        r"SWARM_PROMPT_OVERFLOW=warn to cut it from the left; it begins "
        r"'you are Miner \. goal chop'$",
    ):
        policy.act([prompt])
    policy.role = "Smith"  # a backend that knows its role names it, whatever the prompt says
    with pytest.raises(PromptOverflowError, match="^a prompt of role Smith is 10 tokens"):
        policy.encode_prompt(prompt)


def test_warn_cuts_from_the_left_and_counts_each_prompt(monkeypatch, caplog):
    from loguru import logger

    monkeypatch.setenv("SWARM_PROMPT_OVERFLOW", "warn")
    policy = tiny(8)
    seen: list[str] = []
    sink = logger.add(seen.append, level="WARNING", format="{message}")
    try:
        ids = policy.encode_prompt("you are Miner . goal chop tree log planks")
        policy.encode_prompt("you are Miner . goal chop tree log planks")  # cached: counted once
        policy.encode_prompt("goal chop tree log planks goal chop tree log")
        policy.encode_prompt("goal chop tree log planks goal chop tree")
    finally:
        logger.remove(sink)
    assert len(ids) == 8 and ids[0] == policy.bos and policy.decode(ids[1:]) == "Miner . goal chop tree log planks"
    assert policy.prompt_overflows == 3
    assert [m.split(":")[0] for m in seen] == [
        "prompt overflow #1 (SWARM_PROMPT_OVERFLOW=warn)",
        "prompt overflow #2 (SWARM_PROMPT_OVERFLOW=warn)",
    ]  # 1st, 2nd, 4th ...
    monkeypatch.setenv("SWARM_PROMPT_OVERFLOW", "cut")
    with pytest.raises(ValueError, match=r"SWARM_PROMPT_OVERFLOW='cut' is not valid: must be one of error, warn"):
        tiny(8)


def test_swarm_run_stops_on_an_overflow_and_runs_counted_under_warn(tmp_path, warm_swarm):
    args = ["run", *TINY_RUN, "model.max_prompt_tokens=24", "algo.iterations=1"]
    r = swarm(*args, f"run_dir={tmp_path / 'error'}", cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr
    assert (
        last.startswith(
            "swarm: error: PromptOverflowError: a prompt of role Logger is 38 tokens long (bos "
            "included), more than model.max_prompt_tokens=24: raise it"
        )
        and "SWARM_PROMPT_OVERFLOW=warn" in last
        and "it begins 'you are Logger . goal wooden_pickaxe'" in last
    ), last
    # the error cold, the run under warn through the warm CLI (the variable is read when a prompt overflows)
    r = warm_swarm(*args, f"run_dir={tmp_path / 'warn'}", cwd=tmp_path, env={"SWARM_PROMPT_OVERFLOW": "warn"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "prompt overflow #1 (SWARM_PROMPT_OVERFLOW=warn): a prompt of role " in r.stderr
    assert (tmp_path / "warn" / "eval.json").exists()
