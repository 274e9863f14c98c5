"""Plugin system: a tiny plugin class registered in a fixture, never relying on what is installed."""

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

import swarm_runtime
from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import resolve
from swarm_runtime.config.rules import Rule, choices, ints
from swarm_runtime.conformance.probe import ConformanceError
from swarm_runtime.conformance.suite import check_domain
from swarm_runtime.core.domain import Domain, Role
from swarm_runtime.core.env import DomainEnv, ExpertStep, StepResult
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

    def expert_action(self):
        return ExpertStep("Counter", "add") if self.n < 3 else None


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
                "limit": 3,  # the domain's own key
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


# --------------------------------------------------------------------------- call semantics


def test_every_hook_is_plain_and_says_how_it_is_called():
    """No hook is firstresult or historic (every implementation is called, at the time of the call); each
    docstring says who calls it, and the module's table lists every hook."""
    pm = make_plugin_manager()
    for name in (n for n in dir(hookspecs) if n.startswith("swarm_")):
        opts = getattr(pm.hook, name).spec.opts
        assert not opts["firstresult"] and not opts["historic"], name
        assert "alled" in getattr(hookspecs, name).__doc__, f"hook {name} does not say who calls it"
        assert name in hookspecs.__doc__, f"hook {name} is not in the module's table"


def test_an_exception_in_a_registration_hook_names_the_plugin_and_the_hook():
    class Broken:
        @swarm_runtime.hookimpl
        def swarm_register_credit_schemes(self, register):
            raise ImportError("no module named 'fancy'")

    with pytest.raises(PluginError, match="plugin 'broken' failed in swarm_register_credit_schemes: ImportError: no"):
        build_registry(make_plugin_manager(extra_plugins=[(Broken(), "broken")]))


# --------------------------------------------------------------------------- config rules and checks


class LimitRules:
    """``task.limit`` of the counter domain: 1 to 5; and a check that the limit fits the decisions."""

    @swarm_runtime.hookimpl
    def swarm_register_config_rules(self, register, register_check):
        register(Rule("task.limit", *ints(1, 5)), domain="counter")
        register(Rule("task.limit", *choices(100)), domain="other")  # another domain's meaning of the key
        register_check(limit_fits)


def limit_fits(cfg, registry):
    if cfg.domain == "counter" and cfg.task.limit > cfg.task.max_decisions:
        raise ConfigError(f"task.limit={cfg.task.limit} exceeds task.max_decisions={cfg.task.max_decisions}")


def _counter_registry(*plugins):
    return build_registry(make_plugin_manager(extra_plugins=[(TinyPlugin(), "tiny"), *plugins]))


def test_a_plugin_rule_checks_its_domains_key_and_names_the_plugin():
    reg = _counter_registry((LimitRules(), "limits"))
    assert [(r.rule.key, r.domain, r.plugin) for r in reg.config_rules] == [
        ("task.limit", "counter", "limits"),
        ("task.limit", "other", "limits"),
    ]
    assert resolve(["domain=counter", "limit=5", "max_decisions=5"], reg).task.limit == 5  # not 'other''s rule
    with pytest.raises(ConfigError) as err:
        resolve(["domain=counter", "limit=9"], reg)
    assert str(err.value) == (
        "task.limit=9 is not valid: must be an integer in [1, 5] (rule of plugin 'limits' for domain 'counter')"
    )
    with pytest.raises(ConfigError, match=r"task.limit=5 exceeds task.max_decisions=4 \(check 'limit_fits' of plugin"):
        resolve(["domain=counter", "limit=5", "max_decisions=4"], reg)


def test_a_precheck_runs_the_plugin_rules_from_their_hook_alone(monkeypatch):
    """A light registry (domains only, as ``swarm_runtime.config.load.precheck`` builds) gets the rules by calling
    their hook alone; a registry of None runs none."""
    import swarm_runtime.plugins.rules as rules
    from swarm_runtime.config.validation import validate
    from swarm_runtime.plugins.manager import Registry

    extras = [(TinyPlugin(), "tiny"), (LimitRules(), "limits")]
    monkeypatch.setattr(rules, "make_plugin_manager", lambda: make_plugin_manager(extra_plugins=extras))
    light = Registry(domains={"counter": CounterDomain()}, light=True)
    with pytest.raises(ConfigError, match=r"task.limit=0 is not valid: .* \(rule of plugin 'limits' for domain"):
        resolve(["domain=counter", "limit=0"], light)
    cfg = resolve(["domain=counter"], light)
    cfg.task.limit = 0
    validate(cfg, None)  # no plugin loaded: nothing of theirs runs


@pytest.mark.parametrize(
    "bad, error",
    [
        (
            lambda r, c: r(Rule("algo.lr", *ints(1, 2)), domain="counter"),
            r"a rule of 'algo.lr'; valid: keys of the task",
        ),
        (lambda r, c: r(Rule("task.limit", *ints(1, 2))), r"for domain None; valid: register\(rule, domain='NAME'\)"),
        (lambda r, c: r(("task.limit", 1), domain="counter"), r"as a config rule; valid: a swarm_runtime.config"),
        (lambda r, c: c("limit_fits"), r"'limit_fits' as a config check; valid: a function fn\(cfg, registry\)"),
    ],
)
def test_a_bad_rule_registration_says_what_is_valid(bad, error):
    class Plugin:
        @swarm_runtime.hookimpl
        def swarm_register_config_rules(self, register, register_check):
            bad(register, register_check)

    with pytest.raises(PluginError, match=r"plugin 'bad' registered .*" + error):
        build_registry(make_plugin_manager(extra_plugins=[(Plugin(), "bad")]))


@pytest.mark.parametrize(
    "hook, what",
    [
        ("rules", r"config rule of task.limit for domain 'counter' registered twice: by 'limits' and by 'again'"),
        ("checks", r"config check 'limit_fits' registered twice: by 'limits' and by 'again'"),
        ("suites", r"conformance suite 'rlcr' registered twice: by 'builtins' and by 'again'"),
    ],
)
def test_a_duplicate_rule_check_or_suite_names_both_plugins(hook, what):
    class Again:
        @swarm_runtime.hookimpl
        def swarm_register_config_rules(self, register, register_check):
            if hook == "rules":
                register(Rule("task.limit", *ints(2, 3)), domain="counter")
            if hook == "checks":
                register_check(limit_fits)

        @swarm_runtime.hookimpl
        def swarm_register_conformance_suites(self, register):
            if hook == "suites":
                register("rlcr", lambda domain, task, **kw: None)

    with pytest.raises(PluginError, match=what):
        _counter_registry((LimitRules(), "limits"), (Again(), "again"))


# --------------------------------------------------------------------------- conformance suites


class Suites:
    """A suite for the counter domain that fails, and one for another domain that would."""

    @swarm_runtime.hookimpl
    def swarm_register_conformance_suites(self, register):
        register("strict", strict, applies=lambda domain, task: domain.name == "counter")
        register("elsewhere", strict, applies=lambda domain, task: domain.name == "other")


def strict(domain, task, max_tokens=None, **kw):
    raise ConformanceError(f"{domain.name}/{task}: the strict suite ran (max_tokens={max_tokens})")


def test_check_domain_runs_the_suites_that_apply_after_its_own_checks():
    reg = _counter_registry((Suites(), "suites"))
    assert [(s.name, s.plugin) for s in reg.conformance_suites.values()] == [
        ("rlcr", "builtins"),
        ("strict", "suites"),
        ("elsewhere", "suites"),
    ]
    assert "conformance_suite:strict" in reg.provenance["suites"]
    with pytest.raises(ConformanceError, match=r"counter/count: the strict suite ran \(max_tokens=64\)") as err:
        check_domain(CounterDomain(), "count", max_tokens=64, processes=False, registry=reg)
    if sys.version_info >= (3, 11):  # exception notes
        assert err.value.__notes__ == ["in conformance suite 'strict' of plugin 'suites'"]
    check_domain(CounterDomain(), "count", processes=False)  # the installed plugins' suites: the core's alone


# --------------------------------------------------------------------------- public API


def test_the_public_api_is_light_and_keeps_the_module_paths():
    from swarm_runtime.conformance import check_domain as by_path
    from swarm_runtime.core import domain, env

    assert swarm_runtime.check_domain is by_path is check_domain
    assert swarm_runtime.ConformanceError is ConformanceError
    assert (swarm_runtime.Domain, swarm_runtime.Role, swarm_runtime.Event) == (domain.Domain, domain.Role, domain.Event)
    assert (swarm_runtime.DomainEnv, swarm_runtime.StepResult, swarm_runtime.ExpertStep) == (
        env.DomainEnv,
        env.StepResult,
        env.ExpertStep,
    )
    assert {"check_domain", "hookimpl", "Domain"} <= set(dir(swarm_runtime))
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        swarm_runtime.nosuch  # noqa: B018
    code = (
        "import sys, swarm_runtime\n"
        "from swarm_runtime import Domain, DomainEnv, Event, ExpertStep, Role, StepResult, hookimpl\n"
        "heavy = ('torch', 'transformers', 'ray', 'swarm_runtime.conformance')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
