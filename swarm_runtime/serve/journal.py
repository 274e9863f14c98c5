"""The gateway's episode journal: every episode's start, each turn and its end, appended to
``RUN/serve/journal.jsonl`` and fsynced before the answer leaves, so a gateway killed mid-episode
(``kill -9``, a crash, the machine) loses nothing a client was told.

On start the gateway reads the journal back (:func:`recover`): an episode that started and never
ended was interrupted; it is written to ``episodes.jsonl`` as ``interrupted`` with its turns so far,
and its id answers with that state (not 404). Its ``seed`` and ``noise`` replay it exactly. The
journal then starts afresh (everything in it has ended); a running gateway compacts it to the
episodes still running whenever it passes :data:`COMPACT_BYTES`.

One line per event: ``{"ev": "start", "id", "seed", "noise", "task", "env", "temperature",
"max_decisions", "client", "time"}``, ``{"ev": "turn", "id", "rec", "samples"}`` (the turn's record as the API
returns it, with ``versions``: the version, ``Role@vN``, of each agent that answered in the turn; ``samples``: the
token ids and log-probs of its bids and action, :func:`swarm_runtime.serve.answerer.sample`), ``{"ev": "reward",
"id", "t", "reward", "valid"}`` (a client-side turn's outcome, reported with the next turn or posted later),
``{"ev": "end", "id", "status", "versions"}`` (``versions``: each agent's versions that answered in the episode, in
order; a version swap, :mod:`swarm_runtime.serve.swap`, takes effect at an agent's next request).

Exactly once: an episode's transcript line (``episodes.jsonl``) is fsynced before its ``end`` event. A gateway
killed between the two leaves an episode that ended in the transcript and open in the journal; recovery finds its
id in the transcript's tail (:data:`TAIL_BYTES`) and does not write it again as ``interrupted``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

#: A running gateway rewrites its journal with only the running episodes beyond this size.
COMPACT_BYTES = 64 << 20
#: How much of the transcript's end recovery reads for episodes that ended just before a crash.
TAIL_BYTES = 64 << 20


def append_synced(path: Path, line: dict) -> None:
    """Append ``line`` as JSON to ``path`` and fsync it."""
    with Path(path).open("ab") as f:
        f.write((json.dumps(line, default=float) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


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

    def turn(self, eid: str, rec: dict, samples: dict | None = None) -> None:
        self.write({"ev": "turn", "id": eid, "rec": rec, **({"samples": samples} if samples is not None else {})})

    def reward(self, eid: str, t: int, reward: float, valid: bool) -> None:
        self.write({"ev": "reward", "id": eid, "t": t, "reward": reward, "valid": valid})

    def end(self, eid: str, status: str, versions: dict | None = None) -> None:
        """The episode's end; ``versions``: each agent's versions that answered in it (``Role@vN``)."""
        self.write({"ev": "end", "id": eid, "status": status, **({"versions": versions} if versions else {})})

    def size(self) -> int:
        return self.f.tell()

    def compact(self, running: list[tuple[dict, list[dict], list[dict]]]) -> None:
        """Start the journal afresh with only the episodes still running (``(start event, turn records, their
        samples)`` each), so it does not grow with every episode ever served; atomic (a crash leaves the old or
        the new file, both complete)."""
        tmp = self.path.with_suffix(".compact")
        with tmp.open("wb") as f:
            for start, turns, samples in running:
                f.write((json.dumps({"ev": "start", **start}, default=float) + "\n").encode())
                for rec, drawn in zip(turns, samples):
                    ev = {"ev": "turn", "id": start["id"], "rec": rec, "samples": drawn}
                    f.write((json.dumps(ev, default=float) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        self.f.close()
        os.replace(tmp, self.path)
        self.f = self.path.open("ab")

    def close(self) -> None:
        self.f.close()


def recover(path: Path) -> list[dict]:
    """The episodes ``path`` saw start and never end: ``[{id, seed, noise, task, env, ..., turns, samples}]`` in
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
            open_[eid] = {k: v for k, v in ev.items() if k != "ev"} | {"turns": [], "samples": []}
        elif eid in open_ and ev.get("ev") == "turn":
            open_[eid]["turns"].append(ev["rec"])
            open_[eid]["samples"].append(ev.get("samples"))
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


def ended_ids(transcripts: Path, ids: set[str]) -> set[str]:
    """Which of ``ids`` the transcript ``transcripts`` already holds (in its last :data:`TAIL_BYTES`)."""
    path = Path(transcripts)
    if not ids or not path.exists():
        return set()
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - TAIL_BYTES))
        tail = f.read()
    found = set()
    for line in tail.splitlines():
        head = line[:200].decode("utf-8", "replace")  # every line starts with its id: {"id": "ep-...", ...}
        found.update(i for i in ids if f'"id": "{i}"' in head)
    return found


def recover_into(path: Path, transcripts: Path) -> list[dict]:
    """Start the journal at ``path`` afresh after a stop: the episodes it saw start and not end are appended to
    ``transcripts`` as ``interrupted`` (:func:`interrupted_body`, with their turns' samples) and returned so; one
    that the transcript holds already (it ended, and the gateway was killed before its ``end`` event) is not."""
    lost = recover(path)
    done = ended_ids(transcripts, {e["id"] for e in lost})
    lost = [e for e in lost if e["id"] not in done]
    for e in lost:
        append_synced(transcripts, {**interrupted_body(e), "samples": e["samples"]})
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_bytes(b"")
    os.replace(tmp, path)  # everything in the old journal has ended now
    return [interrupted_body(e) for e in lost]
