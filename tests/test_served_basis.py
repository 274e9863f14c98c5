"""Served samples say whose log-probs they carry (docs/guides/serve.md, "Served traffic as experience" and "Training on
served traffic"): our worker echoes ``"swarm_logprobs": "learner"`` when it answered in the learner's basis, every
recorded sample keeps ``logprobs_basis`` (:func:`swarm_runtime.serve.answerer.sample`, one function for the gateway's
completions and intercepted chat calls), and learn/served.py trains on a sampler-basis sample only at temperature 1.
The worker runs in process (its FastAPI app, batcher and completer) on a tiny byte-level BPE checkpoint."""

import json

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import make_local_checkpoint, run_context  # noqa: E402
from test_serve import RUN_ARGS  # noqa: E402
from test_serve_openai import PROMPT, TEMPLATE  # noqa: E402

from swarm_runtime.serve.answerer import TOKEN_FIELDS, sample  # noqa: E402

MESSAGES = [{"role": "user", "content": "goal wooden_pickaxe . action :"}]


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """A worker's app (``python -m swarm_runtime.serve.worker``'s, in process) on a checkpoint with a chat template."""
    import torch
    from fastapi.testclient import TestClient

    from swarm_runtime.serve.worker import WorkerOptions, load_policy
    from swarm_runtime.serve.worker_app import make_app

    torch.set_num_threads(1)
    ckpt = make_local_checkpoint(tmp_path_factory.mktemp("basis") / "bpe")
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    opts = WorkerOptions(model=str(ckpt), name="bpe")
    with TestClient(make_app(load_policy(opts), opts)) as client:
        yield client


def test_the_worker_says_when_its_log_probs_are_the_learners(worker):
    """Asked as the gateway asks (``TOKEN_FIELDS``: ``swarm_logprobs: "learner"``), a completion's and a chat
    completion's choices carry ``"swarm_logprobs": "learner"``, and their samples ``logprobs_basis: "learner"``; asked
    without it (as vLLM answers: the field ignored), or with vLLM's token-level fields (scored as vLLM scores them),
    they carry none, and the sample's basis is the sampler's."""

    def complete(**body):
        r = worker.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "seed": 3, **body})
        assert r.status_code == 200, r.text
        return r.json()

    def chat(**body):
        r = worker.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 6, "seed": 3, **body})
        assert r.status_code == 200, r.text
        return r.json()

    ours = complete(temperature=0.7, **TOKEN_FIELDS)
    assert ours["choices"][0]["swarm_logprobs"] == "learner" and ours["choices"][0]["logprobs"]
    assert sample(ours, "Logger@v1", PROMPT)["logprobs_basis"] == "learner"
    for other in (
        complete(temperature=0.7, return_token_ids=True, logprobs=0),
        complete(temperature=0.7, **TOKEN_FIELDS, stop_token_ids=[0]),
    ):
        assert "swarm_logprobs" not in other["choices"][0] and other["choices"][0]["logprobs"]
        assert sample(other, "Logger@v1", PROMPT)["logprobs_basis"] == "sampler"
    # as the intercept route asks a chat call
    said = chat(temperature=0.7, **{**TOKEN_FIELDS, "logprobs": True, "top_logprobs": 0})
    assert said["choices"][0]["swarm_logprobs"] == "learner" and said["choices"][0]["logprobs"]["content"]
    drawn = sample(said, "Logger@v1", messages=MESSAGES, temperature=0.7)
    assert drawn["logprobs_basis"] == "learner" and drawn["prompt_ids"] and drawn["token_ids"]
    plain = chat(temperature=0.7, return_token_ids=True, logprobs=True)
    assert "swarm_logprobs" not in plain["choices"][0] and plain["choices"][0]["logprobs"]["content"]
    assert sample(plain, "Logger@v1", messages=MESSAGES, temperature=0.7)["logprobs_basis"] == "sampler"


def test_one_sample_for_completions_and_chat_calls():
    """:func:`sample` keeps what the gateway's completion sample and the intercept route's chat sample kept before
    they were one function (the same fields, in the same order), plus ``logprobs_basis``."""
    completion = {
        "choices": [
            {
                "text": "chop tree",
                "prompt_token_ids": [5, 6],
                "token_ids": [7, 8],
                "logprobs": {"token_logprobs": [-0.25, None]},
                "swarm_logprobs": "learner",
            }
        ]
    }
    got = sample(completion, "Logger@v2", "goal :")
    assert list(got) == ["version", "prompt", "text", "prompt_ids", "token_ids", "logprobs", "logprobs_basis"]
    assert got == {
        "version": "Logger@v2",
        "prompt": "goal :",
        "text": "chop tree",
        "prompt_ids": [5, 6],
        "token_ids": [7, 8],
        "logprobs": [-0.25, None],
        "logprobs_basis": "learner",
    }
    bare = sample({"choices": [{"text": "x"}]}, None, "p")  # a server without vLLM's extensions: text only
    assert bare == {
        "version": None,
        "prompt": "p",
        "text": "x",
        "prompt_ids": None,
        "token_ids": None,
        "logprobs": None,
        "logprobs_basis": "sampler",
    }
    chat = {
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "message": {"role": "assistant", "content": "mine stone"},
                "token_ids": [9],
                "logprobs": {"content": [{"token": "mine stone", "logprob": -1}]},
            }
        ],
    }
    got = sample(chat, "Smith@v1", messages=MESSAGES, temperature=1)
    before = ("version", "temperature", "messages", "prompt", "text", "prompt_ids", "token_ids", "logprobs")
    assert list(got) == [*before, "logprobs_basis"]
    assert got == {
        "version": "Smith@v1",
        "temperature": 1.0,
        "messages": MESSAGES,
        "prompt": None,
        "text": "mine stone",
        "prompt_ids": [1, 2, 3],
        "token_ids": [9],
        "logprobs": [-1.0],
        "logprobs_basis": "sampler",
    }
    assert isinstance(got["temperature"], float) and isinstance(got["logprobs"][0], float)
    chat["choices"][0]["swarm_logprobs"] = "learner"
    assert sample(chat, "Smith@v1", messages=MESSAGES, temperature=1)["logprobs_basis"] == "learner"


def _line(eid: str, agent, prompt: str, temperature: float, echoed: bool | None) -> dict:
    """A served transcript line: one acted turn whose action sample comes from an agent's completion that echoed the
    learner's basis (``echoed``), did not (a vLLM agent), or (None) was written before ``logprobs_basis`` existed."""
    policy = agent.policy
    choice = {
        "text": "x",
        "prompt_token_ids": list(policy.encode_prompt(prompt)),
        "token_ids": [1, 2],
        "logprobs": {"token_logprobs": [-0.5, -0.25]},
        **({"swarm_logprobs": "learner"} if echoed else {}),
    }
    act = sample({"choices": [choice]}, f"{agent.role}@v1", prompt)
    if echoed is None:
        del act["logprobs_basis"]
    turn = {"t": 0, "agent": agent.role, "role": agent.role, "bid": 0.4, "reward": 1.0, "valid": True}
    return {
        "id": eid,
        "status": "done",
        "env": "server",
        "seed": 1,
        "temperature": temperature,
        "turns": [turn],
        "samples": [{"bids": {}, "action": act}],
    }


def test_sampler_basis_is_trained_on_only_at_temperature_one(registry, tmp_path):
    """learn/served.py: a sample whose log-probs are the sampler's own is used when the run samples at temperature 1
    (vLLM's default raw log-probs are then the learner's basis) and skipped at another, the reason counted in the
    report; the learner's basis, and an older line without ``logprobs_basis`` (read as the learner's), are used at
    either."""
    import torch

    from swarm_runtime.learn.served import load_served

    torch.set_num_threads(1)
    agents, _ = run_context(registry, *RUN_ARGS).build_swarm()
    prompt = "goal wooden_pickaxe . inventory : none . action :"
    for T in (1.0, 0.7):
        path = tmp_path / f"episodes-{T:g}.jsonl"
        kinds = {"learner": True, "sampler": False, "old": None}
        lines = [_line(f"ep-{k}", agents[0], prompt, T, echoed) for k, echoed in kinds.items()]
        assert "logprobs_basis" not in lines[2]["samples"][0]["action"]
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        episodes, report = load_served([path], agents, T)
        if T == 1.0:
            assert report.used == 3 and not report.skipped, report.summary()
        else:
            why = "log-probs not in the learner's basis at temperature 0.7"
            assert report.used == 2 and report.skipped == {why: 1}, report.summary()
            assert f"1 {why}" in report.summary()
        assert all(e.turns[0].action_logprobs == [-0.5, -0.25] for e in episodes)
