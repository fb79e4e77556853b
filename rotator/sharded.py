"""ShardedRotator: one logical queue over N rotator queues (its shards) on a Redis Cluster.

A queue lives in one slot, so one queue is bounded by one Redis core. A sharded queue is N
ordinary queues, each in a slot of its own, and the same Lua module: nothing here changes
the protocol, and every call is still one atomic single-slot module call.

- **Shard names.** Shard ``k`` of queue ``NAME`` is the queue ``NAME:k.SALT`` (its keys
  ``rotator:{NAME:k.SALT}:...``), SALT the smallest integer that puts its slot in the
  ``k``-th of N equal ranges of the 16384 slots. The names are a pure function of
  ``(NAME, N)``: every client finds the same ones, and they never move when the cluster
  reshards. Evenly spaced slots land evenly on masters that own equal slot ranges (what
  ``redis-cli --cluster create`` and ``--cluster rebalance`` make); :meth:`placement` shows
  where they are. (Picking tags by where the masters are now would not survive a reshard.)
- **Routing.** A job's shard is ``crc32(id) % N``: a pure function of its id, so a push, a
  unique push, a cancel and the ack of a delivery (its token starts with its id) all find
  the one shard that holds it. A Job needs no extra field, and the module no change.
- **Claims** visit the shards from a start that moves one shard on at each call (a random
  first start per consumer), and gather up to ``count`` jobs.
- **Blocking.** A BLPOP cannot span slots. Pushes add up to 16 wake tokens (the shard
  index) to the queue's own wake list (``rotator:{NAME}:wake``, the slot of ``{NAME}``);
  a consumer that found every shard idle blocks there, and starts its next visit at the
  shard the token names. The wait is also bounded by the earliest lease deadline, retry or
  scheduled job any shard reported, so expired leases are reclaimed on time. Tokens are
  never deleted on an idle visit (that cannot be atomic across slots, and a deletion could
  lose a wake-up): a token no consumer needed costs one spurious visit later.
- **Retries.** Cluster errors are retried for at most ``retry_for`` seconds per module call
  (see :mod:`rotator.retries`); MOVED and ASK are followed by redis-py itself.
- **Durability.** With ``durability=``, a durable module call and its WAITAOF (or WAIT)
  go in one pipeline on one connection of the shard's master
  (:func:`rotator.durability.durable_flow`, as for a Rotator on any client): the wait
  counts that connection's writes, so it must go there, not through the cluster client.
- **The layout** (shard count and naming scheme) is stored in ``rotator:{NAME}:shards`` at
  first use (HSETNX) and checked by every client that opens the queue: ShardsMismatch.
- **asyncio.** :class:`rotator.sharded_aio.AsyncShardedRotator` runs the same flows
  (:class:`ShardedFlows`) and retry policy (:class:`rotator.retries.Tries`) on ``redis.asyncio``.
"""

from __future__ import annotations

import random
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, cast

from redis.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.retry import Retry

from rotator import commands, protocol, registry
from rotator.commands import ClientCall, Flow, ModuleCall, Together
from rotator.defaults import (
    DEFAULT_BUDGET,
    DEFAULT_LEASE_TIMEOUT,
    DEFAULT_POLL,
    DEFAULT_PREFIX,
    DEFAULT_PUSH_CHUNK,
    DEFAULT_WORK_BATCH,
    MAX_BATCH,
    MAX_COUNT,
)
from rotator.errors import InvalidToken, ShardsMismatch
from rotator.flows import QueueFlows
from rotator.keys import QueueKeys, queue_keys, validate_queue_name
from rotator.models import (
    DeadLetter,
    Durability,
    Durations,
    Handler,
    Job,
    NextReply,
    QueueSettings,
    Stats,
    WorkSummary,
)
from rotator.protocol import JobRef, When
from rotator.registry import WorkerInfo
from rotator.retries import (
    DEFAULT_RETRY_FOR,
    RetryingSender,
    bounded_options,
    check_retry_for,
    marker_ttl_ms,
)
from rotator.sending import cluster_socket_timeout, wake_wait
from rotator.urls import check_not_sentinel

if TYPE_CHECKING:
    from rotator.core import Rotator

T = TypeVar("T")

# The most shards a queue may have (names are found by trying salts: N^2 CRCs in all).
MAX_SHARDS = 256
# Wake tokens a push adds (and the wake list keeps) at most: idle consumers woken per push.
WAKE_TOKENS = 16
# The naming scheme stored with the queue: shard k in the k-th of N equal slot ranges.
LAYOUT = "slot-ranges-1"

# -- layout and routing --------------------------------------------------------------------


def check_shards(shards: object) -> int:
    return protocol.whole(shards, "shards", 1, MAX_SHARDS)


@cache
def shard_names(name: str, shards: int) -> tuple[str, ...]:
    """The queue names of ``name``'s ``shards`` shards: shard ``k`` is ``name:k.SALT``, SALT
    the smallest integer that puts its slot in the ``k``-th of ``shards`` equal slot ranges
    (stable: a function of the two arguments only)."""
    validate_queue_name(name)
    shards = check_shards(shards)
    names = []
    for k in range(shards):
        low = k * REDIS_CLUSTER_HASH_SLOTS // shards
        high = (k + 1) * REDIS_CLUSTER_HASH_SLOTS // shards
        salt = 0
        while not low <= key_slot(f"{name}:{k}.{salt}".encode()) < high:
            salt += 1
        names.append(validate_queue_name(f"{name}:{k}.{salt}"))
    return tuple(names)


def shard_of_id(job_id: bytes, shards: int) -> int:
    """The shard that holds job ``job_id`` (its encoded bytes): ``crc32(id) % shards``."""
    return zlib.crc32(job_id) % shards


def id_of_ref(ref: JobRef) -> bytes:
    """The job id a delivery names (a Job, or its token)."""
    if isinstance(ref, Job):
        return protocol.encode_id(ref.id)
    found = protocol.parse_token(protocol.text(ref))
    if found is None:
        raise InvalidToken(f"not a delivery token: {protocol.text(ref)[:80]!r}")
    return protocol.encode_id(found[0])


def cluster_client(url: str, **options: Any) -> RedisCluster:
    """A RedisCluster for ``url`` made for :class:`ShardedRotator`: redis-py's own retries off
    (the sharded queue retries within its ``retry_for``) and socket timeouts set
    (:func:`rotator.retries.bounded_options`)."""
    check_not_sentinel(url, "a Redis Cluster")
    return RedisCluster.from_url(url, **bounded_options(options, Retry))


# -- the flows -----------------------------------------------------------------------------


def _sum_stats(parts: Sequence[Stats]) -> Stats:
    """One Stats for the whole queue: counts added, the oldest age the oldest, flags any."""

    def total(field: str) -> int:
        return sum(int(getattr(part, field) or 0) for part in parts)

    def optional(field: str) -> int | None:
        values = [getattr(part, field) for part in parts]
        return None if any(v is None for v in values) else sum(values)

    ages = [part.oldest_pending_age for part in parts if part.oldest_pending_age is not None]
    histograms = [part.durations for part in parts if part.durations is not None]
    durations = None
    if histograms:
        durations = Durations(
            tuple(sum(counts) for counts in zip(*(h.counts for h in histograms), strict=True)),
            sum(h.seconds for h in histograms),
        )
    return Stats(
        length=total("length"),
        pending=total("pending"),
        in_flight=total("in_flight"),
        done=total("done"),
        deferred=total("deferred"),
        dead=total("dead"),
        oldest_pending_age=max(ages) if ages else None,
        overdue=total("overdue"),
        overdue_capped=any(part.overdue_capped for part in parts),
        scheduled=total("scheduled"),
        paused=any(part.paused for part in parts),
        schedules=total("schedules"),
        rate_limit=None,
        prioritized=total("prioritized"),
        pushed=optional("pushed"),
        delivered=optional("delivered"),
        completed=optional("completed"),
        retried=optional("retried"),
        reclaimed=optional("reclaimed"),
        dead_lettered=optional("dead_lettered"),
        cancelled=optional("cancelled"),
        durations=durations,
    )


def layout_key(name: str, prefix: str) -> str:
    """The hash that stores queue ``name``'s shard count and layout (in the slot of {NAME})."""
    return f"{prefix}:{{{name}}}:shards"


def stored_count(name: str, prefix: str) -> Flow[int]:
    """The shard count stored with queue ``name``; ShardsMismatch when it has none."""
    layout = queue_keys(name, prefix)  # validates the name first
    raw = yield ClientCall("hget", (layout_key(name, prefix), "shards"))
    if raw is None:
        raise ShardsMismatch(f"queue {layout.name!r} has no stored shard count")
    return int(raw)


class ShardedFlows:
    """A sharded queue's layout and the flows of its operations (no I/O: run by
    :class:`ShardedRotator` and, awaited, by :class:`rotator.sharded_aio.AsyncShardedRotator`);
    each shard's own calls are its :class:`QueueFlows`."""

    def __init__(
        self,
        name: str,
        shards: int,
        *,
        timeout: float = DEFAULT_LEASE_TIMEOUT,
        idempotency: Any = None,
        max_deliveries: int | None = None,
        budget: int = DEFAULT_BUDGET,
        prefix: str = DEFAULT_PREFIX,
        retry_for: float = DEFAULT_RETRY_FOR,
    ) -> None:
        self.name = name
        self.count = check_shards(shards)
        # The queue's own keys ({NAME}): its wake list, worker registry and layout hash.
        self.keys: QueueKeys = queue_keys(name, prefix)
        self.layout_key = layout_key(name, prefix)
        self.names = shard_names(name, self.count)
        self.shards = [
            QueueFlows(
                shard,
                timeout=timeout,
                idempotency=idempotency,
                max_deliveries=max_deliveries,
                budget=budget,
                prefix=prefix,
            )
            for shard in self.names
        ]
        self.marker_ttl_ms = marker_ttl_ms(retry_for)
        self.start = random.randrange(self.count)  # this consumer's next first shard
        self.wake_cap: float | None = None  # the client's socket timeout bounds a BLPOP
        self.checked = False

    # -- layout ----------------------------------------------------------------------------

    def check_layout(self, store: bool = True) -> Flow[None]:
        """Stores the shard count and layout at first use; refuses another (once per
        instance: a count cannot change under a queue that holds jobs, see the README).
        ``store=False`` (reads, acks, deletes) only compares: a read of a queue that does
        not exist, or no longer does, must not fix its count for the next one of the name."""
        if self.checked:
            return
        if store:
            yield ClientCall("hsetnx", (self.layout_key, "shards", self.count))
            yield ClientCall("hsetnx", (self.layout_key, "layout", LAYOUT))
        stored = yield ClientCall("hmget", (self.layout_key, ["shards", "layout"]))
        if not store and stored == [None, None]:
            return  # nothing stored: nothing to compare with (checked again next time)
        count, layout = (protocol.text(value) if value is not None else "" for value in stored)
        if count != str(self.count) or layout != LAYOUT:
            raise ShardsMismatch(
                f"queue {self.name!r} is stored with {count or '?'} shards (layout "
                f"{layout or '?'}), not {self.count} ({LAYOUT})"
            )
        self.checked = True

    def shard_options(self, k: int) -> dict[str, Any]:
        """What opens shard ``k`` as an ordinary queue (Rotator or AsyncRotator)."""
        flows = self.shards[k]
        return {
            "name": flows.name,
            "timeout": flows.timeout,
            "max_deliveries": flows.max_deliveries or None,
            "budget": flows.budget,
            "prefix": self.keys.ring.split(":{", 1)[0],
        }

    def placement(self, client: Any) -> list[str]:
        """Each shard's master in ``client``'s slot map, ``host:port``, shard 0 first."""
        return [str(client.get_node_from_key(shard.keys.ring).name) for shard in self.shards]

    def of_id(self, job_id: bytes) -> int:
        return shard_of_id(job_id, self.count)

    def by_id(self, ids: Iterable[bytes]) -> dict[int, list[bytes]]:
        groups: dict[int, list[bytes]] = {}
        for job_id in ids:
            groups.setdefault(self.of_id(job_id), []).append(job_id)
        return groups

    def by_ref(self, refs: Iterable[JobRef]) -> dict[int, list[JobRef]]:
        groups: dict[int, list[JobRef]] = {}
        for ref in refs:
            groups.setdefault(self.of_id(id_of_ref(ref)), []).append(ref)
        return groups

    # -- producing -------------------------------------------------------------------------

    def push_many(
        self,
        ids: Iterable[str | int],
        chunk: int,
        *,
        delay: float | None,
        at: When | None,
        unique: bool,
        priority: int,
    ) -> Flow[int]:
        due = protocol.check_due(delay, at)
        priority = protocol.check_priority(priority)
        raw = protocol.encode_ids(ids)
        size = protocol.whole(chunk, "chunk", 1, MAX_BATCH)
        yield from self.check_layout()
        plain = due is None and not priority and not unique
        run = uuid.uuid4().hex  # this push's markers: a retried call pushes nothing twice
        pushed = 0
        woken: dict[int, int] = {}
        rounds: list[list[ModuleCall[int]]] = []  # chunk i of every shard
        for k, part_ids in self.by_id(raw).items():
            shard = self.shards[k]
            marker = shard.keys.push_marker(run)
            for index, part in enumerate(protocol.chunks(part_ids, size)):
                if unique:  # (harmless twice by the id index)
                    pushed += yield commands.push_ids(
                        shard.plain_keys, part, due, priority=priority, unique=True
                    )
                    continue
                if index == len(rounds):
                    rounds.append([])
                if plain:
                    call = commands.push_chunk(
                        (*shard.plain_keys, marker), index, self.marker_ttl_ms, part
                    )
                else:  # scheduled or prioritized: the push command under `once`
                    call = commands.once(
                        commands.push_ids(shard.plain_keys, part, due, priority=priority),
                        marker,
                        index,
                        self.marker_ttl_ms,
                    )
                rounds[index].append(call)
            woken[k] = len(part_ids)
        for calls in rounds:
            # Harmless twice, so sent at once: a round trip per node, not per shard (at
            # most a chunk per shard at a time, so a huge push never builds a huge pipeline).
            replies: list[int] = yield Together(tuple(calls))
            pushed += sum(replies)
        yield from self.wake(woken)
        return pushed

    def wake(self, woken: dict[int, int]) -> Flow[None]:
        """Adds wake tokens naming the shards pushed to (as many as jobs, at most
        WAKE_TOKENS in all), and keeps the list that short."""
        tokens: list[int] = []
        while woken and len(tokens) < WAKE_TOKENS:
            for k in list(woken):
                tokens.append(k)
                woken[k] -= 1
                if woken[k] <= 0:
                    del woken[k]
        if not tokens:
            return
        tokens = tokens[:WAKE_TOKENS]
        length: int = yield ClientCall("lpush", (self.keys.wake, *tokens))
        if length > WAKE_TOKENS:  # (a second round trip only when the list grew past it)
            yield ClientCall("ltrim", (self.keys.wake, 0, WAKE_TOKENS - 1))

    def cancel(self, ids: Iterable[str | int]) -> Flow[int]:
        raw = protocol.encode_ids(ids)
        yield from self.check_layout(store=False)
        found = 0
        for k, part in self.by_id(raw).items():
            found += yield from self.shards[k].cancel(map(protocol.text, part))
        return found

    # -- consuming -------------------------------------------------------------------------

    def next(
        self,
        count: int,
        block: float | None,
        ack: Iterable[JobRef],
        durations: Iterable[float] = (),
    ) -> Flow[list[Job]]:
        count = protocol.check_count(count)
        waited = protocol.check_block(block)
        acks = self.by_ref(ack)
        times = protocol.encode_durations(durations)  # rides on the first call only
        yield from self.check_layout()
        give_up = None if waited is None else time.monotonic() + waited
        start = self.start
        self.start = (start + 1) % self.count
        while True:
            jobs: list[Job] = []
            waits: list[int] = []
            for step in range(self.count):
                k = (start + step) % self.count
                refs = acks.pop(k, [])
                if len(jobs) >= count:
                    if refs:  # acks of shards this claim did not need to visit
                        yield from self.shards[k].ack_refs(refs, pack=True)
                    continue
                found, wait_ms = yield from self.claim(k, count - len(jobs), refs, times)
                times = None
                jobs += found
                if wait_ms >= 0:
                    waits.append(wait_ms)
            if jobs or give_up is None:
                return jobs
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return []
            # Every shard is idle: wait for a push, or until work may be due on one.
            wait = min(remaining, min(waits) / 1000) if waits else remaining
            woken = yield ClientCall("blpop", ([self.keys.wake], wake_wait(wait, self.wake_cap)))
            if woken:
                start = int(woken[1]) % self.count  # the shard that was pushed to first

    def claim(
        self, k: int, count: int, refs: list[JobRef], times: bytes | None
    ) -> Flow[tuple[list[Job], int]]:
        """Shard ``k``'s part of a claim: QueueFlows.next without blocking, that also says
        how soon work may be due there (its idle reply's wait_ms; -1: unknown or none)."""
        shard = self.shards[k]
        acks, packed, _ = shard.pack(refs)
        while True:
            call = shard._next_call(count, acks if times is None else [*acks, times])
            times = None
            reply: NextReply = yield call
            if packed and reply.acked < len(acks):
                yield from shard.ack_refs(refs, pack=False)  # a batch ack was refused
            shard.batches.note(reply)
            jobs, acks = yield from shard._screen(reply.jobs)
            packed = False
            if jobs:
                if acks:
                    yield from shard.ack_refs(acks, pack=True)
                return jobs, -1
            if acks or not reply.idle:
                continue  # send the acks, or look at the rest of the lap
            return [], reply.wait_ms

    def ack(self, refs: Sequence[JobRef]) -> Flow[int]:
        groups = self.by_ref(refs)
        yield from self.check_layout(store=False)
        accepted = 0
        for k, part in groups.items():
            accepted += yield from self.shards[k].ack_refs(part, pack=True)
        return accepted

    def per_shard(
        self, refs: Sequence[JobRef], flow: Callable[[QueueFlows, list[JobRef]], Flow[int]]
    ) -> Flow[int]:
        groups = self.by_ref(refs)
        yield from self.check_layout(store=False)
        done = 0
        for k, part in groups.items():
            done += yield from flow(self.shards[k], part)
        return done

    def nack(self, refs: Sequence[JobRef], delay: float) -> Flow[int]:
        return self.per_shard(refs, lambda shard, part: shard.nack(part, delay))

    def fail(self, refs: Sequence[JobRef], error: str, delay: float) -> Flow[int]:
        return self.per_shard(refs, lambda shard, part: shard.fail(part, error, delay))

    def bury(self, refs: Sequence[JobRef], error: str) -> Flow[int]:
        return self.per_shard(refs, lambda shard, part: shard.bury(part, error))

    def extend(self, job: JobRef, seconds: float | None) -> Flow[float]:
        k = self.of_id(id_of_ref(job))
        yield from self.check_layout(store=False)
        return (yield from self.shards[k].extend(job, seconds))

    def extend_many(self, jobs: Iterable[JobRef], seconds: float | None) -> Flow[list[bool]]:
        refs = list(jobs)
        kept = [False] * len(refs)
        places: dict[int, list[int]] = {}
        for place, ref in enumerate(refs):
            places.setdefault(self.of_id(id_of_ref(ref)), []).append(place)
        yield from self.check_layout(store=False)
        for k, where in places.items():
            flags = yield from self.shards[k].extend_many([refs[i] for i in where], seconds)
            for place, flag in zip(where, flags, strict=True):
                kept[place] = flag
        return kept

    # -- every shard -----------------------------------------------------------------------

    def server_warnings(self) -> Flow[list[str]]:
        return self.shards[0].server_warnings()

    def each(self, flow: Callable[[QueueFlows], Flow[T]], store: bool = False) -> Flow[list[T]]:
        """``flow`` on every shard in turn; their results, shard by shard. ``store``: the
        flow writes settings, so the layout is stored first (see check_layout)."""
        yield from self.check_layout(store)
        found: list[T] = []
        for shard in self.shards:
            found.append((yield from flow(shard)))
        return found

    def pause(self) -> Flow[bool]:
        return any((yield from self.each(lambda shard: shard.pause(), store=True)))

    def resume(self) -> Flow[bool]:
        resumed = any((yield from self.each(lambda shard: shard.resume(), store=True)))
        yield from self.wake(dict.fromkeys(range(self.count), WAKE_TOKENS))
        return resumed

    def configure(
        self,
        fence_window: float | None,
        fence_max: int | None,
        dead_max: int | None,
        dead_max_age: float | None,
        track_ids: bool | None,
    ) -> Flow[QueueSettings]:
        found = yield from self.each(
            lambda shard: shard.configure(
                fence_window, fence_max, dead_max, dead_max_age, track_ids
            ),
            store=True,
        )
        return found[0]

    def exists(self) -> Flow[bool]:
        return any((yield from self.each(lambda shard: shard.exists())))

    def sweep(self) -> Flow[int]:
        return sum((yield from self.each(lambda shard: shard.sweep())))

    def drained(self) -> Flow[bool]:
        return all((yield from self.each(lambda shard: shard.drained())))

    def stats(self) -> Flow[tuple[Stats, list[Stats]]]:
        parts = yield from self.each(lambda shard: shard.stats())
        return _sum_stats(parts), parts

    def durations(self, seconds: Iterable[float]) -> Flow[Durations]:
        """Adds to shard 0's histogram; answers the sum of every shard's."""
        times = list(seconds)
        yield from self.check_layout(store=bool(times))
        parts = [(yield from self.shards[0].durations(times))]
        for shard in self.shards[1:]:
            parts.append((yield from shard.durations(())))
        return Durations(
            tuple(sum(counts) for counts in zip(*(p.counts for p in parts), strict=True)),
            sum(p.seconds for p in parts),
        )

    def dead(self, start: int, limit: int) -> Flow[list[DeadLetter]]:
        start = protocol.whole(start, "start", 0, 10**6)
        limit = protocol.whole(limit, "limit", 1, MAX_COUNT)
        yield from self.check_layout(store=False)
        letters: list[DeadLetter] = []
        for shard in self.shards:
            # Each shard's first start + limit letters hold the ones wanted, oldest first.
            offset = 0
            while offset < start + limit:
                page = yield from shard.dead(offset, min(MAX_COUNT, start + limit - offset))
                letters += page
                offset += len(page)
                if len(page) < MAX_COUNT:
                    break
        letters.sort(key=lambda letter: letter.died_ms)
        return letters[start : start + limit]

    def requeue_dead(self, ids: Iterable[str | int], count: int) -> Flow[int]:
        raw = protocol.encode_ids(ids)
        count = protocol.whole(count, "count", 1, MAX_BATCH)
        yield from self.check_layout()
        groups = self.by_id(raw) if raw else {k: list[bytes]() for k in range(self.count)}
        requeued: dict[int, int] = {}
        for k, part in groups.items():
            if sum(requeued.values()) >= count:
                break
            requeued[k] = yield from self.shards[k].requeue_dead(
                map(protocol.text, part), count - sum(requeued.values())
            )
        yield from self.wake({k: n for k, n in requeued.items() if n})
        return sum(requeued.values())

    def delete(self, forget: bool) -> Flow[bool]:
        deleted = yield from self.each(lambda shard: shard.delete(forget))
        yield ClientCall("unlink", (self.keys.wake,))
        yield ClientCall("unlink", (self.keys.workers,))
        yield ClientCall("unlink", (self.layout_key,))
        self.checked = False
        return any(deleted)


# -- the API -------------------------------------------------------------------------------


class ShardedView:
    """What the sync and async sharded queue classes show of their queue, read from its
    flows, and how both are set up."""

    client: Any
    retry_for: float
    _flows: ShardedFlows

    def _lay_out(
        self, cluster: Any, name: str, shards: int, retry_for: float, **options: Any
    ) -> None:
        self.client = cluster
        self._flows = ShardedFlows(name, shards, retry_for=retry_for, **options)
        self._flows.wake_cap = cluster_socket_timeout(cluster)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, shards={self.shards}, timeout={self.timeout})"

    @property
    def name(self) -> str:
        return self._flows.name

    @property
    def shards(self) -> int:
        return self._flows.count

    @property
    def shard_names(self) -> tuple[str, ...]:
        """The shards' queue names, shard 0 first (each an ordinary rotator queue)."""
        return self._flows.names

    @property
    def keys(self) -> QueueKeys:
        """The queue's own keys (``{NAME}``): its wake list and worker registry live there."""
        return self._flows.keys

    @property
    def timeout(self) -> float:
        return self._flows.shards[0].timeout

    @property
    def idempotency(self) -> Any:
        return self._flows.shards[0].idempotency

    @property
    def max_deliveries(self) -> int | None:
        return self._flows.shards[0].max_deliveries or None

    def shard_of(self, job_id: str | int) -> int:
        """The shard that holds (or would hold) job ``job_id``."""
        return self._flows.of_id(protocol.encode_id(job_id))


class ShardedRotator(ShardedView):
    """One logical queue over ``shards`` rotator queues of a Redis Cluster (see the module
    docstring for the layout, routing and blocking), with the API of :class:`rotator.Rotator`
    for what it offers. Each call of a shard is one atomic module call; an operation on
    many jobs is atomic per shard, not across shards. Order is first in first out within
    a shard, not across them.

    ``retry_for`` (seconds, default 10) bounds how long one module call retries cluster
    errors: CLUSTERDOWN, TRYAGAIN, MASTERDOWN, LOADING, READONLY and connections refused
    or lost while a master fails over. A call that may have run is retried only when
    running it twice is harmless; a plain push goes as ``push_chunk`` with a marker, so a
    retry after a lost reply pushes nothing twice. Beyond ``retry_for`` the error is
    raised. Give a client made by :func:`cluster_client` (``from_url`` does): redis-py's
    own default retries would add up to ten more tries per command.

    ``durability`` (a :class:`rotator.Durability`): as for Rotator, push, ack, nack, bury,
    cancel, requeue_dead, configure, pause, resume and delete return only once each
    shard's writes are confirmed (WAITAOF, or WAIT on Redis before 7.2) by its master's
    AOF and/or replicas; each such call goes with its wait in one pipeline on one
    connection of the shard's master (see :func:`rotator.durability.durable_flow`). A
    write that is not confirmed within ``durability.timeout`` raises NotDurable: it was
    applied, and is not retried; the shards after it in that call are not written. The
    timeout must be shorter than the client's socket timeout. Claims are durable calls
    too, with the acks that ride on them (``next(ack=...)``, which ``work()`` uses): a
    lease the promoted replica never had would be gone after a failover, and a confirmed
    ack of its job would complete nothing there. A claim that raises NotDurable has leased
    its jobs; they come back when their leases run out.

    Options as for Rotator: ``timeout``, ``idempotency``, ``max_deliveries``, ``budget``,
    ``prefix``, ``functions``. ``functions`` defaults to False here (EVALSHA): pushes go in
    cluster pipelines, where redis-py finds each FCALL's keys with a COMMAND GETKEYS sent to
    the client's default node (a round trip more, and a call that fails while that node is
    down); a single FCALL goes to its slot's master (rotator.script.ClusterFunctionCall).
    Not offered on sharded queues (yet): payloads, item stats, schedules, rate
    limits, topics.

    The shard count is stored with the queue at its first use; opening it with another
    count raises ShardsMismatch. ``shards=None`` opens it with the stored count.
    """

    def __init__(
        self,
        cluster: RedisCluster,
        name: str,
        *,
        shards: int | None,
        timeout: float = DEFAULT_LEASE_TIMEOUT,
        idempotency: Callable[[str], bool] | None = None,
        max_deliveries: int | None = None,
        budget: int = DEFAULT_BUDGET,
        prefix: str = DEFAULT_PREFIX,
        functions: bool | None = False,
        retry_for: float = DEFAULT_RETRY_FOR,
        durability: Durability | None = None,
    ) -> None:
        self.retry_for = check_retry_for(retry_for)
        self._sender = RetryingSender(cluster, functions, self.retry_for, durability)
        self.durability = self._sender.durability
        self._run = self._sender.run
        if shards is None:
            shards = self._run(stored_count(name, prefix))
        self._lay_out(
            cluster,
            name,
            shards,
            self.retry_for,
            timeout=timeout,
            idempotency=idempotency,
            max_deliveries=max_deliveries,
            budget=budget,
            prefix=prefix,
        )

    @classmethod
    def from_url(cls, url: str, name: str, *, shards: int | None, **options: Any) -> ShardedRotator:
        """A ShardedRotator on a new :func:`cluster_client` for any node's ``url``."""
        return cls(cluster_client(url), name, shards=shards, **options)

    # -- what it is ------------------------------------------------------------------------

    def placement(self) -> list[str]:
        """Each shard's master now, ``host:port``, shard 0 first (it moves with resharding)."""
        return self._flows.placement(self.client)

    def shard(self, k: int) -> Rotator:
        """Shard ``k`` as an ordinary :class:`rotator.Rotator` (to inspect or drain it; push
        through the sharded queue, so that ids keep to their shards)."""
        from rotator.core import Rotator  # noqa: PLC0415 (only for this view)

        return Rotator(self.client, **self._flows.shard_options(k))

    def server_warnings(self) -> list[str]:
        return self._run(self._flows.server_warnings())

    # -- producing -------------------------------------------------------------------------

    def push(
        self,
        *ids: str | int,
        delay: float | None = None,
        at: When | None = None,
        unique: bool = False,
        priority: int = 0,
    ) -> int:
        """Adds jobs, each to its id's shard, one call per shard (of up to 1000 ids); returns
        how many were pushed. Options as for :meth:`rotator.Rotator.push`. Atomic per
        shard. A push carries a marker of its own per shard, so that a retry after a lost
        reply pushes nothing twice (a plain one as ``push_chunk``, a delayed or prioritized
        one as ``once``); a unique push is idempotent on its own."""
        return self.push_many(ids, delay=delay, at=at, unique=unique, priority=priority)

    def push_many(
        self,
        ids: Iterable[str | int],
        chunk: int = DEFAULT_PUSH_CHUNK,
        *,
        delay: float | None = None,
        at: When | None = None,
        unique: bool = False,
        priority: int = 0,
    ) -> int:
        """``push`` of any number of ids: grouped by shard, calls of ``chunk`` per shard."""
        return self._run(
            self._flows.push_many(ids, chunk, delay=delay, at=at, unique=unique, priority=priority)
        )

    def cancel(self, *ids: str | int) -> int:
        """As :meth:`rotator.Rotator.cancel`, on each id's shard (they must track ids:
        ``configure(track_ids=True)``)."""
        return self._run(self._flows.cancel(ids))

    def keep_schedules(self) -> int:
        """Sharded queues have no schedules: 0 (for the worker loops)."""
        return 0

    def durations(self, *seconds: float) -> Durations:
        """The processing-time histogram of every shard together, after adding ``seconds``."""
        return self._run(self._flows.durations(seconds))

    def pause(self) -> bool:
        """Pauses every shard; True when one was not paused yet."""
        return self._run(self._flows.pause())

    def resume(self) -> bool:
        """Resumes every shard (and wakes blocked consumers); True when one was paused."""
        return self._run(self._flows.resume())

    # -- consuming -------------------------------------------------------------------------

    def next(
        self,
        count: int = 1,
        block: float | None = None,
        *,
        ack: Iterable[JobRef] = (),
        durations: Iterable[float] = (),
    ) -> list[Job]:
        """Leases up to ``count`` jobs, visiting the shards from a start that moves on at
        each call; [] when every shard is empty. ``ack`` rides on the calls of the shards
        visited (the others' acks get a call of their own). With ``block``, waits without
        polling: see the module docstring."""
        return self._run(self._flows.next(count, block, ack, durations))

    def ack(self, *jobs: JobRef) -> int:
        """Completes deliveries, one call per shard; how many were accepted."""
        return self._run(self._flows.ack(jobs))

    def nack(self, *jobs: JobRef, delay: float = 0.0) -> int:
        return self._run(self._flows.nack(jobs, delay))

    def fail(self, *jobs: JobRef, error: str, delay: float = 0.0) -> int:
        return self._run(self._flows.fail(jobs, error, delay))

    def bury(self, *jobs: JobRef, error: str = "") -> int:
        return self._run(self._flows.bury(jobs, error))

    def extend(self, job: JobRef, seconds: float | None = None) -> float:
        return self._run(self._flows.extend(job, seconds))

    def extend_many(self, jobs: Iterable[JobRef], seconds: float | None = None) -> list[bool]:
        return self._run(self._flows.extend_many(jobs, seconds))

    @contextmanager
    def claim(self, block: float | None = None) -> Iterator[Job | None]:
        """As :meth:`rotator.Rotator.claim`."""
        jobs = self.next(1, block)
        if not jobs:
            yield None
            return
        job = jobs[0]
        try:
            yield job
        except BaseException:
            self.nack(job)
            raise
        self.ack(job)

    def work(
        self,
        handler: Handler,
        *,
        concurrency: int = 1,
        stop_when_empty: bool = False,
        batch: int = DEFAULT_WORK_BATCH,
        poll: float = DEFAULT_POLL,
        install_signal_handlers: bool = True,
    ) -> WorkSummary:
        """:meth:`rotator.Rotator.work` over the sharded queue: the same worker loop."""
        from rotator.worker import Worker  # noqa: PLC0415 (the worker builds on this API)

        # The worker uses only what a ShardedRotator shares with a Rotator.
        worker = Worker(
            cast("Rotator", self), handler, concurrency=concurrency, batch=batch, poll=poll
        )
        return worker.run(
            stop_when_empty=stop_when_empty, install_signal_handlers=install_signal_handlers
        )

    # -- inspecting ------------------------------------------------------------------------

    def configure(
        self,
        *,
        fence_window: float | None = None,
        fence_max: int | None = None,
        dead_max: int | None = None,
        dead_max_age: float | None = None,
        track_ids: bool | None = None,
    ) -> QueueSettings:
        """Sets the settings on every shard (``dead_max`` is per shard); returns shard 0's."""
        return self._run(
            self._flows.configure(fence_window, fence_max, dead_max, dead_max_age, track_ids)
        )

    def exists(self) -> bool:
        return self._run(self._flows.exists())

    def delete(self, *, forget: bool = False) -> bool:
        """Deletes every shard (each atomically, not all at once), the wake list, the worker
        registry and the stored shard count."""
        return self._run(self._flows.delete(forget))

    def sweep(self) -> int:
        return self._run(self._flows.sweep())

    def drained(self) -> bool:
        """True when no shard has anything pending, in flight, deferred or scheduled."""
        return self._run(self._flows.drained())

    def stats(self) -> Stats:
        """The shards' counts added up (each shard's read atomically, not all at once)."""
        return self._run(self._flows.stats())[0]

    def shard_stats(self) -> list[Stats]:
        """Each shard's counts, shard 0 first."""
        return self._run(self._flows.stats())[1]

    def dead(self, start: int = 0, limit: int = 100) -> list[DeadLetter]:
        """Dead letters of every shard, oldest first (reads ``start + limit`` per shard)."""
        return self._run(self._flows.dead(start, limit))

    def requeue_dead(self, *ids: str | int, count: int = MAX_BATCH) -> int:
        """Moves dead letters (all, or those of ``ids``) back to their shards as new jobs."""
        return self._run(self._flows.requeue_dead(ids, count))

    # -- workers (rotator.registry): one registry for the whole queue ------------------------

    def workers(self, *, include_stale: bool = False) -> list[WorkerInfo]:
        return self._run(registry.read(self.keys.workers, include_stale))

    def report_worker(self, info: WorkerInfo) -> None:
        self._run(registry.report(self.keys.workers, info))

    def forget_worker(self, worker_id: str) -> bool:
        return self._run(registry.forget(self.keys.workers, worker_id))


__all__ = [
    "ShardedFlows",
    "ShardedRotator",
    "cluster_client",
    "shard_names",
    "shard_of_id",
]
