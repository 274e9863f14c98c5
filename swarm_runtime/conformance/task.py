"""Conformance of a domain's tasks: seed splits, fresh task configs and prompts that fit the model."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from swarm_runtime.conformance.probe import (
    DEFAULT_MAX_PROMPT_TOKENS,
    EXPERT_LED,
    GARBAGE,
    KIT_WORDS,
    MOSTLY_RANDOM,
    Mix,
    Probe,
    Where,
    action_pool,
    choose,
    load_task,
    role_names,
    shorten,
    task_label,
)
from swarm_runtime.core.domain import SPLITS, Domain, Event
from swarm_runtime.models.tokenizer import build_tokenizer, split_words, unknown_words


def check_splits(domain: Domain, task: str | DictConfig) -> None:
    """train, dev (when the task defines one) and eval seeds are disjoint; and, when the domain
    defines ``instances(task, seeds)`` (what each seed picks: a question, a layout; hashables, one
    per seed), so are the instances the splits' seeds pick (distinct seeds may pick one instance,
    e.g. a question pool indexed by ``seed % len``)."""
    cfg = load_task(domain, task)
    name = task_label(task)
    got = {}
    for split in SPLITS:
        try:
            got[split] = set(domain.episode_seeds(cfg, split))
        except ValueError:
            if split != "dev":
                raise
    for i, a in enumerate(got):
        for b in list(got)[i + 1 :]:
            both = got[a] & got[b]
            if both:
                Where(domain.name, name).fail(
                    f"{a} and {b} seeds overlap ({len(both)} shared, e.g. {sorted(both)[:5]}); tuning on dev or "
                    "training on held-out worlds would leak into the reported numbers"
                )
    instances = getattr(domain, "instances", None)
    if not callable(instances):
        return
    picked: dict[str, dict[Any, int]] = {}
    for split, seeds in got.items():
        picked[split] = {}
        order = sorted(seeds)
        for seed, inst in zip(order, instances(cfg, order)):
            picked[split].setdefault(inst, seed)
    for i, a in enumerate(picked):
        for b in list(picked)[i + 1 :]:
            both = picked[a].keys() & picked[b].keys()
            if both:
                inst = sorted(both, key=repr)[0]
                Where(domain.name, name, picked[b][inst]).fail(
                    f"{a} and {b} seeds pick the same instances ({len(both)} shared, e.g. {shorten(inst)} by {a} seed "
                    f"{picked[a][inst]} and {b} seed {picked[b][inst]}); the seeds are disjoint but what they "
                    "pick is not"
                )


def check_fresh_task_config(domain: Domain, task: str | DictConfig) -> None:
    """Each ``task_config()`` (what ``resolve()`` starts from) is a fresh object: a run that edits
    its config (``task.max_decisions=...``) must not leak into the next run."""
    if not isinstance(task, str):
        return
    w = Where(domain.name, task)
    a = w.call("task_config()", domain.task_config, task)
    b = w.call("task_config()", domain.task_config, task)
    if a is b:
        w.fail("task_config() returned the same object twice (configs must be fresh per call)")
    a.max_decisions = -12345
    if int(domain.task_config(task).max_decisions) == -12345:
        w.fail("editing one task_config() changed the next one (it shares a cached config)")


def max_prompt_tokens(cfg: DictConfig) -> int:
    """``model.max_prompt_tokens`` a run of this task gets unless the command line sets it: the task's
    ``overrides: {model: {max_prompt_tokens: N}}``, else the default (:data:`DEFAULT_MAX_PROMPT_TOKENS`)."""
    over = cfg.get("overrides") or {}
    model = over.get("model") if hasattr(over, "get") else None
    n = model.get("max_prompt_tokens") if model is not None and hasattr(model, "get") else None
    return int(n) if n is not None else DEFAULT_MAX_PROMPT_TOKENS


def prompt_problem(
    tok, text: str, limit: int, ids: list[int] | None = None, vocab: set[str] | None = None
) -> str | None:
    """What is wrong with a prompt for the in-process word-level tokenizer ``tok``: empty, words
    missing from the vocabulary (the kit's own garbage words aside), or longer than ``limit`` tokens
    (the beginning of sequence included), as the policy would encode it; ``None`` when it is fine.
    ``ids``: the prompt's token ids when already encoded (a batch); ``vocab``: ``set(tok.get_vocab())``."""
    if not (isinstance(text, str) and text.strip()):
        return f"the prompt is empty ({text!r})"
    if ids is None:
        ids = tok(text, add_special_tokens=False).input_ids
    if tok.unk_token_id in ids:
        words = {w for w in split_words(text) if w not in vocab} if vocab is not None else set(unknown_words(tok, text))
        unk = sorted(words - KIT_WORDS)
        if unk:
            return f"prompt words missing from vocabulary(): {unk[:10]} in {shorten(text)}"
    n = len(ids) + 1
    if n > limit:
        return (
            f"the prompt is {n} tokens long (beginning of sequence included), more than model.max_prompt_tokens="
            f"{limit}: the policy refuses it at run time (SWARM_PROMPT_OVERFLOW=warn would cut it from the left, "
            f"losing its opening {shorten(' '.join(text.split()[:6]))}); shorten the observation or log_window, "
            "or raise max_prompt_tokens in the task's overrides"
        )
    return None


def model_field(model: Any, key: str) -> Any:
    """``model[key]`` of a run's ``model`` section (a mapping or a config), None when absent."""
    if model is None:
        return None
    return model.get(key) if hasattr(model, "get") else getattr(model, key, None)


def run_tokenizer(path: str | Path):
    """The tokenizer a run with ``model.path=path`` encodes prompts with, loaded as the run loads it
    (swarm_runtime/models/transformers_backend.py, ``load_pretrained``): the in-process word-level one a swarm
    checkpoint saved, else the checkpoint's own (``AutoTokenizer``, no code of the checkpoint run)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from swarm_runtime.models.transformers_backend import refuse_custom_code

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model.path {str(path)!r} has no config.json: not a Hugging Face checkpoint")
    refuse_custom_code(path)
    meta = path / "swarm_policy.json"
    if meta.exists() and json.loads(meta.read_text()).get("word_level_tokenizer"):
        return PreTrainedTokenizerFast.from_pretrained(path, trust_remote_code=False)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def run_prompt_length(model: Any) -> Callable[[str], int] | None:
    """How a run with ``model`` (its ``model`` section: ``path``, ``chat_template``) counts a prompt's tokens, when
    not with the in-process word-level tokenizer: with ``model.path``, that checkpoint's tokenizer
    (:func:`run_tokenizer`), the prompt one user turn of its chat template under ``model.chat_template=auto`` (the
    template's own special tokens), else its tokens and the beginning of sequence when the tokenizer has one, as
    ``TransformersPolicy.encode_prompt`` (swarm_runtime/models/transformers_backend.py) encodes it. None without
    ``model.path``."""
    path = model_field(model, "path")
    if not path:
        return None
    tok = run_tokenizer(path)
    templated = str(model_field(model, "chat_template") or "none") == "auto" and bool(
        getattr(tok, "chat_template", None)
    )
    bos = 1 if tok.bos_token_id is not None else 0

    def length(text: str) -> int:
        if templated:
            turn = [{"role": "user", "content": text}]
            return len(
                tok.apply_chat_template(turn, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
            )
        return len(tok(text, add_special_tokens=False).input_ids) + bos

    return length


def check_prompts(
    domain: Domain,
    task: str | DictConfig,
    trajectories=((0, EXPERT_LED), (2, MOSTLY_RANDOM)),
    bid_levels=(0, 0.2, 0.4, 0.6, 0.8),
    max_tokens: int | None = None,
    model: Any = None,
) -> int:
    """At every step of each ``(seed, mix)`` trajectory, the observation and every prompt the core
    would build from it (bid and action prompt of every role, the single model's prompt, with the log
    so far) use only vocabulary words and fit ``max_tokens`` (default: ``model.max_prompt_tokens`` of ``model``,
    else :func:`max_prompt_tokens` of the task). ``model``: a run's ``model`` section (``resolve(...).model``, or a
    mapping of ``path``, ``max_prompt_tokens``, ``chat_template``): with ``model.path``, the prompts are measured
    with that checkpoint's tokenizer, as the run measures them (:func:`run_prompt_length`). Returns the prompts
    checked."""
    cfg = load_task(domain, task)
    name = task_label(task)
    tok = build_tokenizer(domain.all_words(cfg), bid_levels)
    limit = int(max_tokens or model_field(model, "max_prompt_tokens") or max_prompt_tokens(cfg))
    run_length = run_prompt_length(model)
    roles = role_names(domain)
    checked = 0
    for m, (seed, mix) in enumerate(trajectories):
        mix = Mix(*mix)
        pool = action_pool(domain, cfg, int(seed), name)
        p = Probe(domain, cfg, name)
        obs = p.reset(int(seed))
        rng = random.Random(3000 + 1000 * m + int(seed))
        log: list[Event] = []
        last: tuple[str | None, str | None] = (None, None)
        shown: list[tuple[int, str | None, str | None, str, str]] = []  # (step, action, role, what, text)
        for t in range(int(cfg.max_decisions) + 1):
            w = p.w.at(t, *last)
            shown.append((t, *last, "the observation", obs))
            shown.append((t, *last, "the single prompt", w.call("single_prompt()", domain.single_prompt, obs, log)))
            for role in roles:
                shown.append(
                    (t, *last, f"{role}'s bid prompt", w.call("bid_prompt()", domain.bid_prompt, role, obs, log))
                )
                shown.append(
                    (
                        t,
                        *last,
                        f"{role}'s action prompt",
                        w.call("action_prompt()", domain.action_prompt, role, obs, log),
                    )
                )
            if p.done or t == int(cfg.max_decisions):
                break
            action, role = choose(p, rng, roles, pool, mix, garbage=(GARBAGE,))
            res = p.step(action, role, bounds=False)
            log.append(Event(t, role if role is not None else "you", action, bool(res.valid), float(res.reward)))
            obs, last = res.observation, (action, role)
        texts = [x[4] if isinstance(x[4], str) else "" for x in shown]
        vocab = set(tok.get_vocab())
        for (t, action, role, what, text), ids in zip(shown, tok(texts, add_special_tokens=False).input_ids):
            word_limit = (1 << 30) if what == "the observation" or run_length is not None else limit
            bad = prompt_problem(tok, text, word_limit, ids, vocab)
            if bad is None and run_length is not None and what != "the observation":
                bad = run_overflow(run_length(text), limit, model_field(model, "path"), text)
            if bad:
                p.w.at(t, action, role).fail(f"{what}: {bad}")
            checked += what != "the observation"
    return checked


def run_overflow(n: int, limit: int, path: str, text: str) -> str | None:
    """A prompt of ``n`` tokens with the tokenizer of ``model.path=path`` over ``limit``, in words; None when it fits."""
    if n <= limit:
        return None
    return (
        f"the prompt is {n} tokens long with the run's tokenizer (model.path={str(path)!r}), more than "
        f"model.max_prompt_tokens={limit}: the run stops on it (PromptOverflowError; it begins "
        f"{shorten(' '.join(text.split()[:6]))}); shorten the observation or log_window, or raise "
        "model.max_prompt_tokens (and model.max_positions)"
    )
