"""The folder a keyed vLLM server puts first on its ``PYTHONPATH`` (:class:`~swarm_runtime.sampling.vllm_server.VLLMServer`):
it holds :mod:`swarm_vllm_guard` (stdlib only), imported there by that top-level name through vLLM's
``--middleware``. A folder of its own so that nothing else of swarm_runtime lands on vLLM's path (``rollout/``
holds an ``http.py`` that would shadow the standard library's)."""

from pathlib import Path

#: The folder to put on the vLLM server's ``PYTHONPATH``.
FOLDER = Path(__file__).resolve().parent
#: vLLM's ``--middleware`` value.
MIDDLEWARE = "swarm_vllm_guard.BearerGuard"
