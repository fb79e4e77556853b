"""The worker loop: claim, run the handler, ack or nack, keep long leases alive, stop cleanly.

Each loop claims jobs in batches and acks finished ones in the same call that claims the
next batch, so a busy worker pays one round trip per batch. A claim takes about
WORK_CLAIM_SECONDS of work at the handler's recent pace, at most ``batch`` jobs (the first
claim takes one): fast jobs go many per round trip, slow ones one at a time, so that idle
workers elsewhere can take the rest. A heartbeat extends the lease of any job held (waiting
its turn or running) once it has used half its lease; it also keeps the worker's entry in
the queue's worker registry (:mod:`rotator.registry`), removed on a clean stop.
SIGINT/SIGTERM stop claiming; jobs already started are finished and acked, jobs claimed but
not started are given back at once.

:class:`Worker` runs loops in threads over a :class:`rotator.Rotator`; :class:`AsyncWorker`
runs them as tasks over a :class:`rotator.aio.AsyncRotator`. What they decide alike (which
jobs are held, which leases are due or lost, how much to claim, what was done) is one
:class:`Ledger`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import threading
import time
from itertools import islice
from types import FrameType
from typing import TYPE_CHECKING, Any

from redis.exceptions import AuthenticationError, NoPermissionError, RedisError

from rotator import protocol
from rotator.defaults import (
    CLAIM_RETRY_CAP,
    CLAIM_RETRY_FIRST,
    DEFAULT_POLL,
    DEFAULT_WORK_BATCH,
    MAX_ERROR_BYTES,
    RETRIED_MEMORY,
    RETRY_BACKOFF_BASE,
    RETRY_BACKOFF_CAP,
    WORK_CLAIM_SECONDS,
)
from rotator.errors import JobCancelled, ServerBusy
from rotator.models import AsyncHandler, Handler, Job, WorkSummary
from rotator.registry import HELD_SHOWN, Presence
from rotator.schedules import Keeper

if TYPE_CHECKING:
    from rotator.aio import AsyncRotator
    from rotator.core import Rotator

log = logging.getLogger("rotator.worker")


def transient(error: Exception) -> bool:
    """True for server errors worth waiting out; ACL and auth errors need a person."""
    if isinstance(error, NoPermissionError | AuthenticationError):
        return False
    return isinstance(error, RedisError | ServerBusy)


def retry_delay(deliveries: int) -> float:
    """Exponential backoff before a failed job is delivered again."""
    return float(min(RETRY_BACKOFF_BASE * 2 ** max(deliveries - 1, 0), RETRY_BACKOFF_CAP))


def claim_pause(failures: int) -> float:
    """Seconds to wait before claiming again after ``failures`` transient errors in a row."""
    pause = min(CLAIM_RETRY_CAP, CLAIM_RETRY_FIRST * 2 ** (failures - 1))
    return float(pause * random.uniform(0.5, 1.0))


def failure_reason(error: BaseException) -> str:
    """The error text kept with a failed job: its first MAX_ERROR_BYTES bytes (a longer one
    would be refused)."""
    text = f"{type(error).__name__}: {error}".encode("utf-8", "replace")[:MAX_ERROR_BYTES]
    return text.decode("utf-8", "ignore")


def last_delivery(job: Job, max_deliveries: int | None) -> bool:
    """True when a failure of this delivery sends the job to the dead letters: the next
    claim that reaches it finds it delivered ``max_deliveries`` times."""
    return max_deliveries is not None and job.deliveries >= max_deliveries


def log_failure(job: Job, error: BaseException, delay: float, max_deliveries: int | None) -> None:
    # One line per failure, saying what happens to the job; the traceback only when debugging.
    of = f" of {max_deliveries}" if max_deliveries else ""
    then = (
        "no deliveries left: it goes to the dead letters"
        if last_delivery(job, max_deliveries)
        else f"retrying in {delay:g} s"
    )
    log.warning(
        "job %s failed (delivery %d%s): %s; %s", job.id, job.deliveries, of, error, then,
        exc_info=log.isEnabledFor(logging.DEBUG),
    )  # fmt: skip


def extend_due(rotator: Rotator, ledger: Ledger) -> None:
    """One heartbeat of a worker or consumer: extends the held leases that are half used, in
    one call. A lease found lost is asked about once more, alone: ``extend`` raises
    JobCancelled for a job cancelled, and the ledger logs and counts why."""
    now, due = ledger.due()
    if not due:
        return
    try:
        kept = rotator.extend_many(due)
    except Exception as error:
        log.warning("could not extend %d leases (%s); will retry", len(due), error)
        return
    for job in ledger.extended(now, due, kept):
        try:
            rotator.extend(job)
        except JobCancelled:
            ledger.lost_because(job, cancelled=True)
            continue
        except Exception:  # LeaseLost, or the server: lost is what the first call said
            pass
        ledger.lost_because(job, cancelled=False)


async def extend_due_async(rotator: AsyncRotator, ledger: Ledger) -> None:
    """The asyncio twin of :func:`extend_due`."""
    now, due = ledger.due()
    if not due:
        return
    try:
        kept = await rotator.extend_many(due)
    except Exception as error:
        log.warning("could not extend %d leases (%s); will retry", len(due), error)
        return
    for job in ledger.extended(now, due, kept):
        try:
            await rotator.extend(job)
        except JobCancelled:
            ledger.lost_because(job, cancelled=True)
            continue
        except Exception:  # LeaseLost, or the server: lost is what the first call said
            pass
        ledger.lost_because(job, cancelled=False)


def failure_delay(job: Job, max_deliveries: int | None) -> float:
    """Backoff before a failed job is delivered again; none on its last delivery, so that
    the next claim moves it to the dead letters at once."""
    return 0.0 if last_delivery(job, max_deliveries) else retry_delay(job.deliveries)


class Ledger:
    """What a worker holds and has done, shared by its loops and its heartbeat.

    Every job claimed and not yet acked or nacked is held, with the monotonic time its lease
    runs out: jobs waiting their turn in a batch and finished jobs whose ack rides on the
    next claim need their leases kept as much as the one running. Thread-safe.
    """

    def __init__(self, timeout: float, batch: int) -> None:
        self.timeout = timeout
        self.batch = batch
        self._lock = threading.Lock()
        self._held: dict[str, tuple[Job, float]] = {}
        self._lost: set[str] = set()
        # Handled jobs whose ack is on its way: a refused extend means the ack landed first.
        self._handled: set[str] = set()
        self._processed = self._failed = self._lost_count = self._retried = self._dead = 0
        self._cancelled = 0
        # Ids of jobs that failed here and were given back, so that a job retried several
        # times counts once in ``retried``. Forgotten when the job completes or dies here;
        # cleared past RETRIED_MEMORY ids (jobs completed elsewhere would otherwise stay).
        self._retrying: set[str] = set()
        # Seconds per job over the recent batches (None until one was run): sizes claims.
        self._pace: float | None = None
        # How long each job completed since the last report took (Rotator.durations).
        self._durations: list[float] = []

    def hold(self, jobs: list[Job]) -> None:
        expiry = time.monotonic() + self.timeout
        with self._lock:
            for job in jobs:
                self._held[job.token] = (job, expiry)

    def release(self, jobs: list[Job]) -> None:
        with self._lock:
            for job in jobs:
                self._held.pop(job.token, None)
                self._lost.discard(job.token)
                self._handled.discard(job.token)

    def lost(self, job: Job) -> bool:
        """True when another consumer has the job now: running it here would duplicate it."""
        with self._lock:
            return job.token in self._lost

    def handled(self, job: Job, seconds: float | None = None) -> bool:
        """Counts a job completed here (``seconds``: how long its handler ran), and True: ack
        it. False when its lease was found lost while the handler ran (cancelled, or taken
        over): its ack would be refused, so it is neither counted nor acked, only released."""
        with self._lock:
            if job.token in self._lost:
                self._held.pop(job.token, None)
                self._lost.discard(job.token)
                return False
            self._handled.add(job.token)
            self._processed += 1
            if seconds is not None:
                self._durations.append(seconds)
            if self._retrying:
                self._retrying.discard(job.id)
        return True

    def take_durations(self) -> list[float]:
        """The processing times noted since the last call (for the queue's histogram)."""
        with self._lock:
            taken, self._durations = self._durations, []
        return taken

    def note_durations(self, times: list[float]) -> None:
        """Processing times taken but not sent: they go with the next claim."""
        with self._lock:
            self._durations.extend(times)

    def failed(self, job: Job, dead: bool) -> None:
        """Counts a failed delivery: the job is dead (its last delivery) or given back."""
        with self._lock:
            self._failed += 1
            if dead:
                self._dead += 1
                self._retrying.discard(job.id)
            elif job.id not in self._retrying:
                if len(self._retrying) >= RETRIED_MEMORY:
                    self._retrying.clear()
                self._retrying.add(job.id)
                self._retried += 1

    def claim_size(self) -> int:
        """Jobs to claim next: about WORK_CLAIM_SECONDS of work, 1..batch."""
        pace = self._pace
        if pace is None:
            return 1
        if pace * self.batch <= WORK_CLAIM_SECONDS:
            return self.batch
        return max(1, min(self.batch, int(WORK_CLAIM_SECONDS / pace)))

    def note_pace(self, seconds_per_job: float) -> None:
        # A moving average: one slow batch halves the next claim, it does not reset it.
        # Loops share it; a lost update only skews one claim.
        pace = self._pace
        self._pace = seconds_per_job if pace is None else (pace + seconds_per_job) / 2

    def heartbeat_interval(self) -> float:
        return max(min(self.timeout / 4, 5.0), 0.01)

    def due(self) -> tuple[float, list[Job]]:
        """``(now, jobs)``: the held jobs that have used half their lease."""
        now = time.monotonic()
        with self._lock:
            return now, [
                job
                for token, (job, expiry) in self._held.items()
                if expiry - now < self.timeout / 2 and token not in self._lost
            ]

    def extended(self, now: float, due: list[Job], kept: list[bool]) -> list[Job]:
        """Records what an extend of ``due`` (sent at ``now``) answered; returns the jobs
        whose leases it found lost (see :meth:`lost_because`)."""
        lost: list[Job] = []
        with self._lock:
            for job, ok in zip(due, kept, strict=True):
                if job.token not in self._held or (not ok and job.token in self._handled):
                    continue  # acked or nacked meanwhile: nothing was lost
                if ok:
                    self._held[job.token] = (job, now + self.timeout)
                else:
                    self._lost.add(job.token)
                    self._lost_count += 1
                    lost.append(job)
        return lost

    def lost_because(self, job: Job, cancelled: bool) -> None:
        """Logs a lease found lost: its job was cancelled, or another consumer has it. Either
        way the job is neither acked nor retried here."""
        if cancelled:
            with self._lock:
                self._cancelled += 1
            log.warning("job %s was cancelled: stopped keeping it, not acked, not retried", job.id)
        else:
            log.warning("lease of job %s was lost; it will not be acked here", job.id)

    def summary(self) -> WorkSummary:
        return WorkSummary(
            self._processed,
            self._failed,
            self._lost_count,
            self._retried,
            self._dead,
            self._cancelled,
        )

    def presence(self, limit: int) -> tuple[list[tuple[str, float]], int, tuple[int, int, int]]:
        """What the worker registry shows: ``(id, monotonic lease expiry)`` of the first
        ``limit`` jobs held (earliest claimed first), how many are held (a lost lease is not
        held any more), and the jobs completed, retried and dead so far."""
        with self._lock:
            live = (
                (job.id, expiry)
                for token, (job, expiry) in self._held.items()
                if token not in self._lost
            )
            held = list(islice(live, limit))
            holding = len(self._held) - len(self._lost)
            return held, holding, (self._processed, self._retried, self._dead)


def report_failed(presence: Presence, error: Exception) -> None:
    """A worker registry write failed: the jobs go on all the same. Said once, not on every
    heartbeat; a server that refuses it for good (ACL) is not asked again."""
    if not transient(error):
        presence.enabled = False
        log.warning("not reporting to the worker registry: %s", error)
    elif not presence.failing:
        log.warning("could not report to the worker registry (%s); will retry", error)
    presence.failing = True


class Worker:
    def __init__(
        self,
        rotator: Rotator,
        handler: Handler,
        *,
        concurrency: int = 1,
        batch: int = DEFAULT_WORK_BATCH,
        poll: float = DEFAULT_POLL,
    ) -> None:
        self.rotator = rotator
        self.handler = handler
        self.concurrency = protocol.whole(concurrency, "concurrency", 1, 1024)
        self.batch = protocol.check_count(batch)
        self.poll = poll
        self._stop = threading.Event()
        self._ledger = Ledger(rotator.timeout, self.batch)
        self._presence = Presence(rotator.keys.name)
        self._schedules_kept = Keeper()

    @property
    def worker_id(self) -> str:
        """This worker's field in the queue's worker registry (``Rotator.workers``)."""
        return self._presence.id

    def stop(self) -> None:
        """Asks every loop to finish its current job and return."""
        self._stop.set()

    def run(
        self, *, stop_when_empty: bool = False, install_signal_handlers: bool = True
    ) -> WorkSummary:
        for warning in self.rotator.server_warnings():
            log.warning("%s", warning)
        restore = self._install_signals() if install_signal_handlers else {}
        self._presence.start()
        heartbeat = threading.Thread(target=self._heartbeat, name="rotator-heartbeat", daemon=True)
        heartbeat.start()
        try:
            if self.concurrency == 1:
                self._loop(stop_when_empty)
            else:
                failed: list[BaseException] = []
                threads = [
                    threading.Thread(
                        target=self._thread_loop,
                        args=(stop_when_empty, failed),
                        name=f"rotator-{i}",
                    )
                    for i in range(self.concurrency)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    while thread.is_alive():  # join in slices so signals reach the main thread
                        thread.join(0.2)
                if failed:
                    raise failed[0]
        finally:
            self._stop.set()
            heartbeat.join()
            for signum, previous in restore.items():
                signal.signal(signum, previous)
            self._send_durations()
            self._forget()
        return self._ledger.summary()

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: finishing the jobs in hand, then stopping", signum)
            self.stop()

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _thread_loop(self, stop_when_empty: bool, failed: list[BaseException]) -> None:
        """One of several loops, in a thread of its own: an error that ends it (one not worth
        waiting out) stops the others too, and run raises it, as with one loop."""
        try:
            self._loop(stop_when_empty)
        except BaseException as error:
            failed.append(error)
            self._stop.set()

    def _loop(self, stop_when_empty: bool) -> None:
        ledger = self._ledger
        finished: list[Job] = []
        failures = 0
        try:
            while not self._stop.is_set():
                # The processing times of the jobs done here ride on the claim with the acks.
                times = ledger.take_durations()
                try:
                    jobs = self.rotator.next(
                        ledger.claim_size(), block=self.poll, ack=finished, durations=times
                    )
                except Exception as error:
                    ledger.note_durations(times)  # for the next claim
                    if not transient(error):
                        raise
                    # Wait it out instead of dying: the leases held stay held (the heartbeat
                    # keeps extending them) and `finished` rides on the next claim.
                    failures += 1
                    pause = claim_pause(failures)
                    log.warning("could not claim jobs (%s); trying again in %.2f s", error, pause)
                    self._stop.wait(pause)
                    continue
                failures = 0
                ledger.release(finished)
                finished = []
                ledger.hold(jobs)
                if not jobs:
                    if stop_when_empty and self._drained():
                        return
                    continue
                began = time.monotonic()
                for position, job in enumerate(jobs):
                    if self._stop.is_set():
                        self._give_back(jobs[position:])  # claimed, never started
                        break
                    if self._run_one(job):
                        finished.append(job)
                ledger.note_pace((time.monotonic() - began) / len(jobs))
        finally:
            if finished:
                try:
                    self.rotator.ack(*finished)
                except Exception as error:
                    if not transient(error):
                        raise
                    log.warning(
                        "could not ack %d finished jobs (%s); they come back when their "
                        "leases run out",
                        len(finished),
                        error,
                    )
                ledger.release(finished)

    def _give_back(
        self, jobs: list[Job], delay: float = 0.0, reason: str | None = None, dead: bool = False
    ) -> None:
        """Nacks jobs (recording ``reason`` as their last error when the queue keeps item
        stats), or, ``dead`` (their last delivery failed), buries them with ``reason`` in
        their dead letters; when the server cannot take that now, their leases run out
        instead (and the next claim dead-letters them without the reason)."""
        try:
            if dead:
                self.rotator.bury(*jobs, error=reason or "")
            elif reason is None:
                self.rotator.nack(*jobs, delay=delay)
            else:
                self.rotator.fail(*jobs, error=reason, delay=delay)
        except Exception as error:
            if not transient(error):
                raise
            log.warning(
                "could not give back %d jobs (%s); their leases will run out", len(jobs), error
            )
        self._ledger.release(jobs)

    def _drained(self) -> bool:
        if self.rotator.drained():
            self.rotator.sweep()  # leave no acked element behind in the ring
            return True
        return False

    def _run_one(self, job: Job) -> bool:
        """Runs the handler; True when the job should be acked."""
        if self._ledger.lost(job):
            self._ledger.release([job])
            return False
        started = time.monotonic()
        try:
            self.handler(job)
        except Exception as error:
            limit = self.rotator.max_deliveries
            dead = last_delivery(job, limit)
            delay = failure_delay(job, limit)
            log_failure(job, error, delay, limit)
            self._give_back([job], delay=delay, reason=failure_reason(error), dead=dead)
            self._ledger.failed(job, dead)
            return False
        return self._ledger.handled(job, time.monotonic() - started)

    def _heartbeat(self) -> None:
        """Extends every held lease that is half used, so slow batches keep their jobs, and
        keeps this worker's registry entry and the cron schedules' due times."""
        ledger = self._ledger
        self._report()
        while not self._stop.wait(ledger.heartbeat_interval()):
            self._report()
            self._keep_schedules()
            extend_due(self.rotator, ledger)

    def _report(self) -> None:
        """Writes this worker's registry entry when one is due (rotator.registry): on the
        heartbeat, at most every REPORT_EVERY seconds, never per job."""
        presence = self._presence
        if not presence.due():
            return
        try:
            self.rotator.report_worker(presence.entry(*self._ledger.presence(HELD_SHOWN)))
        except Exception as error:
            report_failed(presence, error)
        else:
            presence.failing = False

    def _send_durations(self) -> None:
        """Adds the processing times not sent with a claim yet to the queue's histogram (at
        the end of a run: claims carry them while it runs)."""
        taken = self._ledger.take_durations()
        if not taken:
            return
        try:
            self.rotator.durations(*taken)
        except Exception as error:
            log.warning("could not report %d processing times (%s)", len(taken), error)

    def _keep_schedules(self) -> None:
        """Tops up the cron schedules' due times, every KEEP_EVERY seconds."""
        if not self._schedules_kept.due():
            return
        try:
            self.rotator.keep_schedules()
        except Exception as error:
            log.warning("could not top up the schedules' due times (%s); will retry", error)

    def _forget(self) -> None:
        """Removes this worker's registry entry on a clean stop."""
        if not self._presence.enabled:
            return
        try:
            self.rotator.forget_worker(self._presence.id)
        except Exception as error:
            log.warning("could not remove this worker's registry entry (%s): it goes stale", error)


class AsyncWorker:
    """The asyncio twin of :class:`Worker`: ``concurrency`` tasks instead of threads, each
    awaiting ``handler(job)``. Cancelling the task that runs :meth:`run` gives back every
    job in hand."""

    def __init__(
        self,
        rotator: AsyncRotator,
        handler: AsyncHandler,
        *,
        concurrency: int = 1,
        batch: int = DEFAULT_WORK_BATCH,
        poll: float = DEFAULT_POLL,
    ) -> None:
        self.rotator = rotator
        self.handler = handler
        self.concurrency = protocol.whole(concurrency, "concurrency", 1, 10_000)
        self.batch = protocol.check_count(batch)
        self.poll = poll
        self._stop = asyncio.Event()
        self._ledger = Ledger(rotator.timeout, self.batch)
        self._presence = Presence(rotator.keys.name)
        self._schedules_kept = Keeper()

    @property
    def worker_id(self) -> str:
        """This worker's field in the queue's worker registry (``AsyncRotator.workers``)."""
        return self._presence.id

    def stop(self) -> None:
        """Asks every loop to finish its current job and return."""
        self._stop.set()

    async def run(
        self, *, stop_when_empty: bool = False, install_signal_handlers: bool = True
    ) -> WorkSummary:
        for warning in await self.rotator.server_warnings():
            log.warning("%s", warning)
        restore = self._install_signals() if install_signal_handlers else []
        self._presence.start()
        heartbeat = asyncio.ensure_future(self._heartbeat())
        try:
            await asyncio.gather(*(self._loop(stop_when_empty) for _ in range(self.concurrency)))
        finally:
            self._stop.set()
            heartbeat.cancel()
            loop = asyncio.get_running_loop()
            for signum in restore:
                loop.remove_signal_handler(signum)
            # Let a report in flight end first, so that it cannot land after the HDEL.
            await asyncio.gather(heartbeat, return_exceptions=True)
            await self._send_durations()
            await self._forget()
        return self._ledger.summary()

    def _install_signals(self) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        loop = asyncio.get_running_loop()
        installed: list[int] = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(signum, self._on_signal, signum)
            except (NotImplementedError, RuntimeError):  # no signals on this loop
                continue
            installed.append(signum)
        return installed

    def _on_signal(self, signum: int) -> None:
        log.info("signal %d: finishing the jobs in hand, then stopping", signum)
        self.stop()

    async def _loop(self, stop_when_empty: bool) -> None:
        ledger = self._ledger
        finished: list[Job] = []
        jobs: list[Job] = []
        position = 0
        failures = 0
        try:
            while not self._stop.is_set():
                times = ledger.take_durations()
                try:
                    jobs = await self.rotator.next(
                        ledger.claim_size(), block=self.poll, ack=finished, durations=times
                    )
                except Exception as error:
                    ledger.note_durations(times)
                    if not transient(error):
                        raise
                    failures += 1
                    pause = claim_pause(failures)
                    log.warning("could not claim jobs (%s); trying again in %.2f s", error, pause)
                    await asyncio.sleep(pause)
                    continue
                failures = 0
                ledger.release(finished)
                finished = []
                ledger.hold(jobs)
                if not jobs:
                    if stop_when_empty and await self._drained():
                        return
                    continue
                began = time.monotonic()
                for position, job in enumerate(jobs):
                    if self._stop.is_set():
                        await self._give_back(jobs[position:])  # claimed, never started
                        break
                    if await self._run_one(job):
                        finished.append(job)
                jobs = []
                ledger.note_pace((time.monotonic() - began) / max(position + 1, 1))
        except asyncio.CancelledError:
            # Cancelled: what was claimed and not finished goes back now, not at its lease.
            unfinished = [job for job in jobs if job not in finished]
            if unfinished:
                await asyncio.shield(self._give_back(unfinished))
            raise
        finally:
            if finished:
                try:
                    await asyncio.shield(self.rotator.ack(*finished))
                except Exception as error:
                    if not transient(error):
                        raise
                    log.warning("could not ack %d finished jobs (%s)", len(finished), error)
                ledger.release(finished)

    async def _give_back(
        self, jobs: list[Job], delay: float = 0.0, reason: str | None = None, dead: bool = False
    ) -> None:
        try:
            if dead:
                await self.rotator.bury(*jobs, error=reason or "")
            elif reason is None:
                await self.rotator.nack(*jobs, delay=delay)
            else:
                await self.rotator.fail(*jobs, error=reason, delay=delay)
        except Exception as error:
            if not transient(error):
                raise
            log.warning(
                "could not give back %d jobs (%s); their leases will run out", len(jobs), error
            )
        self._ledger.release(jobs)

    async def _drained(self) -> bool:
        if await self.rotator.drained():
            await self.rotator.sweep()
            return True
        return False

    async def _run_one(self, job: Job) -> bool:
        if self._ledger.lost(job):
            self._ledger.release([job])
            return False
        started = time.monotonic()
        try:
            await self.handler(job)
        except Exception as error:
            limit = self.rotator.max_deliveries
            dead = last_delivery(job, limit)
            delay = failure_delay(job, limit)
            log_failure(job, error, delay, limit)
            await self._give_back([job], delay=delay, reason=failure_reason(error), dead=dead)
            self._ledger.failed(job, dead)
            return False
        return self._ledger.handled(job, time.monotonic() - started)

    async def _heartbeat(self) -> None:
        ledger = self._ledger
        await self._report()
        while not self._stop.is_set():
            await asyncio.sleep(ledger.heartbeat_interval())
            await self._report()
            await self._keep_schedules()
            await extend_due_async(self.rotator, ledger)

    async def _report(self) -> None:
        presence = self._presence
        if not presence.due():
            return
        try:
            await self.rotator.report_worker(presence.entry(*self._ledger.presence(HELD_SHOWN)))
        except Exception as error:
            report_failed(presence, error)
        else:
            presence.failing = False

    async def _send_durations(self) -> None:
        taken = self._ledger.take_durations()
        if not taken:
            return
        try:
            await self.rotator.durations(*taken)
        except Exception as error:
            log.warning("could not report %d processing times (%s)", len(taken), error)

    async def _keep_schedules(self) -> None:
        if not self._schedules_kept.due():
            return
        try:
            await self.rotator.keep_schedules()
        except Exception as error:
            log.warning("could not top up the schedules' due times (%s); will retry", error)

    async def _forget(self) -> None:
        if not self._presence.enabled:
            return
        try:
            await self.rotator.forget_worker(self._presence.id)
        except Exception as error:
            log.warning("could not remove this worker's registry entry (%s): it goes stale", error)
