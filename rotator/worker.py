"""The worker loop: claim, run the handler, ack or nack, keep long leases alive, stop cleanly.

Each worker thread leases ``batch`` jobs at a time and acks finished ones in the same call
that claims the next batch, so a busy worker pays one round trip per batch. A heartbeat
thread extends the lease of any job that has run for half its lease. SIGINT/SIGTERM stop
claiming; jobs already started are finished and acked, jobs claimed but not started are given
back at once.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from rotator import protocol
from rotator.defaults import DEFAULT_POLL, RETRY_BACKOFF_BASE, RETRY_BACKOFF_CAP
from rotator.models import Job

if TYPE_CHECKING:
    from rotator.core import Rotator

Handler = Callable[[Job], Any]
log = logging.getLogger("rotator.worker")


@dataclass(frozen=True, slots=True)
class WorkSummary:
    processed: int  # handler returned and the ack was sent
    failed: int  # handler raised; the job was nacked for a retry
    leases_lost: int  # leases another consumer took over while the handler ran


def retry_delay(deliveries: int) -> float:
    """Exponential backoff before a failed job is delivered again."""
    return float(min(RETRY_BACKOFF_BASE * 2 ** max(deliveries - 1, 0), RETRY_BACKOFF_CAP))


class Worker:
    def __init__(
        self,
        rotator: Rotator,
        handler: Handler,
        *,
        concurrency: int = 1,
        batch: int = 1,
        poll: float = DEFAULT_POLL,
    ) -> None:
        self.rotator = rotator
        self.handler = handler
        self.concurrency = protocol.whole(concurrency, "concurrency", 1, 1024)
        self.batch = protocol.check_count(batch)
        self.poll = poll
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[str, float] = {}  # token -> monotonic time its lease runs out
        self._tokens: dict[str, Job] = {}
        self._processed = self._failed = self._lost = 0

    def stop(self) -> None:
        """Asks every loop to finish its current job and return."""
        self._stop.set()

    def run(
        self, *, stop_when_empty: bool = False, install_signal_handlers: bool = True
    ) -> WorkSummary:
        restore = self._install_signals() if install_signal_handlers else {}
        heartbeat = threading.Thread(target=self._heartbeat, name="rotator-heartbeat", daemon=True)
        heartbeat.start()
        try:
            if self.concurrency == 1:
                self._loop(stop_when_empty)
            else:
                threads = [
                    threading.Thread(
                        target=self._loop, args=(stop_when_empty,), name=f"rotator-{i}"
                    )
                    for i in range(self.concurrency)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    while thread.is_alive():  # join in slices so signals reach the main thread
                        thread.join(0.2)
        finally:
            self._stop.set()
            heartbeat.join()
            for signum, previous in restore.items():
                signal.signal(signum, previous)
        return WorkSummary(self._processed, self._failed, self._lost)

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: finishing the jobs in hand, then stopping", signum)
            self.stop()

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _loop(self, stop_when_empty: bool) -> None:
        finished: list[Job] = []
        try:
            while not self._stop.is_set():
                jobs = self.rotator.next(self.batch, block=self.poll, ack=finished)
                finished = []
                if not jobs:
                    if stop_when_empty and self._drained():
                        return
                    continue
                for position, job in enumerate(jobs):
                    if self._stop.is_set():
                        self.rotator.nack(*jobs[position:])  # claimed, never started
                        break
                    if self._run_one(job):
                        finished.append(job)
        finally:
            if finished:
                self.rotator.ack(*finished)

    def _drained(self) -> bool:
        stats = self.rotator.stats()
        return stats.pending == 0 and stats.in_flight == 0 and stats.deferred == 0

    def _run_one(self, job: Job) -> bool:
        with self._lock:
            self._running[job.token] = time.monotonic() + self.rotator.timeout
            self._tokens[job.token] = job
        try:
            self.handler(job)
        except Exception:
            log.exception("job %s failed (delivery %d); retrying later", job.id, job.deliveries)
            self.rotator.nack(job, delay=retry_delay(job.deliveries))
            with self._lock:
                self._failed += 1
            return False
        finally:
            with self._lock:
                self._running.pop(job.token, None)
                self._tokens.pop(job.token, None)
        with self._lock:
            self._processed += 1
        return True

    def _heartbeat(self) -> None:
        """Extends leases that are half used, so long handlers keep their jobs."""
        timeout = self.rotator.timeout
        interval = max(min(timeout / 4, 5.0), 0.01)
        while not self._stop.wait(interval):
            now = time.monotonic()
            with self._lock:
                due = [
                    self._tokens[t] for t, end in self._running.items() if end - now < timeout / 2
                ]
            if not due:
                continue
            try:
                kept = self.rotator.extend_many(due)
            except Exception:
                log.exception("could not extend %d leases; will retry", len(due))
                continue
            with self._lock:
                for job, ok in zip(due, kept, strict=True):
                    if ok and job.token in self._running:
                        self._running[job.token] = now + timeout
                    elif not ok:
                        self._running.pop(job.token, None)
                        self._lost += 1
                        log.warning("lease of job %s was lost; its ack will be refused", job.id)
