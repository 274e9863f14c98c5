"""Built-in domain: minecraft."""
