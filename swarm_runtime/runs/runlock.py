"""An exclusive lock on a run folder (``<run_dir>/.lock``), so that two commands never write
one run at once. The lock is an OS file lock (``fcntl.flock``), which the kernel drops when its
holder dies, so a lock left by a killed run (``kill -9``, a lost machine) is stale and taken over
with a warning; the file names the holder (pid, host, command) for the message the second
command prints."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from loguru import logger

from swarm_runtime.config.errors import ConfigError

LOCK_NAME = ".lock"


class RunLockedError(ConfigError):
    """The run folder is locked by another live command."""


def _holder(path: Path) -> dict:
    try:
        info = json.loads(path.read_text() or "{}")
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def describe(info: dict) -> str:
    if not info:
        return "another process"
    return (
        f"pid {info.get('pid', '?')} on host {info.get('host', '?')} "
        f"(swarm {info.get('command', '?')}, since {info.get('started', '?')})"
    )


class RunLock:
    """``with RunLock(run_dir, "run"):`` or :meth:`acquire` / :meth:`release`."""

    def __init__(self, run_dir: Path, command: str):
        self.path = Path(run_dir) / LOCK_NAME
        self.command = command
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        for _ in range(10):  # retry when the holder released (and deleted) the file under us
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunLockedError(
                    f"run folder {self.path.parent} is in use by {describe(_holder(self.path))}; "
                    "wait for it to finish (or stop it) and try again"
                ) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            stale = _holder(self.path)
            if stale.get("pid") and stale.get("pid") != os.getpid():
                logger.warning(
                    "run folder {}: taking over the stale lock of {}, which is no longer running",
                    self.path.parent,
                    describe(stale),
                )
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "command": self.command,
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
            self._fd = fd
            return self
        raise RunLockedError(f"could not lock {self.path}: it keeps changing under us")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
