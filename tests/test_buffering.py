"""Producer and consumer buffering (rotator.buffering) on real servers: every id pushed once
and in order, the size, time and exit flushes, failed flushes raised on the next call and
sent again, several threads through one producer; a consumer whose acks ride on its claims,
whose prefetched jobs keep their leases, and which gives back on exit what it did not ack.
Each scenario runs on Redis and on Valkey; the asyncio twins run the main ones too."""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from rotator import (
    InvalidArgument,
    InvalidJobId,
    NotTracked,
    Rotator,
    RotatorError,
    WrongKeyType,
)
from rotator import buffering as b
from rotator.aio import AsyncRotator
from rotator.commands import AfterWake, ModuleCall, Request, Together
from rotator.lane import AsyncLane, Lane
from tests.helpers import drain, wait_until
from tests.servers import ServerProcess


@contextmanager
def counting(q: Rotator | AsyncRotator) -> Iterator[list[str]]:
    """The module commands ``q`` sends meanwhile (``push``, ``next_packed``, ``ack``...), in
    order, calls sent together as one (``nack+next_packed``); lease extends (the lease
    keeping's, on its own clock) and the test's own ``stats`` are left out."""
    sent: list[str] = []
    perform = q._sender.perform

    def spy(request: Request) -> Any:
        call = request.call if isinstance(request, AfterWake) else request
        if isinstance(call, Together):
            sent.append("+".join(part.args[0].decode() for part in call.calls))
        elif isinstance(call, ModuleCall) and call.args[0] not in {b"extend", b"stats"}:
            sent.append(call.args[0].decode())
        return perform(request)

    q._sender.perform = spy  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        del q._sender.perform


# Module commands a round trip may carry that tests leave out: the lease keeping's extends,
# on its own clock, and the test's own stats.
UNCOUNTED = {"extend", "stats"}


def command_name(args: tuple[Any, ...]) -> str | None:
    """The module command ``args`` (a client command) calls, or ``blpop``; None for others."""
    head = protocol_text(args[0]).upper()
    if head in {"FCALL", "EVALSHA", "EVAL"}:
        return protocol_text(args[3 + int(args[2])])
    return "blpop" if head == "BLPOP" else None


def protocol_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def note_trip(trips: list[tuple[str, ...]], commands: list[tuple[Any, ...]]) -> None:
    names = tuple(name for args in commands if (name := command_name(args)) is not None)
    if names and not set(names) <= UNCOUNTED:
        trips.append(names)


@contextmanager
def round_trips(client: redis.Redis | aredis.Redis) -> Iterator[list[tuple[str, ...]]]:
    """The round trips ``client`` makes meanwhile that call the module: each a command of
    its own, or a pipeline's ``execute``, noted as the module commands it carried, in order
    (``("nack", "next_packed")``; a BLPOP as ``blpop``). Trips of lease extends and stats
    only are left out. Sync or asyncio client; wraps its ``execute_command`` and
    ``pipeline`` on the instance, and the fast lane's calls on it (rotator.lane), so
    whatever sends through them is seen."""
    trips: list[tuple[str, ...]] = []
    execute_command = client.execute_command
    pipeline = client.pipeline
    lane_call, async_lane_call = Lane.call, AsyncLane.call

    def by_lane(lane: Lane, keys: tuple[Any, ...], args: Any) -> Any:
        if lane.client is client:
            note_trip(trips, [(lane.verb, lane.name, len(keys), *keys, *args)])
        return lane_call(lane, keys, args)

    async def by_async_lane(lane: AsyncLane, keys: tuple[Any, ...], args: Any) -> Any:
        if lane.client is client:
            note_trip(trips, [(lane.verb, lane.name, len(keys), *keys, *args)])
        return await async_lane_call(lane, keys, args)

    def one(*args: Any, **options: Any) -> Any:
        note_trip(trips, [args])
        return execute_command(*args, **options)

    def piped(*args: Any, **options: Any) -> Any:
        pipe = pipeline(*args, **options)
        execute = pipe.execute

        def run(*run_args: Any, **run_options: Any) -> Any:
            note_trip(trips, [command for command, _ in pipe.command_stack])
            return execute(*run_args, **run_options)

        pipe.execute = run  # type: ignore[method-assign]
        return pipe

    client.execute_command = one  # type: ignore[method-assign]
    client.pipeline = piped  # type: ignore[method-assign]
    Lane.call = by_lane  # type: ignore[method-assign, assignment]
    AsyncLane.call = by_async_lane  # type: ignore[method-assign, assignment]
    try:
        yield trips
    finally:
        del client.execute_command
        del client.pipeline
        Lane.call = lane_call  # type: ignore[method-assign]
        AsyncLane.call = async_lane_call  # type: ignore[method-assign]


def acked(q: Rotator) -> int:
    """Jobs acked: removed from the ring (``completed``) or not yet (``done``)."""
    stats = q.stats()
    return stats.done + (stats.completed or 0)


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(n)]


# -- producer ---------------------------------------------------------------------------------


def test_every_id_is_pushed_once_in_the_order_pushed(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    pushed = ids("job", 2345)
    with q.producer(max_batch=100, max_delay=0.01) as p:
        for job_id in pushed:
            p.push(job_id)
    assert (p.sent, p.pending) == (2345, 0)
    assert drain(q, 1000) == pushed
    assert q.stats().pushed == 2345


def test_a_push_that_fills_a_batch_sends_it(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    with q.producer(max_batch=10, max_delay=60) as p, counting(q) as calls:
        p.push(*ids("a", 9))
        assert q.stats().pending == 0  # nine wait for a tenth, or a minute
        p.push("a-00009")
        assert q.stats().pending == 10
        assert calls.count("push") == 1
        p.push(*ids("b", 25))  # one push of 25: sent at once, in calls of 10
        assert q.stats().pending == 35
        assert calls.count("push") == 4
    assert p.sent == 35


def test_the_background_flush_sends_what_waited_max_delay(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    with q.producer(max_batch=500, max_delay=0.1) as p:
        p.push("a", "b")
        p.push("c")
        wait_until(lambda: q.stats().pending == 3, timeout=10)
        assert (p.sent, p.pending) == (3, 0)
        p.push("d")  # and again, once the buffer filled up anew
        wait_until(lambda: q.stats().pending == 4, timeout=10)
    assert drain(q) == ["a", "b", "c", "d"]


def test_exit_and_flush_send_everything(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    with q.producer(max_batch=500, max_delay=60) as p:
        p.push("a")
        p.flush()
        assert q.stats().pending == 1
        p.push("b", "c")
    assert q.stats().pending == 3
    with pytest.raises(RotatorError, match="closed"):
        p.push("d")
    p.flush()  # nothing left: a closed producer's flush is a no-op


def test_options_group_calls_and_keep_their_meaning(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, payloads=True)
    with q.producer(max_batch=500, max_delay=60) as p, counting(q) as calls:
        p.push("now-1")
        p.push("later-1", delay=3600)
        p.push_payload("with-1", b"one")
        p.push("now-2")
        p.push("later-2", delay=3600)
        p.push("at-1", at=time.time() + 7200)
        p.push_payload("with-2", "two")
        p.push_payload("with-later", b"x", delay=3600)
        p.flush()
        assert calls == ["push", "push_later", "pushp", "push_later", "pushp_later"]
    stats = q.stats()
    assert (stats.pending, stats.scheduled) == (4, 4)
    jobs = q.next(10)
    assert [(job.id, job.payload) for job in jobs] == [
        ("now-1", None),
        ("now-2", None),
        ("with-1", b"one"),
        ("with-2", b"two"),
    ]


def test_bad_input_raises_at_the_push_and_takes_nothing(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    with q.producer(max_batch=3, max_delay=60) as p:
        p.push("a")
        with pytest.raises(InvalidJobId):
            p.push("b", "bad*id")
        with pytest.raises(InvalidArgument):
            p.push("c", delay=-1)
        with pytest.raises(InvalidArgument, match="payloads=True"):
            p.push_payload("d", b"x")
        assert p.pending == 1
        p.push("e", "f")  # the batch of three: a, e, f
        assert drain(q) == ["a", "e", "f"]
    for max_batch, max_delay in ((0, 0.05), (5001, 0.05), (10, 0.0), (10, -1.0), (10, 61.0)):
        with pytest.raises(InvalidArgument):
            q.producer(max_batch=max_batch, max_delay=max_delay)


def test_a_failed_flush_raises_on_the_next_call_and_is_sent_again(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    with q.producer(max_batch=5, max_delay=60) as p:
        p.push(*ids("first", 5))  # sent
        client.set(q.keys.wake, "someone else's string")  # push reads it: WRONGTYPE
        p.push(*ids("kept", 5))  # fills a batch: its call is refused, the jobs are kept
        assert (p.sent, p.pending) == (5, 5)
        with pytest.raises(WrongKeyType) as raised:
            p.push("refused-at-the-door")  # raises the flush's error, takes nothing
        assert "earlier flush" in "".join(raised.value.__notes__)
        assert p.pending == 5
        p.push("after")  # raised once: the next push is taken
        with pytest.raises(WrongKeyType):
            p.flush()  # sends again, fails again, raises
        client.delete(q.keys.wake)
        p.flush()
        assert (p.sent, p.pending) == (11, 0)
    assert drain(q) == [*ids("first", 5), *ids("kept", 5), "after"]


def test_a_background_flush_that_failed_raises_on_the_next_push(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    client.set(q.keys.wake, "in the way")
    p = q.producer(max_batch=500, max_delay=0.02)
    p.push("a", "b")
    # The timer's flush fails (and is tried again every max_delay); nothing is sent. (Its
    # error, kept for the next call, is private: waiting for it is how a test knows.)
    wait_until(lambda: p._out._error is not None, timeout=10)
    with pytest.raises(WrongKeyType):
        p.push("c")
    assert (p.pending, p.sent) == (2, 0)
    with pytest.raises(WrongKeyType):
        p.close()  # exit sends again: refused again, raised; the jobs stay to retry
    assert p.pending == 2
    client.delete(q.keys.wake)
    p.flush()
    assert drain(q) == ["a", "b"]


def test_jobs_are_kept_through_a_server_outage(
    server: ServerProcess, tmp_path: Path, queue_name: str
) -> None:
    aof = {"appendonly": "yes", "appendfsync": "always"}
    with ServerProcess(server.kind, tmp_path, aof) as own, own.client() as conn:
        q = Rotator(conn, queue_name)
        with q.producer(max_batch=10, max_delay=60) as p:
            p.push(*ids("before", 10))
            assert p.sent == 10
            own.stop()
            p.push(*ids("during", 10))  # a full batch: its flush fails
            with pytest.raises(redis.ConnectionError):
                p.push("refused")
            p.push(*ids("during-more", 3))
            with pytest.raises(redis.ConnectionError):
                p.flush()
            assert (p.sent, p.pending) == (10, 13)
            own.start()
            p.flush()
        expected = [*ids("before", 10), *ids("during", 10), *ids("during-more", 3)]
        assert drain(q) == expected


def test_several_threads_push_through_one_producer(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    threads, each = 6, 1500
    start = threading.Barrier(threads)
    with q.producer(max_batch=200, max_delay=0.005) as p:

        def pusher(t: int) -> None:
            start.wait()
            for job_id in ids(f"t{t}", each):
                p.push(job_id)

        workers = [threading.Thread(target=pusher, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    seen = drain(q, 1000)
    assert len(seen) == threads * each == len(set(seen))
    for t in range(threads):
        assert [job_id for job_id in seen if job_id.startswith(f"t{t}-")] == ids(f"t{t}", each)


def test_the_async_producer_sends_on_size_time_and_exit_and_raises_on_the_next_call(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario(client: aredis.Redis) -> None:
        q = AsyncRotator(client, queue_name)
        async with q.producer(max_batch=4, max_delay=0.05) as p:
            await p.push(*ids("size", 4))
            assert (await q.stats()).pending == 4  # sent by the push that filled it
            await p.push("time")
            for _ in range(200):
                if (await q.stats()).pending == 5:
                    break
                await asyncio.sleep(0.05)
            assert p.sent == 5
            await client.set(q.keys.wake, "in the way")
            await p.push(*ids("kept", 4))
            with pytest.raises(WrongKeyType):
                await p.push("refused")
            await client.delete(q.keys.wake)
            await p.push("exit")
        assert (p.sent, p.pending) == (10, 0)
        got = []
        while jobs := await q.next(100):
            got += [job.id for job in jobs]
            await q.ack(*jobs)
        assert got == [*ids("size", 4), "time", *ids("kept", 4), "exit"]

    run_async(server, scenario)


def test_many_tasks_push_through_one_async_producer(server: ServerProcess, queue_name: str) -> None:
    async def scenario(client: aredis.Redis) -> None:
        q = AsyncRotator(client, queue_name)
        async with q.producer(max_batch=50, max_delay=0.01) as p:

            async def pusher(t: int) -> None:
                for job_id in ids(f"t{t}", 300):
                    await p.push(job_id)
                    if job_id.endswith("7"):
                        await asyncio.sleep(0)

            await asyncio.gather(*(pusher(t) for t in range(5)))
        assert (p.sent, (await q.stats()).pending) == (1500, 1500)

    run_async(server, scenario)


# -- producer: unique pushes ------------------------------------------------------------------


def tracked(client: redis.Redis, name: str, **options: Any) -> Rotator:
    q = Rotator(client, name, **options)
    assert q.configure(track_ids=True).track_ids
    return q


def push_name(request: Request) -> str | None:
    """The command of a push of any kind (a unique one's starts ``unique``); None: not one."""
    if not isinstance(request, ModuleCall):
        return None
    name = request.args[0]
    if isinstance(name, bytes) and (b"push" in name or name == b"unique"):
        return name.decode()
    return None


@contextmanager
def replies_lost(q: Rotator, lose: int) -> Iterator[list[str]]:
    """The next ``lose`` pushes ``q`` sends run on the server and then raise ConnectionError,
    as when the connection drops after the server ran the call and before its reply came."""
    pushes: list[str] = []
    perform = q._sender.perform

    def spy(request: Request) -> Any:
        reply = perform(request)
        if (name := push_name(request)) is not None:
            pushes.append(name)
            if len(pushes) <= lose:
                raise redis.ConnectionError("reply lost")
        return reply

    q._sender.perform = spy  # type: ignore[method-assign]
    try:
        yield pushes
    finally:
        del q._sender.perform


def test_a_unique_push_through_the_producer_skips_the_ids_the_queue_holds(
    client: redis.Redis, queue_name: str
) -> None:
    q = tracked(client, queue_name)
    q.push("in-flight")
    [taken] = q.next(1)
    q.push("waiting")
    q.push("scheduled", delay=3600)
    with q.producer(max_batch=500, max_delay=60) as p:
        p.push("waiting", "scheduled", "in-flight", "new-1", unique=True)
        p.push("new-1", "new-2", unique=True)  # again within the buffer: held once
        p.push("low", "waiting", priority=2, unique=True)
        p.push("later", "scheduled", delay=3600, unique=True)
        p.flush()
        assert (p.sent, p.pending) == (10, 0)  # sent: what went, added or skipped
    stats = q.stats()
    assert (stats.pending, stats.scheduled, stats.in_flight) == (4, 2, 1)
    assert q.push("in-flight", unique=True) == 0
    q.ack(taken)
    assert drain(q) == ["waiting", "new-1", "new-2", "low"]  # level 0 before level 2
    assert q.push("in-flight", "waiting", unique=True) == 2  # acked: free again


def test_a_unique_flush_sent_again_after_a_lost_reply_adds_nothing_twice(
    client: redis.Redis, queue_name: str
) -> None:
    q = tracked(client, queue_name)
    pushed = ids("order", 30)
    with q.producer(max_batch=10, max_delay=60) as p, replies_lost(q, lose=2) as calls:
        p.push(*pushed[:10], unique=True)  # a full batch: run, its reply lost, kept
        assert (p.sent, p.pending) == (0, 10)
        with pytest.raises(redis.ConnectionError):
            p.push("refused", unique=True)  # raises the flush's error, takes nothing
        with pytest.raises(redis.ConnectionError):
            p.flush()  # the kept ten sent again: run again (adding nothing), reply lost again
        assert (p.sent, p.pending) == (0, 10)
        p.push(*pushed[10:], unique=True)  # the ten a third time, then the twenty new
    assert (p.sent, p.pending) == (30, 0)
    assert len(calls) == 5  # the first ten three times (two replies lost), then 10 + 10
    assert q.stats().pending == 30
    assert drain(q) == pushed


def test_without_unique_a_flush_sent_again_after_a_lost_reply_pushes_twice(
    client: redis.Redis, queue_name: str
) -> None:
    # What the producer's docstring says of a lost reply on a queue that does not track ids:
    # the contrast that makes the unique test above mean something.
    q = Rotator(client, queue_name)
    with q.producer(max_batch=5, max_delay=60) as p, replies_lost(q, lose=1):
        p.push(*ids("job", 5))
        with pytest.raises(redis.ConnectionError):
            p.flush()
    assert drain(q) == ids("job", 5) * 2


def test_a_unique_push_to_a_queue_that_does_not_track_ids_is_kept_and_raised(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    with q.producer(max_batch=500, max_delay=60) as p:
        p.push("a", "b", unique=True)
        with pytest.raises(NotTracked):
            p.flush()  # refused, nothing written: kept, never dropped
        assert (p.pending, q.exists()) == (2, False)
        assert q.configure(track_ids=True).track_ids  # still empty: it may track ids now
        p.push("a", unique=True)
    assert (p.sent, p.pending) == (3, 0)
    assert drain(q) == ["a", "b"]


def test_a_unique_push_payload_through_the_producer_keeps_the_payload_held(
    client: redis.Redis, queue_name: str
) -> None:
    q = tracked(client, queue_name, payloads=True)
    q.push_payloads({"a": b"first"})
    with q.producer(max_batch=500, max_delay=60) as p:
        p.push_payload("a", b"second", unique=True)
        p.push_payload("b", b"only", unique=True)
    jobs = q.next(10)
    assert [(job.id, job.payload) for job in jobs] == [("a", b"first"), ("b", b"only")]


def test_the_async_producer_skips_held_ids_and_a_lost_reply_adds_nothing_twice(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario(client: aredis.Redis) -> None:
        q = AsyncRotator(client, queue_name)
        assert (await q.configure(track_ids=True)).track_ids
        await q.push("held")
        perform = q._sender.perform
        lost: list[str] = []

        async def spy(request: Request) -> Any:
            reply = await perform(request)
            if (name := push_name(request)) is not None and not lost:
                lost.append(name)
                raise redis.ConnectionError("reply lost")
            return reply

        q._sender.perform = spy  # type: ignore[method-assign]
        async with q.producer(max_batch=4, max_delay=60) as p:
            await p.push("held", "a", "b", "c", unique=True)  # full: run, reply lost, kept
            assert (p.sent, p.pending) == (0, 4)
            with pytest.raises(redis.ConnectionError):
                await p.push("refused", unique=True)
            await p.push("a", "d", unique=True)
        assert (p.sent, p.pending) == (6, 0)
        del q._sender.perform
        got = []
        while jobs := await q.next(100):
            got += [job.id for job in jobs]
            await q.ack(*jobs)
        assert got == ["held", "a", "b", "c", "d"]

    run_async(server, scenario)


# -- consumer ---------------------------------------------------------------------------------


def test_the_consumer_hands_out_every_job_once_and_acks_ride_on_the_next_claim(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push(*ids("job", 25))
    seen: list[str] = []
    with counting(q) as calls, q.consumer(prefetch=10, block=0.05, stop_when_empty=True) as c:
        for job in c:
            seen.append(job.id)
            c.ack(job)
            if len(seen) == 10:
                # All ten acked, none sent: they go with the claim of the eleventh.
                assert acked(q) == 0
            if len(seen) == 11:
                assert acked(q) == 10
    assert seen == ids("job", 25)
    # Three claims with jobs, then the empty one that ended it (a look, then one more call
    # after its wait): no ack call of its own.
    assert calls == ["next_packed"] * 5
    assert acked(q) == 25
    assert (q.stats().in_flight, q.stats().pending) == (0, 0)


def test_prefetched_jobs_keep_their_leases_past_the_lease_timeout(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=1.0)
    other = Rotator(client, queue_name, timeout=1.0)
    q.push(*ids("job", 5))
    with q.consumer(prefetch=5, block=0.05, stop_when_empty=True) as c:
        jobs = [next(c)]
        time.sleep(2.5)  # two and a half leases: the first handed out, four prefetched
        assert other.next(5) == []  # nothing ran out: no one else gets them
        jobs += list(c)
        assert [(job.id, job.deliveries) for job in jobs] == [(i, 1) for i in ids("job", 5)]
        c.ack(*jobs)
    assert acked(q) == 5
    assert (q.stats().reclaimed, q.stats().in_flight) == (0, 0)


def test_a_consumer_dropped_unclosed_stops_keeping_its_leases(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=1.0)
    q.push("a", "b")
    c = q.consumer(prefetch=2, block=0.05)
    next(c)
    keeper = c._keeper
    assert keeper is not None
    assert keeper.is_alive()
    del c
    gc.collect()
    wait_until(lambda: not keeper.is_alive(), timeout=10)
    wait_until(lambda: len(q.next(2, ack=[])) == 2, timeout=10)  # their leases ran out


def test_exit_sends_the_acks_and_gives_back_what_was_not_acked(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push(*ids("job", 10))
    with q.consumer(prefetch=10, block=0.05) as c:
        for n, job in enumerate(c):
            if n == 3:
                break  # handed out, never acked
            c.ack(job)
    assert (acked(q), q.stats().in_flight) == (3, 0)
    again = q.next(100)  # given back with no delay: claimable at once
    assert sorted(job.id for job in again) == ids("job", 10)[3:]
    assert {job.deliveries for job in again} == {2}


def test_an_error_in_the_loop_gives_back_the_job_and_is_not_hidden(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a", "b", "c")

    def loop() -> None:
        with q.consumer(prefetch=3, block=0.05) as c:
            for job in c:
                if job.id == "b":
                    raise KeyError(job.id)
                c.ack(job)

    with pytest.raises(KeyError):
        loop()
    assert acked(q) == 1
    assert sorted(job.id for job in q.next(10)) == ["b", "c"]


def test_a_nack_waits_for_the_next_claim_and_stop_ends_the_iteration(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push(*ids("job", 6))
    with counting(q) as calls, q.consumer(prefetch=6, block=0.05) as c:
        first = next(c)
        assert c.nack(first, delay=3600) == 1
        assert calls == ["next_packed"]  # buffered: nothing sent
        assert (q.stats().deferred, q.stats().in_flight) == (0, 6)
        second = next(c)
        c.ack(second)
        threading.Timer(0.05, c.stop).start()
        rest = list(c)  # the other jobs, unless stop lands first: iteration ends either way
        assert len(rest) <= 4
        for job in rest:
            c.ack(job)
    assert "nack" not in calls[1:2]  # the claim after it carried it, or the exit sent it
    assert acked(q) == 1 + len(rest)
    stats = q.stats()
    assert (stats.deferred + stats.pending, stats.in_flight) == (5 - len(rest), 0)
    back = q.next(10)  # what stop left prefetched went back; first waits its delay
    assert sorted(job.id for job in back) == sorted(set(ids("job", 6)[2:]) - {j.id for j in rest})


def test_a_nack_rides_on_the_next_claim_in_one_round_trip_and_comes_back_after_its_delay(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=1.0)
    other = Rotator(client, queue_name, timeout=1.0)
    q.push("a", "b")
    with round_trips(client) as trips, q.consumer(prefetch=2, block=0.05) as c:
        a = next(c)
        assert c.nack(a, delay=0.5) == 1
        assert c.nack(a) == 0  # taken once, with its first delay
        c.ack(a)  # nacked: not acked as well
        assert trips == [("next_packed",)]
        time.sleep(2.5)  # two and a half leases: a's kept until its nack is sent
        assert other.next(5) == []
        stats = q.stats()
        assert (stats.in_flight, stats.deferred, stats.reclaimed) == (2, 0, 0)
        q.push("c", "d")
        trips.clear()  # other's claim, and the push
        b = next(c)  # prefetched: no claim
        c.ack(b)
        assert trips == []
        third = next(c)  # the claim: a's nack and the claim (carrying b's ack), one trip
        assert trips == [("nack", "next_packed")]
        assert third.id == "c"
        stats = q.stats()
        assert (stats.deferred, stats.in_flight, acked(q)) == (1, 2, 1)
        c.ack(third, next(c))
        again = next(c)  # a, once its delay has passed
        assert (again.id, again.deliveries) == ("a", 2)
        c.ack(again)
    assert acked(q) == 4
    assert (q.stats().in_flight, q.stats().deferred, q.stats().pending) == (0, 0, 0)


def test_close_sends_the_buffered_nacks_with_their_delays_then_gives_back_the_rest(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a", "b", "c", "d")
    with round_trips(client) as trips, q.consumer(prefetch=4, block=0.05) as c:
        a, b, done = next(c), next(c), next(c)
        assert c.nack(a, delay=3600) + c.nack(b) == 2
        c.ack(done)
        assert q.stats().in_flight == 4
    # The ack, a's nack, b's, then the give-back of d (prefetched, never handed out).
    assert trips == [("next_packed",), ("ack",), ("nack",), ("nack",), ("nack",)]
    stats = q.stats()  # a nacked job counts as deferred until a claim reaches it, delay or not
    assert (stats.deferred + stats.pending, stats.in_flight, acked(q)) == (3, 0, 1)
    assert c.nack(a) == 0  # after close: at once (and refused, a was given back)
    assert trips[-1] == ("nack",)
    assert sorted((job.id, job.deliveries) for job in q.next(10)) == [("b", 2), ("d", 2)]


def test_several_threads_take_jobs_from_one_consumer(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.push(*ids("job", 600))
    seen: list[str] = []
    lock = threading.Lock()
    with q.consumer(prefetch=25, block=0.05, stop_when_empty=True) as c:

        def work() -> None:
            for job in c:
                with lock:
                    seen.append(job.id)
                c.ack(job)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(seen) == ids("job", 600)
    assert acked(q) == 600


def test_a_claim_that_fails_keeps_its_acks_and_nacks_for_the_next(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a", "b", "n")
    with q.consumer(prefetch=1, block=0.05, stop_when_empty=True) as c:
        c.ack(next(c))
        perform = q._sender.perform
        failures = [redis.ConnectionError("dropped")]

        def flaky(request: Request) -> Any:
            if failures:
                raise failures.pop()
            return perform(request)

        q._sender.perform = flaky  # type: ignore[method-assign]
        with pytest.raises(redis.ConnectionError):
            next(c)
        del q._sender.perform
        second = next(c)  # the retried claim carries the first ack
        assert acked(q) == 1
        assert c.nack(second, delay=3600) == 1
        failures.append(redis.ConnectionError("dropped"))
        q._sender.perform = flaky  # type: ignore[method-assign]
        with pytest.raises(redis.ConnectionError):
            next(c)
        del q._sender.perform
        assert (q.stats().deferred, q.stats().in_flight) == (0, 1)  # kept, and held
        c.ack(next(c))  # the retried claim carries the nack
        assert q.stats().deferred == 1
    assert acked(q) == 2
    assert q.stats().deferred == 1


def test_the_async_consumer_acks_on_claims_keeps_leases_and_gives_back(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario(client: aredis.Redis) -> None:
        q = AsyncRotator(client, queue_name, timeout=1.0)
        await q.push(*ids("job", 12))
        seen = []
        async with q.consumer(prefetch=6, block=0.05) as c:
            async for job in c:
                seen.append(job.id)
                if len(seen) == 1:
                    await asyncio.sleep(2.5)  # the five prefetched keep their leases
                if len(seen) == 8:
                    break  # handed out, not acked: given back
                await c.ack(job)
        assert seen == ids("job", 8)
        stats = await q.stats()
        assert (stats.done + (stats.completed or 0), stats.reclaimed, stats.in_flight) == (7, 0, 0)
        again = await q.next(10)
        assert [job.id for job in again] == ids("job", 12)[7:]
        async with q.consumer(prefetch=6, block=0.05, stop_when_empty=True) as c:
            assert await c.nack(*again) == 5  # not ours: given back at once all the same
            assert [job.id async for job in c] == ids("job", 12)[7:]

    run_async(server, scenario)


def test_the_async_consumer_sends_its_nacks_with_the_next_claim_or_at_close(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario(client: aredis.Redis) -> None:
        q = AsyncRotator(client, queue_name)
        await q.push("a", "b", "c", "d", "e")
        with round_trips(client) as trips:
            async with q.consumer(prefetch=2, block=0.05) as c:
                a = await anext(c)
                assert await c.nack(a, delay=0.5) == 1
                assert await c.nack(a) == 0
                stats = await q.stats()
                assert (stats.in_flight, stats.deferred) == (2, 0)  # not sent yet
                await c.ack(await anext(c))  # prefetched: no claim
                assert trips == [("next_packed",)]
                third = await anext(c)  # a's nack and the claim, one round trip
                assert trips == [("next_packed",), ("nack", "next_packed")]
                assert third.id == "c"
                assert (await q.stats()).deferred == 1
                await c.ack(third, await anext(c))
                out = {job.id: job for job in [await anext(c), await anext(c)]}
                assert sorted((job.id, job.deliveries) for job in out.values()) == [
                    ("a", 2),  # once its delay passed
                    ("e", 1),
                ]
                assert await c.nack(out["e"], delay=3600) == 1
                trips.clear()
            # Exit: the acks (none), e's nack with its delay, a given back (never acked).
            assert trips == [("nack",), ("nack",)]
        stats = await q.stats()
        assert (stats.deferred + stats.pending, stats.in_flight) == (2, 0)
        assert [(job.id, job.deliveries) for job in await q.next(10)] == [("a", 3)]

    run_async(server, scenario)


# -- the hooks --------------------------------------------------------------------------------


def test_the_hooks_defaults_are_the_modules() -> None:
    defaults = {
        "max_batch": b.DEFAULT_PRODUCER_BATCH,
        "max_delay": b.DEFAULT_PRODUCER_DELAY,
        "prefetch": b.DEFAULT_PREFETCH,
        "block": b.DEFAULT_CONSUMER_BLOCK,
        "stop_when_empty": False,
    }
    hooks: list[Callable[..., Any]] = [
        Rotator.producer,
        Rotator.consumer,
        AsyncRotator.producer,
        AsyncRotator.consumer,
        b.Producer.__init__,
        b.Consumer.__init__,
        b.AsyncProducer.__init__,
        b.AsyncConsumer.__init__,
    ]
    for hook in hooks:
        for name, parameter in inspect.signature(hook).parameters.items():
            if name in defaults:
                assert parameter.default == defaults[name], (hook, name)


def test_the_consumer_refuses_bad_sizes(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    for prefetch, block in ((0, 1.0), (1001, 1.0), (10, -1.0), (10, 0.0)):
        with pytest.raises(InvalidArgument):
            q.consumer(prefetch=prefetch, block=block)
    q.consumer(block=0, stop_when_empty=True).close()  # a drain of what is there: no wait


def test_an_ack_given_twice_is_sent_once_and_one_after_close_at_once(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a", "b")
    with counting(q) as calls, q.consumer(prefetch=2, block=0.05) as c:
        a, b = next(c), next(c)
        c.ack(a)
        c.ack(a)
    assert calls == ["next_packed", "ack", "nack"]  # a's ack once; b given back
    assert acked(q) == 1
    c.ack(b)  # after close: sent at once (and refused: b was given back)
    assert acked(q) == 1
    assert [job.id for job in q.next(2)] == ["b"]


def run_async(server: ServerProcess, scenario: Callable[[aredis.Redis], Any]) -> None:
    async def main() -> None:
        client = aredis.Redis.from_url(server.url)
        try:
            await scenario(client)
        finally:
            await client.aclose()

    asyncio.run(main())
