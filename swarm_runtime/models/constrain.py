"""Constrained action decoding: sample only among the action texts a role may emit.

A domain whose roles have a finite action space lists it (``Domain.action_choices``);
with ``model.constrained_actions=true`` each role's model then samples its action
token by token from the next-token distribution restricted to the continuations of
its listed texts (a prefix tree over their token ids), as vLLM's guided ``choice``
decoding does. Tokens every choice shares ("The next action is") are forced and
carry no gradient; the policy's probability of a text is its probability among the
valid texts, so REINFORCE and the KL charge score actions under the same mask
(``logprobs(..., actions=True)``) and no probability can drift to invalid text.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ActionTrie:
    """Prefix tree over the token-id sequences of the valid action texts (each ends in EOS).

    Node 0 is the root. ``allowed[node]`` is a ``(vocab,)`` bool row of the tokens that may
    follow; a leaf (after EOS) allows only EOS, so a finished row in a batch never has an
    empty distribution, but :meth:`walk` rejects any token after a leaf.
    """

    def __init__(
        self,
        texts: Sequence[str],
        sequences: Sequence[Sequence[int]],
        vocab_size: int,
        eos: int,
        invalid: Sequence[int] = (),
    ):
        if not texts:
            raise ValueError("action choices are empty; list at least one action text")
        self.texts = list(texts)
        bad = set(int(t) for t in invalid)
        self.child: dict[tuple[int, int], int] = {}
        n_nodes = 1
        for text, seq in zip(texts, sequences):
            seq = [int(t) for t in seq]
            if not seq or seq[-1] != eos:
                raise ValueError(f"action choice {text!r} does not end in the end-of-sequence token")
            if bad & set(seq) or any(not 0 <= t < vocab_size for t in seq):
                raise ValueError(
                    f"action choice {text!r} has words the tokenizer does not know "
                    "(add them to the domain's vocabulary)"
                )
            node = 0
            for t in seq:
                nxt = self.child.get((node, t))
                if nxt is None:
                    nxt = self.child[(node, t)] = n_nodes
                    n_nodes += 1
                node = nxt
        self._inner = {node for node, _ in self.child}
        self.longest = max(len(s) for s in sequences)
        self.allowed = torch.zeros((n_nodes, vocab_size), dtype=torch.bool)
        for node, t in self.child:
            self.allowed[node, t] = True
        leaves = ~self.allowed.any(dim=1)
        self.allowed[leaves, eos] = True

    def step(self, node: int, token: int) -> int:
        """The node after ``token``; the leaf stays a leaf (a finished row keeps padding)."""
        return self.child.get((node, int(token)), node)

    def walk(self, tokens: Sequence[int], decode=None) -> list[int]:
        """The node before each of ``tokens`` (the rows of :attr:`allowed` that scored them).

        Raises ``ValueError`` naming the text and the valid ones when ``tokens`` is not one
        of the choices (an action sampled without the constraint, or a foreign response)."""
        nodes, node = [], 0
        for t in tokens:
            nodes.append(node)
            nxt = self.child.get((node, int(t)))
            if nxt is None:
                break
            node = nxt
        else:
            if tokens and node not in self._inner:
                return nodes
        shown = decode(list(tokens)) if decode else list(tokens)
        raise ValueError(
            f"action {shown!r} is not one of the role's action choices "
            f"({', '.join(repr(t) for t in self.texts)}); it was not sampled under "
            "model.constrained_actions=true"
        )
