"""The world of a client-side episode (``POST /v1/episodes`` with ``"env": "client"``), as the core loop's env.

The client owns the world: each ``POST /v1/episodes/{id}/turns`` reports what its world did with the last action
it was told (``reward``, ``valid``, ``done``) and what it sees now (``observation``), and is answered with the
next decided turn. The episode's loop (:class:`swarm_runtime.serve.turns.ServedTurns`) runs in a task of its
own and stays suspended at its :class:`~swarm_runtime.core.engine.Steps` request between the client's requests:
the answerer hands the decided turn to the waiting request (:meth:`ClientWorld.exchange`) and the client's next
report is the step's result, which the core settles (:func:`swarm_runtime.core.loop.settle`).
"""

from __future__ import annotations

import asyncio

from swarm_runtime.core.env import StepResult


class ClientWorld:
    """What the client last reported, for the loop: :meth:`observation`, ``done``, no :meth:`metrics`. Two
    hand-overs: ``decision`` (the loop's decided turn's record, for the client's request) and ``report`` (the
    client's report of that turn's outcome, for the loop)."""

    def __init__(self, observation: str):
        loop = asyncio.get_running_loop()
        self.last_observation = observation
        self.done = False
        self.decision: asyncio.Future = loop.create_future()
        self.report: asyncio.Future = loop.create_future()

    def observation(self) -> str:
        return self.last_observation

    def metrics(self) -> dict:
        return {}

    async def exchange(self, record: dict) -> StepResult:
        """The loop's side of a step: hand ``record`` (the decided turn) to the client, wait for its report."""
        self.report = asyncio.get_running_loop().create_future()
        self.decision.set_result(record)
        r = await self.report
        self.last_observation, self.done = r.observation, bool(r.done)
        return StepResult(r.observation, float(r.reward), bool(r.done), bool(r.valid), {})

    def tell(self, report) -> None:
        """The client's side: its ``report`` (``observation``, ``reward``, ``valid``, ``done``) of the last turn
        it was told. Not taken while a decision it was not told waits (its request was cut off: the report was
        taken already) or while the last report is being played."""
        if not self.decision.done() and not self.report.done():
            self.report.set_result(report)

    async def next_decision(self, task: asyncio.Future) -> dict | None:
        """The next decided turn's record, or None when the episode's loop (``task``) ended first."""
        if not self.decision.done():
            await asyncio.wait([self.decision, task], return_when=asyncio.FIRST_COMPLETED)
        if not self.decision.done():
            return None
        record = self.decision.result()
        self.decision = asyncio.get_running_loop().create_future()
        return record
