"""Documents, corpora and question sets of the openresearcher domain, and their loaders.

A :class:`Corpus` is read-only and shared between envs (``copy.deepcopy``
returns the same object), so an env snapshot copies only the browser state.

Document text is *data*: the only markup it may carry is links, written
``[[url|anchor]]`` (our own format) or Markdown ``[anchor](url)``; nothing in a
document is ever executed or followed except by an explicit ``open``.

Real data: a corpus from a local parquet or JSONL file (columns ``docid``,
``url``, ``text``; a ``title`` in an optional front matter block at the top of
``text``) and questions from a local JSONL or parquet file (``qid``,
``question``, ``answer``). pyarrow is imported lazily, only for parquet.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS_COLUMNS = ("docid", "url", "text")
QUESTION_COLUMNS = ("qid", "question", "answer")
#: ``[[url|anchor]]`` (generated corpora) or Markdown ``[anchor](url)`` (real pages).
LINK_RE = re.compile(
    r"\[\[(?P<url>[^\]|]+)\|(?P<anchor>[^\]]+)\]\]"
    r"|\[(?P<md_anchor>[^\[\]]+)\]\((?P<md_url>[^()\s]+)\)"
)
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(?P<body>.*?)\n---[ \t]*(?:\n|\Z)", re.S)


@dataclass(frozen=True)
class Document:
    """One corpus document. ``text`` is the body (front matter removed)."""

    docid: str
    url: str
    title: str
    text: str


@dataclass(frozen=True)
class Question:
    """A question with its reference answer.

    ``hops`` (generated questions only) is the evidence chain the scripted
    expert follows: one dict per hop with ``title`` (the document to read),
    ``query`` (what the expert searches), ``keyword`` (what to ``find`` in it) and ``line`` (the line index of the
    fact in that document's page)."""

    qid: str
    question: str
    answer: str
    hops: tuple = ()


def split_front_matter(text: str) -> tuple[dict[str, str], str]:
    """Parse a ``---``-delimited ``key: value`` block at the top of ``text``.

    :returns: (front matter dict, body). No block: ``({}, text)``."""
    m = _FRONT_MATTER.match(text)
    if not m:
        return {}, text
    meta: dict[str, str] = {}
    for line in m.group("body").splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            meta[k.strip().lower()] = v.strip().strip("\"'")
    return meta, text[m.end() :]


def strip_links(text: str) -> str:
    """Text with every link replaced by its anchor (what BM25 and ``find`` see)."""
    return LINK_RE.sub(lambda m: m.group("anchor") or m.group("md_anchor"), text)


def render_lines(text: str, width: int = 80) -> tuple[list[str], list[str]]:
    """Page lines of a document body: links become ``anchor [ k ]`` and lines are
    wrapped at ``width`` characters (gpt-oss wraps at 80).

    :returns: (lines, link urls in id order)."""
    urls: list[str] = []

    def sub(m: re.Match) -> str:
        urls.append(m.group("url") or m.group("md_url"))
        return f"{m.group('anchor') or m.group('md_anchor')} [ {len(urls) - 1} ]"

    rendered = LINK_RE.sub(sub, text)
    lines: list[str] = []
    for raw in rendered.split("\n"):
        lines.extend(textwrap.wrap(raw, width=width, break_long_words=True) if raw.strip() else [""])
    while lines and not lines[-1]:
        lines.pop()
    return lines or [""], urls


_LINK_MARK = re.compile(r" \[ \d+ \]")


def unlink_line(line: str) -> str:
    """A rendered line without its ``[ k ]`` link marks (find results show no links)."""
    return _LINK_MARK.sub("", line)


class Corpus:
    """An immutable list of documents with url / docid lookup and a content hash."""

    def __init__(self, docs: Iterable[Document], name: str = "corpus", line_width: int = 80):
        self.docs: list[Document] = list(docs)
        self.name = name
        self.line_width = line_width
        self.by_url: dict[str, int] = {}
        self.by_docid: dict[str, int] = {}
        for i, d in enumerate(self.docs):
            if d.docid in self.by_docid:
                raise ValueError(f"{name}: duplicate docid {d.docid!r} (rows {self.by_docid[d.docid]} and {i})")
            self.by_docid[d.docid] = i
            self.by_url.setdefault(d.url, i)
        self.by_title: dict[str, int] = {}
        for i, d in enumerate(self.docs):
            self.by_title.setdefault(d.title.lower(), i)
        self._lines: dict[int, tuple[list[str], list[str]]] = {}
        self._hash: str | None = None

    def __len__(self) -> int:
        return len(self.docs)

    def __deepcopy__(self, memo: dict) -> Corpus:
        return self  # read-only and shared: snapshots never copy the corpus

    def content_hash(self) -> str:
        """sha256 over every document (docid, url, title, text): changes when any of them does."""
        if self._hash is None:
            h = hashlib.sha256()
            for d in self.docs:
                for part in (d.docid, d.url, d.title, d.text):
                    h.update(part.encode("utf-8"))
                    h.update(b"\x00")
            self._hash = h.hexdigest()
        return self._hash

    def page(self, idx: int) -> tuple[list[str], list[str]]:
        """(lines, link urls) of document ``idx``, rendered once and memoised."""
        if idx not in self._lines:
            self._lines[idx] = render_lines(self.docs[idx].text, self.line_width)
        return self._lines[idx]

    #: how many times the title is indexed (a simple title boost)
    title_weight = 2

    def search_text(self, idx: int) -> str:
        """What the search index sees: the title (``title_weight`` times) + body without link markup."""
        d = self.docs[idx]
        return "\n".join([d.title] * self.title_weight + [strip_links(d.text)])


# --------------------------------------------------------------------------- loaders


def _read_rows(path: str | Path, what: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows of a ``.jsonl`` or ``.parquet`` file and its column names."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"{what} file {str(p)!r} does not exist")
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows: list[dict[str, Any]] = []
        with p.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{what} file {str(p)!r}: line {n} is not JSON ({exc.msg})") from exc
                if not isinstance(row, dict):
                    raise ValueError(f"{what} file {str(p)!r}: line {n} is not a JSON object")
                rows.append(row)
        cols = sorted({k for r in rows for k in r})
        return rows, cols
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(
                f"reading {what} file {str(p)!r} needs pyarrow: pip install pyarrow (or convert it to JSONL)"
            ) from exc
        table = pq.read_table(p)
        return table.to_pylist(), list(table.column_names)
    raise ValueError(f"{what} file {str(p)!r}: unsupported extension {suffix!r}; valid: .jsonl, .json, .parquet")


def _check_columns(rows: list[dict], cols: list[str], need: tuple[str, ...], path, what: str) -> None:
    missing = [c for c in need if c not in cols]
    if missing:
        raise ValueError(f"{what} file {str(path)!r} lacks column(s) {missing}; required: {list(need)}; found: {cols}")
    for i, r in enumerate(rows):
        empty = [c for c in need if r.get(c) is None]
        if empty:
            raise ValueError(f"{what} file {str(path)!r}: row {i} has no value for {empty}")


def load_corpus(path: str | Path, line_width: int = 80) -> Corpus:
    """A corpus from a parquet or JSONL file with columns ``docid``, ``url``, ``text``.

    The title comes from a ``title:`` line of a front matter block at the top of
    ``text`` (a ``title`` column also works); else the first line of the body, else the url."""
    rows, cols = _read_rows(path, "corpus")
    _check_columns(rows, cols, CORPUS_COLUMNS, path, "corpus")
    docs = []
    for r in rows:
        meta, body = split_front_matter(str(r["text"]))
        first = next((ln.strip() for ln in body.splitlines() if ln.strip()), "")
        title = str(r.get("title") or meta.get("title") or first[:80] or r["url"])
        docs.append(Document(str(r["docid"]), str(r["url"]), title, body.strip("\n")))
    return Corpus(docs, name=Path(path).name, line_width=line_width)


def load_questions(path: str | Path) -> list[Question]:
    """Questions from a JSONL or parquet file with columns ``qid``, ``question``, ``answer``."""
    rows, cols = _read_rows(path, "questions")
    _check_columns(rows, cols, QUESTION_COLUMNS, path, "questions")
    out = [Question(str(r["qid"]), str(r["question"]), str(r["answer"])) for r in rows]
    seen: set[str] = set()
    for q in out:
        if q.qid in seen:
            raise ValueError(f"questions file {str(path)!r}: duplicate qid {q.qid!r}")
        seen.add(q.qid)
    return out


def split_questions(questions: list[Question], eval_count: int, seed: int = 0) -> tuple[list[Question], list[Question]]:
    """Deterministic (train, eval) split: ``eval_count`` questions chosen by a
    seeded shuffle of the qids; both keep file order."""
    if not 0 < eval_count < len(questions):
        raise ValueError(
            f"eval_count={eval_count} must be between 1 and {len(questions) - 1} "
            f"(the file has {len(questions)} questions)"
        )
    order = sorted(range(len(questions)), key=lambda i: questions[i].qid)
    random.Random(seed).shuffle(order)
    held = set(order[:eval_count])
    train = [q for i, q in enumerate(questions) if i not in held]
    ev = [q for i, q in enumerate(questions) if i in held]
    return train, ev


# --------------------------------------------------------------------------- synthetic corpora (benchmarks)


def synthetic_corpus(n_docs: int, seed: int = 0, vocab_size: int = 50_000, doc_len: int = 150) -> Corpus:
    """A Zipf-distributed random-word corpus of ``n_docs`` documents for search
    benchmarks (realistic term statistics, no meaning)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab_size)]
    ranks = np.arange(1, vocab_size + 1)
    p = 1.0 / ranks**1.07
    p /= p.sum()
    lens = rng.integers(doc_len // 2, doc_len * 3 // 2, size=n_docs)
    ids = rng.choice(vocab_size, size=int(lens.sum()), p=p)
    docs, pos = [], 0
    for i, n in enumerate(lens):
        chunk = ids[pos : pos + n]
        pos += n
        docs.append(Document(f"d{i}", f"synthetic/{i}", f"doc {i}", " ".join(words[j] for j in chunk)))
    return Corpus(docs, name=f"synthetic-{n_docs}-{seed}")
