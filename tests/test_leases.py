"""Claims do not walk the jobs in flight (issue 21), counted, not timed.

The module is run in a test-only variant whose every LRANGE adds the number of elements it
returned to a field of the queue's meta hash: what a call read of either list, element by
element. Everything else is lua/rotator.lua as it is. Real servers, real leases made by the
module's own commands.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from rotator import Job, Rotator
from rotator.keys import queue_keys
from rotator.script import module_source

TOUCHED = "test_elements_read"
_BIND = "  rcall = redis.call\n"
_COUNTING = """  rcall = function(command, ...)
    local reply = redis.call(command, ...)
    if command == 'LRANGE' then redis.call('HINCRBY', K.meta, 'test_elements_read', #reply) end
    return reply
  end
"""


def counting_source() -> str:
    source = module_source()
    assert source.count(_BIND) == 1, "main binds rcall once"
    return source.replace(_BIND, _COUNTING)


class Counting:
    """Raw calls of the counting variant on one queue's thirteen keys."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.keys = queue_keys(name).all
        self.script = client.register_script(counting_source())

    def __call__(self, *args: Any) -> Any:
        return self.script(keys=list(self.keys), args=list(args))

    def read_by(self, *args: Any) -> tuple[Any, int]:
        """The reply of one call, and how many list elements it read."""
        meta = self.keys[8]
        before = int(self.client.hget(meta, TOUCHED) or 0)
        reply = self(*args)
        return reply, int(self.client.hget(meta, TOUCHED) or 0) - before


def single_leases(q: Counting, n: int, lease_ms: int = 3_600_000) -> None:
    """`n` jobs in flight, each its own lease element: claimed in batches with a short lease,
    then, once it has ended, claimed again (each batch broken up into leases of their own)."""
    for start in range(0, n, 5000):
        q("push", *(f"job-{i:08d}" for i in range(start, min(start + 5000, n))))
    taken = 0
    while taken < n:  # a lease that outlasts these calls (a due one would be taken first)
        taken += len(q("next_packed", 1000, 2000, 1000, 0)[3].split(b"*")) - 2
    time.sleep(2.1)
    leased = 0
    while leased < n:
        leased += (len(q("next_packed", 1000, lease_ms, 1000, 0)) - 4) // 2


def test_a_fresh_job_is_claimed_without_reading_the_leases_in_flight(
    client: redis.Redis, queue_name: str
) -> None:
    q = Counting(client, queue_name)
    single_leases(q, 100_000)
    assert client.llen(q.keys[10]) == 100_000  # a hundred thousand single leases, young
    q("push", "fresh")
    reply, read = q.read_by("next_packed", 1, 30_000, 1000, 0)
    assert reply[3].endswith(b"*fresh")
    assert read <= 2  # the ring's sentinel and the job; no lease
    # And the leases are still all there, untouched, in their order.
    assert client.llen(q.keys[10]) == 100_001


def test_acked_leases_at_the_tail_go_reading_only_up_to_the_first_young_one(
    client: redis.Redis, queue_name: str
) -> None:
    q = Counting(client, queue_name)
    single_leases(q, 20_000)
    oldest = client.lrange(q.keys[10], -3, -1)  # the tail: the three leased first
    assert q("ack", *oldest) == 3
    q("push", "fresh")
    reply, read = q.read_by("next_packed", 1, 30_000, 1000, 0)
    assert reply[3].endswith(b"*fresh")
    # Lease list: slices of 2 and 4 from the tail (three acked, then the young one that stops
    # the walk); ring: its sentinel and the job.
    assert read <= 8
    leases = client.lrange(q.keys[10], 0, -1)
    assert len(leases) == 20_000 - 3 + 1
    assert not set(oldest) & set(leases)


def test_due_leases_are_reclaimed_reading_what_the_count_needs_not_what_is_in_flight(
    client: redis.Redis, queue_name: str
) -> None:
    q = Counting(client, queue_name)
    single_leases(q, 20_000, lease_ms=1000)
    time.sleep(1.1)  # every lease is due now
    reply, read = q.read_by("next_packed", 1, 30_000, 1000, 0)
    assert reply[5] == 1  # a reclaimed lease
    assert read <= 2  # the first slice of the lease list; the ring is not needed


@pytest.mark.parametrize("consumer_lease", [30.0, 2.0], ids=["longer", "as-long"])
def test_a_consumer_idle_before_a_lease_was_taken_reclaims_it_soon_after_its_deadline(
    client: redis.Redis, queue_name: str, consumer_lease: float
) -> None:
    """An idle consumer waits no longer than its own lease time, and one whose lease is longer
    than the lease another then takes is woken by that claim: either way it reclaims the
    lease soon after its deadline, not at the end of its block."""
    worker = Rotator(client, queue_name, timeout=2.0)
    consumer = Rotator(client, queue_name, timeout=consumer_lease)
    worker.push("warm-up")
    worker.ack(*worker.next())  # (the queue exists: its claims note their lease times)
    held: list[Job] = []
    got: list[tuple[str, bool, float]] = []

    def work() -> None:
        held.extend(worker.next(1, block=8.0))  # and never acked: a crashed worker

    def wait() -> None:
        jobs = consumer.next(1, block=8.0)
        got.extend((job.id, job.reclaimed, time.time()) for job in jobs)

    threads = [threading.Thread(target=work), threading.Thread(target=wait)]
    for thread in threads:
        thread.start()
        time.sleep(0.3)  # blocked on an idle queue: the worker first, then the consumer
    Rotator(client, queue_name).push("job")  # one wake-up: the worker's, blocked first
    for thread in threads:
        thread.join(10)
    deadline = held[0].deadline_ms / 1000
    (job_id, reclaimed, at) = got[0]
    assert (job_id, reclaimed) == ("job", True)
    # Long before its 8 s block would have ended (bench/leases.py measures how soon).
    assert at - deadline < 3.0, f"reclaimed {at - deadline:.3f} s after the deadline"


def extended_leases(q: Counting, n: int, extend_ms: int) -> list[bytes]:
    """`n` single leases of 1 s, each then extended by `extend_ms`; returns their tokens once
    their own deadlines have passed (only the extension keeps them)."""
    single_leases(q, n, lease_ms=1000)
    tokens: list[bytes] = q.client.lrange(q.keys[10], 0, -1)  # type: ignore[assignment]
    for start in range(0, n, 1000):
        assert q("extend", extend_ms, *tokens[start : start + 1000])[1:] == [1] * len(
            tokens[start : start + 1000]
        )
    time.sleep(1.1)
    return tokens


def test_more_extended_leases_than_a_budget_do_not_starve_the_ring(
    client: redis.Redis, queue_name: str
) -> None:
    """3,000 held jobs a heartbeat has extended, a budget of 1,000 a call. Each extended lease
    is moved to the lease list's head once ("w"), in its new deadline's order; it was moved
    again each time it came round ("e"), so every claim spent its budget moving them, the
    fresh job was never reached and the consumer was told to call again at once."""
    q = Counting(client, queue_name)
    extended_leases(q, 3000, extend_ms=30_000)
    q("push", "fresh")
    claimed, reads = [], []
    for _ in range(5):
        reply, read = q.read_by("next_packed", 1, 30_000, 1000, 0)
        reads.append(read)
        if reply[3]:
            claimed.append(reply[3])
            break
    assert claimed, reads
    assert claimed[0].endswith(b"*fresh")
    marks: list[Any] = client.hvals(q.keys[3]) + client.hvals(q.keys[4])
    assert len(marks) == 3000
    assert all(m.startswith(b"w") for m in marks)
    # Moved once: the next claim of a fresh job reads the ring alone.
    q("push", "fresher")
    reply, read = q.read_by("next_packed", 1, 30_000, 1000, 0)
    assert reply[3].endswith(b"*fresher")
    assert read <= 2
    assert client.llen(q.keys[10]) == 3002


def test_an_ack_of_the_extended_lease_a_walk_stopped_at_lets_the_next_walk_go_on(
    client: redis.Redis, queue_name: str
) -> None:
    """The walk stops at a young lease and claims skip the lease list until an ack or nack
    names it (meta lstop). An extended lease ("w") waits by its new deadline but its tokens
    carry the one it was made with: lstop must be that one, or the ack of it did not count
    and the acked lease stayed in the list until the extension ran out."""
    q = Counting(client, queue_name)
    extended_leases(q, 3, extend_ms=30_000)
    q("push", "fresh")
    assert q("next_packed", 1, 30_000, 1000, 0)[3].endswith(b"*fresh")  # moves the three
    marks: Any = client.hvals(q.keys[3]) + client.hvals(q.keys[4])
    assert sorted(m[:1] for m in marks) == [b"w"] * 3
    tail: Any = client.lrange(q.keys[10], -1, -1)[0]
    assert q("ack", tail) == 1
    q("push", "fresher")
    reply, read = q.read_by("next_packed", 1, 30_000, 1000, 0)
    assert reply[3].endswith(b"*fresher")
    leases = client.lrange(q.keys[10], 0, -1)
    assert tail not in leases  # removed by this claim, not 30 s later
    assert len(leases) == 4  # two extended, fresh, fresher
    assert read <= 2 + 4 + 2  # the acked one and the next, young, that stops the walk
    # That walk stopped at the next extended lease: the ack of it counts as well.
    tail = leases[-1]
    assert q("ack", tail) == 1
    q("push", "freshest")
    assert q("next_packed", 1, 30_000, 1000, 0)[3].endswith(b"*freshest")
    leases = client.lrange(q.keys[10], 0, -1)
    assert tail not in leases
    assert len(leases) == 4


def test_a_lease_extended_far_waits_in_the_ring_and_holds_up_no_lease_behind_it(
    client: redis.Redis, queue_name: str
) -> None:
    """A job extended by an hour on a queue of 1 s leases: moved to the lease list's head it
    would stop the walk for that hour, and a crashed worker's lease behind it would wait as
    long. It waits in the ring instead (as a nacked job does), and is leased again at its
    deadline, not before."""
    q = Counting(client, queue_name)
    q("push", "long")
    far = q("next_packed", 1, 1000, 1000, 0)[3]
    long_token = far.split(b"*")[2] + far[: far.index(b"*", 1)] + b"00001"
    assert q("extend", 3_600_000, long_token)[1] == 1
    q("push", "crashed")
    q("next_packed", 1, 1000, 1000, 0)  # its worker dies holding it
    time.sleep(1.1)
    q("push", "fresh")
    reply = q("next_packed", 2, 1000, 1000, 0)
    tokens = reply[4::2]
    assert [t.split(b"*")[0] for t in tokens] == [b"crashed"]
    assert reply[5] == 1  # reclaimed
    assert reply[3].endswith(b"*fresh")
    assert long_token in client.lrange(q.keys[0], 0, -1)  # waiting in the ring
    mark: Any = client.hget(q.keys[3], long_token)
    assert mark.startswith(b"e")
    # Still held: an ack of it is taken, and the walk removes it from the ring.
    assert q("ack", long_token) == 1
