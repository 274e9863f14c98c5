"""The embedded corpus: a generated encyclopedia of fictional people, places,
groups and events with cross-references, and multi-hop questions over it.

Everything is deterministic from a seed. Names are built from a fixed, finite
set of made-up words (:data:`NAME_WORDS`), so the whole text of the corpus and
of the questions uses the closed vocabulary :func:`vocabulary` lists.

Relations are functions (a person has one birthplace, a group one founder ...),
so every question that chains them has exactly one answer:

=====================  ============================================================
hop (find keyword)     fact line of the document
=====================  ============================================================
person born (born)     ``born in <place> in <year> .``
person job (works)     ``works as a <job> .``
person parent (child)  ``child of <person> .``
place realm (realm)    ``lies in the realm of <realm> .``
place mayor (mayor)    ``mayor is <person> .``
group founder          ``founded by <person> in <year> .``  (keyword ``founded``)
group base (based)     ``based in <place> .``
event group            ``organised by <group> .``  (keyword ``organised``)
=====================  ============================================================
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from swarm_domains.openresearcher.corpus import Corpus, Document, Question


def _made_up_words(n: int, seed: int) -> list[str]:
    """``n`` distinct pronounceable made-up words (consonant-vowel syllables)."""
    onsets = "b d f g k l m n p r s t v z".split()
    vowels = "a e i o u".split()
    codas = ["", "n", "r", "s", "l"]
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set(ENGLISH)
    while len(out) < n:
        w = rng.choice(onsets) + rng.choice(vowels) + rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


# Fixed English words of documents and questions.
PLACE_PREFIXES = ["north", "south", "east", "west", "upper", "lower", "new", "old"]
GROUP_KINDS = ["guild", "bank", "company", "order", "league", "school", "press", "club"]
EVENT_KINDS = ["battle", "treaty", "flood", "fair", "council", "festival", "strike", "fire"]
JOBS = [
    "smith",
    "baker",
    "miner",
    "sailor",
    "painter",
    "scholar",
    "farmer",
    "weaver",
    "potter",
    "mason",
    "doctor",
    "singer",
]
ENGLISH = set(
    PLACE_PREFIXES
    + GROUP_KINDS
    + EVENT_KINDS
    + JOBS
    + """
is a an the person place group event born in works as child of lies realm mayor founded by based
organised held founder near where was who what when which job birthplace parent that ?  .
""".split()
)

_POOL = _made_up_words(36 + 36 + 30 + 40 + 10, seed=20240601)
FIRST_NAMES, LAST_NAMES = _POOL[:36], _POOL[36:72]
PLACE_STEMS, GROUP_STEMS, REALMS = _POOL[72:102], _POOL[102:142], _POOL[142:152]
NAME_WORDS = _POOL

#: Question templates: (id, text with {x}, start entity kind, hop relations).
TEMPLATES = [
    ("founder_born", "where was the founder of {x} born ?", "group", ("founder", "born_place")),
    ("founder_year", "when was the founder of {x} born ?", "group", ("founder", "born_year")),
    ("founder_job", "what is the job of the founder of {x} ?", "group", ("founder", "job")),
    ("founder_realm", "in which realm was the founder of {x} born ?", "group", ("founder", "born_place", "realm")),
    (
        "founder_mayor",
        "who is the mayor of the birthplace of the founder of {x} ?",
        "group",
        ("founder", "born_place", "mayor"),
    ),
    ("event_base", "where is the group that organised the {x} based ?", "event", ("group", "base")),
    ("event_founder", "who founded the group that organised the {x} ?", "event", ("group", "founder")),
    (
        "event_born",
        "where was the founder of the group that organised the {x} born ?",
        "event",
        ("group", "founder", "born_place"),
    ),
    ("event_realm", "in which realm is the group that organised the {x} based ?", "event", ("group", "base", "realm")),
    ("person_realm", "in which realm was {x} born ?", "person", ("born_place", "realm")),
    ("person_mayor", "who is the mayor of the birthplace of {x} ?", "person", ("born_place", "mayor")),
    ("parent_born", "where was the parent of {x} born ?", "person", ("parent", "born_place")),
    ("parent_job", "what is the job of the parent of {x} ?", "person", ("parent", "job")),
]
#: Templates of the ``dev`` split only (tuning): the same relations, find keywords and 2-3 hop chains as
#: :data:`TEMPLATES`, recombined into questions no train or eval question asks, over the same corpus. Every
#: (template, entity) pair of :data:`TEMPLATES` is already a train or eval question, so a dev split with the
#: same templates would have to take questions from train (and change the default run); these leave the train
#: and eval questions, the corpus and its index as they are. Dev is therefore a *transfer* split (new
#: phrasings of known hops): use it to rank settings, not as an estimate of the eval score.
DEV_TEMPLATES = [
    ("parent_year", "when was the parent of {x} born ?", "person", ("parent", "born_year")),
    ("parent_realm", "in which realm was the parent of {x} born ?", "person", ("parent", "born_place", "realm")),
    (
        "parent_mayor",
        "who is the mayor of the birthplace of the parent of {x} ?",
        "person",
        ("parent", "born_place", "mayor"),
    ),
    ("founder_parent", "who is the parent of the founder of {x} ?", "group", ("founder", "parent")),
    ("base_realm", "in which realm is {x} based ?", "group", ("base", "realm")),
    ("base_mayor", "who is the mayor of the place where {x} is based ?", "group", ("base", "mayor")),
    (
        "event_job",
        "what is the job of the founder of the group that organised the {x} ?",
        "event",
        ("group", "founder", "job"),
    ),
    (
        "event_year",
        "when was the founder of the group that organised the {x} born ?",
        "event",
        ("group", "founder", "born_year"),
    ),
]
#: relation -> find keyword
KEYWORDS = {
    "born_place": "born",
    "born_year": "born",
    "job": "works",
    "parent": "child",
    "realm": "realm",
    "mayor": "mayor",
    "founder": "founded",
    "base": "based",
    "group": "organised",
}

#: relations that share another relation's line
_LINE_OF = {"born_year": "born_place"}

DEFAULT_SIZES = {"people": 1200, "places": 240, "groups": 300, "events": 600}


def _max_sizes() -> dict[str, int]:
    places = len(PLACE_PREFIXES) * len(PLACE_STEMS)
    return {
        "people": len(FIRST_NAMES) * len(LAST_NAMES),
        "places": places,
        "groups": len(GROUP_STEMS) * len(GROUP_KINDS),
        "events": len(EVENT_KINDS) * places,
    }


@dataclass
class Entity:
    kind: str
    title: str
    facts: dict  #: relation -> value (an entity title, a year or a word)


def _url(title: str) -> str:
    return "wiki/" + title.replace(" ", "_")


class Encyclopedia:
    """A generated world: entities, their documents (a :class:`Corpus`) and questions."""

    def __init__(self, seed: int = 0, sizes: dict | None = None, eval_questions: int = 50, dev_questions: int = 0):
        sizes = {**DEFAULT_SIZES, **(dict(sizes) if sizes else {})}
        limits = _max_sizes()
        bad = [k for k in sizes if k not in limits]
        if bad:
            raise ValueError(f"unknown corpus size key(s) {bad}; valid: {sorted(limits)}")
        for k, v in sizes.items():
            if not isinstance(v, int) or not 2 <= v <= limits[k]:
                raise ValueError(f"corpus size {k}={v!r} must be an integer in [2, {limits[k]}]")
        if sizes["people"] < sizes["places"] + sizes["groups"]:
            raise ValueError(
                f"corpus sizes: people ({sizes['people']}) must be at least places + groups "
                f"({sizes['places'] + sizes['groups']}) so mayors and founders are distinct"
            )
        self.seed, self.sizes = seed, sizes
        rng = random.Random(seed)
        self.entities: dict[str, Entity] = {}
        self._build(rng)
        self.corpus = Corpus(self._documents(rng), name=f"encyclopedia-{seed}")
        questions = self._questions()
        if not 1 <= eval_questions < len(questions):
            raise ValueError(f"eval_questions={eval_questions} must be in [1, {len(questions) - 1}]")
        random.Random(seed + 1).shuffle(questions)  # mixed templates in seed order; the first ones are held out
        self.eval_questions = questions[:eval_questions]
        self.train_questions = questions[eval_questions:]
        self.dev_questions = self._dev(dev_questions)

    def _dev(self, count: int) -> list[Question]:
        """``count`` questions of :data:`DEV_TEMPLATES` (mixed templates, seeded), drawn after and apart
        from the train / eval questions: they change neither."""
        if not count:
            return []
        pool = self._questions(DEV_TEMPLATES, prefix="dev/")
        if not 1 <= count <= len(pool):
            raise ValueError(f"dev_seeds count {count} must be in [1, {len(pool)}] (the dev questions this corpus has)")
        random.Random(self.seed + 2).shuffle(pool)
        return pool[:count]

    # ---- world ----------------------------------------------------------------
    def _build(self, rng: random.Random) -> None:
        s = self.sizes
        places = rng.sample([f"{p} {t}" for p in PLACE_PREFIXES for t in PLACE_STEMS], s["places"])
        people = rng.sample([f"{f} {l}" for f in FIRST_NAMES for l in LAST_NAMES], s["people"])
        groups = rng.sample([f"{t} {k}" for t in GROUP_STEMS for k in GROUP_KINDS], s["groups"])
        events = rng.sample([f"{k} of {p}" for k in EVENT_KINDS for p in places], s["events"])
        for p in places:
            near = rng.choice([q for q in places if q != p])
            self.entities[p] = Entity("place", p, {"realm": rng.choice(REALMS), "near": near})
        years = {p: rng.randint(1700, 1899) for p in people}
        by_age = sorted(people, key=lambda p: (years[p], p))
        for i, p in enumerate(by_age):
            facts = {"born_place": rng.choice(places), "born_year": years[p], "job": rng.choice(JOBS)}
            elders = [q for q in by_age[:i] if years[q] <= years[p] - 18]
            if elders and rng.random() < 0.9:
                facts["parent"] = rng.choice(elders[-200:])
            self.entities[p] = Entity("person", p, facts)
        officials = rng.sample(people, s["places"] + s["groups"])
        for place, mayor in zip(places, officials[: s["places"]]):
            self.entities[place].facts["mayor"] = mayor
            self.entities[mayor].facts["mayor_of"] = place
        for g, founder in zip(groups, officials[s["places"] :]):
            year = years[founder] + rng.randint(20, 50)
            self.entities[g] = Entity("group", g, {"founder": founder, "year": year, "base": rng.choice(places)})
            self.entities[founder].facts["founded"] = g
        for e in events:
            g = rng.choice(groups)
            where = e.split(" of ", 1)[1]
            self.entities[e] = Entity(
                "event", e, {"place": where, "group": g, "year": self.entities[g].facts["year"] + rng.randint(1, 60)}
            )
            self.entities[g].facts.setdefault("organised", []).append(e)

    def fact_lines(self, ent: Entity) -> list[tuple[str, str]]:
        """(relation, line text with ``[[url|anchor]]`` links) of an entity's document, unshuffled."""
        f, L = ent.facts, (lambda t: f"[[{_url(t)}|{t}]]")
        if ent.kind == "person":
            out = [
                ("born_place", f"born in {L(f['born_place'])} in {f['born_year']} ."),
                ("job", f"works as a {f['job']} ."),
            ]
            if "parent" in f:
                out.append(("parent", f"child of {L(f['parent'])} ."))
            if "founded" in f:
                out.append(("founded", f"founder of {L(f['founded'])} ."))
            if "mayor_of" in f:
                out.append(("mayor_of", f"mayor of {L(f['mayor_of'])} ."))
            return out
        if ent.kind == "place":
            return [
                ("realm", f"lies in the realm of {f['realm']} ."),
                ("mayor", f"mayor is {L(f['mayor'])} ."),
                ("near", f"near {L(f['near'])} ."),
            ]
        if ent.kind == "group":
            out = [
                ("founder", f"founded by {L(f['founder'])} in {f['year']} ."),
                ("base", f"based in {L(f['base'])} ."),
            ]
            out += [("organised", f"organised the {L(e)} .") for e in f.get("organised", [])[:3]]
            return out
        return [("place", f"held in {L(f['place'])} in {f['year']} ."), ("group", f"organised by {L(f['group'])} .")]

    def _documents(self, rng: random.Random) -> list[Document]:
        self.fact_line_index: dict[tuple[str, str], int] = {}
        docs = []
        for title in sorted(self.entities):
            ent = self.entities[title]
            facts = self.fact_lines(ent)
            rng.shuffle(facts)
            article = "an" if ent.kind == "event" else "a"
            lines = [f"{title} is {article} {ent.kind} ."] + [t for _, t in facts]
            for i, (rel, _) in enumerate(facts, 1):
                self.fact_line_index[(title, rel)] = i
            docs.append(Document(docid=_url(title)[5:], url=_url(title), title=title, text="\n".join(lines)))
        return docs

    # ---- questions ------------------------------------------------------------
    def _follow(self, start: str, relations: tuple) -> tuple[str, list[dict]] | None:
        cur, hops = start, []
        for rel in relations:
            ent = self.entities[cur]
            if rel not in ent.facts:
                return None
            hops.append(
                {
                    "title": cur,
                    "query": f"{cur} {ent.kind}",
                    "keyword": KEYWORDS[rel],
                    "line": self.fact_line_index[(cur, _LINE_OF.get(rel, rel))],
                }
            )
            cur = str(ent.facts[rel])
        return cur, hops

    def _questions(self, templates=TEMPLATES, prefix: str = "") -> list[Question]:
        out = []
        for tid, text, kind, rels in templates:
            for title in sorted(t for t, e in self.entities.items() if e.kind == kind):
                res = self._follow(title, rels)
                if res is None:
                    continue
                answer, hops = res
                qid = f"{prefix}{tid}:{title.replace(' ', '_')}"
                out.append(Question(qid, text.format(x=title), answer, tuple(hops)))
        return out


def vocabulary() -> list[str]:
    """Every word of the embedded corpus, its questions and its page rendering."""
    return sorted(ENGLISH | set(NAME_WORDS))
