"""Plugin entry point of the openresearcher domain (placeholder until the domain lands)."""
