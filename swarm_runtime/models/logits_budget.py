"""How many full-vocabulary logits one forward pass may hold at once (models/scoring.py scores by it; the memory
plan, models/memory_plan.py, counts by it). Plain Python: the plan is made before torch loads."""

from __future__ import annotations

#: Logits one forward pass may hold at once (fp32: 128 MiB): a padded batch with at most this many
#: (rows x tokens x vocabulary) is scored whole, a larger one position-chunked (models/scoring.py: ``scoring_head``).
LOGITS_BUDGET = 1 << 25


def chunk_positions(vocab: int, budget: int = LOGITS_BUDGET) -> int:
    """Positions per chunk: as many as keep a chunk's logits within ``budget`` (at least one)."""
    return max(1, int(budget) // max(1, int(vocab)))
