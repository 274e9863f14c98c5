"""``swarm experiment rlcr_org``: the flat team, the CEO organisation and the latency penalty, each its
own RLCR training, run end to end by the real CLI at a tiny budget."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from tests.conftest import ROOT, TINY_RLCR_EXPERIMENT, swarm


def test_rlcr_org_trains_three_arms_and_tabulates_them(tmp_path):
    out = tmp_path / "org"
    res = swarm("experiment", "rlcr_org", *TINY_RLCR_EXPERIMENT, f"run_dir={out}", cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    table = (out / "results.md").read_text()
    for label in ("| flat team of 3 |", "| CEO + up to 2 hires |", "| flat team of 3, latency penalty beta=0.5 |"):
        assert label in table
    assert "minus flat, paired" in table and (out / "seed-0" / "rlcr_org_latency.png").exists()
    # the header counts the runs RLCR evaluates per held-out seed (rlcr.eval_runs), not eval.runs
    assert "2 seeds x 1 runs" in table and json.loads((out / "results.json").read_text())["runs"] == 1
    arms = [OmegaConf.load(out / "seed-0" / "trainings" / f"rlcr-org{i}" / "config.yaml").rlcr for i in range(3)]
    assert [(a.org, a.latency_penalty) for a in arms] == [("flat", 0.0), ("ceo", 0.0), ("flat", 0.5)]
    assert arms[1].max_hires == 2
    rows = [
        json.loads(x) for x in (out / "seed-0" / "trainings" / "rlcr-org1" / "metrics.jsonl").read_text().splitlines()
    ]
    assert any("charts/team_peak" in r and r["charts/team_peak"] >= 1 for r in rows)
