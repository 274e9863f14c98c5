"""The bid tokens added to a pretrained vocabulary get rows of their own (models/transformers_backend.py
``distinct_new_rows``): transformers' mean resizing drew them alike to 1e-5, so on a frozen base with tied
embeddings every bid level had the same logit and ``logits``-mode bids were uniform whatever the adapters learned
(docs/guides/pretrained.md, "How an instruct model is prompted")."""

import itertools
import json

import pytest
import torch
from conftest import make_local_checkpoint

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.models.transformers_backend import bid_token, load_pretrained

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


def _rows(model, tok):
    ids = [tok.convert_tokens_to_ids(bid_token(b)) for b in LEVELS]
    assert len(set(ids)) == len(LEVELS) and min(ids) >= len(tok) - len(LEVELS)  # the added tokens, not unk
    return model.get_input_embeddings().weight[ids].detach().clone(), model.get_output_embeddings().weight[ids]


@pytest.mark.parametrize("tied", [True, False])
def test_added_bid_rows_are_distinct_seeded_and_in_the_vocabularys_range(tmp_path, tied):
    folder = make_local_checkpoint(tmp_path / "ckpt")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": tied}))
    model, tok = load_pretrained(folder, LEVELS, seeded_resize=True)
    inp, out = _rows(model, tok)
    old = model.get_input_embeddings().weight[: len(tok) - len(LEVELS)]
    spread = (old[:-1] - old[1:]).abs().max(-1).values.median()  # how far apart two ordinary tokens' rows are
    for rows in (inp, out):
        for i, j in itertools.combinations(range(len(LEVELS)), 2):
            assert (rows[i] - rows[j]).abs().max() > spread / 40, (i, j)  # BID_ROW_SCALE = 0.1 of the spread
        assert rows.norm(dim=-1).max() < 3 * old.norm(dim=-1).max()
    if not tied:
        assert not torch.equal(inp, out)
    again, _ = load_pretrained(folder, LEVELS, seeded_resize=True)
    assert torch.equal(_rows(again, tok)[0], inp)  # the same frozen base at every load
    # and a frozen model's bid levels get different logits: bids are not a uniform draw
    ids = torch.tensor([tok.encode("you are Logger . bid :")])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1, [tok.convert_tokens_to_ids(bid_token(b)) for b in LEVELS]]
    assert logits.std() > 1e-3, logits


def test_an_adapter_trained_on_alike_bid_rows_is_refused(tmp_path):
    from swarm_runtime.models.adapters import POINTER, check_adapter_base, fingerprint

    base = make_local_checkpoint(tmp_path / "base")
    adapter = tmp_path / "Logger"
    adapter.mkdir()
    ptr = {"base": str(base), "fingerprint": fingerprint(base), "trained_base": False, "arch": {}}
    (adapter / POINTER).write_text(json.dumps(ptr))  # written before bid_rows existed
    with pytest.raises(ConfigError, match="bid-token rows drawn otherwise .bid_rows None, now 3.*train it again"):
        check_adapter_base(adapter)
    (adapter / POINTER).write_text(json.dumps({**ptr, "bid_rows": 2}))
    with pytest.raises(ConfigError, match="bid_rows 2, now 3"):
        check_adapter_base(adapter)
    (adapter / POINTER).write_text(json.dumps({**ptr, "bid_rows": 3}))
    assert check_adapter_base(adapter)[1] == base
