"""The demo: the product's main job, end to end, on real processes.

Pushes jobs, runs worker processes, SIGKILLs one of them while it holds leases, and checks
that every job was completed: the dead worker's jobs are reclaimed when their leases expire,
and the idempotency callback stops the ones it had already finished from running twice.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from rotator import protocol
from rotator.core import Rotator
from rotator.models import Job
from rotator.urls import client_from_url

DEMO_LEASE = 2.0  # short, so the killed worker's jobs come back quickly
DEMO_BATCH = 20


@dataclass(frozen=True, slots=True)
class DemoResult:
    pushed: int
    completed: int
    reclaimed: int
    duplicates_prevented: int
    duplicates_processed: int
    lost: int
    killed_workers: int
    seconds: float
    jobs_per_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _keys(queue: str) -> tuple[str, str]:
    # Same hash tag as the queue, so the demo also runs on a cluster slot of its own.
    return f"rotator-demo:{{{queue}}}:completed", f"rotator-demo:{{{queue}}}:counters"


def _worker_main(url: str, queue: str) -> None:
    """One worker process. Completing a job means adding its id to the completed set."""
    client = client_from_url(url)
    completed, counters = _keys(queue)

    def already_done(job_id: str) -> bool:
        done = bool(client.sismember(completed, job_id))
        if done:
            client.hincrby(counters, "duplicates_prevented", 1)
        return done

    q = Rotator(client, queue, timeout=DEMO_LEASE, idempotency=already_done)
    finished: list[Job] = []
    while True:
        jobs = q.next(DEMO_BATCH, block=0.5, ack=finished)
        finished = []
        if not jobs:
            stats = q.stats()
            if stats.pending == stats.in_flight == stats.deferred == stats.overdue == 0:
                return
            continue
        for job in jobs:
            if job.reclaimed:
                client.hincrby(counters, "reclaimed", 1)
            # The job's side effect, and progress, in one round trip.
            pipe = client.pipeline(transaction=False)
            pipe.sadd(completed, job.id)
            pipe.hincrby(counters, "processed", 1)
            added, _ = pipe.execute()
            if not added:
                client.hincrby(counters, "duplicates_processed", 1)
            finished.append(job)


def run_demo(
    url: str,
    *,
    jobs: int = 20_000,
    workers: int = 4,
    progress: Callable[[int, int], None] | None = None,
) -> DemoResult:
    """Runs the demo against the server at ``url`` and cleans up its keys afterwards."""
    queue = f"demo-{uuid.uuid4().hex[:8]}"
    client = client_from_url(url)
    q = Rotator(client, queue, timeout=DEMO_LEASE)
    completed, counters = _keys(queue)
    try:
        q.push_many(f"job-{i}" for i in range(jobs))
        context = multiprocessing.get_context("spawn")
        procs = [
            context.Process(target=_worker_main, args=(url, queue), daemon=True)
            for _ in range(workers)
        ]
        started = time.monotonic()
        for proc in procs:
            proc.start()
        killed = 0
        while any(proc.is_alive() for proc in procs):
            done = int(client.hget(counters, "processed") or 0)
            if progress is not None:
                progress(min(done, jobs), jobs)
            if not killed and done >= jobs // 4 and procs[0].pid is not None:
                os.kill(procs[0].pid, signal.SIGKILL)  # mid-batch: it holds leases
                killed = 1
            time.sleep(0.05)
        seconds = time.monotonic() - started
        finished = int(client.scard(completed))
        if progress is not None:
            progress(finished, jobs)
        raw = {protocol.text(k): int(v) for k, v in client.hgetall(counters).items()}
        prevented = raw.get("duplicates_prevented", 0)
        return DemoResult(
            pushed=jobs,
            completed=finished,
            reclaimed=raw.get("reclaimed", 0) + prevented,
            duplicates_prevented=prevented,
            duplicates_processed=raw.get("duplicates_processed", 0),
            lost=jobs - finished,
            killed_workers=killed,
            seconds=round(seconds, 3),
            jobs_per_s=round(finished / seconds, 1) if seconds > 0 else 0.0,
        )
    finally:
        q.delete(forget=True)  # a name made for this run alone
        client.delete(completed, counters)
        client.close()
