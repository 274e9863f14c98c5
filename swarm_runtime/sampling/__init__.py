"""Samplers and learners: who draws the swarm's bids and actions (in process, an OpenAI-compatible server, vLLM), adapter sync and the sampler-learner mismatch."""
