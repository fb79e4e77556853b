"""A chaos producer: ``python -m tests.chaos.producer --url URL --queue Q --log FILE --count N``.

Pushes ids ``<prefix><n:06d>`` in batches at a steady rate. Each attempt of a batch is
``PUSH_INVOKE batch ids`` then ``PUSH_OK batch`` or ``PUSH_FAIL batch kind``; a failed batch
is tried again after a backoff (its outcome was unknown, so a retry may enqueue it twice: the
checker counts every attempt). redis-py's own retries of a push (a reply lost, a timeout) are
logged as ``PUSH_RETRY batch kind``: each may also have enqueued the batch once more. rotator
offers no push dedup, so such copies are duplicates the checker explains by these lines.
SIGTERM/SIGINT stop it after the batch in hand.

Scheduled pushes (``--later F``): a fraction F of the batches is pushed for later instead,
half of them with ``delay``, half with ``at``; ``--soon G`` of those are due at once (delay 0,
or ``at`` a moment ago), the rest at a time spread uniformly over the next ``--spread``
seconds. Their PUSH_INVOKE carries a third field, the earliest time (unix ms) the batch can be
due: ``at`` as sent, or the client's clock before the call plus ``delay``. The server takes
its own clock (the same machine's) a moment later, so its due time is never earlier.

Unique pushes (``--unique``): every push is sent with ``unique=True``, for a queue that tracks
its ids (``configure(track_ids=True)``); the lines logged are the same, and a failed batch is
tried again just the same (the retry of a push whose reply was lost then adds nothing that the
queue still holds).

Retries (``--retry-for S``): the Rotator is made with ``retry_for=S`` on a client without
redis-py's retries. Its retries are not logged: a plain push goes under a marker, so a push
sent again after a lost reply enqueues nothing twice, and a copy of an id would be a
duplicate nothing explains.

Priorities (``--priorities 0,3,9``): batch ``n`` (from 1) is pushed with ``priority`` the
``(n - 1) % len``-th of the levels, every attempt of it alike, so a test reads each id's level
from its batch number in PUSH_INVOKE (:func:`level_of`); the lines logged are the same.
"""

from __future__ import annotations

import argparse
import math
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from redis.exceptions import RedisError

from rotator import Rotator, RotatorError
from rotator.protocol import check_due
from tests.chaos.eventlog import (
    EventLog,
    chaos_body,
    chaos_client,
    error_kind,
    stop_with_parent,
)

BACKOFF_FIRST = 0.05
BACKOFF_CAP = 1.0


def level_of(batch_no: int, priorities: Sequence[int]) -> int:
    """The priority batch ``batch_no`` (from 1) is pushed with: 0 when there are no levels."""
    return priorities[(batch_no - 1) % len(priorities)] if priorities else 0


class Producer:
    """Pushes batches and logs each attempt; used by producer processes and by tests inline."""

    def __init__(
        self,
        url: str,
        queue: str,
        log: EventLog,
        *,
        socket_timeout: float = 2.0,
        rng: random.Random | None = None,
        stop: threading.Event | None = None,
        functions: bool = False,
        unique: bool = False,
        payloads: bool = False,
        priorities: Sequence[int] = (),
        retry_for: float = 0.0,
    ) -> None:
        if payloads and any(priorities):
            raise ValueError("jobs with payloads take no priority")
        self.log = log
        self.unique = unique
        self.payloads = payloads
        self.priorities = tuple(priorities)
        self.rng = rng or random.Random(0)
        self.stop = stop or threading.Event()
        self.batch_no = 0
        self._current = 0
        if retry_for:  # the Rotator's retries alone, unlogged: they must push nothing twice
            client = chaos_client(url, socket_timeout=socket_timeout, retries=0)
        else:
            client = chaos_client(url, socket_timeout=socket_timeout, on_failure=self._on_failure)
        self.rotator = Rotator(
            client, queue, functions=functions, payloads=payloads, retry_for=retry_for
        )

    def _on_failure(self, error: Exception) -> None:
        self.log.write("PUSH_RETRY", self._current, error_kind(error))

    def push(
        self,
        ids: list[str],
        *,
        give_up_after: float = 30.0,
        delay: float | None = None,
        at: float | None = None,
    ) -> bool:
        """Pushes one batch (for later with ``delay`` or ``at``, as ``Rotator.push``), trying
        again on errors; True once a push of it was confirmed."""
        self.batch_no += 1
        self._current = self.batch_no
        give_up = time.monotonic() + give_up_after
        backoff = 0.0
        due = check_due(delay, at)
        while True:
            fields = [self.batch_no, ",".join(ids)]
            if due is not None:  # the earliest this attempt can be due, by the same clock
                fields.append(
                    due.ms if due.mode == b"AT" else math.floor(time.time() * 1000) + due.ms
                )
            self.log.write("PUSH_INVOKE", *fields)
            try:
                if self.payloads:
                    bodies = {job_id: chaos_body(job_id) for job_id in ids}
                    self.rotator.push_payloads(bodies, delay=delay, at=at, unique=self.unique)
                else:
                    level = level_of(self.batch_no, self.priorities)
                    self.rotator.push(*ids, delay=delay, at=at, priority=level, unique=self.unique)
            except (RedisError, RotatorError) as error:
                self.log.write("PUSH_FAIL", self.batch_no, error_kind(error))
                if self.stop.is_set() or time.monotonic() > give_up:
                    return False
                backoff = min(BACKOFF_CAP, max(BACKOFF_FIRST, backoff * 2))
                time.sleep(backoff * self.rng.uniform(0.5, 1.0))
                continue
            self.log.write("PUSH_OK", self.batch_no)
            return True

    def when(self, later: float, soon: float, spread: float) -> dict[str, float]:
        """``push``'s keywords for one batch: none (at once), or a delay or a time."""
        if self.rng.random() >= later:
            return {}
        # Whole milliseconds, so the ms the client sends is exactly the one logged.
        wait = 0.0 if self.rng.random() < soon else round(self.rng.uniform(0.05, spread), 3)
        if self.rng.random() < 0.5:
            return {"delay": wait}
        if wait == 0.0:
            wait = -round(self.rng.uniform(0.0, 1.0), 3)  # a time already passed: due at once
        return {"at": (math.floor(time.time() * 1000) + round(wait * 1000)) / 1000}

    def run(
        self,
        ids: list[str],
        *,
        batch: int,
        rate: float,
        later: float = 0.0,
        soon: float = 0.0,
        spread: float = 0.0,
    ) -> int:
        """Pushes ``ids`` at about ``rate`` ids per second, a fraction ``later`` of the batches
        for later (see the module docstring); returns how many were confirmed."""
        started = time.monotonic()
        confirmed = 0
        for index in range(0, len(ids), batch):
            if self.stop.is_set():
                break
            due = started + index / rate
            wait = due - time.monotonic()
            if wait > 0 and self.stop.wait(wait):
                break
            part = ids[index : index + batch]
            if self.push(part, **self.when(later, soon, spread)):
                confirmed += len(part)
        return confirmed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.producer")
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--prefix", default="j")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rate", type=float, default=1000.0, help="ids per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--socket-timeout", type=float, default=2.0)
    parser.add_argument("--functions", action="store_true", help="FCALL instead of EVALSHA")
    parser.add_argument("--later", type=float, default=0.0, help="fraction pushed for later")
    parser.add_argument("--soon", type=float, default=0.0, help="of those, fraction due at once")
    parser.add_argument("--spread", type=float, default=0.0, help="seconds the rest spread over")
    parser.add_argument("--unique", action="store_true", help="push with unique=True")
    parser.add_argument("--payloads", action="store_true", help="push each id with its body")
    parser.add_argument(
        "--priorities", default="", help="levels the batches take in turn, e.g. 0,3,9"
    )
    parser.add_argument(
        "--retry-for", type=float, default=0.0, help="the Rotator's retry_for (redis-py's off)"
    )
    args = parser.parse_args(argv)

    log = EventLog(args.log)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stop_with_parent(stop)
    producer = Producer(
        args.url,
        args.queue,
        log,
        socket_timeout=args.socket_timeout,
        rng=random.Random(args.seed),
        stop=stop,
        functions=args.functions,
        unique=args.unique,
        payloads=args.payloads,
        priorities=[int(level) for level in args.priorities.split(",") if level],
        retry_for=args.retry_for,
    )
    ids = [f"{args.prefix}{n:06d}" for n in range(args.start, args.start + args.count)]
    log.write("BOOT", "producer", len(ids))
    confirmed = producer.run(
        ids,
        batch=args.batch,
        rate=args.rate,
        later=args.later,
        soon=args.soon,
        spread=args.spread,
    )
    log.write("EXIT", "stopped" if stop.is_set() else "done", confirmed)
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
