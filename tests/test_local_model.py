"""``model=local model.path=DIR``: a Hugging Face checkpoint of the kind users bring (a byte-level
BPE tokenizer with no pad token and no bid tokens, bfloat16 by the preset), built here in process
since nothing can be downloaded, trained by the real CLI and evaluated from its run folder."""
import json

import pytest
import torch

from conftest import TINY_RUN, swarm


@pytest.fixture(scope="module")
def local_checkpoint(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("pretrained") / "ckpt"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    text = ["you are Logger . goal wooden_pickaxe . inventory : none . action :", "chop tree craft planks stick",
            "mine stone smelt iron explore", "bid : 0.2 0.4 0.6 0.8", "The next action is turn left 30 degree."]
    bpe.train_from_iterator(text * 40, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    assert tok.pad_token is None and "<bid_0.2>" not in tok.get_vocab()
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    Qwen2ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_a_local_bpe_checkpoint_trains_and_evaluates(local_checkpoint, tmp_path):
    run = tmp_path / "run"
    args = [a for a in TINY_RUN if not a.startswith(("algo.sft.", "algo.iterations"))]
    res = swarm("run", *args, "model=local", f"model.path={local_checkpoint}", "algo.sft.demo_episodes=4",
                "algo.sft.epochs=6", "algo.iterations=1", f"run_dir={run}", cwd=tmp_path)
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
    res = swarm("eval", str(run), "eval.runs=1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "reward" in res.stdout
