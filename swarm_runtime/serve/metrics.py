"""The gateway's Prometheus metrics, written in the text exposition format (no client library)."""
from __future__ import annotations

import threading
from collections import defaultdict

#: Upper bounds (seconds) of the latency histograms' buckets.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    def __init__(self):
        self.counts = [0] * len(BUCKETS)
        self.sum, self.n = 0.0, 0
        self.values: list[float] = []  #: raw observations (bounded), for percentiles in benchmarks

    def observe(self, v: float) -> None:
        for i, b in enumerate(BUCKETS):
            if v <= b:
                self.counts[i] += 1
        self.sum += v
        self.n += 1
        if len(self.values) < 200_000:
            self.values.append(v)


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Counters and histograms; ``render()`` is the ``/metrics`` body."""

    def __init__(self):
        self.lock = threading.Lock()
        self.turns = 0
        self.skipped_turns = 0
        self.episodes: dict[str, int] = defaultdict(int)  # by final status
        self.missed_bids: dict[str, int] = defaultdict(int)  # by agent
        self.failures: dict[tuple[str, str], int] = defaultdict(int)  # (agent, kind: bid|action)
        self.failovers = 0
        self.turn_latency = Histogram()
        self.overhead = Histogram()

    def render(self, agents_up: int, agents_total: int, running: int) -> str:
        lines = []

        def metric(name, kind, help_, samples):
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples)

        with self.lock:
            metric("swarm_turns_total", "counter", "Turns decided (auction run).", [f"swarm_turns_total {self.turns}"])
            metric("swarm_skipped_turns_total", "counter", "Turns nobody acted on.",
                   [f"swarm_skipped_turns_total {self.skipped_turns}"])
            metric("swarm_episodes_total", "counter", "Episodes ended, by status.",
                   [f'swarm_episodes_total{{status="{_label(s)}"}} {n}' for s, n in sorted(self.episodes.items())])
            metric("swarm_bids_missed_total", "counter", "Bids not received within the deadline, per agent.",
                   [f'swarm_bids_missed_total{{agent="{_label(a)}"}} {n}' for a, n in sorted(self.missed_bids.items())])
            metric("swarm_agent_failures_total", "counter", "Failed requests to an agent, per agent and kind.",
                   [f'swarm_agent_failures_total{{agent="{_label(a)}",kind="{k}"}} {n}'
                    for (a, k), n in sorted(self.failures.items())])
            metric("swarm_failovers_total", "counter", "Turns handed to the next bidder after the winner failed.",
                   [f"swarm_failovers_total {self.failovers}"])
            for name, h, help_ in (("swarm_turn_latency_seconds", self.turn_latency, "Bids, auction and action of a turn."),
                                   ("swarm_gateway_overhead_seconds", self.overhead,
                                    "Turn latency beyond the workers' model compute.")):
                samples = [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(BUCKETS, h.counts)]
                samples += [f'{name}_bucket{{le="+Inf"}} {h.n}', f"{name}_sum {h.sum:.6f}", f"{name}_count {h.n}"]
                metric(name, "histogram", help_, samples)
            import resource

            ru = resource.getrusage(resource.RUSAGE_SELF)
            metric("process_cpu_seconds_total", "counter", "CPU time of the gateway process (user + system).",
                   [f"process_cpu_seconds_total {ru.ru_utime + ru.ru_stime:.6f}"])
            metric("swarm_agents_up", "gauge", "Agents answering now.", [f"swarm_agents_up {agents_up}"])
            metric("swarm_agents", "gauge", "Agents in the population (not removed).", [f"swarm_agents {agents_total}"])
            metric("swarm_episodes_running", "gauge", "Episodes in progress.", [f"swarm_episodes_running {running}"])
        return "\n".join(lines) + "\n"
