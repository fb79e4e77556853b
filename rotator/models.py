"""The values rotator hands back and the options it takes: immutable records, nothing
clever."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from rotator.defaults import DEFAULT_TOPIC_RETENTION, DURATION_BUCKETS
from rotator.errors import InvalidArgument


class Job(NamedTuple):
    """One delivery of a job.

    ``token`` (``<id>*<deadline>.<deliveries>.<seq>``) names this delivery only: ack, nack
    and extend take it, so a consumer whose lease was re-issued cannot complete the new one.
    A NamedTuple rather than a dataclass: a batch of 1000 is built per call, and a tuple is
    built several times faster than a frozen dataclass.
    """

    id: str
    token: str
    deliveries: int
    reclaimed: bool
    deadline_ms: int
    payload: bytes | None = None  # with payloads on: the job's payload (None when it has none)

    def __str__(self) -> str:
        return self.token


# What a worker runs for each job: its return acks the job, an exception retries it.
Handler = Callable[[Job], Any]
AsyncHandler = Callable[[Job], Awaitable[Any]]


# The Stats fields the module counts since the queue was made (each has a rate: jobs per
# second between two reads).
COUNTER_FIELDS = (
    "pushed",
    "delivered",
    "completed",
    "retried",
    "reclaimed",
    "dead_lettered",
    "cancelled",
)


@dataclass(frozen=True, slots=True)
class Stats:
    """A queue's counts, in jobs: ``length`` is the sum of the five that follow it
    (``overdue`` included), the dead letters apart."""

    length: int
    pending: int  # pushed, never leased
    in_flight: int  # leased, its deadline not passed
    done: int  # acked, its element not yet removed (by the next walk that reaches it)
    deferred: int  # given back (nacked), waiting for its delay or for the walk to reach it
    dead: int  # dead letters
    oldest_pending_age: float | None  # seconds, None when nothing is pending
    # Leased past its deadline and not yet reclaimed, counted from the lease list's tail (at
    # most 100 leases, 1000 jobs: ``overdue_capped`` then says it is a lower bound).
    overdue: int = 0
    overdue_capped: bool = False
    # Pushed for later (``push(..., delay=)``/``at=``), not yet queued (a due one is, at the
    # next claim): apart from ``length``.
    scheduled: int = 0
    paused: bool = False  # leases nothing until resumed (``pause``)
    schedules: int = 0  # recurring schedules (``schedule``)
    rate_limit: RateLimit | None = None  # ``set_rate_limit``; None: no limit
    # Of ``pending``, the jobs pushed with a priority from 1, waiting behind the others.
    prioritized: int = 0
    # Counts since the queue was made (``delete`` starts them again), kept by the module in
    # the call that does each thing, so they never disagree with the queue; None where not
    # reported (a topic group's stats).
    pushed: int | None = None  # ids pushed (and moved from the schedule or the dead letters)
    delivered: int | None = None  # deliveries, first ones and later ones
    completed: int | None = None  # jobs acked and removed
    retried: int | None = None  # jobs given back (nack)
    reclaimed: int | None = None  # expired leases leased again
    dead_lettered: int | None = None  # dead letters written
    cancelled: int | None = None  # jobs cancelled (``cancel``)
    durations: Durations | None = None  # the processing-time histogram (``Rotator.durations``)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Durations:
    """A queue's histogram of processing times, across every worker that reports to it:
    ``counts[0]`` jobs took under 1 ms, ``counts[b]`` from 2^(b-1) to 2^b ms, the last
    from 2^24 ms (4.7 hours) on. Quantiles are the upper bound of their bucket (within a
    factor of 2), in seconds; None before any job was reported."""

    counts: tuple[int, ...]
    seconds: float = 0.0  # what the jobs took together

    @property
    def total(self) -> int:
        return sum(self.counts)

    @staticmethod
    def upper_bound(bucket: int) -> float:
        """Seconds: the most a job counted in ``bucket`` took (inf for the last)."""
        return math.inf if bucket >= DURATION_BUCKETS - 1 else 2.0**bucket / 1000

    def quantile(self, q: float) -> float | None:
        total = self.total
        if total == 0:
            return None
        seen = 0
        for bucket, count in enumerate(self.counts):
            seen += count
            if seen >= q * total:
                return self.upper_bound(bucket)
        return math.inf

    @property
    def p50(self) -> float | None:
        return self.quantile(0.5)

    @property
    def p95(self) -> float | None:
        return self.quantile(0.95)

    @property
    def p99(self) -> float | None:
        return self.quantile(0.99)


def duration_bucket(seconds: float) -> int:
    """The bucket of :class:`Durations` a job of ``seconds`` falls in."""
    ms = seconds * 1000
    if not ms >= 1:  # (NaN and negatives too: under 1 ms)
        return 0
    return min(int(math.log2(ms)) + 1, DURATION_BUCKETS - 1)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``jobs`` leased per ``per`` seconds across every consumer of a queue (a burst
    of ``jobs``, then one every ``per / jobs`` seconds)."""

    jobs: int
    per: float


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring schedule (``Rotator.schedule``): each tick pushes one job
    ``"<job_id>@<tick ms>"``."""

    name: str
    spec: str  # the cron expression, or "every <seconds>s"
    next_due: float | None  # unix seconds of the next tick; None: a cron schedule ran out
    last_run: float | None  # unix seconds of the last tick (its job's time), None before one
    job_id: str
    every: float | None = None  # seconds, for an interval schedule
    cron: str | None = None
    tz: str | None = None  # the cron expression's time zone; None: UTC
    dues_left: int | None = None  # due times a cron schedule holds (worker loops add more)
    dues_until: float | None = None  # unix seconds of the last of them

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ItemStats:
    """One job's stats (``stats=True``), kept from its push until it is acked."""

    enqueued_ms: int | None  # None when it was pushed without stats
    deliveries: int
    last_delivery_ms: int | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class RingEntry:
    """An element of the ring as ``peek`` sees it."""

    element: str
    state: str  # lap, pending, leased, done, deferred or corrupt
    time_ms: int  # lease deadline or nack due time; 0 when there is none


@dataclass(frozen=True, slots=True)
class RingPage:
    """One ``scan`` call's elements of the ring, and where the next call starts."""

    next: int  # the offset from the tail to scan from next (the STOP given: done)
    length: int  # the ring's length when this page was read
    version: tuple[int, int]  # (seq, pushed): unchanged between pages, nothing moved
    entries: list[RingEntry]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A job that left the ring without being acked, and why."""

    id: str  # the job id, or the raw element for a corrupt one
    reason: str  # max_deliveries, failed (bury) or corrupt
    deliveries: int
    died_ms: int
    element: str
    error: str | None = None  # what the last delivery failed with (reason failed)


class NextReply(NamedTuple):
    """What one `next` script call answered (a tuple: one is made per call)."""

    idle: bool
    wait_ms: int
    acked: int
    jobs: list[Job]
    # The call's batch of first deliveries as the reply named it ("<deadline>.1.<seq>") and
    # its size; "" when the reply did not say (its jobs then tell, see Batches.note).
    batch: bytes = b""
    batch_jobs: int = 0
    # The batch's packed element as the reply sent it ("*<deadline>.1.<seq>*<id>*<id>..."):
    # what a named batch ack sends back. Kept from payload replies only, the ones whose whole
    # batches are acked by name (b"" otherwise).
    element: bytes = b""


@dataclass(frozen=True, slots=True)
class Retention:
    """How much a topic keeps: at most ``count`` messages and/or none older than ``age``
    seconds. At least one must be set, so the topic's memory is bounded (checked when a
    topic is made with it)."""

    count: int | None = DEFAULT_TOPIC_RETENTION
    age: float | None = None


@dataclass(frozen=True, slots=True)
class TopicStats:
    """A topic's counts, read in one atomic call."""

    retained: int  # messages in the log (and payloads kept)
    bytes: int  # payload bytes retained
    last_seq: int  # seq of the last message published (0 before the first)
    groups: dict[str, Stats] = field(default_factory=dict)  # backlog = Stats.pending


@dataclass(frozen=True, slots=True)
class Discovered:
    """The queues and topics found on a server, each sorted (see :mod:`rotator.discovery`)."""

    queues: tuple[str, ...]
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WorkSummary:
    """What a worker loop did. ``processed``, ``failed`` and ``leases_lost`` count
    deliveries; ``retried`` and ``dead`` count jobs."""

    processed: int  # handler returned and the ack was sent (jobs completed)
    failed: int  # deliveries whose handler raised (each given back, or dead-lettered)
    leases_lost: int  # leases another consumer took over while the handler ran
    retried: int = 0  # jobs given back for another delivery after a failure, each once
    dead: int = 0  # jobs that failed their last allowed delivery: gone to the dead letters
    cancelled: int = 0  # of leases_lost, those whose job was cancelled (``Rotator.cancel``)

    @property
    def completed(self) -> int:
        """Jobs whose handler returned, acked."""
        return self.processed


@dataclass(frozen=True, slots=True)
class Durability:
    """What a push, ack or nack must reach before the call returns.

    ``local_aof``: fsynced to the server's own append-only file (needs ``appendonly yes``:
    a server with WAITAOF and the AOF off raises DurabilityUnavailable, nothing written).
    ``replicas``: acknowledged by (with ``local_aof``, fsynced on) this many replicas.
    ``timeout``: seconds to wait for that. With ``appendfsync everysec`` a server confirms a
    write at its next sync, up to a second later (Redis 7.2 and later, and replicas), so the
    default leaves a second more than that; with ``appendfsync always``, at once.
    """

    local_aof: bool = True
    replicas: int = 0
    timeout: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise InvalidArgument(f"replicas must be a whole number, got {self.replicas!r}")
        if self.replicas < 0 or not (self.local_aof or self.replicas):
            raise InvalidArgument("ask for local_aof, or for at least one replica")
        if not math.isfinite(self.timeout) or self.timeout <= 0:
            raise InvalidArgument(f"timeout must be positive and finite, got {self.timeout!r}")


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's settings, kept on the server (see :meth:`rotator.Rotator.configure`)."""

    fence_window: float  # seconds a refused token (re-leased, nacked, ...) stays refused
    fence_max: int  # refused tokens remembered at most
    dead_max: int  # dead letters kept (the newest)
    dead_max_age: float | None  # seconds a dead letter is kept; None: no age limit
    track_ids: bool = False  # keeps an index of its ids: unique pushes and cancel
