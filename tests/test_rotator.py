"""The Rotator API against real Redis 7 and Valkey 8 servers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import cast

import pytest
import redis

from rotator import Durations, Job, LeaseLost, Rotator, Stats, WrongKeyType
from rotator.aio import AsyncRotator
from rotator.sending import socket_timeout
from tests.helpers import drain, later, snapshot
from tests.servers import ServerProcess
from tests.twins import Blocking


@pytest.fixture(params=["sync", "async"])
def q(
    request: pytest.FixtureRequest, server: ServerProcess, client: redis.Redis, queue_name: str
) -> Iterator[Rotator]:
    """The queue as Rotator, and as AsyncRotator driven to completion (tests/twins.py): each
    scenario checks both APIs."""
    if request.param == "sync":
        yield Rotator(client, queue_name, timeout=30.0)
        return
    twin = Blocking(lambda aclient: AsyncRotator(aclient, queue_name, timeout=30.0), server.url)
    yield cast(Rotator, twin)
    twin.close()


def short_lease(client: redis.Redis, queue_name: str, **options: object) -> Rotator:
    return Rotator(client, queue_name, timeout=0.15, **options)  # type: ignore[arg-type]


def test_jobs_come_out_in_push_order_with_unique_tokens(q: Rotator) -> None:
    assert q.push("a", "b", "c") == 3
    assert q.push(*[f"j{i}" for i in range(5)]) == 5
    jobs = q.next(10)
    assert [job.id for job in jobs] == ["a", "b", "c", "j0", "j1", "j2", "j3", "j4"]
    assert len({job.token for job in jobs}) == 8
    assert all(job.deliveries == 1 and not job.reclaimed for job in jobs)
    assert all(job.token.startswith(job.id + "*") for job in jobs)


def test_the_same_id_pushed_twice_is_two_deliveries_with_different_tokens(q: Rotator) -> None:
    q.push("same", "same")
    first, second = q.next(2)
    assert first.id == second.id == "same"
    assert first.token != second.token
    assert q.ack(first) == 1
    assert [job.id for job in q.next(5)] == []  # the second is still leased, not completed
    assert q.stats().in_flight == 1


def test_an_empty_or_missing_queue_returns_nothing(q: Rotator) -> None:
    assert q.next(5) == []
    q.push("x")
    drain(q)
    assert q.next(5) == []
    assert q.stats() == Stats(
        0,
        0,
        0,
        0,
        0,
        0,
        None,
        pushed=1,
        delivered=1,
        completed=1,
        retried=0,
        reclaimed=0,
        dead_lettered=0,
        cancelled=0,
        durations=Durations((0,) * 26),
    )


def test_acked_elements_leave_the_ring_on_the_next_lap(client: redis.Redis, q: Rotator) -> None:
    q.push("a", "b")
    jobs = q.next(2)
    assert q.ack(*jobs) == 2
    assert q.stats().done == 2
    assert q.next(1) == []  # this lap removes them
    assert client.lrange(q.keys.ring, 0, -1) == [b"*lap"]
    assert q.stats() == Stats(
        0,
        0,
        0,
        0,
        0,
        0,
        None,
        pushed=2,
        delivered=2,
        completed=2,
        retried=0,
        reclaimed=0,
        dead_lettered=0,
        cancelled=0,
        durations=Durations((0,) * 26),
    )


def test_acks_carried_by_next_complete_the_previous_batch(q: Rotator) -> None:
    q.push(*[str(i) for i in range(6)])
    first = q.next(3)
    second = q.next(3, ack=first)
    assert [j.id for j in second] == ["3", "4", "5"]
    assert q.next(3, ack=second) == []
    assert q.stats().length == 0


def batch_marks(client: redis.Redis, q: Rotator) -> dict[bytes, bytes]:
    """The batch acks (``a<jobs>``) and touches in the queue's marks, by batch name."""
    marks: dict[bytes, bytes] = client.hgetall(q.keys.all[3])  # type: ignore[assignment]
    return {name: value for name, value in marks.items() if name.startswith(b"*")}


def done_tokens(client: redis.Redis, q: Rotator) -> set[bytes]:
    done: set[bytes] = client.sunion([q.keys.all[1], q.keys.all[2]])  # type: ignore[assignment]
    return done


def test_a_whole_batch_acked_as_next_returned_it_is_one_batch_ack(
    client: redis.Redis, q: Rotator
) -> None:
    q.push(*[str(i) for i in range(6)])
    first = q.next(3)
    batch = b"*" + first[0].token.split("*")[1][:-5].encode()
    assert q.ack(*first) == 3
    assert batch_marks(client, q) == {batch: b"a3"}
    assert done_tokens(client, q) == set()  # no token written one by one
    second = q.next(3, ack=first)  # acked again: one by one now, each accepted
    assert done_tokens(client, q) == {job.token.encode() for job in first}
    assert q.ack(*second, *first[:1]) == 4  # the batch, and a token beside it
    second_batch = b"*" + second[0].token.split("*")[1][:-5].encode()
    assert batch_marks(client, q)[second_batch] == b"a3"
    drain(q)
    assert q.stats().length == 0


def test_a_refused_batch_ack_is_resent_token_by_token(client: redis.Redis, q: Rotator) -> None:
    q.push("a", "b", "c")
    jobs = q.next(3)
    assert q.nack(jobs[0], delay=60) == 1  # revokes the batch
    assert q.ack(*jobs) == 2  # the batch ack is refused, then b and c are accepted
    assert done_tokens(client, q) == {job.token.encode() for job in jobs[1:]}
    assert q.next(3, ack=jobs) == []  # a waits for its nack delay
    assert q.stats().deferred == 1


def test_no_other_consumer_gets_a_job_while_its_lease_is_valid(
    client: redis.Redis, queue_name: str
) -> None:
    one = Rotator(client, queue_name, timeout=30)
    other = Rotator(client, queue_name, timeout=30)
    one.push("only")
    assert [j.id for j in one.next()] == ["only"]
    for _ in range(5):
        assert other.next(10) == []


def test_an_expired_lease_is_reissued_and_the_late_ack_is_refused(
    client: redis.Redis, queue_name: str
) -> None:
    q = short_lease(client, queue_name)
    q.push("slow")
    (first,) = q.next()
    time.sleep(0.2)
    (second,) = q.next()
    assert (second.id, second.deliveries, second.reclaimed) == ("slow", 2, True)
    assert second.token != first.token
    assert q.ack(first) == 0  # fenced: the late ack completes nothing
    with pytest.raises(LeaseLost):
        q.extend(first, 10)
    assert q.nack(first) == 0
    assert q.ack(second) == 1
    drain(q)
    assert q.stats().length == 0
    assert client.scard(q.keys.all[1]) + client.scard(q.keys.all[2]) == 0


def test_expired_lease_is_reclaimed_by_exactly_one_of_many_racing_consumers(
    client: redis.Redis, server: ServerProcess, queue_name: str
) -> None:
    q = short_lease(client, queue_name)
    q.push("contested")
    q.next()
    time.sleep(0.2)
    barrier = threading.Barrier(8)
    got: list[Job] = []
    lock = threading.Lock()

    def race() -> None:
        racer = Rotator.from_url(server.url, queue_name)
        barrier.wait()
        jobs = racer.next(1)
        with lock:
            got.extend(jobs)

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [(j.id, j.reclaimed) for j in got] == [("contested", True)]


def test_the_idempotency_callback_decides_for_reclaimed_jobs_only(
    client: redis.Redis, queue_name: str
) -> None:
    asked: list[str] = []

    def already_done(job_id: str) -> bool:
        asked.append(job_id)
        return job_id == "finished"

    q = short_lease(client, queue_name, idempotency=already_done)
    q.push("finished", "unfinished")
    assert [j.id for j in q.next(2)] == ["finished", "unfinished"]
    assert asked == []  # first deliveries are not asked about
    time.sleep(0.2)
    again = q.next(2)
    assert [(j.id, j.reclaimed) for j in again] == [("unfinished", True)]
    assert sorted(asked) == ["finished", "unfinished"]
    q.ack(*again)
    assert drain(q) == []
    assert q.stats().length == 0


def test_nack_redelivers_at_once_or_after_its_delay(q: Rotator) -> None:
    q.push("now", "later")
    now, later = q.next(2)
    assert q.nack(now) == 1
    assert q.nack(later, delay=0.3) == 1
    assert q.ack(now) == 0  # a nacked delivery cannot be acked any more
    (again,) = q.next(5)
    assert (again.id, again.deliveries, again.reclaimed) == ("now", 2, False)
    assert q.stats().deferred == 1
    assert q.next(5) == []
    time.sleep(0.35)
    (late,) = q.next(5)
    assert (late.id, late.deliveries) == ("later", 2)
    q.ack(again, late)
    assert drain(q) == []
    assert q.stats().length == 0


def test_extend_keeps_a_lease_past_its_deadline(client: redis.Redis, queue_name: str) -> None:
    q = short_lease(client, queue_name)
    q.push("long")
    (job,) = q.next()
    deadline = q.extend(job, 5.0)
    assert deadline > time.time() + 4
    time.sleep(0.25)
    assert q.next(5) == []  # past the original 0.15 s lease, still held
    assert q.ack(job) == 1


def test_jobs_delivered_max_deliveries_times_become_dead_letters(
    client: redis.Redis, queue_name: str
) -> None:
    q = short_lease(client, queue_name, max_deliveries=2)
    q.push("poison", "fine")
    for _ in range(2):
        assert {j.id for j in q.next(5)} >= {"poison"}
        time.sleep(0.2)
    leftovers = q.next(5)
    assert "poison" not in {j.id for j in leftovers}
    (letter,) = [d for d in q.dead() if d.id == "poison"]
    assert (letter.reason, letter.deliveries) == ("max_deliveries", 2)
    assert q.requeue_dead("poison") == 1
    assert q.dead() == [d for d in q.dead() if d.id != "poison"]
    assert "poison" in {j.id for j in q.next(5)}


def test_a_blocked_consumer_is_woken_by_a_push(q: Rotator) -> None:
    started = time.monotonic()
    with later(0.2, lambda: q.push("wake-up")):
        jobs = q.next(block=10.0)
    assert [j.id for j in jobs] == ["wake-up"]
    assert time.monotonic() - started < 5.0  # woken, not timed out


def test_a_blocked_consumer_is_woken_when_a_lease_expires(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=0.3)
    q.push("abandoned")
    q.next()
    started = time.monotonic()
    (job,) = q.next(block=10.0)
    assert job.reclaimed
    assert time.monotonic() - started < 5.0


def test_a_consumer_woken_after_a_script_flush_still_gets_the_job(
    client: redis.Redis, q: Rotator
) -> None:
    # The call that follows the wake-up is sent with the BLPOP, before anyone knows whether
    # the script is still cached: a NOSCRIPT reply there means nothing ran, and it is resent.
    q.next()  # the script is loaded
    with later(0.2, lambda: (client.script_flush(), q.push("after"))):
        (job,) = q.next(block=10.0)
    assert (job.id, job.deliveries) == ("after", 1)
    assert q.ack(job) == 1


def test_a_call_that_fails_after_the_wake_up_raises_its_typed_error(
    client: redis.Redis, q: Rotator, queue_name: str
) -> None:
    q.push("x")
    q.ack(*q.next())
    assert q.next() == []  # a lap: the ring holds only its sentinel

    def break_the_ring() -> None:
        client.delete(q.keys.ring)
        client.set(q.keys.ring, "not a list")
        client.lpush(q.keys.wake, "1")

    with later(0.2, break_the_ring), pytest.raises(WrongKeyType):
        q.next(block=10.0)
    assert client.get(q.keys.ring) == b"not a list"  # nothing written


def test_block_gives_up_after_its_time_on_an_empty_queue(q: Rotator) -> None:
    started = time.monotonic()
    assert q.next(block=0.3) == []
    assert time.monotonic() - started >= 0.3


def test_calls_survive_script_flush(client: redis.Redis, q: Rotator) -> None:
    q.push("a")
    client.script_flush()
    (job,) = q.next()
    client.script_flush()
    assert q.ack(job) == 1


def test_claim_acks_on_success_and_nacks_on_error(q: Rotator) -> None:
    q.push("ok", "boom")
    with q.claim() as job:
        assert job is not None
        assert job.id == "ok"
    with pytest.raises(RuntimeError), q.claim() as job:
        raise RuntimeError("handler failed")
    (retry,) = q.next()
    assert (retry.id, retry.deliveries) == ("boom", 2)
    with q.claim() as nothing:
        assert nothing is None


def test_stats_follow_a_job_through_its_life(client: redis.Redis, queue_name: str) -> None:
    q = short_lease(client, queue_name)
    q.push("a", "b", "c")
    s = q.stats()
    assert (s.length, s.pending, s.in_flight, s.done) == (3, 3, 0, 0)
    assert s.oldest_pending_age is not None
    assert 0 <= s.oldest_pending_age < 5
    a, b = q.next(2)
    q.ack(a)
    q.nack(b, delay=60)
    s = q.stats()
    assert (s.length, s.pending, s.in_flight, s.done, s.deferred) == (3, 1, 0, 1, 1)
    # Its walk of the lease list takes a's acked lease away, and moves b to the ring to wait.
    assert [j.id for j in q.next(1)] == ["c"]
    s = q.stats()
    assert (s.length, s.pending, s.in_flight, s.done, s.deferred) == (2, 0, 1, 0, 1)
    assert s.oldest_pending_age is None
    assert q.next(1) == []
    s = q.stats()
    assert (s.length, s.pending, s.in_flight, s.done, s.deferred) == (2, 0, 1, 0, 1)
    assert s.as_dict()["deferred"] == 1


def test_a_counter_written_by_hand_starts_again_and_fails_no_call(
    client: redis.Redis, queue_name: str
) -> None:
    """The calls add to the counters without reading them (HINCRBY; one worker's loop reads
    `completed` and leaves one it cannot add to to them): one that is not a whole number,
    written by hand, must not fail a call that has already written its other changes (stats
    reads it as 0, and the next change starts it again from what it adds)."""
    q = short_lease(client, queue_name)
    q.push("a", "b", "c")
    client.hset(q.keys.meta, mapping={"completed": "garbage", "retried": "1.5"})
    a, b = q.next(2)
    assert q.nack(b) == 1  # would fail after revoking b's token, had it not been handled
    q.ack(a)
    assert {j.id for j in q.next(2)} == {"b", "c"}  # the walk removes a: completed 1
    s = q.stats()
    assert (s.completed, s.retried, s.pushed, s.delivered) == (1, 1, 3, 4)
    assert client.hmget(q.keys.meta, "completed", "retried") == [b"1", b"1"]


def test_peek_shows_states_and_changes_nothing(client: redis.Redis, q: Rotator) -> None:
    q.push("a", "b", "c")
    a, b = q.next(2)
    q.ack(a)
    q.nack(b, delay=60)
    before = snapshot(client, q)
    states = {entry.element.partition("*")[0]: entry.state for entry in q.peek(10)}
    assert states == {"a": "done", "b": "deferred", "c": "pending", "": "lap"}
    assert snapshot(client, q) == before


def test_a_client_made_from_a_url_blocks_past_its_socket_timeout(
    server: ServerProcess, queue_name: str
) -> None:
    """redis-py 8 keeps a URL client's socket timeout (5 s; redis-py 6.0 has none) out of the
    pool's kwargs: the wait on the wake list must still stay within it, or a long block fails
    with TimeoutError."""
    q = Rotator.from_url(server.url, queue_name, timeout=30.0)
    assert socket_timeout(q.client) == redis.Connection().socket_timeout  # type: ignore[no-untyped-call]
    started = time.monotonic()
    assert q.next(1, block=5.5) == []
    assert time.monotonic() - started >= 5.5


def test_making_a_rotator_reads_no_socket_timeout_until_it_first_blocks(
    server: ServerProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a URL client's socket timeout makes a connection object (milliseconds: redis-py
    looks its own version up); a client that never blocks must not pay for it, and one that
    blocks asks once per connection class."""
    made: list[object] = []
    original: Callable[..., None] = redis.Connection.__init__

    def counting(self: redis.Connection, *args: object, **kwargs: object) -> None:
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(redis.Connection, "__init__", counting)
    monkeypatch.setattr("rotator.sending._DEFAULT_SOCKET_TIMEOUTS", {})
    q = Rotator.from_url(server.url, queue_name, timeout=30.0)
    q.push("a")
    assert [job.id for job in q.next(1)] == ["a"]
    assert len(made) == 1  # the pool's one connection, no other
    assert q.next(1, block=0.05) == []
    assert len(made) == 2  # the timeout read once, on the first block
    other = Rotator.from_url(server.url, queue_name, timeout=30.0)
    assert other.next(1, block=0.05) == []
    assert len(made) == 3  # the other client's own connection: the class's timeout is known


def test_a_job_acked_twice_or_alone_then_with_its_batch_counts_once(q: Rotator) -> None:
    q.push("solo")
    [solo] = q.next(1)
    assert q.ack(solo, solo) == 1  # the batch ack alone: solo is named once
    assert q.stats().done == 1
    q.push("a", "b", "c")
    jobs = q.next(3)
    assert q.ack(jobs[0]) == 1
    assert q.ack(*jobs) == 3  # the batch ack is refused (a was acked alone): token by token
    stats = q.stats()
    assert (stats.done, stats.completed) == (3, 1)  # a, b, c; solo left at the last claim
    q.sweep()
    assert q.stats().length == 0
    assert q.stats().completed == 4
