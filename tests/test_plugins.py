"""Plugin system: a tiny plugin class registered in a fixture, never relying on what is installed."""

import pytest
from omegaconf import OmegaConf

import swarm_runtime
from swarm_runtime.core.domain import Domain, Role
from swarm_runtime.core.env import DomainEnv, StepResult
from swarm_runtime.plugins import hookspecs
from swarm_runtime.plugins.manager import PluginError, build_registry, make_plugin_manager


class CounterEnv(DomainEnv):
    """Count to 3: the Counter says 'add', reward 1 per add, done at 3."""

    def reset(self, seed):
        self.n = 0
        return self.observation()

    def observation(self):
        return f"count {self.n}"

    def step(self, action, role=None):
        if action.strip() != "add":
            return StepResult(self.observation(), 0.0, False, valid=False)
        self.n += 1
        return StepResult(self.observation(), 1.0, self.n >= 3)


class CounterDomain(Domain):
    name = "counter"
    roles = [Role("Counter", "adds one")]

    def task_names(self):
        return ["count"]

    def task_config(self, task):
        return OmegaConf.create(
            {
                "max_decisions": 5,
                "reward_max": 3,
                "train_seeds": {"start": 0, "count": 4},
                "eval_seeds": {"start": 10, "count": 2},
            }
        )

    def make_env(self, task):
        return CounterEnv()

    def vocabulary(self, task):
        return ["count", "add"]


class TinyPlugin:
    @swarm_runtime.hookimpl
    def swarm_register_domains(self, register):
        register(CounterDomain())

    @swarm_runtime.hookimpl
    def swarm_register_coordinators(self, register):
        register("always_first", lambda cfg: None)


@pytest.fixture
def pm():
    pm = make_plugin_manager(extra_plugins=[(TinyPlugin(), "tiny")])
    try:
        yield pm
    finally:
        pm.unregister(name="tiny")


def test_third_party_plugin_registers_through_hooks(pm):
    reg = build_registry(pm)
    assert "counter" in reg.domains and "always_first" in reg.coordinators
    assert reg.provenance["tiny"] == ["domain:counter", "coordinator:always_first"]
    # built-ins come through the very same hooks
    assert {"auction", "round_robin"} <= set(reg.coordinators)
    assert reg.provenance["builtins"]


def test_builtin_domains_come_from_the_entry_point_group():
    reg = build_registry(make_plugin_manager())
    assert {"minecraft", "vln_ce", "openresearcher"} <= set(reg.domains)
    assert reg.provenance["minecraft"] == ["domain:minecraft"]


def test_duplicate_registration_names_both_plugins():
    class Dup:
        @swarm_runtime.hookimpl
        def swarm_register_coordinators(self, register):
            register("auction", object)

    pm = make_plugin_manager(extra_plugins=[(Dup(), "dup")])
    with pytest.raises(PluginError, match="'auction' registered twice: by 'builtins' and by 'dup'"):
        build_registry(pm)


def test_misspelled_hook_fails_loudly():
    class Typo:
        @swarm_runtime.hookimpl
        def swarm_register_domain(self, register):  # missing "s"
            pass

    with pytest.raises(PluginError, match="swarm_register_domain"):
        make_plugin_manager(extra_plugins=[(Typo(), "typo")])


def test_disable_plugins_env_var(monkeypatch):
    monkeypatch.setenv("SWARM_DISABLE_PLUGINS", "minecraft,tiny")
    pm = make_plugin_manager(extra_plugins=[(TinyPlugin(), "tiny")])
    reg = build_registry(pm)
    assert "minecraft" not in reg.domains and "counter" not in reg.domains
    assert "vln_ce" in reg.domains


def test_allow_list_env_var(monkeypatch):
    monkeypatch.setenv("SWARM_LOAD_PLUGINS", "vln_ce")
    reg = build_registry(make_plugin_manager())
    assert set(reg.domains) == {"vln_ce"}
    assert "auction" in reg.coordinators  # core plugins always load


def test_every_hook_is_documented():
    specs = [n for n in dir(hookspecs) if n.startswith("swarm_")]
    assert len(specs) >= 9
    for name in specs:
        doc = getattr(hookspecs, name).__doc__
        assert doc and len(doc.strip()) > 30, f"hook {name} lacks a docstring"
        assert ":param" in doc, f"hook {name} documents no parameter"


def test_registry_get_names_valid_values(pm):
    reg = build_registry(pm)
    with pytest.raises(KeyError, match="valid: .*auction"):
        reg.get("coordinators", "nosuch")


def test_the_built_wheel_is_self_contained(tmp_path):
    """``pip install swarm-runtime`` (not editable) carries the config presets and the built-in
    domains' task files: the CLI resolves every group from the installed package alone."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(swarm_runtime.__file__).resolve().parent.parent
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(wheels), str(root)], check=True, timeout=300, capture_output=True
    )
    (wheel,) = wheels.glob("swarm_runtime-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True,
        timeout=120,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = tmp_path / "elsewhere"
    out.mkdir()

    def cli(*args):
        res = subprocess.run(
            [sys.executable, "-m", "swarm_runtime.cli.main", *args],
            cwd=out,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        return res.stdout

    where = subprocess.run(
        [sys.executable, "-c", "import swarm_runtime; print(swarm_runtime.__file__)"],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(site))
    assert "minecraft" in cli("domains") and "vln_ce" in cli("domains")
    for domain, task in (("minecraft", "iron_pickaxe"), ("vln_ce", "r2r"), ("openresearcher", "embedded")):
        text = cli("config", f"domain={domain}", f"task={task}", "model=small", "algo=monolithic", "hardware=h200")
        assert "device: cuda" in text and "name: small" in text and f"task_name: {task}" in text
