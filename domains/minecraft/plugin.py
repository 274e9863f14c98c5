"""Plugin entry point of the minecraft domain (placeholder until the domain lands)."""
