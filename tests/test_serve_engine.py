"""The gateway takes its turns on the turn engine (docs/engine.md): the served strategy
(``serve.turns.ServedTurns``) run by ``TurnEngine.arun`` with the gateway's HTTP answerer
(``serve.engine.TurnAnswerer``), here over an in-process transport that answers as workers do, so
missed bids, a failed winner and the records are checked exactly and fast. (Real workers over real
HTTP: tests/test_serve.py, whose served episodes equal the in-process ones.)"""

import asyncio

import httpcore
import pytest
from conftest import run_context

from swarm_runtime.core import noise as keyed
from swarm_runtime.core.engine import Batch, TurnEngine
from swarm_runtime.core.loop import make_env
from swarm_runtime.core.protocols import Bid, Response
from swarm_runtime.models.tokenizer import bid_token
from swarm_runtime.serve.episodes import Engine, EngineOptions, ServedEpisode
from swarm_runtime.serve.metrics import Metrics
from swarm_runtime.serve.population import AgentHandle, Population, PopulationOptions
from swarm_runtime.serve.protocol import seed_for
from swarm_runtime.serve.turns import ServedTurns


class Workers:
    """``AgentClients.post_json`` in process: each agent (by URL) bids a fixed level, or never answers
    in time (``slow``); acts with the first allowed action, or its worker fails (``broken``)."""

    def __init__(self, levels: dict, slow=(), broken=(), action="chop tree"):
        self.levels, self.slow, self.broken, self.action = levels, set(slow), set(broken), action
        self.bodies: list[tuple[str, dict]] = []

    async def post_json(self, url, path, body, timeout):
        name = url.rsplit("/", 1)[-1]
        self.bodies.append((name, body))
        assert path == "/v1/completions" and body["model"] == f"m-{name}"
        if body.get("swarm_kind") == "bid" or body["max_tokens"] == 1:  # a bid (bid_mode text, or logits)
            if name in self.slow:
                await asyncio.sleep(30)  # cancelled at the bid deadline
            return {"choices": [{"text": bid_token(self.levels[name])}]}, {"x-swarm-compute-ms": "2.0"}
        if name in self.broken:
            raise httpcore.ConnectError("connection refused")
        return {"choices": [{"text": self.action}]}, {"x-swarm-compute-ms": "5.0"}


def _setup(registry, workers, names, *, deadline=0.2, **opts):
    ctx = run_context(registry, "domain=minecraft", "task=wooden_pickaxe")
    roles = list(ctx.domain.roles)
    pop = Population(PopulationOptions(drop_after_misses=3))
    pop.agents = [
        AgentHandle(i, n, roles[i % len(roles)], f"http://agents/{n}", model_id=f"m-{n}", status="up")
        for i, n in enumerate(names)
    ]
    eopts = EngineOptions(
        bid_levels=[float(b) for b in ctx.cfg.algo.bid_levels], bid_deadline_s=deadline, agent_wait_s=0.5, **opts
    )
    engine = Engine(ctx.domain, ctx.coordinator("auction"), pop, workers, eopts, Metrics(), ctx.credit_fn())
    return ctx, engine


def test_gateway_turns_run_on_the_turn_engine_with_missed_bids_and_failover(registry):
    """A: bids highest, its worker fails when it acts (failover, then down); B: misses every bid
    deadline (down after 3 in a row); C: bids lower and acts. Every turn is counted by the engine's
    TurnEngine, and the records say exactly what happened."""
    workers = Workers({"A": 0.8, "B": 0.6, "C": 0.4}, slow={"B"}, broken={"A"})
    ctx, engine = _setup(registry, workers, ["A", "B", "C"])
    seed = ctx.domain.episode_seeds(ctx.task, "eval")[0]
    ep = ServedEpisode("ep-test", seed, 12345, ctx.cfg.task_name, ctx.task, 5)
    ep.env = make_env(ctx.domain, ctx.task)
    ep.env.reset(seed)
    streamed = []

    async def on_turn(rec):
        streamed.append(rec)

    asyncio.run(engine.play(ep, on_turn))
    recs = ep.records
    assert ep.status == "done" and streamed == recs and len(recs) == len(ep.episode.turns) == ep.t >= 4
    # turn 0: everyone up; B missed, A won and failed, C (the runner-up) acted
    r0 = recs[0]
    assert (r0["missed"], r0["failed"], r0["agent"], r0["bids"]) == (["B"], ["A"], "C", {"A": 0.8, "C": 0.4})
    assert r0["action"] == "chop tree" and r0["compute_ms"] == 7.0  # slowest answered bid + the action
    # A is down after its failure; B after its third missed deadline; then C bids alone
    assert [r["missed"] for r in recs[:4]] == [["B"], ["B"], ["B"], []]
    assert all(r["failed"] == [] and r["agent"] == "C" and r["bids"] == {"C": 0.4} for r in recs[1:])
    assert [a.status for a in engine.pop.agents] == ["down", "down", "up"]
    m = engine.metrics
    assert (m.failovers, m.failures[("A", "action")], m.missed_bids["B"], m.turns) == (1, 1, 3, len(recs))
    # the engine answered one bid batch per turn and one action batch per attempt
    assert engine.turns.batches == sum(1 + len(r["failed"]) + (r["agent"] is not None) for r in recs)
    assert engine.turns.rows == sum(len(r["bids"]) + len(r["missed"]) + len(r["failed"]) + 1 for r in recs)
    # the workers got the keyed seeds, as in process: (noise, turn, agent index, kind)
    index = {a.name: a.index for a in engine.pop.agents}
    t_of = {}
    for name, body in workers.bodies:
        kind = keyed.BID if body["max_tokens"] == 1 else keyed.ACTION
        t = next(t for t in range(len(recs)) if body["seed"] == seed_for(ep.noise, t, index[name], kind))
        t_of.setdefault(name, []).append(t)
    assert t_of["A"] == [0, 0] and t_of["B"] == [0, 1, 2]
    # the records are the core's turns, stepped on the env as in process
    for r, turn, event in zip(recs, ep.episode.turns, ep.log):
        assert (r["t"], r["reward"], r["valid"]) == (turn.t, turn.reward, turn.valid)
        assert turn.winner == 2 and turn.action_text == r["action"]
        assert (event.turn, event.role, event.action, event.valid) == (
            turn.t,
            engine.pop.agents[2].role,
            "chop tree",
            turn.valid,
        )
    assert ep.episode.reward == sum(t.reward for t in ep.episode.turns)


def test_answerer_requests_text_bids_constrained_actions_and_the_episodes_temperature(registry):
    """bid_mode=text bids are generated (``swarm_kind: bid``), constrained actions carry the role's
    choices in both of vLLM's spellings, every request the episode's temperature; with every agent
    down the turn fails after ``agent_wait`` (NoAgentsLeft), naming their states."""
    from swarm_runtime.serve.episodes import NoAgentsLeft

    workers = Workers({"A": 0.4, "B": 0.8})
    ctx, engine = _setup(
        registry, workers, ["A", "B"], bid_mode="text", constrained_actions=True, max_bid_tokens=5, max_action_tokens=7
    )
    ep = ServedEpisode("ep-c", 0, 77, ctx.cfg.task_name, ctx.task, 3, temperature=0.3)
    turn, rec = asyncio.run(engine.decide(ep, "goal wooden_pickaxe . inventory : none"))
    assert (rec["agent"], rec["bids"], turn.winner) == ("B", {"A": 0.4, "B": 0.8}, 1)
    bids, acts = workers.bodies[:2], workers.bodies[2:]
    assert all(b["swarm_kind"] == "bid" and b["max_tokens"] == 5 and "guided_choice" not in b for _, b in bids)
    choices = ctx.domain.action_choices(ctx.task, engine.pop.agents[1].role)
    assert choices and [n for n, _ in acts] == ["B"] and acts[0][1]["max_tokens"] == 7
    assert acts[0][1]["guided_choice"] == choices and acts[0][1]["structured_outputs"] == {"choice": choices}
    assert {b["temperature"] for _, b in workers.bodies} == {0.3}
    for a in engine.pop.agents:
        a.status = "down"
    with pytest.raises(NoAgentsLeft, match="A down, B down"):
        asyncio.run(engine.decide(ep, "x"))


def test_served_strategy_on_a_fake_answerer_skips_when_every_winner_fails(registry):
    """The strategy alone, driven by ``TurnEngine.arun``: every winner failing withdraws each bid in
    turn, then the turn is skipped; an unparsed bid is counted; rows are keyed and carry their agent."""
    ctx = run_context(registry, "domain=minecraft", "task=wooden_pickaxe")
    roles = list(ctx.domain.roles)
    agents = [AgentHandle(i, f"a{i}", roles[i], "http://x", model_id=f"m{i}", status="up") for i in range(3)]
    strategy = ServedTurns(ctx.domain, ctx.coordinator("auction"), ctx.cfg.algo.bid_levels)
    seen: list[Batch] = []

    async def answer(batch):
        seen.append(batch)
        if batch.kind == "bid":
            return [Bid("<bid_0.8>", None, level=0.8), Bid("junk", None, level=0.0, parsed=False), None]
        return [None]

    from swarm_runtime.core.episode import Episode

    episode = Episode(7, noise=99)
    engine = TurnEngine()
    out = asyncio.run(engine.arun(strategy.rounds(episode, 3, [], "obs", agents, agents), answer))
    assert [b.kind for b in seen] == ["bid", "act"] and engine.batches == 2 and engine.rows == 4
    assert [r.key for r in seen[0].rows] == [(99, 3, i, keyed.BID) for i in range(3)]
    assert [r.context for r in seen[0].rows] == agents and seen[1].rows[0].key == (99, 3, 0, keyed.ACTION)
    assert out.missed == [2] and out.failed == [0] and out.turn.winner is None  # a 0.0 bid does not act
    assert out.turn.bids == [0.8, 0.0, None] and episode.unparsed_bids == 1 and out.turn.action_text == ""


def test_served_strategy_plays_the_auction_strategys_episode(registry):
    """One auction: the served turn, answered by the in-process sampler and settled with
    ``episode.step_turn``, plays the episode ``episode.play`` (``AuctionTurns``) plays on the same noise,
    turn by turn."""
    import random
    from types import SimpleNamespace

    from swarm_runtime.core.episode import Episode
    from swarm_runtime.core.loop import finish_episode, new_slots, step_turn
    from swarm_runtime.sampling.local import LocalSampler
    from swarm_runtime.sampling.play import play

    ctx = run_context(registry, "domain=minecraft", "task=wooden_pickaxe", "task.max_decisions=6", "hardware.threads=1")
    agents, _ = ctx.build_swarm()
    coordinator, seed, noise = ctx.coordinator(), ctx.domain.episode_seeds(ctx.task, "eval")[0], 4242
    (slot,) = new_slots(ctx.domain, ctx.task, [seed])
    slot.episode.noise = noise
    (want,) = play([slot], agents, coordinator, ctx.domain, 6, random.Random(0))

    sampler, models = LocalSampler.for_agents(agents)
    handles = [SimpleNamespace(index=i, role=a.role, model_id=m) for i, (a, m) in enumerate(zip(agents, models))]
    strategy, engine = ServedTurns(ctx.domain, coordinator, ctx.cfg.algo.bid_levels), TurnEngine(sampler)
    env, got, log = make_env(ctx.domain, ctx.task), Episode(seed, noise=noise), []
    env.reset(seed)
    while not env.done and len(got.turns) < 6:
        out = engine.run(strategy.rounds(got, len(got.turns), log, env.observation(), handles, handles))
        assert out.missed == [] and out.failed == []
        role = agents[out.turn.winner].role if out.turn.winner is not None else None
        step_turn(env, got, log, out.turn, role, role)
        got.turns.append(out.turn)
    finish_episode(got, env)
    assert len(want.turns) >= 2 and want.acted
    assert engine.batches == 2 * len(got.turns) - sum(t.winner is None for t in got.turns)
    assert [(t.winner, t.bids, t.action_text, t.reward, t.valid) for t in got.turns] == [
        (t.winner, t.bids, t.action_text, t.reward, t.valid) for t in want.turns
    ]
    assert (got.reward, got.metrics, got.unparsed_bids) == (want.reward, want.metrics, want.unparsed_bids)


def test_lockstep_sends_each_steps_batches_together_in_order():
    """``core.turn.lockstep`` (AuctionTurns over its slots): one request per kind per step, rows in the
    generators' order, keys kept only when every row has one, score requests merged like batches, each
    generator sent its own answers and its result returned in order."""
    from swarm_runtime.core.engine import Scores
    from swarm_runtime.core.protocols import Row
    from swarm_runtime.core.turn import lockstep

    got = {}

    def turn(name, keys, extra_act=False):
        b = yield Batch("bid", [Row(name, f"{name}-b{i}", k) for i, k in enumerate(keys)])
        got[name, "bid"] = b
        got[name, "score"] = yield Scores([])
        a = yield Batch("act", [Row(name, f"{name}-a", keys[0])])
        if extra_act:  # a failover: one more action batch, alone
            a = a + (yield Batch("act", [Row(name, f"{name}-a2", None)]))
        return name, a

    sent = []

    def answer(batch):
        if batch.kind == "score":
            sent.append(("score", list(batch.rows)))
            return []
        sent.append((batch.kind, [(r.prompt, r.key) for r in batch.rows]))
        return [f"{batch.kind}:{r.prompt}" for r in batch.rows]

    rounds = lockstep([turn("x", [(1,), (2,)]), turn("y", [None], extra_act=True), turn("z", [(3,)])])
    answers, n = None, 0
    while True:
        try:
            batch = rounds.send(answers)
        except StopIteration as stop:
            result = stop.value
            break
        answers, n = answer(batch), n + 1
        assert n < 10
    assert sent == [
        ("bid", [("x-b0", None), ("x-b1", None), ("y-b0", None), ("z-b0", None)]),  # y unkeyed: none
        ("score", []),
        ("act", [("x-a", None), ("y-a", None), ("z-a", None)]),
        ("act", [("y-a2", None)]),
    ]
    assert got["x", "bid"] == ["bid:x-b0", "bid:x-b1"] and got["z", "bid"] == ["bid:z-b0"] and got["y", "score"] == []
    assert result == [("x", ["act:x-a"]), ("y", ["act:y-a", "act:y-a2"]), ("z", ["act:z-a"])]
    keyed_only = lockstep([turn("k", [(5,)])])
    assert keyed_only.send(None).rows[0].key == (5,)


def test_arun_refuses_an_answerer_that_drops_rows():
    async def short(batch):
        return [Response("x", None)]

    def rounds():
        yield Batch("act", [None, None])

    with pytest.raises(RuntimeError, match="gave 1 answers to 2 act rows"):
        asyncio.run(TurnEngine().arun(rounds(), short))
