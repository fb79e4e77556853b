"""Plain-queue payloads (payloads=True) on real servers; the bare ring stays as it was."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aredis

from rotator import InvalidArgument, InvalidJobId, InvalidToken, Job, Rotator
from rotator.aio import AsyncRotator
from rotator.commands import decode_next_packed_payloads
from rotator.protocol import Batches, PackedAcks
from tests.servers import ServerProcess


@pytest.fixture
def q(client: redis.Redis, queue_name: str) -> Rotator:
    return Rotator(client, queue_name, timeout=30.0, payloads=True)


def test_next_returns_each_jobs_payload_in_the_same_call(q: Rotator) -> None:
    assert q.push_payloads({"a": b"\x00bin", "b": "text \u00e9", 7: b""}) == 3
    jobs = q.next(10)
    assert [(j.id, j.payload) for j in jobs] == [
        ("a", b"\x00bin"),
        ("b", "text \u00e9".encode()),
        ("7", b""),
    ]


def test_an_accepted_ack_deletes_the_payload_and_a_refused_one_does_not(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=0.1, payloads=True)
    q.push_payloads({"x": "1", "y": "2"})
    first = q.next(2)
    time.sleep(0.15)
    again = q.next(2)  # both leases expired: re-issued, the first tokens are revoked
    assert [j.payload for j in again] == [b"1", b"2"]
    assert q.ack(*first) == 0
    assert client.hlen(q.keys.payloads) == 2
    assert q.ack(again[0]) == 1
    assert client.hgetall(q.keys.payloads) == {b"y": b"2"}
    assert q.next(1, ack=[again[1]]) == []
    assert not client.exists(q.keys.payloads)


def test_nack_keeps_the_payload_for_the_next_delivery(q: Rotator) -> None:
    q.push_payloads({"job": "body"})
    (job,) = q.next()
    assert q.nack(job) == 1
    (retry,) = q.next()
    assert (retry.id, retry.deliveries, retry.payload) == ("job", 2, b"body")


def test_a_job_pushed_without_a_payload_comes_with_none(q: Rotator) -> None:
    q.push("bare")
    q.push_payloads({"full": "x"})
    assert [(j.id, j.payload) for j in q.next(5)] == [("bare", None), ("full", b"x")]


def test_the_bare_queue_is_untouched_when_payloads_are_off(
    client: redis.Redis, queue_name: str
) -> None:
    bare = Rotator(client, queue_name)
    bare.push("a")
    (job,) = bare.next()
    assert job.payload is None
    bare.ack(job)
    assert not client.exists(bare.keys.payloads)
    with pytest.raises(InvalidArgument):
        bare.push_payloads({"a": "b"})


def test_a_batch_with_a_bad_id_writes_nothing(client: redis.Redis, q: Rotator) -> None:
    with pytest.raises(InvalidJobId):
        q.push_payloads({"good": "1", "bad*": "2"})
    with pytest.raises(InvalidArgument):
        q.push_payloads({"good": 3})  # type: ignore[dict-item]
    assert not client.exists(*q.keys.with_payloads)


def test_large_batches_are_split_into_atomic_calls(client: redis.Redis, q: Rotator) -> None:
    items = {f"j{i}": f"p{i}" for i in range(6000)}
    assert q.push_payloads(items) == 6000
    assert client.hlen(q.keys.payloads) == 6000
    got = []
    previous: list[Job] = []
    while jobs := q.next(1000, ack=previous):
        got += jobs
        previous = jobs
    q.ack(*previous)
    assert [(j.id, j.payload) for j in got] == [(k, v.encode()) for k, v in items.items()]
    assert not client.exists(q.keys.payloads)


def test_delete_removes_the_payloads_too(client: redis.Redis, q: Rotator) -> None:
    q.push_payloads({"a": "1"})
    assert q.delete()
    meta = q.keys.meta
    assert not client.exists(*(key for key in q.keys.with_payloads if key != meta))
    # All a deleted queue keeps is where its seq got to: no token of it is issued again.
    assert set(client.hkeys(meta)) == {b"seq", b"origin"}


def test_payloads_work_through_fcall(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, payloads=True, functions=True)
    q.push_payloads({"f": "v"})
    (job,) = q.next()
    assert job.payload == b"v"
    assert q.ack(job) == 1
    assert not client.exists(q.keys.payloads)


def test_asyncio_plain_queue_payloads(server: ServerProcess, queue_name: str) -> None:
    async def scenario() -> None:
        client = aredis.Redis.from_url(server.url)
        try:
            queue = AsyncRotator(client, queue_name, payloads=True)
            assert await queue.push_payloads({"x": "px", "y": b"py"}) == 2
            jobs = await queue.next(5)
            assert [(j.id, j.payload) for j in jobs] == [("x", b"px"), ("y", b"py")]
            assert await queue.ack(*jobs) == 2
            assert not await client.exists(queue.keys.payloads)
            await client.delete(*queue.keys.all)
            counted = AsyncRotator(client, queue_name + "-s", item_stats=True)
            assert await counted.push("s") == 1
            (job,) = await counted.next()
            assert await counted.fail(job, error="oops") == 1
            (stats,) = await counted.item_stats("s")
            assert stats is not None
            assert (stats.deliveries, stats.last_error) == (1, "oops")
            (job,) = await counted.next()
            assert await counted.ack(job) == 1
            assert await counted.item_stats("s") == [None]
            await client.delete(*counted.keys.with_items)
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_item_stats_follow_a_job_from_push_to_ack(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, timeout=30.0, item_stats=True)
    before = int(time.time() * 1000)
    q.push("a", "b")
    (a_stats, b_stats, none) = q.item_stats("a", "b", "never")
    assert none is None
    assert a_stats is not None
    assert a_stats.enqueued_ms is not None
    assert before - 50 <= a_stats.enqueued_ms <= before + 5000
    assert (a_stats.deliveries, a_stats.last_delivery_ms, a_stats.last_error) == (0, None, None)
    assert b_stats is not None
    first, second = q.next(2)
    assert first.payload is None  # stats without payloads
    assert q.fail(first, error="boom: bad input") == 1
    (again,) = q.next(1)
    assert again.id == "a"
    (stats,) = q.item_stats("a")
    assert stats is not None
    assert stats.deliveries == 2
    assert stats.last_error == "boom: bad input"
    assert stats.last_delivery_ms is not None
    assert stats.last_delivery_ms >= a_stats.enqueued_ms
    assert q.ack(again, second) == 2
    assert q.item_stats("a", "b") == [None, None]
    assert not client.exists(q.keys.items)
    q.delete()


def test_item_stats_and_payloads_together(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, payloads=True, item_stats=True)
    q.push_payloads({"j": "body"})
    (job,) = q.next()
    assert job.payload == b"body"
    (stats,) = q.item_stats("j")
    assert stats is not None
    assert stats.deliveries == 1
    assert q.next(1, ack=[job]) == []
    assert not client.exists(q.keys.payloads, q.keys.items)
    with pytest.raises(InvalidArgument):
        q.fail(job, error="x" * 5000)
    with pytest.raises(InvalidArgument):
        Rotator(client, queue_name).item_stats("j")


def test_without_item_stats_fail_is_a_plain_nack(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.push("a")
    (job,) = q.next()
    assert q.fail(job, error="ignored") == 1
    assert [j.deliveries for j in q.next()] == [2]
    assert not client.exists(q.keys.items)
    q.delete()


def test_the_worker_records_a_failed_jobs_last_error(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, item_stats=True, max_deliveries=1)
    q.push("flaky")

    def handler(job: Job) -> None:
        raise RuntimeError("disk full")

    summary = q.work(handler, stop_when_empty=True, poll=0.05, install_signal_handlers=False)
    assert summary.failed == 1
    assert [letter.id for letter in q.dead()] == ["flaky"]
    (stats,) = q.item_stats("flaky")
    assert stats is not None
    assert stats.deliveries == 1
    assert stats.last_error == "RuntimeError: disk full"


def test_a_packed_payload_reply_gives_each_job_its_own_payload() -> None:
    """nextp_packed: the batch packed, its payloads in order, then the later deliveries."""
    stamp = "1700000000000.1.42"
    reply = [0, -1, 2, f"*{stamp}*a*b".encode(), b"pa", None, b"c*1700000001000.2.40", 1, b"pc"]
    decoded = decode_next_packed_payloads(reply)
    assert (decoded.batch, decoded.batch_jobs, decoded.acked) == (stamp.encode(), 2, 2)
    assert [(j.id, j.token, j.deliveries, j.reclaimed, j.payload) for j in decoded.jobs] == [
        ("a", f"a*{stamp}00001", 1, False, b"pa"),
        ("b", f"b*{stamp}00002", 1, False, None),
        ("c", "c*1700000001000.2.40", 2, True, b"pc"),
    ]
    with pytest.raises(InvalidToken, match="1 payloads for a batch of 2"):
        decode_next_packed_payloads(reply[:5])


def test_a_named_batch_ack_is_the_packed_element_the_reply_sent() -> None:
    """Acking a payload batch whole as next returned it sends its element back byte for byte:
    no id joined again (one here is not UTF-8), and once only."""
    stamp = b"1700000000000.1.42"
    element = b"*" + stamp + b"*a*\xff\xfeb"
    decoded = decode_next_packed_payloads([0, -1, 0, element, b"pa", b"pb"])
    assert decoded.element == element
    batches = Batches()
    batches.note(decoded)
    assert batches.pack_refs(decoded.jobs, named=True) == PackedAcks([element], True, 2)
    tokens = [job.token.encode("utf-8", "surrogateescape") for job in decoded.jobs]
    assert batches.pack_refs(decoded.jobs, named=True) == PackedAcks(tokens, False, 2)


def test_a_payload_queue_batch_comes_packed_and_its_acks_drop_each_payload(
    redis_server: ServerProcess, queue_name: str
) -> None:
    q = Rotator(redis_server.client(), queue_name, payloads=True)
    q.push_payloads({f"j{i}": f"p{i}".encode() for i in range(5)})
    jobs = q.next(5)
    assert [(job.id, job.payload) for job in jobs] == [
        (f"j{i}", f"p{i}".encode()) for i in range(5)
    ]
    stamps = {job.token.split("*")[1][:-5] for job in jobs}
    assert len(stamps) == 1  # one call's batch, as a plain queue's next_packed gives it
    assert q.next(5, ack=jobs) == []
    assert q.client.exists(q.keys.payloads) == 0


def test_a_batch_too_deep_in_the_lease_list_to_be_found_is_acked_token_by_token(
    redis_server: ServerProcess, queue_name: str
) -> None:
    """The module looks for a named batch ack's element within 100 elements of either end of
    the lease list; a batch held while more than that were leased on both sides of it is
    refused by name, and the client acks it token by token: its payloads go all the same."""
    q = Rotator(redis_server.client(), queue_name, payloads=True)
    q.push_payloads({f"j{i}": b"p" for i in range(300)})
    before = [q.next(1) for _ in range(101)]
    held = q.next(2)
    after = [q.next(1) for _ in range(101)]
    calls = calls_made(q)
    assert q.ack(*held) == 2
    assert calls_made(q) - calls == 2  # by name (refused), then by tokens
    remaining = q.client.hkeys(q.keys.payloads)
    assert {job.id.encode() for job in held}.isdisjoint(remaining)
    assert len(remaining) == 300 - 2
    assert q.ack(*[job for jobs in before + after for job in jobs]) == 202
    assert q.client.hlen(q.keys.payloads) == 300 - 204


def calls_made(q: Rotator) -> int:
    """Module calls the server has run so far (FCALL and EVALSHA)."""
    stats = q.client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("fcall", "evalsha")
    )
