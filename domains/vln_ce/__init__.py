"""Built-in domain: vln_ce."""
