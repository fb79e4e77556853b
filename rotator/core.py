"""Rotator: the synchronous API over one queue.

Every method is one or a few calls of the Lua module; each call is atomic on the server. The
policy that needs no atomicity lives here: the idempotency callback, blocking waits, retries.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis.cluster import RedisCluster

from rotator import protocol
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
from rotator.durability import Durability, server_warnings, wait_durable
from rotator.errors import InvalidArgument, LeaseLost
from rotator.keys import QueueKeys, queue_keys
from rotator.models import DeadLetter, ItemStats, Job, NextReply, RingEntry, Stats
from rotator.protocol import JobRef
from rotator.script import module_caller, module_command, not_loaded, pipeline_reply, run
from rotator.server import EmbeddedServer
from rotator.worker import Handler, Worker, WorkSummary

Client = redis.Redis | RedisCluster
Idempotency = Callable[[str], bool]


def check_block(block: float | None) -> float | None:
    if block is None:
        return None
    if isinstance(block, bool) or not isinstance(block, int | float) or not math.isfinite(block):
        raise InvalidArgument(f"block must be a finite number of seconds, got {block!r}")
    if block < 0:
        raise InvalidArgument(f"block must not be negative, got {block!r}")
    return float(block)


def blpop_wait(client: Any, remaining: float, wait_ms: int) -> float:
    """Seconds to block on the wake list: until work may be due, within the socket timeout."""
    wait = remaining if wait_ms < 0 else min(remaining, wait_ms / 1000)
    socket_timeout = getattr(client, "connection_pool", None)
    limit = None
    if socket_timeout is not None:
        limit = socket_timeout.connection_kwargs.get("socket_timeout")
    if limit:
        wait = min(wait, max(float(limit) - 0.1, 0.01))
    return max(wait, 0.001)  # BLPOP's 0 would mean "forever"


def chunks(items: list[bytes], size: int) -> Iterator[list[bytes]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class QueueRequests:
    """What Rotator and AsyncRotator build alike before a call: the arguments of a ``next``
    and the acks to send. Only the sending differs (sync or async)."""

    keys: QueueKeys
    _extended: bool
    _item_stats: bool
    _drop_payloads: bool
    _lease_ms: int
    _budget: int
    _max_deliveries: int
    _batches: protocol.Batches

    def _next_request(
        self, count: int, acks: list[bytes]
    ) -> tuple[tuple[str, ...], list[Any], Callable[[Any], NextReply]]:
        """The keys, arguments and reply decoder of one ``next`` call."""
        head = (count, self._lease_ms, self._budget, self._max_deliveries)
        if not self._extended:
            return self.keys.all, [b"next_packed", *head, *acks], protocol.decode_next_packed
        keys = self.keys.with_items if self._item_stats else self.keys.with_payloads
        args = [b"nextp", *head, int(self._drop_payloads), *acks]
        return keys, args, protocol.decode_next_payloads

    def _pack(self, refs: Sequence[JobRef]) -> protocol.PackedAcks:
        """Whole batches as batch acks, except where an ack must name each job (to delete
        its payload)."""
        if self._extended and self._drop_payloads:
            tokens = protocol.encode_tokens(refs)
            return protocol.PackedAcks(tokens, False, len(set(tokens)))
        return self._batches.pack_refs(refs)


class Rotator(QueueRequests):
    """One queue on one Redis or Valkey server (or Redis Cluster).

    ``timeout`` is the lease: seconds a consumer holds a job before it may be handed to
    another consumer. ``idempotency(job_id) -> bool`` is asked about every job whose lease
    expired before it is handed out again: True means the job was already done (it is acked
    and not returned). ``max_deliveries`` moves a job that was delivered that many times to
    the dead letters instead of leasing it again. With ``durability``, push, ack, nack and
    requeue_dead return only once their writes are persisted/replicated as it asks (raising
    NotDurable, after the write, when that is not confirmed in time). ``functions=True``
    calls the module with FCALL instead of EVALSHA (Redis 7+ / Valkey): cheaper per call, and
    a worker's ACL can then allow FCALL of this library without allowing arbitrary scripts.
    ``payloads=True`` keeps a payload per job id (see :meth:`push_payloads`): ``next``
    returns it with each job in the same call, and an accepted ack deletes it. Off by
    default, so the bare ring costs nothing extra. ``item_stats=True`` keeps per-job stats
    (enqueue time, deliveries, last delivery, last error from :meth:`fail`), read by
    :meth:`item_stats` and deleted by an accepted ack; also off by default.
    """

    # Whether an accepted ack deletes the job's payload: a topic group's payloads belong to
    # the topic (its retention), see rotator.topic.
    _drop_payloads = True

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        timeout: float = DEFAULT_LEASE_TIMEOUT,
        idempotency: Idempotency | None = None,
        max_deliveries: int | None = None,
        budget: int = DEFAULT_BUDGET,
        prefix: str = DEFAULT_PREFIX,
        durability: Durability | None = None,
        functions: bool = False,
        payloads: bool = False,
        item_stats: bool = False,
    ) -> None:
        self.client = client
        self.payloads = payloads
        self._item_stats = item_stats
        # Payloads or item stats: the queue is called with its extra keys (pushp, nextp, ...).
        self._extended = payloads or item_stats
        self.durability = durability
        self.name = name
        self.keys = queue_keys(name, prefix)
        self.timeout = timeout
        self.idempotency = idempotency
        self._lease_ms = protocol.seconds_to_ms(timeout, "timeout")
        self._max_deliveries = protocol.check_max_deliveries(max_deliveries)
        self._budget = protocol.check_budget(budget)
        # FCALL of the module loaded as a function library, or EVALSHA of the script.
        self._script: Any = module_caller(client, functions)
        self._batches = protocol.Batches()

    @classmethod
    def from_url(cls, url: str, name: str, *, cluster: bool = False, **options: Any) -> Rotator:
        """A Rotator on a new client for ``url`` (``redis://``, ``rediss://``, ``unix://``)."""
        client: Client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
        return cls(client, name, **options)

    @classmethod
    def embedded(cls, name: str, *, data_dir: str | None = None, **options: Any) -> Rotator:
        """A Rotator on the private embedded server, started first if it is not running.

        This is the zero-setup default the CLI uses when given no URL; see
        :mod:`rotator.server`.
        """
        server = EmbeddedServer(data_dir)
        server.start()
        return cls(server.client(), name, **options)

    def __repr__(self) -> str:
        return f"Rotator({self.name!r}, timeout={self.timeout})"

    def _call(self, *args: Any) -> Any:
        return run(self._script, self.keys.all, list(args))

    def _call_payloads(self, *args: Any) -> Any:
        """A pushp/nextp/ackp/... call: the ten keys, the payloads and, with item stats on,
        the stats hash."""
        keys = self.keys.with_items if self._item_stats else self.keys.with_payloads
        return run(self._script, keys, list(args))

    def _write(self, *args: Any) -> Any:
        """A call whose writes the caller relies on: waits for durability when asked."""
        reply = self._call(*args)
        if self.durability is not None:
            wait_durable(self.client, self.durability)
        return reply

    def server_warnings(self) -> list[str]:
        """Server settings that can lose jobs (an evicting maxmemory-policy, AOF off)."""
        return server_warnings(self.client)

    # -- producing -------------------------------------------------------------------------

    def push(self, *ids: str | int) -> int:
        """Adds job ids at the back of the queue; returns how many were pushed.

        Every id is checked before anything is sent. Up to 1000 ids go in one atomic call;
        longer lists are sent in such calls, in order. Idle consumers are woken.
        """
        return self.push_many(ids)

    def push_payloads(
        self, items: Mapping[Any, bytes | str], chunk: int = DEFAULT_PUSH_CHUNK
    ) -> int:
        """Adds jobs with payloads (``{id: payload}``); needs ``payloads=True``.

        Each call of up to ``chunk`` (at most 2500) jobs is atomic: ids, payloads and the
        wake-up together. Pushing an id again replaces its payload (one payload per id).
        """
        if not self.payloads:
            raise InvalidArgument("push_payloads needs a Rotator made with payloads=True")
        pairs = [(protocol.encode_id(k), protocol.encode_payload(v)) for k, v in items.items()]
        size = protocol.whole(chunk, "chunk", 1, MAX_BATCH // 2)
        pushed = 0
        for start in range(0, len(pairs), size):
            flat = [part for pair in pairs[start : start + size] for part in pair]
            pushed += int(self._write_payloads(b"pushp", *flat))
        return pushed

    def _write_payloads(self, *args: Any) -> Any:
        reply = self._call_payloads(*args)
        if self.durability is not None:
            wait_durable(self.client, self.durability)
        return reply

    def push_many(self, ids: Iterable[str | int], chunk: int = DEFAULT_PUSH_CHUNK) -> int:
        raw = protocol.encode_ids(ids)
        size = protocol.whole(chunk, "chunk", 1, MAX_BATCH)
        if self._item_stats:
            return sum(int(self._write_payloads(b"pushi", *part)) for part in chunks(raw, size))
        return sum(int(self._write(b"push", *part)) for part in chunks(raw, size))

    # -- consuming -------------------------------------------------------------------------

    def next(
        self, count: int = 1, block: float | None = None, *, ack: Iterable[JobRef] = ()
    ) -> list[Job]:
        """Leases up to ``count`` jobs; returns them oldest first, or [] when there is none.

        ``ack`` completes earlier jobs in the same round trip. With ``block`` (seconds), an
        empty queue is waited on without polling: pushes wake the consumer at once, and the
        wait also ends when a lease or a delayed retry falls due.
        """
        count = protocol.check_count(count)
        refs = list(ack)
        acks, packed, _ = self._pack(refs)
        waited = check_block(block)
        give_up = None if waited is None else time.monotonic() + waited
        wake_wait: float | None = None
        while True:
            reply = self._next_call(count, acks, wake_wait)
            wake_wait = None
            if packed and reply.acked < len(acks):
                self._ack_refs(refs, pack=False)  # a batch ack was refused
            self._batches.note(reply)
            jobs, acks = self._screen(reply.jobs)
            packed = False
            if jobs:
                if acks:
                    self.ack(*acks)
                return jobs
            if acks or not reply.idle:
                continue  # send the acks, or look at the rest of the lap
            if give_up is None:
                return []
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return []
            wake_wait = blpop_wait(self.client, remaining, reply.wait_ms)

    def _next_call(self, count: int, acks: list[bytes], wake_wait: float | None) -> NextReply:
        """One ``next`` call; with ``wake_wait``, after blocking that long on the wake list."""
        keys, args, decode = self._next_request(count, acks)
        if wake_wait is None:
            return decode(run(self._script, keys, args))
        return decode(self._after_wake(wake_wait, keys, args))

    def _after_wake(self, wait: float, keys: tuple[str, ...], args: list[Any]) -> Any:
        """Blocks on the wake list, then calls the module, in one round trip: the server runs
        the pipelined call as soon as BLPOP returns (woken by a push, or timed out), so a
        woken consumer does not pay a second round trip before it holds the job."""
        if not isinstance(self.client, redis.Redis):  # a cluster client: two round trips
            self.client.blpop([self.keys.wake], timeout=wait)
            return run(self._script, keys, args)
        pipe: Any = self.client.pipeline(transaction=False)
        pipe.blpop([self.keys.wake], timeout=wait)
        pipe.execute_command(*module_command(self._script, keys, args))
        woken, reply = pipe.execute(raise_on_error=False)
        if isinstance(woken, Exception):
            raise woken
        if not_loaded(reply):
            return run(self._script, keys, args)
        return pipeline_reply(reply)

    def _screen(self, jobs: list[Job]) -> tuple[list[Job], list[bytes]]:
        """Splits reclaimed jobs the idempotency callback says are done from the rest."""
        if self.idempotency is None:
            return jobs, []
        keep: list[Job] = []
        finished: list[bytes] = []
        for job in jobs:
            if job.reclaimed and self.idempotency(job.id):
                finished.append(protocol.encode_token(job))
            else:
                keep.append(job)
        return keep, finished

    def ack(self, *jobs: JobRef) -> int:
        """Completes deliveries; returns how many were accepted.

        A delivery whose lease was re-issued, nacked or dead-lettered is refused (not
        counted). O(1) per job: the element leaves the ring when a consumer next reaches it.
        """
        return self._ack_refs(jobs, pack=True)

    def _ack_refs(self, refs: Sequence[JobRef], *, pack: bool) -> int:
        if pack:
            args, packed, named = self._pack(refs)
        else:
            args, packed, named = protocol.encode_tokens(refs), False, 0
        if self._extended and self._drop_payloads:
            return sum(
                int(self._write_payloads(b"ackp", *part)) for part in chunks(args, MAX_BATCH)
            )
        accepted = sum(int(self._write(b"ack", *part)) for part in chunks(args, MAX_BATCH))
        if not packed:
            return accepted
        if accepted < len(args):
            return self._ack_refs(refs, pack=False)  # a batch ack was refused
        return named

    def nack(self, *jobs: JobRef, delay: float = 0.0) -> int:
        """Gives jobs back, to be delivered again once ``delay`` seconds have passed.

        Returns how many were given back; a lease that was already lost is not counted.
        """
        delay_ms = protocol.seconds_to_ms(delay, "delay", allow_zero=True)
        tokens = protocol.encode_tokens(jobs)
        return sum(
            sum(int(flag) for flag in self._write(b"nack", delay_ms, *part))
            for part in chunks(tokens, MAX_BATCH)
        )

    def fail(self, *jobs: JobRef, error: str, delay: float = 0.0) -> int:
        """``nack`` that also records ``error`` as each job's last error, in the same call,
        when item stats are on (without them it is just ``nack``)."""
        if not self._item_stats:
            return self.nack(*jobs, delay=delay)
        delay_ms = protocol.seconds_to_ms(delay, "delay", allow_zero=True)
        message = protocol.encode_error(error)
        tokens = protocol.encode_tokens(jobs)
        return sum(
            sum(int(flag) for flag in self._write_payloads(b"nackp", delay_ms, message, *part))
            for part in chunks(tokens, MAX_BATCH)
        )

    def extend(self, job: JobRef, seconds: float | None = None) -> float:
        """Keeps a lease for ``seconds`` more (default: the queue's timeout).

        Returns the new deadline (unix seconds). Raises LeaseLost when the lease was
        re-issued, nacked, dead-lettered or acked.
        """
        (kept,), deadline = self._extend([job], seconds)
        if not kept:
            raise LeaseLost(f"lease {protocol.encode_token(job).decode(errors='replace')} was lost")
        return deadline

    def extend_many(self, jobs: Iterable[JobRef], seconds: float | None = None) -> list[bool]:
        """Extends many leases in one call; True where the lease is still held."""
        return self._extend(list(jobs), seconds)[0]

    def _extend(self, jobs: list[JobRef], seconds: float | None) -> tuple[list[bool], float]:
        lease_ms = self._lease_ms if seconds is None else protocol.seconds_to_ms(seconds, "seconds")
        tokens = protocol.encode_tokens(jobs)
        if not tokens:
            return [], 0.0
        flags: list[bool] = []
        deadline_ms = 0
        for part in chunks(tokens, MAX_BATCH):
            reply = self._call(b"extend", lease_ms, *part)
            deadline_ms = int(reply[0])
            flags.extend(int(flag) == 1 for flag in reply[1:])
        return flags, deadline_ms / 1000

    @contextmanager
    def claim(self, block: float | None = None) -> Iterator[Job | None]:
        """Leases one job for a ``with`` block: acked when it ends, nacked if it raises.

        Yields None when no job came within ``block`` seconds.
        """
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
        """Runs ``handler(job)`` for each job until stopped (SIGINT/SIGTERM) or, with
        ``stop_when_empty``, until nothing is pending, in flight or deferred.

        Failures are nacked with exponential backoff; the leases of every job held are
        extended while it waits or runs. A claim takes about 0.1 s of work at the handler's
        recent pace and at most ``batch`` jobs (``batch=1``: one job per round trip).
        ``poll`` is how long an idle loop blocks before it looks at its stop conditions. See
        :mod:`rotator.worker`.
        """
        worker = Worker(self, handler, concurrency=concurrency, batch=batch, poll=poll)
        return worker.run(
            stop_when_empty=stop_when_empty, install_signal_handlers=install_signal_handlers
        )

    # -- inspecting ------------------------------------------------------------------------

    def exists(self) -> bool:
        """True once anything was pushed (or dead-lettered) and the queue was not deleted."""
        return bool(self.client.exists(self.keys.ring, self.keys.dead))

    def delete(self) -> bool:
        """Removes the queue and everything in it (pending, leased, dead, payloads) in one
        command."""
        return bool(self.client.delete(*self.keys.with_items))

    def sweep(self) -> int:
        """Visits a whole lap without leasing anything; returns how many elements it removed.

        Acked elements normally leave the ring when consumers next reach them; an idle
        queue keeps them until its next lap. Costs O(ring length), in bounded calls.
        """
        length = int(self.client.llen(self.keys.ring))
        visited = removed = 0
        while visited < length:
            reply = self._call(b"sweep", self._budget)
            if int(reply[0]) == 0:
                break
            visited += int(reply[0])
            removed += int(reply[1])
            # A call that visited the whole ring as it stood has seen everything; this ends a
            # lap early when other consumers are removing elements at the same time.
            if int(reply[0]) >= int(reply[1]) + int(reply[2]) + 1:
                break
        return removed

    def item_stats(self, *ids: str | int) -> list[ItemStats | None]:
        """Each id's stats (None for an id without any); needs ``item_stats=True``."""
        if not self._item_stats:
            raise InvalidArgument("item_stats needs a Rotator made with item_stats=True")
        raw = protocol.encode_ids(ids)
        found: list[ItemStats | None] = []
        for part in chunks(raw, MAX_BATCH):
            found += [protocol.decode_item_stats(v) for v in self._call_payloads(b"items", *part)]
        return found

    def stats(self) -> Stats:
        """Counts, read in one atomic call; costs O(nacked and extended jobs), not O(ring)."""
        return protocol.decode_stats(self._call(b"stats"))

    def peek(self, limit: int = 20) -> list[RingEntry]:
        """The ``limit`` elements nearest the tail (next to be visited), without changes."""
        return protocol.decode_peek(self._call(b"peek", protocol.check_count(limit)))

    def dead(self, start: int = 0, limit: int = 100) -> list[DeadLetter]:
        """Dead letters, oldest first."""
        start = protocol.whole(start, "start", 0, 10**15)
        limit = protocol.whole(limit, "limit", 1, MAX_COUNT)
        return [protocol.decode_dead_letter(raw) for raw in self._call(b"dead", start, limit)]

    def requeue_dead(self, *ids: str | int, count: int = MAX_BATCH) -> int:
        """Moves dead letters (all, or those of ``ids``) back to the queue as new jobs."""
        raw = protocol.encode_ids(ids)
        count = protocol.whole(count, "count", 1, MAX_BATCH)
        if len(raw) > MAX_BATCH:
            raise InvalidArgument(f"at most {MAX_BATCH} ids per call")
        return int(self._write(b"requeue_dead", count, *raw))
