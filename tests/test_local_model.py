"""``model=local model.path=DIR``: a Hugging Face checkpoint of the kind users bring (a byte-level
BPE tokenizer with no pad token and no bid tokens, bfloat16 by the preset), built here in process
since nothing can be downloaded, trained by the real CLI and evaluated from its run folder."""

import json

import pytest
import torch
from conftest import TINY_RUN, make_local_checkpoint


@pytest.fixture(scope="module")
def local_checkpoint(tmp_path_factory):
    return make_local_checkpoint(tmp_path_factory.mktemp("pretrained") / "ckpt")


def test_a_local_bpe_checkpoint_trains_and_evaluates(local_checkpoint, tmp_path, warm_swarm):
    run = tmp_path / "run"
    args = [a for a in TINY_RUN if not a.startswith(("algo.sft.", "algo.iterations"))]
    res = warm_swarm(
        "run",
        *args,
        "model=local",
        f"model.path={local_checkpoint}",
        "algo.sft.demo_episodes=4",
        "algo.sft.epochs=6",
        "algo.iterations=1",
        f"run_dir={run}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    log = (run / "run.log").read_text()
    assert "resized embeddings" in log  # the bid-level tokens were added to the tokenizer and the model
    losses = [line.split("loss ")[1].split(",")[0] for line in log.splitlines() if "SFT Logger:" in line]
    first, last = (float(x) for x in losses[0].split(" -> "))
    assert last < 0.7 * first, losses  # SFT learns through the BPE tokenizer, in bfloat16
    saved = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip() / "agents" / "Logger"
    meta = json.loads((saved / "swarm_policy.json").read_text())
    assert meta["word_level_tokenizer"] is False and meta["bid_mode"] == "generate"
    state = torch.load(saved / "training_state.pt", weights_only=False)
    masters = [m for m in state["master_weights"] if m is not None]  # bf16 weights train via fp32 masters
    assert masters and all(m.dtype == torch.float32 for m in masters)
    added = json.loads((saved / "tokenizer.json").read_text())["added_tokens"]
    assert any(t["content"] == "<bid_0.2>" for t in added)
    res = warm_swarm("eval", str(run), "eval.runs=1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "reward" in res.stdout


def test_constrained_actions_on_a_tokenizer_whose_pad_is_its_eos(local_checkpoint):
    """A local tokenizer without a pad token gets pad = EOS (``load_pretrained``); EOS still ends an
    action choice, so constraining to the listed choices must not refuse every choice."""
    from swarm_runtime.models.transformers_backend import TransformersPolicy, load_pretrained

    model, tok = load_pretrained(local_checkpoint, [0.0, 0.5, 1.0])
    assert tok.pad_token_id == tok.eos_token_id
    policy = TransformersPolicy(model, tok, [0.0, 0.5, 1.0], bid_mode="generate", max_action_tokens=12)
    choices = ["chop tree", "craft planks", "mine stone"]
    policy.constrain_actions(choices)
    acts = policy.act(["Logger: what next?"] * 4)
    assert all(a.text in choices for a in acts), [a.text for a in acts]
