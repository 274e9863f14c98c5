"""Prompts as chat messages for a tokenizer with a chat template (``model.chat_template=auto``).

A domain's prompt opens with the role card, ``you are ROLE .`` (``swarm_runtime/core/domain.py``), followed by the
observation, the public log and the cue (``bid :`` / ``action :``). An instruct model gets the card as the system
message and the rest as the user turn, then the template's generation prompt. Every sampler (in process, ``openai``,
``vllm``) sends the token ids of :meth:`TransformersPolicy.encode_prompt`, and the served workers' chat completions
template their messages with :func:`template_ids` too, so all of them prompt a model the same way.
"""

from __future__ import annotations

import re

from loguru import logger

#: The role card at the start of a prompt, and the rest.
ROLE_CARD = re.compile(r"^\s*(you are \S+ \.)\s+(\S.*)$", re.S)


def chat_messages(prompt: str) -> list[dict]:
    """``prompt`` as chat messages: its role card as the system message and the rest as the user turn; a prompt
    without a card (the monolithic model's) as one user turn."""
    m = ROLE_CARD.match(prompt)
    if m is None:
        return [{"role": "user", "content": prompt}]
    return [{"role": "system", "content": m.group(1)}, {"role": "user", "content": m.group(2)}]


def template_ids(tok, messages: list[dict]) -> list[int]:
    """``messages`` through ``tok``'s chat template with the generation prompt, as token ids (the template places
    its own special tokens)."""
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(enc["input_ids"])


def prompt_ids(tok, prompt: str) -> list[int]:
    """A domain prompt through ``tok``'s chat template (:func:`chat_messages`). A template that refuses a system
    message (some accept only user and assistant turns) gets the whole prompt as one user turn, logged once per
    tokenizer."""
    messages = chat_messages(prompt)
    if len(messages) == 1 or getattr(tok, "_swarm_no_system", False):
        return template_ids(tok, [{"role": "user", "content": prompt}])
    try:
        return template_ids(tok, messages)
    except Exception as exc:  # jinja's TemplateError, or the template's own raise_exception
        tok._swarm_no_system = True
        logger.warning(
            "the chat template refused a system message ({}); prompts go in as one user turn, role card included",
            (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120],
        )
        return template_ids(tok, [{"role": "user", "content": prompt}])
