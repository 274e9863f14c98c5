"""Plugin entry point of the vln_ce domain (placeholder until the domain lands)."""
