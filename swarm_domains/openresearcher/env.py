"""The deep-research episode: a question, a browser, three tool roles and an answer.

Actions (short texts, parsed by :func:`parse_action`):

==========================================  ========  =====================================
text                                        role      browser call
==========================================  ========  =====================================
``search <words> [top <n>]``                Searcher  ``search(words, topn=n)``
``open <id> [cursor <c>] [at <loc>]``       Opener    follow link ``id`` of page ``c``
``open <url> [at <loc>] [lines <n>]``       Opener    open a corpus url
``open [cursor <c>] at <loc> [lines <n>]``  Opener    scroll page ``c`` to line ``loc``
``find <words> [cursor <c>]``               Finder    ``find(words, cursor=c)``
``answer <words>``                          any role  ends the episode; judged
==========================================  ========  =====================================

A role calling another role's tool, unparsable text, or a tool call that fails
(the browser's error is shown in the next observation) is a no-op with
``valid=False``. Every step (valid or not) counts toward ``max_decisions``;
reaching it ends the episode unanswered (reward 0). Reward: 1 for a correct
answer, else 0; a missing LLM grade gives reward 0 with
``info["reward_missing"] = True`` (the core leaves such episodes out of reward means).

``evidence_credit`` (task key, default 0 = the paper's binary reward) pays part of
that 1 for evidence: each evidence hop of the question, the first time its fact
line is shown, pays ``evidence_credit / hops``, and a correct answer pays the
rest (``1 - paid``). A correct episode still totals exactly 1 and every return
stays in [0, 1]; a wrong answer keeps the evidence credit it earned. It gives
RL a signal where tiny models almost never answer right (docs/results.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm_domains.openresearcher.browser import Browser
from swarm_domains.openresearcher.corpus import Question
from swarm_runtime.core.env import DomainEnv, ExpertStep, StepResult

ROLE_OF_TOOL = {"search": "Searcher", "open": "Opener", "find": "Finder"}
ROLES = tuple(ROLE_OF_TOOL.values())
#: Words the env writes around the browser display and the action keywords.
ENV_WORDS = ("question", "answer", "search", "open", "find", "top", "cursor", "at", "lines", ":", ".")


@dataclass(frozen=True)
class Action:
    """A parsed action: ``tool`` is search / open / find / answer."""

    tool: str
    text: str = ""  #: query, pattern, url or answer
    id: int = -1  #: link id for open
    cursor: int = -1
    loc: int = -1
    num_lines: int = -1
    topn: int = 0


def _int(tok: str) -> int | None:
    return int(tok) if tok.isdigit() else None


def _options(words: list[str], allowed: tuple[str, ...]) -> dict[str, int] | None:
    """``key value`` pairs (values non-negative integers); ``None`` if malformed."""
    if len(words) % 2:
        return None
    out: dict[str, int] = {}
    for k, v in zip(words[::2], words[1::2]):
        n = _int(v)
        if k not in allowed or n is None or k in out:
            return None
        out[k] = n
    return out


def _split_trailing(words: list[str], key: str) -> tuple[list[str], int | None]:
    """Strip a trailing ``key <n>`` pair from ``words``."""
    if len(words) >= 3 and words[-2] == key and _int(words[-1]) is not None:
        return words[:-2], int(words[-1])
    return words, None


def parse_action(text: str) -> Action | None:
    """The action of ``text`` or ``None`` when it does not parse (see the module table)."""
    words = str(text).split()
    if not words:
        return None
    verb, rest = words[0].lower(), words[1:]
    if verb == "answer":
        return Action("answer", " ".join(rest)) if rest else None
    if verb == "search":
        rest, topn = _split_trailing(rest, "top")
        return Action("search", " ".join(rest), topn=topn or 0) if rest else None
    if verb == "find":
        rest, cursor = _split_trailing(rest, "cursor")
        return Action("find", " ".join(rest), cursor=-1 if cursor is None else cursor) if rest else None
    if verb == "open":
        target: str | int = -1
        if rest and rest[0] not in ("cursor", "at", "lines"):
            target = _int(rest[0]) if _int(rest[0]) is not None else rest[0]
            rest = rest[1:]
        opts = _options(rest, ("cursor", "at", "lines"))
        if opts is None or (target == -1 and not opts):
            return None
        if isinstance(target, str) and "cursor" in opts:
            return None  # a url names its page itself
        return Action(
            "open",
            target if isinstance(target, str) else "",
            id=target if isinstance(target, int) else -1,
            cursor=opts.get("cursor", -1),
            loc=opts.get("at", -1),
            num_lines=opts.get("lines", -1),
        )
    return None


class ResearchEnv(DomainEnv):
    """One question per episode. ``world`` (corpus, index, questions, judge) is shared
    and never copied by snapshots; the browser stack and episode fields are."""

    #: counters an invalid action still advances (the conformance kit allows them to change)
    bookkeeping = ("decisions", "counts", "error")  # "error": the last tool error text, shown until a call succeeds

    def __init__(self, world, max_decisions: int, browser_cfg: dict | None = None, evidence_credit: float = 0.0):
        if not 0.0 <= float(evidence_credit) < 1.0:
            raise ValueError(
                f"evidence_credit {evidence_credit!r} must be in [0, 1): the share of the answer's "
                "reward paid for evidence hops (0 = the paper's binary reward)"
            )
        self.world = world
        self.max_decisions = int(max_decisions)
        self.evidence_credit = float(evidence_credit)
        self.browser_cfg = dict(browser_cfg or {})
        self.browser = Browser(world.corpus, world.index, **self.browser_cfg)
        self.question: Question | None = None
        self._reset_fields()

    def _reset_fields(self) -> None:
        self.decisions = 0
        self.done = False
        self.error = ""  #: the last tool error, shown until the next successful call
        self.answer: str | None = None
        self.correct: bool | None = None
        self.f1 = 0.0
        self.reward_missing = False
        self.progress = 0  #: evidence hops seen so far (drives the scripted expert)
        self.paid = 0.0  #: evidence credit paid so far this episode
        self.last_tool_role: str | None = None
        self.counts = {"tool_calls": 0, "tool_errors": 0, "invalid": 0}

    # ---- episode ---------------------------------------------------------------
    def reset(self, seed: int) -> str:
        self.question = self.world.question_for(int(seed))
        self.browser.stack = []
        self._reset_fields()
        return self.observation()

    def observation(self) -> str:
        q = self.question.question if self.question else ""
        parts = [f"question : {q}"]
        if self.answer is not None:
            parts.append(f"answer : {self.answer}")
        if self.error:
            parts.append(self.error)
        parts.append(self.browser.display())
        return " .\n".join(parts)

    def step(self, action: str, role: str | None = None) -> StepResult:
        if self.done:
            return StepResult(self.observation(), 0.0, True, False, {"error": "episode already ended"})
        self.decisions += 1
        act = parse_action(action)
        allowed = act is not None and (role is None or (role in ROLES and ROLE_OF_TOOL.get(act.tool, role) == role))
        if not allowed:
            self.counts["invalid"] += 1
            return self._end_if_capped(StepResult(self.observation(), 0.0, False, False))
        if act.tool == "answer":
            return self._answer(act.text)
        res = self._call(act)
        self.counts["tool_calls"] += 1
        reward = 0.0
        if res.ok:
            self.error = ""
            self.last_tool_role = role or ROLE_OF_TOOL[act.tool]
            seen = self.progress
            self._update_progress()
            if self.progress > seen and self.evidence_credit:
                reward = self.evidence_credit * (self.progress - seen) / len(self.question.hops)
                self.paid += reward
        else:
            self.counts["tool_errors"] += 1
            self.error = res.text
        info = {} if res.ok else {"tool_error": res.text}
        # a failed tool call (no such link, nothing found, a page out of range) did nothing: not a valid action
        return self._end_if_capped(StepResult(self.observation(), reward, False, bool(res.ok), info))

    def _call(self, act: Action):
        b = self.browser
        if act.tool == "search":
            return b.search(act.text, act.topn or None)
        if act.tool == "find":
            return b.find(act.text, act.cursor)
        return b.open(act.text if act.text else act.id, act.cursor, act.loc, act.num_lines)

    def _answer(self, text: str) -> StepResult:
        q = self.question
        grade = self.world.judge.grade(q.question, q.answer, text)
        self.answer, self.done, self.f1 = text, True, grade.f1
        info = {"answer": text, "reference": q.answer, "f1": grade.f1, "judge_attempts": grade.attempts}
        if grade.missing:
            self.reward_missing = True
            info.update(reward_missing=True, judge_error=grade.error)
            return StepResult(self.observation(), 0.0, True, True, info)
        self.correct = bool(grade.correct)
        info["correct"] = self.correct
        return StepResult(self.observation(), 1.0 - self.paid if self.correct else 0.0, True, True, info)

    def _end_if_capped(self, res: StepResult) -> StepResult:
        if self.decisions >= self.max_decisions:
            self.done = res.done = True
            res.info["timeout"] = True
        return res

    # ---- expert ----------------------------------------------------------------
    def _update_progress(self) -> None:
        """Count an evidence hop as seen once its fact line is in the shown window."""
        hops = self.question.hops if self.question else ()
        if self.progress >= len(hops) or not self.browser.stack:
            return
        hop, page = hops[self.progress], self.browser.stack[-1]
        doc = self.world.corpus.by_title.get(hop["title"].lower())
        if page.get("doc") != doc:
            return
        if page["kind"] == "doc":
            shown = range(page["loc"], page["end"])
        else:
            shown = page["matches"][page["loc"] : page["end"]] if page["kind"] == "find" else []
        if hop["line"] in shown:
            self.progress += 1

    def expert_action(self) -> ExpertStep | None:
        """Per hop: search the entity, open its result, find the keyword; then answer.

        The answer comes from the role whose tool showed the last fact (the
        Opener when it was already in the opened window, else the Finder).
        Real questions carry no hops: no expert."""
        q = self.question
        if self.done or q is None or not q.hops:
            return None
        if self.progress >= len(q.hops):
            return ExpertStep(self.last_tool_role or "Finder", f"answer {q.answer}")
        hop = q.hops[self.progress]
        doc = self.world.corpus.by_title.get(hop["title"].lower())
        page = self.browser.stack[-1] if self.browser.stack else None
        if page is not None and page.get("doc") == doc:
            if page["kind"] == "doc":
                return ExpertStep("Finder", f"find {hop['keyword']}")
            if hop["line"] in page["matches"]:
                return ExpertStep("Opener", f"open {page['matches'].index(hop['line'])}")
        if page is not None and page["kind"] == "search" and doc in page["results"]:
            return ExpertStep("Opener", f"open {page['results'].index(doc)}")
        return ExpertStep("Searcher", f"search {hop['query']}")

    def metrics(self) -> dict[str, float]:
        return {
            "success": float(bool(self.correct)),
            "answered": float(self.answer is not None),
            "f1": float(self.f1),
            "decisions": float(self.decisions),
            "tool_calls": float(self.counts["tool_calls"]),
            "tool_errors": float(self.counts["tool_errors"]),
            "invalid_actions": float(self.counts["invalid"]),
            "reward_missing": float(self.reward_missing),
        }
