"""Built-in domain: vln_ce (VLN-CE R2R-style navigation; Turner / Mover / Stopper)."""
