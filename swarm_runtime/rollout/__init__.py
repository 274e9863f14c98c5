"""Samplers and learners: who draws the swarm's bids and actions, and who trains the weights
(docs/engine.md).

A :class:`~swarm_runtime.rollout.base.Sampler` answers bid and action requests for a batch of
(model, prompt) rows; every response carries its tokens, the sampler's per-token log-probabilities and
the weight version that produced it. A :class:`~swarm_runtime.rollout.base.Learner` holds the trainable
weights and exports a version of each model after an update, which the sampler then loads
(:meth:`Sampler.sync`). ``rollout.engine=local`` samples in process from the learner's own modules
(:class:`~swarm_runtime.rollout.local.LocalSampler`); ``openai`` / ``vllm`` sample on an inference server.
"""

from swarm_runtime.rollout.base import Learner, Row, Sampler  # noqa: F401
