"""A worker as an OpenAI-compatible server: chat completions over the model's chat template,
server-sent events, ``stop``, ``top_p``, ``echo``, token-id prompts, and a prompt beyond the context
refused. One worker process on a byte-level BPE checkpoint with a chat template, real HTTP on 127.0.0.1."""

import json

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from conftest import make_local_checkpoint  # noqa: E402
from test_serve import worker_on  # noqa: E402

TEMPLATE = (
    "{% for m in messages %}<|endoftext|>{{ m['role'] }} : {{ m['content'] }} . {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
PROMPT = "you are Logger . goal wooden_pickaxe . action :"


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openai")
    ckpt = make_local_checkpoint(tmp / "bpe")
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    with worker_on(ckpt, tmp / "w.log") as url:
        yield url


def _events(r: httpx.Response) -> list:
    assert r.headers["content-type"].startswith("text/event-stream")
    lines = [x for x in r.text.split("\n\n") if x]
    assert all(x.startswith("data: ") for x in lines) and lines[-1] == "data: [DONE]"
    return [json.loads(x[6:]) for x in lines[:-1]]


def test_completions_stream_stop_echo_and_token_ids(worker):
    def ask(**body):
        r = httpx.post(
            f"{worker}/v1/completions", timeout=60, json={"prompt": PROMPT, "max_tokens": 8, "seed": 3, **body}
        )
        assert r.status_code == 200, r.text
        return r

    full = ask().json()["choices"][0]
    # the model asked for answers (this worker's own when none is named), as OpenAI answers
    assert ask().json()["model"] == "bpe" and ask(model="bpe").json()["model"] == "bpe"
    assert full["text"] and full["finish_reason"] in ("stop", "length")
    # streaming: the same keyed draw, token piece by piece, then the finish and the usage
    chunks = _events(ask(stream=True))
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == full["text"] and len([c for c in chunks if c["choices"] and c["choices"][0]["text"]]) > 1
    assert chunks[-2]["choices"][0]["finish_reason"] == full["finish_reason"] and chunks[-1]["usage"]
    # stop: cut before the first stop string found
    stop = full["text"][2:4]
    cut = ask(stop=[stop, "never-there"]).json()["choices"][0]
    assert cut["text"] == full["text"][: full["text"].find(stop)] and cut["finish_reason"] == "stop"
    assert cut["stop_reason"] == stop
    lp = ask(stop=stop, logprobs=1).json()["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == cut["text"]
    # echo: the prompt first
    assert ask(echo=True).json()["choices"][0]["text"] == PROMPT + full["text"]
    # token ids: the same ids the text prompt encodes to give the same draw
    from transformers import AutoTokenizer

    ids = httpx.post(f"{worker}/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}).json()["usage"]
    assert ids["prompt_tokens"] > 0
    tok_ids = AutoTokenizer.from_pretrained(_ckpt_of(worker))(PROMPT, add_special_tokens=False).input_ids
    by_ids = ask(prompt=tok_ids).json()["choices"][0]
    assert by_ids["text"] == full["text"]
    assert ask(prompt=[tok_ids, tok_ids]).json()["choices"][1]["text"] == full["text"]
    bad = httpx.post(f"{worker}/v1/completions", json={"prompt": [10**6]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"
    long = httpx.post(f"{worker}/v1/completions", json={"prompt": list(tok_ids) * 200})
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"


def _ckpt_of(worker: str) -> str:
    return httpx.get(f"{worker}/v1/models").json()["data"][0]["root"]


def test_top_p_keeps_the_nucleus(worker):
    """A tiny top_p keeps one token per step: the answer is the greedy one whatever the seed."""

    def ask(**body):
        return httpx.post(
            f"{worker}/v1/completions", timeout=60, json={"prompt": PROMPT, "max_tokens": 6, **body}
        ).json()["choices"][0]["text"]

    greedy = ask(temperature=0)
    assert {ask(seed=s, top_p=1e-9) for s in range(4)} == {greedy}
    assert len({ask(seed=s, temperature=2.0) for s in range(6)}) > 1  # without it, the draws differ
    r = httpx.post(f"{worker}/v1/completions", json={"prompt": PROMPT, "top_p": 0})
    assert r.status_code == 422 and r.json()["error"]["param"] == "top_p"


def test_chat_completions_with_the_template(worker):
    msgs = [{"role": "system", "content": "you are Logger"}, {"role": "user", "content": "goal wooden_pickaxe"}]
    r = httpx.post(f"{worker}/v1/chat/completions", timeout=60, json={"messages": msgs, "max_tokens": 6, "seed": 9})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["model"] == "bpe"
    # the model a chat asks for is the completion's: this worker's answers with it, another is a 404
    named = httpx.post(f"{worker}/v1/chat/completions", json={"model": "bpe", "messages": msgs, "max_tokens": 2})
    assert named.status_code == 200 and named.json()["model"] == "bpe", named.text
    other = httpx.post(f"{worker}/v1/chat/completions", json={"model": "Wizard", "messages": msgs, "max_tokens": 2})
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found", other.text
    # it is the completion of the rendered template
    rendered = "".join(f"<|endoftext|>{m['role']} : {m['content']} . " for m in msgs) + "assistant :"
    same = httpx.post(
        f"{worker}/v1/completions", timeout=60, json={"prompt": rendered, "max_tokens": 6, "seed": 9}
    ).json()["choices"][0]["text"]
    assert body["choices"][0]["message"]["content"] == same
    chunks = _events(
        httpx.post(
            f"{worker}/v1/chat/completions",
            timeout=60,
            json={"messages": msgs, "max_tokens": 6, "seed": 9, "stream": True},
        )
    )
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["model"] for c in chunks} == {"bpe"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == same
    for bad, param in (
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"messages": msgs, "temperature": "hot"}, "temperature"),
    ):
        r = httpx.post(f"{worker}/v1/chat/completions", json=bad)
        assert r.status_code == 422 and r.json()["error"]["param"] == param, r.text
