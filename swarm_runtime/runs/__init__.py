"""A run: its context (the swarm and shared services), its folder and resume, checkpoints, outputs, provenance and lock."""
