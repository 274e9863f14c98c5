"""``swarm experiment rlcr_teams``: per team size its own RLCR training, the solo agent with the team's
tokens, best-of-k and the signs of life, run end to end by the real CLI at a tiny budget."""

from __future__ import annotations

import json

from tests.conftest import ROOT, TINY_RLCR_EXPERIMENT, swarm


def test_rlcr_teams_trains_each_team_size_and_gives_the_solo_agent_the_teams_tokens(tmp_path):
    out = tmp_path / "teams"
    res = swarm("experiment", "rlcr_teams", *TINY_RLCR_EXPERIMENT, "rlcr.teams=[1,2]", f"run_dir={out}", cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    table = (out / "results.md").read_text()
    assert "| team 1 (solo) |" in table and "| team 2 |" in table and "solo, same tokens" in table
    seed = out / "seed-0"
    assert (seed / "rlcr_signs.png").exists() and (seed / "rlcr_latency.png").exists()
    for k in (1, 2):  # the solo agent's budget is team k's own mean tokens per held-out rollout
        cell = json.loads((seed / "cells" / f"solo-tokens-team{k}.json").read_text())
        results = json.loads((seed / "trainings" / f"rlcr-team{k}" / "eval.json").read_text())["results"]
        coll = results["RLCR: solo" if k == 1 else f"RLCR: flat team of {k}"]
        assert cell["budget_tokens"] == max(1, round(coll["tokens_mean"])) and cell["solo_budget"]["tokens_mean"] > 0
