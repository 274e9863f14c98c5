"""The SmolLM2 recipes (configs/*smollm2*): each is shipped and listed, resolves as ``swarm run`` resolves it, and
its memory plan, which counts only the logits of the positions scored at once, is within the 6 GiB goal. The
converted folder is stood in for by its config.json (no extra needed): a few seconds in all."""

from __future__ import annotations

import json

import pytest

from swarm_runtime.models import pretrained

RECIPES = [
    "minecraft-smollm2-cpu",
    "minecraft-smollm2-rlcr-cpu",
    "openresearcher-smollm2-cpu",
    "vln_ce-smollm2-cpu",
]
#: SmolLM2-135M-Instruct's config.json, the fields the memory plan reads
SMOLLM2 = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "tie_word_embeddings": True,
}


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    folder = tmp_path / "smollm2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMOLLM2))
    monkeypatch.setattr(pretrained, "ensure", lambda name: folder)
    return folder


@pytest.mark.parametrize("name", RECIPES)
def test_each_smollm2_recipe_is_listed_resolves_and_plans_within_6_gib(registry, stand_in, name):
    from swarm_runtime.cli.recipes import expand_recipe, recipe_names
    from swarm_runtime.config.load import resolve
    from swarm_runtime.models.memory_plan import GiB, make_plan

    assert name in recipe_names()
    _, reg = registry
    cfg = resolve(expand_recipe([f"recipe={name}"]), reg)
    assert cfg.model.path == str(stand_in) and cfg.hardware.gradient_checkpointing
    assert cfg.domain == name.split("-")[0]
    lora = cfg.algo.name == "mpt"
    assert (cfg.model.adapter or "none") == ("lora" if lora else "none")
    plan = make_plan(cfg, 3 if lora else 1, 3)
    rows = dict((what, b) for what, b, _ in plan.rows)
    # the chunked scoring: the logits of at most one chunk (2^25 fp32 values, x3 with the log-softmax and its
    # gradient), not of every position of the update chunk (8 x 268 x 49,157 for the Minecraft recipe: 1.2 GB x 3)
    assert rows["activations"] < 0.6 * GiB  # every position's logits: 1.4 GiB (Minecraft) to 3 GiB (VLN-CE)
    if lora:
        assert plan.total < 6 * GiB


def test_the_plan_scores_a_small_chunk_whole_and_a_large_one_at_its_response_positions():
    from swarm_runtime.models.logits_budget import LOGITS_BUDGET, chunk_positions
    from swarm_runtime.models.memory_plan import scored_positions

    assert scored_positions(4, 50, 12, 1000) == (200, "whole")  # the tiny models: every position, as scored
    assert scored_positions(8, 268, 12, 49157) == (96, "chunked")  # 8 rows x 12 response tokens
    assert scored_positions(512, 268, 12, 49157) == (chunk_positions(49157), "chunked")  # at most one chunk
    assert chunk_positions(49157) * 49157 <= LOGITS_BUDGET
