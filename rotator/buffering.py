"""Buffering on either side of a queue: a producer that gathers single pushes into batched
module calls, and a consumer that hands out one job at a time from batched claims.

:class:`Producer` (``q.producer()``) takes ids (and payloads) one call at a time and sends
them ``max_batch`` to a module call: when that many are waiting, when the oldest has waited
``max_delay`` seconds (a background thread), on :meth:`Producer.flush` and on exit. Jobs
pushed with equal options (:class:`PushOptions`) share calls, in the order they were pushed.
A flush that fails keeps its jobs, ahead of later ones, for the next flush to send again,
and its error is raised by the next ``push``, ``push_payload``, ``flush`` or exit.

:class:`Consumer` (``q.consumer()``) claims ``prefetch`` jobs a call and hands them out one
at a time; the acks it is given ride on its next claim (``next(..., ack=...)``), and the
nacks go in the same round trip as that claim (:meth:`rotator.flows.QueueFlows.next`'s
``nacks``). Every job it holds (prefetched, handed out, or acked or nacked with the call not
yet sent) is in a :class:`rotator.worker.Ledger`, whose half-used leases a background thread
extends. On exit it sends the acks and nacks still buffered and gives back (nack, no delay)
every job neither acked nor nacked.

:class:`AsyncProducer` and :class:`AsyncConsumer` are the asyncio twins (a task instead of
the thread). What they decide alike (what is buffered, what a flush sends and keeps, what is
handed out, acked or given back) is :class:`Outgoing` and :class:`Prefetch`, and the calls a
flush makes are one flow (:func:`send`), run by the sync and the async sender.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple

from rotator import commands, protocol
from rotator.commands import Flow, ModuleCall
from rotator.defaults import DEFAULT_POLL, MAX_BATCH
from rotator.errors import InvalidArgument, NotDurable, RotatorError
from rotator.flows import QueueFlows
from rotator.models import Job
from rotator.protocol import When
from rotator.worker import Ledger, extend_due, extend_due_async

if TYPE_CHECKING:
    from rotator.aio import AsyncRotator
    from rotator.core import Rotator

log = logging.getLogger("rotator.buffering")

# Jobs a producer gathers before it sends them: a module call carries this many at most.
DEFAULT_PRODUCER_BATCH = 500
# Seconds a job waits at most in a producer's buffer before the background flush sends it.
DEFAULT_PRODUCER_DELAY = 0.05
# Jobs a consumer claims per call, held ahead of the loop that takes them one at a time.
DEFAULT_PREFETCH = 100
# Seconds a consumer's claim waits on an empty queue (then it claims again, or stops).
DEFAULT_CONSUMER_BLOCK = DEFAULT_POLL
# The longest a producer may hold a job before its background flush (a buffer, not a timer).
MAX_PRODUCER_DELAY = 60.0


# -- producing --------------------------------------------------------------------------------


class PushOptions(NamedTuple):
    """What jobs are pushed with. Jobs with equal options share module calls: an option
    ``push`` gains (a priority, unique) is one field here and one argument in
    :func:`push_call`."""

    due: protocol.Due | None = None  # scheduled: push_later's IN|AT and ms
    payloads: bool = False  # id/payload pairs, for pushp
    priority: int = 0  # a level from 1: push_priority
    unique: bool = False  # refused unless the queue tracks ids


NOW = PushOptions()
NOW_WITH_PAYLOADS = PushOptions(None, True)


def push_call(flows: QueueFlows, options: PushOptions, part: Sequence[bytes]) -> ModuleCall[int]:
    """The module call that pushes ``part`` (ids, or id/payload pairs) with ``options``: the
    call :meth:`rotator.Rotator.push` or ``push_payloads`` makes for them."""
    if options.payloads:
        return commands.pushp(flows.extended_keys, part, options.due, unique=options.unique)
    (call,) = flows.push_calls(part, len(part), options.due, options.unique, options.priority)
    return call


def width(options: PushOptions) -> int:
    """Items a job takes in a batch: its id, and its payload."""
    return 2 if options.payloads else 1


class Batch:
    """Jobs of equal options on their way out: ``items[:done]`` were sent."""

    __slots__ = ("done", "items", "options")

    def __init__(self, options: PushOptions, items: list[bytes]) -> None:
        self.options = options
        self.items = items
        self.done = 0


def send(flows: QueueFlows, batches: list[Batch], max_batch: int) -> Flow[int]:
    """Sends ``batches`` in order, ``max_batch`` jobs a module call (at most what a call
    takes), noting in each batch what went: a call that fails leaves in them exactly what
    was not sent. Returns how many jobs were sent."""
    sent = 0
    for batch in batches:
        step = min(max_batch, MAX_BATCH // width(batch.options)) * width(batch.options)
        items = batch.items
        while batch.done < len(items):
            part = items[batch.done : batch.done + step]
            try:
                yield push_call(flows, batch.options, part)
            except NotDurable:
                batch.done += len(part)  # applied, only not confirmed: not to be sent again
                raise
            batch.done += len(part)
            sent += len(part) // width(batch.options)
    return sent


class Outgoing:
    """A producer's buffer, without I/O: the jobs taken and not yet sent, by options in the
    order they were pushed, and the error of a failed flush not yet raised. Thread-safe.

    A flush takes everything (:meth:`take`) and puts back what it could not send
    (:meth:`restore`) ahead of what was pushed meanwhile, so jobs of equal options go out in
    the order they were pushed whatever failed on the way.
    """

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._groups: dict[PushOptions, list[bytes]] = {}
        self._jobs = 0
        self._since: float | None = None  # monotonic time the buffer last became non-empty
        self._error: Exception | None = None
        self._closed = False
        self.sent = 0

    @property
    def jobs(self) -> int:
        return self._jobs

    def add(self, options: PushOptions, items: list[bytes], jobs: int) -> tuple[bool, bool]:
        """Takes ``jobs`` (their ``items``); raises instead, taking nothing, when a failed
        flush is yet to be raised. Returns (the buffer was empty, it holds a batch)."""
        with self._lock:
            if self._closed:
                raise RotatorError("the producer is closed")
            if self._error is not None:
                raise self._take_error()
            group = self._groups.get(options)
            if group is None:
                self._groups[options] = items
            else:
                group += items
            first = not self._jobs
            if first:
                self._since = time.monotonic()
            self._jobs += jobs
            return first, self._jobs >= self.max_batch

    def close(self) -> None:
        """Takes nothing more: a push racing the close raises rather than miss its flush."""
        with self._lock:
            self._closed = True

    def take(self) -> list[Batch]:
        """Everything buffered, as batches to send; [] when there is nothing."""
        with self._lock:
            if not self._jobs:
                return []
            groups, self._groups = self._groups, {}
            self._jobs = 0
            self._since = None
        return [Batch(options, items) for options, items in groups.items()]

    def restore(self, batches: list[Batch], error: Exception | None) -> None:
        """Puts back what a flush did not send, ahead of what was pushed since, and keeps
        ``error`` to raise (the first one, when several flushes failed before a raise)."""
        with self._lock:
            groups: dict[PushOptions, list[bytes]] = {}
            for batch in batches:
                rest = batch.items[batch.done :]
                self.sent += batch.done // width(batch.options)
                if rest:
                    groups[batch.options] = rest
                    self._jobs += len(rest) // width(batch.options)
            for options, items in self._groups.items():
                if options in groups:
                    groups[options] += items
                else:
                    groups[options] = items
            self._groups = groups
            if self._jobs:
                self._since = time.monotonic()  # a retry waits max_delay, it does not spin
            if error is not None and self._error is None:
                self._error = error

    def sent_all(self, batches: list[Batch]) -> None:
        with self._lock:
            self.sent += sum(batch.done // width(batch.options) for batch in batches)

    def due_in(self, max_delay: float) -> float | None:
        """Seconds until the oldest job has waited ``max_delay`` (<= 0: now); None: empty."""
        with self._lock:
            since = self._since if self._jobs else None
        return None if since is None else since + max_delay - time.monotonic()

    def take_error(self) -> Exception | None:
        with self._lock:
            return self._take_error() if self._error is not None else None

    def _take_error(self) -> Exception:
        error = self._error
        assert error is not None
        self._error = None
        kept = f"{self._jobs} jobs are buffered" if self._jobs else "nothing is buffered now"
        error.add_note(
            f"raised by an earlier flush of this producer; what it could not send was kept "
            f"and goes with the next flush ({kept})"
        )
        return error

    def discard(self) -> list[str]:
        with self._lock:
            groups, self._groups = self._groups, {}
            self._jobs = 0
            self._since = None
        return [
            protocol.text(job_id)
            for options, items in groups.items()
            for job_id in items[:: width(options)]
        ]


def options_of(
    delay: float | None,
    at: When | None,
    payloads: bool = False,
    priority: int = 0,
    unique: bool = False,
) -> PushOptions:
    if delay is None and at is None and not priority and not unique:
        return NOW_WITH_PAYLOADS if payloads else NOW
    level = protocol.check_priority(priority)
    if payloads and level:
        raise InvalidArgument("jobs with payloads take no priority yet")
    return PushOptions(protocol.check_due(delay, at), payloads, level, unique is True)


def check_producer(max_batch: int, max_delay: float) -> None:
    protocol.whole(max_batch, "max_batch", 1, MAX_BATCH)
    protocol.seconds_to_ms(max_delay, "max_delay", limit=MAX_PRODUCER_DELAY)


def payload_pair(flows: QueueFlows, job_id: str | int, payload: bytes | str) -> list[bytes]:
    if not flows.payloads:
        raise InvalidArgument("push_payload needs a queue made with payloads=True")
    if not flows.drop_payloads:
        raise InvalidArgument("publish to the topic instead of pushing payloads to a group")
    return [protocol.encode_id(job_id), protocol.encode_payload(payload)]


class Producer:
    """Gathers pushes into batched module calls; made by :meth:`rotator.Rotator.producer`.

    ``push`` and ``push_payload`` check their arguments at once (a bad id raises there,
    nothing taken) and return: the jobs go out ``max_batch`` to a call when that many are
    waiting (sent by the push that makes it so, so a producer faster than the server waits
    for it), when the oldest has waited ``max_delay`` seconds (a background thread), on
    :meth:`flush` and on exit. Thread-safe: threads may push through one producer. Jobs
    with equal options (``delay``/``at``, payload or not) share calls and reach the queue in
    the order they were pushed; each call is atomic. ``delay`` counts from the call that
    sends the job, up to ``max_delay`` after the push.

    A flush that fails keeps the jobs it could not send, ahead of those pushed later, and
    the next flush sends them again. Its error is raised once, by the next ``push`` or
    ``push_payload`` (which then take nothing), ``flush`` or exit (which send first). A
    call whose reply was lost (a connection dropped after the server ran it) is sent again
    too: those jobs are then pushed twice, as by a retried ``q.push``. :meth:`discard` gives
    up on what is buffered. A producer never closed goes on flushing in the background, but
    what it holds when the program ends is lost: leave it by ``with``, or :meth:`close` it.
    """

    def __init__(
        self,
        rotator: Rotator,
        *,
        max_batch: int = DEFAULT_PRODUCER_BATCH,
        max_delay: float = DEFAULT_PRODUCER_DELAY,
    ) -> None:
        check_producer(max_batch, max_delay)
        self.rotator = rotator
        self.max_batch = max_batch
        self.max_delay = float(max_delay)
        self._flows = rotator._flows
        self._out = Outgoing(max_batch)
        self._sending = threading.Lock()  # one flush at a time: batches leave in order
        self._wake = threading.Condition()
        self._closed = False
        self._timer = threading.Thread(target=self._flush_in_time, name="rotator-producer")
        self._timer.daemon = True
        self._timer.start()

    def __repr__(self) -> str:
        return f"Producer({self.rotator.name!r}, pending={self.pending}, sent={self.sent})"

    @property
    def pending(self) -> int:
        """Jobs taken and not sent yet (those of a failed flush included)."""
        return self._out.jobs

    @property
    def sent(self) -> int:
        """Jobs sent so far (calls the server answered)."""
        return self._out.sent

    def push(
        self,
        *ids: str | int,
        delay: float | None = None,
        at: When | None = None,
        priority: int = 0,
        unique: bool = False,
    ) -> None:
        """Takes job ids to push, with ``delay``/``at``/``priority``/``unique`` as
        :meth:`rotator.Rotator.push`."""
        options = options_of(delay, at, priority=priority, unique=unique)
        self._take(options, protocol.encode_ids(ids), len(ids))

    def push_payload(
        self,
        job_id: str | int,
        payload: bytes | str,
        *,
        delay: float | None = None,
        at: When | None = None,
        unique: bool = False,
    ) -> None:
        """Takes a job with its payload, as :meth:`rotator.Rotator.push_payloads` pushes it."""
        options = options_of(delay, at, True, unique=unique)
        self._take(options, payload_pair(self._flows, job_id, payload), 1)

    def flush(self) -> None:
        """Sends every job taken so far; returns once the server has them all. Raises the
        error of this flush (the jobs it could not send are kept), or else that of an
        earlier one not raised yet."""
        error = self._send()
        if error is not None:
            self._out.take_error()  # superseded: this one is about the same jobs
            raise error
        if (earlier := self._out.take_error()) is not None:
            raise earlier

    def discard(self) -> list[str]:
        """Forgets every job buffered and not sent (after a flush the server refuses for
        good, say); returns their ids, in order within each set of options."""
        with self._sending:
            return self._out.discard()

    def close(self) -> None:
        """Stops the background flush, then :meth:`flush`: what :meth:`flush` raises, this
        raises (the producer stays closed; ``flush`` may be called again)."""
        if not self._closed:
            self._closed = True
            self._out.close()
            with self._wake:
                self._wake.notify()
            self._timer.join()
        self.flush()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _take(self, options: PushOptions, items: list[bytes], jobs: int) -> None:
        if not jobs:
            return
        first, full = self._out.add(options, items, jobs)
        if full:
            self._send()  # a failure is kept for the next call to raise
        elif first:
            with self._wake:
                self._wake.notify()

    def _send(self) -> Exception | None:
        """One flush: sends what is buffered. On failure, keeps what was not sent and the
        error, and returns the error."""
        with self._sending:
            batches = self._out.take()
            if not batches:
                return None
            try:
                self.rotator._run(send(self._flows, batches, self.max_batch))
            except Exception as failure:
                self._out.restore(batches, failure)
                error = failure
            except BaseException:
                self._out.restore(batches, None)  # interrupted: kept, nothing to report
                raise
            else:
                self._out.sent_all(batches)
                return None
        with self._wake:
            self._wake.notify()  # the timer sends it again in max_delay
        return error

    def _flush_in_time(self) -> None:
        out = self._out
        while True:
            with self._wake:
                while not self._closed:
                    wait = out.due_in(self.max_delay)
                    if wait is not None and wait <= 0:
                        break
                    self._wake.wait(wait)
                else:
                    return
            self._send()


class AsyncProducer:
    """The asyncio twin of :class:`Producer`: the background flush is a task, pushes are
    awaited (a push that fills a batch sends it). Safe for the tasks of one event loop.
    Cancelling a task in the middle of a flush keeps the jobs of the call it interrupted:
    the next flush sends them again (twice, if that call had run)."""

    def __init__(
        self,
        rotator: AsyncRotator,
        *,
        max_batch: int = DEFAULT_PRODUCER_BATCH,
        max_delay: float = DEFAULT_PRODUCER_DELAY,
    ) -> None:
        check_producer(max_batch, max_delay)
        self.rotator = rotator
        self.max_batch = max_batch
        self.max_delay = float(max_delay)
        self._flows = rotator._flows
        self._out = Outgoing(max_batch)
        self._sending = asyncio.Lock()  # bound to a loop at its first use
        self._wake = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"AsyncProducer({self.rotator.name!r}, pending={self.pending}, sent={self.sent})"

    @property
    def pending(self) -> int:
        return self._out.jobs

    @property
    def sent(self) -> int:
        return self._out.sent

    async def push(
        self,
        *ids: str | int,
        delay: float | None = None,
        at: When | None = None,
        priority: int = 0,
        unique: bool = False,
    ) -> None:
        options = options_of(delay, at, priority=priority, unique=unique)
        await self._take(options, protocol.encode_ids(ids), len(ids))

    async def push_payload(
        self,
        job_id: str | int,
        payload: bytes | str,
        *,
        delay: float | None = None,
        at: When | None = None,
        unique: bool = False,
    ) -> None:
        pair = payload_pair(self._flows, job_id, payload)
        await self._take(options_of(delay, at, True, unique=unique), pair, 1)

    async def flush(self) -> None:
        error = await self._send()
        if error is not None:
            self._out.take_error()
            raise error
        if (earlier := self._out.take_error()) is not None:
            raise earlier

    async def discard(self) -> list[str]:
        async with self._sending:
            return self._out.discard()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._out.close()
            if self._timer is not None:
                self._timer.cancel()  # its flush runs on, shielded; ours waits for it
                await asyncio.gather(self._timer, return_exceptions=True)
        await self.flush()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _take(self, options: PushOptions, items: list[bytes], jobs: int) -> None:
        if not jobs:
            return
        first, full = self._out.add(options, items, jobs)
        if self._timer is None:
            self._timer = asyncio.ensure_future(self._flush_in_time())
        if full:
            await self._send()
        elif first:
            self._wake.set()

    async def _send(self) -> Exception | None:
        async with self._sending:
            batches = self._out.take()
            if not batches:
                return None
            try:
                await self.rotator._run(send(self._flows, batches, self.max_batch))
            except Exception as failure:
                self._out.restore(batches, failure)
                error = failure
            except BaseException:
                self._out.restore(batches, None)
                raise
            else:
                self._out.sent_all(batches)
                return None
        self._wake.set()
        return error

    async def _flush_in_time(self) -> None:
        out, wake = self._out, self._wake
        while not self._closed:
            wait = out.due_in(self.max_delay)
            if wait is None:
                wake.clear()
                await wake.wait()
            elif wait > 0:
                await asyncio.sleep(wait)
            else:
                # Shielded: closing cancels this task, never a call on its way.
                await asyncio.shield(self._send())


# -- consuming --------------------------------------------------------------------------------


# Nacks a consumer holds for its next claim: (jobs, delay in ms) groups, in the order taken.
Nacks = list[tuple[list[Job], int]]


class Prefetch:
    """A consumer's jobs, without I/O: claimed and not handed out yet (in order), handed
    out and neither acked nor nacked, and acked or nacked with the call still to send. All
    of them are held in :attr:`ledger`, which says whose leases are due for an extend.
    Thread-safe."""

    def __init__(self, timeout: float, prefetch: int) -> None:
        self.ledger = Ledger(timeout, prefetch)
        self._lock = threading.Lock()
        self._ready: deque[Job] = deque()
        self._out: dict[str, Job] = {}  # token -> job
        self._acks: list[Job] = []
        self._acking: set[str] = set()  # their tokens: a job acked twice is sent once
        self._nacks: dict[int, list[Job]] = {}  # delay_ms -> jobs, in the order nacked
        # Tokens of the nacks taken and not yet sent (those of a claim on its way too): a
        # job nacked is neither nacked again nor acked.
        self._nacking: set[str] = set()
        self._closed = False

    @property
    def ready(self) -> int:
        return len(self._ready)

    def hand_out(self) -> Job | None:
        """The next prefetched job, or None; a job whose lease was lost meanwhile (another
        consumer has it now) is dropped, not handed out."""
        while True:
            with self._lock:
                if not self._ready:
                    return None
                job = self._ready.popleft()
                if not self.ledger.lost(job):
                    self._out[job.token] = job
                    return job
            log.warning("job %s lost its lease while prefetched; skipped", job.id)
            self.ledger.release([job])

    def ack(self, jobs: Sequence[Job]) -> bool:
        """Buffers acks for the next claim; False when closed (send them at once)."""
        with self._lock:
            if self._closed:
                return False
            for job in jobs:
                if job.token not in self._acking and job.token not in self._nacking:
                    self._acking.add(job.token)
                    self._acks.append(job)
                    self._out.pop(job.token, None)
                    self.ledger.handled(job)
            return True

    def nack(self, jobs: Sequence[Job], delay_ms: int) -> tuple[int, list[Job]] | None:
        """Buffers nacks for the next claim, the jobs held until they are sent; None when
        closed (send them at once). Returns (how many were taken: the jobs handed out and
        neither acked nor nacked, the jobs this consumer never held, to give back now)."""
        with self._lock:
            if self._closed:
                return None
            taken = 0
            foreign: list[Job] = []
            for job in jobs:
                token = job.token
                if token in self._out:
                    del self._out[token]
                    self._nacking.add(token)
                    self._nacks.setdefault(delay_ms, []).append(job)
                    taken += 1
                elif token not in self._acking and token not in self._nacking:
                    foreign.append(job)
            return taken, foreign

    def given_back(self, jobs: Sequence[Job]) -> None:
        with self._lock:
            for job in jobs:
                self._out.pop(job.token, None)
        self.ledger.release(list(jobs))

    def take_acks(self) -> list[Job]:
        with self._lock:
            acks, self._acks = self._acks, []
            self._acking.clear()
            return acks

    def take_nacks(self) -> Nacks:
        """The nacks buffered, for a claim to carry (their jobs stay held until it lands)."""
        with self._lock:
            nacks, self._nacks = self._nacks, {}
            return [(jobs, delay_ms) for delay_ms, jobs in nacks.items()]

    def claimed(self, acks: list[Job], nacks: Nacks, jobs: list[Job]) -> None:
        """A claim that carried ``acks`` and ``nacks`` returned ``jobs``."""
        given = [job for group, _ in nacks for job in group]
        self.ledger.release(acks)
        self.ledger.release(given)
        self.ledger.hold(jobs)
        with self._lock:
            self._nacking.difference_update(job.token for job in given)
            self._ready += jobs

    def claim_failed(self, acks: list[Job], nacks: Nacks) -> None:
        """A claim raised: its acks and nacks ride on the next one, ahead of those given
        since (sent twice, if it had run: a second ack or nack of a job changes nothing)."""
        with self._lock:
            self._acks[:0] = acks
            self._acking.update(job.token for job in acks)
            groups = {delay_ms: list(group) for group, delay_ms in nacks}
            for delay_ms, group in self._nacks.items():
                groups.setdefault(delay_ms, []).extend(group)
            self._nacks = groups

    def close(self) -> tuple[list[Job], Nacks, list[Job]]:
        """Closes; returns (the acks to send, the nacks to send, the jobs to give back:
        prefetched, or handed out and neither acked nor nacked)."""
        with self._lock:
            self._closed = True
            acks, self._acks = self._acks, []
            self._acking.clear()
            nacks = [(jobs, delay_ms) for delay_ms, jobs in self._nacks.items()]
            self._nacks = {}
            self._nacking.clear()
            back = [*self._out.values(), *self._ready]
            self._out.clear()
            self._ready.clear()
            return acks, nacks, back

    def release(self, jobs: list[Job]) -> None:
        self.ledger.release(jobs)


class Finishing(NamedTuple):
    """One call of a consumer's close: its flow, and the jobs it lets go of."""

    flow: Flow[int]
    jobs: list[Job]


def finishing(flows: QueueFlows, acks: list[Job], nacks: Nacks, back: list[Job]) -> list[Finishing]:
    """What a consumer's close sends, in order: the acks, the nacks with their delays, and
    then the give-back (no delay) of the jobs neither acked nor nacked."""
    sends = [Finishing(flows.ack_refs(acks, pack=True), acks)] if acks else []
    sends += [Finishing(give_back(flows, jobs, delay_ms), jobs) for jobs, delay_ms in nacks]
    if back:
        sends.append(Finishing(give_back(flows, back, 0), back))
    return sends


def give_back(flows: QueueFlows, jobs: list[Job], delay_ms: int) -> Flow[int]:
    """Nacks ``jobs``, to come back ``delay_ms`` later; how many were given back."""
    given = 0
    for call in flows.nack_calls(jobs, delay_ms):
        given += yield call
    return given


def check_consumer(prefetch: int, block: float, stop_when_empty: bool) -> float:
    protocol.check_count(prefetch)
    waited = protocol.check_block(block)
    if not waited and not stop_when_empty:
        raise InvalidArgument("a consumer that does not stop when empty needs block > 0")
    return waited or 0.0


def keep_leases(rotator: Rotator, ledger: Ledger, done: threading.Event) -> None:
    """Extends the half-used leases of the jobs a consumer holds until ``done``; holds no
    reference to the consumer, so that one dropped unclosed stops this (its finalizer sets
    ``done``) and its jobs come back when their leases run out."""
    while not done.wait(ledger.heartbeat_interval()):
        extend_due(rotator, ledger)


async def keep_leases_async(rotator: AsyncRotator, ledger: Ledger) -> None:
    """The asyncio twin of :func:`keep_leases`, until cancelled."""
    while True:
        await asyncio.sleep(ledger.heartbeat_interval())
        await extend_due_async(rotator, ledger)


class Consumer:
    """Hands out jobs one at a time from batched claims; made by
    :meth:`rotator.Rotator.consumer`.

    Iterating claims ``prefetch`` jobs a call (``next(prefetch, block)``) whenever the jobs
    in hand run out, and yields them one by one. :meth:`ack` and :meth:`nack` buffer: the
    acks ride on the next claim (whole batches as one batch ack), and the nacks go in the
    same round trip as that claim (pipelined ahead of it). A background thread extends the
    lease of every job held (prefetched, handed out, or acked or nacked and not yet sent)
    once it has used half of it; a prefetched job whose lease was lost anyway is skipped.
    Iteration ends on :meth:`stop` (any thread; a claim that is blocked returns first,
    within ``block`` seconds), on close, and, with ``stop_when_empty``, when a claim finds
    nothing. Exit sends the acks and nacks still buffered (with their delays), then gives
    back (nack, no delay) every job neither acked nor nacked: the prefetched ones and those
    handed out. Thread-safe: threads may iterate, ack and nack.

    A claim that raises raises from the iteration; its acks and nacks stay buffered for the
    next.
    """

    def __init__(
        self,
        rotator: Rotator,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        block: float = DEFAULT_CONSUMER_BLOCK,
        stop_when_empty: bool = False,
    ) -> None:
        self.block = check_consumer(prefetch, block, stop_when_empty)
        self.rotator = rotator
        self.prefetch = prefetch
        self.stop_when_empty = stop_when_empty
        self._state = Prefetch(rotator.timeout, prefetch)
        self._claiming = threading.Lock()
        self._stopped = threading.Event()
        self._closed = False
        self._done = threading.Event()  # ends the lease keeping
        self._keeper: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Consumer({self.rotator.name!r}, prefetch={self.prefetch})"

    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> Job:
        state = self._state
        while not self._stopped.is_set():
            job = state.hand_out()
            if job is not None:
                return job
            with self._claiming:
                if state.ready or self._stopped.is_set():
                    continue
                if not self._claim() and self.stop_when_empty:
                    break
        raise StopIteration

    def ack(self, *jobs: Job) -> None:
        """Acks jobs with the next claim (or at exit); after close, at once."""
        if not self._state.ack(jobs):
            self.rotator.ack(*jobs)

    def nack(self, *jobs: Job, delay: float = 0.0) -> int:
        """Gives jobs back with the next claim (in its round trip), or at close, to be
        delivered again ``delay`` seconds after that (see :meth:`rotator.Rotator.nack`);
        their leases are kept until then. Returns how many it took: the jobs it handed out
        and holds, neither acked nor nacked (a job given twice counts once). Jobs it never
        held go at once, and count when the server gave them back; so does everything
        after close."""
        delay_ms = protocol.seconds_to_ms(delay, "delay", allow_zero=True)
        taken = self._state.nack(jobs, delay_ms)
        if taken is None:
            given = self.rotator.nack(*jobs, delay=delay)
            self._state.given_back(jobs)
            return given
        count, foreign = taken
        return count + (self.rotator.nack(*foreign, delay=delay) if foreign else 0)

    def stop(self) -> None:
        """Ends the iteration (every thread's) before the next job; jobs still prefetched
        are given back on exit."""
        self._stopped.set()

    def close(self) -> None:
        """Stops, sends the acks and nacks still buffered, gives back every job neither acked
        nor nacked, and stops keeping leases. Raises what those calls raised (the jobs
        concerned come back when their leases run out). Idempotent."""
        self._stopped.set()
        with self._claiming:  # a claim on its way lands first
            if self._closed:
                return
            self._closed = True
            acks, nacks, back = self._state.close()
            try:
                self._finish(acks, nacks, back)
            finally:
                self._done.set()
                if self._keeper is not None:
                    self._keeper.join()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except Exception as error:
            if exc is None:
                raise
            # The block's own error says more; these jobs come back after their leases.
            log.warning("closing the consumer failed too: %s", error)

    def _claim(self) -> bool:
        if self._keeper is None:
            self._keeper = threading.Thread(
                target=keep_leases,
                args=(self.rotator, self._state.ledger, self._done),
                name="rotator-consumer-leases",
                daemon=True,
            )
            self._keeper.start()
            weakref.finalize(self, self._done.set)  # dropped unclosed: the leases run out
        state, rotator = self._state, self.rotator
        acks = state.take_acks()
        nacks = state.take_nacks()
        try:
            # Rotator.next's flow, with the nacks that go in the claim's round trip.
            jobs = rotator._run(rotator._flows.next(self.prefetch, self.block, acks, nacks=nacks))
        except BaseException:
            state.claim_failed(acks, nacks)
            raise
        state.claimed(acks, nacks, jobs)
        return bool(jobs)

    def _finish(self, acks: list[Job], nacks: Nacks, back: list[Job]) -> None:
        failed: Exception | None = None
        for sent in finishing(self.rotator._flows, acks, nacks, back):
            try:
                self.rotator._run(sent.flow)
            except Exception as error:
                failed = failed or error
            self._state.release(sent.jobs)
        if failed is not None:
            raise failed


class AsyncConsumer:
    """The asyncio twin of :class:`Consumer` (``async for``; the lease keeping is a task).
    Safe for the tasks of one event loop."""

    def __init__(
        self,
        rotator: AsyncRotator,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        block: float = DEFAULT_CONSUMER_BLOCK,
        stop_when_empty: bool = False,
    ) -> None:
        self.block = check_consumer(prefetch, block, stop_when_empty)
        self.rotator = rotator
        self.prefetch = prefetch
        self.stop_when_empty = stop_when_empty
        self._state = Prefetch(rotator.timeout, prefetch)
        self._claiming = asyncio.Lock()
        self._stopped = False
        self._closed = False
        self._keeper: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"AsyncConsumer({self.rotator.name!r}, prefetch={self.prefetch})"

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> Job:
        state = self._state
        while not self._stopped:
            job = state.hand_out()
            if job is not None:
                return job
            async with self._claiming:
                if state.ready or self._stopped:
                    continue
                if not await self._claim() and self.stop_when_empty:
                    break
        raise StopAsyncIteration

    async def ack(self, *jobs: Job) -> None:
        if not self._state.ack(jobs):
            await self.rotator.ack(*jobs)

    async def nack(self, *jobs: Job, delay: float = 0.0) -> int:
        """As :meth:`Consumer.nack`: with the next claim, or at close."""
        delay_ms = protocol.seconds_to_ms(delay, "delay", allow_zero=True)
        taken = self._state.nack(jobs, delay_ms)
        if taken is None:
            given = await self.rotator.nack(*jobs, delay=delay)
            self._state.given_back(jobs)
            return given
        count, foreign = taken
        return count + (await self.rotator.nack(*foreign, delay=delay) if foreign else 0)

    def stop(self) -> None:
        self._stopped = True

    async def close(self) -> None:
        self._stopped = True
        async with self._claiming:
            if self._closed:
                return
            self._closed = True
            acks, nacks, back = self._state.close()
            try:
                await self._finish(acks, nacks, back)
            finally:
                if self._keeper is not None:
                    self._keeper.cancel()
                    await asyncio.gather(self._keeper, return_exceptions=True)

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.close()
        except Exception as error:
            if exc is None:
                raise
            log.warning("closing the consumer failed too: %s", error)

    async def _claim(self) -> bool:
        if self._keeper is None:
            self._keeper = asyncio.ensure_future(
                keep_leases_async(self.rotator, self._state.ledger)
            )
            weakref.finalize(self, self._keeper.cancel)  # dropped unclosed: the leases run out
        state, rotator = self._state, self.rotator
        acks = state.take_acks()
        nacks = state.take_nacks()
        flow = rotator._flows.next(self.prefetch, self.block, acks, nacks=nacks)
        try:
            jobs = await rotator._run(flow)
        except BaseException:
            state.claim_failed(acks, nacks)
            raise
        state.claimed(acks, nacks, jobs)
        return bool(jobs)

    async def _finish(self, acks: list[Job], nacks: Nacks, back: list[Job]) -> None:
        failed: Exception | None = None
        for sent in finishing(self.rotator._flows, acks, nacks, back):
            try:
                await self.rotator._run(sent.flow)
            except Exception as error:
                failed = failed or error
            self._state.release(sent.jobs)
        if failed is not None:
            raise failed


__all__ = [
    "AsyncConsumer",
    "AsyncProducer",
    "Consumer",
    "Producer",
    "PushOptions",
]
