"""The first process of a vLLM server's process group: it starts the server and makes sure that nothing of the group
outlives the server's own process or the run that started it (docs/guides/vllm.md, "Lifecycle").

    python swarm_vllm_watch.py PARENT_PID -- PROGRAM ARGS...

:class:`~swarm_runtime.sampling.vllm_server.VLLMServer` runs it in a session of its own (its process group's id is
its pid), under the server's Python. It starts ``PROGRAM ARGS`` in the same group and waits, polling every
:data:`POLL_S` seconds, until either

- the server's process exits (killed, crashed or stopped): the rest of the group (vLLM's engine core, its resource
  tracker) is ended too, and this process exits with the server's code; or
- its parent is gone (``swarm run`` killed with ``kill -9``: this process is re-parented, ``os.getppid()`` changes):
  the server is sent SIGTERM, the group SIGKILL after :data:`GRACE_S`, and this process exits.

SIGTERM sent to this process alone is passed on to the server (which then shuts down, and the first case ends the
rest). Standalone on purpose, like ``swarm_vllm_guard``: it runs under vLLM's own virtualenv (stdlib only).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

#: Seconds between two looks at the server and at the parent.
POLL_S = 0.2
#: Seconds the server is given to stop on SIGTERM before the group is killed.
GRACE_S = 10.0


def group_members() -> list[int]:
    """The other live processes of this process's group (Linux: from /proc)."""
    me, group = os.getpid(), os.getpgrp()
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
            if int(fields[2]) == group and fields[0] != "Z":
                out.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def end_group(grace_s: float) -> None:
    """SIGTERM to the rest of the group, then SIGKILL to what is left after ``grace_s`` seconds (without /proc: the
    whole group at once, this process included)."""
    if not os.path.isdir("/proc"):
        os.killpg(0, signal.SIGKILL)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        members = group_members()
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        end = time.monotonic() + wait
        while time.monotonic() < end and group_members():
            time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: swarm_vllm_watch.py PARENT_PID -- PROGRAM ARGS...", file=sys.stderr)
        return 2
    parent = int(argv[0])
    server = subprocess.Popen(argv[2:])
    signal.signal(signal.SIGTERM, lambda *_: server.send_signal(signal.SIGTERM))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run's Ctrl-C is the run's to handle (it stops the server)
    while True:
        code = server.poll()
        if code is not None:
            end_group(2.0)
            return code if code >= 0 else 128 - code
        if os.getppid() != parent:
            print(f"swarm_vllm_watch: the run (pid {parent}) is gone; stopping the server", file=sys.stderr, flush=True)
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            end_group(0.0)
            return 0
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
