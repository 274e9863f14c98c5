"""The docs stay true to the repository: every relative link in README.md and docs/ points at a file
(and, for a Markdown heading anchor, a heading) the repository has; every repository path they name
exists; every commit hash they name is in the history. Runs without a model or the network."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: Top-level folders whose paths the docs name (``swarm_runtime/models/memory_plan.py``, ``tests/test_credit.py``).
TOP = ("swarm_runtime", "swarm_domains", "tests", "benchmarks", "docs", "swarm_plugins", "configs", ".ci")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w./-])((?:{})/[\w./-]*)".format("|".join(re.escape(t) for t in TOP)))
#: A Markdown file named by itself (``results.md``, ``DESIGN.md``): it must be one the repository has.
MD_NAME = re.compile(r"(?<![\w./-])([\w-]+\.md)(?![\w/])")
#: Files a run writes into its run folder, named by the docs as outputs.
RUN_OUTPUTS = {"eval.md"}
#: A commit hash: 7-40 hex digits with a letter and a digit, not part of a longer word or number.
HASH = re.compile(r"(?<![\w./-])([0-9a-f]{7,40})(?![\w-])")
FENCE = re.compile(r"^(```|~~~)")


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def slug(heading: str, seen: dict[str, int]) -> str:
    """GitHub's anchor of a heading: lowercase, markup and punctuation dropped, spaces to hyphens,
    repeats numbered."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    s = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
    n = seen.get(s, 0)
    seen[s] = n + 1
    return s if n == 0 else f"{s}-{n}"


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*)", line)):
            out.add(slug(m.group(1), seen))
    return out


def prose(path: Path) -> str:
    """The Markdown text (code blocks included: commands and paths in them must hold too)."""
    return path.read_text(encoding="utf-8")


def outside_code(path: Path) -> str:
    """The Markdown text without code blocks and inline code (where ``[a](b)`` is no link)."""
    lines, fenced = [], False
    for line in prose(path).splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(lines)


def placeholder(path: str) -> bool:
    """A pattern rather than a path: ``checkpoints/<tag>/``, ``docs/*.md``, ``configs/algo/NAME.yaml``."""
    return (
        any(c in path for c in "<>*{}")
        or "..." in path
        or any(re.fullmatch(r"[A-Z][A-Z_]+", Path(part).stem) for part in path.split("/"))
    )


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_relative_link_points_at_a_file_and_heading_the_repository_has(doc):
    bad = []
    for target in LINK.findall(outside_code(doc)):
        if re.match(r"[a-z]+:", target) or target.startswith("//"):
            continue  # http(s):, mailto:
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            bad.append(f"{target} (no {rel(dest) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {rel(dest)})")
    assert not bad, f"{rel(doc)}: broken links: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_every_repository_path_named_exists(doc):
    bad = []
    for raw in PATH.findall(prose(doc)):
        path = raw.rstrip(".,:;")
        if placeholder(path):
            continue
        if not ((ROOT / path).exists() or (doc.parent / path).exists()):  # from the root, or from the doc
            bad.append(path)
    for name in set(MD_NAME.findall(prose(doc))) - RUN_OUTPUTS:
        if not any((d / name).exists() for d in (ROOT, doc.parent, ROOT / "docs", ROOT / "docs" / "domains")):
            bad.append(name)
    assert not bad, f"{rel(doc)} names paths the repository does not have: {sorted(set(bad))}"


def history() -> set[str] | str:
    """Every commit reachable from HEAD, or why the history cannot be read."""
    try:
        shallow = subprocess.run(
            ["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        if shallow.returncode != 0:
            return "not a git checkout"
        if shallow.stdout.strip() == "true":
            return "a shallow clone: the history the docs cite is not here (CI runs in a full clone)"
        log = subprocess.run(
            ["git", "log", "--format=%H", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"git is not usable here ({exc})"
    return set(log.stdout.split())


def test_every_commit_named_is_in_the_history():
    commits = history()
    if isinstance(commits, str):
        pytest.skip(f"commit hashes not checked: {commits}")
    bad = {}
    for doc in DOCS:
        for h in HASH.findall(prose(doc)):
            if not (re.search(r"[a-f]", h) and re.search(r"\d", h)):
                continue  # a number or a word, not a hash
            if not any(c.startswith(h) for c in commits):
                bad.setdefault(rel(doc), []).append(h)
    assert not bad, f"commit hashes not in the history of HEAD: {bad}"


def test_the_checks_fail_on_what_they_should(tmp_path):
    """The extractors see a broken link, a missing path and an unknown hash (they are not vacuous)."""
    text = "see [x](nowhere.md) and `swarm_runtime/no_such.py`, measured at commit 0badc0de1"
    assert LINK.findall(text) == ["nowhere.md"]
    assert PATH.findall(text) == ["swarm_runtime/no_such.py"]
    assert MD_NAME.findall("for the rationale see `DESIGN.md`, and docs/results.md") == ["DESIGN.md"]
    assert HASH.findall(text) == ["0badc0de1"]
    assert placeholder("swarm_runtime/configs/algo/NAME.yaml") and not placeholder("swarm_runtime/config/load.py")
    assert slug("1. The auction", {}) == "1-the-auction"
    assert (
        slug("Held-out: MPT vs monolithic REINFORCE (matched FLOPs)", {})
        == "held-out-mpt-vs-monolithic-reinforce-matched-flops"
    )
    assert slug("VLN-CE (`swarm run domain=vln_ce task=r2r`)", {}) == "vln-ce-swarm-run-domainvln_ce-taskr2r"
