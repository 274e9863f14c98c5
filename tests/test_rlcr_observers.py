"""RLCR and the observer hooks: ``swarm_on_turn`` sees every action of a training rollout (one entry
per decision of each round of the concurrent loop), as it sees every turn of an MPT rollout."""

from __future__ import annotations

from swarm_runtime import hookimpl
from swarm_runtime.config.load import resolve
from swarm_runtime.learn.rlcr.loop import LoopOptions, play_concurrent, turn_report
from swarm_runtime.runs.context import RunContext
from tests.test_rlcr import TICK_TASK, TickDomain, scripted


class TurnObserver:
    def __init__(self):
        self.calls: list[tuple[int, list, list]] = []
        self.episodes = 0

    @hookimpl
    def swarm_on_turn(self, turn, bids, winners):
        self.calls.append((turn, bids, winners))

    @hookimpl
    def swarm_on_episode_end(self, domain, seed, reward, metrics):
        self.episodes += 1


def test_turn_report_has_one_entry_per_decision_and_follows_hires():
    rounds = []
    decide = scripted({"ceo": ["hire work hard", "work"]}, {"ceo": 2, "alpha": 1})
    (r,) = play_concurrent(
        TickDomain(),
        TICK_TASK,
        [0],
        decide,
        LoopOptions(t_max=60, seconds_per_token=1.0, org="ceo"),
        on_round=lambda n, reqs: rounds.append((n, [q.agent for q in reqs], turn_report(reqs))),
    )
    assert [n for n, _, _ in rounds] == list(range(len(rounds)))
    assert rounds[0] == (0, ["ceo"], ([[0.0]], [0]))  # the CEO alone at t = 0
    # the hire lands at t = 2 (2 tokens): the CEO and its new hire decide together, each one entry
    n, agents, (bids, winners) = rounds[1]
    assert agents == ["ceo", "alpha"] and bids == [[0.0, 0.0], [0.0, 0.0]] and winners == [0, 1]
    assert sum(len(w) for _, _, (_, w) in rounds) == len(r.turns)
    busy = [(b, w) for _, _, (bs, ws) in rounds for b, w in zip(bs, ws) if None in b]
    # then alpha (11 s per action) decides at 13 while the CEO (12 s) is busy until 14: the CEO reads None
    assert rounds[2][1:] == (["alpha"], ([[None, 0.0]], [1])) and busy


def test_observers_see_every_action_of_an_rlcr_training_rollout(tmp_path, registry):
    pm, reg = registry
    obs = TurnObserver()
    pm.register(obs, name="turn-observer")
    try:
        _one_update(pm, reg, tmp_path, obs)
    finally:
        pm.unregister(obs)


def _one_update(pm, reg, tmp_path, obs):
    from swarm_runtime.learn.rlcr.trainer import RLCRTrainer

    cfg = resolve(
        [
            "domain=minecraft",
            "task=wooden_pickaxe",
            "algo=rlcr",
            "rlcr.instances=1",
            "rlcr.group_size=2",
            "rlcr.t_max.start=90",
            "rlcr.t_max.end=90",
            "tensorboard=false",
            "progress=false",
            f"run_dir={tmp_path}",
        ],
        reg,
    )
    trainer = RLCRTrainer(RunContext(cfg, pm, reg, tmp_path))
    trainer._setup()
    played = []
    play = trainer.play
    trainer.play = lambda *a, **kw: played.extend(play(*a, **kw)) or played
    m = trainer.rl_step(0)
    trainer.writer.close()
    assert [t for t, _, _ in obs.calls] == list(range(len(obs.calls))) and obs.episodes == 2
    assert sum(len(w) for _, _, w in obs.calls) == sum(len(r.turns) for r in played) == m["charts/turns"] * 2 > 0
    assert all(len(b) == len(w) and all(bb[i] == 0.0 for bb, i in zip(b, w)) for _, b, w in obs.calls)
    assert all(len(bb) == 3 for _, b, _ in obs.calls for bb in b)  # the default flat team of 3
