"""Two bases (``model.bases`` + ``model.role_base``) on engine samplers, on any CPU: one reference server per base
(tests/engine/refserver.py), one sampler routing each row to its model's base's server, one adapter sync per
server (README, "A base per role"; docs/reference/engine.md, "Several bases: one server each")."""

from __future__ import annotations

import torch
from enginekit import PROMPTS, learner_for, openai_cfg, served_names, start_ref, step_adapter
from omegaconf import OmegaConf

from swarm_runtime.core.protocols import Row
from swarm_runtime.sampling.factory import RoutedSampler, engine_folder, make_sampler, write_base
from swarm_runtime.sampling.local import LocalSampler

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


def on(cfg, base: str, url: str):
    """``cfg`` whose server of ``base`` is at ``url``."""
    cfg = openai_cfg(cfg, url)
    OmegaConf.update(cfg, f"rollout.urls.{base}", url, force_add=True)
    return cfg


def test_bases_times_replicas_compose(registry, tmp_path):
    """``model.bases`` x ``cluster.sampler_replicas``: a :class:`RoutedSampler` over one :class:`ReplicatedSampler`
    per base (what ``make_sampler`` builds on Ray), each replica its own server: each row goes to its base, spread
    over that base's replicas; a sync reaches every replica of the changed role's base, and no other."""
    from swarm_runtime.sampling.factory import BaseLearner, engine_sampler, models_by_base
    from swarm_runtime.sampling.replicas import ReplicatedSampler

    cfg, learner = learner_for(registry, *SMALL)
    shared = {p.shared_base.name: p.shared_base for p in learner.policies.values()}
    by_base = models_by_base(learner)
    servers: dict = {}
    try:
        for name, n in (("default", 2), ("small", 2)):
            base = write_base(shared[name], engine_folder(tmp_path, name) / "base")
            servers[name] = [start_ref(base, tmp_path / f"ref-{name}-{j}.log") for j in range(n)]
        routed = RoutedSampler(
            {
                name: ReplicatedSampler(
                    [
                        engine_sampler(
                            on(cfg, name, s.url),
                            BaseLearner(learner, by_base[name]),
                            tmp_path / f"r{j}",
                            base=name,
                        )
                        for j, s in enumerate(servers[name])
                    ],
                    name,
                )
                for name in ("default", "small")
            },
            {m: name for name, models in by_base.items() for m in models},
        )
        try:
            rows = ROWS * 2  # Logger, Miner (default) and Smith (small), twice
            want = LocalSampler(learner.policies, learner).bid(rows)
            assert [b.level for b in routed.bid(rows)] == [b.level for b in want]
            assert routed.samplers["default"].rows == [2, 2] and routed.samplers["small"].rows == [1, 1]
            step_adapter(learner, "Smith")
            routed.sync(learner, ["Smith"])
            assert [served_names(s.url) for s in servers["small"]] == [{"Smith@v1"}] * 2
            assert [served_names(s.url) for s in servers["default"]] == [{"Logger@v0", "Miner@v0"}] * 2
            assert routed.version("Smith") == 1 and routed.version("Logger") == 0
        finally:
            routed.close()
    finally:
        for group in servers.values():
            for server in group:
                server.stop()
