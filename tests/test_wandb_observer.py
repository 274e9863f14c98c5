"""The shipped cross-cutting plugin (swarm_plugins/wandb_observer.py) and plugin load errors.

With the ``wandb`` extra installed, a real tiny ``swarm run`` is mirrored to an offline W&B run
(``WANDB_MODE=offline``: no network); without it, the W&B test is skipped and the observer's
install message is still checked."""

from __future__ import annotations

import sys

import pytest
from conftest import TINY_RUN

from swarm_plugins import wandb_observer
from swarm_runtime.plugins import manager as plugin_mod


def _use(monkeypatch, *extra):
    pm = plugin_mod.make_plugin_manager(extra_plugins=[(wandb_observer, "wandb"), *extra])
    monkeypatch.setitem(plugin_mod._CACHE, "pm", pm)
    monkeypatch.setitem(plugin_mod._CACHE, "reg", plugin_mod.build_registry(pm))


def test_inert_without_the_switch(monkeypatch):
    monkeypatch.delenv(wandb_observer.ENV, raising=False)
    monkeypatch.setitem(sys.modules, "wandb", None)  # would fail if imported
    wandb_observer.swarm_on_run_start(config={}, run_dir="/nonexistent")
    assert wandb_observer._state["run"] is None
    assert wandb_observer.numbers({"a": 1, "b": {"c": 2.5}, "d": "x", "e": True}) == {"a": 1.0, "b/c": 2.5}


def test_switched_on_without_wandb_names_the_extra(monkeypatch):
    monkeypatch.setenv(wandb_observer.ENV, "1")
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install 'swarm-runtime\[wandb\]'.*SWARM_DISABLE_PLUGINS=wandb"):
        wandb_observer.swarm_on_run_start(config={}, run_dir="/tmp")


def test_a_broken_plugin_names_itself_and_the_way_to_skip_it(monkeypatch):
    class BrokenEntryPoint:
        name, value = "brokenthing", "brokenthing.plugin"

        def load(self):
            raise ImportError("No module named 'brokenthing'")

    monkeypatch.setattr(plugin_mod, "entry_points", lambda group: [BrokenEntryPoint()])
    with pytest.raises(
        plugin_mod.PluginError,
        match=r"plugin 'brokenthing' \(brokenthing.plugin\) failed to load: "
        r"No module named 'brokenthing'; skip it with "
        r"SWARM_DISABLE_PLUGINS=brokenthing",
    ):
        plugin_mod.make_plugin_manager()
    monkeypatch.setenv("SWARM_DISABLE_PLUGINS", "brokenthing")
    plugin_mod.make_plugin_manager()  # skipped: loads


@pytest.mark.slow
def test_a_real_run_is_mirrored_to_an_offline_wandb_run(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    from swarm_runtime.cli.main import main

    _use(monkeypatch)
    monkeypatch.setenv(wandb_observer.ENV, "swarm-test")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    assert main(["run", *TINY_RUN, "tensorboard=false", f"run_dir={run_dir}"]) == 0
    import wandb

    wandb.teardown()  # stop W&B's writer process, so the offline file is complete on disk
    found = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(found) == 1, list((run_dir / "wandb").rglob("*"))
    data = found[0].read_bytes()
    # the training metrics, the rollouts, the held-out summary and the config reached the W&B run
    for key in (
        b"losses/",
        b"charts/episode_reward",
        b"flops/total",
        b"rollout/episode_reward",
        b"eval/",
        b"sft/Logger/",
        b"wooden_pickaxe",
    ):
        assert key in data, key
    assert wandb_observer._state["run"] is None  # finished at run end
