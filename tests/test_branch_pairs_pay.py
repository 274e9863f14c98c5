"""Counterfactual bid pairs and credit on episodes that pay, through the trainer's own update
(``MPTTrainer.rl_step``: the rollout, ``pick_contested``, ``run_branches``, ``bid_update`` or ``action_update``).

The domain ``paying`` is written here through the public hooks. Its world pays whoever acts, and what it pays
is known: the k-th action of an episode by role ``r`` pays ``VALUE[r] * 4**k`` (``VALUE``: 1, 2, 3). Any run of
actions has a unique total (its base-4 digits), so a branch, whose contested turn's actor differs from the
original's, never ties with it, and a side swapped or a score taken from the wrong rollout changes a number.
The tests watch the real code path through pass-through spies and check, for every ``BranchPair``: which side is
the original and which the branch, both scores against the pay of who acted, the winner and loser the
Bradley-Terry loss was fed and its value; and, on an action update, the credit and the advantage of every acted
turn against the bucket brigade worked out here. Each test costs ~2-4 s (one tiny swarm, one update).
"""

from __future__ import annotations

import pytest
import torch.nn.functional as F
from omegaconf import OmegaConf

import swarm_runtime
from swarm_runtime import Domain, DomainEnv, Role, StepResult
from swarm_runtime.config.load import resolve
from swarm_runtime.plugins.manager import build_registry, make_plugin_manager

VALUE = {"Low": 1, "Mid": 2, "Top": 3}  #: what an action of each role pays, times 4**k
DECISIONS = 4  #: decisions per episode
REWARD_MAX = sum(3 * 4**k for k in range(DECISIONS))


def pay(role: str, k: int) -> float:
    """What the k-th action of an episode (from 0) pays when role ``role`` takes it."""
    return float(VALUE[role] * 4**k)


class PayingEnv(DomainEnv):
    """Counts the actions taken; every action, whatever its text, pays :func:`pay` of its role."""

    def reset(self, seed: int) -> str:
        self.acted = 0
        return self.observation()

    def observation(self) -> str:
        return f"turn {self.acted}"

    def step(self, action: str, role: str | None = None) -> StepResult:
        reward = pay(role, self.acted)
        self.acted += 1
        return StepResult(self.observation(), reward=reward, done=self.acted >= DECISIONS)


class PayingDomain(Domain):
    name = "paying"
    description = "Three roles; every action pays its role's value, times 4 per action taken before it."
    roles = tuple(Role(r, f"pays {v}") for r, v in VALUE.items())

    def task_names(self) -> list[str]:
        return ["pay"]

    def task_config(self, task: str):
        if task not in self.task_names():
            raise KeyError(task)
        return OmegaConf.create(
            {
                "max_decisions": DECISIONS,
                "reward_max": REWARD_MAX,
                "reward_min": 0,
                "train_seeds": {"start": 0, "count": 100},
                "eval_seeds": {"start": 1000, "count": 2},
            }
        )

    def make_env(self, task) -> DomainEnv:
        return PayingEnv()

    def vocabulary(self, task) -> list[str]:
        return ["turn", "pay"]


class PayingPlugin:
    @swarm_runtime.hookimpl
    def swarm_register_domains(self, register):
        register(PayingDomain())


@pytest.fixture
def trainer(tmp_path):
    """``make(*overrides)``: an MPT trainer of the ``paying`` domain set up on tiny untrained models (no SFT)."""
    from swarm_runtime.learn.mpt import MPTTrainer
    from swarm_runtime.runs.context import RunContext

    pm = make_plugin_manager(extra_plugins=[(PayingPlugin(), "paying_plugin")])
    made = []

    def make(*overrides: str) -> MPTTrainer:
        args = ["domain=paying", "task=pay", "algo.envs_per_step=4", "algo.action_steps=1", "algo.bid_steps=1"]
        cfg = resolve(args + ["algo.resample_tries=10", "progress=false", "tensorboard=false", *overrides], reg)
        tr = MPTTrainer(RunContext(cfg, pm, reg, tmp_path / f"run{len(made)}"))
        tr._setup()
        made.append(tr)
        return tr

    try:
        reg = build_registry(pm)
        yield make
    finally:
        for tr in made:
            if tr.sampler is not None:
                tr.sampler.close()
        pm.unregister(name="paying_plugin")


def spy(monkeypatch, module, name: str, seen: list):
    """Replace ``module.name`` by a pass-through that appends ``(args, kwargs, result)`` to ``seen``."""
    real = getattr(module, name)

    def wrapper(*args, **kw):
        out = real(*args, **kw)
        seen.append((args, kw, out))
        return out

    monkeypatch.setattr(module, name, wrapper)


def paid(turns, before: int, agents) -> float:
    """What the world pays for ``turns`` when ``before`` actions were taken before them (skipped turns pay 0)."""
    total, k = 0.0, before
    for u in turns:
        if u.winner is not None:
            total += pay(agents[u.winner].role, k)
            k += 1
    return total


def bid_level(agents, agent: int, tokens: list[int]) -> float:
    pol = agents[agent].policy
    return pol.bid_levels[pol.bid_ids.index(tokens[0])]


def bid_step(monkeypatch, tr) -> dict:
    """One bid update of ``tr`` (``rl_step(1)``), watched: its rollout's episodes, the branched picks, each one's
    rollouts (``runs[k]``: side 1, the branches; side 0, the re-rolls), the pairs, and the rows (with their
    log-probs) each policy's Bradley-Terry loss was fed."""
    import swarm_runtime.learn.bid as bid_mod
    import swarm_runtime.learn.mpt as mpt_mod

    seen = {k: [] for k in ("contested", "slots", "play", "pairs", "rows")}
    spy(monkeypatch, mpt_mod, "pick_contested", seen["contested"])
    spy(monkeypatch, mpt_mod, "run_branches", seen["pairs"])
    spy(monkeypatch, bid_mod, "branch_slots", seen["slots"])
    spy(monkeypatch, bid_mod, "play", seen["play"])
    spy(monkeypatch, bid_mod, "_pair_logprobs", seen["rows"])
    m = tr.rl_step(1)
    assert m["kind"] == "bid" and len(seen["pairs"]) == 1 and len(seen["play"]) == 1
    (branched, _, owner) = seen["slots"][0][2]
    runs = [{0: [], 1: []} for _ in branched]
    for (k, side), episode in zip(owner, seen["play"][0][2], strict=True):
        runs[k][side].append(episode)
    samples = int(tr.cfg.algo.branch_samples)
    assert all((len(r[1]), len(r[0])) == (samples, samples - 1) for r in runs)
    return {
        "m": m,
        "episodes": seen["contested"][0][0][0],
        "branched": branched,
        "runs": runs,
        "pairs": seen["pairs"][0][2],
        "rows": [(args[0], args[1], out) for args, _, out in seen["rows"]],
    }


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def check_pairs(tr, got: dict, horizon: int | None) -> None:
    """Every pair against the pay of who acted, on the original's side (with its re-rolls) and the branches' (see
    the module)."""
    agents, pairs, branched = tr.agents, got["pairs"], got["branched"]
    assert len(branched) >= 2, f"too few branched picks to check: {len(branched)}"
    selected = [j for j, p in enumerate(pairs) if not p.runner_up]
    assert len(selected) == len(branched), [(p.agent, p.runner_up) for p in pairs]
    for j, pick, runs in zip(selected, branched, got["runs"]):
        turn = pick.turn
        ep = next(e for e in got["episodes"] if any(u is turn for u in e.turns))
        sel, ru = turn.winner, turn.auction.runner_up
        before = sum(u.winner is not None for u in ep.turns[: turn.t])
        end = None if horizon is None else turn.t + horizon
        window = paid(ep.turns[turn.t : end], before, agents)
        original = mean([window] + [paid(r.turns, before, agents) for r in runs[0]])
        branch = mean([paid(b.turns, before, agents) for b in runs[1]])
        ups = [j + 1] if j + 1 < len(pairs) and pairs[j + 1].runner_up else []
        for i in [j, *ups]:
            p = pairs[i]
            where = (
                f"pair {i} ({'runner-up' if p.runner_up else 'selected'} agent {p.agent} "
                f"{agents[p.agent].role}, seed {ep.seed}, turn {turn.t})"
            )
            assert p.original_score == original, (
                f"{where}: original_score {p.original_score}, but the original episode paid {original} from turn "
                f"{turn.t} on (branch_score {p.branch_score}; the branch paid {branch})"
            )
            assert p.branch_score == branch, (
                f"{where}: branch_score {p.branch_score}, but the branch paid {branch} (original_score "
                f"{p.original_score}; the original episode paid {original})"
            )
            who = ru if p.runner_up else sel
            assert (p.agent, p.prompt, p.original) == (who, turn.bid_prompts[who], turn.bid_tokens[who]), where
            assert p.original_logprobs == turn.bid_logprobs[who] and len(p.original_logprobs) == 1, where
            level = bid_level(agents, who, p.counterfactual)
            if p.runner_up:  # its re-sampled bid would have won the turn: the branch's side
                assert level > turn.auction.winning_bid, f"{where}: re-sampled bid {level}"
            else:  # its re-sampled bid hands the turn to the runner-up: the branch's side
                assert p.counterfactual == pick.lower and level < turn.auction.runner_up_bid, where
        # each rollout restored at the turn: in a branch the runner-up acts there, in a re-roll the selected agent
        # again; each ends at the horizon or the episode's end
        for side, who in ((1, ru), (0, sel)):
            for r in runs[side]:
                assert r.seed == ep.seed and r.turns[0].t == turn.t and r.turns[0].winner == who, (side, turn.t)
                assert len(r.turns) == (DECISIONS - turn.t if horizon is None else min(horizon, DECISIONS - turn.t))
        assert window != paid(runs[1][0].turns, before, agents)  # distinct pay: the contested action's digit differs


def check_bradley_terry(tr, got: dict) -> None:
    """The rows fed to each policy's loss: its decisive pairs, the higher-scoring side's bid the winner; the loss's
    value."""
    agents, pairs = tr.agents, got["pairs"]
    for role, policy in tr.policies.items():
        mine = [p for p in pairs if agents[p.agent].policy is policy and p.original_score != p.branch_score]
        rows = [r for pol, chunk, _ in got["rows"] if pol is policy for r in chunk]
        want = [
            (
                p.prompt,
                *(
                    (p.original, p.counterfactual)
                    if p.original_score > p.branch_score
                    else (p.counterfactual, p.original)
                ),
            )
            for p in mine
        ]
        assert [(r.prompt, r.winner, r.loser) for r in rows] == want, f"{role}: the Bradley-Terry rows"
        if not mine:
            assert f"losses/bid_{role}" not in got["m"]
            continue
        (lw, ll) = next(out for pol, _, out in got["rows"] if pol is policy)
        loss = float(-F.logsigmoid(lw.detach() - ll.detach()).mean())
        assert got["m"][f"losses/bid_{role}"] == pytest.approx(loss, rel=1e-5), role
    assert got["m"]["charts/bid_pairs"] == sum(p.original_score != p.branch_score for p in pairs)  # ties dropped
    higher = sum(p.original_score > p.branch_score for p in pairs if not p.runner_up)
    assert got["m"]["charts/bid_pairs_higher_won"] == higher


@pytest.mark.parametrize(
    "overrides",
    [(), ("algo.bid_pairs=both",), ("algo.branch_horizon=2",), ("algo.branch_samples=2",)],
    ids=["selected", "runner-up", "horizon", "samples"],
)
def test_bid_pairs_score_the_original_and_the_branch_by_what_each_paid(trainer, monkeypatch, overrides):
    tr = trainer(*overrides)
    got = bid_step(monkeypatch, tr)
    horizon = 2 if "algo.branch_horizon=2" in overrides else None
    check_pairs(tr, got, horizon)
    check_bradley_terry(tr, got)
    ups = sum(p.runner_up for p in got["pairs"])
    if overrides == ("algo.bid_pairs=both",):
        assert ups >= 1 and got["m"]["charts/bid_pairs_runner_up"] == ups
    else:
        assert ups == 0
    if horizon is not None:  # some branch was cut by the horizon before the episode's end
        assert any(pick.turn.t + horizon < DECISIONS for pick in got["branched"])
    if overrides == ("algo.branch_samples=2",):  # some pair's scores are means of two different rollouts a side
        assert any(len({paid(r.turns, 0, tr.agents) for r in rs[1]}) > 1 for rs in got["runs"])


def bucket_brigade_by_hand(rewards: list[float], bids: list[float]) -> list[float]:
    """``c_k = (1 - b_k) v_k``, ``v_k = r_k + b_{k+1} v_{k+1}``, ``v_{K+1} = 0`` (docs/reference/method.md, section 2)."""
    credit, v, b_next = [], 0.0, 0.0
    for r, b in zip(reversed(rewards), reversed(bids)):
        v = r + b_next * v
        credit.insert(0, (1 - b) * v)
        b_next = b
    return credit


def test_credit_and_advantages_of_an_action_update_follow_what_each_action_paid(trainer, monkeypatch):
    """An action update (``rl_step(0)``): each acted turn's credit is the bucket brigade over what the actions paid
    and their winning bids; each REINFORCE row's advantage is its credit minus its agent's mean, over reward_max."""
    import swarm_runtime.learn.action as action_mod
    import swarm_runtime.learn.mpt as mpt_mod

    tr = trainer()
    credit, chunks = [], []
    spy(monkeypatch, mpt_mod, "credit_samples_and_turns", credit)
    spy(monkeypatch, action_mod, "reinforce_chunk", chunks)
    m = tr.rl_step(0)
    assert m["kind"] == "action"
    episodes, (samples, _) = credit[0][0][0], credit[0][2]
    want = []
    for ep in episodes:
        acted = ep.acted
        rewards = [pay(tr.agents[u.winner].role, k) for k, u in enumerate(acted)]
        assert [u.reward for u in acted] == rewards, f"seed {ep.seed}: the world's pay"
        got_credit = bucket_brigade_by_hand(rewards, [u.auction.winning_bid for u in acted])
        want += [(u.winner, u.action_prompt, u.action_tokens, c) for u, c in zip(acted, got_credit)]
    assert len(samples) == len(want) >= 8
    for i, (s, w) in enumerate(zip(samples, want)):
        assert s[:3] == w[:3] and s[3] == pytest.approx(w[3], rel=1e-12), f"sample {i}: {s[0]}, {s[3]} != {w[3]}"
    mean = {a: [w[3] for w in want if w[0] == a] for a in {w[0] for w in want}}
    mean = {a: sum(v) / len(v) for a, v in mean.items()}
    for role, policy in tr.policies.items():
        rows = [r for (pol, chunk), _, _ in chunks if pol is policy for r in chunk]
        expect = [(w[1], w[2], (w[3] - mean[w[0]]) / REWARD_MAX) for w in want if tr.agents[w[0]].policy is policy]
        assert [(r[0], r[1]) for r in rows] == [e[:2] for e in expect], role
        assert [r[2] for r in rows] == pytest.approx([e[2] for e in expect], rel=1e-9, abs=1e-12), role
