"""What the dashboard shows, read from the server and shaped as JSON.

Reads go through the async API (:class:`rotator.aio.AsyncRotator`, :class:`AsyncTopic`)
and :func:`rotator.discovery.find_async`: one SCAN over the keyspace in bounded steps, never
KEYS. Every queue's counts are one ``stats`` call (O(1) on the server); a queue's page adds
``peek``, ``dead`` and ``schedules``. Rates are not read: they are the change of the module's
counters between two readings, divided by the seconds between them. A counter the module
does not report (``None`` in :class:`Stats`) has no rate and is shown as absent, never as 0.
No web framework here.

A sharded queue (:mod:`rotator.sharded`, found by discovery under its logical name) is read
through :class:`rotator.sharded_aio.AsyncShardedRotator` on the same client: its counts are
``stats()``, every shard's added up (one ``stats`` call per shard, each atomic, not all at
once), and its page adds ``shard_stats()``, ``placement()`` (the client's slot map: no round
trip) and ``dead()``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import RedisClusterException

from rotator.aio import AsyncRotator, AsyncTopic
from rotator.defaults import DEFAULT_PREFIX
from rotator.discovery import Found, find_async, layout_count
from rotator.errors import RotatorError
from rotator.keys import validate_queue_name
from rotator.models import (
    COUNTER_FIELDS,
    DeadLetter,
    Discovered,
    RingEntry,
    Schedule,
    Stats,
    TopicStats,
)
from rotator.sharded import layout_key
from rotator.sharded_aio import AsyncShardedRotator

T = TypeVar("T")

COUNTERS = COUNTER_FIELDS  # the module's counters: each has a rate, jobs per second
# Queues (or topics) read at once during one poll.
READ_CONCURRENCY = 16
# Ring elements and dead letters a queue's page shows.
PEEK_LIMIT = 10
DEAD_LIMIT = 50
# Queue and topic objects kept between polls (each remembers how it calls the module);
# beyond this many the cache starts again, so names asked for in URLs cannot grow it.
CACHE_LIMIT = 4096
# Quantiles of the processing time shown and exported.
QUANTILES = (0.5, 0.95, 0.99)
# Seconds a sharded queue's reading retries cluster errors: none, like every other reading
# (the next poll reads again); its actions keep AsyncShardedRotator's default.
READ_RETRY_FOR = 0.0
# What a read that could not reach the server raises (a cluster client's own errors, such as
# no node reachable, are no RedisError).
UNREACHABLE = (redis.RedisError, RedisClusterException, OSError)


def backlog(stats: Stats) -> int:
    """Jobs waiting for a worker: pending, deferred (nacked) and overdue (lease run out)."""
    return stats.pending + stats.deferred + stats.overdue


# -- processing time (the histogram the module does not keep yet) -------------------------------


@dataclass(frozen=True, slots=True)
class Durations:
    """A queue's processing-time histogram: ``buckets`` are (upper bound in seconds, jobs that
    took at most that long), cumulative and ascending, the last bound ``math.inf``; ``total``
    is the sum of the durations, in seconds."""

    buckets: tuple[tuple[float, int], ...]
    total: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1] if self.buckets else 0

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile, interpolated within its bucket as Prometheus's
        ``histogram_quantile`` does; None with no jobs. In the +Inf bucket: the highest
        finite bound."""
        if self.count == 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower
                if cumulative == below:
                    return bound
                return lower + (bound - lower) * (rank - below) / (cumulative - below)
            lower, below = bound, cumulative
        return lower


def durations_of(stats: Stats) -> Durations | None:
    """The queue's processing-time histogram (``Stats.durations``: the module's buckets,
    which the worker loops add to), cumulative as Prometheus has it; None where the module
    reports none (a topic group) or no job was reported yet (absent, never zeros)."""
    found = stats.durations
    if found is None or not found.total:
        return None
    buckets, seen = [], 0
    for bucket, count in enumerate(found.counts):
        seen += count
        buckets.append((found.upper_bound(bucket), seen))
    return Durations(tuple(buckets), found.seconds)


# -- readings and rates ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reading:
    """One queue's stats and when they were read (unix seconds, this machine's clock)."""

    at: float
    stats: Stats


def rates(before: Reading | None, after: Reading) -> dict[str, float | None]:
    """Jobs per second of each counter between two readings, and ``backlog``: how fast the
    backlog grew (negative: shrank). None for a counter the module does not report, for the
    first reading, and for a counter that went down (the queue was deleted and made again)."""
    found: dict[str, float | None] = dict.fromkeys((*COUNTERS, "backlog"))
    if before is None or after.at <= before.at:
        return found
    seconds = after.at - before.at
    for name in COUNTERS:
        old, new = getattr(before.stats, name), getattr(after.stats, name)
        if old is not None and new is not None and new >= old:
            found[name] = (new - old) / seconds
    found["backlog"] = (backlog(after.stats) - backlog(before.stats)) / seconds
    return found


def add_rates(into: dict[str, float | None], more: dict[str, float | None]) -> None:
    """Sums rates; a total stays None only while every queue's is."""
    for name, value in more.items():
        if value is not None:
            into[name] = (into.get(name) or 0.0) + value


def stats_json(stats: Stats) -> dict[str, Any]:
    found = stats.as_dict()
    found.pop("durations", None)  # shown as percentiles instead (see durations_json)
    found["backlog"] = backlog(stats)
    return found


def durations_json(stats: Stats) -> dict[str, Any] | None:
    durations = durations_of(stats)
    if durations is None:
        return None
    found: dict[str, Any] = {f"p{round(q * 100)}": durations.quantile(q) for q in QUANTILES}
    found["count"] = durations.count
    found["mean"] = durations.total / durations.count if durations.count else None
    return found


def element_id(element: str) -> str:
    """The job id an element of the ring names ("" for the lap sentinel)."""
    return "" if element.startswith("*") else element.partition("*")[0]


def raw_letter(letter: DeadLetter) -> str:
    """The dead letter as the list holds it (``<reason>*<deliveries>*<ms>*<element>``): what
    names one letter exactly, for deleting it."""
    return f"{letter.reason}*{letter.deliveries}*{letter.died_ms}*{letter.element}"


def entry_json(entry: RingEntry) -> dict[str, Any]:
    return {
        "id": element_id(entry.element),
        "element": entry.element,
        "state": entry.state,
        "time_ms": entry.time_ms or None,
    }


def letter_json(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "reason": letter.reason,
        "deliveries": letter.deliveries,
        "died_ms": letter.died_ms,
        "error": letter.error,
        "letter": raw_letter(letter),
    }


def schedule_json(schedule: Schedule) -> dict[str, Any]:
    return schedule.as_dict()


def topic_json(name: str, stats: TopicStats | RotatorError) -> dict[str, Any]:
    if isinstance(stats, RotatorError):
        return {"name": name, "error": str(stats)}
    groups = [
        {"name": group, "backlog": backlog(s), **stats_json(s)}
        for group, s in sorted(stats.groups.items())
    ]
    return {
        "name": name,
        "error": None,
        "retained": stats.retained,
        "bytes": stats.bytes,
        "last_seq": stats.last_seq,
        "backlog": sum(g["backlog"] for g in groups),
        "groups": groups,
    }


# -- reading the server ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Overview:
    """Every queue's and topic's counts, read at ``at`` (a queue or topic whose keys are
    broken is there with its error)."""

    at: float
    queues: dict[str, Stats | RotatorError]  # a sharded queue's: its shards' added up
    topics: dict[str, TopicStats | RotatorError]
    shards: dict[str, int] = field(default_factory=dict)  # sharded queue -> its shard count


@dataclass(frozen=True, slots=True)
class ShardRow:
    """One shard of a sharded queue: its index, its queue name, the master holding its slot
    (``host:port``; None off a cluster) and its own counts."""

    index: int
    name: str
    node: str | None
    stats: Stats


@dataclass(frozen=True, slots=True)
class QueueDetail:
    """What a queue's page shows beyond its counts (a sharded queue: its shards; it shows
    no peek and no schedules, which sharded queues do not offer)."""

    at: float
    name: str
    exists: bool
    stats: Stats
    peek: list[RingEntry]
    dead: list[DeadLetter]
    schedules: list[Schedule]
    shards: tuple[ShardRow, ...] | None = None  # None: an ordinary queue


class Reader:
    """Reads queues and topics on one ``redis.asyncio`` client: a server's, or a cluster's
    (discovery then scans every primary, and each queue is read on its own node)."""

    def __init__(self, client: Any, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.prefix = prefix
        self._queues: dict[str, AsyncRotator] = {}
        self._topics: dict[str, AsyncTopic] = {}
        self._sharded: dict[tuple[str, int], AsyncShardedRotator] = {}

    def queue(self, name: str) -> AsyncRotator:
        """The queue ``name`` (InvalidQueueName for a name rotator never makes)."""
        found = self._queues.get(name)
        if found is None:
            found = AsyncRotator(self.client, name, prefix=self.prefix)
            if len(self._queues) >= CACHE_LIMIT:
                self._queues.clear()
            self._queues[name] = found
        return found

    def topic(self, name: str) -> AsyncTopic:
        found = self._topics.get(name)
        if found is None:
            found = AsyncTopic(self.client, name, prefix=self.prefix)
            if len(self._topics) >= CACHE_LIMIT:
                self._topics.clear()
            self._topics[name] = found
        return found

    def sharded(
        self, name: str, shards: int, *, retry_for: float | None = None
    ) -> AsyncShardedRotator:
        """Sharded queue ``name`` of ``shards`` shards: the one kept between polls to read it
        (its first call checks the stored layout: ShardsMismatch if the count is another
        now), or a new one that retries for ``retry_for`` seconds (an action)."""
        cluster = cast("AsyncRedisCluster", self.client)  # its flows run on any client
        if retry_for is not None:
            return AsyncShardedRotator(
                cluster, name, shards=shards, prefix=self.prefix, retry_for=retry_for
            )
        found = self._sharded.get((name, shards))
        if found is None:
            found = AsyncShardedRotator(
                cluster, name, shards=shards, prefix=self.prefix, retry_for=READ_RETRY_FOR
            )
            if len(self._sharded) >= CACHE_LIMIT:
                self._sharded.clear()
            self._sharded[name, shards] = found
        return found

    async def stored_shards(self, name: str) -> int | None:
        """The shard count stored with sharded queue ``name`` (one HMGET of its layout hash),
        or None: no sharded queue has that name."""
        key = layout_key(validate_queue_name(name), self.prefix)
        return layout_count(await self.client.hmget(key, ["shards", "layout"]))

    async def discover(self) -> Found:
        """Every queue, sharded queue and topic on the server or cluster: SCAN, never KEYS
        (see rotator.discovery)."""
        return await find_async(self.client, prefix=self.prefix)

    async def overview(self, found: Discovered) -> Overview:
        """The counts of every queue, sharded queue and topic in ``found``, read
        concurrently, queues sorted by name (a sharded queue's name names it, should an
        ordinary queue have the same)."""
        at = time.time()
        shards = {q.name: q.shards for q in found.sharded} if isinstance(found, Found) else {}
        queues, summed, topics = await asyncio.gather(
            gather_errors(lambda name: self.queue(name).stats(), found.queues),
            gather_errors(lambda name: self.sharded(name, shards[name]).stats(), list(shards)),
            gather_errors(lambda name: self.topic(name).stats(), found.topics),
        )
        every = dict(zip(found.queues, queues, strict=True))
        every.update(zip(shards, summed, strict=True))
        return Overview(
            at,
            {name: every[name] for name in sorted(every)},
            dict(zip(found.topics, topics, strict=True)),
            shards,
        )

    async def detail(self, name: str) -> QueueDetail:
        """One queue's counts, next elements, dead letters and schedules (read one after
        another: they may disagree by what happened between the reads); a sharded queue's
        counts, shards and dead letters."""
        shards = await self.stored_shards(name)
        if shards is not None:
            return await self.sharded_detail(name, shards)
        q = self.queue(name)
        at = time.time()
        stats = await q.stats()
        exists = await q.exists()
        peek = await q.peek(PEEK_LIMIT) if exists else []
        dead = await q.dead(0, DEAD_LIMIT) if stats.dead else []
        schedules = await q.schedules() if stats.schedules else []
        return QueueDetail(at, name, exists, stats, peek, dead, schedules)

    async def sharded_detail(self, name: str, shards: int) -> QueueDetail:
        """A sharded queue's counts (every shard's added up), each shard's, where each shard
        is, and its dead letters (every shard's, oldest first), read one after another. It
        exists while its layout is stored."""
        q = self.sharded(name, shards)
        at = time.time()
        stats = await q.stats()
        parts = await q.shard_stats()
        nodes: list[str | None] = [None] * q.shards
        if isinstance(self.client, AsyncRedisCluster):
            nodes = list(await q.placement())
        dead = await q.dead(0, DEAD_LIMIT) if stats.dead else []
        rows = tuple(
            ShardRow(k, shard, node, part)
            for k, (shard, node, part) in enumerate(zip(q.shard_names, nodes, parts, strict=True))
        )
        return QueueDetail(at, name, True, stats, [], dead, [], rows)


async def gather_errors(
    read: Callable[[str], Awaitable[T]], names: Sequence[str]
) -> list[T | RotatorError]:
    """``read(name)`` for each name, at most READ_CONCURRENCY at once; a RotatorError (a key
    of the wrong type, say) is that name's result instead of failing the rest."""
    limit = asyncio.Semaphore(READ_CONCURRENCY)

    async def one(name: str) -> T | RotatorError:
        async with limit:
            try:
                return await read(name)
            except RotatorError as error:
                return error

    return list(await asyncio.gather(*(one(name) for name in names)))


def shard_json(row: ShardRow) -> dict[str, Any]:
    return {"index": row.index, "name": row.name, "node": row.node, "stats": stats_json(row.stats)}


def detail_json(detail: QueueDetail, queue_rates: dict[str, float | None]) -> dict[str, Any]:
    shards = detail.shards
    return {
        "at": detail.at,
        "name": detail.name,
        # "kind" names the snapshot (the queue page's); this says what sort of queue it is
        "queue_kind": "queue" if shards is None else "sharded",
        "shards": None if shards is None else [shard_json(row) for row in shards],
        "exists": detail.exists,
        "stats": stats_json(detail.stats),
        "rates": queue_rates,
        "durations": durations_json(detail.stats),
        "peek": [entry_json(e) for e in detail.peek],
        "dead": [letter_json(d) for d in detail.dead],
        "dead_shown": len(detail.dead),
        "schedules": [schedule_json(s) for s in detail.schedules],
    }


def queue_row_json(
    name: str,
    stats: Stats | RotatorError,
    queue_rates: dict[str, float | None],
    shards: int | None = None,
) -> dict[str, Any]:
    """An overview row; ``shards``: the shard count of a sharded queue (None: ordinary)."""
    kind = {"name": name, "kind": "queue" if shards is None else "sharded", "shards": shards}
    if isinstance(stats, RotatorError):
        return {**kind, "error": str(stats)}
    return {**kind, "error": None, "stats": stats_json(stats), "rates": queue_rates}
