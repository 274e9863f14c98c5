"""On resume, TensorBoard shows each step once, as the resumed run wrote it:
the resumed writer starts its event file with ``purge_step``, so TensorBoard hides the earlier
files' events from the step after the checkpoint on (as ``metrics.jsonl`` is cut back)."""

from __future__ import annotations

import pytest

from swarm_runtime.runs.outputs import MetricsWriter, read_metrics

pytest.importorskip("tensorboard")


def _scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(run_dir / "tb"))
    ea.Reload()
    return [(e.step, e.value) for e in ea.Scalars(tag)]


def test_resumed_writer_purges_the_steps_after_the_checkpoint(tmp_path):
    w = MetricsWriter(tmp_path)
    for step in range(5):  # steps 3 and 4 were written after the checkpoint at step 2, then the run died
        w.log(step, {"charts/episode_reward": float(step)})
    w.close()
    w = MetricsWriter(tmp_path, truncate_after=2)  # resume from the checkpoint at step 2
    for step in range(3, 6):
        w.log(step, {"charts/episode_reward": 10.0 + step})
    w.close()
    want = [(0, 0.0), (1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0), (5, 15.0)]
    assert _scalars(tmp_path, "charts/episode_reward") == want
    assert [(r["step"], r["charts/episode_reward"]) for r in read_metrics(tmp_path)] == want


def test_a_fresh_writer_purges_nothing(tmp_path):
    w = MetricsWriter(tmp_path)
    for step in range(3):
        w.log(step, {"losses/x": float(step)})
    w.close()
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (events,) = list((tmp_path / "tb").iterdir())
    assert not any(ev.HasField("session_log") for ev in EventFileLoader(str(events)).Load())
    assert _scalars(tmp_path, "losses/x") == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_a_value_that_is_not_a_finite_number_is_written_as_null(tmp_path):
    """metrics.jsonl stays standard JSON (a strict reader refuses NaN) and TensorBoard gets no NaN point."""
    import json

    import torch

    w = MetricsWriter(tmp_path)
    w.log(
        0,
        {
            "sft/demo_action_accuracy_Miner": float("nan"),
            "sft/loss": 0.5,
            "x/inf": float("inf"),
            "x/tensor_nan": torch.tensor(float("nan")),
            "note": "text",
            "flag": True,
        },
    )
    w.close()

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    line = (tmp_path / "metrics.jsonl").read_text().strip()
    row = json.loads(line, parse_constant=refuse)
    assert row == {
        "step": 0,
        "sft/demo_action_accuracy_Miner": None,
        "sft/loss": 0.5,
        "x/inf": None,
        "x/tensor_nan": None,
        "note": "text",
        "flag": True,
    }
    back = read_metrics(tmp_path)[0]  # read back as NaN, as plots and tables expect a number
    assert back["sft/loss"] == 0.5 and back["note"] == "text" and back["x/inf"] != back["x/inf"]
    assert _scalars(tmp_path, "sft/loss") == [(0, 0.5)]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    assert "sft/demo_action_accuracy_Miner" not in ea.Tags()["scalars"]
