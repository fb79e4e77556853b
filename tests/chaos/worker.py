"""A chaos worker: ``python -m tests.chaos.worker --url URL --queue Q --log FILE --logs-dir DIR``.

It claims jobs one batch at a time, "does" each job (a seeded sleep) and acks it, writing every
step to its event log (see ``eventlog.py``). Two modes:

* ``loop`` (default): its own loop on ``Rotator.next``/``ack``, so every step, the ack's
  outcome included, is an event. Errors from the server (down, timeouts, OOM, NOSCRIPT, ...)
  are logged and retried after a jittered exponential backoff from 50 ms capped at 1 s, so the
  worker never spins while the server is unreachable.
* ``work``: the library's own worker loop, ``Rotator.work``, with a handler that logs; acks
  ride on the next claim (``ACK_SENT``). If ``work`` raises, that is logged (``WORK_DIED``)
  and it is started again after a backoff.

Idempotency (``--idempotency log``, the default): the callback answers from the DONE lines of
every log in ``--logs-dir``. A job's side effect is its DONE line, written before the ack, so
the callback reads the very store the side effect went to; it survives the SIGKILL of the
process that did the job and needs no second write to Redis (which the negative control would
lose, and which a lost reply could leave half done). ``--idempotency none`` turns it off, so a
crash after DONE shows up as a duplicate, explained by the reclaim.

Crash points: ``RQ_CRASH_AT=after_claim|mid_job|after_done_before_ack|after_ack`` with
``RQ_CRASH_ON_NTH=n`` (default 1) makes the worker SIGKILL itself at that point of its n-th
job, after logging ``CRASH point``. SIGTERM/SIGINT stop it gracefully: the job in hand is
finished and acked, then it exits 0.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType

from redis.exceptions import RedisError

from rotator import Job, Rotator, RotatorError
from rotator.protocol import JobRef
from tests.chaos.eventlog import (
    DoneIndex,
    EventLog,
    chaos_body,
    chaos_client,
    error_kind,
    stop_with_parent,
)

CRASH_POINTS = ("after_claim", "mid_job", "after_done_before_ack", "after_ack")
BACKOFF_FIRST = 0.05  # seconds before retrying after an error
BACKOFF_CAP = 1.0  # the longest pause between attempts: never a hot loop, never a long stall


class Backoff:
    """Jittered exponential pauses after consecutive errors; reset on success."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.current = 0.0

    def next_delay(self) -> float:
        self.current = min(BACKOFF_CAP, max(BACKOFF_FIRST, self.current * 2))
        return self.current * self.rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.current = 0.0


def make_idempotency(log: EventLog, done: DoneIndex) -> Callable[[str], bool]:
    def already_done(job_id: str) -> bool:
        verdict = job_id in done
        log.write("IDEM", job_id, int(verdict))
        return verdict

    return already_done


class LoggedRotator(Rotator):
    """A Rotator that logs the acks the library's worker loop sends (for ``work`` mode)."""

    events: EventLog | None = None

    def next(
        self,
        count: int = 1,
        block: float | None = None,
        *,
        ack: Iterable[JobRef] = (),
        durations: Iterable[float] = (),
    ) -> list[Job]:
        acks = list(ack)
        jobs = super().next(count, block, ack=acks, durations=durations)
        if self.events is not None:
            for ref in acks:
                if isinstance(ref, Job):
                    self.events.write("ACK_SENT", ref.id, ref.token)
            # Every delivery, also those the loop gives back unrun when it stops (its FETCH
            # is logged by the handler, which a job given back never reaches).
            for job in jobs:
                self.events.write("CLAIM", job.id, job.token, int(job.reclaimed), job.deliveries)
        return jobs

    def ack(self, *jobs: JobRef) -> int:
        accepted = super().ack(*jobs)
        if self.events is not None:
            for ref in jobs:
                if isinstance(ref, Job):
                    self.events.write("ACK_SENT", ref.id, ref.token)
        return accepted


class ChaosWorker:
    """Processes jobs and logs every step; used by worker processes and the final drain."""

    def __init__(
        self,
        rotator: Rotator,
        log: EventLog,
        rng: random.Random,
        *,
        job_ms: tuple[float, float] = (1.0, 3.0),
        batch: int = 1,
        poll: float = 0.5,
        crash_at: str | None = None,
        crash_on_nth: int = 1,
        stop: threading.Event | None = None,
        payloads: bool = False,
    ) -> None:
        if crash_at is not None and crash_at not in CRASH_POINTS:
            raise SystemExit(f"RQ_CRASH_AT must be one of {CRASH_POINTS}, got {crash_at!r}")
        self.rotator = rotator
        self.log = log
        self.rng = rng
        self.job_ms = job_ms
        self.batch = batch
        self.poll = poll
        self.crash_at = crash_at
        self.crash_on_nth = crash_on_nth
        self.stop = stop or threading.Event()
        self.backoff = Backoff(rng)
        self.jobs_seen = 0
        self.payloads = payloads

    # -- one job ---------------------------------------------------------------------------

    def _crash(self, point: str) -> None:
        if self.crash_at == point and self.jobs_seen == self.crash_on_nth:
            self.log.write("CRASH", point)
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # not reached: SIGKILL cannot be caught

    def run_job(self, job: Job) -> None:
        """Everything up to and including DONE: the job's side effect."""
        self.jobs_seen += 1
        self.log.write("FETCH", job.id, job.token, int(job.reclaimed), job.deliveries)
        if self.payloads and job.payload != chaos_body(job.id):
            self.log.write(
                "PAYLOAD_BAD", job.id, job.token, repr(job.payload)[:40].replace(" ", "")
            )
        self._crash("after_claim")
        self.log.write("START", job.id, job.token)
        duration = self.rng.uniform(*self.job_ms) / 1000
        if self.crash_at == "mid_job" and self.jobs_seen == self.crash_on_nth:
            time.sleep(duration / 2)
            self._crash("mid_job")
        time.sleep(duration)
        self.log.write("DONE", job.id, job.token)
        self._crash("after_done_before_ack")

    def process(self, job: Job) -> None:
        self.run_job(job)
        self.ack(job)
        self._crash("after_ack")

    def ack(self, job: Job) -> None:
        """Acks, retrying errors until shortly after the lease ran out (by then it is gone)."""
        give_up = job.deadline_ms / 1000 + 1.0
        while True:
            try:
                accepted = self.rotator.ack(job)
            except (RedisError, RotatorError) as error:
                self.log.write("ACK_ERR", job.id, job.token, error_kind(error))
                if time.time() > give_up:
                    return
                time.sleep(self.backoff.next_delay())
                continue
            self.backoff.reset()
            self.log.write("ACK_OK", job.id, job.token, accepted)
            return

    # -- loops -----------------------------------------------------------------------------

    def pause_after(self, op: str, error: BaseException) -> None:
        self.log.write("ERR", op, error_kind(error))
        self.stop.wait(self.backoff.next_delay())

    def run_loop(self) -> None:
        while not self.stop.is_set():
            try:
                jobs = self.rotator.next(self.batch, block=self.poll)
            except (RedisError, RotatorError) as error:
                self.pause_after("next", error)
                continue
            self.backoff.reset()
            if not jobs:
                self.log.write("LAP")
            for job in jobs:  # a batch is finished even when asked to stop: its jobs are short
                self.process(job)

    def run_work(self) -> None:
        """The library's worker loop; restarted (and logged) when it dies of an error."""
        while not self.stop.is_set():
            try:
                # Rotator.work installs its own SIGTERM handler while it runs, finishes the
                # jobs in hand, acks them and returns: that return is our stop.
                self.rotator.work(self.run_job, batch=self.batch, poll=self.poll)
                return
            except (RedisError, RotatorError) as error:
                self.log.write("WORK_DIED", error_kind(error))
                self.stop.wait(self.backoff.next_delay())


def connect(rotator: Rotator, log: EventLog, stop: threading.Event, rng: random.Random) -> bool:
    """Waits until the server answers (loading the script); False if stopped first."""
    backoff = Backoff(rng)
    while not stop.is_set():
        try:
            rotator.stats()
            return True
        except (RedisError, RotatorError) as error:
            log.write("ERR", "connect", error_kind(error))
            stop.wait(backoff.next_delay())
    return False


def parse_range(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    return float(low), float(high or low)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.worker")
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--logs-dir", required=True, type=Path)
    parser.add_argument("--lease", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--job-ms", type=parse_range, default=(1.0, 3.0), help="LOW:HIGH")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--socket-timeout", type=float, default=2.0)
    parser.add_argument("--mode", choices=("loop", "work"), default="loop")
    parser.add_argument("--idempotency", choices=("log", "none"), default="log")
    parser.add_argument("--functions", action="store_true", help="FCALL instead of EVALSHA")
    parser.add_argument("--payloads", action="store_true", help="jobs carry bodies: check them")
    args = parser.parse_args(argv)

    crash_at = os.environ.get("RQ_CRASH_AT") or None
    if crash_at == "after_ack" and args.mode == "work":
        raise SystemExit("after_ack is not observable in work mode (acks ride on the next claim)")
    log = EventLog(args.log)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stop_with_parent(stop)
    rng = random.Random(args.seed)
    client = chaos_client(
        args.url,
        socket_timeout=args.socket_timeout,
        on_failure=lambda error: log.write("RETRY", error_kind(error)),
    )
    idempotency = (
        make_idempotency(log, DoneIndex(args.logs_dir)) if args.idempotency == "log" else None
    )
    rotator = LoggedRotator(
        client,
        args.queue,
        timeout=args.lease,
        idempotency=idempotency,
        functions=args.functions,
        payloads=args.payloads,
    )
    if args.mode == "work":
        rotator.events = log
    worker = ChaosWorker(
        rotator,
        log,
        rng,
        job_ms=args.job_ms,
        batch=args.batch,
        poll=args.poll,
        crash_at=crash_at,
        crash_on_nth=int(os.environ.get("RQ_CRASH_ON_NTH", "1")),
        stop=stop,
        payloads=args.payloads,
    )
    if connect(rotator, log, stop, rng):
        log.write("BOOT", args.mode, "fcall" if args.functions else "evalsha", os.getpid())
        if args.mode == "loop":
            worker.run_loop()
        else:
            worker.run_work()
    log.write("EXIT", "stopped")
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
