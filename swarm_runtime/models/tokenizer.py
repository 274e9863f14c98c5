"""A word-level tokenizer made in process from a domain's vocabulary (no download).

Words are split on whitespace and punctuation, digits one by one; bid levels
are single added tokens such as ``<bid_0.4>`` so a bid is one next-token choice.
The result is a ``transformers.PreTrainedTokenizerFast`` that saves and loads
with ``save_pretrained`` / ``from_pretrained`` like any Hugging Face tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from swarm_runtime.models.bids import bid_token

SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]
_WORD = re.compile(r"\w+|[^\w\s]+")


def split_words(text: str) -> list[str]:
    """The pre-tokenizer's view of ``text`` (digits split one by one)."""
    out: list[str] = []
    for w in _WORD.findall(text):
        out.extend(list(w) if w.isdigit() else [w])
    return out


def build_tokenizer(vocabulary: Iterable[str], bid_levels: Sequence[float]):
    """Build the tokenizer from ``vocabulary`` (words or phrases) plus digits,
    common punctuation and one token per bid level."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words: dict[str, None] = {}
    for phrase in list(vocabulary) + list("0123456789") + [".", ",", ":", ";", "?", "!", "(", ")", "-", "'", '"']:
        for w in split_words(str(phrase)):
            words.setdefault(w, None)
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for w in words:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )
    fast.add_tokens([bid_token(b) for b in bid_levels], special_tokens=True)
    fast.padding_side = "left"
    return fast


def unknown_words(tokenizer, text: str) -> list[str]:
    """Words of ``text`` the tokenizer maps to ``<unk>`` (used by the conformance kit)."""
    return [w for w in split_words(text) if tokenizer.convert_tokens_to_ids(w) == tokenizer.unk_token_id]
