"""A worker's batching (:class:`Batcher`): requests that arrive while the model is busy are answered together,
one batch per group (:attr:`swarm_runtime.serve.completer.Job.group`)."""

from __future__ import annotations

from swarm_runtime.serve.completer import Completer, Job


class Batcher:
    """Requests that arrive while the model is busy are answered together: each round takes every
    queued request, and runs one batch per group (bids; actions of one choice set; same temperature,
    length and keying). One request alone is a batch of one."""

    def __init__(self, completer: Completer, max_rows: int = 64):
        self.completer, self.max_rows = completer, max_rows
        self.queue: list[Job] = []
        self.wake = None
        self.task = None
        self.stats = {"requests": 0, "batches": 0, "rows": 0}  #: answered so far (``GET /health``)

    async def submit(self, job: Job):
        import asyncio

        if self.task is None:
            self.wake = asyncio.Event()
            self.task = asyncio.ensure_future(self._loop())
        job.future = asyncio.get_running_loop().create_future()
        self.queue.append(job)
        self.wake.set()
        return await job.future

    async def _loop(self):
        import asyncio

        while True:
            await self.wake.wait()
            self.wake.clear()
            await asyncio.sleep(0)  # let the requests already read join this round
            batch, self.queue = self.queue, []
            groups: dict[tuple, list[Job]] = {}
            for j in sorted(batch, key=lambda j: j.adapter or ""):  # an adapter's rows contiguous (mixed batches)
                groups.setdefault(j.group, []).append(j)
            for jobs in groups.values():
                for k in range(0, len(jobs), self.max_rows):
                    chunk = jobs[k : k + self.max_rows]
                    try:
                        bodies, ms = self.completer.run(chunk)
                    except Exception as exc:  # answer every request of the batch with the error
                        for j in chunk:
                            if not j.future.done():
                                j.future.set_exception(exc)
                        continue
                    self.stats["requests"] += len(chunk)
                    self.stats["batches"] += 1
                    self.stats["rows"] += sum(len(j.prompts) for j in chunk)
                    for j, body in zip(chunk, bodies):
                        if not j.future.done():
                            j.future.set_result((body, ms))
                    await asyncio.sleep(0)
