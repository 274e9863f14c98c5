"""Common random numbers: sampling noise keyed by *where* it is used, not by call order.

With one generator per policy, a draw depends on everything sampled before it in
the batch, so a counterfactual branch and its original episode see unrelated noise
from the branch point on, and their score difference is mostly that noise. Keyed
noise gives every draw its own Gumbel vector, a pure function of ``(episode noise
id, turn, agent, kind, token position)``, and picks ``argmax(logits / T + gumbel)``
(the Gumbel-max trick: an exact sample of ``softmax(logits / T)``). Two rollouts
that share a noise id then make the same choice wherever their distributions are
close, whatever the vocabulary order: the Gumbel-max structural causal model of
Oberst & Sontag (2019) for counterfactual trajectories.

Measured (``benchmarks/branch_noise.py``, docs/benchmarks.md): on VLN-CE and
Minecraft the continuations drift apart after the forced decision and the
pairs are not measurably less noisy; evaluations paired this way are tighter.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1


#: the ``kind`` part of a key: a bid, an action (or proposal), the coordinator's tie-breaking
BID, ACTION, COORDINATOR = 0, 1, 2


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def key_hash(*parts: int) -> int:
    """A 64-bit hash of a tuple of integers (order matters); equal tuples, equal hashes."""
    h = 0x243F6A8885A308D3
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _MASK))
    return h
