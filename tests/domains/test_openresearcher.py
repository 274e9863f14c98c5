"""The openresearcher domain: conformance, browser, BM25 + cache, corpus and
questions, loaders, judge, env and expert."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from swarm_domains.openresearcher.browser import BROWSER_WORDS, Browser
from swarm_domains.openresearcher.corpus import (
    Corpus,
    Document,
    load_corpus,
    load_questions,
    render_lines,
    split_front_matter,
    split_questions,
)
from swarm_domains.openresearcher.encyclopedia import Encyclopedia
from swarm_domains.openresearcher.encyclopedia import vocabulary as enc_vocabulary
from swarm_domains.openresearcher.env import parse_action
from swarm_domains.openresearcher.judge import ExactJudge, Grade, make_judge, normalize_answer, token_f1
from swarm_domains.openresearcher.plugin import OpenResearcherDomain
from swarm_domains.openresearcher.search import build_index, cache_key
from swarm_runtime import check_domain
from swarm_runtime.conformance.task import check_splits
from swarm_runtime.models.tokenizer import build_tokenizer, split_words, unknown_words

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def domain():
    return OpenResearcherDomain()


@pytest.fixture(scope="module")
def task(domain, tmp_path_factory):
    cfg = domain.task_config("embedded")
    cfg.search.cache_dir = str(tmp_path_factory.mktemp("bm25"))
    return cfg


@pytest.fixture(scope="module")
def enc():
    return Encyclopedia(seed=0)


def small_corpus() -> Corpus:
    docs = [
        Document(
            "a",
            "wiki/ada",
            "ada vold",
            "ada vold is a person .\nborn in [[wiki/kelda|north kelda]] in 1820 .\n"
            "works as a Miner .\nfriend of [[wiki/bram|bram kest]] .\nlikes the miner songs .",
        ),
        Document("b", "wiki/bram", "bram kest", "bram kest is a person .\nborn in [[wiki/tarn|south tarn]] ."),
        Document(
            "k",
            "wiki/kelda",
            "north kelda",
            "north kelda is a place .\nlies in the realm of zor .\nsee [[https://example.org/x|outside]] .",
        ),
    ]
    # filler pages keep every idf of the words above positive
    docs += [Document(f"f{i}", f"wiki/f{i}", f"filler {i}", f"weather report number w{i} .") for i in range(6)]
    return Corpus(docs, name="small")


@pytest.fixture()
def browser(tmp_path):
    c = small_corpus()
    return Browser(c, build_index(c, "sparse", tmp_path), topn=3, view_lines=2)


# --------------------------------------------------------------------------- conformance


def test_conformance_kit(domain, task):
    check_domain(domain, task)


def test_plugin_registers_through_entry_point():
    from swarm_runtime.plugins.manager import build_registry, make_plugin_manager

    reg = build_registry(make_plugin_manager())
    d = reg.get("domains", "openresearcher")
    assert [r.name for r in d.roles] == ["Searcher", "Opener", "Finder"]
    assert {"embedded", "local"} <= set(d.task_names())


def test_every_word_of_corpus_questions_and_browser_is_in_vocabulary(domain, task, enc):
    tok = build_tokenizer(domain.all_words(task), [0.0])
    texts = [" ".join(enc.corpus.page(i)[0]) for i in range(len(enc.corpus))]
    texts += [f"{q.question} {q.answer}" for q in enc.train_questions + enc.eval_questions]
    unk = {w for t in texts for w in unknown_words(tok, t)}
    assert not unk, sorted(unk)[:10]
    assert len(enc_vocabulary()) < 300  # a small closed vocabulary for the tiny models


def test_browser_error_messages_use_vocabulary(domain, task):
    tok = build_tokenizer(domain.all_words(task), [0.0])
    env = domain.make_env(task)
    env.reset(0)
    b = env.browser
    msgs = [b.open(5).text, b.find("born").text, b.search("   ").text]
    b.search("answer")
    msgs += [b.display(), b.open(0).text, b.find("x").text, b.open(cursor=9, loc=0).text, b.open(-1, loc=99).text]
    env.step("search kelda", "Searcher")
    env.step("open 0", "Opener")
    msgs += [b.find("nothing here").text, b.open(40).text, b.find("is").text]
    assert all(m for m in msgs)
    unk = {w for m in msgs for w in unknown_words(tok, m)}
    assert not unk, (sorted(unk), msgs)
    assert set(BROWSER_WORDS) <= set(domain.vocabulary(task))


# --------------------------------------------------------------------------- browser


def test_search_results_page_has_link_ids(browser):
    res = browser.search("bram kest")
    assert res.ok
    page = browser.stack[-1]
    assert page["kind"] == "search" and page["results"] == [1, 0]  # bram's page, then ada's (mentions bram)
    assert browser.lines(page) == ["[ 0 ] bram kest", "[ 1 ] ada vold"]
    assert res.text == "page 0 results for bram kest lines 0 - 1 of 2 :\n[ 0 ] bram kest\n[ 1 ] ada vold"
    assert browser.links(page) == [("wiki/bram", 0), ("wiki/ada", 0)]


def test_search_without_match_is_an_empty_results_page(browser):
    res = browser.search("qqq zzz")
    assert res.ok and "no results for qqq zzz" in res.text


def test_open_by_id_by_url_and_follow_doc_links(browser):
    browser.search("bram kest")
    res = browser.open(0)
    assert res.ok and browser.stack[-1] == {"kind": "doc", "doc": 1, "loc": 0, "end": 2}
    assert "page 1 bram kest lines 0 - 1 of 2" in res.text and "0 : bram kest is a person ." in res.text
    res = browser.open("wiki/ada")
    assert res.ok and browser.stack[-1]["doc"] == 0
    assert "1 : born in north kelda [ 0 ] in 1820 ." in res.text
    res = browser.open(0)  # the link "north kelda [ 0 ]" of ada's page
    assert res.ok and "north kelda is a place" in res.text
    res = browser.open(1, cursor=2)  # link 1 of the page at cursor 2 (ada): bram kest
    assert res.ok and browser.stack[-1]["doc"] == 1
    assert len(browser.stack) == 5


def test_open_scrolls_with_loc_and_num_lines(browser):
    browser.open("wiki/ada")
    res = browser.open(-1, loc=2, num_lines=3)
    assert res.ok and "lines 2 - 4 of 5" in res.text
    assert "2 : works as a Miner ." in res.text and "4 : likes the miner songs ." in res.text
    assert "1 :" not in res.text
    res = browser.open(-1, cursor=0, loc=4)  # default window (2 lines) clipped at the end
    assert res.ok and "lines 4 - 4 of 5" in res.text
    assert [p["loc"] for p in browser.stack] == [0, 2, 4]


def test_window_in_characters(tmp_path):
    c = small_corpus()
    b = Browser(c, build_index(c, "sparse", tmp_path), view_lines=0, view_chars=45)
    res = b.open("wiki/ada")
    # "ada vold is a person ." (22) + "born in north kelda [ 0 ] in 1820 ." (35) > 45: one line
    assert "lines 0 - 0 of 5" in res.text
    b.view_chars = 60
    assert "lines 0 - 1 of 5" in b.open(-1, loc=0).text


def test_find_is_case_insensitive_with_line_numbers_and_links(browser):
    browser.open("wiki/ada")
    res = browser.find("MINER")
    assert res.ok
    assert browser.lines(browser.stack[-1]) == ["[ 0 ] 2 : works as a Miner .", "[ 1 ] 4 : likes the miner songs ."]
    assert res.text.startswith("page 1 find miner in ada vold lines 0 - 1 of 2")
    res = browser.open(1)  # match 1 opens the document at its line
    assert res.ok and browser.stack[-1]["loc"] == 4 and "4 : likes the miner songs ." in res.text
    browser.find("north kelda", cursor=0)
    assert browser.lines(browser.stack[-1]) == ["[ 0 ] 1 : born in north kelda in 1820 ."]  # links stripped
    browser.open("wiki/ada")
    assert "no matches for zebra" in browser.find("zebra").text


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.open(7),  # unknown link id
        lambda b: b.open("wiki/nowhere"),  # unknown url
        lambda b: b.open("/etc/passwd"),  # never the file system
        lambda b: b.open("https://example.org/x"),  # never the network
        lambda b: b.open(2),  # a link that leaves the corpus
        lambda b: b.open(0, cursor=9),  # unknown cursor
        lambda b: b.open(-1, loc=50),  # beyond the last line
        lambda b: b.find("x", cursor=0),  # find on a results page
        lambda b: b.find("   "),
        lambda b: b.search(""),
    ],
)
def test_errors_are_clean_messages_and_leave_the_stack(browser, call):
    browser.search("ada vold")
    browser.open(0)
    browser.open(-1, loc=1)
    browser.open(0)  # north kelda (link 2 of it leaves the corpus)
    before = copy.deepcopy(browser.stack)
    res = call(browser)
    assert not res.ok and res.text.startswith("error :")
    assert browser.stack == before


def test_open_without_pages_is_an_error(browser):
    assert browser.open(0).text == "error : no pages yet"
    assert browser.display() == "no pages yet"


def test_markdown_links_and_front_matter():
    meta, body = split_front_matter("---\ntitle: The Page\nlang: en\n---\nhello [there](https://x.org/a) you\n")
    assert meta == {"title": "The Page", "lang": "en"} and body.startswith("hello")
    lines, urls = render_lines(body)
    assert lines == ["hello there [ 0 ] you"] and urls == ["https://x.org/a"]
    lines, _ = render_lines("word " * 40, width=30)
    assert all(len(ln) <= 30 for ln in lines) and len(lines) > 5


def test_browser_deepcopy_shares_corpus_and_copies_stack(browser):
    browser.search("ada")
    twin = copy.deepcopy(browser)
    assert twin.corpus is browser.corpus and twin.index is browser.index
    twin.open(0)
    assert len(twin.stack) == 2 and len(browser.stack) == 1


# --------------------------------------------------------------------------- BM25 and its cache


def test_bm25_ranking_sanity(enc, tmp_path):
    idx = build_index(enc.corpus, "rank_bm25", tmp_path)
    for q in enc.eval_questions:
        for hop in q.hops:
            top = idx.search(hop["query"], 3)
            assert enc.corpus.docs[top[0][0]].title == hop["title"]
            assert top[0][1] >= top[-1][1] > 0
    assert idx.search("qqq", 3) == []


def test_backends_give_identical_scores(enc, tmp_path):
    a = build_index(enc.corpus, "rank_bm25", tmp_path)
    b = build_index(enc.corpus, "sparse", tmp_path)
    for query in ["born in north", "guild guild founded by", "is a person .", "zzz"]:
        np.testing.assert_allclose(a.scores(query), b.scores(query), rtol=1e-9, atol=1e-9)
        ra, rb = a.search(query, 5), b.search(query, 5)
        assert [i for i, _ in ra] == [i for i, _ in rb]
        assert [s for _, s in ra] == pytest.approx([s for _, s in rb])


@pytest.mark.parametrize("backend", ["rank_bm25", "sparse"])
def test_index_cache_reused_and_invalidated(tmp_path, backend):
    c = small_corpus()
    first = build_index(c, backend, tmp_path)
    second = build_index(c, backend, tmp_path)
    assert not first.loaded_from_cache and second.loaded_from_cache
    np.testing.assert_allclose(first.scores("ada kelda"), second.scores("ada kelda"))
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert entries == [cache_key(c, backend, 1.5, 0.75, 0.25)]
    changed = Corpus(c.docs[:2] + [Document("k", "wiki/kelda", "north kelda", "north kelda is a town .")])
    third = build_index(changed, backend, tmp_path)
    assert not third.loaded_from_cache
    assert len(list(tmp_path.iterdir())) == 2
    assert third.scores("town")[2] > 0 and first.scores("town")[2] == 0


def test_damaged_cache_entry_is_rebuilt(tmp_path):
    c = small_corpus()
    build_index(c, "sparse", tmp_path)
    d = tmp_path / cache_key(c, "sparse", 1.5, 0.75, 0.25)
    (d / "postings.npy").write_bytes(b"garbage")
    again = build_index(c, "sparse", tmp_path)
    assert not again.loaded_from_cache and again.search("ada", 1)[0][0] == 0
    assert build_index(c, "sparse", tmp_path).loaded_from_cache


def test_bad_search_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown search backend 'bm42'; valid: rank_bm25, sparse"):
        build_index(small_corpus(), "bm42", tmp_path)
    with pytest.raises(ValueError, match=r"search.b=2.0 must be a number in \[0.0, 1.0\]"):
        build_index(small_corpus(), "sparse", tmp_path, b=2.0)


# --------------------------------------------------------------------------- generated corpus and questions


def test_encyclopedia_is_deterministic_and_sized(enc):
    again = Encyclopedia(seed=0)
    assert again.corpus.content_hash() == enc.corpus.content_hash()
    assert again.train_questions == enc.train_questions and again.eval_questions == enc.eval_questions
    assert Encyclopedia(seed=1).corpus.content_hash() != enc.corpus.content_hash()
    assert 2000 <= len(enc.corpus) <= 5000
    assert len(enc.train_questions) >= 5000 and len(enc.eval_questions) == 50
    train_q = {q.question for q in enc.train_questions}
    assert not train_q & {q.question for q in enc.eval_questions}
    assert len(train_q) == len(enc.train_questions)  # every question text is unique


def test_questions_are_multi_hop_and_answered_by_their_evidence(enc):
    c = enc.corpus
    for q in enc.train_questions + enc.eval_questions:
        assert 2 <= len(q.hops) <= 3 and 1 <= len(q.answer.split()) <= 2
        for i, hop in enumerate(q.hops):
            lines = c.page(c.by_title[hop["title"]])[0]
            fact = lines[hop["line"]]
            assert hop["keyword"] in fact
            assert [ln for ln in lines if hop["keyword"] in ln] == [fact]  # find hits one line
            nxt = q.hops[i + 1]["title"] if i + 1 < len(q.hops) else q.answer
            assert f" {nxt} " in f" {fact} "
    assert {q.qid.split(":")[0] for q in enc.eval_questions} > {"founder_born"}


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match=r"corpus size people=99999 must be an integer in \[2, 1296\]"):
        Encyclopedia(sizes={"people": 99999})
    with pytest.raises(ValueError, match="unknown corpus size key"):
        Encyclopedia(sizes={"robots": 3})


# --------------------------------------------------------------------------- loaders


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_corpus_and_questions(tmp_path):
    corpus = load_corpus(
        _write_jsonl(
            tmp_path / "c.jsonl",
            [
                {
                    "docid": "1",
                    "url": "https://a.org/1",
                    "text": "---\ntitle: Alpha Page\n---\nAlpha text [b](https://a.org/2)",
                },
                {"docid": "2", "url": "https://a.org/2", "text": "Beta first line\nmore"},
            ],
        )
    )
    assert [d.title for d in corpus.docs] == ["Alpha Page", "Beta first line"]
    assert corpus.docs[0].text == "Alpha text [b](https://a.org/2)"
    assert corpus.page(0) == (["Alpha text b [ 0 ]"], ["https://a.org/2"])
    qs = load_questions(
        _write_jsonl(tmp_path / "q.jsonl", [{"qid": i, "question": f"q{i}?", "answer": f"a{i}"} for i in range(10)])
    )
    assert [q.qid for q in qs] == [str(i) for i in range(10)] and qs[3].answer == "a3"
    train, ev = split_questions(qs, 3, seed=0)
    assert len(train) == 7 and len(ev) == 3 and not {q.qid for q in train} & {q.qid for q in ev}
    assert split_questions(qs, 3, seed=0) == (train, ev)


def test_loader_errors_name_the_problem(tmp_path):
    bad = _write_jsonl(tmp_path / "c.jsonl", [{"docid": "1", "body": "x"}])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['url', 'text'\]; required: \['docid', 'url', 'text'\]"):
        load_corpus(bad)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['answer'\]"):
        load_questions(_write_jsonl(tmp_path / "q.jsonl", [{"qid": 1, "question": "x"}]))
    with pytest.raises(ValueError, match="duplicate qid '1'"):
        load_questions(_write_jsonl(tmp_path / "d.jsonl", [{"qid": 1, "question": "x", "answer": "y"}] * 2))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpus(tmp_path / "nope.jsonl")
    (tmp_path / "c.csv").write_text("docid,url,text\n")
    with pytest.raises(ValueError, match="unsupported extension '.csv'; valid: .jsonl, .json, .parquet"):
        load_corpus(tmp_path / "c.csv")
    (tmp_path / "broken.jsonl").write_text('{"docid": 1}\n{oops\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        load_corpus(tmp_path / "broken.jsonl")
    with pytest.raises(ValueError, match="eval_count=5 must be between 1 and 1"):
        split_questions(
            load_questions(
                _write_jsonl(tmp_path / "two.jsonl", [{"qid": i, "question": "x", "answer": "y"} for i in range(2)])
            ),
            5,
        )


def test_parquet_loaders(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"docid": ["1"], "url": ["u1"], "text": ["---\ntitle: T\n---\nbody"]})
    pq.write_table(table, tmp_path / "c.parquet")
    pq.write_table(pa.table({"qid": ["q"], "question": ["?"], "answer": ["a"]}), tmp_path / "q.parquet")
    assert load_corpus(tmp_path / "c.parquet").docs[0].title == "T"
    assert load_questions(tmp_path / "q.parquet")[0].answer == "a"
    pq.write_table(pa.table({"docid": ["1"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="lacks column"):
        load_corpus(tmp_path / "bad.parquet")


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "c.parquet").write_bytes(b"PAR1")
    with pytest.raises(ImportError, match="needs pyarrow: pip install pyarrow"):
        load_corpus(tmp_path / "c.parquet")


def _local_task(domain, tmp_path, rows, qs):
    """``task=local`` over ``rows`` (corpus) and ``qs`` (questions) written as JSONL, 10 eval questions."""
    cfg = domain.task_config("local")
    cfg.corpus_path = str(_write_jsonl(tmp_path / "c.jsonl", rows))
    cfg.questions_path = str(_write_jsonl(tmp_path / "q.jsonl", qs))
    cfg.search.cache_dir = str(tmp_path / "cache")
    cfg.eval_questions = 10
    return cfg


def test_local_task_runs_on_jsonl_files(domain, tmp_path):
    rows = [
        {
            "docid": str(i),
            "url": f"https://x.org/{i}",
            "text": f"---\ntitle: Page {i}\n---\nThe capital of land{i} "
            f"is city{i}.\nSee [next](https://x.org/{(i + 1) % 60}).",
        }
        for i in range(60)
    ]
    qs = [{"qid": f"q{i}", "question": f"What is the capital of land{i}?", "answer": f"city{i}"} for i in range(60)]
    cfg = _local_task(domain, tmp_path, rows, qs)
    env = domain.make_env(cfg)
    obs = env.reset(1_000_000)
    assert "question : What is the capital of land" in obs and env.expert_action() is None
    r = env.step("search capital land7", "Searcher")
    assert r.valid and "[ 0 ] Page 7" in r.observation
    r = env.step("open 0", "Opener")
    assert "The capital of land7 is city7." in r.observation
    r = env.step("open 0", "Opener")  # the [next] link
    assert "land8" in r.observation
    assert "city7" in domain.vocabulary(cfg)
    cfg.evidence_credit = 0.5  # real questions carry no evidence hops
    with pytest.raises(ValueError, match="evidence_credit 0.5 needs questions with evidence hops"):
        domain.make_env(cfg)
    cfg.evidence_credit = 0.0
    cfg.corpus_path = None
    with pytest.raises(ValueError, match="needs corpus_path"):
        domain.make_env(cfg)


# --------------------------------------------------------------------------- judges


def test_normalisation_and_f1_worked_by_hand():
    assert normalize_answer("The  North-Kelda!") == "northkelda"
    assert normalize_answer("an Old  Town.") == "old town"
    assert token_f1("north kelda", "north kelda") == 1.0
    assert token_f1("north", "north kelda") == pytest.approx(2 * 1.0 * 0.5 / 1.5)  # P=1, R=1/2
    assert token_f1("south tarn", "north kelda") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0


def test_exact_judge():
    j = ExactJudge()
    assert j.grade("q", "North Kelda", "the north kelda .").correct is True
    assert j.grade("q", "north kelda", "north").correct is False
    assert ExactJudge(f1_threshold=0.6).grade("q", "north kelda", "north").correct is True
    with pytest.raises(ValueError, match="f1_threshold=0"):
        ExactJudge(0)
    with pytest.raises(ValueError, match="unknown judge 'gpt'; valid: exact, llm"):
        make_judge("gpt")
    with pytest.raises(ValueError, match=r"unknown llm_judge key\(s\) \['modle'\]"):
        make_judge("llm", llm_cfg={"modle": "x"})


# --------------------------------------------------------------------------- env


@pytest.mark.parametrize(
    "text, expect",
    [
        ("search north kelda", ("search", "north kelda", -1, -1, -1, -1, 0)),
        ("search north kelda top 5", ("search", "north kelda", -1, -1, -1, -1, 5)),
        ("open 3", ("open", "", 3, -1, -1, -1, 0)),
        ("open 3 cursor 1 at 4", ("open", "", 3, 1, 4, -1, 0)),
        ("open at 6 lines 2", ("open", "", -1, -1, 6, 2, 0)),
        ("open wiki/ada at 2", ("open", "wiki/ada", -1, -1, 2, -1, 0)),
        ("find born", ("find", "born", -1, -1, -1, -1, 0)),
        ("find founded by cursor 2", ("find", "founded by", -1, 2, -1, -1, 0)),
        ("answer north kelda", ("answer", "north kelda", -1, -1, -1, -1, 0)),
    ],
)
def test_parse_action(text, expect):
    a = parse_action(text)
    assert (a.tool, a.text, a.id, a.cursor, a.loc, a.num_lines, a.topn) == expect


@pytest.mark.parametrize(
    "text",
    [
        "",
        "zzqx florp",
        "search",
        "open",
        "open 3 at",
        "open 3 at x",
        "open x cursor 1",
        "open 1 at 2 at 3",
        "find",
        "answer",
        "jump 3",
    ],
)
def test_parse_action_rejects(text):
    assert parse_action(text) is None


def test_roles_own_their_tools(domain, task):
    env = domain.make_env(task)
    env.reset(0)
    for text, role in [
        ("search kelda", "Opener"),
        ("open 0", "Searcher"),
        ("find born", "Searcher"),
        ("search kelda", "Boss"),
    ]:
        obs = env.observation()
        r = env.step(text, role)
        assert not r.valid and r.reward == 0 and r.observation == obs
    failed = 0
    for text, role in [
        ("search kelda", "Searcher"),
        ("open 0", "Opener"),
        ("find is", "Finder"),
        ("search kelda", None),
    ]:  # a monolithic model may call every tool
        r = env.step(text, role)
        # its own tool is called; a call the browser refuses (no such link) is not a valid action either
        assert r.valid == ("tool_error" not in r.info)
        failed += not r.valid
    assert env.step("search kelda", "Searcher").valid
    assert env.metrics()["invalid_actions"] == 4 and env.metrics()["tool_errors"] == failed


def test_answer_rewards_and_ends(domain, task):
    env = domain.make_env(task)
    env.reset(5)
    q = env.question
    r = env.step(f"answer {q.answer}", "Searcher")
    assert r.done and r.reward == 1.0 and r.info["correct"] is True
    assert env.metrics()["success"] == 1.0
    env.reset(5)
    r = env.step("answer nobody", "Opener")
    assert r.done and r.reward == 0.0 and r.info["correct"] is False and "reward_missing" not in r.info


@pytest.fixture()
def credit_task(task):
    cfg = copy.deepcopy(task)
    cfg.evidence_credit = 0.5
    return cfg


def test_evidence_credit_pays_each_hop_once_and_a_correct_episode_totals_one(domain, credit_task):
    env = domain.make_env(credit_task)
    for seed in range(6):
        env.reset(seed)
        hops, rewards = len(env.question.hops), []
        while (step := env.expert_action()) is not None:
            rewards.append(env.step(step.action, step.role).reward)
        paid = [r for r in rewards[:-1] if r]
        assert paid == [pytest.approx(0.5 / hops)] * hops  # one payment per hop, when its fact is first shown
        assert rewards[-1] == pytest.approx(0.5) and sum(rewards) == pytest.approx(1.0)
        assert env.metrics()["success"] == 1.0
    # a wrong answer keeps the evidence credit it earned and no more
    env.reset(0)
    while (step := env.expert_action()) is not None and not step.action.startswith("answer"):
        env.step(step.action, step.role)
    snap = env.snapshot()
    assert env.step("answer nobody", "Finder").reward == 0.0 and env.paid == pytest.approx(0.5)
    env.restore(snap)  # the paid credit is part of the snapshot
    assert env.paid == pytest.approx(0.5) and env.step(
        f"answer {env.question.answer}", "Finder"
    ).reward == pytest.approx(0.5)


def test_evidence_credit_passes_the_conformance_kit(domain, credit_task):
    check_domain(domain, credit_task)  # returns stay within [0, reward_max = 1]


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_bad_evidence_credit_is_named(domain, task, bad):
    cfg = copy.deepcopy(task)
    cfg.evidence_credit = bad
    with pytest.raises(ValueError, match=f"evidence_credit {bad!r} must be in \\[0, 1\\)"):
        domain.make_env(cfg)


def test_decision_cap_ends_unanswered(domain, task):
    env = domain.make_env(task)
    env.reset(0)
    results = [env.step("find zebra" if i % 2 else "zzqx", "Finder") for i in range(int(task.max_decisions))]
    assert [r.done for r in results] == [False] * (len(results) - 1) + [True]
    assert results[-1].info["timeout"] and results[-1].reward == 0
    m = env.metrics()
    assert m["answered"] == 0 and m["decisions"] == task.max_decisions and m["tool_errors"] == 10


def test_missing_grade_is_flagged_not_zeroed(domain, task):
    env = domain.make_env(task)
    env.reset(0)

    class Down:
        def grade(self, question, reference, answer):
            return Grade(correct=None, missing=True, attempts=3, error="InternalServerError: 500")

    world = copy.copy(env.world)
    world.judge = Down()
    env.world = world
    r = env.step(f"answer {env.question.answer}", "Finder")
    assert r.done and r.reward == 0.0 and r.info["reward_missing"] is True and "correct" not in r.info
    assert env.metrics()["reward_missing"] == 1.0 and env.metrics()["success"] == 0.0


def test_seeds_pick_train_and_held_out_questions(domain, task, enc):
    env = domain.make_env(task)
    held = [env.world.question_for(s) for s in domain.episode_seeds(task, "eval")]
    assert held == enc.eval_questions
    train = {env.world.question_for(s).qid for s in domain.episode_seeds(task, "train")}
    assert len(train) == len(enc.train_questions) and not train & {q.qid for q in held}


def test_dev_split_is_disjoint_and_leaves_train_eval_and_corpus_unchanged(domain, task, enc):
    """The dev questions (tuning) come from templates no train or eval question uses, over the
    same corpus: the train and eval questions and the documents are those of a world without
    them (so the default run and its documented figures do not change)."""
    from swarm_domains.openresearcher.encyclopedia import DEV_TEMPLATES, TEMPLATES

    with_dev = Encyclopedia(seed=0, dev_questions=50)
    assert with_dev.train_questions == enc.train_questions and with_dev.eval_questions == enc.eval_questions
    assert [(d.docid, d.text) for d in with_dev.corpus.docs] == [(d.docid, d.text) for d in enc.corpus.docs]
    assert enc.dev_questions == [] and len(with_dev.dev_questions) == 50
    texts = {q.question for q in enc.train_questions + enc.eval_questions}
    assert not texts & {q.question for q in with_dev.dev_questions}
    assert not {t[1] for t in TEMPLATES} & {t[1] for t in DEV_TEMPLATES}
    assert len({q.qid.split(":")[0] for q in with_dev.dev_questions}) >= 6  # a mix of the dev templates
    env = domain.make_env(task)
    dev_seeds = domain.episode_seeds(task, "dev")
    assert dev_seeds == list(range(2_000_000, 2_000_050))
    assert [env.world.question_for(s) for s in dev_seeds] == with_dev.dev_questions
    for seed in dev_seeds:  # the expert solves each (its hops exist in the corpus), as on eval
        env.reset(seed)
        total = 0.0
        while not env.done:
            e = env.expert_action()
            r = env.step(e.action, e.role)
            assert r.valid, (e, r.observation)
            total += r.reward
        assert total == 1.0 and env.decisions <= 12, env.question
    with pytest.raises(ValueError, match=r"dev_seeds count 6000 must be in \[1, 5013\]"):
        Encyclopedia(seed=0, dev_questions=6000)


def test_local_dev_split_comes_out_of_the_training_questions(domain, tmp_path):
    rows = [
        {"docid": str(i), "url": f"https://x.org/{i}", "text": f"The capital of land{i} is city{i}."} for i in range(40)
    ]
    qs = [{"qid": f"q{i}", "question": f"What is the capital of land{i}?", "answer": f"city{i}"} for i in range(40)]
    cfg = _local_task(domain, tmp_path, rows, qs)
    plain = domain.make_env(cfg).world
    cfg.dev_seeds = {"start": 2_000_000, "count": 5}
    world = domain.make_env(cfg).world
    assert world.eval == plain.eval and len(world.dev) == 5 and len(world.train) == 25
    assert {q.qid for q in world.train} | {q.qid for q in world.dev} == {q.qid for q in plain.train}
    check_splits(domain, cfg)  # seeds, and the questions they pick
    assert world.question_for(2_000_003) == world.dev[3]


@pytest.mark.parametrize(
    "domain_task,key",
    [
        ("openresearcher/embedded", "dev_seeds"),
        ("openresearcher/local", "dev_seeds"),
        ("vln_ce/r2r", "habitat.dev_split"),
    ],
)
def test_a_run_folder_from_before_the_dev_split_still_loads(tmp_path, registry, domain_task, key):
    """config version 2 had no openresearcher dev_seeds (nor vln_ce habitat.dev_split): such a
    folder loads without them (no dev split: eval.split=dev is refused); a version-3 file lacking
    them is truncated."""
    from omegaconf import OmegaConf

    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import load_saved, resolve
    from swarm_runtime.config.schema import CONFIG_VERSION

    reg = registry[1]
    name, task = domain_task.split("/")
    cfg = OmegaConf.to_container(resolve([f"domain={name}", f"task={task}"], reg))
    node = cfg["task"]
    *parents, last = key.split(".")
    for p in parents:
        node = node[p]
    node.pop(last)
    cfg["config_version"] = 2
    OmegaConf.save(OmegaConf.create(cfg), tmp_path / "config.yaml")
    loaded = load_saved(tmp_path / "config.yaml", reg)
    assert OmegaConf.select(loaded.task, key) is None and loaded.config_version == CONFIG_VERSION
    cfg["config_version"] = CONFIG_VERSION
    OmegaConf.save(OmegaConf.create(cfg), tmp_path / "config.yaml")
    with pytest.raises(ConfigError, match=f"lacks task.{key}"):
        load_saved(tmp_path / "config.yaml", reg)


def test_eval_on_the_dev_split_through_the_cli(tmp_path):
    """`swarm eval RUN eval.split=dev` plays the dev questions; eval.json and the eval file record the
    library versions, and the footer prints them."""
    from conftest import swarm

    run = tmp_path / "run"
    res = swarm(
        "run",
        "domain=openresearcher",
        "task=embedded",
        "task.max_decisions=4",
        "algo.sft.demo_episodes=2",
        "algo.sft.epochs=1",
        "algo.sft.action_epochs=1",
        "algo.envs_per_step=2",
        "algo.iterations=0",
        "eval.episodes=2",
        "eval.runs=1",
        "progress=false",
        f"run_dir={run}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    ev = json.loads((run / "eval.json").read_text())
    assert sorted(ev["results"]["SFT only"]["seed_rewards"]) == ["1000000", "1000001"]  # 0 updates: one row
    from swarm_runtime.runs.provenance import versions_line

    assert ev["versions"]["transformers"] and versions_line(ev["versions"]).startswith("versions: python ")
    res = swarm("eval", str(run), "eval.split=dev", "eval.episodes=3", "eval.runs=1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "3 held-out seeds (dev split) x 1 runs" in res.stdout
    out = json.loads(next(run.glob("eval-*eval.split=dev*.json")).read_text())
    assert sorted(out["seed_rewards"]) == ["2000000", "2000001", "2000002"] and out["eval_split"] == "dev"
    assert versions_line(out["versions"]) in res.stdout
    assert {k: v for k, v in out["versions"].items() if k != "commit"} == {
        k: v for k, v in ev["versions"].items() if k != "commit"
    }


def test_snapshot_restore_is_exact_and_cheap(domain, task):
    env = domain.make_env(task)
    env.reset(11)
    for _ in range(3):
        e = env.expert_action()
        env.step(e.action, e.role)
    snap = env.snapshot()
    assert snap["world"] is env.world  # the corpus, index and judge are shared, not copied
    obs, stack = env.observation(), copy.deepcopy(env.browser.stack)
    trace = []
    while not env.done:
        e = env.expert_action()
        trace.append(env.step(e.action, e.role).observation)
    env.restore(snap)
    assert env.observation() == obs and env.browser.stack == stack and not env.done
    again = []
    while not env.done:
        e = env.expert_action()
        again.append(env.step(e.action, e.role).observation)
    assert again == trace


def test_expert_solves_every_held_out_question_with_short_observations(domain, task):
    env = domain.make_env(task)
    longest, roles = 0, {}
    for seed in domain.episode_seeds(task, "eval"):
        obs = env.reset(seed)
        total = 0.0
        while not env.done:
            longest = max(longest, len(split_words(obs)))
            e = env.expert_action()
            r = env.step(e.action, e.role)
            assert r.valid and "tool_error" not in r.info, (e, r.observation)
            verb = e.action.split()[0]
            roles.setdefault(e.role, set()).add(verb)
            obs, total = r.observation, total + r.reward
        assert total == 1.0 and env.decisions <= 10, env.question
    assert longest <= 70
    # each role's demos hold only its own tool (plus answers)
    assert roles["Searcher"] == {"search"} and roles["Opener"] <= {"open", "answer"}
    assert roles["Finder"] <= {"find", "answer"} and "find" in roles["Finder"]
