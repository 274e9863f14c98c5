"""RLCR, collective-reward RL (docs/reference/method.md, section 7; docs/guides/rlcr.md): agent collectives acting
at once against a simulated wall clock, talking through direct messages, a public channel and an archive, organised flat
or under a CEO who hires and fires, trained with one shared policy and one flat collective advantage.

Modules: :mod:`.clock` (event queue, ``T_max`` schedule, latency penalty), :mod:`.messages` (the
communication primitives), :mod:`.org` (flat / CEO), :mod:`.loop` (the concurrent episode loop),
:mod:`.learn` (group baselines, flat advantage, REINFORCE), :mod:`.signs` (signs of life, plots),
:mod:`.trainer` (``algo=rlcr``), :mod:`.experiments` (``swarm experiment rlcr_*``),
:mod:`.conformance` (checks third-party domains call).
"""
