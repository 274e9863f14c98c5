"""Tests of the vln_ce domain: conformance, parser, metrics, simulator, splits, expert, habitat adapter."""

from __future__ import annotations

import importlib.util
import math
import random
import re
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf

from swarm_domains.vln_ce import actions as A
from swarm_domains.vln_ce import metrics as M
from swarm_domains.vln_ce import plugin
from swarm_domains.vln_ce.config import EmbeddedConfig, HabitatConfig, VLNConfigError
from swarm_domains.vln_ce.episodes import layout_key, make_episode
from swarm_domains.vln_ce.habitat_adapter import (
    HabitatUnavailable,
    HabitatVLNEnv,
    check_data,
    episode_index,
    expert_step,
    map_metrics,
)
from swarm_domains.vln_ce.layout import get_layout
from swarm_domains.vln_ce.plugin import VLNDomain
from swarm_runtime import check_domain
from swarm_runtime.core.domain import Event
from swarm_runtime.models.tokenizer import build_tokenizer, split_words, unknown_words


@pytest.fixture(scope="module")
def domain():
    return VLNDomain()


@pytest.fixture(scope="module")
def task(domain):
    return domain.task_config("r2r")


def make_env(task, **over):
    cfg = OmegaConf.merge(task, over) if over else task
    return VLNDomain().make_env(cfg)


# ---------------------------------------------------------------- registration and conformance


def test_plugin_registers_the_domain():
    got = []
    plugin.swarm_register_domains(register=got.append)
    assert [d.name for d in got] == ["vln_ce"]
    assert [r.name for r in got[0].roles] == ["Turner", "Mover", "Stopper"]


def test_conformance_kit(domain):
    check_domain(domain, "r2r")


def test_task_yaml(task):
    assert task.max_decisions == 64 and task.sim == "embedded"
    assert task.train_seeds.count >= 5000 and task.eval_seeds.count == 88
    assert (task.reward_min, task.reward_max) == M.reward_bounds(
        task.success_bonus, task.invalid_penalty, task.max_decisions
    )


# ---------------------------------------------------------------- action parser


@pytest.mark.parametrize(
    "text, kind, amount",
    [
        ("The next action is turn left 30 degree.", A.TURN_LEFT, 30),
        ("the next action is TURN RIGHT 45 DEGREES!", A.TURN_RIGHT, 45),
        ("The next action is move forward 75 cm.", A.MOVE_FORWARD, 75),
        ("move forward 50cm", A.MOVE_FORWARD, 50),
        ("Next action: move forward 0.5 m", A.MOVE_FORWARD, 50),
        ("go forward 1 meter", A.MOVE_FORWARD, 100),
        ("The next action is stop.", A.STOP, 0),
        ("  STOP  ", A.STOP, 0),
        ("turn left", A.TURN_LEFT, 15),
        ("move forward", A.MOVE_FORWARD, 25),
        ("The next action is turn_right 90 degree", A.TURN_RIGHT, 90),
    ],
)
def test_parser_formats(text, kind, amount):
    assert A.parse_action(text) == A.ParsedAction(kind, amount)


@pytest.mark.parametrize(
    "text, prims",
    [
        ("turn left 45 degree", (A.TURN_LEFT,) * 3),
        ("turn right 15 degree", (A.TURN_RIGHT,)),
        ("turn left 180 degree", (A.TURN_LEFT,) * 12),
        ("move forward 25 cm", (A.MOVE_FORWARD,)),
        ("move forward 75 cm", (A.MOVE_FORWARD,) * 3),
        ("stop", (A.STOP,)),
    ],
)
def test_multiples_expand_into_primitive_steps(text, prims):
    assert A.parse_action(text).primitives() == prims


@pytest.mark.parametrize(
    "text",
    [
        "zzqx florp",
        "",
        "turn left 20 degree",
        "turn left 0 degree",
        "turn left 195 degree",
        "move forward 30 cm",
        "move forward 125 cm",
        "move forward 0.3 m",
        "move backward 25 cm",
        "turn up 30 degree",
        "turn left 30 degree and stop",
        "The next action is",
        "stop moving",
        "fly",
    ],
)
def test_parser_rejects_garbage(text):
    assert A.parse_action(text) is None


def test_roundtrip_of_navila_text():
    for act in (A.ParsedAction(A.TURN_LEFT, 30), A.ParsedAction(A.MOVE_FORWARD, 75), A.ParsedAction(A.STOP)):
        assert A.parse_action(act.navila_text()) == act
        assert A.parse_action(act.short()) == act
    assert A.ParsedAction(A.TURN_RIGHT, 45).navila_text() == "The next action is turn right 45 degree."


def test_per_role_action_spaces():
    assert A.role_allows("Turner", A.TURN_LEFT) and A.role_allows("Turner", A.TURN_RIGHT)
    assert not A.role_allows("Turner", A.MOVE_FORWARD) and not A.role_allows("Turner", A.STOP)
    assert A.role_allows("Mover", A.MOVE_FORWARD) and not A.role_allows("Mover", A.TURN_LEFT)
    assert A.role_allows("Stopper", A.STOP) and not A.role_allows("Stopper", A.MOVE_FORWARD)
    assert all(A.role_allows(None, k) for k in A.PRIMITIVES)
    act, err = A.check_action("move forward 25 cm", "Turner")
    assert act is None and "Turner" in err
    act, err = A.check_action("stop", "Captain")
    assert act is None and "Captain" in err and "Stopper" in err


def test_wrong_role_is_a_noop(task):
    env = make_env(task)
    env.reset(3)
    before = env.snapshot()
    for text, role in (
        ("The next action is move forward 75 cm.", "Turner"),
        ("The next action is turn left 30 degree.", "Mover"),
        ("The next action is stop.", "Mover"),
        ("The next action is turn left 30 degree.", "Stopper"),
    ):
        res = env.step(text, role)
        assert not res.valid and res.reward == 0.0 and not res.done
        assert (env.x, env.y, env.heading, env.stopped) == (
            before["state"]["x"],
            before["state"]["y"],
            before["state"]["heading"],
            False,
        )
    assert env.decisions == 4  # a no-op still used a decision
    assert env.metrics()["invalid_actions"] == 4 and env.metrics()["steps_taken"] == 0
    env.step("The next action is turn left 30 degree.", "Turner")
    assert env.metrics()["invalid_actions"] == 4


def test_invalid_penalty_charges_each_invalid_action(domain, task):
    env = make_env(task, invalid_penalty=0.05, reward_min=-1 - 64 * 0.05)
    env.reset(3)
    before = env.snapshot()["state"]
    res = env.step("The next action is move forward 75 cm.", "Turner")
    assert not res.valid and res.reward == pytest.approx(-0.05)
    assert (env.x, env.y, env.heading) == (before["x"], before["y"], before["heading"])  # still a no-op
    assert env.step("The next action is turn left 30 degree.", "Turner").reward == 0.0  # valid turns: free
    assert M.reward_bounds(1.0, 0.05, 64) == (-1 - 3.2, 2.0)
    check_domain(domain, OmegaConf.merge(task, {"invalid_penalty": 0.05, "reward_min": -4.2}))
    with pytest.raises(VLNConfigError, match=r"set reward_min: -4.2"):
        make_env(task, invalid_penalty=0.05)  # the default reward_min (-1) cannot hold 64 penalties
    with pytest.raises(VLNConfigError, match="invalid_penalty=-0.1.* must be >= 0"):
        make_env(task, invalid_penalty=-0.1)


# ---------------------------------------------------------------- metrics (hand-computed)


def test_success_radius():
    assert M.is_success(True, 3.0) and M.is_success(True, 0.0)
    assert not M.is_success(True, 3.01)
    assert not M.is_success(False, 0.5)  # no stop, no success
    assert M.is_success(True, 4.0, success_distance=5.0)


def test_spl():
    assert M.spl(True, 10.0, 12.5) == pytest.approx(0.8)
    assert M.spl(True, 10.0, 10.0) == pytest.approx(1.0)
    assert M.spl(True, 10.0, 8.0) == pytest.approx(1.0)  # max(p, l) in the denominator
    assert M.spl(False, 10.0, 10.0) == 0.0


def test_dtw_and_ndtw():
    path, ref = [(0, 0), (1, 0), (2, 0)], [(0, 0), (2, 0)]
    # cost: |p0r0|=0 |p0r1|=2 |p1r0|=1 |p1r1|=1 |p2r0|=2 |p2r1|=0 -> DTW = 0 + 1 + 0 = 1
    assert M.dtw(path, ref) == pytest.approx(1.0)
    assert M.ndtw(path, ref, 3.0) == pytest.approx(math.exp(-1.0 / (2 * 3.0)))
    assert M.ndtw(ref, ref) == pytest.approx(1.0)
    far = [(0, 3), (2, 3)]  # every point 3 m off: DTW = 6, |R| = 2 -> exp(-1)
    assert M.ndtw(far, ref, 3.0) == pytest.approx(math.exp(-1.0))
    assert M.ndtw([], ref) == 0.0


def test_path_helpers():
    assert M.path_length([(0, 0), (3, 4), (3, 5)]) == pytest.approx(6.0)
    pts = M.resample([(0, 0), (1, 0), (1, 0.5)], 0.25)
    assert len(pts) == 7 and pts[4] == pytest.approx((1.0, 0.0)) and pts[-1] == pytest.approx((1.0, 0.5))
    assert M.dedup([(0, 0), (0, 0), (1, 0), (1, 0)]) == [(0, 0), (1, 0)]


def test_shaped_reward():
    d0 = 10.0
    assert M.potential(10.0, d0) == 0.0 and M.potential(0.0, d0) == 1.0 and M.potential(50.0, d0) == -1.0
    assert M.step_reward(10.0, 7.5, d0, False, 1.0) == pytest.approx(0.25)
    assert M.step_reward(2.0, 2.0, d0, True, 1.0) == pytest.approx(1.0)
    assert M.step_reward(7.5, 10.0, d0, False, 1.0) == pytest.approx(-0.25)
    # episode total telescopes to phi(d_final) + bonus * success
    ds = [10.0, 8.0, 12.0, 4.0, 1.0]
    total = sum(M.step_reward(a, b, d0, i == len(ds) - 2, 1.0) for i, (a, b) in enumerate(zip(ds, ds[1:])))
    assert total == pytest.approx(M.potential(1.0, d0) + 1.0)


# ---------------------------------------------------------------- world


def _place(env, x, y, heading):
    env.x, env.y, env.heading = x, y, heading
    env.dist = env.field.distance(env.pos)


def test_walls_block(task):
    env = make_env(task)
    env.reset(0)
    lay = env.ep.layout
    y = lay.rooms[0].center[1]
    _place(env, 0.2, y, 180)  # facing the outer wall at x = 0
    res = env.step("The next action is move forward 75 cm.", "Mover")
    assert res.valid and res.info["collided"]
    assert env.pos == (0.2, y) and env.path_len == 0.0
    assert res.observation.endswith("bump") and env.metrics()["collisions"] == 1.0
    # an interior wall without a door blocks too; the door gap does not
    door = lay.doors[0]
    a, b = door.rooms
    nx, ny = door.normal_from(a)
    wall_pt = (door.mid[0] - 0.2 * nx + 0.9 * abs(ny), door.mid[1] - 0.2 * ny + 0.9 * abs(nx))
    assert lay.room_at(wall_pt) == a
    assert lay.blocked(wall_pt, (wall_pt[0] + 0.4 * nx, wall_pt[1] + 0.4 * ny))
    gap_pt = (door.mid[0] - 0.2 * nx, door.mid[1] - 0.2 * ny)
    assert not lay.blocked(gap_pt, (gap_pt[0] + 0.4 * nx, gap_pt[1] + 0.4 * ny))
    assert lay.room_at((gap_pt[0] + 0.4 * nx, gap_pt[1] + 0.4 * ny)) == b


def test_turns_and_moves(task):
    env = make_env(task)
    env.reset(0)
    room = env.ep.layout.rooms[env.ep.layout.room_at(env.pos)]
    cx, cy = room.center
    _place(env, cx - 0.5, cy, 90)
    env.step("The next action is turn right 90 degree.", "Turner")
    assert env.heading == 0 and env.steps == 6
    env.step("The next action is move forward 50 cm.", "Mover")
    assert env.pos == pytest.approx((cx, cy)) and env.path_len == pytest.approx(0.5)
    env.step("turn left 45 degree", "Turner")
    assert env.heading == 45


def test_stop_ends_episode_with_metrics(task):
    env = make_env(task)
    env.reset(1)
    _place(env, *env.ep.goal, 0)
    res = env.step("The next action is stop.", "Stopper")
    assert res.done and res.valid and res.info["success"] == 1.0
    m = env.metrics()
    assert m["success"] == 1.0 and m["distance_to_goal"] == pytest.approx(0.0)
    assert m["oracle_success"] == 1.0 and m["spl"] == 1.0  # teleported: path length 0 <= shortest


def test_decision_cap_ends_episode(task):
    env = make_env(task, max_decisions=3)
    env.reset(0)
    assert not env.step("turn left", "Turner").done
    assert not env.step("zzqx florp", "Turner").done
    res = env.step("turn left", "Turner")
    assert res.done and env.metrics()["success"] == 0.0


def test_snapshot_restore_exact(task):
    env = make_env(task)
    env.reset(5)
    for _ in range(6):
        e = env.expert_action()
        env.step(e.action, e.role)
    snap = env.snapshot()
    obs, met = env.observation(), env.metrics()

    def roll(e):
        out = []
        while not e.done:
            x = e.expert_action()
            r = e.step(x.action, x.role)
            out.append((r.observation, r.reward, r.done))
        return out, e.metrics()

    first = roll(env)
    env.restore(snap)
    assert env.observation() == obs and env.metrics() == met
    assert roll(env) == first
    fresh = make_env(task)  # restores into a fresh env too
    fresh.restore(snap)
    assert fresh.observation() == obs and roll(fresh) == first
    env.restore(snap)
    assert env.metrics() == met  # the snapshot was not mutated


def test_observation_short_and_in_vocabulary(domain, task):
    tok = build_tokenizer(domain.all_words(task), (0, 0.2, 0.4, 0.6, 0.8))
    env = make_env(task)
    rng = random.Random(0)
    lengths = []
    for seed in list(range(0, 400, 20)) + [1_000_000 + i for i in range(0, 88, 11)]:
        obs = env.reset(seed)
        for _ in range(20):
            assert not unknown_words(tok, obs), obs
            lengths.append(len(split_words(obs)))
            if env.done:
                break
            e = env.expert_action() if rng.random() < 0.7 else None
            text, role = (e.action, e.role) if e else (A.expert_text(A.TURN_LEFT, 45), "Turner")
            obs = env.step(text, role).observation
    assert max(lengths) <= 60 and sum(lengths) / len(lengths) <= 42


def test_bearings_give_each_seen_item_its_direction(domain, task):
    from swarm_domains.vln_ce.observation import direction

    assert [direction(a) for a in (0, 7, 8, 29, -31, 95, -120)] == [
        "0",
        "0",
        "15 left",
        "30 left",
        "30 right",
        "90 left",
        "120 right",
    ]
    cfg = OmegaConf.merge(task, {"bearings": True})
    tok = build_tokenizer(domain.all_words(cfg), (0, 0.2, 0.4, 0.6, 0.8))
    plain, env = make_env(task), make_env(cfg)
    for seed in (0, 5, 1_000_003):
        obs, obs_b = plain.reset(seed), env.reset(seed)
        assert not unknown_words(tok, obs_b)
        # the same view, each landmark or door "<name> <d> m" followed by its direction (walls have none)
        assert obs_b != obs and re.sub(r" m (\d+ (left|right)|0)(?= [,.]|$)", " m", obs_b) == obs
    check_domain(domain, cfg)


def test_instruction_names_route_and_goal(task):
    for seed in range(0, 200, 7):
        ep = make_episode(seed, 1_000_000, 8, 18)
        lay = ep.layout
        words = split_words(ep.instruction)
        assert len(words) <= 18
        assert ep.instruction.endswith(f"stop at the {ep.goal_name}")
        assert lay.rooms[lay.room_at(ep.goal)].type in words
        assert 1 <= len(ep.route) <= 3 and 5.0 <= ep.shortest <= 20.0


def test_render_log_is_compact(domain):
    log = [
        Event(0, "Turner", "The next action is turn left 30 degree."),
        Event(1, "Mover", "The next action is turn left 30 degree.", valid=False),
        Event(2, None, ""),
        Event(3, "Stopper", "zzqx florp", valid=False),
        Event(4, "Mover", "The next action is move forward 75 cm."),
    ]
    assert domain.render_log(log) == (
        "Mover turn left 30 degree invalid ; skip ; Stopper invalid ; Mover move forward 75 cm"
    )


# ---------------------------------------------------------------- splits


def test_splits_disjoint_and_unseen_layouts(domain, task):
    train, evals = domain.episode_seeds(task, "train"), domain.episode_seeds(task, "eval")
    assert len(train) >= 5000 and len(evals) == 88 and not set(train) & set(evals)
    start, epl = int(task.unseen_seed_start), int(task.episodes_per_layout)
    train_layouts = {layout_key(s, start, epl) for s in train}
    eval_layouts = {layout_key(s, start, epl) for s in evals}
    assert len(eval_layouts) == 11 and not train_layouts & eval_layouts
    assert all(make_episode(s, start, epl).split == "val_unseen" for s in evals[::8])
    assert make_episode(train[0], start, epl).split == "train"
    # unseen layouts are new floor plans, not renamed training ones
    train_plans = {
        (get_layout(k).xs, get_layout(k).ys, tuple(r.type for r in get_layout(k).rooms))
        for k in sorted(train_layouts)[:300]
    }
    for k in eval_layouts:
        lay = get_layout(k)
        assert (lay.xs, lay.ys, tuple(r.type for r in lay.rooms)) not in train_plans


def test_split_config_errors(task):
    with pytest.raises(VLNConfigError, match="unseen_seed_start"):
        make_env(task, train_seeds={"start": 0, "count": 2_000_000})
    with pytest.raises(VLNConfigError, match="eval_seeds.start=5"):
        make_env(task, eval_seeds={"start": 5, "count": 88})
    with pytest.raises(VLNConfigError, match="valid: embedded, habitat"):
        make_env(task, sim="gazebo")
    with pytest.raises(VLNConfigError, match="reward bounds"):
        make_env(task, reward_max=1.0)
    with pytest.raises(VLNConfigError, match="max_decisions"):
        make_env(task, max_decisions="many")
    with pytest.raises(VLNConfigError, match="valid: state, replay"):
        HabitatConfig.from_task(OmegaConf.create({"habitat": {"restore": "teleport"}}))


def test_episodes_are_deterministic():
    a = make_episode.__wrapped__(1234, 1_000_000, 8, 18)
    b = make_episode.__wrapped__(1234, 1_000_000, 8, 18)
    assert a == b


# ---------------------------------------------------------------- expert


def test_expert_succeeds_and_each_role_owns_its_actions(task):
    env = make_env(task)
    seeds = list(range(0, 600, 15)) + [1_000_000 + i for i in range(0, 88, 4)]
    wins, roles_seen = 0, set()
    for seed in seeds:
        env.reset(seed)
        while not env.done:
            e = env.expert_action()
            act = A.parse_action(e.action)
            assert act is not None and A.role_allows(e.role, act.kind), e
            assert e.action == act.navila_text()
            roles_seen.add(e.role)
            assert env.step(e.action, e.role).valid
        wins += env.metrics()["success"]
    assert wins / len(seeds) >= 0.9
    assert roles_seen == {"Turner", "Mover", "Stopper"}


def test_expert_reward_and_spl(task):
    env = make_env(task)
    env.reset(7)
    total = 0.0
    while not env.done:
        e = env.expert_action()
        total += env.step(e.action, e.role).reward
    m = env.metrics()
    assert total == pytest.approx(M.potential(m["distance_to_goal"], env.ep.shortest) + 1.0)
    assert m["spl"] > 0.8 and m["ndtw"] > 0.7 and m["path_length"] >= env.ep.shortest - 0.5


# ---------------------------------------------------------------- habitat adapter

HAS_HABITAT = importlib.util.find_spec("habitat") is not None


@pytest.mark.skipif(HAS_HABITAT, reason="habitat-lab is installed")
def test_habitat_refuses_cleanly_without_habitat_lab(task):
    with pytest.raises(HabitatUnavailable) as err:
        make_env(task, sim="habitat")
    msg = str(err.value)
    assert "habitat-lab" in msg and "pip install 'swarm-runtime[habitat]'" in msg


def test_habitat_data_check_names_missing_paths(tmp_path):
    cfg = HabitatConfig(data_path=str(tmp_path / "{split}" / "{split}.json.gz"), scenes_dir=str(tmp_path / "scenes"))
    with pytest.raises(HabitatUnavailable) as err:
        check_data(cfg, ("train", "val_unseen"))
    msg = str(err.value)
    assert "val_unseen.json.gz" in msg and "scenes" in msg and "R2R_VLNCE_v1-3_preprocessed" in msg


def test_habitat_metric_mapping():
    own = {"success": 0.0, "spl": 0.0, "ndtw": 0.4, "distance_to_goal": 5.0, "decisions": 3.0}
    raw = {
        "distance_to_goal": 2.5,
        "success": True,
        "spl": 0.75,
        "top_down_map": {"map": object()},
        "ndtw": float("nan"),
    }
    out = map_metrics(raw, own)
    assert out == {"success": 1.0, "spl": 0.75, "ndtw": 0.4, "distance_to_goal": 2.5, "decisions": 3.0}


def test_habitat_expert_and_episode_index():
    assert expert_step("turn_left").role == "Turner"
    assert expert_step("turn_right").action == "The next action is turn right 15 degree."
    assert expert_step("move_forward").action == "The next action is move forward 25 cm."
    assert expert_step(None).role == "Stopper" and expert_step("stop").action == "The next action is stop."
    with pytest.raises(ValueError, match="valid"):
        expert_step("jump")
    assert episode_index(5, 100, 3) == ("train", 2)
    assert episode_index(104, 100, 3) == ("eval", 1)
    assert episode_index(110, 100, 3, dev_seeds=(108, 8)) == ("dev", 2)  # dev seeds first, above unseen_seed_start
    assert episode_index(107, 100, 3, dev_seeds=(108, 8)) == ("eval", 1)


def test_habitat_dev_seeds_play_the_val_seen_split(domain, task, tmp_path):
    """The task's dev seeds (1000088-1000175) play R2R-CE's val_seen from its first episode, never an
    episode of val_unseen (eval) or train; a missing val_seen file is named when dev is first used."""
    cfg = HabitatConfig.from_task(task)
    assert (cfg.dev_split, cfg.eval_split, cfg.train_split) == ("val_seen", "val_unseen", "train")
    dev, ev = domain.episode_seeds(task, "dev"), domain.episode_seeds(task, "eval")
    assert cfg.dev_seeds == (dev[0], len(dev))
    assert {episode_index(s, 1_000_000, 1000, cfg.dev_seeds)[0] for s in dev} == {"dev"}
    assert [episode_index(s, 1_000_000, 1000, cfg.dev_seeds)[1] for s in dev] == list(range(88))
    assert {episode_index(s, 1_000_000, 1000, cfg.dev_seeds) for s in ev} == {("eval", i) for i in range(88)}
    envs = {}

    def factory(split):
        envs[split] = FakeHabitatEnv(split)
        return envs[split]

    env = HabitatVLNEnv(
        HabitatConfig(dev_seeds=(108, 8)),
        EmbeddedConfig(unseen_seed_start=100),
        env_factory=factory,
        follower_factory=lambda e: lambda goal: "move_forward",
    )
    env.reset(109)
    assert env.env.current_episode.episode_id == "val_seen-1" and set(envs) == {"val_seen"}
    env.step("move forward 50 cm", "Mover")
    snap = env.snapshot()
    env.reset(101)
    assert env.env.current_episode.episode_id == "val_unseen-1"
    env.restore(snap)  # back to the dev episode
    assert env.env.current_episode.episode_id == "val_seen-1" and env.bk.seed == 109
    missing = HabitatVLNEnv(
        HabitatConfig(data_path=str(tmp_path / "{split}.json.gz"), scenes_dir=str(tmp_path), dev_seeds=(108, 8)),
        EmbeddedConfig(unseen_seed_start=100),
        env_factory=factory,
    )
    missing._check_splits = True  # as with real habitat (no fake factory)
    with pytest.raises(HabitatUnavailable, match=r"val_seen\.json\.gz"):
        missing.reset(108)


class FakeMeasure:
    def __init__(self, sim):
        self._sim, self._metric, self.history = sim, None, []


class FakeSim:
    """Agent on a plane (x, 0, z) with a wall at x = 3."""

    def __init__(self):
        self.pos, self.yaw, self.previous_step_collided = np.zeros(3), 0.0, False

    def get_agent_state(self):
        return SimpleNamespace(position=self.pos.copy(), rotation=self.yaw)

    def set_agent_state(self, position, rotation):
        self.pos, self.yaw = np.array(position, dtype=float), float(rotation)


class FakeHabitatEnv:
    """Mimics the parts of ``habitat.Env`` the adapter uses."""

    def __init__(self, split):
        goal = SimpleNamespace(position=[2.0, 0.0, 2.0])
        self.episodes = [
            SimpleNamespace(
                episode_id=f"{split}-{i}",
                start_position=[0.0, 0.0, float(i)],
                goals=[goal],
                reference_path=[[0, 0, 0], [2, 0, 0], [2, 0, 2]],
                instruction=SimpleNamespace(instruction_text=f"walk to the sofa {i}"),
            )
            for i in range(3)
        ]
        self.sim = FakeSim()
        self.task = SimpleNamespace(
            measurements=SimpleNamespace(measures={"distance_to_goal": FakeMeasure(self.sim)}), is_stop_called=False
        )
        self.episode_iterator = iter(self.episodes)
        self.current_episode, self._episode_over, self._elapsed_steps, self.calls = None, False, 0, []

    @property
    def episode_over(self):
        return self._episode_over

    def reset(self):
        self.current_episode = next(self.episode_iterator)
        self.sim.set_agent_state(self.current_episode.start_position, 0.0)
        self.task.is_stop_called, self._episode_over, self._elapsed_steps = False, False, 0
        self.task.measurements.measures["distance_to_goal"].history = []
        self.calls.append("reset")
        return self._update()

    def step(self, name):
        assert not self._episode_over, "step after episode over"
        self.calls.append(name)
        self._elapsed_steps += 1
        self.sim.previous_step_collided = False
        if name == "move_forward":
            new = self.sim.pos + 0.25 * np.array([math.cos(self.sim.yaw), 0.0, math.sin(self.sim.yaw)])
            if new[0] > 3.0:
                self.sim.previous_step_collided = True
            else:
                self.sim.pos = new
        elif name in ("turn_left", "turn_right"):
            self.sim.yaw += math.radians(15 if name == "turn_left" else -15)
        elif name == "stop":
            self.task.is_stop_called, self._episode_over = True, True
        return self._update()

    def _dist(self):
        return float(np.linalg.norm(self.sim.pos - np.array(self.current_episode.goals[0].position)))

    def _update(self):
        m = self.task.measurements.measures["distance_to_goal"]
        m._metric = self._dist()
        m.history.append(m._metric)
        return {"rgb": np.full((2, 2, 3), self._elapsed_steps, dtype=np.uint8)}

    def get_metrics(self):
        d = self._dist()
        return {
            "distance_to_goal": d,
            "success": float(self.task.is_stop_called and d <= 3.0),
            "top_down_map": {"map": None},
        }


def make_fake(restore="state", **emb):
    envs = {}

    def factory(split):
        envs[split] = FakeHabitatEnv(split)
        return envs[split]

    env = HabitatVLNEnv(
        HabitatConfig(restore=restore),
        EmbeddedConfig(unseen_seed_start=100, **emb),
        env_factory=factory,
        follower_factory=lambda e: lambda goal: "move_forward",
    )
    return env, envs


def test_habitat_adapter_steps_and_rewards():
    env, envs = make_fake()
    obs = env.reset(1)
    assert obs == "walk to the sofa 1" and envs["train"].current_episode.episode_id == "train-1"
    d0 = env.bk.d0
    res = env.step("The next action is move forward 75 cm.", "Mover")
    assert envs["train"].calls[-3:] == ["move_forward"] * 3 and res.valid
    assert env.bk.path_len == pytest.approx(0.75) and res.info["primitive_steps"] == 3
    assert res.reward == pytest.approx(M.potential(env.bk.dist, d0))
    bad = env.step("The next action is stop.", "Mover")
    assert not bad.valid and bad.reward == 0.0 and envs["train"].calls[-1] == "move_forward"
    assert env.observation_images()[0].shape == (2, 2, 3)
    assert env.expert_action().role == "Mover"
    env.step("The next action is turn left 90 degree.", "Turner")
    env.step("The next action is move forward 100 cm.", "Mover")
    res = env.step("The next action is stop.", "Stopper")
    assert res.done and res.info["success"] == 1.0 and res.info["distance_to_goal"] < 3.0
    assert 0.0 < res.info["ndtw"] <= 1.0 and res.info["steps_taken"] == 14.0
    assert env.expert_action() is None
    env.reset(105)  # eval seeds index the val_unseen split
    assert envs["val_unseen"].current_episode.episode_id == "val_unseen-2"


def test_habitat_adapter_bump():
    env, envs = make_fake()
    env.reset(0)
    for _ in range(4):
        res = env.step("The next action is move forward 100 cm.", "Mover")
    assert res.info["collided"] and res.observation.endswith("bump") and env.bk.collisions == 1
    assert env.bk.path_len == pytest.approx(3.0)


@pytest.mark.parametrize("mode", ["state", "replay"])
def test_habitat_adapter_restore(mode):
    env, envs = make_fake(restore=mode)
    env.reset(2)
    env.step("turn left 45 degree", "Turner")
    env.step("move forward 50 cm", "Mover")
    snap = env.snapshot()
    pos, hist, met = (
        env._position(),
        list(envs["train"].task.measurements.measures["distance_to_goal"].history),
        env.metrics(),
    )

    def roll():
        out = [
            env.step(t, r)
            for t, r in (
                ("move forward 100 cm", "Mover"),
                ("turn right 30 degree", "Turner"),
                ("move forward 75 cm", "Mover"),
                ("stop", "Stopper"),
            )
        ]
        return [(r.observation, round(r.reward, 9), r.done) for r in out], env.metrics()

    first = roll()
    env.reset(0)  # move to another episode before restoring
    env.restore(snap)
    fake = envs["train"]
    assert fake.current_episode.episode_id == "train-2"
    assert env._position() == pytest.approx(pos) and env.metrics() == met
    if mode == "state":
        assert fake.task.measurements.measures["distance_to_goal"].history == hist
        assert not fake.episode_over and fake._elapsed_steps == 5
    else:
        assert fake.calls[-6:] == ["reset", "turn_left", "turn_left", "turn_left", "move_forward", "move_forward"]
    assert roll() == first
    env.restore(snap)
    assert env.metrics() == met  # snapshot reusable


def test_habitat_adapter_close_closes_every_split_env_once():
    env, envs = make_fake()
    closed = []
    env.reset(1)
    env.reset(105)  # a second split's habitat env
    env.expert_action()  # the follower, bound to a habitat env
    for name, fake in envs.items():
        fake.close = lambda name=name: closed.append(name)
    env.close()
    env.close()
    assert sorted(closed) == ["train", "val_unseen"] and env._follower is None
