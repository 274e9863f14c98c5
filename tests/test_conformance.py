"""The conformance kit catches each failure class it promises (docs/reference/plugins.md), on deliberately
broken tiny domains, with a message naming the seed, the step and the action; a correct tiny
domain passes; run-time contract errors (``EnvContractError``) name the same."""

from __future__ import annotations

import copy
import random
import re

import pytest
from omegaconf import OmegaConf

from swarm_runtime.conformance.determinism import check_determinism
from swarm_runtime.conformance.env import check_action_choices, check_max_decisions, check_snapshots
from swarm_runtime.conformance.probe import ConformanceError, ConformanceWarning
from swarm_runtime.conformance.suite import check_domain
from swarm_runtime.conformance.task import check_fresh_task_config, check_prompts, check_splits
from swarm_runtime.core.domain import Domain, Role
from swarm_runtime.core.env import DomainEnv, EnvContractError, ExpertStep, StepResult, ValidatedEnv

TASK = {
    "max_decisions": 30,
    "reward_max": 6,
    "reward_min": 0,
    "train_seeds": {"start": 0, "count": 100},
    "dev_seeds": {"start": 500, "count": 8},
    "eval_seeds": {"start": 1000, "count": 8},
}


class StackEnv(DomainEnv):
    """Builder stacks ``target`` blocks (reward 1 each); Digger may ``dig`` (finds 0-2 loose
    blocks, seeded) or ``rest``. ``knock`` by Builder takes a block off (allowed, no reward).
    A role's own action is *valid* even when it cannot succeed now (``stack`` with nothing loose):
    valid means well-formed and the role's, as for listed action choices."""

    bookkeeping = ("turns",)

    def __init__(self, target: int):
        self.target = target

    def reset(self, seed: int) -> str:
        self.rng = random.Random(seed)
        self.loose, self.stack, self.paid, self.turns = 1, [], 0, 0
        self.done = False
        return self.observation()

    def observation(self) -> str:
        return f"loose {self.loose} stack {len(self.stack)} of {self.target}"

    def step(self, action: str, role: str | None = None) -> StepResult:
        self.turns += 1
        a = action.strip()
        owner = {"dig": "Digger", "rest": "Digger", "stack": "Builder", "knock": "Builder"}.get(a)
        if owner is None or role not in (owner, None):  # role None: one model that may take any role's action
            return StepResult(self.observation(), valid=False)
        if a == "dig":
            self.loose += self.rng.randrange(3)
            return StepResult(self.observation())
        if a == "rest":
            return StepResult(self.observation())
        if a in ("stack", "knock") and not (self.loose if a == "stack" else self.stack):
            return StepResult(self.observation())  # well-formed, nothing to do now
        if a == "stack":
            self.loose -= 1
            self.stack.append(len(self.stack))
            reward = 0.0
            if len(self.stack) > self.paid:  # pay each height once
                self.paid, reward = len(self.stack), 1.0
            self.done = len(self.stack) >= self.target
            return StepResult(self.observation(), reward, self.done)
        self.stack.pop()  # knock
        self.loose += 1
        return StepResult(self.observation())

    def expert_action(self) -> ExpertStep | None:
        if self.done:
            return None
        return ExpertStep("Builder", "stack") if self.loose > 0 else ExpertStep("Digger", "dig")


class StackDomain(Domain):
    name = "stack"
    roles = (Role("Builder", "stacks blocks"), Role("Digger", "digs loose blocks"))
    env_cls = StackEnv
    task = TASK

    def task_names(self):
        return ["tower"]

    def task_config(self, task):
        if task != "tower":
            raise KeyError(task)
        return OmegaConf.create(self.task)

    def make_env(self, task):
        return self.env_cls(int(task.reward_max))

    def vocabulary(self, task):
        return "loose stack of dig rest knock 0 1 2 3 4 5 6 7 8 9".split()

    def action_choices(self, task, role):
        return {"Builder": ["stack", "knock"], "Digger": ["dig", "rest"]}.get(role)


def domain_with(env_cls=StackEnv, **task) -> StackDomain:
    d = StackDomain()
    d.env_cls = env_cls
    d.task = {**TASK, **task}
    return d


def located(msg: str) -> bool:
    """The message names domain/task, seed, step, action and role."""
    return bool(re.search(r"stack/tower, seed \d+, step \d+, action '[^']*' by (\w+|role=None): ", msg))


def test_a_correct_domain_passes_every_check():
    check_domain(domain_with(), "tower")
    assert check_snapshots(domain_with(), "tower") > 20


# ------------------------------------------------------------------ broken domains
class ForgetfulRestore(StackEnv):
    """Snapshot is complete, but restore() forgets the stack."""

    def snapshot(self):
        return copy.deepcopy(vars(self))

    def restore(self, snap):
        keep = self.stack
        self.__dict__.update(copy.deepcopy(snap))
        self.stack = keep


class SharedSnapshot(StackEnv):
    """Snapshot copies the dict shallowly: the stack list is shared with the live env."""

    def snapshot(self):
        return dict(vars(self))

    def restore(self, snap):
        self.__dict__.update(snap)


class OutsideSnapshot(StackEnv):
    """The payout high-water mark is left out of the snapshot (a hand-written field list)."""

    def snapshot(self):
        return {k: copy.deepcopy(v) for k, v in vars(self).items() if k != "paid"}

    def restore(self, snap):
        self.__dict__.update(copy.deepcopy(snap))


class GlobalState(StackEnv):
    """State kept outside the env object (a module-level counter): replays differ."""

    calls = [0]

    def step(self, action, role=None):
        GlobalState.calls[0] += 1
        res = super().step(action, role)
        if res.valid and role == "Digger":
            self.loose += GlobalState.calls[0] % 2
            res.observation = self.observation()
        return res


class InvalidChangesState(StackEnv):
    """A garbage action still knocks the top block off."""

    def step(self, action, role=None):
        res = super().step(action, role)
        if not res.valid and self.stack:
            self.stack.pop()
            res.observation = self.observation()
        return res


class NegativeReward(StackEnv):
    """``knock`` (a listed, valid action) is charged -1, below reward_min 0."""

    def step(self, action, role=None):
        res = super().step(action, role)
        if res.valid and action.strip() == "knock":
            res.reward = -1.0
        return res


class StaleObservation(StackEnv):
    """step() returns the observation from before the action."""

    def step(self, action, role=None):
        before = self.observation()
        res = super().step(action, role)
        res.observation = before
        return res


@pytest.mark.parametrize(
    "env_cls,what",
    [
        (ForgetfulRestore, r"restore\(\) did not bring back the state of snapshot time .*\.stack"),
        (SharedSnapshot, r"stepping changed the snapshot taken before it \(it shares live state"),
        (
            OutsideSnapshot,
            r"restore\(\) did not bring back the state .*\.paid|the same action from the restored snapshot",
        ),
        (
            GlobalState,
            r"the same action from the restored snapshot gave another result|two episodes from the same seed|"
            r"the envs share state",
        ),
        (InvalidChangesState, r"an invalid action changed the state .*\.stack"),
        (NegativeReward, r"the episode reward -1 left the task's bounds \[reward_min 0, reward_max 6\]"),
        (StaleObservation, r"step\(\) returned an observation that observation\(\) then does not show"),
    ],
)
def test_each_broken_snapshot_contract_is_caught_with_seed_step_and_action(env_cls, what):
    with pytest.raises(ConformanceError) as err:
        check_domain(domain_with(env_cls), "tower")
    msg = str(err.value)
    assert re.search(what, msg), msg
    assert located(msg), msg


# ------------------------------------------------------------------ the bugs plugin authors write
#: Eight kinds of wood, a set of strings: its iteration order depends on the process's hash seed.
WOODS = {"oak", "birch", "pine", "spruce", "acacia", "jungle", "cherry", "mangrove"}


class SetOrderReset(StackEnv):
    """reset() lays out the trees from a list made of a set of strings: another world in another process.
    The whole order is seen (not, say, one tree's name length mod 3), so every other hash seed whose
    order differs from this process's shows it: the two children's orders differ from each other, so
    at least one differs from ours whatever this process's hash seed is."""

    def reset(self, seed):
        super().reset(seed)
        self.woods = list(WOODS)
        return self.observation()

    def observation(self) -> str:
        return (
            super().observation() + " of " + " ".join(str(sorted(WOODS).index(w)) for w in getattr(self, "woods", []))
        )


class HashSeeded(StackEnv):
    """reset() seeds its generator with hash() of a string: another world in another process."""

    def reset(self, seed):
        super().reset(seed)
        self.rng = random.Random(hash("tower") + seed)
        self.loose = 1 + self.rng.randrange(3)
        return self.observation()


class EarlyRestBonus(StackEnv):
    """Resting before anything was dug pays a 'patience' bonus of 10, above reward_max 6: a path the
    expert (who digs or stacks) never takes."""

    def step(self, action, role=None):
        first = self.turns == 0
        res = super().step(action, role)
        if res.valid and action.strip() == "rest" and first:
            res.reward = 10.0
        return res


class UselessKnockPenalty(StackEnv):
    """Knocking at an empty stack (valid: the Builder's own action, nothing to do) costs 0.5: below
    reward_min 0 when it comes first."""

    def step(self, action, role=None):
        empty = not self.stack
        res = super().step(action, role)
        if res.valid and action.strip() == "knock" and empty:
            res.reward = -0.5
        return res


class CrashOnEmptyText(StackEnv):
    """Reads the verb as ``action.split()[0]``: an empty or blank text raises IndexError."""

    def step(self, action, role=None):
        verb = action.split()[0]
        return super().step(verb, role)


class CrashOnRoleNone(StackEnv):
    """Compares ``role.lower()``: algo=monolithic and algo=rlcr step with role=None, an AttributeError."""

    def step(self, action, role=None):
        if role.lower() not in ("builder", "digger"):
            return StepResult(self.observation(), valid=False)
        return super().step(action, role)


class NoneIsInvalid(StackEnv):
    """Treats role=None as nobody: the monolithic model and RLCR could never act."""

    def step(self, action, role=None):
        if role is None:
            self.turns += 1
            return StepResult(self.observation(), valid=False)
        return super().step(action, role)


class ExpertOffPlan(StackEnv):
    """The expert follows a fixed plan and indexes past its end once other actions were taken."""

    PLAN = ("stack", "dig", "stack", "dig", "stack", "dig", "stack", "dig", "stack", "dig", "stack")

    def expert_action(self):
        if self.done:
            return None
        a = self.PLAN[self.turns]
        return ExpertStep("Builder" if a == "stack" else "Digger", a)


class HistoryObservation(StackEnv):
    """The observation lists every action so far: past 40 tokens (the task's model.max_prompt_tokens) deep
    in an episode, and the left cut would drop the role line."""

    def reset(self, seed):
        self.history = []
        return super().reset(seed)

    def step(self, action, role=None):
        res = super().step(action, role)
        if res.valid:
            self.history.append(action.strip())
            res.observation = self.observation()
        return res

    def observation(self):
        return super().observation() + " " + " ".join(getattr(self, "history", []))


class ProgressStack(StackEnv):
    """A correct anytime return: the heights paid so far (the summed step rewards)."""

    def progress(self):
        return float(self.paid)


class ProgressAsFraction(ProgressStack):
    """progress() in [0, 1] (share of the target) while rewards pay 1 per block: not in reward units."""

    def progress(self):
        return self.paid / self.target


#: The payout of each env, kept outside it (keyed by the env's id): snapshot/restore never sees it.
PAID_OUTSIDE: dict[int, float] = {}


class ProgressOutsideSnapshot(ProgressStack):
    """progress() reads a total kept outside the env: right after reset and every step it equals the
    rewards, but restoring a snapshot does not bring it back."""

    def reset(self, seed):
        PAID_OUTSIDE[id(self)] = 0.0
        return super().reset(seed)

    def step(self, action, role=None):
        res = super().step(action, role)
        PAID_OUTSIDE[id(self)] = PAID_OUTSIDE.get(id(self), 0.0) + float(res.reward)
        return res

    def progress(self):
        return PAID_OUTSIDE.get(id(self), 0.0)


class ClassListState(StackEnv):
    """The stack is a class attribute, cleared (not replaced) on reset: every env shares one list."""

    stack: list = []

    def reset(self, seed):
        obs = super().reset(seed)
        del self.stack  # back to the class's list
        self.stack.clear()
        return obs


class CachedEnvDomain(StackDomain):
    """make_env() hands out one cached env."""

    _env = None

    def make_env(self, task):
        if CachedEnvDomain._env is None:
            CachedEnvDomain._env = StackEnv(int(task.reward_max))
        return CachedEnvDomain._env


class HistoryDomain(StackDomain):
    """The task sets model.max_prompt_tokens: 40 in its overrides."""

    env_cls = HistoryObservation
    task = {**TASK, "overrides": {"model": {"max_prompt_tokens": 40}}}


LOC = r"stack/tower, seed \d+, step \d+, action '[^']*' by (\w+|role=None): "
LOC_NO_ACTION = r"stack/tower, seed \d+, step \d+: "


@pytest.mark.parametrize(
    "domain,where,what",
    [
        (
            domain_with(SetOrderReset),
            LOC_NO_ACTION + "|" + LOC,
            r"another process \(PYTHONHASHSEED=\d\) gave another episode for the same seed and actions .*set\(\)",
        ),
        (
            domain_with(HashSeeded),
            LOC_NO_ACTION + "|" + LOC,
            r"another process \(PYTHONHASHSEED=\d\) gave another episode for the same seed and actions",
        ),
        (
            domain_with(EarlyRestBonus),
            LOC,
            r"the episode reward 10 left the task's bounds \[reward_min 0, reward_max 6\]",
        ),
        (
            domain_with(UselessKnockPenalty),
            LOC,
            r"the episode reward -0\.5 left the task's bounds \[reward_min 0, reward_max 6\]",
        ),
        (
            domain_with(CrashOnEmptyText),
            r"stack/tower, seed \d+, step \d+, action '\s*' by (\w+|role=None): ",
            r"step\(\) raised IndexError: list index out of range",
        ),
        (
            domain_with(CrashOnRoleNone),
            r"stack/tower, seed \d+, step \d+, action '[^']*' by role=None: ",
            r"step\(\) raised AttributeError: 'NoneType' object has no attribute 'lower'",
        ),
        (
            domain_with(NoneIsInvalid),
            r"stack/tower, seed 0, step 0, action 'stack' by role=None: ",
            r"the expert's action was invalid when stepped with role=None \(it is Builder's; algo=monolithic and "
            r"algo=rlcr step the env with role=None",
        ),
        (
            domain_with(ExpertOffPlan),
            LOC_NO_ACTION + "|" + LOC,
            r"expert_action\(\) raised IndexError: tuple index out of range",
        ),
        (
            HistoryDomain(),
            LOC_NO_ACTION + "|" + LOC,
            r"'s (bid|action) prompt: the prompt is \d+ tokens long \(beginning of sequence included\), more than "
            r"model\.max_prompt_tokens=40: the policy refuses it at run time",
        ),
        (
            domain_with(ProgressAsFraction),
            r"stack/tower, seed \d+, step \d+, action '[^']*' by role=None: ",
            r"progress\(\) is 0\.1\d* but the step rewards so far sum to 1 .*in reward units",
        ),
        (
            domain_with(ProgressOutsideSnapshot),
            r"stack/tower, seed \d+, step \d+, action '[^']*' by role=None: ",
            r"progress\(\) after snapshot, \d more steps and restore is \d, not \d as at snapshot time",
        ),
        (CachedEnvDomain(), r"stack/tower, seed 0, step 0: ", r"make_env\(\) returned the same env object twice"),
        (
            domain_with(ClassListState),
            LOC_NO_ACTION + "|" + LOC,
            r"the episode played beside another env of the task \(seed 1\) differs from the same episode played alone",
        ),
    ],
    ids=[
        "set-order",
        "hash",
        "rare-bonus",
        "rare-penalty",
        "crash-on-blank-text",
        "crash-on-role-None",
        "role-None-invalid",
        "expert-raises",
        "prompt-overflow",
        "progress-units",
        "progress-restore",
        "cached-env",
        "class-list",
    ],
)
def test_each_plugin_author_bug_is_caught_naming_domain_task_seed_step_action_and_role(domain, where, what):
    with pytest.raises(ConformanceError) as err:
        check_domain(domain, "tower")
    msg = str(err.value)
    assert re.match(f"({where}).*{what}", msg), msg


def test_a_domain_whose_expert_stops_early_passes_without_the_kits_own_words_counting():
    """The kit's garbage ('zzqx florp') in a log is not the domain's vocabulary problem."""

    class Lazy(StackEnv):
        def expert_action(self):
            return ExpertStep("Builder", "stack") if not self.stack else None  # one block, then nothing to do

    check_domain(domain_with(Lazy), "tower", processes=False)
    assert check_prompts(domain_with(Lazy), "tower") > 100


def test_a_correct_anytime_return_passes_and_its_checks_run_inside_check_domain(monkeypatch):
    import swarm_runtime.conformance.rlcr as rc

    ran = []
    monkeypatch.setattr(rc, "check_progress", lambda d, t, **kw: ran.append("progress"))
    check_domain(domain_with(ProgressStack), "tower", processes=False)
    assert ran == ["progress"]
    monkeypatch.undo()
    check_domain(domain_with(ProgressStack), "tower")
    assert rc.check_progress(domain_with(ProgressStack), "tower") > 30


def test_a_domain_class_defined_in_a_function_is_carried_to_the_other_processes_by_cloudpickle(monkeypatch):
    """Its class cannot be imported by another process, so cloudpickle (Ray's copy with the ray extra) carries it
    there by value: the cross-process check runs on it and catches its hash-seed bug; a correct one passes without
    a warning. Without cloudpickle the kit says the check did not run, never passes silently. About 10 s (two pairs
    of child processes, Ray's cloudpickle imported in each)."""
    import warnings

    import swarm_runtime.conformance.determinism as det

    if det.cloudpickle_module() is None:
        pytest.skip("neither cloudpickle nor Ray installed")

    class LocalHashSeeded(StackDomain):  # defined in a function: no other process can import it
        env_cls = HashSeeded

    class Local(StackDomain):
        pass

    with pytest.raises(ConformanceError, match=r"another process \(PYTHONHASHSEED=\d\) gave another episode"):
        check_determinism(LocalHashSeeded(), "tower")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConformanceWarning)  # checked, not warned about
        check_determinism(Local(), "tower")
    monkeypatch.setattr(det, "cloudpickle_module", lambda: None)
    with pytest.warns(
        ConformanceWarning,
        match=r"stack/tower: determinism across processes not checked: its class .*Local is defined in a function, "
        r"so another process cannot import it, and cloudpickle, which would carry it there, is not installed",
    ):
        check_domain(Local(), "tower")


def test_the_cross_process_check_is_what_catches_hash_seed_bugs():
    """In one process the hash-seeded domain is deterministic; only the other processes see it."""
    check_determinism(domain_with(HashSeeded), "tower", processes=False)
    with pytest.raises(ConformanceError, match=r"PYTHONHASHSEED"):
        check_determinism(domain_with(HashSeeded), "tower")


def test_overlapping_splits_are_caught():
    with pytest.raises(ConformanceError, match=r"stack/tower: dev and eval seeds overlap \(4 shared"):
        check_splits(domain_with(dev_seeds={"start": 1004, "count": 8}), "tower")
    with pytest.raises(ConformanceError, match="train and eval seeds overlap"):
        check_splits(domain_with(eval_seeds={"start": 90, "count": 20}), "tower")
    check_splits(domain_with(), "tower")


class SeedModuloDomain(StackDomain):
    """Distinct seeds, shared instances: seed ``s`` builds tower ``s % 100``, so the dev seeds
    500-507 pick the same towers as train seeds 0-7."""

    def instances(self, task, seeds):
        return [f"tower {s % 100}" for s in seeds]


def test_splits_that_pick_the_same_instances_are_caught():
    with pytest.raises(
        ConformanceError,
        match=r"^stack/tower, seed 500: train and dev seeds pick the same instances "
        r"\(8 shared, e\.g\. 'tower 0' by train seed 0 and dev seed 500\)",
    ):
        check_splits(SeedModuloDomain(), "tower")
    d = SeedModuloDomain()
    d.task = {**TASK, "dev_seeds": {"start": 250, "count": 8}, "eval_seeds": {"start": 1, "count": 0}}
    d.instances = lambda task, seeds: [f"tower {s}" for s in seeds]
    check_splits(d, "tower")


class ChoicesDomain(StackDomain):
    """``action_choices`` broken three ways (``broken``): the expert's ``stack`` is not listed, a
    listed choice is not a valid action of its role, a listed choice is not in the vocabulary."""

    broken = "missing"

    def action_choices(self, task, role):
        choices = {"Builder": ["stack", "knock"], "Digger": ["dig", "rest"]}
        if self.broken == "missing":
            choices["Builder"] = ["knock"]
        elif self.broken == "invalid":
            choices["Digger"] = ["dig", "rest", "knock"]  # knock is the Builder's
        elif self.broken == "unspelled":
            choices["Digger"] = ["dig", "rest", "nap"]
        return choices.get(role)


@pytest.mark.parametrize(
    "broken,where,what",
    [
        (
            "missing",
            r"stack/tower, seed 0, step 0, action 'stack' by Builder: ",
            r"the expert's action is not among Builder's 1 listed action choices \(e\.g\. \['knock'\]\): with "
            r"model\.constrained_actions=true its model could never take it",
        ),
        (
            "invalid",
            r"stack/tower, seed 0, step 0, action 'knock' by Digger: ",
            r"the listed action choice is not a valid action of Digger at the start of the episode .*valid=False, "
            r"observation 'loose 1 stack 0 of 6'",
        ),
        (
            "unspelled",
            r"stack/tower, seed 0, step 0, action 'nap' by Digger: ",
            r"the listed action choice has words missing from vocabulary\(\): \['nap'\]",
        ),
    ],
    ids=["expert-not-listed", "invalid-choice", "unspelled-choice"],
)
def test_broken_action_choices_are_caught_with_seed_step_and_action(broken, where, what):
    d = ChoicesDomain()
    d.broken = broken
    with pytest.raises(ConformanceError) as err:
        check_action_choices(d, "tower")
    msg = str(err.value)
    assert re.match(where + what, msg), msg
    assert located(msg), msg
    with pytest.raises(ConformanceError, match=re.escape(msg)):
        check_domain(d, "tower")  # the whole kit reports the same failure


def test_a_cached_task_config_is_caught():
    class Cached(StackDomain):
        cfg = OmegaConf.create(TASK)

        def task_config(self, task):
            return self.cfg

    with pytest.raises(ConformanceError, match="task_config\\(\\) returned the same object twice"):
        check_fresh_task_config(Cached(), "tower")


def test_max_decisions_that_cut_the_expert_off_are_caught():
    with pytest.raises(ConformanceError) as err:
        check_max_decisions(domain_with(max_decisions=4), "tower")
    assert "max_decisions=4 cut the expert off" in str(err.value) and located(str(err.value))


def test_runtime_contract_errors_name_seed_step_and_action():
    env = ValidatedEnv(NegativeReward(6), "stack", (0.0, 6.0), task="tower")
    env.reset(3)
    for a in ("stack", "knock", "stack"):  # +1, -1, 0 (height 1 was paid)
        env.step(a, "Builder")
    with pytest.raises(
        EnvContractError,
        match=r"^stack/tower, seed 3, step 3, action 'knock' by Builder: episode "
        r"reward -1.0 left its bounds \[0.0, 6.0\]",
    ):
        env.step("knock", "Builder")
    env.reset(3)
    snap = env.snapshot()
    env.step("stack", "Builder")
    env.restore(snap)
    assert env.t == 0


# ------------------------------------------------------------------ dev split of the built-in tasks
def test_builtin_tasks_have_a_disjoint_dev_split_and_eval_split_selects_it(registry):
    from conftest import run_context

    from swarm_runtime.config.errors import ConfigError
    from swarm_runtime.config.load import resolve

    mc = registry[1].domains["minecraft"]
    task = mc.task_config("iron_pickaxe")
    assert mc.episode_seeds(task, "dev") == list(range(50000, 50032))
    assert mc.episode_seeds(task, "eval") == list(range(100000, 100032))  # unchanged
    assert mc.episode_seeds(task, "train") == list(range(1000))  # unchanged
    check_splits(mc, "iron_pickaxe")
    check_splits(registry[1].domains["vln_ce"], "r2r")
    with pytest.raises(ValueError, match="unknown split 'test'; valid: train, dev, eval"):
        mc.episode_seeds(task, "test")
    ctx = run_context(registry, "domain=minecraft", "task=iron_pickaxe", "eval.split=dev", "eval.episodes=4")
    assert ctx.seeds("eval") == [50000, 50001, 50002, 50003] and ctx.seeds("train")[:2] == [0, 1]
    assert run_context(registry, "domain=minecraft", "eval.episodes=2").seeds("eval") == [100000, 100001]
    orr = registry[1].domains["openresearcher"]
    assert orr.episode_seeds(orr.task_config("embedded"), "dev") == list(range(2_000_000, 2_000_050))
    check_splits(orr, "embedded")  # seeds and the questions they pick
    with pytest.raises(
        ConfigError, match="eval.split=dev, but task 'local' of 'openresearcher' defines no dev_seeds; valid here: eval"
    ):
        resolve(["domain=openresearcher", "task=local", "eval.split=dev"], registry[1])


def test_prompts_are_measured_with_the_runs_tokenizer_and_too_long_ones_fail(tmp_path):
    """With the run's ``model.path``, the kit counts a prompt's tokens as the run does (that checkpoint's BPE, not
    the in-process word-level tokenizer): prompts that fit 40 words but not 40 BPE tokens fail, where the run would
    stop on them. A few seconds (a 2-layer checkpoint built here, the kit run once)."""
    from conftest import make_local_checkpoint

    from swarm_runtime.config.schema import ModelConfig
    from swarm_runtime.conformance.task import run_prompt_length
    from swarm_runtime.models.transformers_backend import make_transformers_policy

    ckpt = make_local_checkpoint(tmp_path / "ckpt")
    domain = domain_with()
    check_prompts(domain, "tower", model={"max_prompt_tokens": 40})  # the word-level count: fits
    for kit, model in (
        (check_domain, {"path": str(ckpt), "max_prompt_tokens": 40}),  # the whole kit (the other checks pass)
        (check_prompts, OmegaConf.structured(ModelConfig(name="local", path=str(ckpt), max_prompt_tokens=40))),
    ):
        with pytest.raises(ConformanceError) as err:
            kit(domain, "tower", model=model, **({"processes": False} if kit is check_domain else {}))
        assert located(str(err.value)) or re.match(r"stack/tower, seed \d+, step \d+: ", str(err.value))
        assert (
            f"tokens long with the run's tokenizer (model.path={str(ckpt)!r}), more than model.max_prompt_tokens=40"
            in (str(err.value))
        )
        assert "the run stops on it" in str(err.value)
    check_prompts(domain, "tower", model={"path": str(ckpt), "max_prompt_tokens": 120})
    # the kit's count is the run's: the policy a run builds on that checkpoint encodes each prompt to as many tokens
    cfg = OmegaConf.structured(ModelConfig(name="local", path=str(ckpt), max_prompt_tokens=4096))
    policy = make_transformers_policy(cfg, [], [0.0, 0.2, 0.4, 0.6, 0.8], seed=0)
    length = run_prompt_length(cfg)
    prompts = [domain.bid_prompt("Builder", "loose 1 stack 0 of 6", []), "you are Digger . loose 3 stack 2 of 6 ."]
    assert [length(p) for p in prompts] == [len(policy.encode_prompt(p)) for p in prompts]
    assert length(prompts[0]) > len(prompts[0].split()) + 1  # more than the word-level count
