"""Sampler replicas (docs/reference/cluster.md, "Sampler replicas"): one base served by several samplers of
the same weights (``cluster.sampler_replicas``: an engine sampler actor each, its own vLLM server, spread over the
nodes), so that a rollout's rows are drawn on all of them at once.

- Rows: each call's rows are split into balanced contiguous chunks, one per live replica in order
  (:func:`spread`); the chunks are in flight together and the answers come back in the rows' order. A row keeps
  its keyed seed (``row_seed``), so it is asked the same whichever replica gets it; an unkeyed row gets the seed a
  single sampler's generator would have drawn for it (:meth:`ReplicatedSampler.seeded`), so the replicas ask what
  one server would be asked, whatever their number.
- Sync: every changed adapter version is loaded on EVERY live replica (the same version names everywhere) before
  the call returns; each version is exported once and copied for the other replicas, or (engine actors) put in
  Ray's object store once and the same object loaded by all (:class:`ExportOnce`).
- Faults: a replica restarts or adopts its own server as a lone sampler does (its rows retried there); one gone
  for good (:class:`~swarm_runtime.sampling.http.EngineGone`: its restarts spent, its node lost, its server not
  back) is dropped with one warning line and its rows go to the live replicas. When none is left the run stops with
  one line (resumable).
"""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from loguru import logger

from swarm_runtime.sampling.http import EngineGone


def spread(n_rows: int, n_replicas: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each replica's rows: ``n_rows`` split into ``n_replicas`` contiguous chunks whose sizes
    differ by at most one (the first ones the larger)."""
    if n_replicas < 1:
        raise ValueError(f"spread: n_replicas={n_replicas} is not valid; valid: at least 1")
    q, r = divmod(int(n_rows), int(n_replicas))
    out, start = [], 0
    for j in range(n_replicas):
        end = start + q + (1 if j < r else 0)
        out.append((start, end))
        start = end
    return out


class ExportOnce:
    """The learner as each replica's sync sees it: a model's version is exported once (under a lock: replicas sync
    from threads) and copied for every other replica; for replicas on Ray (engine actors), its files are put in
    Ray's object store once (:meth:`put`) and the same object loaded by every replica. The rest is the learner's."""

    def __init__(self, learner):
        self.learner = learner
        self._lock = threading.Lock()
        self._tmp = Path(tempfile.mkdtemp(prefix="swarm-replicas-"))
        self._done: dict[tuple[str, int], Path] = {}
        self._refs: dict[tuple[str, int], object] = {}
        self.puts = 0  #: objects put in Ray's object store (one per changed model's version)

    def version(self, model: str) -> int:
        return self.learner.version(model)

    def export(self, model: str, folder: Path) -> Path:
        v = int(self.learner.version(model))
        with self._lock:
            src = self._done.get((model, v))
            if src is None:
                src = self.learner.export(model, self._tmp / f"{model}@v{v}")
                self._done[(model, v)] = src
        folder = Path(folder)
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(src, folder)
        return folder

    def put(self, model: str, ray) -> tuple[int, object]:
        """``(version, ref)``: the files of ``model``'s current version (``cluster.base_shipping.read_folder``'s) put in
        ``ray``'s object store on the first ask, the same ref for every later one (every replica's
        ``RemoteAdapters.sync``)."""
        from swarm_runtime.cluster.base_shipping import read_folder

        v = int(self.learner.version(model))
        with self._lock:
            ref = self._refs.get((model, v))
            if ref is None:
                src = self._done.get((model, v))
                if src is None:
                    src = self.learner.export(model, self._tmp / f"{model}@v{v}")
                    self._done[(model, v)] = src
                ref = self._refs[(model, v)] = ray.put(read_folder(src))
                self.puts += 1
        return v, ref

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._refs.clear()  # the replicas that loaded a version hold its ref (their ``kept``) for as long as needed


class ReplicatedSampler:
    """Several samplers of one base (``replicas``: samplers of the same models on the same weights, e.g. one
    :func:`~swarm_runtime.sampling.factory.engine_sampler` per engine actor); the module docstring says how rows,
    sync and faults go. ``base``: the base's name, for the log lines; ``seed``: the run's (the generator of the
    unkeyed rows' seeds, as a single :class:`~swarm_runtime.sampling.openai.OpenAISampler` seeds its own)."""

    def __init__(self, replicas: list, base: str = "default", seed: int = 0):
        if not replicas:
            raise ValueError("ReplicatedSampler: no replicas; valid: at least one sampler")
        self.replicas, self.base = list(replicas), str(base)
        self.live: list[int] = list(range(len(self.replicas)))  #: indices of the replicas still in use
        self.dropped: dict[int, str] = {}  #: replica index -> why it was dropped
        self.rows = [0] * len(self.replicas)  #: rows each replica answered
        first = self.replicas[0]
        self.name = first.name
        self.server = getattr(first, "server", None)  #: the first replica's (``servers``: every replica's)
        self.servers = [getattr(s, "server", None) for s in self.replicas]
        self.on_ray = any(getattr(s, "on_ray", False) for s in self.replicas)
        self._pool = ThreadPoolExecutor(max_workers=len(self.replicas), thread_name_prefix="replica")
        self.closed = False
        self.rng = random.Random(int(seed))

    # ------------------------------------------------------------------ faults
    def _drop(self, j: int, exc: BaseException) -> None:
        if j not in self.live:
            return
        self.live.remove(j)
        self.dropped[j] = str(exc)
        logger.warning(
            "sampler replica {} of base {} is gone ({}); dropped, its rows go to the {} live replica(s)",
            j,
            self.base,
            str(exc).split("; the run")[0],
            len(self.live),
        )
        try:
            self.replicas[j].close()
        except Exception:  # noqa: BLE001 - already gone; what is left of it is Ray's or the OS's
            pass

    def _none_left(self) -> EngineGone:
        why = "; ".join(f"replica {j}: {w}" for j, w in sorted(self.dropped.items()))
        return EngineGone(
            f"every sampler replica of base {self.base!r} is gone ({len(self.dropped)} dropped: {why}); the run "
            "stops here: resume it from its last checkpoint (swarm run resume=true)"
        )

    # ------------------------------------------------------------------ rows
    def seeded(self, method: str, rows: list) -> list:
        """``rows`` with each unkeyed row's ``seed`` drawn from :attr:`rng` in the order one
        :class:`~swarm_runtime.sampling.openai.OpenAISampler` draws them over the whole call (``act``: the rows' order;
        ``bid``: the rows drawn as text first, then the ``logits``-mode ones), so a row is asked with the same seed
        whichever replica gets it and however many there are."""
        if all(r.key is not None or r.seed is not None for r in rows):
            return rows
        order = list(range(len(rows)))
        if method == "bid":
            policies = getattr(self.replicas[0], "policies", {})

            def logits(i: int) -> bool:
                return getattr(policies.get(rows[i].model), "bid_mode", None) == "logits"

            order = [i for i in order if not logits(i)] + [i for i in order if logits(i)]
        seeds = {i: self.rng.getrandbits(63) for i in order if rows[i].key is None and rows[i].seed is None}
        return [replace(r, seed=seeds[i]) if i in seeds else r for i, r in enumerate(rows)]

    def _call(self, method: str, rows) -> list:
        rows = self.seeded(method, list(rows))
        out: list = [None] * len(rows)
        todo = list(range(len(rows)))
        while todo:
            live = list(self.live)
            if not live:
                raise self._none_left()
            parts = [
                (j, todo[a:b]) for j, (a, b) in zip(live, spread(len(todo), len(live))) if b > a
            ]  # replica -> the rows' indices
            futures = [
                (j, idx, self._pool.submit(getattr(self.replicas[j], method), [rows[i] for i in idx]))
                for j, idx in parts
            ]
            failed: list[int] = []
            error: BaseException | None = None
            for j, idx, f in futures:
                try:
                    for i, answer in zip(idx, f.result()):
                        out[i] = answer
                    self.rows[j] += len(idx)
                except EngineGone as exc:
                    self._drop(j, exc)
                    failed.extend(idx)
                except BaseException as exc:  # noqa: BLE001 - raised once every chunk is back
                    error = error or exc
            if error is not None:
                raise error
            todo = sorted(failed)
        return out

    def bid(self, rows):
        return self._call("bid", rows)

    def act(self, rows):
        return self._call("act", rows)

    def _first(self):
        if not self.live:
            raise self._none_left()
        return self.replicas[self.live[0]]

    def bid_levels(self, model: str):
        return self._first().bid_levels(model)

    def version(self, model: str) -> int:
        return self._first().version(model)

    # ------------------------------------------------------------------ weights
    def sync(self, learner, models) -> None:
        """Load every changed version on every live replica (together; each version exported once); a replica
        gone for good is dropped, the others keep the versions."""
        models = list(models)
        once = ExportOnce(learner)
        try:
            futures = [(j, self._pool.submit(self.replicas[j].sync, once, models)) for j in list(self.live)]
            error: BaseException | None = None
            for j, f in futures:
                try:
                    f.result()
                except EngineGone as exc:
                    self._drop(j, exc)
                except BaseException as exc:  # noqa: BLE001 - raised once every replica is back
                    error = error or exc
            if error is not None:
                raise error
        finally:
            once.close()
        if not self.live:
            raise self._none_left()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        logger.info(
            "sampler replicas of base {}: rows {}, requests {} per replica; {} dropped",
            self.base,
            self.rows,
            [getattr(s, "requests", None) for s in self.replicas],
            sorted(self.dropped) or "none",
        )
        self._pool.shutdown(wait=False, cancel_futures=True)
        for j in self.live:
            self.replicas[j].close()
