"""Every queue and topic operation, written once: a generator (a flow) that checks its
arguments, yields the module calls and plain commands it needs (:mod:`rotator.commands`),
and returns the result. No I/O: :class:`rotator.Rotator` runs these flows on a client,
:class:`rotator.aio.AsyncRotator` awaits them, and so do the topic classes.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from rotator import commands, protocol, schedules
from rotator.commands import AfterWake, Ask, ClientCall, Flow, Keys, ModuleCall
from rotator.defaults import (
    DEFAULT_BUDGET,
    DEFAULT_LEASE_TIMEOUT,
    DEFAULT_PREFIX,
    MAX_BATCH,
    MAX_COUNT,
    MAX_PUBLISH,
    MAX_RATE_JOBS,
    MAX_RETENTION_COUNT,
    MAX_RETENTION_SECONDS,
    MAX_TRIM_BUDGET,
    TOPIC_STALE_RETRIES,
)
from rotator.durability import server_warnings
from rotator.errors import GroupsChanged, InvalidArgument, JobCancelled, LeaseLost
from rotator.keys import (
    QueueKeys,
    TopicKeys,
    queue_keys,
    topic_keys,
    validate_group_name,
)
from rotator.models import (
    DeadLetter,
    Durations,
    ItemStats,
    Job,
    NextReply,
    QueueSettings,
    Retention,
    RingEntry,
    Schedule,
    Stats,
    TopicStats,
)
from rotator.protocol import JobRef, chunks

T = TypeVar("T")


class PushMarker(NamedTuple):
    """The marker hash of one push call whose calls are retried, and how long it is kept."""

    key: str
    ttl_ms: int

    def once(self, call: ModuleCall[int], index: int) -> ModuleCall[int]:
        """Push call ``call`` as chunk ``index`` under this marker (``once``)."""
        return commands.once(call, self.key, index, self.ttl_ms)


class QueueFlows:
    """One queue's options and the flows of its operations; see :class:`rotator.Rotator`
    for what each operation means.

    ``keys`` replaces the queue's own keys (a topic group's ring); ``drop_payloads`` says
    whether an accepted ack deletes the job's payload (a topic group's payloads belong to
    the topic's retention, so its acks keep them). ``push_marker_ttl_ms`` (the calls are
    retried, :mod:`rotator.retries`): a plain push goes as ``push_chunk`` under a marker of
    its own kept that long, so that a chunk sent again after a lost reply pushes nothing
    twice.
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float = DEFAULT_LEASE_TIMEOUT,
        idempotency: Any = None,
        max_deliveries: int | None = None,
        budget: int = DEFAULT_BUDGET,
        prefix: str = DEFAULT_PREFIX,
        payloads: bool = False,
        item_stats: bool = False,
        keys: QueueKeys | None = None,
        drop_payloads: bool = True,
        push_marker_ttl_ms: int | None = None,
    ) -> None:
        self.name = name
        self.keys = keys if keys is not None else queue_keys(name, prefix)
        self.timeout = timeout
        self.idempotency = idempotency
        self.payloads = payloads
        self.item_stats = item_stats
        self.lease_ms = protocol.seconds_to_ms(timeout, "timeout")
        self.max_deliveries = protocol.check_max_deliveries(max_deliveries)
        self.budget = protocol.check_budget(budget)
        self.drop_payloads = drop_payloads
        self.push_marker_ttl_ms = push_marker_ttl_ms
        # Payloads or item stats: the queue is called with its extra keys (pushp, nextp, ...).
        self.extended = payloads or item_stats
        self.plain_keys: Keys = self.keys.all
        self.extended_keys: Keys = self.keys.with_items if item_stats else self.keys.with_payloads
        self.batches = protocol.Batches()

    # -- producing -------------------------------------------------------------------------

    def push_many(
        self,
        ids: Iterable[str | int],
        chunk: int,
        due: protocol.Due | None = None,
        unique: bool = False,
        priority: int = 0,
    ) -> Flow[int]:
        raw = protocol.encode_ids(ids)
        size = protocol.whole(chunk, "chunk", 1, MAX_BATCH)
        pushed = 0
        for call in self.push_calls(raw, size, due, unique, priority):
            pushed += yield call
        return pushed

    def push_calls(
        self,
        ids: Sequence[bytes],
        size: int,
        due: protocol.Due | None,
        unique: bool,
        priority: int,
    ) -> Iterator[ModuleCall[int]]:
        """The atomic calls that push ``ids``, ``size`` a call, in order. Where the queue's
        calls are retried, each push call has one marker of its own that counts its chunks,
        so that a chunk sent again after a lost reply pushes nothing twice: a plain push (no
        time, uniqueness, priority or item stats) goes as ``push_chunk``, any other as
        ``once``; a unique push needs none (the id index makes it harmless twice)."""
        marker = self.push_marker(unique)
        plain = due is None and not unique and not priority and not self.item_stats
        keys = self.extended_keys if self.item_stats else self.plain_keys
        for index, part in enumerate(chunks(ids, size)):
            if marker is not None and plain:
                yield commands.push_chunk((*keys, marker.key), index, marker.ttl_ms, part)
                continue
            call = commands.push_ids(
                keys, part, due, priority=priority, unique=unique, item_stats=self.item_stats
            )
            yield marker.once(call, index) if marker is not None else call

    def push_marker(self, unique: bool) -> PushMarker | None:
        """A new push call's marker where the queue's calls are retried, but for a unique
        push (the id index makes it harmless twice); else None."""
        ttl_ms = self.push_marker_ttl_ms
        if ttl_ms is None or unique:
            return None
        return PushMarker(self.keys.push_marker(uuid.uuid4().hex), ttl_ms)

    def cancel(self, ids: Iterable[str | int]) -> Flow[int]:
        found = 0
        for part in chunks(protocol.encode_ids(ids), MAX_BATCH):
            found += yield commands.cancel(self.plain_keys, part)
        return found

    def schedule(
        self, name: str, every: object, cron: object, job_id: object, tz: object
    ) -> Flow[bool]:
        call = schedules.check(name, every=every, cron=cron, job_id=job_id, tz=tz, now=time.time())
        changed: bool = yield commands.schedule(self.plain_keys, b"SET", call)
        return changed

    def schedules(self) -> Flow[list[Schedule]]:
        found: list[Schedule] = yield commands.schedules(self.plain_keys)
        return found

    def unschedule(self, name: str) -> Flow[bool]:
        gone: bool = yield commands.unschedule(self.plain_keys, schedules.check_name(name))
        return gone

    def keep_schedules(self) -> Flow[int]:
        """Gives the cron schedules that run low a fresh window of due times."""
        refilled = 0
        for schedule in (yield from self.schedules()):
            call = schedules.refill(schedule, time.time())
            if call is not None:
                yield commands.schedule(self.plain_keys, b"FILL", call)
                refilled += 1
        return refilled

    def set_rate_limit(self, jobs: int | None, per: float) -> Flow[None]:
        if jobs is None:
            yield commands.rate_limit(self.plain_keys, 0, 1)
            return
        jobs = protocol.whole(jobs, "jobs", 1, MAX_RATE_JOBS)
        per_ms = protocol.seconds_to_ms(per, "per")
        yield commands.rate_limit(self.plain_keys, jobs, per_ms)

    def durations(self, seconds: Iterable[float]) -> Flow[Durations]:
        total_ms, counts = protocol.duration_counts(seconds)
        pairs = [half for bucket in sorted(counts) for half in (bucket, counts[bucket])]
        if pairs:
            pairs.insert(0, total_ms)
        found: Durations = yield commands.durations(self.plain_keys, pairs)
        return found

    def pause(self) -> Flow[bool]:
        paused: bool = yield commands.pause(self.plain_keys)
        return paused

    def resume(self) -> Flow[bool]:
        resumed: bool = yield commands.resume(self.plain_keys)
        return resumed

    def push_payloads(
        self,
        items: Mapping[Any, bytes | str],
        chunk: int,
        due: protocol.Due | None = None,
        unique: bool = False,
    ) -> Flow[int]:
        if not self.payloads:
            raise InvalidArgument("push_payloads needs a queue made with payloads=True")
        if not self.drop_payloads:
            raise InvalidArgument("publish to the topic instead of pushing payloads to a group")
        pairs = [(protocol.encode_id(k), protocol.encode_payload(v)) for k, v in items.items()]
        size = protocol.whole(chunk, "chunk", 1, MAX_BATCH // 2)
        pushed = 0
        marker = self.push_marker(unique)
        for index, part in enumerate(chunks(pairs, size)):
            flat = [half for pair in part for half in pair]
            call = commands.pushp(self.extended_keys, flat, due, unique=unique)
            pushed += yield marker.once(call, index) if marker is not None else call
        return pushed

    # -- consuming -------------------------------------------------------------------------

    def next(
        self,
        count: int,
        block: float | None,
        ack: Iterable[JobRef],
        durations: Iterable[float] = (),
        nacks: Sequence[tuple[Sequence[JobRef], int]] = (),
    ) -> Flow[list[Job]]:
        """The claim of :meth:`rotator.Rotator.next`. ``nacks``: jobs to give back first, as
        ``(jobs, delay_ms)`` groups (a buffering consumer's); their nack calls and the first
        claim go as one :class:`rotator.commands.Together`, in one round trip, each call
        whose reply was an error made again on its own (a nack sent twice gives back
        nothing more). A group with no delay may be claimed again by that very claim."""
        count = protocol.check_count(count)
        refs = list(ack)
        times = protocol.encode_durations(durations) if durations else None  # (first call only)
        acks, packed, _ = self.pack(refs)
        waited = protocol.check_block(block)
        gives = [call for jobs, delay_ms in nacks for call in self.nack_calls(jobs, delay_ms)]
        give_up = None if waited is None else time.monotonic() + waited
        wake_wait: float | None = None
        while True:
            call = self._next_call(count, acks if times is None else [*acks, times])
            times = None
            reply: NextReply
            if gives:  # only ever the first call: it has no wake to wait on
                *_, reply = yield commands.Together((*gives, call))
                gives = []
            else:
                reply = yield (
                    call if wake_wait is None else AfterWake(self.keys.wake, wake_wait, call)
                )
            wake_wait = None
            if packed and reply.acked < len(acks):
                yield from self.ack_refs(refs, pack=False)  # a batch ack was refused
            self.batches.note(reply)
            jobs, acks = yield from self._screen(reply.jobs)
            packed = False
            if jobs:
                if acks:
                    yield from self.ack_refs(acks, pack=True)
                return jobs
            if acks or not reply.idle:
                continue  # send the acks, or look at the rest of the lap
            if give_up is None:
                return []
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return []
            # Until work may be due (a lease deadline or a retry), at the latest.
            wait_ms = reply.wait_ms
            wake_wait = remaining if wait_ms < 0 else min(remaining, wait_ms / 1000)

    def _next_call(self, count: int, acks: list[bytes]) -> commands.ModuleCall[NextReply]:
        head = (count, self.lease_ms, self.budget, self.max_deliveries)
        if not self.extended:
            return commands.next_packed(self.plain_keys, *head, acks)
        return commands.nextp_packed(self.extended_keys, *head, self.drop_payloads, acks)

    def _screen(self, jobs: list[Job]) -> Flow[tuple[list[Job], list[bytes]]]:
        """Splits reclaimed jobs the idempotency callback says are done from the rest."""
        if self.idempotency is None:
            return jobs, []
        keep: list[Job] = []
        finished: list[bytes] = []
        for job in jobs:
            if job.reclaimed and (yield Ask(self.idempotency, job.id)):
                finished.append(protocol.encode_token(job))
            else:
                keep.append(job)
        return keep, finished

    def pack(self, refs: Sequence[JobRef]) -> protocol.PackedAcks:
        """Whole batches as batch acks; named ones where the module drops the payloads of
        what is acked (it needs the ids)."""
        return self.batches.pack_refs(refs, named=self.extended and self.drop_payloads)

    def ack_refs(self, refs: Sequence[JobRef], *, pack: bool) -> Flow[int]:
        if pack:
            args, packed, named = self.pack(refs)
        else:
            args, packed, named = protocol.encode_tokens(refs), False, 0
        drop = self.extended and self.drop_payloads
        keys = self.extended_keys if drop else self.plain_keys
        accepted = 0
        for part in chunks(args, MAX_BATCH):
            accepted += yield commands.ack(keys, part, drop_payloads=drop)
        if not packed:
            return accepted
        if accepted < len(args):
            return (yield from self.ack_refs(refs, pack=False))  # a batch ack was refused
        return named

    def nack(self, refs: Sequence[JobRef], delay: float) -> Flow[int]:
        delay_ms = protocol.seconds_to_ms(delay, "delay", allow_zero=True)
        given_back = 0
        for call in self.nack_calls(refs, delay_ms):
            given_back += yield call
        return given_back

    def nack_calls(self, refs: Sequence[JobRef], delay_ms: int) -> list[ModuleCall[int]]:
        """The calls that give ``refs`` back, ``delay_ms`` (checked) before their return."""
        tokens = protocol.encode_tokens(refs)
        return [
            commands.nack(self.plain_keys, delay_ms, part) for part in chunks(tokens, MAX_BATCH)
        ]

    def fail(self, refs: Sequence[JobRef], error: str, delay: float) -> Flow[int]:
        if not self.item_stats:
            return (yield from self.nack(refs, delay))
        delay_ms = protocol.seconds_to_ms(delay, "delay", allow_zero=True)
        message = protocol.encode_error(error)
        given_back = 0
        for part in chunks(protocol.encode_tokens(refs), MAX_BATCH):
            given_back += yield commands.nackp(self.extended_keys, delay_ms, message, part)
        return given_back

    def bury(self, refs: Sequence[JobRef], error: str) -> Flow[int]:
        message = protocol.encode_error(error)
        # With item stats, the module also records the error as each job's last error.
        keys = self.extended_keys if self.item_stats else self.plain_keys
        buried = 0
        for part in chunks(protocol.encode_tokens(refs), MAX_BATCH):
            buried += yield commands.bury(keys, message, part)
        return buried

    def extend(self, job: JobRef, seconds: float | None) -> Flow[float]:
        (state,), deadline = yield from self._extend([job], seconds)
        if state != 1:
            token = protocol.encode_token(job).decode(errors="replace")
            if state == -1:
                raise JobCancelled(f"the job of lease {token} was cancelled")
            raise LeaseLost(f"lease {token} was lost")
        return deadline

    def extend_many(self, jobs: Iterable[JobRef], seconds: float | None) -> Flow[list[bool]]:
        states, _ = yield from self._extend(list(jobs), seconds)
        return [state == 1 for state in states]

    def _extend(self, jobs: list[JobRef], seconds: float | None) -> Flow[tuple[list[int], float]]:
        lease_ms = self.lease_ms if seconds is None else protocol.seconds_to_ms(seconds, "seconds")
        tokens = protocol.encode_tokens(jobs)
        flags: list[int] = []
        deadline_ms = 0
        for part in chunks(tokens, MAX_BATCH):
            deadline_ms, kept = yield commands.extend(self.plain_keys, lease_ms, part)
            flags.extend(kept)
        return flags, deadline_ms / 1000

    # -- inspecting ------------------------------------------------------------------------

    def server_warnings(self) -> Flow[list[str]]:
        return server_warnings()

    def exists(self) -> Flow[bool]:
        found = yield ClientCall("exists", (self.keys.ring, self.keys.dead, self.keys.scheduled))
        return bool(found)

    def configure(
        self,
        fence_window: float | None,
        fence_max: int | None,
        dead_max: int | None,
        dead_max_age: float | None,
        track_ids: bool | None = None,
    ) -> Flow[QueueSettings]:
        pairs: list[Any] = []
        if track_ids is not None:
            if not isinstance(track_ids, bool):
                raise InvalidArgument(f"track_ids must be True or False, got {track_ids!r}")
            pairs += [b"track_ids", int(track_ids)]
        if fence_window is not None:
            window = protocol.seconds_to_ms(fence_window, "fence_window", limit=30 * 86_400.0)
            pairs += [b"fence_ms", max(window, 1000)]
        if fence_max is not None:
            pairs += [b"fence_max", protocol.whole(fence_max, "fence_max", 1000, 10**9)]
        if dead_max is not None:
            pairs += [b"dead_max", protocol.whole(dead_max, "dead_max", 1, 1_000_000)]
        if dead_max_age is not None:
            age = protocol.seconds_to_ms(dead_max_age, "dead_max_age", limit=3650 * 86_400.0)
            pairs += [b"dead_age_ms", max(age, 1000)]
        settings: QueueSettings = yield commands.configure(self.plain_keys, pairs)
        return settings

    def delete(self, forget: bool) -> Flow[bool]:
        # A topic group's payloads are the topic's: deleting the group leaves them.
        keys = self.keys.with_items if self.drop_payloads else self.keys.all
        deleted: bool = yield commands.delete(keys, forget)
        # The worker registry is no key of the module's: a second call. A worker still
        # running writes its entry again at its next heartbeat, as it should.
        yield ClientCall("unlink", (self.keys.workers,))
        return deleted

    def sweep(self) -> Flow[int]:
        ring = int((yield ClientCall("llen", (self.keys.ring,))))
        leases = int((yield ClientCall("llen", (self.keys.leases,))))
        length = ring + leases
        visited = removed = 0
        while visited < length:
            seen, gone, left = yield commands.sweep(self.plain_keys, self.budget)
            if seen == 0:
                break
            visited += seen
            removed += gone
            # A call that visited the whole ring as it stood has seen everything; this ends a
            # lap early when other consumers are removing elements at the same time.
            if seen >= gone + left + 1:
                break
        return removed

    def item_stats_of(self, ids: Iterable[str | int]) -> Flow[list[ItemStats | None]]:
        if not self.item_stats:
            raise InvalidArgument("item_stats needs a queue made with item_stats=True")
        found: list[ItemStats | None] = []
        for part in chunks(protocol.encode_ids(ids), MAX_BATCH):
            found += yield commands.items(self.extended_keys, part)
        return found

    def stats(self) -> Flow[Stats]:
        reply: Stats = yield commands.stats(self.plain_keys)
        return reply

    def drained(self) -> Flow[bool]:
        """True when nothing is pending, in flight, deferred or scheduled."""
        now: Stats = yield commands.stats(self.plain_keys)
        return now.pending == now.in_flight == now.deferred == now.overdue == now.scheduled == 0

    def peek(self, limit: int) -> Flow[list[RingEntry]]:
        reply: list[RingEntry] = yield commands.peek(self.plain_keys, protocol.check_count(limit))
        return reply

    def dead(self, start: int, limit: int) -> Flow[list[DeadLetter]]:
        start = protocol.whole(start, "start", 0, 10**15)
        limit = protocol.whole(limit, "limit", 1, MAX_COUNT)
        reply: list[DeadLetter] = yield commands.dead(self.plain_keys, start, limit)
        return reply

    def requeue_dead(self, ids: Iterable[str | int], count: int) -> Flow[int]:
        raw = protocol.encode_ids(ids)
        count = protocol.whole(count, "count", 1, MAX_BATCH)
        if len(raw) > MAX_BATCH:
            raise InvalidArgument(f"at most {MAX_BATCH} ids per call")
        # Calls that each examine a bounded stretch of the letters, from the oldest on.
        requeued, start = 0, 0
        while requeued < count and start >= 0:
            step: tuple[int, int] = yield commands.requeue_dead_from(
                self.plain_keys, start, count - requeued, raw
            )
            moved, start = step
            requeued += moved
        return requeued


class QueueView:
    """What the sync and async queue classes show of their queue, read from its flows."""

    _flows: QueueFlows

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.keys.name!r}, timeout={self.timeout})"

    def _make_flows(self, name: str, **options: Any) -> QueueFlows:
        return QueueFlows(name, **options)

    @property
    def name(self) -> str:
        return self._flows.name

    @property
    def keys(self) -> QueueKeys:
        return self._flows.keys

    @property
    def timeout(self) -> float:
        return self._flows.timeout

    @property
    def idempotency(self) -> Any:
        return self._flows.idempotency

    @property
    def payloads(self) -> bool:
        return self._flows.payloads

    @property
    def max_deliveries(self) -> int | None:
        """Deliveries after which a job goes to the dead letters; None: no limit."""
        return self._flows.max_deliveries or None


class GroupView(QueueView):
    """A topic group's ring seen as a queue: the group's keys, payloads read from the
    topic's bodies, and acks that leave them to the topic's retention."""

    group: str
    _topic: TopicKeys

    def _make_flows(self, name: str, **options: Any) -> QueueFlows:
        if options.pop("item_stats", False):
            raise InvalidArgument("topic groups keep no item stats")
        options["payloads"] = True
        return QueueFlows(name, keys=self._topic.group(self.group), drop_payloads=False, **options)


# -- topics -----------------------------------------------------------------------------------


def retention_args(retention: Retention) -> tuple[int, int]:
    """``(MAXLEN, MAXAGE_MS)`` of a retention, 0 meaning no limit; refuses no limit at all."""
    count = (
        0
        if retention.count is None
        else protocol.whole(retention.count, "count", 1, MAX_RETENTION_COUNT)
    )
    age = (
        0
        if retention.age is None
        else protocol.seconds_to_ms(retention.age, "age", limit=MAX_RETENTION_SECONDS)
    )
    if count == 0 and age == 0:
        raise InvalidArgument("retention needs a count, an age or both")
    return count, age


_MESSAGE_ID = re.compile(r"(\d{1,15})-(\d{1,15})")


def message_seq(message_id: str) -> int:
    """The seq of a message id ``<ms>-<seq>``."""
    found = _MESSAGE_ID.fullmatch(message_id) if isinstance(message_id, str) else None
    if not found:
        raise InvalidArgument(f"not a message id (<ms>-<seq>): {message_id!r}")
    return int(found[2])


def start_seq(start: str) -> int | None:
    """The first seq a new group gets from the retained log: None for "latest"."""
    if start == "latest":
        return None
    if start == "earliest":
        return 0
    return message_seq(start)


def time_ms(from_time: object) -> int:
    if isinstance(from_time, bool) or not isinstance(from_time, int | float):
        raise InvalidArgument(f"from_time must be unix seconds, got {from_time!r}")
    return protocol.whole(int(max(from_time, 0) * 1000), "from_time", 0, 10**15)


class TopicFlows:
    """One topic's options and the flows of its operations; see :class:`rotator.Topic`."""

    def __init__(
        self,
        name: str,
        *,
        retention: Retention | None = None,
        prefix: str = DEFAULT_PREFIX,
        publish_marker_ttl_ms: int | None = None,
    ) -> None:
        self.name = name
        self.keys: TopicKeys = topic_keys(name, prefix)
        self.retention = retention if retention is not None else Retention()
        self.max_len, self.max_age_ms = retention_args(self.retention)
        # (the calls are retried, rotator.retries: each publish goes as tpublish_chunk under a
        # marker of its own kept that long, so a chunk sent again publishes nothing twice)
        self.publish_marker_ttl_ms = publish_marker_ttl_ms
        # The KEYS of a call naming every group, as last read: reused until the module says
        # the groups changed (ROTATOR_STALE, nothing written), which it checks on every call.
        self._every_group: Keys | None = None

    def _group_keys(self, group: str) -> Keys:
        return (*self.keys.all, *self.keys.group(group).all)

    def _with_every_group(self, call: Callable[[Keys], ModuleCall[T]]) -> Flow[T]:
        """Makes a call that names every registered group (``call(keys)`` builds it), with the
        groups read the last time; reads them again when they changed meanwhile."""
        for _ in range(TOPIC_STALE_RETRIES):
            keys = self._every_group
            if keys is None:
                names = yield from self.groups()
                keys = (*self.keys.all, *(k for name in names for k in self.keys.group(name).all))
            try:
                reply: T = yield call(keys)
            except GroupsChanged:
                self._every_group = None
                continue
            self._every_group = keys
            return reply
        raise GroupsChanged(f"topic {self.name!r}: groups kept changing during the call")

    def exists(self) -> Flow[bool]:
        found = yield ClientCall("exists", (self.keys.all[0], self.keys.groups))
        return bool(found)

    def groups(self) -> Flow[list[str]]:
        raw = yield ClientCall("hkeys", (self.keys.groups,))
        return sorted(protocol.text(name) for name in raw)

    def subscribe(self, group: str, start: str) -> Flow[bool]:
        validate_group_name(group)
        first = start_seq(start)
        added, last_seq = yield commands.tsubscribe(self._group_keys(group), group)
        self._every_group = None
        # Messages after last_seq reach the group by publishing (0: there were none before).
        if added and first is not None and last_seq > 0:
            yield from self.replay_seqs(group, first, last_seq)
        return bool(added)

    def unsubscribe(self, group: str) -> Flow[bool]:
        validate_group_name(group)
        reply: bool = yield commands.tunsubscribe(self._group_keys(group), group)
        self._every_group = None
        yield ClientCall("unlink", (self.keys.group(group).workers,))  # as QueueFlows.delete
        return reply

    def publish_many(self, payloads: Iterable[bytes | str], chunk: int) -> Flow[list[str]]:
        raw = [protocol.encode_payload(payload) for payload in payloads]
        size = protocol.whole(chunk, "chunk", 1, MAX_PUBLISH)
        ids: list[str] = []
        ttl_ms = self.publish_marker_ttl_ms
        marker = self.keys.publish_marker(uuid.uuid4().hex) if ttl_ms is not None else None
        for index, part in enumerate(chunks(raw, size)):

            def publish(
                keys: Keys, index: int = index, part: Sequence[bytes] = part
            ) -> ModuleCall[list[str]]:
                if marker is None or ttl_ms is None:
                    return commands.tpublish(keys, self.max_len, self.max_age_ms, part)
                return commands.tpublish_chunk(
                    (*keys, marker), index, ttl_ms, self.max_len, self.max_age_ms, part
                )

            ids.extend((yield from self._with_every_group(publish)))
        return ids

    def replay(self, group: str, from_id: str | None, from_time: float | None) -> Flow[int]:
        validate_group_name(group)
        if (from_id is None) == (from_time is None):
            raise InvalidArgument("give exactly one of from_id and from_time")
        if from_id is not None:
            first = message_seq(from_id)
        else:
            first = yield commands.tseek(self.keys.all, time_ms(from_time))
        return (yield from self.replay_seqs(group, first, 0))

    def replay_seqs(self, group: str, first: int, last: int) -> Flow[int]:
        keys = self._group_keys(group)
        pushed = 0
        while True:
            step: tuple[int, int, int] = yield commands.treplay(keys, group, first, last, MAX_BATCH)
            done, first, last = step
            pushed += done
            if first > last or done == 0:
                return pushed

    def trim(self) -> Flow[int]:
        # A long backlog over retention is trimmed call by call, each a few ms of server time.
        dropped = 0
        while True:
            gone: int = yield commands.ttrim(
                self.keys.all, self.max_len, self.max_age_ms, MAX_TRIM_BUDGET
            )
            dropped += gone
            if gone < MAX_TRIM_BUDGET:
                return dropped

    def expired(self, group: str) -> Flow[int]:
        """How many ids the group's backlog bound dropped (its meta's ``expired``)."""
        meta = self.keys.group(group).meta
        raw = yield ClientCall("hget", (meta, "expired"))
        return int(raw or 0)

    def stats(self) -> Flow[TopicStats]:
        return (yield from self._with_every_group(commands.tstats))

    def delete(self) -> Flow[None]:
        for group in (yield from self.groups()):
            yield from self.unsubscribe(group)
        yield ClientCall("delete", self.keys.all)


class TopicView:
    """What the sync and async topic classes show of their topic, read from its flows."""

    _flows: TopicFlows

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, retention={self.retention})"

    @property
    def name(self) -> str:
        return self._flows.name

    @property
    def keys(self) -> TopicKeys:
        return self._flows.keys

    @property
    def retention(self) -> Retention:
        return self._flows.retention

    def group_keys(self, group: str) -> QueueKeys:
        """Group ``group``'s thirteen queue keys."""
        return self.keys.group(group)
