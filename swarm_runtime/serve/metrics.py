"""The gateway's Prometheus metrics, written in the text exposition format (no client library)."""

from __future__ import annotations

import threading
from collections import defaultdict

#: Upper bounds (seconds) of the latency histograms' buckets.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: ... of the episode duration histogram.
EPISODE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
#: Agent states, one gauge each (``swarm_agent_state``).
AGENT_STATES = ("starting", "up", "down", "failed", "draining", "removed")


class Histogram:
    def __init__(self, buckets=BUCKETS):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum, self.n = 0.0, 0
        self.values: list[float] = []  #: raw observations (bounded), for percentiles in benchmarks

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
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
        self.episode_duration = Histogram(EPISODE_BUCKETS)
        self.responses: dict[int, int] = defaultdict(int)  # HTTP answers by status code

    def render(self, agents_up: int, agents_total: int, running: int, agents=()) -> str:
        """``agents``: the population's handles (state and restarts per agent)."""
        lines: list[str] = []

        def metric(name, kind, help_, samples):
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples)

        with self.lock:
            self._turns_and_episodes(metric)
            self._http(metric)
            _agents(metric, agents)
            self._histograms(metric)
            _process(metric)
            metric("swarm_agents_up", "gauge", "Agents answering now.", [f"swarm_agents_up {agents_up}"])
            metric("swarm_agents", "gauge", "Agents in the population (not removed).", [f"swarm_agents {agents_total}"])
            metric("swarm_episodes_running", "gauge", "Episodes in progress.", [f"swarm_episodes_running {running}"])
        return "\n".join(lines) + "\n"

    def _turns_and_episodes(self, metric) -> None:
        metric("swarm_turns_total", "counter", "Turns decided (auction run).", [f"swarm_turns_total {self.turns}"])
        metric(
            "swarm_skipped_turns_total",
            "counter",
            "Turns nobody acted on.",
            [f"swarm_skipped_turns_total {self.skipped_turns}"],
        )
        metric(
            "swarm_episodes_total",
            "counter",
            "Episodes ended, by status.",
            [f'swarm_episodes_total{{status="{_label(s)}"}} {n}' for s, n in sorted(self.episodes.items())],
        )
        metric(
            "swarm_bids_missed_total",
            "counter",
            "Bids not received within the deadline, per agent.",
            [f'swarm_bids_missed_total{{agent="{_label(a)}"}} {n}' for a, n in sorted(self.missed_bids.items())],
        )
        metric(
            "swarm_agent_failures_total",
            "counter",
            "Failed requests to an agent, per agent and kind.",
            [
                f'swarm_agent_failures_total{{agent="{_label(a)}",kind="{k}"}} {n}'
                for (a, k), n in sorted(self.failures.items())
            ],
        )
        metric(
            "swarm_failovers_total",
            "counter",
            "Turns handed to the next bidder after the winner failed.",
            [f"swarm_failovers_total {self.failovers}"],
        )

    def _http(self, metric) -> None:
        metric(
            "swarm_http_responses_total",
            "counter",
            "HTTP answers of the gateway, by status code.",
            [f'swarm_http_responses_total{{code="{c}"}} {n}' for c, n in sorted(self.responses.items())],
        )
        metric(
            "swarm_http_client_errors_total",
            "counter",
            "4xx answers (bad requests, limits, auth).",
            [f"swarm_http_client_errors_total {sum(n for c, n in self.responses.items() if 400 <= c < 500)}"],
        )
        metric(
            "swarm_http_throttled_total",
            "counter",
            "429 answers (admission limits).",
            [f"swarm_http_throttled_total {self.responses.get(429, 0)}"],
        )

    def _histograms(self, metric) -> None:
        for name, h, help_ in (
            ("swarm_turn_latency_seconds", self.turn_latency, "Bids, auction and action of a turn."),
            ("swarm_gateway_overhead_seconds", self.overhead, "Turn latency beyond the workers' model compute."),
            ("swarm_episode_duration_seconds", self.episode_duration, "Wall time of ended episodes, start to end."),
        ):
            samples = [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(h.buckets, h.counts)]
            samples += [f'{name}_bucket{{le="+Inf"}} {h.n}', f"{name}_sum {h.sum:.6f}", f"{name}_count {h.n}"]
            metric(name, "histogram", help_, samples)


def _agents(metric, agents) -> None:
    """Restarts and the state of each agent."""
    metric(
        "swarm_agent_restarts_total",
        "counter",
        "Worker restarts, per agent.",
        [f'swarm_agent_restarts_total{{agent="{_label(a.name)}"}} {a.restarts}' for a in agents],
    )
    metric(
        "swarm_agent_state",
        "gauge",
        "1 for each agent's current state.",
        [
            f'swarm_agent_state{{agent="{_label(a.name)}",role="{_label(a.role)}",state="{st}"}} {int(a.status == st)}'
            for a in agents
            for st in AGENT_STATES
        ],
    )


def _process(metric) -> None:
    """The gateway process's CPU time."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    metric(
        "process_cpu_seconds_total",
        "counter",
        "CPU time of the gateway process (user + system).",
        [f"process_cpu_seconds_total {ru.ru_utime + ru.ru_stime:.6f}"],
    )
