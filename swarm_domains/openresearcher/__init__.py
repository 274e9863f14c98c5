"""Built-in domain: openresearcher."""
