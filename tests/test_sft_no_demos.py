"""A cold start whose expert gives no demonstrations: every role, and a config-built shared base (an adapter run),
starts untrained with a warning; the ``sft`` checkpoint is still written and training goes on from it.

The domain is ``paying`` (tests/test_branch_pairs_pay.py), which has no scripted expert. ~3 s."""

from __future__ import annotations

import pytest
from loguru import logger

from tests.test_branch_pairs_pay import trainer  # noqa: F401  (the fixture)


@pytest.mark.parametrize("overrides", [(), ("model.adapter=lora",)], ids=["full", "lora"])
def test_a_cold_start_without_demonstrations_starts_untrained_and_saves(trainer, overrides):  # noqa: F811
    tr = trainer(*overrides)
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        tr.cold_start()
    finally:
        logger.remove(sink)
    untrained = [line for line in lines if "no demonstrations" in line and "starts untrained" in line]
    # one line per role, plus the shared base of an adapter run
    assert len(untrained) == 3 + (1 if overrides else 0), lines
    assert tr.state["phase"] == "sft_done"
    assert (tr.ctx.run_dir / "checkpoints" / "sft" / "state.json").is_file()
