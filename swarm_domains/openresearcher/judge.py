"""Judges that grade an answer against the reference answer.

- ``exact`` (default, offline): normalised exact match, or token F1 at or above
  ``f1_threshold`` (SQuAD-style normalisation: lower case, no punctuation, no
  articles, single spaces).
- ``llm``: an OpenAI-compatible chat model (default ``qwen3.5-flash``) with a
  BrowseComp-style grader prompt whose reply is parsed to correct / incorrect.
  Timeouts, connection errors, 429 / 5xx responses and unparsable replies are
  retried with exponential backoff, a bounded number of times; a grade that
  still fails is *missing* (``Grade.missing``): never a silent 0. Definite
  grades are cached on disk, keyed by model + question + reference + answer.
  The API key is never logged.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import string
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

JUDGES = ("exact", "llm")
DEFAULT_MODEL = "qwen3.5-flash"

#: A judge whose first this many grades all went missing (none given) stops the run: a wrong URL, model or key.
GIVE_UP_AFTER = 3


@dataclass(frozen=True)
class Grade:
    """A judged answer. ``correct`` is ``None`` when the grade is missing."""

    correct: bool | None
    f1: float = 0.0
    missing: bool = False
    attempts: int = 0
    cached: bool = False
    error: str = ""


# --------------------------------------------------------------------------- exact / F1


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation and the articles a / an / the, collapse spaces."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, reference: str) -> float:
    """Token-level F1 of the normalised strings (1.0 when both are empty)."""
    p, r = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not p or not r:
        return float(p == r)
    common = sum((Counter(p) & Counter(r)).values())
    if common == 0:
        return 0.0
    prec, rec = common / len(p), common / len(r)
    return 2 * prec * rec / (prec + rec)


class ExactJudge:
    """Offline judge: correct iff the normalised strings match or F1 >= ``f1_threshold``."""

    name = "exact"

    def __init__(self, f1_threshold: float = 1.0):
        if not 0.0 < float(f1_threshold) <= 1.0:
            raise ValueError(f"judge f1_threshold={f1_threshold!r} must be in (0, 1]")
        self.f1_threshold = float(f1_threshold)

    def __deepcopy__(self, memo: dict) -> ExactJudge:
        return self

    def grade(self, question: str, reference: str, answer: str) -> Grade:
        f1 = token_f1(answer, reference)
        em = normalize_answer(answer) == normalize_answer(reference)
        return Grade(correct=bool(em or f1 >= self.f1_threshold), f1=f1, attempts=0)


# --------------------------------------------------------------------------- LLM judge

GRADER_TEMPLATE = """You are grading an answer to a research question against a reference answer.

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

Judge only whether the final answer in [response] means the same as [correct_answer]; \
do not solve the question yourself and do not argue for another answer. A small \
numerical margin is acceptable; any other difference, ambiguity or missing answer is incorrect.

Reply in exactly this format:
extracted_final_answer: <the final answer found in [response], or None>
reasoning: <one or two sentences comparing it with [correct_answer]>
correct: <yes or no>"""

_CORRECT_RE = re.compile(r"^\W*correct\W*:\W*(yes|no)\b", re.I | re.M)


def parse_grade(text: str) -> bool | None:
    """``True`` / ``False`` from the grader's ``correct: yes|no`` line (the last
    one wins), ``None`` when the reply has no such line."""
    found = _CORRECT_RE.findall(text or "")
    return None if not found else found[-1].lower() == "yes"


class GradeCache:
    """Definite grades on disk: one small JSON file per key, written atomically."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()

    @staticmethod
    def key(model: str, question: str, reference: str, answer: str) -> str:
        blob = json.dumps([model, question, reference, answer], ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        p = self._path(key)
        try:
            return json.loads(p.read_text()) if p.is_file() else None
        except (OSError, json.JSONDecodeError):
            return None

    def put(self, key: str, value: dict) -> None:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(value))
        os.replace(tmp, p)


def _retryable(exc: Exception) -> bool:
    """Everything is retried (timeouts, connection errors, 5xx, 429, malformed
    bodies) except a 4xx client error such as a bad key or an unknown model."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in (408, 409, 429)
    return True


class LLMJudge:
    """BrowseComp-style grader behind an OpenAI-compatible chat-completions API.

    :param model: model name sent to the server.
    :param base_url: API base (``.../v1``); ``None`` = ``$OPENAI_BASE_URL`` (else the openai default).
    :param api_key: ``None`` = ``$OPENAI_API_KEY``. Never logged.
    :param timeout_s: per-request timeout.
    :param max_attempts: requests per grade at most (bounded loop).
    :param backoff_s / backoff_max_s: exponential backoff ``backoff_s * 2**k``, capped.
    :param cache_dir: grade cache folder; ``None`` = no cache.
    """

    name = "llm"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_attempts: int = 4,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        cache_dir: str | Path | None = None,
        temperature: float = 0.0,
        max_tokens: int = 512,
        sleep: Callable[[float], None] = time.sleep,
    ):
        problem = settings_problem(
            dict(
                base_url=base_url,
                timeout_s=timeout_s,
                max_attempts=max_attempts,
                backoff_s=backoff_s,
                backoff_max_s=backoff_max_s,
                cache_dir=cache_dir,
            )
        )
        if problem:
            raise ValueError(problem)
        try:
            import openai
        except ImportError as exc:
            raise ImportError("judge=llm needs the openai package: pip install 'swarm-runtime[judge]'") from exc
        self.model = str(model)
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            raise ValueError("judge=llm needs an API key: set OPENAI_API_KEY or task.llm_judge.api_key")
        from swarm_runtime.config.secrets import check_endpoint

        # a base_url a run folder from elsewhere saved is not sent the key unless the command line gives it
        check_endpoint(self.base_url, "task.llm_judge.api_key" if api_key else "the key in OPENAI_API_KEY")
        self.timeout_s, self.max_attempts = float(timeout_s), int(max_attempts)
        self.backoff_s, self.backoff_max_s = float(backoff_s), float(backoff_max_s)
        self.temperature, self.max_tokens = float(temperature), int(max_tokens)
        self._sleep = sleep
        self.cache = GradeCache(cache_dir) if cache_dir else None
        self._client = openai.OpenAI(api_key=key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0)
        #: counters: requests sent, failed requests (any cause), missing grades, cache hits, grades given
        self.stats: Counter = Counter()
        logger.info(
            "llm judge: model={} base_url={} timeout={}s attempts={} cache={}",
            self.model,
            self.base_url or "(openai default)",
            self.timeout_s,
            self.max_attempts,
            cache_dir or "off",
        )

    def __deepcopy__(self, memo: dict) -> LLMJudge:
        return self  # shared: an env snapshot never copies the client

    def __repr__(self) -> str:  # never shows the key
        return f"LLMJudge(model={self.model!r}, base_url={self.base_url!r})"

    def _ask(self, prompt: str) -> str:
        resp = self._client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            temperature=self.temperature,
            max_tokens=self.max_tokens,
        )
        if not resp.choices:
            return ""
        return resp.choices[0].message.content or ""

    def grade(self, question: str, reference: str, answer: str) -> Grade:
        f1 = token_f1(answer, reference)
        key = GradeCache.key(self.model, question, reference, answer)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            self.stats["cache_hits"] += 1
            self.stats["graded"] += 1
            return Grade(correct=bool(hit["correct"]), f1=f1, attempts=0, cached=True)
        prompt = GRADER_TEMPLATE.format(question=question, response=answer, correct_answer=reference)
        error = ""
        for attempt in range(1, self.max_attempts + 1):
            self.stats["requests"] += 1
            try:
                verdict = parse_grade(self._ask(prompt))
                if verdict is not None:
                    self.stats["graded"] += 1
                    if self.cache is not None:
                        self.cache.put(key, {"correct": verdict, "model": self.model})
                    return Grade(correct=verdict, f1=f1, attempts=attempt)
                error = "unparsable grader reply"
            except Exception as exc:  # noqa: BLE001 - classified by _retryable
                error = f"{type(exc).__name__}: {getattr(exc, 'status_code', '') or ''}".rstrip(": ")
                if not _retryable(exc):
                    self.stats["failures"] += 1
                    logger.warning("llm judge: {} is not retryable; grade missing", error)
                    break
            self.stats["failures"] += 1
            if attempt < self.max_attempts:
                delay = min(self.backoff_s * 2 ** (attempt - 1), self.backoff_max_s)
                logger.debug(
                    "llm judge attempt {}/{} failed ({}); retrying in {:.2f}s", attempt, self.max_attempts, error, delay
                )
                self._sleep(delay)
        self.stats["missing"] += 1
        logger.warning("llm judge: grade missing after {} attempt(s): {}", self.max_attempts, error)
        if not self.stats["graded"] and self.stats["missing"] >= GIVE_UP_AFTER:
            from swarm_runtime.config.errors import ConfigError

            raise ConfigError(
                f"the llm judge at {self.base_url or '(openai default)'} graded none of the {self.stats['missing']} "
                f"answers it was asked to (last error: {error}): the run stops rather than train and evaluate on "
                "missing rewards; check task.llm_judge.base_url, task.llm_judge.model and the key (OPENAI_API_KEY)"
            )
        return Grade(correct=None, f1=f1, missing=True, attempts=attempt, error=error)


# --------------------------------------------------------------------------- settings
#: Bounds of the LLM judge's numeric settings: a request waits at most an hour, a grade is tried at most 100 times.
MAX_TIMEOUT_S = 3600.0
MAX_ATTEMPTS = 100
#: A value that looks like an API key (``sk-...``, or one long token without ``/`` or ``:``), not a URL.
_KEY_LIKE = re.compile(r"^(sk-|sk_|key-)\S*$|^[A-Za-z0-9_\-.]{24,}$")


def base_url_problem(url) -> str:
    """Why ``url`` cannot be the judge's ``base_url`` ("" when it can): an http(s) URL with a host. A value that
    looks like an API key is said to be one and never shown (the key would land in messages and config.yaml)."""
    from urllib.parse import urlsplit

    if url is None:
        return ""
    text = str(url).strip()
    if "://" not in text and _KEY_LIKE.match(text):
        return (
            "task.llm_judge.base_url holds what looks like an API key, not a URL (not shown): give the key as "
            "OPENAI_API_KEY, and base_url an http(s) URL such as https://api.openai.com/v1 (or null)"
        )
    parts = urlsplit(text) if "://" in text else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return (
            f"task.llm_judge.base_url={text[:120]!r} is not an http(s) URL: give one such as "
            "https://api.openai.com/v1, or null for $OPENAI_BASE_URL"
        )
    return ""


def cache_dir_problem(path) -> str:
    """Why the grade cache cannot live in ``path`` ("" when it can): the folder, or the nearest folder above it
    that exists, must take a new entry (tried: a temporary folder made and removed there)."""
    import tempfile

    if path is None or str(path) == "":
        return ""
    folder = Path(str(path)).expanduser()
    here = next((p for p in (folder, *folder.parents) if p.exists()), None)
    why = "its nearest existing folder is a file" if here is not None and not here.is_dir() else ""
    if not why and here is not None:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".swarm-judge-", dir=here))
        except OSError as exc:
            why = f"{str(here)!r} takes no new entry ({exc.strerror})"
    if why or here is None:
        return (
            f"task.llm_judge.cache_dir={str(path)!r} cannot hold the grade cache: {why or 'no folder of it exists'}; "
            "give a writable folder, or null for no cache"
        )
    return ""


def settings_problem(cfg: dict) -> str:
    """The first problem of the LLM judge's settings ``cfg`` (``task.llm_judge``), "" when there is none: the base
    URL (:func:`base_url_problem`), a finite timeout up to :data:`MAX_TIMEOUT_S`, whole attempts up to
    :data:`MAX_ATTEMPTS`, finite back-offs, a writable cache (:func:`cache_dir_problem`)."""
    import math

    problem = base_url_problem(cfg.get("base_url"))
    if problem:
        return problem
    numbers = {
        "timeout_s": (lambda v: 0 < v <= MAX_TIMEOUT_S, f"a number of seconds > 0 and <= {MAX_TIMEOUT_S:g}"),
        "max_attempts": (lambda v: v == int(v) and 1 <= v <= MAX_ATTEMPTS, f"a whole number from 1 to {MAX_ATTEMPTS}"),
        "backoff_s": (lambda v: 0 <= v <= MAX_TIMEOUT_S, f"seconds from 0 to {MAX_TIMEOUT_S:g}"),
        "backoff_max_s": (lambda v: 0 <= v <= MAX_TIMEOUT_S, f"seconds from 0 to {MAX_TIMEOUT_S:g}"),
    }
    for key, (ok, valid) in numbers.items():
        value = cfg.get(key)
        if value is None:
            continue
        try:
            number = float(value)
            good = not isinstance(value, bool) and math.isfinite(number) and ok(number)
        except (TypeError, ValueError):
            good = False
        if not good:
            return f"task.llm_judge.{key}={value!r} is not valid: must be {valid}"
    return cache_dir_problem(cfg.get("cache_dir"))


def check_settings(cfg, registry=None) -> None:
    """Validation's check of an openresearcher config (``swarm_register_config_rules``): the judge's base URL with
    any judge (a key given as the URL is refused before config.yaml is written), and with ``judge=llm`` all of
    :func:`settings_problem`; a :class:`~swarm_runtime.config.errors.ConfigError` naming the key."""
    from omegaconf import DictConfig, OmegaConf

    from swarm_runtime.config.errors import ConfigError

    task = cfg.get("task") if cfg.get("domain") == "openresearcher" else None
    llm = task.get("llm_judge") if isinstance(task, DictConfig) else None
    if not isinstance(llm, DictConfig):
        return
    settings = OmegaConf.to_container(llm)
    problem = settings_problem(settings) if task.get("judge") == "llm" else base_url_problem(settings.get("base_url"))
    if problem:
        raise ConfigError(problem)


# --------------------------------------------------------------------------- factory


def make_judge(kind: str, exact_cfg: dict | None = None, llm_cfg: dict | None = None):
    """A judge by name (``exact`` or ``llm``) from plain config dicts."""
    if kind == "exact":
        return ExactJudge(**{k: v for k, v in (exact_cfg or {}).items() if v is not None})
    if kind == "llm":
        cfg = dict(llm_cfg or {})
        known = set(LLMJudge.__init__.__code__.co_varnames[1 : LLMJudge.__init__.__code__.co_argcount]) - {"sleep"}
        bad = sorted(set(cfg) - known)
        if bad:
            raise ValueError(f"unknown llm_judge key(s) {bad}; valid: {sorted(known)}")
        return LLMJudge(**{k: v for k, v in cfg.items() if v is not None})
    raise ValueError(f"unknown judge {kind!r}; valid: {', '.join(JUDGES)}")
