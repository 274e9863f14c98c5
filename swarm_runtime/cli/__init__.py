"""The ``swarm`` command line, one module per command."""
