"""BM25 search over a :class:`~swarm_domains.openresearcher.corpus.Corpus`, cached on disk.

Two backends behind one interface (:class:`SearchIndex`), with identical scores
(BM25Okapi: ``k1``, ``b`` and rank-bm25's idf floor ``epsilon * mean idf``):

- ``rank_bm25``: the `rank-bm25` package (a Python loop over every document per
  query term: fine for thousands of documents, slow for 100k);
- ``sparse``: our own inverted index in numpy arrays (per term: the documents
  that hold it and their precomputed BM25 weights), so a query touches only
  the postings of its terms.

:func:`build_index` builds an index once and caches it under
``<cache_dir>/<key>/`` where ``key`` hashes the corpus content, the backend and
its parameters: a changed corpus gets a new key (the old entry is never read).
Cache files are JSON and ``.npy`` arrays (no pickle); writes are atomic.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Protocol

import numpy as np
from loguru import logger

from swarm_domains.openresearcher.corpus import Corpus

BACKENDS = ("rank_bm25", "sparse")
INDEX_VERSION = 1
_TOKEN = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens (the same for documents and queries)."""
    return _TOKEN.findall(text.lower())


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/swarm-runtime/bm25`` (``~/.cache/swarm-runtime/bm25``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "swarm-runtime" / "bm25"


class SearchIndex(Protocol):
    """What the browser needs from a search backend."""

    backend: str
    loaded_from_cache: bool

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query``."""

    def hits(self, query: str) -> np.ndarray:
        """Boolean mask of the documents that hold at least one word of ``query``."""

    def search(self, query: str, topn: int) -> list[tuple[int, float]]:
        """Top ``topn`` (document index, score) pairs among the documents holding
        a query word, best first, ties by index."""


def _top(scores: np.ndarray, hits: np.ndarray, topn: int) -> list[tuple[int, float]]:
    cand = np.flatnonzero(hits)
    if topn <= 0 or cand.size == 0:
        return []
    k = min(topn, cand.size)
    if k < cand.size:
        # keep every candidate tied with the k-th best score so ties break by index, deterministically
        kth = np.partition(scores[cand], cand.size - k)[cand.size - k]
        cand = cand[scores[cand] >= kth]
    order = cand[np.lexsort((cand, -scores[cand]))][:k]
    return [(int(i), float(scores[i])) for i in order]


class _Base:
    backend = ""
    loaded_from_cache = False

    def __deepcopy__(self, memo: dict):
        return self  # read-only and shared between envs and snapshots

    def search(self, query: str, topn: int) -> list[tuple[int, float]]:
        return _top(self.scores(query), self.hits(query), topn)


class RankBM25Index(_Base):
    """rank-bm25's ``BM25Okapi`` over the tokenised corpus."""

    backend = "rank_bm25"

    def __init__(self, bm25):
        self.bm25 = bm25

    @classmethod
    def build(cls, tokens: list[list[str]], k1: float, b: float, epsilon: float) -> RankBM25Index:
        from rank_bm25 import BM25Okapi

        return cls(BM25Okapi(tokens, k1=k1, b=b, epsilon=epsilon))

    def scores(self, query: str) -> np.ndarray:
        return np.asarray(self.bm25.get_scores(tokenize(query)), dtype=np.float64)

    def hits(self, query: str) -> np.ndarray:
        """Which documents hold at least one query word."""
        words = set(tokenize(query))
        return np.fromiter(
            (not words.isdisjoint(d) for d in self.bm25.doc_freqs), dtype=bool, count=self.bm25.corpus_size
        )

    def save(self, d: Path) -> None:
        m = self.bm25
        state = {
            "k1": m.k1,
            "b": m.b,
            "epsilon": m.epsilon,
            "corpus_size": m.corpus_size,
            "avgdl": m.avgdl,
            "average_idf": m.average_idf,
            "idf": m.idf,
            "doc_len": m.doc_len,
            "doc_freqs": m.doc_freqs,
        }
        (d / "rank_bm25.json").write_text(json.dumps(state))

    @classmethod
    def load(cls, d: Path) -> RankBM25Index:
        from rank_bm25 import BM25Okapi

        state = json.loads((d / "rank_bm25.json").read_text())
        m = BM25Okapi.__new__(BM25Okapi)
        m.tokenizer = None
        for k, v in state.items():
            setattr(m, k, v)
        return cls(m)


class SparseBM25Index(_Base):
    """Inverted index in numpy arrays: ``postings[ptr[t]:ptr[t+1]]`` are the
    documents holding term ``t`` and ``weights`` their BM25 term weights."""

    backend = "sparse"

    def __init__(self, vocab: dict[str, int], ptr: np.ndarray, postings: np.ndarray, weights: np.ndarray, n_docs: int):
        self.vocab, self.ptr, self.postings, self.weights, self.n_docs = vocab, ptr, postings, weights, n_docs

    @classmethod
    def build(cls, tokens: list[list[str]], k1: float, b: float, epsilon: float) -> SparseBM25Index:
        vocab: dict[str, int] = {}
        doc_ids, term_ids, tfs = [], [], []
        doc_len = np.zeros(len(tokens), dtype=np.float64)
        for i, toks in enumerate(tokens):
            doc_len[i] = len(toks)
            counts: dict[int, int] = {}
            for w in toks:
                t = vocab.setdefault(w, len(vocab))
                counts[t] = counts.get(t, 0) + 1
            doc_ids.extend([i] * len(counts))
            term_ids.extend(counts.keys())
            tfs.extend(counts.values())
        n = len(tokens)
        d_arr = np.asarray(doc_ids, dtype=np.int32)
        t_arr = np.asarray(term_ids, dtype=np.int64)
        tf = np.asarray(tfs, dtype=np.float64)
        order = np.lexsort((d_arr, t_arr))  # by term, then document
        d_arr, t_arr, tf = d_arr[order], t_arr[order], tf[order]
        df = np.bincount(t_arr, minlength=len(vocab)).astype(np.float64)
        # rank-bm25's BM25Okapi idf: log((N - df + .5) / (df + .5)), negatives floored at epsilon * mean idf
        idf = np.log(n - df + 0.5) - np.log(df + 0.5)
        mean_idf = float(idf.mean()) if idf.size else 0.0
        idf = np.where(idf < 0, epsilon * mean_idf, idf)
        avgdl = float(doc_len.mean()) if n else 1.0
        norm = k1 * (1 - b + b * doc_len[d_arr] / avgdl)
        weights = idf[t_arr] * tf * (k1 + 1) / (tf + norm)
        ptr = np.zeros(len(vocab) + 1, dtype=np.int64)
        np.cumsum(df.astype(np.int64), out=ptr[1:])
        return cls(vocab, ptr, d_arr, weights, n)

    def scores(self, query: str) -> np.ndarray:
        return self._scores_hits(query)[0]

    def _scores_hits(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros(self.n_docs, dtype=np.float64)
        hit = np.zeros(self.n_docs, dtype=bool)
        for w in tokenize(query):  # a repeated query word counts again, as in rank-bm25
            t = self.vocab.get(w)
            if t is not None:
                lo, hi = self.ptr[t], self.ptr[t + 1]
                docs = self.postings[lo:hi]
                out[docs] += self.weights[lo:hi]  # a document appears once per term
                hit[docs] = True
        return out, hit

    def hits(self, query: str) -> np.ndarray:
        return self._scores_hits(query)[1]

    def search(self, query: str, topn: int) -> list[tuple[int, float]]:
        return _top(*self._scores_hits(query), topn)

    def save(self, d: Path) -> None:
        (d / "vocab.json").write_text(json.dumps(self.vocab))
        np.save(d / "ptr.npy", self.ptr)
        np.save(d / "postings.npy", self.postings)
        np.save(d / "weights.npy", self.weights)
        (d / "sparse.json").write_text(json.dumps({"n_docs": self.n_docs}))

    @classmethod
    def load(cls, d: Path) -> SparseBM25Index:
        vocab = json.loads((d / "vocab.json").read_text())
        n = json.loads((d / "sparse.json").read_text())["n_docs"]
        return cls(vocab, np.load(d / "ptr.npy"), np.load(d / "postings.npy"), np.load(d / "weights.npy"), n)


_CLASSES = {"rank_bm25": RankBM25Index, "sparse": SparseBM25Index}


def cache_key(corpus: Corpus, backend: str, k1: float, b: float, epsilon: float) -> str:
    """Hash of everything an index depends on."""
    spec = f"v{INDEX_VERSION}|{backend}|{k1!r}|{b!r}|{epsilon!r}|{corpus.content_hash()}"
    return hashlib.sha256(spec.encode()).hexdigest()[:24]


def build_index(
    corpus: Corpus,
    backend: str = "rank_bm25",
    cache_dir: str | Path | None = None,
    k1: float = 1.5,
    b: float = 0.75,
    epsilon: float = 0.25,
    use_cache: bool = True,
):
    """The BM25 index of ``corpus``: loaded from ``<cache_dir>/<key>`` when present, else
    built and saved there. ``cache_dir`` ``None`` = :func:`default_cache_dir`.

    :returns: a :class:`SearchIndex`; its ``loaded_from_cache`` tells which happened."""
    if backend not in _CLASSES:
        raise ValueError(f"unknown search backend {backend!r}; valid: {', '.join(BACKENDS)}")
    for name, v, lo, hi in (("k1", k1, 0.0, 10.0), ("b", b, 0.0, 1.0), ("epsilon", epsilon, 0.0, 10.0)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi):
            raise ValueError(f"search.{name}={v!r} must be a number in [{lo}, {hi}]")
    cls = _CLASSES[backend]
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    d = root / cache_key(corpus, backend, k1, b, epsilon)
    if use_cache and (d / "meta.json").is_file():
        try:
            t0 = time.perf_counter()
            idx = cls.load(d)
            idx.loaded_from_cache = True
            logger.debug(
                "bm25 {} index of {} loaded from {} in {:.2f}s", backend, corpus.name, d, time.perf_counter() - t0
            )
            return idx
        except (OSError, ValueError, KeyError) as exc:  # a damaged entry is rebuilt, never fatal
            logger.warning("bm25 cache entry {} unreadable ({}); rebuilding", d, exc)
    t0 = time.perf_counter()
    tokens = [tokenize(corpus.search_text(i)) for i in range(len(corpus))]
    idx = cls.build(tokens, k1, b, epsilon)
    secs = time.perf_counter() - t0
    logger.info("bm25 {} index of {} ({} docs) built in {:.2f}s", backend, corpus.name, len(corpus), secs)
    if use_cache:
        _save_atomically(
            idx,
            d,
            {
                "backend": backend,
                "docs": len(corpus),
                "corpus": corpus.name,
                "corpus_hash": corpus.content_hash(),
                "build_s": round(secs, 3),
            },
        )
    return idx


def _save_atomically(idx, d: Path, meta: dict) -> None:
    d.parent.mkdir(parents=True, exist_ok=True)
    if d.exists():  # a damaged entry (no meta.json) is replaced
        shutil.rmtree(d, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=d.name + ".tmp-", dir=d.parent))
    try:
        idx.save(tmp)
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            os.replace(tmp, d)
        except OSError:  # another process won the race: keep theirs
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
