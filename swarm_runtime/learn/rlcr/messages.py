"""Communication primitives, kept simple (seed: "keep these primitives simple"): direct messages,
a public channel and an archive any agent can write to and search, plus the organisation commands
``hire`` and ``fire``. They are ordinary text actions of the shared policy, parsed here by the core
(never by the domain); any other text is handed to the env as its action.

    say NAME words ...   direct message to agent NAME
    post words ...       public channel
    write words ...      archive entry
    search word ...      archive entries holding any of the words (shown in the next prompt)
    hire words ...       (CEO) hire a specialist whose brief is ``words``
    fire NAME            (CEO) fire agent NAME
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Command verbs; their texts are never passed to the env.
VERBS = ("say", "post", "write", "search", "hire", "fire")
#: Command kinds that count as communication (message tokens), not as work on the env.
MESSAGE_KINDS = ("say", "post", "write", "search", "hire", "fire")


@dataclass(frozen=True)
class Command:
    """A parsed action: ``kind`` is ``env`` (the text goes to the env), one of :data:`VERBS`, or
    ``unparsed`` (a verb missing its argument, or empty text: a counted no-op that costs its time)."""

    kind: str
    target: str | None = None  #: the addressee of ``say`` / the agent to ``fire``
    body: str = ""  #: message text, brief, query, or the env action's text


def parse_command(text: str) -> Command:
    words = text.split()
    if not words:
        return Command("unparsed")
    verb, rest = words[0].lower(), words[1:]
    if verb not in VERBS:
        return Command("env", body=text.strip())
    if verb in ("say", "fire"):
        if not rest or (verb == "say" and len(rest) < 2):
            return Command("unparsed", body=text.strip())
        return Command(verb, target=rest[0].lower(), body=" ".join(rest[1:]))
    if verb in ("post", "write", "search") and not rest:
        return Command("unparsed", body=text.strip())
    return Command(verb, body=" ".join(rest))


@dataclass(frozen=True)
class Message:
    t: float  #: simulated second it was delivered
    sender: str
    text: str

    def render(self, verb: str = "") -> str:
        return f"{self.sender} {verb + ' ' if verb else ''}{self.text}"


@dataclass
class Board:
    """Inboxes, the public channel and the archive of one rollout. :meth:`view` returns what an
    agent has not seen since its last action (and marks it seen)."""

    inbox: dict[str, list[Message]] = field(default_factory=dict)
    channel: list[Message] = field(default_factory=list)
    archive: list[Message] = field(default_factory=list)
    found: dict[str, list[Message]] = field(default_factory=dict)
    _seen: dict[str, int] = field(default_factory=dict)

    def say(self, t: float, sender: str, to: str, text: str) -> None:
        self.inbox.setdefault(to, []).append(Message(t, sender, text))

    def post(self, t: float, sender: str, text: str) -> None:
        self.channel.append(Message(t, sender, text))

    def write(self, t: float, sender: str, text: str) -> None:
        self.archive.append(Message(t, sender, text))

    def search(self, agent: str, query: str, limit: int = 2) -> int:
        """Archive entries sharing a word with ``query`` (newest first, at most ``limit``) are shown
        to ``agent`` in its next prompt; returns how many were found."""
        q = set(query.lower().split())
        hits = [m for m in reversed(self.archive) if q & set(m.text.lower().split())][:limit]
        self.found[agent] = hits
        return len(hits)

    def view(self, agent: str, window: int) -> tuple[list[Message], list[Message], list[Message]]:
        """``(inbox, channel, found)`` new to ``agent`` since its last action (the last ``window`` of
        each; the channel without the agent's own posts), then marked as seen."""
        inbox = self.inbox.pop(agent, [])
        start = self._seen.get(agent, 0)
        channel = [m for m in self.channel[start:] if m.sender != agent]
        self._seen[agent] = len(self.channel)
        found = self.found.pop(agent, [])
        return inbox[-window:], channel[-window:], found[-window:]
