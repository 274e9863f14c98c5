"""A text browser over a corpus with the semantics of gpt-oss's simple browser.

- ``search(query, topn)`` pushes a results page whose lines are links
  ``[ k ] title``;
- ``open(id, cursor, loc, num_lines)``: ``id`` an integer follows link ``id``
  of the page at ``cursor`` (default: the last page); ``id`` a string opens that
  url; ``id = -1`` re-shows (scrolls) the page at ``cursor`` from line ``loc``.
  Every successful open pushes a page;
- ``find(pattern, cursor)`` pushes a page listing the case-insensitive matches
  of ``pattern`` in the document at ``cursor``, one ``[ k ] line : text`` per
  match; link ``k`` opens the document at that line.

Pages form a stack; a page's *cursor* is its index in the stack. A window
shows ``num_lines`` numbered lines (default ``view_lines``, or as many as fit in
``view_chars`` characters: no tokenizer download). Errors (unknown link id,
url or cursor, a bad ``loc``) return a clean error message and leave the
stack unchanged; nothing raises. ``open`` only reaches corpus documents: no
file system, no network. Document text is data, never instructions.

State (:attr:`Browser.stack`) is plain lists and dicts; the corpus and index are
shared (deep copy returns them), so ``copy.deepcopy(browser)`` is an exact,
cheap snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm_domains.openresearcher.corpus import Corpus, unlink_line

#: Every word the browser itself writes (headers, errors), for vocabulary().
BROWSER_WORDS = (
    "page",
    "lines",
    "of",
    "results",
    "for",
    "find",
    "in",
    "no",
    "matches",
    "error",
    "link",
    "on",
    "valid",
    "url",
    "document",
    "at",
    "cursor",
    "out",
    "range",
    "line",
    "beyond",
    "last",
    "empty",
    "query",
    "pattern",
    "only",
    "documents",
    "pages",
    "yet",
    "has",
    "not",
    "leads",
    "corpus",
    "works",
    "[",
    "]",
    "-",
    ":",
    ",",
    ".",
)


@dataclass
class ToolResult:
    """What a browser call returns: ``ok`` False for an error (stack unchanged)."""

    ok: bool
    text: str


class Browser:
    """The page stack and the three tools. ``index`` is a search index over ``corpus``."""

    def __init__(
        self, corpus: Corpus, index, topn: int = 3, view_lines: int = 3, view_chars: int = 0, max_find_results: int = 10
    ):
        if view_lines < 1 and view_chars < 1:
            raise ValueError(f"view_lines={view_lines} and view_chars={view_chars}: one must be >= 1")
        self.corpus, self.index = corpus, index
        self.topn, self.view_lines, self.view_chars = int(topn), int(view_lines), int(view_chars)
        self.max_find_results = int(max_find_results)
        self.stack: list[dict] = []

    # ---- pages ----------------------------------------------------------------
    def lines(self, page: dict) -> list[str]:
        """The full text lines of ``page``."""
        if page["kind"] == "doc":
            return self.corpus.page(page["doc"])[0]
        if page["kind"] == "search":
            if not page["results"]:
                return [f"no results for {page['query']}"]
            return [f"[ {k} ] {self.corpus.docs[d].title}" for k, d in enumerate(page["results"])]
        doc_lines = self.corpus.page(page["doc"])[0]
        if not page["matches"]:
            return [f"no matches for {page['pattern']}"]
        return [f"[ {k} ] {i} : {unlink_line(doc_lines[i])}" for k, i in enumerate(page["matches"])]

    def links(self, page: dict) -> list[tuple[str, int]]:
        """Link id -> (url, line to open at) of ``page``."""
        if page["kind"] == "doc":
            return [(u, 0) for u in self.corpus.page(page["doc"])[1]]
        if page["kind"] == "search":
            return [(self.corpus.docs[d].url, 0) for d in page["results"]]
        url = self.corpus.docs[page["doc"]].url
        return [(url, i) for i in page["matches"]]

    def title(self, page: dict) -> str:
        if page["kind"] == "doc":
            return self.corpus.docs[page["doc"]].title
        if page["kind"] == "search":
            return f"results for {page['query']}"
        return f"find {page['pattern']} in {self.corpus.docs[page['doc']].title}"

    def _window_end(self, lines: list[str], loc: int, num_lines: int) -> int:
        if num_lines <= 0:
            if self.view_chars > 0:
                used, num_lines = 0, 0
                for ln in lines[loc:]:
                    used += len(ln) + 1
                    if num_lines and used > self.view_chars:
                        break
                    num_lines += 1
            else:
                num_lines = self.view_lines
        return min(loc + num_lines, len(lines))

    def display(self, cursor: int = -1) -> str:
        """The window of the page at ``cursor`` (the last page by default), as text."""
        if not self.stack:
            return "no pages yet"
        cur = cursor if cursor >= 0 else len(self.stack) - 1
        page = self.stack[cur]
        lines = self.lines(page)
        a, b = page["loc"], page["end"]
        numbered = page["kind"] == "doc"
        body = "\n".join(f"{i} : {lines[i]}" if numbered else lines[i] for i in range(a, b))
        return f"page {cur} {self.title(page)} lines {a} - {b - 1} of {len(lines)} :\n{body}"

    def _push(self, page: dict, loc: int, num_lines: int) -> ToolResult:
        lines = self.lines(page)
        if loc >= len(lines):
            return ToolResult(False, f"error : line {loc} beyond last line {len(lines) - 1}")
        page = {**page, "loc": loc, "end": self._window_end(lines, loc, num_lines)}
        self.stack.append(page)
        return ToolResult(True, self.display())

    def _page_at(self, cursor: int) -> dict | ToolResult:
        if not self.stack:
            return ToolResult(False, "error : no pages yet")
        if cursor == -1:
            return self.stack[-1]
        if not 0 <= cursor < len(self.stack):
            return ToolResult(False, f"error : cursor {cursor} out of range , valid 0 - {len(self.stack) - 1}")
        return self.stack[cursor]

    # ---- tools ----------------------------------------------------------------
    def search(self, query: str, topn: int | None = None) -> ToolResult:
        """Search the corpus; push a results page (possibly empty) and show it."""
        query = " ".join(str(query).split())
        if not query:
            return ToolResult(False, "error : empty query")
        n = self.topn if topn is None or topn <= 0 else int(topn)
        results = [i for i, _ in self.index.search(query, n)]
        return self._push({"kind": "search", "query": query, "results": results}, 0, -1)

    def open(self, id: int | str = -1, cursor: int = -1, loc: int = -1, num_lines: int = -1) -> ToolResult:
        """Follow link ``id`` of the page at ``cursor``, open url ``id``, or (``id=-1``) scroll to ``loc``."""
        if isinstance(id, str):
            doc = self.corpus.by_url.get(id)
            if doc is None:
                return ToolResult(False, f"error : no document at url {id}")
            return self._push({"kind": "doc", "doc": doc}, max(loc, 0), num_lines)
        page = self._page_at(cursor)
        if isinstance(page, ToolResult):
            return page
        if id < 0:  # stay on the page, move the window
            base = {k: v for k, v in page.items() if k not in ("loc", "end")}
            return self._push(base, max(loc, 0), num_lines)
        links = self.links(page)
        if id >= len(links):
            valid = f"valid 0 - {len(links) - 1}" if links else "page has no link"
            return ToolResult(False, f"error : no link {id} on page , {valid}")
        url, at = links[id]
        doc = self.corpus.by_url.get(url)
        if doc is None:
            return ToolResult(False, f"error : link {id} leads out of corpus")
        return self._push({"kind": "doc", "doc": doc}, at if loc < 0 else loc, num_lines)

    def find(self, pattern: str, cursor: int = -1) -> ToolResult:
        """Case-insensitive substring matches of ``pattern`` in the document at ``cursor``."""
        pattern = " ".join(str(pattern).split()).lower()
        if not pattern:
            return ToolResult(False, "error : empty pattern")
        page = self._page_at(cursor)
        if isinstance(page, ToolResult):
            return page
        if page["kind"] != "doc":
            return ToolResult(False, "error : find works on documents only , not on results pages")
        lines = self.corpus.page(page["doc"])[0]
        matches = [i for i, ln in enumerate(lines) if pattern in unlink_line(ln).lower()][: self.max_find_results]
        return self._push({"kind": "find", "doc": page["doc"], "pattern": pattern, "matches": matches}, 0, -1)
