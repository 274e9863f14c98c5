"""Core behaviour registered through the same public hooks a third-party plugin uses:
the auction and round-robin coordinators, the bucket-brigade credit scheme,
the transformers policy backend and the MPT algorithm."""
