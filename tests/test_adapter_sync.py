"""``AdapterSync`` (swarm_runtime/sampling/sync.py) over real HTTP, against a small server that keeps vLLM's runtime
LoRA endpoints' books (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, ``/v1/models``) and answers their
errors as vLLM does: which versions it loads and unloads, the version it names while several are kept
(``rollout.max_staleness`` > 0), strays and reloads, and each refusal as one clear error. A learner that writes
adapter folders stands in for the trainer's. No model: the file costs well under a second."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.sampling.http import Client, EngineError
from swarm_runtime.sampling.sync import AdapterSync, lora_slots, version_name


class LoraServer(ThreadingHTTPServer):
    """The adapters loaded (name -> path), every load and unload asked for, and scripted refusals
    (``refuse[(path, name)] = (status, message)``)."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), LoraHandler)
        self.adapters: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.refuse: dict[tuple[str, str], tuple[int, str]] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class LoraHandler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        srv = self.server
        models = [{"id": "base", "root": "/nowhere/base", "parent": None}]
        models += [{"id": n, "root": p, "parent": "base"} for n, p in srv.adapters.items()]
        self._answer(200, {"data": models})

    def do_POST(self) -> None:
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        name = body["lora_name"]
        srv.calls.append((self.path, name))
        if (self.path, name) in srv.refuse:
            status, message = srv.refuse[(self.path, name)]
            return self._answer(status, {"error": {"message": message}})
        if self.path == "/v1/load_lora_adapter":
            if name in srv.adapters and not body.get("load_inplace"):
                return self._answer(400, {"error": {"message": f"The lora adapter '{name}' has already been loaded."}})
            srv.adapters[name] = body["lora_path"]
        elif name in srv.adapters:
            del srv.adapters[name]
        else:
            return self._answer(404, {"error": {"message": f"The lora adapter '{name}' cannot be found."}})
        self._answer(200, {})


class Learner:
    """Each model's version, and ``export``: an adapter folder whose config has rank ``rank``."""

    def __init__(self, **versions: int):
        self.versions, self.rank = dict(versions), 8

    def version(self, model: str) -> int:
        return self.versions[model]

    def export(self, model: str, path: Path) -> None:
        path.mkdir(parents=True)
        cfg = {"r": 8, "rank_pattern": {"q_proj": self.rank}}
        (path / "adapter_config.json").write_text(json.dumps({**cfg, "version": self.versions[model]}))


@pytest.fixture
def server():
    srv = LoraServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def loads(srv) -> list[tuple[str, str]]:
    """The calls since the last look, as (load|unload, adapter name)."""
    out = [(path.split("/")[-1].split("_")[0], name) for path, name in srv.calls]
    srv.calls.clear()
    return out


def test_the_newest_version_is_named_while_several_are_kept(server, tmp_path):
    """keep=3 (max_staleness=2): each new version of a model is loaded, the oldest beyond three unloaded and its
    folder removed; ``version`` and ``served`` name the newest, whatever is kept; an unchanged model loads nothing."""
    learner = Learner(Smith=0, Miner=0)
    sync = AdapterSync(Client(server.url), tmp_path, keep=3)
    assert sync.sync(learner, ["Smith", "Miner"]) == ["Smith@v0", "Miner@v0"]
    assert loads(server) == [("load", "Smith@v0"), ("load", "Miner@v0")]
    for v in range(1, 6):
        learner.versions["Smith"] = v
        assert sync.sync(learner, ["Smith", "Miner"]) == [f"Smith@v{v}"]
        assert sync.version("Smith") == v and sync.served("Smith") == f"Smith@v{v}"
        assert sync.version("Miner") == 0 and sync.served("Miner") == "Miner@v0"
        kept = list(range(max(0, v - 2), v + 1))
        assert sync.loaded["Smith"] == kept
        assert sorted(server.adapters) == sorted(["Miner@v0", *(f"Smith@v{k}" for k in kept)])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(server.adapters)
    assert loads(server) == [
        ("load", "Smith@v1"),
        ("load", "Smith@v2"),
        ("load", "Smith@v3"),
        ("unload", "Smith@v0"),
    ] + [x for v in (4, 5) for x in (("load", f"Smith@v{v}"), ("unload", f"Smith@v{v - 3}"))]
    assert (sync.loads, sync.unloads) == (7, 3)
    # each folder holds the version it is named after, and the server was told where
    for name, path in server.adapters.items():
        assert Path(path) == (tmp_path / name).resolve()
        assert json.loads((Path(path) / "adapter_config.json").read_text())["version"] == int(name.split("@v")[1])
    assert sync.sync(learner, ["Smith", "Miner"]) == [] and loads(server) == []
    # a model whose version did not change does not hold up the next one; an old folder already gone is fine
    learner.versions["Miner"] = 1
    shutil.rmtree(tmp_path / "Smith@v3")
    assert sync.sync(learner, ["Smith", "Miner"]) == ["Miner@v1"] and sync.loaded["Miner"] == [0, 1]
    learner.versions["Smith"] = 6
    assert sync.sync(learner, ["Smith"]) == ["Smith@v6"] and sync.loaded["Smith"] == [4, 5, 6]
    assert loads(server) == [("load", "Miner@v1"), ("load", "Smith@v6"), ("unload", "Smith@v3")]


def test_keep_one_is_on_policy_and_keep_is_at_least_one(server, tmp_path):
    learner = Learner(Smith=3)
    sync = AdapterSync(Client(server.url), tmp_path, keep=0)
    assert sync.keep == 1
    sync.sync(learner, ["Smith"])
    learner.versions["Smith"] = 4
    sync.sync(learner, ["Smith"])
    assert loads(server) == [("load", "Smith@v3"), ("load", "Smith@v4"), ("unload", "Smith@v3")]
    assert sync.loaded == {"Smith": [4]} and sync.version("Smith") == 4
    assert lora_slots(3, 0) == (3, 6) and lora_slots(2, 2) == (6, 8)
    assert version_name("Smith", 12.0) == "Smith@v12"


def test_strays_are_unloaded_and_a_restarted_server_gets_every_kept_version_again(server, tmp_path):
    learner = Learner(Smith=1, Miner=0)
    sync = AdapterSync(Client(server.url), tmp_path, keep=2)
    server.adapters.update({"Smith@v9": "/old/run", "Other@v1": "/another/run"})
    sync.sync(learner, ["Smith", "Miner"])
    learner.versions["Smith"] = 2
    sync.sync(learner, ["Smith"])
    loads(server)
    assert sync.drop_strays(["Smith", "Miner"]) == ["Smith@v9"]  # another model's adapter is not ours to drop
    assert loads(server) == [("unload", "Smith@v9")]
    assert sorted(server.adapters) == ["Miner@v0", "Other@v1", "Smith@v1", "Smith@v2"]
    server.adapters.clear()  # the server restarted
    sync.reload()
    assert loads(server) == [("load", "Smith@v1"), ("load", "Smith@v2"), ("load", "Miner@v0")]
    assert sorted(server.adapters) == ["Miner@v0", "Smith@v1", "Smith@v2"]


def test_a_leftover_of_an_earlier_run_is_replaced_in_place(server, tmp_path):
    server.adapters["Smith@v0"] = "/an/earlier/run"
    sync = AdapterSync(Client(server.url), tmp_path)
    assert sync.sync(Learner(Smith=0), ["Smith"]) == ["Smith@v0"]
    assert loads(server) == [("load", "Smith@v0"), ("load", "Smith@v0")]
    assert server.adapters["Smith@v0"] == str((tmp_path / "Smith@v0").resolve()) and sync.loads == 1


def test_each_refusal_is_one_clear_error(server, tmp_path):
    sync = AdapterSync(Client(server.url), tmp_path)
    with pytest.raises(EngineError, match=r"^no version of 'Smith' is loaded on http://127\.0\.0\.1:\d+; sync it"):
        sync.served("Smith")
    server.refuse[("/v1/load_lora_adapter", "Smith@v0")] = (404, "Not Found")
    with pytest.raises(EngineError, match=r"cannot load LoRA adapters at run time .*HTTP 404: Not Found\); start it "):
        sync.sync(Learner(Smith=0), ["Smith"])
    server.refuse[("/v1/load_lora_adapter", "Smith@v0")] = (400, "LoRA is not enabled; use --enable-lora")
    with pytest.raises(EngineError, match="--enable-lora and the environment variable VLLM_ALLOW_RUNTIME"):
        sync.sync(Learner(Smith=0), ["Smith"])
    server.refuse[("/v1/load_lora_adapter", "Smith@v0")] = (405, "Method Not Allowed")
    with pytest.raises(EngineError, match=r"cannot load LoRA adapters at run time .*HTTP 405: Method Not Allowed\)"):
        sync.sync(Learner(Smith=0), ["Smith"])
    server.refuse[("/v1/load_lora_adapter", "Smith@v0")] = (400, "invalid LoRA adapter path")
    with pytest.raises(EngineError, match=r"refused the adapter Smith@v0 \(.*\): HTTP 400: invalid LoRA adapter path$"):
        sync.sync(Learner(Smith=0), ["Smith"])
    server.refuse[("/v1/load_lora_adapter", "Smith@v0")] = (500, "out of memory")
    with pytest.raises(EngineError, match=r"refused the adapter Smith@v0 \(.*Smith@v0\): HTTP 500: out of memory$"):
        sync.sync(Learner(Smith=0), ["Smith"])
    del server.refuse[("/v1/load_lora_adapter", "Smith@v0")]
    learner = Learner(Smith=0)
    sync.sync(learner, ["Smith"])
    server.refuse[("/v1/unload_lora_adapter", "Smith@v0")] = (500, "busy")
    learner.versions["Smith"] = 1
    with pytest.raises(EngineError, match=r"refused to unload Smith@v0: HTTP 500: busy$"):
        sync.sync(learner, ["Smith"])
    # already gone: nothing to do, whether the server says so by status or in words
    server.refuse[("/v1/unload_lora_adapter", "Smith@v1")] = (404, "gone")
    server.refuse[("/v1/unload_lora_adapter", "Smith@v2")] = (400, "The lora adapter 'Smith@v2' was NOT found.")
    for v in (2, 3):
        learner.versions["Smith"] = v
        sync.sync(learner, ["Smith"])
    assert sync.loaded["Smith"] == [3] and sync.unloads == 2


def test_an_adapter_rank_vllm_does_not_allow_is_refused_before_it_is_loaded(server, tmp_path):
    learner = Learner(Smith=0)
    learner.rank = 12
    with pytest.raises(ConfigError, match=r"^the adapter rank of Smith=12 is not a LoRA rank vLLM allows; valid: "):
        AdapterSync(Client(server.url), tmp_path).sync(learner, ["Smith"])
    assert loads(server) == []
