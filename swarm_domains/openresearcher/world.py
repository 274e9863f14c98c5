"""The shared, read-only part of every env of a task: corpus, search index,
question splits and judge, built once per process per task config."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from swarm_domains.openresearcher.corpus import Corpus, Question, load_corpus, load_questions, split_questions
from swarm_domains.openresearcher.judge import make_judge
from swarm_domains.openresearcher.search import build_index

SOURCES = ("embedded", "local")


@dataclass
class World:
    corpus: Corpus
    index: Any
    train: list[Question]
    eval: list[Question]
    judge: Any
    eval_start: int
    eval_count: int
    dev: list[Question] = field(default_factory=list)  #: tuning questions, disjoint from train and eval
    dev_start: int = 0
    dev_count: int = 0

    def __deepcopy__(self, memo: dict) -> World:
        return self  # shared by every env and snapshot

    def question_for(self, seed: int) -> Question:
        """Seeds in ``eval_seeds`` pick held-out questions, seeds in ``dev_seeds`` dev (tuning) questions,
        every other seed a training one."""
        if self.eval_start <= seed < self.eval_start + self.eval_count:
            return self.eval[(seed - self.eval_start) % len(self.eval)]
        if self.dev and self.dev_start <= seed < self.dev_start + self.dev_count:
            return self.dev[(seed - self.dev_start) % len(self.dev)]
        return self.train[seed % len(self.train)]


_WORLDS: dict[str, World] = {}
#: task keys the world depends on (others, e.g. max_decisions, share one world)
_WORLD_KEYS = (
    "source",
    "seed",
    "sizes",
    "eval_questions",
    "corpus_path",
    "questions_path",
    "search",
    "judge",
    "exact_judge",
    "llm_judge",
    "browser",
    "eval_seeds",
    "dev_seeds",
)


def _plain(cfg) -> dict:
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def get_world(task) -> World:
    """The :class:`World` of ``task`` (memoised by the task's settings)."""
    cfg = {k: v for k, v in _plain(task).items() if k in _WORLD_KEYS}
    key = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()
    if key not in _WORLDS:
        _WORLDS[key] = _build(cfg)
    return _WORLDS[key]


def _need(cfg: dict, key: str) -> Any:
    v = cfg.get(key)
    if v in (None, "", "???"):
        raise ValueError(
            f"openresearcher task with source=local needs {key}: pass task.{key}=/path/to/file (.parquet or .jsonl)"
        )
    return v


def _build(cfg: dict) -> World:
    source = cfg.get("source", "embedded")
    if source not in SOURCES:
        raise ValueError(f"unknown openresearcher source {source!r}; valid: {', '.join(SOURCES)}")
    browser = cfg.get("browser") or {}
    width = int(browser.get("line_width", 80))
    n_eval = int(cfg.get("eval_questions", 50))
    dev_spec = cfg.get("dev_seeds") or {"start": 0, "count": 0}
    n_dev = int(dev_spec["count"])
    if source == "embedded":
        from swarm_domains.openresearcher.encyclopedia import Encyclopedia

        enc = Encyclopedia(
            seed=int(cfg.get("seed", 0)), sizes=cfg.get("sizes"), eval_questions=n_eval, dev_questions=n_dev
        )
        corpus, train, ev, dev = enc.corpus, enc.train_questions, enc.eval_questions, enc.dev_questions
    else:
        corpus = load_corpus(_need(cfg, "corpus_path"), line_width=width)
        train, ev = split_questions(load_questions(_need(cfg, "questions_path")), n_eval, int(cfg.get("seed", 0)))
        dev = []
        if n_dev:  # a real question file has no spare questions: dev comes out of the training ones
            train, dev = split_questions(train, n_dev, int(cfg.get("seed", 0)) + 1)
    search = dict(cfg.get("search") or {})
    unknown = sorted(set(search) - {"backend", "cache_dir", "k1", "b", "epsilon", "topn"})
    if unknown:
        raise ValueError(f"unknown search key(s) {unknown}; valid: backend, cache_dir, k1, b, epsilon, topn")
    index = build_index(
        corpus,
        backend=search.get("backend", "rank_bm25"),
        cache_dir=search.get("cache_dir"),
        k1=float(search.get("k1", 1.5)),
        b=float(search.get("b", 0.75)),
        epsilon=float(search.get("epsilon", 0.25)),
    )
    judge = make_judge(str(cfg.get("judge", "exact")), cfg.get("exact_judge"), cfg.get("llm_judge"))
    spec = cfg.get("eval_seeds") or {"start": 1_000_000, "count": len(ev)}
    logger.info(
        "openresearcher world: {} docs, {} train / {} eval / {} dev questions, search={}, judge={}",
        len(corpus),
        len(train),
        len(ev),
        len(dev),
        index.backend,
        judge.name,
    )
    return World(
        corpus, index, train, ev, judge, int(spec["start"]), int(spec["count"]), dev, int(dev_spec["start"]), n_dev
    )


def corpus_words(world: World, limit: int) -> list[str]:
    """The ``limit`` most frequent words of a real corpus and every word of its questions."""
    from swarm_runtime.models.tokenizer import split_words

    counts: Counter = Counter()
    for i in range(len(world.corpus)):
        counts.update(split_words(world.corpus.search_text(i)))
    words = [w for w, _ in counts.most_common(limit)]
    for q in world.train + world.eval + world.dev:
        words.extend(split_words(q.question))
    return list(dict.fromkeys(words))
