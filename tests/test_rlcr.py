"""RLCR (``algo=rlcr``): the simulated clock and event loop, messages, organisation, the flat collective
advantage, the Minecraft parallel form, the conformance checks, bad inputs and one real CLI run."""

from __future__ import annotations

import json
import math
from collections import deque

import pytest
import torch
from omegaconf import OmegaConf

from swarm_runtime.config.errors import ConfigError
from swarm_runtime.config.load import resolve
from swarm_runtime.config.schema import ModelConfig
from swarm_runtime.conformance.rlcr import check_concurrent, check_progress
from swarm_runtime.core.domain import Domain, Role
from swarm_runtime.core.env import DomainEnv, StepResult
from swarm_runtime.learn.rlcr.clock import EventQueue, latency_penalized, t_max_at
from swarm_runtime.learn.rlcr.learn import collective_returns, flat_samples, group_advantages, reinforce_step
from swarm_runtime.learn.rlcr.loop import LoopOptions, Rollout, Turn, play_concurrent, policy_decider
from swarm_runtime.learn.rlcr.messages import Board, parse_command
from swarm_runtime.learn.rlcr.org import Organisation
from tests.conftest import ROOT, TINY_RLCR, swarm

TICK_TASK = OmegaConf.create(
    {
        "max_decisions": 50,
        "reward_max": 10,
        "reward_min": 0,
        "train_seeds": {"start": 0, "count": 4},
        "eval_seeds": {"start": 100, "count": 2},
    }
)


class Tick(DomainEnv):
    """Toy concurrent env: ``work ...`` takes 10 simulated seconds and adds 1 to the progress; 10 is done."""

    def reset(self, seed: int) -> str:
        self.n, self.log, self.done = 0, [], False
        return self.observation()

    def step(self, action: str, role=None) -> StepResult:
        if not action.startswith("work"):
            return StepResult(self.observation(), 0.0, False, valid=False)
        self.n += 1
        self.log.append(action)
        self.done = self.n >= 10
        return StepResult(self.observation(), 1.0, self.done)

    def observation(self) -> str:
        return f"count {self.n}"

    def progress(self) -> float:
        return float(self.n)

    def action_seconds(self, action: str, role=None) -> float:
        return 10.0 if action.startswith("work") else 0.0

    def concurrent_expert(self, agent, busy):
        return None if self.done else "work"


class TickDomain(Domain):
    name = "tick"
    roles = (Role("Worker", "works"),)

    def make_env(self, task):
        return Tick()

    def vocabulary(self, task):
        return ["work", "count", "hi", "hello", "iron", "coal"]


def scripted(scripts: dict[str, list[str]], tokens: dict[str, int] | None = None):
    """A decider that plays each agent's script (then ``work``), with ``tokens[agent]`` tokens per action."""
    queues = {a: deque(s) for a, s in scripts.items()}
    seen: dict[str, list[str]] = {}

    def decide(requests):
        out = []
        for r in requests:
            seen.setdefault(r.agent, []).append(r.prompt)
            q = queues.get(r.agent)
            text = q.popleft() if q else "work"
            out.append((text, [0] * (tokens or {}).get(r.agent, 1)))
        return out

    decide.seen = seen
    return decide


def envs_of(rollout_slots):
    return rollout_slots


# ----------------------------------------------------------------------------- the clock


def test_event_queue_pops_the_earliest_agents_together_in_push_order():
    q = EventQueue()
    for t, a in ((5.0, "a"), (3.0, "b"), (3.0, "c"), (7.0, "d")):
        q.push(t, a)
    assert q.pop_due() == (3.0, ["b", "c"])
    q.drop("d")
    assert q.pop_due() == (5.0, ["a"]) and q.peek() is None
    with pytest.raises(ValueError):
        q.push(math.inf, "x")


def test_time_accounting_and_the_env_sees_actions_in_time_order():
    # alpha: 1 token x 2 s + 10 s = 12 s per action; bravo: 3 tokens x 2 s + 10 s = 16 s.
    decide = scripted({"alpha": ["work alpha"] * 20, "bravo": ["work bravo"] * 20}, {"alpha": 1, "bravo": 3})
    domain = TickDomain()
    envs = []
    orig = domain.concurrent_env
    domain.concurrent_env = lambda task: envs.append(orig(task)) or envs[-1]
    (r,) = play_concurrent(domain, TICK_TASK, [0], decide, LoopOptions(t_max=1000, seconds_per_token=2.0, agents=2))
    # completions: a12 b16 a24 b32 a36 | 48: bravo (queued at 32) before alpha (queued at 36) | a60 b64 a72 = 10th
    assert envs[0].log == ["work " + x for x in "alpha bravo alpha bravo alpha bravo alpha alpha bravo alpha".split()]
    assert r.done and r.duration == 72.0 and r.progress == 10.0
    assert [t.t for t in r.turns if t.agent == "alpha"][:4] == [0.0, 12.0, 24.0, 36.0]
    assert [t.t for t in r.turns if t.agent == "bravo"][:3] == [0.0, 16.0, 32.0]
    assert {t.seconds for t in r.turns if t.agent == "bravo"} == {16.0}
    assert r.curve[-1] == (72.0, 10.0) and r.progress_at(30.0) == 3.0


def test_tick_makes_agents_decide_together_at_its_multiples():
    decide = scripted({}, {"alpha": 1, "bravo": 3})
    (r,) = play_concurrent(
        TickDomain(), TICK_TASK, [0], decide, LoopOptions(t_max=1000, seconds_per_token=2.0, agents=2, tick=10.0)
    )
    # alpha's 12 s and bravo's 16 s actions both end before 20: both decide at 0, 20, 40, ...
    assert [t.t for t in r.turns][:6] == [0.0, 0.0, 20.0, 20.0, 40.0, 40.0]


def test_t_max_stops_the_rollout_with_the_progress_at_that_moment():
    decide = scripted({}, {"alpha": 1, "bravo": 3})
    (r,) = play_concurrent(TickDomain(), TICK_TASK, [0], decide, LoopOptions(t_max=30, seconds_per_token=2.0, agents=2))
    # a12 b16 a24 complete; bravo's action due at 32 lies past T_max and never lands
    assert (r.progress, r.duration, r.done) == (3.0, 30.0, False)
    assert all(t.t <= 30 for t in r.turns)


def test_token_budget_and_turn_cap_stop_deciding():
    decide = scripted({})
    (r,) = play_concurrent(
        TickDomain(),
        TICK_TASK,
        [0],
        decide,
        LoopOptions(t_max=math.inf, seconds_per_token=1.0, agents=1, token_budget=4),
    )
    assert len(r.turns) == 4 and r.progress == 4.0 and r.duration == 44.0


def test_schedule_and_latency_penalty():
    assert [t_max_at(s, 600, 1500, 12) for s in (0, 6, 12, 40)] == [600, 1050, 1500, 1500]
    assert latency_penalized(100.0, 10.0, 0.5, 300.0, 600.0) == pytest.approx(97.5)
    assert latency_penalized(100.0, 0.0, 0.5, 300.0, 600.0) == 100.0


# ----------------------------------------------------------------------------- messages and organisation


def test_parse_command():
    assert parse_command("say bravo mine iron") == parse_command("say bravo mine iron")
    c = parse_command("say bravo mine iron")
    assert (c.kind, c.target, c.body) == ("say", "bravo", "mine iron")
    assert parse_command("post chop tree").kind == "post"
    assert parse_command("hire mine iron").body == "mine iron"
    assert (parse_command("fire alpha").kind, parse_command("fire alpha").target) == ("fire", "alpha")
    assert parse_command("chop tree").kind == "env" and parse_command("chop tree").body == "chop tree"
    for bad in ("", "say", "say bravo", "post", "fire", "search"):
        assert parse_command(bad).kind == "unparsed", bad


def test_board_shows_each_agent_what_is_new_since_its_last_action():
    b = Board()
    b.post(1, "alpha", "hello")
    b.say(2, "bravo", "alpha", "hi")
    b.write(3, "bravo", "iron at depth two")
    inbox, channel, found = b.view("alpha", 3)
    assert [m.render() for m in inbox] == ["bravo hi"] and channel == [] and found == []  # own post hidden
    assert [m.render() for m in b.view("bravo", 3)[1]] == ["alpha hello"]
    assert b.view("bravo", 3)[1] == []  # seen
    assert b.search("alpha", "iron") == 1 and b.view("alpha", 3)[2][0].text == "iron at depth two"


def test_messages_in_the_loop_reach_inbox_channel_and_archive():
    decide = scripted(
        {
            "alpha": ["post hello", "write iron coal", "work"],
            "bravo": ["say alpha hi", "search iron", "say zulu hi", "say"],
        }
    )
    (r,) = play_concurrent(
        TickDomain(), TICK_TASK, [0], decide, LoopOptions(t_max=200, seconds_per_token=1.0, agents=2)
    )
    a2, b2, b3 = decide.seen["alpha"][1], decide.seen["bravo"][1], decide.seen["bravo"][2]
    assert "inbox : bravo hi" in a2 and "channel : alpha hello" in b2
    assert "found : alpha iron coal" in b3
    assert r.counts["bad_messages"] == 1 and r.counts["unparsed"] == 1  # zulu does not exist; a bare "say"
    assert (
        r.message_tokens == 5
        and r.counts["messages"] == 4
        and r.env_tokens == len([t for t in r.turns if t.kind == "env"])
    )
    assert all(t.seconds == 1.0 for t in r.turns if t.kind != "env")  # a message costs its tokens' time


def test_ceo_hires_fires_and_hires_beyond_the_cap_are_refused():
    decide = scripted(
        {"ceo": ["hire work hard", "hire more", "fire alpha", "say alpha hi", "fire ceo"], "alpha": ["work"] * 50}
    )
    (r,) = play_concurrent(
        TickDomain(), TICK_TASK, [0], decide, LoopOptions(t_max=300, seconds_per_token=1.0, org="ceo", max_hires=1)
    )
    c = r.counts
    assert (c["hires"], c["refused_hires"], c["fires"], c["bad_messages"], c["bad_fires"]) == (1, 1, 1, 1, 1)
    assert "you are alpha . brief work hard" in decide.seen["alpha"][0]
    fired_at = next(t.t + t.seconds for t in r.turns if t.text == "fire alpha")
    assert max(t.t for t in r.turns if t.agent == "alpha") < fired_at and r.team_peak == 2
    org = Organisation("flat", agents=2)
    assert org.hire("alpha", "x") == (None, "only the ceo hires") and org.members == ["alpha", "bravo"]


# ----------------------------------------------------------------------------- learning rule


def test_group_advantages_by_hand():
    assert group_advantages([1, 3, 10, 20], [0, 0, 1, 1]) == [-1, 1, -5, 5]
    assert group_advantages([1, 3, 10, 20], [0, 0, 1, 1], normalize_std=True) == pytest.approx([-1, 1, -1, 1], abs=1e-5)
    assert group_advantages([4, 4], [0, 0], normalize_std=True) == [0.0, 0.0]


def test_flat_advantage_on_every_token_of_every_agent():
    rollouts = []
    for i, p in enumerate((10.0, 30.0, 50.0)):
        r = Rollout(seed=7, group=0, t_max=600.0, progress=p, duration=300.0 * (i + 1))
        r.turns = [
            Turn(a, 0.0, f"p{i}{a}", "work", [1] * (k + 1), "env") for k, a in enumerate(("alpha", "bravo", "ceo"))
        ]
        rollouts.append(r)
    returns = collective_returns(rollouts, 0.0, 100.0)
    adv = group_advantages(returns, [r.group for r in rollouts])
    samples = flat_samples(rollouts, adv)
    assert adv == [-20.0, 0.0, 20.0]
    assert [(s[0][:2], s[2]) for s in samples] == [("p0", -20.0)] * 3 + [
        ("p2", 20.0)
    ] * 3  # zero-advantage rollout left out
    # latency penalty: mean pass rate 0.3, T/T_max = 0.5, 1, 1 (capped)
    # beta is relative to reward_max: 0.1 x 100 = 10 return units at pass rate 1 and T = T_max
    assert collective_returns(rollouts, 0.1, 100.0) == pytest.approx([10 - 1.5, 30 - 3.0, 50 - 3.0])


@pytest.fixture(scope="module")
def tiny_policy():
    from swarm_runtime.learn.rlcr.loop import RLCR_WORDS
    from swarm_runtime.models.transformers_backend import make_transformers_policy

    cfg = OmegaConf.merge(
        OmegaConf.structured(ModelConfig), {"hidden_size": 32, "intermediate_size": 64, "max_action_tokens": 4}
    )
    return make_transformers_policy(cfg, TickDomain().all_words(TICK_TASK) + list(RLCR_WORDS), [0.0, 0.5], seed=3)


def test_reinforce_step_moves_each_rollouts_tokens_by_its_sign(tiny_policy):
    from swarm_runtime.learn.optim import make_optimizer

    p = tiny_policy
    good, bad = (
        ("you are alpha . count 1 . action :", p.action_target("work")),
        ("you are alpha . count 1 . action :", p.action_target("say bravo hi")),
    )
    with torch.no_grad():
        before = p.logprobs([good[0], bad[0]], [good[1], bad[1]]).tolist()
    params = [q.detach().clone() for q in p.parameters()]
    opt, sched = make_optimizer(p.parameters(), 1e-2, 0.0, 10)
    for _ in range(3):
        m = reinforce_step(p, [(*good, 1.0), (*bad, -1.0)], opt, sched, 1.0, 8, 1.0)
    with torch.no_grad():
        after = p.logprobs([good[0], bad[0]], [good[1], bad[1]]).tolist()
    assert after[0] > before[0] and after[1] < before[1] and m["charts/trained_turns"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(params, p.parameters()))


def test_concurrent_loop_with_a_real_policy_is_batched_and_deterministic(tiny_policy):
    sizes = []
    runs = []
    for _ in range(2):
        tiny_policy.gen.manual_seed(11)
        rs = play_concurrent(
            TickDomain(),
            TICK_TASK,
            [0, 0, 1],
            policy_decider(tiny_policy),
            LoopOptions(t_max=120, seconds_per_token=1.0, agents=3),
            on_round=lambda n, reqs: sizes.append(len(reqs)),
        )
        runs.append([[(t.agent, t.t, t.text) for t in r.turns] for r in rs])
    assert runs[0] == runs[1]
    assert sizes[0] == 9  # 3 rollouts x 3 agents free at t = 0 go to the model in one batch


# ----------------------------------------------------------------------------- domains


def test_minecraft_parallel_form_split_work_finishes_sooner(registry):
    from swarm_runtime.conformance.rlcr import _WordCount
    from swarm_runtime.learn.rlcr.loop import expert_decider
    from swarm_runtime.learn.rlcr.trainer import loop_options

    _, reg = registry
    d = reg.domains["minecraft"]
    task = d.task_config("iron_pickaxe")
    cfg = OmegaConf.structured(__import__("swarm_runtime.config.load", fromlist=["RunConfig"]).RunConfig)
    minutes = {}
    for n in (1, 3):
        rs = play_concurrent(d, task, list(range(6)), expert_decider(_WordCount(), n), loop_options(cfg, 1e9, agents=n))
        minutes[n] = sum(r.duration for r in rs if r.done) / max(1, sum(r.done for r in rs))
    assert minutes[3] < 0.8 * minutes[1]


def test_minecraft_duplicated_crafts_waste_the_shared_storage(registry):
    _, reg = registry
    d = reg.domains["minecraft"]
    env = d.concurrent_env(d.task_config("iron_pickaxe"))
    env.reset(0)
    env.inventory = {"planks": 8}
    env.rng.random = lambda: 0.0
    env.step("craft crafting_table")
    env.step("craft crafting_table")  # a second agent did the same: 4 planks gone for nothing
    assert env.inventory == {"crafting_table": 2} and env.progress() == 10.0
    assert env.action_seconds("chop tree") > env.action_seconds("craft planks") > 0
    assert env.concurrent_expert("bravo", {"alpha": "craft crafting_table"}) != "craft crafting_table"


def test_conformance_checks_pass_on_minecraft_and_a_toy_domain(registry):
    _, reg = registry
    for domain, task in ((reg.domains["minecraft"], "iron_pickaxe"), (TickDomain(), TICK_TASK)):
        check_progress(domain, task)
        check_concurrent(domain, task)


class GiveUp(Tick):
    """``quit`` ends the episode unsolved: done, but its metrics say no success."""

    def step(self, action: str, role=None) -> StepResult:
        if action.startswith("quit"):
            self.done = True
            return StepResult(self.observation(), 0.0, True)
        return super().step(action, role)

    def metrics(self):
        return {"success": float(self.n >= 10)}


class GiveUpDomain(TickDomain):
    def make_env(self, task):
        return GiveUp()


def test_rlcr_success_comes_from_the_envs_metrics_not_from_done():
    from swarm_runtime.learn.rlcr.signs import rollout_metrics, summarize_rollouts

    opts = LoopOptions(t_max=1e6, seconds_per_token=1.0, agents=1)
    quit_, solve = (
        play_concurrent(GiveUpDomain(), TICK_TASK, [0], scripted({"alpha": script}), opts)[0]
        for script in (["work", "quit"], [])
    )
    assert quit_.done and quit_.success == 0.0 and solve.done and solve.success == 1.0
    assert rollout_metrics([quit_, solve])["charts/success"] == 0.5
    assert summarize_rollouts([quit_], runs=1)["success_mean"] == 0.0
    tick = play_concurrent(TickDomain(), TICK_TASK, [0], scripted({}), opts)[0]  # no success metric: done counts
    assert tick.done and tick.metrics == {} and tick.success == 1.0


# ----------------------------------------------------------------------------- bad input and the CLI


@pytest.mark.parametrize(
    "arg, words",
    [
        ("rlcr.org=mesh", ["rlcr.org", "'mesh'", "flat, ceo"]),
        ("rlcr.t_max.end=100", ["rlcr.t_max.end", ">= rlcr.t_max.start"]),
        ("rlcr.t_max.start=0", ["rlcr.t_max.start", "> 0"]),
        ("rlcr.t_max.steps=0", ["rlcr.t_max.steps=0", "[1, "]),
        ("rlcr.group_size=1", ["rlcr.group_size=1", "[2, 1024]"]),
        ("rlcr.agents=12", ["rlcr.agents", "[1, 9]"]),
        ("rlcr.max_hires=9", ["rlcr.max_hires", "[0, 8]"]),
        ("rlcr.seconds_per_token=0", ["rlcr.seconds_per_token", "> 0"]),
    ],
)
def test_bad_rlcr_values_name_the_valid_range(registry, arg, words):
    _, reg = registry
    with pytest.raises(ConfigError) as e:
        resolve(["domain=minecraft", "algo=rlcr", arg], reg)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_rlcr_is_registered_like_any_plugin_algorithm(registry):
    _, reg = registry
    assert "rlcr" in reg.algorithms and {"rlcr_teams", "rlcr_org"} <= set(reg.experiments)
    assert "algorithm:rlcr" in reg.provenance["builtins"]


def test_a_domain_without_progress_is_a_config_error_naming_it(registry):
    _, reg = registry
    with pytest.raises(ConfigError) as e:
        resolve(["domain=vln_ce", "algo=rlcr"], reg)
    assert "'vln_ce'" in str(e.value) and "progress()" in str(e.value) and "docs/guides/rlcr.md" in str(e.value)
    resolve(["domain=vln_ce"], reg)  # the other algorithms do not need it


def test_cli_rlcr_run_trains_evaluates_and_plots(tmp_path, warm_swarm):
    out = tmp_path / "run"
    res = swarm(
        "run", *TINY_RLCR, "algo.iterations=2", "rlcr.t_max.steps=2", "eval.episodes=2", f"run_dir={out}", cwd=ROOT
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "RLCR: flat team of 3" in res.stdout and "RLCR: solo" in res.stdout and "RLCR - SFT" in res.stdout
    ev = json.loads((out / "eval.json").read_text())
    assert set(ev["results"]) == {"SFT: flat team of 3", "SFT: solo", "RLCR: flat team of 3", "RLCR: solo"}
    assert (out / "signs_of_life.png").stat().st_size > 0 and (out / "performance_latency.png").exists()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["charts/t_max"] for r in rows if "charts/t_max" in r] == [120.0, 180.0]
    assert all("signs/comm_intensity" in r and "signs/useful_work_rel_team_3" in r for r in rows if r["step"] > 0)
    assert (out / "checkpoints" / "sft" / "agents" / "Shared" / "config.json").exists()
    more = warm_swarm("run", "resume=true", f"run_dir={out}", "algo.iterations=3", "progress=false", cwd=ROOT)
    assert more.returncode == 0, more.stderr[-3000:]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(3) == 1 and steps.count(2) == 1  # one more update, none repeated
    ev = warm_swarm("eval", str(out), "checkpoint=sft", cwd=ROOT)
    assert ev.returncode == 0 and "sft: solo" in ev.stdout and (out / "eval-sft.json").exists(), ev.stderr[-2000:]
    bad = warm_swarm("run", "domain=vln_ce", "algo=rlcr", f"run_dir={tmp_path / 'bad'}", cwd=ROOT)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "vln_ce" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_cli_rlcr_run_without_updates_labels_its_figures_sft(tmp_path):
    """``algo.iterations=0`` under ``algo=rlcr``: the SFT checkpoint is the final one, evaluated once, and
    the collective-vs-solo line says SFT (no RLCR policy exists)."""
    out = tmp_path / "run"
    res = swarm(
        "run", *TINY_RLCR, "algo.iterations=0", "eval.episodes=2", "tensorboard=false", f"run_dir={out}", cwd=ROOT
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "SFT flat team of 3 - solo (same policy, same T_max)" in res.stdout
    assert "RLCR flat team" not in res.stdout and "| RLCR:" not in res.stdout
    assert set(json.loads((out / "eval.json").read_text())["results"]) == {"SFT: flat team of 3", "SFT: solo"}
