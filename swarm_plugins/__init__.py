"""Cross-cutting plugins that ship with swarm-runtime and use only the public hooks
(:mod:`swarm_runtime.plugins.hookspecs`), exactly as a third-party package would.

- :mod:`swarm_plugins.wandb_observer`: a Weights & Biases logger on the observer hooks
  (``pip install 'swarm-runtime[wandb]'``; inert unless ``SWARM_WANDB`` is set).

A domain plugin example lives in ``tests/test_third_party_plugin.py`` and docs/reference/plugins.md (section 6).
"""
