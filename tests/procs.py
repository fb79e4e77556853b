"""Code the tests run in processes of their own.

The claimers are started with multiprocessing's "spawn" context, so each is a fresh
interpreter with its own client, like a real consumer on another machine. ``main`` is a
worker script for the signal test: ``python -m tests.procs URL QUEUE LOG SECONDS`` runs
``Rotator.work`` with a handler that writes START and DONE lines to LOG around a sleep.
"""

from __future__ import annotations

import sys
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

from rotator import Job, Rotator

Delivery = tuple[str, str, int, bool]  # id, token, deliveries, reclaimed


def delivery(job: Job) -> Delivery:
    return (job.id, job.token, job.deliveries, job.reclaimed)


def claim_until_empty(url: str, name: str, out: str, start: Barrier, batch: int) -> None:
    """Leases batches, acking each batch with the call that leases the next, until the queue
    has nothing left; writes one line ``<token>`` per delivery to ``out``."""
    queue = Rotator.from_url(url, name, timeout=60)
    queue.stats()  # connect and load the script before the start line
    start.wait(timeout=60)
    previous: list[Job] = []
    with Path(out).open("w", encoding="utf-8") as lines:
        while jobs := queue.next(batch, ack=previous):
            lines.writelines(f"{job.token}\n" for job in jobs)
            previous = jobs


def race_for_next(url: str, name: str, start: Barrier, results: Queue[list[Delivery]]) -> None:
    """Calls ``next()`` once, together with the other racers; reports what it received."""
    queue = Rotator.from_url(url, name, timeout=60)
    queue.stats()
    start.wait(timeout=60)
    results.put([delivery(job) for job in queue.next()])


def main(argv: list[str]) -> int:
    url, name, log, seconds = argv
    queue = Rotator.from_url(url, name, timeout=2.0)

    def handler(job: Job) -> None:
        with Path(log).open("a", encoding="utf-8") as out:
            out.write(f"START {job.id} {job.deliveries}\n")
        time.sleep(float(seconds))
        with Path(log).open("a", encoding="utf-8") as out:
            out.write(f"DONE {job.id}\n")

    summary = queue.work(handler)
    print(f"processed={summary.processed} failed={summary.failed} lost={summary.leases_lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
