"""The gateway's episode journal: every episode's start, each turn and its end, appended to
``RUN/serve/journal.jsonl`` and fsynced before the answer leaves, so a gateway killed mid-episode
(``kill -9``, a crash, the machine) loses nothing a client was told.

On start the gateway reads the journal back (:func:`recover`): an episode that started and never
ended was interrupted; it is written to ``episodes.jsonl`` as ``interrupted`` with its turns so far,
and its id answers with that state (not 404). Its ``seed`` and ``noise`` replay it exactly. The
journal then starts afresh (everything in it has ended); a running gateway compacts it to the
episodes still running whenever it passes :data:`COMPACT_BYTES`.

One line per event: ``{"ev": "start", "id", "seed", "noise", "task", "env", "temperature",
"max_decisions", "client", "time"}``, ``{"ev": "turn", "id", "rec"}`` (the turn's record as the API
returns it, with ``versions``: the version, ``Role@vN``, of each agent that answered in the turn), ``{"ev": "reward",
"id", "t", "reward", "valid"}`` (a client-side turn's outcome, reported with the next turn), ``{"ev": "end", "id",
"status", "versions"}`` (``versions``: each agent's versions that answered in the episode, in order; a version swap,
:mod:`swarm_runtime.serve.swap`, takes effect at an agent's next request).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

#: A running gateway rewrites its journal with only the running episodes beyond this size.
COMPACT_BYTES = 64 << 20


class Journal:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = self.path.open("ab")

    def write(self, event: dict) -> None:
        self.f.write((json.dumps(event, default=float) + "\n").encode())
        self.f.flush()
        os.fsync(self.f.fileno())

    @staticmethod
    def start_event(ep, env: str, client: str) -> dict:
        return {
            "id": ep.id,
            "seed": ep.seed,
            "noise": str(ep.noise),
            "task": ep.task_name,
            "env": env,
            "temperature": ep.temperature,
            "max_decisions": ep.max_decisions,
            "client": client,
            "time": time.time(),
        }

    def start(self, ep, env: str, client: str) -> None:
        self.write({"ev": "start", **self.start_event(ep, env, client)})

    def turn(self, eid: str, rec: dict) -> None:
        self.write({"ev": "turn", "id": eid, "rec": rec})

    def reward(self, eid: str, t: int, reward: float, valid: bool) -> None:
        self.write({"ev": "reward", "id": eid, "t": t, "reward": reward, "valid": valid})

    def end(self, eid: str, status: str, versions: dict | None = None) -> None:
        """The episode's end; ``versions``: each agent's versions that answered in it (``Role@vN``)."""
        self.write({"ev": "end", "id": eid, "status": status, **({"versions": versions} if versions else {})})

    def size(self) -> int:
        return self.f.tell()

    def compact(self, running: list[tuple[dict, list[dict]]]) -> None:
        """Start the journal afresh with only the episodes still running (``(start event, turn records)``
        each), so it does not grow with every episode ever served; atomic (a crash leaves the old or
        the new file, both complete)."""
        tmp = self.path.with_suffix(".compact")
        with tmp.open("wb") as f:
            for start, turns in running:
                f.write((json.dumps({"ev": "start", **start}, default=float) + "\n").encode())
                for rec in turns:
                    f.write((json.dumps({"ev": "turn", "id": start["id"], "rec": rec}, default=float) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        self.f.close()
        os.replace(tmp, self.path)
        self.f = self.path.open("ab")

    def close(self) -> None:
        self.f.close()


def recover(path: Path) -> list[dict]:
    """The episodes ``path`` saw start and never end: ``[{id, seed, noise, task, env, ..., turns}]`` in
    start order. A torn last line (the process died mid-write) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    open_: dict[str, dict] = {}
    for line in path.read_bytes().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        eid = ev.get("id")
        if ev.get("ev") == "start":
            open_[eid] = {k: v for k, v in ev.items() if k != "ev"} | {"turns": []}
        elif eid in open_ and ev.get("ev") == "turn":
            open_[eid]["turns"].append(ev["rec"])
        elif eid in open_ and ev.get("ev") == "reward":
            turns = open_[eid]["turns"]
            if turns and turns[-1].get("t") == ev.get("t"):
                turns[-1]["reward"], turns[-1]["valid"] = ev["reward"], ev["valid"]
        elif ev.get("ev") == "end":
            open_.pop(eid, None)
    return list(open_.values())


def interrupted_body(e: dict) -> dict:
    """The ``episodes.jsonl`` entry (and ``GET /v1/episodes/{id}`` answer) of an episode :func:`recover` found
    interrupted: its turns so far, and the seed and noise that replay it."""
    return {
        "id": e["id"],
        "status": "interrupted",
        "error": "the gateway stopped (killed or crashed) during this episode; replay it with its seed and noise",
        "task": e["task"],
        "seed": e["seed"],
        "noise": e["noise"],
        "env": e["env"],
        "decisions": len(e["turns"]),
        "reward": sum(float(r.get("reward") or 0.0) for r in e["turns"]),
        "turns": e["turns"],
        "recovered": True,
    }


def recover_into(path: Path, transcripts: Path) -> list[dict]:
    """Start the journal at ``path`` afresh after a stop: the episodes it saw start and not end are appended to
    ``transcripts`` as ``interrupted`` (:func:`interrupted_body`) and returned so."""
    bodies = [interrupted_body(e) for e in recover(path)]
    with Path(transcripts).open("a") as f:
        for body in bodies:
            f.write(json.dumps(body) + "\n")
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_bytes(b"")
    os.replace(tmp, path)  # everything in the old journal has ended now
    return bodies
