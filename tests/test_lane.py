"""The fast lane (rotator.lane): module calls sent on a pooled connection, packed once per key
list, and otherwise exactly as redis-py's execute_command sends them: the same bytes, the same
retries, the same errors. Clients it cannot serve keep redis-py's path."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import rotator.lane
from rotator import Rotator
from rotator.lane import Lane
from rotator.script import AutoCall, FunctionCall, ModuleScript, function_name
from tests.helpers import drain, later
from tests.servers import ServerProcess


def fcall_count(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


class Spied(redis.Redis):
    """A client whose execute_command is its own (as a tracer's is): it gets no lane."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[Any] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(args[0])
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def lane_of(q: Rotator) -> Lane | None:
    caller = q._sender.script
    function = caller.function if isinstance(caller, AutoCall) else caller
    assert isinstance(function, FunctionCall)
    lane: Lane | None = function.lane
    return lane


def test_a_plain_client_sends_module_calls_by_the_lane(
    client: redis.Redis, queue_name: str
) -> None:
    sent: list[Any] = []
    real: Any = client.execute_command

    def spy(*args: Any, **options: Any) -> Any:
        sent.append(args[0])
        return real(*args, **options)

    client.execute_command = spy  # type: ignore[method-assign]
    q = Rotator(client, queue_name, functions=True)
    assert lane_of(q) is not None
    q.stats()  # (the library is loaded)
    before = fcall_count(client)
    q.push("a", "b")
    jobs = q.next(2)
    assert [j.id for j in jobs] == ["a", "b"]
    assert q.ack(*jobs) == 2
    assert fcall_count(client) - before == 3
    assert "FCALL" not in sent  # (commandstats itself went the usual way)


def test_the_lane_packs_what_redis_py_packs(client: redis.Redis) -> None:
    lane = Lane(client, "FCALL", "lib")
    conn: Any = client.connection_pool.get_connection()
    try:
        cases: list[tuple[tuple[Any, ...], list[Any]]] = [
            (("{q}:ring", "{q}:done"), ["next", 1, "600000", b"\xff\x00*", "", "ü€"]),
            (("{q}:ring",), []),
            ((), ["stats"]),
            (("k" * 5000,), [b"x" * 100_000, 2**62, -1]),
        ]
        for keys, args in cases:
            expected = b"".join(conn.pack_command("FCALL", "lib", len(keys), *keys, *args))
            assert lane.pack(keys, args) == expected
            assert lane.pack(keys, args) == expected  # (its head now packed once)
    finally:
        client.connection_pool.release(conn)


def test_an_argument_the_packer_refuses_gets_redis_pys_error(client: redis.Redis) -> None:
    lane = Lane(client, "FCALL", "lib")
    with pytest.raises(redis.DataError):
        lane.call(("{q}:ring",), [object()])


def test_an_argument_the_packer_refuses_gets_redis_pys_error_asyncio_too(
    server: ServerProcess,
) -> None:
    import redis.asyncio as aredis  # noqa: PLC0415

    from rotator.lane import AsyncLane  # noqa: PLC0415

    async def scenario() -> None:
        client = aredis.Redis(port=server.port)
        try:
            with pytest.raises(redis.DataError):
                await AsyncLane(client, "FCALL", "lib").call(("{q}:ring",), [object()])
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_clients_it_cannot_serve_as_redis_py_would_keep_redis_pys_path(
    server: ServerProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    single = redis.Redis(port=server.port, single_connection_client=True)
    spied = Spied(port=server.port)
    try:
        assert Lane.serving(single, "FCALL", "x") is None
        assert Lane.serving(spied, "FCALL", "x") is None
        q = Rotator(spied, queue_name, functions=True)
        q.push("a")
        (job,) = q.next()
        assert q.ack(job) == 1
        assert spied.sent.count("FCALL") == 3
        # redis-py's observability turned on: its recorder must see the calls too.
        plain = redis.Redis(port=server.port)
        q = Rotator(plain, queue_name, functions=True)
        lane = lane_of(q)
        assert lane is not None
        assert lane.ready()
        monkeypatch.setattr(rotator.lane, "_observed", lambda: True)
        assert not lane.ready()
        q.push("b")
        (job,) = q.next()
        assert job.id == "b"
        assert q.ack(job) == 1
        plain.close()
    finally:
        single.close()
        spied.close()


def test_a_wrapped_execute_command_keeps_redis_pys_path(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = redis.Redis.execute_command

    def traced(self: redis.Redis, *args: Any, **options: Any) -> Any:
        return original(self, *args, **options)  # type: ignore[no-untyped-call]

    traced.__wrapped__ = original  # type: ignore[attr-defined]
    traced.__module__ = "redis.client"
    monkeypatch.setattr(redis.Redis, "execute_command", traced)
    with redis.Redis(port=server.port) as client:
        assert Lane.serving(client, "FCALL", "x") is None


def lost_reply(server: ServerProcess, retries: int) -> tuple[type[BaseException] | None, int]:
    """One FCALL whose reply would come after the client's socket timeout (the server
    paused for writes): what was raised, and how many FCALLs the server ran."""
    admin: Any = server.client()
    client = redis.Redis(port=server.port, socket_timeout=0.2, retry=Retry(NoBackoff(), retries))
    q = Rotator(client, f"lost-{retries}-{id(client)}", functions=True)
    q.push("warm")  # (the library is loaded)
    before = fcall_count(admin)
    admin.execute_command("CLIENT", "PAUSE", 300, "WRITE")
    raised: type[BaseException] | None = None
    try:
        q.push("x")
    except Exception as error:
        raised = type(error)
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    ran = fcall_count(admin) - before
    q.delete()
    client.close()
    admin.close()
    return raised, ran


def test_a_lost_reply_is_retried_as_the_connections_policy_says(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane and redis-py's own path, side by side, do the same: retries off, the call
    raises (and the server, finding the connection closed, drops it); retries on, it is sent
    again on a new connection and succeeds (a push whose first send did run lands twice, as
    it does without the lane: the at-least-once of a lost reply)."""
    by_lane = [lost_reply(server, retries) for retries in (0, 2)]
    monkeypatch.setattr(Lane, "serving", classmethod(lambda cls, *args: None))
    by_redis_py = [lost_reply(server, retries) for retries in (0, 2)]
    assert by_lane == by_redis_py
    (raised, sent), (raised_again, sent_again) = by_lane
    assert raised is not None
    assert issubclass(raised, redis.TimeoutError)
    assert sent <= 1
    assert raised_again is None
    assert sent_again >= 1


def test_many_threads_share_one_rotator_through_the_pool(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, functions=True)
    q.push_many([f"j{i}" for i in range(400)])
    seen: list[str] = []
    lock = threading.Lock()

    def consume() -> None:
        while jobs := q.next(7):
            q.ack(*jobs)
            with lock:
                seen.extend(j.id for j in jobs)

    threads = [threading.Thread(target=consume) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seen) == sorted(f"j{i}" for i in range(400))
    assert drain(q) == []


def test_the_lane_reloads_a_flushed_library(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, functions=True)
    assert lane_of(q) is not None
    q.push("x")
    client.function_flush()
    (job,) = q.next()
    assert function_name().encode() in str(client.function_list()).encode()
    client.function_flush()
    assert q.ack(job) == 1


def test_the_heads_kept_are_bounded(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rotator.lane, "MAX_HEADS", 4)
    lane = Lane(client, "FCALL", "lib")
    for i in range(10):
        lane.pack((f"k{i}",), ["a"])
    assert 1 <= len(lane._heads) <= 4


def test_evalsha_goes_by_the_lane_and_reloads_a_flushed_script(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, functions=False)
    script = q._sender.script
    assert isinstance(script, ModuleScript)
    assert script.lane is not None
    q.push("a", "b")
    client.script_flush()
    jobs = q.next(2)
    assert [j.id for j in jobs] == ["a", "b"]
    before = int(client.info("commandstats")["cmdstat_evalsha"]["calls"])
    assert q.ack(*jobs) == 2
    assert int(client.info("commandstats")["cmdstat_evalsha"]["calls"]) == before + 1
    assert drain(q) == []


def test_an_async_rotator_sends_module_calls_by_its_lane(
    server: ServerProcess, queue_name: str
) -> None:
    import redis.asyncio as aredis  # noqa: PLC0415

    from rotator.aio import AsyncRotator  # noqa: PLC0415
    from rotator.lane import AsyncLane  # noqa: PLC0415

    async def scenario() -> None:
        client = aredis.Redis(port=server.port)
        single = aredis.Redis(port=server.port, single_connection_client=True)
        sent: list[Any] = []
        real: Any = client.execute_command

        async def spy(*args: Any, **options: Any) -> Any:
            sent.append(args[0])
            return await real(*args, **options)

        client.execute_command = spy  # type: ignore[method-assign]
        try:
            assert AsyncLane.serving(single, "FCALL", "x") is None
            q = AsyncRotator(client, queue_name, functions=True)
            await q.push("a", "b")
            jobs = await q.next(2)
            assert [j.id for j in jobs] == ["a", "b"]
            assert await q.ack(*jobs) == 2
            assert "FCALL" not in sent
            await client.function_flush()
            await q.push("c")
            (job,) = await q.next()
            assert job.id == "c"
            assert await q.ack(job) == 1
        finally:
            await client.aclose()
            await single.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("options", [{"decode_responses": True}, {"protocol": 3}])
def test_the_lane_serves_decoding_and_resp3_clients_alike(
    server: ServerProcess, queue_name: str, options: dict[str, Any]
) -> None:
    with redis.Redis(port=server.port, **options) as client:
        q = Rotator(client, queue_name, functions=True, payloads=True)
        assert lane_of(q) is not None
        q.push_payloads({"a": b"\xff\x00 body", "b": b"plain"})
        jobs = q.next(2)
        assert [(j.id, j.payload) for j in jobs] == [("a", b"\xff\x00 body"), ("b", b"plain")]
        assert q.ack(*jobs) == 2
        stats = q.stats()
        assert (stats.pending, stats.in_flight, stats.done) == (0, 0, 2)
        assert drain(q) == []


def woken_claim(q: Rotator, pusher: Rotator, job_id: str) -> list[Any]:
    """A claim blocked on an empty queue until ``pusher`` pushes ``job_id``: its jobs."""
    with later(0.2, lambda: pusher.push(job_id)):
        return q.next(1, block=5)


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
def test_a_blocked_claim_sends_its_blpop_and_call_together_by_the_lane(
    client: redis.Redis, queue_name: str, functions: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BLPOP and the module call in one write on one pooled connection (no redis-py pipeline);
    the BLPOP's error reply is raised with the connection left in step, and a library or
    script flushed while the claim is blocked is loaded and the call made again."""

    def no_pipeline(*_: Any, **__: Any) -> Any:
        raise AssertionError("a redis-py pipeline was used")

    monkeypatch.setattr(redis.client.Pipeline, "execute", no_pipeline)
    q = Rotator(client, queue_name, functions=functions)
    pusher = Rotator(redis.Redis(port=client.connection_pool.connection_kwargs["port"]), queue_name)
    (first,) = woken_claim(q, pusher, "a")
    assert first.id == "a"
    assert q.ack(first) == 1
    # Flushed while blocked: the pipelined call says the module is missing; it goes again.
    pusher.client.function_flush() if functions else pusher.client.script_flush()
    (job,) = woken_claim(q, pusher, "b")
    assert job.id == "b"
    assert q.ack(job) == 1
    # An error reply to the first command comes back as its exception, the call's reply
    # after it, and the connection stays in step for the next call.
    caller = q._sender.script
    lane = (caller.current() if isinstance(caller, AutoCall) else caller).lane
    client.set("not-a-list", "x")
    q.push("c")
    keys, args = q.keys.all, [b"next_packed", 1, 1000, 100, 0]
    woken, reply = lane.call_after(("BLPOP", "not-a-list", "0.1"), keys, args)
    assert isinstance(woken, redis.ResponseError)
    assert "WRONGTYPE" in str(woken)
    assert reply[3].endswith(b"*c")  # the packed batch: the claim ran after it
    assert q.stats().in_flight == 1
    pusher.client.close()


def test_an_async_blocked_claim_goes_by_its_lane(
    server: ServerProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis.asyncio as aredis  # noqa: PLC0415
    import redis.asyncio.client  # noqa: PLC0415

    from rotator.aio import AsyncRotator  # noqa: PLC0415

    async def no_pipeline(*_: Any, **__: Any) -> Any:
        raise AssertionError("a redis-py pipeline was used")

    monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", no_pipeline)

    async def scenario() -> None:
        client = aredis.Redis(port=server.port)
        try:
            q = AsyncRotator(client, queue_name, functions=True)
            await q.stats()  # (the library is loaded)
            waiting = asyncio.ensure_future(q.next(1, block=5))
            await asyncio.sleep(0.2)
            await AsyncRotator(client, queue_name).push("a")
            (job,) = await waiting
            assert job.id == "a"
            assert await q.ack(job) == 1
            await client.set("not-a-list", "x")
            await q.push("b")
            lane = q._sender.script.lane
            keys, args = q.keys.all, [b"next_packed", 1, 1000, 100, 0]
            woken, reply = await lane.call_after(("BLPOP", "not-a-list", "0.1"), keys, args)
            assert isinstance(woken, redis.ResponseError)
            assert reply[3].endswith(b"*b")
            assert (await q.stats()).in_flight == 1
        finally:
            await client.aclose()

    asyncio.run(scenario())
