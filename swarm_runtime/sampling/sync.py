"""Adapter sync to an inference server (docs/reference/engine.md): after every update each changed role's adapter
is written and loaded as a new version, named ``<model>@v<N>``, through vLLM's runtime LoRA endpoints
(``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``, ``POST /v1/unload_lora_adapter
{"lora_name"}``: ``vllm/entrypoints/serve/lora/api_router.py`` in vLLM 0.32). Versions no rollout may
still use are unloaded: at most ``rollout.max_staleness + 1`` per model stay loaded.

Before the first load the server's base is checked against the run's (:func:`check_base`).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

from swarm_runtime.config.schemes import check_rank
from swarm_runtime.sampling.http import Client, EngineError, HTTPStatusError


def version_name(model: str, version: int) -> str:
    """The served name of ``model``'s weights after ``version`` updates: ``Smith@v12``."""
    return f"{model}@v{int(version)}"


def adapter_rank(folder: Path) -> int:
    """The largest rank in a PEFT adapter folder (``r`` and any ``rank_pattern`` entry)."""
    cfg = json.loads((Path(folder) / "adapter_config.json").read_text())
    return max([int(cfg["r"]), *[int(v) for v in (cfg.get("rank_pattern") or {}).values()]])


def lora_slots(n_models: int, max_staleness: int) -> tuple[int, int]:
    """``(--max-loras, --max-cpu-loras)``: every model's last ``max_staleness + 1`` versions in one batch,
    and room for one more version per model while a new one is loaded before the oldest is unloaded."""
    keep = int(max_staleness) + 1
    return n_models * keep, n_models * (keep + 1)


def no_lora_hint(client: Client, exc: HTTPStatusError) -> EngineError:
    return EngineError(
        f"the server at {client.url} cannot load LoRA adapters at run time (POST /v1/load_lora_adapter "
        f"answered HTTP {exc.status}: {exc.detail}); start it with --enable-lora and the environment "
        "variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
    )


def served_models(client: Client) -> list[dict]:
    """``GET /v1/models``: the base (``parent`` null) and every loaded adapter."""
    from swarm_runtime.sampling.http import model_list

    return model_list(client.get("/v1/models"), f"the server at {client.url}")


def served_base(client: Client) -> dict:
    models = served_models(client)
    bases = [m for m in models if not m.get("parent")]
    if not bases:
        raise EngineError(f"the server at {client.url} lists no base model in /v1/models")
    return bases[0]


#: The probe prompt of :func:`check_base`: fixed token ids (after BOS), the same on both sides.
PROBE_IDS = (5, 9, 13, 17, 21, 25, 29, 33)
PROBE_TOP = 5


def local_probe(policy, ids: list[int]):
    """The in-process base's ``log_softmax`` of the next token after ``ids`` (adapters off). The head runs on the
    last position only (``logits_to_keep=1``, which PEFT passes on to the base, as the policies' passes do)."""
    import torch

    model = policy.shared_base.model
    x = torch.tensor([ids], device=policy.device)
    with torch.no_grad(), model.disable_adapter():
        logits = model(input_ids=x, use_cache=False, logits_to_keep=1).logits[0, -1].float()
    return torch.log_softmax(logits, dim=-1).cpu()


def check_base(client: Client, policy, tolerance: float | None = None) -> float:
    """Refuse a server whose base is not the run's base. The check compares outputs, not files: the
    server's greedy top-``PROBE_TOP`` log-probs on a fixed token-id prompt against the in-process base's
    (same token ids, each within ``tolerance``). It works for any server, remote or local, and also
    catches a base loaded in another dtype or with another vocabulary, which a file fingerprint would
    not; a file fingerprint is compared first when the server names a folder this machine can read.
    Returns the largest difference seen."""
    import torch

    from swarm_runtime.models.adapters import fingerprint

    base = served_base(client)
    shared = policy.shared_base
    root = Path(str(base.get("root") or base.get("id")))
    ours = getattr(shared, "engine_fingerprint", None)
    if ours and (root / "config.json").exists() and fingerprint(root) != ours:
        raise EngineError(
            f"the server at {client.url} serves the base {str(root)!r}, whose files differ from the run's "
            "base (fingerprint); start it on the run's base"
        )
    vocab = int(shared.model.get_input_embeddings().weight.shape[0])
    ids = ([policy.bos] if policy.bos is not None else []) + [i % vocab for i in PROBE_IDS]
    want = local_probe(policy, ids)
    try:
        res = client.post(
            "/v1/completions",
            {
                "model": base["id"],
                "prompt": ids,
                "max_tokens": 1,
                "temperature": 0.0,
                "logprobs": PROBE_TOP,
                "return_tokens_as_token_ids": True,
            },
        )
    except HTTPStatusError as exc:
        raise EngineError(
            f"the server at {client.url} refused the base check on {base['id']!r}: HTTP {exc.status}: {exc.detail}"
        ) from None
    from swarm_runtime.sampling.http import first_choice

    top = ((first_choice(res, f"the server at {client.url}").get("logprobs") or {}).get("top_logprobs") or [{}])[0]
    if tolerance is None:
        tolerance = 1e-3 if next(shared.model.parameters()).dtype == torch.float32 else 0.1
    worst = 0.0
    for tok, lp in top.items():
        t = int(str(tok).split(":")[-1])
        d = abs(float(lp) - float(want[t])) if 0 <= t < len(want) else math.inf
        worst = max(worst, d)
    if not top or worst > tolerance:
        raise EngineError(
            f"the server at {client.url} serves a base ({base['id']!r}) that is not the run's base: its "
            f"next-token log-probs on a fixed prompt differ from the run's by {worst:.3g} (tolerance "
            f"{tolerance:g}); start it on the run's base"
        )
    return worst


class AdapterSync:
    """Which version of each model the server holds, and the loads and unloads that keep it current.
    ``folder``: where versions are written (``<run_dir>/engine/adapters``); ``keep``: versions kept per model
    (``rollout.max_staleness + 1``)."""

    def __init__(self, client: Client, folder: Path, keep: int = 1):
        self.client, self.folder, self.keep = client, Path(folder), max(1, int(keep))
        self.loaded: dict[str, list[int]] = {}  #: model -> versions on the server, oldest first
        self.loads = self.unloads = 0

    def version(self, model: str) -> int:
        return self.loaded[model][-1]

    def served(self, model: str) -> str:
        if model not in self.loaded:
            raise EngineError(f"no version of {model!r} is loaded on {self.client.url}; sync it first")
        return version_name(model, self.loaded[model][-1])

    def _load(self, name: str, path: Path) -> None:
        body = {"lora_name": name, "lora_path": str(path.resolve())}
        try:
            self.client.post("/v1/load_lora_adapter", body)
        except HTTPStatusError as exc:
            if exc.status == 400 and "already been loaded" in exc.detail:  # a leftover of an earlier run
                self.client.post("/v1/load_lora_adapter", {**body, "load_inplace": True})
            elif exc.status in (404, 405) or "lora" in exc.detail.lower() and "enable" in exc.detail.lower():
                raise no_lora_hint(self.client, exc) from None
            else:
                raise EngineError(
                    f"{self.client.url} refused the adapter {name} ({path}): HTTP {exc.status}: {exc.detail}"
                ) from None
        self.loads += 1

    def _unload(self, name: str) -> None:
        try:
            self.client.post("/v1/unload_lora_adapter", {"lora_name": name})
        except HTTPStatusError as exc:
            if exc.status != 404 and "not" not in exc.detail.lower():  # already gone: nothing to do
                raise EngineError(
                    f"{self.client.url} refused to unload {name}: HTTP {exc.status}: {exc.detail}"
                ) from None
        self.unloads += 1

    def sync(self, learner, models: Sequence[str]) -> list[str]:
        """Export and load the learner's current version of each of ``models`` the server lacks; unload
        versions beyond ``keep``. Returns the names loaded."""
        done = []
        for m in models:
            v = int(learner.version(m))
            have = self.loaded.setdefault(m, [])
            if have and have[-1] == v:
                continue
            name = version_name(m, v)
            path = self.folder / name
            if path.exists():
                shutil.rmtree(path)
            learner.export(m, path)
            check_rank(adapter_rank(path), f"the adapter rank of {m}")
            self._load(name, path)
            have.append(v)
            done.append(name)
            while len(have) > self.keep:
                old = version_name(m, have.pop(0))
                self._unload(old)
                shutil.rmtree(self.folder / old, ignore_errors=True)
        return done

    def drop_strays(self, models: Sequence[str]) -> list[str]:
        """Unload versions of ``models`` an earlier run left on the server (they hold LoRA slots)."""
        ours = {version_name(m, v) for m, vs in self.loaded.items() for v in vs}
        prefixes = tuple(f"{m}@v" for m in models)
        gone = []
        for entry in served_models(self.client):
            name = str(entry.get("id"))
            if entry.get("parent") and name.startswith(prefixes) and name not in ours:
                self._unload(name)
                gone.append(name)
        return gone

    def reload(self) -> None:
        """Load every version held again (a restarted server starts with none)."""
        for m, vs in self.loaded.items():
            for v in vs:
                name = version_name(m, v)
                self._load(name, self.folder / name)
