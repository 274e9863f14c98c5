"""Plugin entry point of the openresearcher domain: Searcher / Opener / Finder
research a question with a BM25 browser over a corpus and answer it."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from swarm_domains.openresearcher.browser import BROWSER_WORDS
from swarm_domains.openresearcher.env import ENV_WORDS, ResearchEnv
from swarm_domains.openresearcher.world import corpus_words, get_world
from swarm_runtime import Domain, Role, hookimpl

BROWSER_KEYS = ("view_lines", "view_chars", "max_find_results", "line_width")


class OpenResearcherDomain(Domain):
    """Deep research over a corpus (OpenResearcher, BrowseComp-style questions)."""

    name = "openresearcher"
    #: the judge (judge.py, called in env.step: in env workers on Ray) and the search cache (search.py)
    env_vars = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "XDG_CACHE_HOME")
    description = (
        "Answer multi-hop questions with browser tools over a corpus: the Searcher searches, the "
        "Opener opens links and scrolls, the Finder finds words in a page; any role may answer."
    )
    roles = (
        Role("Searcher", "calls browser.search: search <words>"),
        Role("Opener", "calls browser.open: open <id> | open <url> | open at <line>"),
        Role("Finder", "calls browser.find: find <words>"),
    )
    tasks_dir = Path(__file__).parent / "tasks"

    def make_env(self, task: DictConfig) -> ResearchEnv:
        browser = dict(task.get("browser") or {})
        unknown = sorted(set(browser) - set(BROWSER_KEYS))
        if unknown:
            raise ValueError(f"unknown browser key(s) {unknown}; valid: {', '.join(BROWSER_KEYS)}")
        browser.pop("line_width", None)
        topn = (task.get("search") or {}).get("topn", 3)
        credit = float(task.get("evidence_credit", 0.0))
        if credit and task.get("source", "embedded") != "embedded":
            raise ValueError(
                f"evidence_credit {credit} needs questions with evidence hops, which only the embedded "
                "corpus has (source: embedded); real questions get the binary reward: set evidence_credit 0"
            )
        return ResearchEnv(
            get_world(task), int(task.max_decisions), {**browser, "topn": int(topn)}, evidence_credit=credit
        )

    def instances(self, task: DictConfig, seeds) -> list[str]:
        """The question each seed picks (its text): the conformance kit checks that no question is
        in two of the train / dev / eval splits, not just that their seeds differ."""
        world = get_world(task)
        return [world.question_for(int(s)).question for s in seeds]

    def vocabulary(self, task: DictConfig) -> list[str]:
        words = list(ENV_WORDS) + list(BROWSER_WORDS)
        if task.get("source", "embedded") == "embedded":
            from swarm_domains.openresearcher.encyclopedia import vocabulary

            return list(dict.fromkeys(words + vocabulary()))
        return list(dict.fromkeys(words + corpus_words(get_world(task), int(task.get("vocab_size", 20000)))))


@hookimpl
def swarm_register_domains(register) -> None:
    register(OpenResearcherDomain())


@hookimpl
def swarm_register_config_rules(register, register_check) -> None:
    from swarm_domains.openresearcher.judge import check_settings

    register_check(check_settings)  # the LLM judge's settings (judge.py: settings_problem)
