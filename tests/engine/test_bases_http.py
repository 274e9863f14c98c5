"""Two bases (``model.bases`` + ``model.role_base``) on engine samplers, on any CPU: one reference server per base
(tests/engine/refserver.py), one sampler routing each row to its model's base's server, one adapter sync per
server (README, "A base per role"; docs/engine.md, "Several bases: one server each")."""

from __future__ import annotations

import torch
from enginekit import PROMPTS, learner_for, openai_cfg, served_names, start_ref, step_adapter
from omegaconf import OmegaConf

from swarm_runtime.rollout.base import Row
from swarm_runtime.rollout.factory import RoutedSampler, engine_folder, make_sampler, write_base
from swarm_runtime.rollout.local import LocalSampler

SMALL = (
    "model.bases.small.hidden_size=64",
    "model.bases.small.intermediate_size=128",
    "model.bases.small.num_layers=1",
    "model.bases.small.num_heads=2",
    "model.bases.small.num_kv_heads=1",
    "model.role_base.Smith=small",
)
ROWS = [Row(m, p, (5, i, 0, 1)) for i, (m, p) in enumerate(PROMPTS.items())]


def test_one_server_per_base_rows_routed_by_model(registry, tmp_path):
    cfg, learner = learner_for(registry, *SMALL)
    shared = {p.shared_base.name: p.shared_base for p in learner.policies.values()}
    assert set(shared) == {"default", "small"}
    servers = {}
    try:
        for name, sb in shared.items():
            base = write_base(sb, engine_folder(tmp_path, name) / "base")
            servers[name] = start_ref(base, tmp_path / f"ref-{name}.log")
        cfg = openai_cfg(cfg, servers["default"].url)
        OmegaConf.update(cfg, "rollout.urls.small", servers["small"].url, force_add=True)
        s = make_sampler(cfg, learner, tmp_path)
        try:
            assert isinstance(s, RoutedSampler)
            assert served_names(servers["default"].url) == {"Logger@v0", "Miner@v0"}
            assert served_names(servers["small"].url) == {"Smith@v0"}
            acts = s.act(ROWS)
            for r, a in zip(ROWS, acts):  # each row answered by its own base: the learner's log-probs of its tokens
                policy = learner.policy(r.model)
                ids = policy.encode_prompt(r.prompt)
                with torch.no_grad():
                    logits = policy._forward(input_ids=torch.tensor([ids + a.tokens]), use_cache=False).logits[0]
                want = torch.log_softmax(logits.float(), -1)[len(ids) - 1 : -1].gather(
                    -1, torch.tensor(a.tokens)[:, None]
                )
                assert torch.allclose(torch.tensor(a.logprobs), want.squeeze(1), atol=1e-4), r.model
            bids = s.bid(ROWS)
            local = LocalSampler(learner.policies, learner).bid(ROWS)
            assert [b.level for b in bids] == [b.level for b in local]
            step_adapter(learner, "Smith")
            s.sync(learner, ["Smith"])
            assert served_names(servers["small"].url) == {"Smith@v1"}
            assert served_names(servers["default"].url) == {"Logger@v0", "Miner@v0"}
            assert (tmp_path / "engine" / "small" / "adapters" / "Smith@v1").is_dir()
            assert s.version("Smith") == 1 and s.version("Logger") == 0
        finally:
            s.close()
    finally:
        for server in servers.values():
            server.stop()
