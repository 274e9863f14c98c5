"""The gateway plays its episodes on the core loop (docs/reference/engine.md): the served loop
(``serve.turns.ServedTurns``, an ``AuctionTurns``) run by ``TurnEngine.arun`` with the gateway's answerer
(``serve.answerer.TurnAnswerer``), here over an in-process transport that answers as workers do, so
missed bids, a failed winner, a client's reports and the records are checked exactly and fast. (Real workers
over real HTTP: tests/test_serve.py, whose served episodes equal the in-process ones.)"""

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
from swarm_runtime.serve.turns import Bidders, ServedTurns


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
    asyncio.run(engine.play(ep, streamed.append))
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
    seed = ctx.domain.episode_seeds(ctx.task, "eval")[0]

    def episode(eid):
        ep = ServedEpisode(eid, seed, 77, ctx.cfg.task_name, ctx.task, 1, temperature=0.3)
        ep.env = make_env(ctx.domain, ctx.task)
        ep.env.reset(seed)
        return ep

    ep = asyncio.run(engine.play(episode("ep-c")))
    (rec,), (turn,) = ep.records, ep.episode.turns
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
        asyncio.run(engine.play(episode("ep-d")))


def test_served_loop_on_a_fake_answerer_skips_when_every_winner_fails(registry):
    """The served loop alone, driven by ``TurnEngine.arun``: it asks who bids (``Bidders``), every winner
    failing withdraws each bid in turn, then the turn is skipped and its world step settles it; an unparsed bid
    is counted; rows are keyed and carry their agent."""
    from types import SimpleNamespace

    from swarm_runtime.core.episode import Episode, Slot

    ctx = run_context(registry, "domain=minecraft", "task=wooden_pickaxe")
    roles = list(ctx.domain.roles)
    agents = [AgentHandle(i, f"a{i}", roles[i], "http://x", model_id=f"m{i}", status="up") for i in range(3)]
    strategy = ServedTurns(ctx.domain, ctx.coordinator("auction"), ctx.cfg.algo.bid_levels, agents, 10)
    seen: list = []

    async def answer(request):
        seen.append(request)
        if request.kind == "bidders":
            return [agents]
        if request.kind == "bid":
            return [Bid("<bid_0.8>", None, level=0.8), Bid("junk", None, level=0.0, parsed=False), None]
        return [None]  # the winner's action fails; the skipped turn's world step answers None

    world = SimpleNamespace(observation=lambda: "obs", done=True, metrics=lambda: {"m": 1.0})
    slot = Slot(world, Episode(7, noise=99), [], t=3)
    engine = TurnEngine()
    (episode,) = asyncio.run(engine.arun(strategy.rounds([slot]), answer))
    assert [r.kind for r in seen] == ["bidders", "bid", "act", "step"] and engine.batches == 2 and engine.rows == 4
    assert seen[0].rows == [slot] and isinstance(seen[0], Bidders)
    assert [r.key for r in seen[1].rows] == [(99, 3, i, keyed.BID) for i in range(3)]
    assert [r.context for r in seen[1].rows] == agents and seen[2].rows[0].key == (99, 3, 0, keyed.ACTION)
    (step,) = seen[3].rows
    assert step.decided.missed == [2] and step.decided.failed == [0] and step.turn.winner is None  # 0.0 does not act
    turn = episode.turns[0]
    assert turn.bids == [0.8, 0.0, None] and episode.unparsed_bids == 1 and turn.action_text == ""
    assert slot.finished and slot.t == 4 and episode.metrics == {"m": 1.0} and slot.log[-1].role is None


def test_served_loop_plays_the_auction_strategys_episode(registry):
    """One loop: the served loop, answered by the in-process sampler and env, plays the episode ``play``
    (``AuctionTurns``) plays on the same noise, turn by turn."""
    import random
    from types import SimpleNamespace

    from swarm_runtime.core.loop import new_slots
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
    strategy = ServedTurns(ctx.domain, coordinator, ctx.cfg.algo.bid_levels, handles, 6)
    engine, in_process = TurnEngine(), TurnEngine(sampler)

    async def answer(request):
        return [handles] * len(request.rows) if request.kind == "bidders" else in_process.answer(request)

    (served,) = new_slots(ctx.domain, ctx.task, [seed])
    served.episode.noise = noise
    (got,) = asyncio.run(engine.arun(strategy.rounds([served]), answer))
    assert len(want.turns) >= 2 and want.acted
    assert engine.batches == 2 * len(got.turns) - sum(t.winner is None for t in got.turns)
    assert [(t.winner, t.bids, t.action_text, t.reward, t.valid) for t in got.turns] == [
        (t.winner, t.bids, t.action_text, t.reward, t.valid) for t in want.turns
    ]
    assert (got.reward, got.metrics, got.unparsed_bids) == (want.reward, want.metrics, want.unparsed_bids)
    assert [(e.turn, e.role, e.action, e.valid, e.reward) for e in served.log] == [
        (e.turn, e.role, e.action, e.valid, e.reward) for e in slot.log
    ]


def test_client_side_episode_on_the_core_loop(registry):
    """A client-side episode: its loop waits at each world step for the client's report, which the core
    settles on the turn the client was told (reward, validity, the log, the invalid count); a skipped turn takes
    its reported reward; while a report is due the summary counts the told turn; ``done`` ends the episode with
    the turns' rewards as its return."""
    from swarm_runtime.serve.client_world import ClientWorld

    workers = Workers({"A": 0.8, "B": 0.4})
    ctx, engine = _setup(registry, workers, ["A", "B"])
    ep = ServedEpisode("ep-client", 5, 31, ctx.cfg.task_name, ctx.task, 10)
    told, rewarded = [], []

    class Report:
        def __init__(self, observation, reward=0.0, valid=True, done=False):
            self.observation, self.reward, self.valid, self.done = observation, reward, valid, done

    async def client():
        ep.world = ClientWorld("goal wooden_pickaxe . inventory : none")
        ep.runner = asyncio.ensure_future(engine.play(ep, told.append, rewarded.append))
        first = await ep.world.next_decision(ep.runner)
        mid = engine.summary(ep)
        ep.world.tell(Report("obs 1", reward=1.5, valid=False))
        second = await ep.world.next_decision(ep.runner)
        ep.world.tell(Report("obs 2", reward=2.0, done=True))
        end = await ep.world.next_decision(ep.runner)
        return first, mid, second, end

    first, mid, second, end = asyncio.run(client())
    assert end is None and ep.status == "done" and [r["t"] for r in told] == [0, 1] and rewarded == told
    assert first["agent"] == "A" and mid["decisions"] == 1 and mid["reward"] == 0.0 and len(ep.records) == 2
    assert [(r["reward"], r["valid"]) for r in ep.records] == [(1.5, False), (2.0, True)]
    assert [(t.reward, t.valid) for t in ep.episode.turns] == [(1.5, False), (2.0, True)]
    assert ep.episode.invalid_actions == 1 and ep.episode.reward == 3.5 and ep.episode.metrics == {}
    assert [(e.turn, e.valid, e.reward) for e in ep.log] == [(0, False, 1.5), (1, True, 2.0)]
    summary = engine.summary(ep)
    assert (summary["decisions"], summary["reward"], summary["invalid_actions"]) == (2, 3.5, 1)
    assert second["t"] == 1 and ep.pending is None and ep.t == 2


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


def test_client_world_keeps_a_decision_whose_request_was_cut_off():
    """A client request cut off while its turn was decided: the decision waits, the retried request gets it and
    its report (already taken) is not taken twice; the loop's end answers None."""
    from types import SimpleNamespace

    from swarm_runtime.serve.client_world import ClientWorld

    async def run():
        world = ClientWorld("obs 0")
        loop_done = asyncio.get_running_loop().create_future()
        first = asyncio.ensure_future(world.next_decision(loop_done))
        await asyncio.sleep(0)
        first.cancel()  # the client's request is cut off before the decision
        step = asyncio.ensure_future(world.exchange({"t": 0}))
        await asyncio.sleep(0)
        report = SimpleNamespace(observation="obs 1", reward=2.0, valid=False, done=True)
        world.tell(report)  # the retried request: the waiting decision is its answer, its report is not taken
        assert not world.report.done()
        got = await world.next_decision(loop_done)
        world.tell(report)
        result = await step
        loop_done.set_result(None)
        return got, result, await world.next_decision(loop_done), world

    got, result, end, world = asyncio.run(run())
    assert got == {"t": 0} and end is None and world.done and world.observation() == "obs 1"
    assert (result.reward, result.valid, result.done, result.info) == (2.0, False, True, {})
