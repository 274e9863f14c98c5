"""Evaluation: held-out evaluation with standard errors, dropout masks, pass@k and participation."""
