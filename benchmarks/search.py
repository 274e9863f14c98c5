"""Search latency and index build time of the openresearcher BM25 backends.

    python benchmarks/search.py [--sizes 10000 100000] [--queries 200] [--backends rank_bm25 sparse]

Corpora are generated (Zipf-distributed random words, ~150 words a document,
see ``swarm_domains.openresearcher.corpus.synthetic_corpus``); queries are 3 words
drawn from random documents. Prints, per corpus size and backend: build time
(tokenise + index + write the cache), cache load time, and query latency
(median, p95), then the rank_bm25 / sparse ratio of the medians measured in
this one run (the machine is shared and noisy: compare ratios, not absolutes).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loguru import logger  # noqa: E402

from swarm_domains.openresearcher.corpus import synthetic_corpus  # noqa: E402
from swarm_domains.openresearcher.search import build_index, tokenize  # noqa: E402


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def bench(n_docs: int, backends: list[str], n_queries: int, seed: int = 0) -> dict[str, float]:
    t0 = time.perf_counter()
    corpus = synthetic_corpus(n_docs, seed=seed)
    gen_s = time.perf_counter() - t0
    rng = random.Random(seed)
    queries = []
    for _ in range(n_queries):
        words = tokenize(corpus.docs[rng.randrange(n_docs)].text)
        queries.append(" ".join(rng.sample(words, 3)))
    print(f"\n{n_docs} documents (generated in {gen_s:.1f}s), {n_queries} queries of 3 words")
    print(f"{'backend':<10} {'build s':>8} {'load s':>8} {'median ms':>10} {'p95 ms':>8}")
    medians = {}
    with tempfile.TemporaryDirectory() as cache:
        for backend in backends:
            t0 = time.perf_counter()
            index = build_index(corpus, backend, cache)
            build_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            index = build_index(corpus, backend, cache)
            load_s = time.perf_counter() - t0
            assert index.loaded_from_cache
            index.search(queries[0], 10)  # warm up
            lat = []
            for q in queries:
                t0 = time.perf_counter()
                index.search(q, 10)
                lat.append((time.perf_counter() - t0) * 1000)
            medians[backend] = statistics.median(lat)
            print(f"{backend:<10} {build_s:>8.2f} {load_s:>8.2f} {medians[backend]:>10.2f} {percentile(lat, 95):>8.2f}")
            del index
    if {"rank_bm25", "sparse"} <= set(medians):
        print(f"median latency ratio rank_bm25 / sparse: {medians['rank_bm25'] / medians['sparse']:.0f}x")
    return medians


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--backends", nargs="+", default=["rank_bm25", "sparse"])
    args = ap.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    for n in args.sizes:
        bench(n, args.backends, args.queries)


if __name__ == "__main__":
    main()
