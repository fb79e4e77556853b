"""Many consumer processes on one queue: every job delivered once, a lapsed lease to one.

Consumers are real processes (multiprocessing, "spawn") with their own clients, so the only
thing serialising them is the server running each script call atomically.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from pathlib import Path

import redis

from rotator import Rotator
from tests.procs import Delivery, claim_until_empty, race_for_next
from tests.servers import ServerProcess

JOBS = 10_000
CLAIMERS = 4
RACERS = 8
JOIN_TIMEOUT = 60.0

spawn = multiprocessing.get_context("spawn")


@contextmanager
def running(procs: Sequence[BaseProcess]) -> Iterator[None]:
    """Starts the processes; whatever happens, none of them outlives the block."""
    try:
        for proc in procs:
            proc.start()
        yield
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join(JOIN_TIMEOUT)


def test_four_processes_claiming_in_batches_receive_every_job_exactly_once(
    server: ServerProcess, client: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    queue = Rotator(client, queue_name, timeout=60)
    ids = [f"job-{i}" for i in range(JOBS)]
    assert queue.push_many(ids) == JOBS
    start = spawn.Barrier(CLAIMERS)
    outs = [tmp_path / f"claimer-{i}.txt" for i in range(CLAIMERS)]
    procs = [
        spawn.Process(target=claim_until_empty, args=(server.url, queue_name, str(out), start, 50))
        for out in outs
    ]
    with running(procs):
        for proc in procs:
            proc.join(JOIN_TIMEOUT)
    assert [proc.exitcode for proc in procs] == [0] * CLAIMERS

    tokens = [line for out in outs for line in out.read_text(encoding="utf-8").splitlines()]
    received = Counter(token.partition("*")[0] for token in tokens)
    assert set(received) == set(ids)
    assert [job_id for job_id, times in received.items() if times > 1] == []
    assert len(tokens) == JOBS
    # Every delivery was the first: no lease ran out and was handed to another process.
    assert {token.rsplit(".", 2)[1] for token in tokens} == {"1"}

    # A final lap removes the acked elements; one call visits at most `budget` (1000) of them.
    for _ in range(JOBS // 1000 + 2):
        assert queue.next() == []
    stats = queue.stats()
    assert (stats.length, stats.pending, stats.in_flight, stats.done) == (0, 0, 0, 0)


def test_expired_lease_is_reclaimed_by_exactly_one_of_eight_racing_processes(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=0.15)
    queue.push("contested")
    (first,) = queue.next()
    start = spawn.Barrier(RACERS + 1)
    results = spawn.Queue()
    procs = [
        spawn.Process(target=race_for_next, args=(server.url, queue_name, start, results))
        for _ in range(RACERS)
    ]
    got: list[Delivery] = []
    with running(procs):
        time.sleep(max(first.deadline_ms / 1000 + 0.05 - time.time(), 0))
        (lease,) = [entry for entry in queue.peek() if entry.state == "leased"]
        assert lease.time_ms < time.time() * 1000  # the lease has run out
        start.wait(timeout=JOIN_TIMEOUT)  # all eight call next() at once
        for _ in procs:
            got.extend(results.get(timeout=JOIN_TIMEOUT))
        for proc in procs:
            proc.join(JOIN_TIMEOUT)
    assert [proc.exitcode for proc in procs] == [0] * RACERS

    assert [(job_id, deliveries, reclaimed) for job_id, _, deliveries, reclaimed in got] == [
        ("contested", 2, True)
    ]
    assert got[0][1] != first.token
    assert queue.ack(first) == 0  # the first consumer's late ack is fenced off
    assert queue.ack(got[0][1]) == 1
