"""Configuration: the error a bad setting raises, the schema, loading and merging, and every rule and cross-key check."""
