"""Rotator: the synchronous API over one queue.

Every method runs one flow of :mod:`rotator.flows` (one or a few calls of the Lua module,
each atomic on the server) on a :class:`rotator.sending.Sender`. The policy that needs no
atomicity lives in those flows: the idempotency callback, blocking waits, batch acks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import redis
from redis.cluster import RedisCluster
from redis.retry import Retry

from rotator import commands, protocol, registry
from rotator.defaults import (
    DEFAULT_BUDGET,
    DEFAULT_LEASE_TIMEOUT,
    DEFAULT_POLL,
    DEFAULT_PREFIX,
    DEFAULT_PUSH_CHUNK,
    DEFAULT_WORK_BATCH,
    MAX_BATCH,
)
from rotator.flows import QueueView
from rotator.models import (
    DeadLetter,
    Durability,
    Durations,
    Handler,
    ItemStats,
    Job,
    QueueSettings,
    RingEntry,
    Schedule,
    Stats,
    WorkSummary,
)
from rotator.protocol import JobRef, When
from rotator.registry import WorkerInfo
from rotator.retries import bounded_options, check_retry_for, push_marker_ttl_ms, sender
from rotator.sharded import cluster_client
from rotator.urls import client_from_url

if TYPE_CHECKING:
    from rotator.buffering import Consumer, Producer

Client = redis.Redis | RedisCluster
Idempotency = Callable[[str], bool]


class Rotator(QueueView):
    """One queue on one Redis or Valkey server (or Redis Cluster).

    ``timeout`` is the lease: seconds a consumer holds a job before it may be handed to
    another consumer. ``idempotency(job_id) -> bool`` is asked about every job whose lease
    expired before it is handed out again: True means the job was already done (it is acked
    and not returned). ``max_deliveries`` moves a job that was delivered that many times to
    the dead letters instead of leasing it again. With ``durability``, push, ack, nack,
    requeue_dead and claims (``next`` and the acks riding on it) return only once their
    writes are persisted/replicated as it asks (raising NotDurable, after the write, when
    that is not confirmed in time: a claim's jobs then come back after their leases). The module is
    called with FCALL where the server and the ACL allow it (Redis 7+ / Valkey), else with
    EVALSHA, chosen at the client's first call; ``functions=True`` forces FCALL (a worker's
    ACL can then allow FCALL of this library without allowing arbitrary scripts),
    ``functions=False`` forces EVALSHA.
    ``payloads=True`` keeps a payload per job id (see :meth:`push_payloads`): ``next``
    returns it with each job in the same call, and an accepted ack deletes it. Off by
    default, so the bare ring costs nothing extra. ``item_stats=True`` keeps per-job stats
    (enqueue time, deliveries, last delivery, last error from :meth:`fail`), read by
    :meth:`item_stats` and deleted by an accepted ack; also off by default.

    ``retry_for`` (seconds, 0..3600; 0, the default, is off) sends a call again after a
    connection error, a timeout or a reply that says it never ran (``LOADING`` from a
    restarting server, ``READONLY`` from a demoted master), for at most that long, pausing
    50 ms, 100 ms, ... 1 s between tries: a failover, a restart or a lost reply costs a
    wait, not an error. A call that may have run is sent again only where its second run
    changes nothing (claims, acks, reads, unique pushes), and every other push goes under a
    marker of its own (one small hash, kept a minute): a plain push as ``push_chunk``, one
    with ``delay``/``at``, a ``priority``, payloads or item stats as ``once`` before its
    own command; so a push sent again after its reply was lost pushes nothing twice and
    returns what it pushed. redis-py's own retries
    of the client still run underneath: :meth:`from_url` turns them off and sets socket
    timeouts (1 s to connect, 5 s a reply) when given ``retry_for``.
    """

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
        functions: bool | None = None,
        payloads: bool = False,
        item_stats: bool = False,
        retry_for: float = 0.0,
    ) -> None:
        self.client = client
        self.durability = durability
        self.retry_for = check_retry_for(retry_for)
        self._flows = self._make_flows(
            name,
            timeout=timeout,
            idempotency=idempotency,
            max_deliveries=max_deliveries,
            budget=budget,
            prefix=prefix,
            payloads=payloads,
            item_stats=item_stats,
            push_marker_ttl_ms=push_marker_ttl_ms(self.retry_for),
        )
        self._sender = sender(client, functions, self.retry_for, durability)
        self._run = self._sender.run

    @classmethod
    def from_url(cls, url: str, name: str, *, cluster: bool = False, **options: Any) -> Rotator:
        """A Rotator on a new client for ``url`` (``redis://``, ``rediss://``, ``unix://``,
        ``redis+sentinel://``).

        ``cluster=True``: ``url`` is any node of a Redis Cluster, and the client is the one
        :func:`rotator.sharded.cluster_client` makes: redis-py's own retries off and socket
        timeouts set (1 s to connect, 5 s a reply), so that a call to a master that died or
        hangs raises within them instead of waiting unbounded. A ``retry_for`` in
        ``options`` makes the client so too: the Rotator's retries are then the only ones."""
        retry_for = check_retry_for(options.get("retry_for", 0.0))
        client: Client
        if cluster:
            client = cluster_client(url)
        else:
            client = client_from_url(url, **bounded_options({}, Retry) if retry_for else {})
        return cls(client, name, **options)

    @classmethod
    def embedded(cls, name: str, *, data_dir: str | None = None, **options: Any) -> Rotator:
        """A Rotator on the private embedded server, started first if it is not running.

        This is the zero-setup default the CLI uses when given no URL; see
        :mod:`rotator.server`.
        """
        from rotator.server import EmbeddedServer  # noqa: PLC0415 (the API does not need it)

        server = EmbeddedServer(data_dir)
        server.start()
        return cls(server.client(), name, **options)

    def _call(self, *args: Any) -> Any:
        """One raw module call with the queue's thirteen keys (for tests and debugging)."""
        return self._sender.perform(commands.raw(self.keys.all, args))

    def server_warnings(self) -> list[str]:
        """Server settings that can lose jobs (an evicting maxmemory-policy, AOF off)."""
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
        """Adds job ids at the back of the queue; returns how many were pushed.

        Every id is checked before anything is sent. Up to 1000 ids go in one atomic call;
        longer lists are sent in such calls, in order. Idle consumers are woken.

        With ``delay`` (seconds) or ``at`` (unix seconds, or an aware datetime) the jobs are
        scheduled instead: kept apart from the queue, by the server's clock, until they are
        due, then queued behind what is pending (``Stats.scheduled`` counts them meanwhile).
        An id already scheduled moves to the new time: one scheduled job per id.

        A queue that tracks ids (``configure(track_ids=True)``) holds each id once: an id it
        holds (waiting, scheduled or in flight, not yet acked) is skipped, and not counted.
        ``unique=True`` says the caller counts on that: it raises NotTracked, pushing nothing,
        on a queue that does not track ids. A push retried after a lost reply then adds
        nothing twice.

        ``priority`` from 0 (the default, most urgent) to 9: a claim hands out every job of a
        more urgent level before any of a less urgent one (strictly: a busy level 0 starves
        the others), first in first out within a level. It governs first deliveries: a job
        given back or reclaimed comes back when due, whatever its level. An id waiting at a
        level from 1 pushed there again moves to the back of it and is not counted. A queue
        that never uses levels from 1 pays nothing for them.
        """
        due = protocol.check_due(delay, at)
        level = protocol.check_priority(priority)
        return self._run(self._flows.push_many(ids, DEFAULT_PUSH_CHUNK, due, unique, level))

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
        """``push`` of any number of ids, in atomic calls of ``chunk`` (at most 5000)."""
        due = protocol.check_due(delay, at)
        level = protocol.check_priority(priority)
        return self._run(self._flows.push_many(ids, chunk, due, unique, level))

    def push_payloads(
        self,
        items: Mapping[Any, bytes | str],
        chunk: int = DEFAULT_PUSH_CHUNK,
        *,
        delay: float | None = None,
        at: When | None = None,
        unique: bool = False,
    ) -> int:
        """Adds jobs with payloads (``{id: payload}``); needs ``payloads=True``.

        Each call of up to ``chunk`` (at most 2500) jobs is atomic: ids, payloads and the
        wake-up together. Pushing an id again replaces its payload (one payload per id).
        ``delay`` and ``at`` schedule them, as for :meth:`push` (the payloads are stored
        at once). ``unique`` as for :meth:`push`: a job held keeps its payload.
        """
        due = protocol.check_due(delay, at)
        return self._run(self._flows.push_payloads(items, chunk, due, unique))

    def cancel(self, *ids: str | int) -> int:
        """Cancels jobs by id; returns how many were found scheduled, waiting or in flight.

        Needs a queue that tracks ids (``configure(track_ids=True)``; NotTracked otherwise).
        A cancelled job is never delivered again: a scheduled one leaves at once, a waiting
        one at the next claim's visit; one in flight has its token revoked, so its ack is
        refused and its ``extend`` raises JobCancelled (a worker stops keeping it, and logs
        it), and its lease is dropped instead of being reclaimed. ``Stats.cancelled`` counts
        them. Its id may be pushed again at once.
        """
        return self._run(self._flows.cancel(ids))

    def schedule(
        self,
        name: str,
        *,
        every: float | None = None,
        cron: str | None = None,
        job_id: str | int | None = None,
        tz: str | None = None,
    ) -> bool:
        """Pushes one job ``"<job_id>@<tick ms>"`` (``job_id`` defaults to ``name``) at each
        tick of the schedule ``name``: ``every`` seconds (the first a period from now), or at
        the times of the cron expression ``cron`` (5 or 6 fields, read by cronsim, the
        ``cron`` extra) in time zone ``tz`` (default UTC). Each tick makes exactly one job
        whatever the number of consumers: the server decides it, in the claim that finds
        it due. Ticks missed while nothing claimed (or the queue was paused) make one
        catch-up job, then the schedule goes on from now.

        Declaring a schedule again as it is changes nothing (so an application may declare
        its schedules at every start); anything else replaces it. True when it was added or
        changed. A cron schedule is given its next 256 due times; the worker loops
        (:meth:`work`) give it more, and so does :meth:`keep_schedules`.
        """
        return self._run(self._flows.schedule(name, every, cron, job_id, tz))

    def schedules(self) -> list[Schedule]:
        """The queue's recurring schedules, by name."""
        return self._run(self._flows.schedules())

    def unschedule(self, name: str) -> bool:
        """Forgets the schedule ``name`` (jobs it pushed stay); False when there was none."""
        return self._run(self._flows.unschedule(name))

    def keep_schedules(self) -> int:
        """Gives each cron schedule that runs low on due times a fresh window (the worker
        loops do this every minute); returns how many were topped up. For consumers that
        run a loop of their own: call it now and then (hourly is plenty)."""
        return self._run(self._flows.keep_schedules())

    def set_rate_limit(self, jobs: int | None, per: float = 1.0) -> None:
        """Leases at most ``jobs`` per ``per`` seconds (at most a day) across every consumer
        of the queue, enforced inside the claim: a burst of ``jobs``, then one every
        ``per / jobs`` seconds. A claim at the limit gets fewer jobs or none, and a blocked
        consumer waits (without polling) until one more may go. ``None`` lifts the limit.
        ``Stats.rate_limit`` shows it."""
        self._run(self._flows.set_rate_limit(jobs, per))

    def durations(self, *seconds: float) -> Durations:
        """The queue's histogram of processing times, after adding ``seconds`` (one per job)
        to it. The worker loops add every job they complete (with the acks of their next
        claim), so p50/p95/p99 cover every worker process: ``q.durations().p95``."""
        return self._run(self._flows.durations(seconds))

    def pause(self) -> bool:
        """Stops the queue handing out jobs, for every consumer, until :meth:`resume`:
        pushes, acks, nacks and extends go on, and leases already out are unaffected
        (expired ones are not reclaimed meanwhile). Blocked consumers stay blocked.
        False when it was paused already."""
        return self._run(self._flows.pause())

    def resume(self) -> bool:
        """Ends a :meth:`pause` and wakes blocked consumers; False when it was not paused."""
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
        """Leases up to ``count`` jobs; returns them oldest first, or [] when there is none.

        ``ack`` completes earlier jobs in the same round trip, and ``durations`` (seconds)
        adds their processing times to the queue's histogram in it too (:meth:`durations`).
        With ``block`` (seconds), an empty queue is waited on without polling: pushes wake
        the consumer at once, and the wait also ends when a lease or a delayed retry falls
        due.
        """
        return self._run(self._flows.next(count, block, ack, durations))

    def ack(self, *jobs: JobRef) -> int:
        """Completes deliveries; returns how many were accepted.

        A delivery whose lease was re-issued, nacked or dead-lettered is refused (not
        counted). O(1) per job: the element leaves the ring when a consumer next reaches it.
        """
        return self._run(self._flows.ack_refs(jobs, pack=True))

    def nack(self, *jobs: JobRef, delay: float = 0.0) -> int:
        """Gives jobs back, to be delivered again once ``delay`` seconds have passed.

        Returns how many were given back; a lease that was already lost is not counted.
        """
        return self._run(self._flows.nack(jobs, delay))

    def fail(self, *jobs: JobRef, error: str, delay: float = 0.0) -> int:
        """``nack`` that also records ``error`` as each job's last error, in the same call,
        when item stats are on (without them it is just ``nack``)."""
        return self._run(self._flows.fail(jobs, error, delay))

    def bury(self, *jobs: JobRef, error: str = "") -> int:
        """Sends held jobs to the dead letters, keeping ``error`` (at most 4096 bytes) in each
        letter (``DeadLetter.error``): for a failure that retrying will not mend, or a job's
        last delivery. The tokens are revoked at once, as by ``nack``; the letter is written
        when a claim or sweep next reaches the job's element (``stats`` counts it as done
        until then), so a job acked and removed before is never dead-lettered as well. With
        ``item_stats``, ``error`` is also the job's last error.

        Returns how many were buried; a lease that was already lost is not counted.
        """
        return self._run(self._flows.bury(jobs, error))

    def extend(self, job: JobRef, seconds: float | None = None) -> float:
        """Keeps a lease for ``seconds`` more (default: the queue's timeout).

        Returns the new deadline (unix seconds). Raises LeaseLost when the lease was
        re-issued, nacked, dead-lettered or acked, and JobCancelled (a LeaseLost) when its job
        was cancelled.
        """
        return self._run(self._flows.extend(job, seconds))

    def extend_many(self, jobs: Iterable[JobRef], seconds: float | None = None) -> list[bool]:
        """Extends many leases in one call; True where the lease is still held (False where
        it was lost or its job cancelled)."""
        return self._run(self._flows.extend_many(jobs, seconds))

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
        from rotator.worker import Worker  # noqa: PLC0415 (the worker builds on this API)

        worker = Worker(self, handler, concurrency=concurrency, batch=batch, poll=poll)
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
        """Sets the queue's settings that are given (kept on the server, for every client)
        and returns all of them. The first four bound memory:

        - ``fence_window`` (seconds, default 3600) and ``fence_max`` (default 1,000,000): how
          long, and how many, refused tokens (leases re-issued, nacked or dead-lettered) are
          remembered. A late ack after the window is accepted but completes nothing.
        - ``dead_max`` (default 100,000) and ``dead_max_age`` (seconds, default 7 days): dead
          letters kept, the newest; older ones are dropped.

        Each call that adds to these structures drops at most what it added plus 1000 of the
        oldest beyond them, so no call does work in proportion to their size.

        ``track_ids=True`` makes the queue keep an index of its ids (a hash of id -> where
        its one copy is: about 40 to 115 bytes per job held, see bench/results/unique.md),
        which unique pushes and :meth:`cancel` need; a tracked queue holds each id once, and
        its claims cost more (no short way). It may only be turned on while the queue holds
        no job (InvalidArgument otherwise); ``False`` drops the index.
        """
        return self._run(
            self._flows.configure(fence_window, fence_max, dead_max, dead_max_age, track_ids)
        )

    def exists(self) -> bool:
        """True once anything was pushed (or scheduled, or dead-lettered) and the queue was
        not deleted."""
        return self._run(self._flows.exists())

    def delete(self, *, forget: bool = False) -> bool:
        """Removes the queue and everything in it (pending, leased, dead, payloads) in one
        atomic call, freeing the memory in the background.

        What stays is where its seq got to (one hash field), so that a queue made again
        under the name never issues a token of this one and refuses the old ones;
        ``forget=True`` removes that too, for a name that is never used again. The worker
        registry (:meth:`workers`) goes too, in a second call.
        """
        return self._run(self._flows.delete(forget))

    def sweep(self) -> int:
        """Visits a whole lap without leasing anything; returns how many elements it removed.

        Acked elements normally leave the ring when consumers next reach them; an idle
        queue keeps them until its next lap. Costs O(ring length), in bounded calls.
        """
        return self._run(self._flows.sweep())

    def drained(self) -> bool:
        """True when nothing is pending, in flight or deferred (acked elements may remain
        until the next lap or :meth:`sweep`)."""
        return self._run(self._flows.drained())

    def item_stats(self, *ids: str | int) -> list[ItemStats | None]:
        """Each id's stats (None for an id without any); needs ``item_stats=True``."""
        return self._run(self._flows.item_stats_of(ids))

    def stats(self) -> Stats:
        """Counts, read in one atomic call; O(1), whatever is queued, deferred or in flight."""
        return self._run(self._flows.stats())

    def peek(self, limit: int = 20) -> list[RingEntry]:
        """The ``limit`` elements nearest the tail (next to be visited), without changes."""
        return self._run(self._flows.peek(limit))

    def dead(self, start: int = 0, limit: int = 100) -> list[DeadLetter]:
        """Dead letters, oldest first."""
        return self._run(self._flows.dead(start, limit))

    def requeue_dead(self, *ids: str | int, count: int = MAX_BATCH) -> int:
        """Moves dead letters (all, or those of ``ids``) back to the queue as new jobs."""
        return self._run(self._flows.requeue_dead(ids, count))

    # -- workers (rotator.registry) ----------------------------------------------------------

    def workers(self, *, include_stale: bool = False) -> list[WorkerInfo]:
        """The worker loops working on this queue, by host and pid: what each holds now and
        what it has done, as it last reported (with its heartbeat: every lease/4 seconds,
        1 s at the most often and 5 s at the least).

        An entry not rewritten for 15 s (``registry.STALE_AFTER``) is a worker that is most
        likely gone: left out, unless ``include_stale`` (then ``stale`` is True). Entries an
        hour old are deleted on the way. [] when no worker reports here. Times are the
        workers' clocks. One HGETALL, plus one HDEL when there is something to prune.
        """
        return self._run(registry.read(self.keys.workers, include_stale))

    def report_worker(self, info: WorkerInfo) -> None:
        """Writes a worker's registry entry (one HSET): what the worker loops send on their
        heartbeat; a loop of your own can report itself the same way."""
        self._run(registry.report(self.keys.workers, info))

    def forget_worker(self, worker_id: str) -> bool:
        """Removes a worker's registry entry (one HDEL); True when there was one."""
        return self._run(registry.forget(self.keys.workers, worker_id))

    # -- buffering (rotator.buffering) -------------------------------------------------------

    def producer(self, *, max_batch: int = 500, max_delay: float = 0.05) -> Producer:
        """Gathers pushes into calls of up to ``max_batch`` jobs, sent when full, after
        ``max_delay`` s in the background, on ``flush()`` and on exit; thread-safe:
        ``with q.producer() as p: p.push(job_id)``. A failed flush keeps its jobs for the
        next one and raises on the next call. See :class:`rotator.buffering.Producer`."""
        from rotator.buffering import Producer  # noqa: PLC0415 (built on this API)

        return Producer(self, max_batch=max_batch, max_delay=max_delay)

    def consumer(
        self, *, prefetch: int = 100, block: float = 1.0, stop_when_empty: bool = False
    ) -> Consumer:
        """Hands out jobs one at a time from claims of ``prefetch``, acks riding on the next
        claim, the leases of every job held kept: ``with q.consumer() as c: for job in c:
        ...; c.ack(job)``. Exit gives back what was not acked. See
        :class:`rotator.buffering.Consumer`."""
        from rotator.buffering import Consumer  # noqa: PLC0415 (built on this API)

        return Consumer(self, prefetch=prefetch, block=block, stop_when_empty=stop_when_empty)
