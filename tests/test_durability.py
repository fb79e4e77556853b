"""Waiting for persistence after writes, and warnings about settings that lose jobs.

On a plain client (sync and asyncio), with a server and its replica, both with AOF on
(Redis 7.0: WAIT; Valkey 8: WAITAOF; the local AOF also on Redis 6.2 and 8.2): a durable
call and its wait go in one pipeline, so in one round trip on one connection, and a push
whose client another thread (or task) uses at the same time still returns only once the
replica has it, or raises NotDurable at its timeout, never early. A wait sent as a command
of its own would go on whatever connection the pool hands out next, and confirm that
connection's writes, not the push's."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
import redis.asyncio as aredis

import rotator.durability
from rotator import (
    Durability,
    DurabilityUnavailable,
    InvalidArgument,
    NotDurable,
    Rotator,
    Stats,
)
from rotator.aio import AsyncRotator
from rotator.durability import wait_commands
from rotator.script import function_name
from tests.helpers import wait_until
from tests.servers import Kind, ServerProcess, replicated_pair
from tests.test_sharded_durability import Stall


# (and Redis 6.2 and 8.2, the oldest and the newest Redis: no WAITAOF before 7.2, and a
# WAITAOF that confirms a local fsync at the server's next once-a-second sync on 8.2)
@pytest.fixture(
    params=["redis", "valkey", "redis6", "redis8"], ids=["redis7", "valkey8", "redis6", "redis8"]
)
def aof_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    config = {"appendonly": "yes", "appendfsync": "everysec"}
    with ServerProcess(request.param, tmp_path, config) as server:
        yield server


def test_pushes_wait_for_the_local_aof(
    aof_server: ServerProcess, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the warning is said once a process: as if this were the first server without WAITAOF)
    monkeypatch.setattr(rotator.durability, "_warned_no_waitaof", False)
    # The default timeout: Redis 8.2 confirms a local fsync at its next once-a-second sync.
    q = Rotator(aof_server.client(), "durable", durability=Durability())
    with caplog.at_level(logging.WARNING, logger="rotator"):
        assert q.push("a", "b") == 2
        (job,) = q.next()
        assert q.ack(job) == 1
    if tuple(int(part) for part in aof_server.version.split(".")[:2]) < (7, 2):
        # No WAITAOF before Redis 7.2: said once (not per call), and the writes went through.
        assert sum("no WAITAOF" in r.message for r in caplog.records) == 1
    else:
        assert not caplog.records
    assert q.stats().length == 2


def test_an_unconfirmed_write_raises_not_durable_after_it_was_applied(
    server: ServerProcess, queue_name: str
) -> None:
    # No replica will ever answer: the push is applied, then reported as not durable.
    q = Rotator(
        server.client(),
        queue_name,
        durability=Durability(local_aof=False, replicas=1, timeout=0.1),
    )
    with pytest.raises(NotDurable, match="asked for 0 and 1"):
        q.push("x")
    assert q.stats().pending == 1


def test_a_claim_is_a_durable_call_and_so_are_the_acks_riding_on_it(
    server: ServerProcess, queue_name: str
) -> None:
    """A lease the replicas never had would be gone after a failover, and the ack of its
    job would complete nothing there: claims wait for their writes too. No replica will
    answer: the claim is applied (the job leased, the ack riding on it taken), then
    reported as not durable."""
    plain = Rotator(server.client(), queue_name)
    assert plain.push("a", "b") == 2
    (first,) = plain.next()
    q = Rotator(
        server.client(),
        queue_name,
        durability=Durability(local_aof=False, replicas=1, timeout=0.1),
    )
    with pytest.raises(NotDurable, match="asked for 0 and 1"):
        q.next(ack=[first])
    stats = plain.stats()
    assert (stats.completed, stats.in_flight, stats.pending) == (1, 1, 0)
    with pytest.raises(NotDurable):  # a claim that finds nothing writes too (its lap)
        q.next()


@pytest.mark.parametrize("kind", ["valkey", "redis8"], ids=["valkey8", "redis8"])
def test_asking_for_the_local_aof_of_a_server_without_aof_is_refused_before_any_write(
    kind: Kind, tmp_path: Path
) -> None:
    # (servers with WAITAOF, which refuses the local AOF's wait there; the AOF off, as a
    # server that relies on its replicas has it)
    with ServerProcess(kind, tmp_path) as server, server.client() as client:
        q = Rotator(client, "no-aof", durability=Durability())
        plain = Rotator(client, "no-aof")
        calls: dict[str, Callable[[], object]] = {"push": lambda: q.push("x"), "next": q.next}
        for name, call in calls.items():
            with pytest.raises(DurabilityUnavailable, match="appendonly off") as refused:
                call()
            assert not isinstance(refused.value, NotDurable), name  # (that one was written)
        with pytest.raises(DurabilityUnavailable):
            asyncio.run(durable_async_push(server, "no-aof"))
        assert client.keys("*no-aof*") == []  # nothing written, not even a new ring
        # Not remembered: the server's answer is asked for again, and appendonly turned on
        # makes the next durable call go through.
        client.config_set("appendonly", "yes")
        wait_until(lambda: client.info("persistence")["aof_rewrite_in_progress"] == 0)
        assert q.push("x") == 1
        assert plain.stats().pending == 1


async def durable_async_push(server: ServerProcess, name: str) -> int:
    client = aredis.Redis(host=server.host, port=server.port)
    try:
        return await AsyncRotator(client, name, durability=Durability()).push("y")
    finally:
        await client.aclose()


def test_the_waits_for_replicas_fsync_share_the_timeout_a_wait_first() -> None:
    with_replicas = wait_commands(Durability(replicas=2, timeout=2.0), waitaof=True)
    assert with_replicas == [("WAIT", 2, 500), ("WAITAOF", 1, 2, 1500)]
    assert sum(command[-1] for command in with_replicas) == 2000  # (within the socket's)
    assert wait_commands(Durability(timeout=2.0), waitaof=True) == [("WAITAOF", 1, 0, 2000)]
    acked = Durability(local_aof=False, replicas=1, timeout=0.3)
    assert wait_commands(acked, waitaof=True) == [("WAIT", 1, 300)]
    smallest = wait_commands(Durability(replicas=1, timeout=0.001), waitaof=True)
    assert [command[-1] for command in smallest] == [1, 1]  # (0 would wait for ever)


@pytest.mark.parametrize(
    "options",
    [{"replicas": -1}, {"local_aof": False, "replicas": 0}, {"timeout": 0}, {"replicas": True}],
    ids=repr,
)
def test_bad_durability_settings_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        Durability(**options)  # type: ignore[arg-type]


def test_settings_that_can_lose_jobs_are_reported(tmp_path: Path) -> None:
    config = {"maxmemory-policy": "allkeys-lru", "appendonly": "no"}
    with ServerProcess("valkey", tmp_path, config) as server:
        warnings = Rotator(server.client(), "w").server_warnings()
    assert any("maxmemory-policy is allkeys-lru" in w for w in warnings)
    assert any("appendonly is off" in w for w in warnings)


def test_a_safe_server_gives_no_warnings(aof_server: ServerProcess) -> None:
    assert Rotator(aof_server.client(), "w").server_warnings() == []


def test_a_durability_timeout_must_be_shorter_than_the_clients_socket_timeout(
    server: ServerProcess, queue_name: str
) -> None:
    """The wait goes in one pipeline with the write: a socket timeout first would make
    redis-py send the pipeline again, write and all."""
    with server.client(socket_timeout=1) as client:
        with pytest.raises(InvalidArgument, match="shorter than"):
            Rotator(client, queue_name, durability=Durability(timeout=1))
        with pytest.raises(InvalidArgument, match="Durability"):
            Rotator(client, queue_name, durability=1)  # type: ignore[arg-type]
        Rotator(client, queue_name, durability=Durability(timeout=0.5))


# -- one pipeline, one connection: a server and its replica ---------------------------------

# WAITAOF 1 1 after a WAIT 1 (Redis 7.0: WAIT 1); a WAITAOF alone would wait about 1 s for a
# replica on Valkey 8.1 (the replica reports its fsynced offset once a second: see
# rotator.durability.wait_commands). ACKED waits for the replica's acknowledgement (WAIT) on
# any server.
ON_REPLICA = Durability(replicas=1, timeout=3)
ACKED = Durability(local_aof=False, replicas=1, timeout=3)
IMPATIENT = Durability(local_aof=False, replicas=1, timeout=0.3)
# Each write fsynced at once (WAITAOF returns when it is).
AOF_ALWAYS = {"appendonly": "yes", "appendfsync": "always"}
COMMAND = re.compile(rb"\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n")  # a RESP array's first word


@pytest.fixture(scope="module", params=["redis", "valkey"], ids=["redis7", "valkey8"])
def replicated_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """A server and its replica, the link up (about 1 s), for this module's tests."""
    workdir = tmp_path_factory.mktemp(f"replicated-{request.param}")
    with replicated_pair(request.param, workdir, AOF_ALWAYS) as pair:
        yield pair


@pytest.fixture
def replicated(
    replicated_servers: tuple[ServerProcess, ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> tuple[ServerProcess, ServerProcess]:
    """The pair. Redis 7.0 has no WAITAOF: the once-per-process warning is said here as if
    already said, and unsaid after (test_pushes_wait_for_the_local_aof checks it)."""
    monkeypatch.setattr("rotator.durability._warned_no_waitaof", True)
    return replicated_servers


def has_waitaof(server: ServerProcess) -> bool:
    return server.kind == "valkey" or server.version >= "7.2"


def on_replica(replica: ServerProcess, name: str) -> Stats:
    """Queue ``name``'s stats as the replica has them now."""
    with replica.client(socket_timeout=2) as client:
        return Rotator(client, name, functions=False).stats()


def command_names(packed: Any) -> list[str]:
    """The names of the commands in what a connection sent at once (RESP arrays)."""
    data = packed.encode() if isinstance(packed, str) else packed
    if not isinstance(data, bytes):
        data = b"".join(bytes(part) for part in data)
    return [name.decode().upper() for name in COMMAND.findall(data)]


class Recording(redis.Connection):
    """A connection that notes each round trip it makes: (its id, the commands sent)."""

    trips: ClassVar[list[tuple[int, list[str]]]] = []

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        Recording.trips.append((id(self), command_names(command)))
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


class AsyncRecording(aredis.Connection):
    """:class:`Recording` on redis.asyncio."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        Recording.trips.append((id(self), command_names(command)))
        await super().send_packed_command(command, check_health)


def durable_trips(server: ServerProcess) -> tuple[set[str], list[str]]:
    """The module commands a durable call may go as, and the waits that go with it (for
    ON_REPLICA): where the server has WAITAOF, a WAIT for the replica first (see
    rotator.durability.wait_commands)."""
    return {"EVALSHA", "FCALL"}, ["WAIT", "WAITAOF"] if has_waitaof(server) else ["WAIT"]


def test_a_durable_call_and_its_wait_go_in_one_round_trip_on_one_connection(
    replicated: tuple[ServerProcess, ServerProcess], queue_name: str
) -> None:
    """Each durable push and ack is one round trip: the module call and its WAIT and WAITAOF
    (WAIT alone on Redis 7.0) sent at once on one connection. Whether the server has
    WAITAOF is asked once per client (WAITAOF 1 0 1), not per queue or call. Without
    ``local_aof`` the wait is WAIT on any server (replicas acknowledge; WAITAOF would wait
    for their fsync), and nothing is asked."""
    server, replica = replicated
    pool = redis.ConnectionPool(host=server.host, port=server.port, connection_class=Recording)
    client = redis.Redis(connection_pool=pool)
    modules, wait = durable_trips(server)
    Recording.trips.clear()
    first = Rotator(client, queue_name, durability=ON_REPLICA)
    second = Rotator(client, f"{queue_name}-2", durability=ON_REPLICA)
    assert first.push("a") == 1
    assert second.push("a") == 1
    assert [names for _, names in Recording.trips].count(["WAITAOF"]) == 1  # the probe
    Recording.trips.clear()
    assert first.push("b") == 1
    ((_, names),) = Recording.trips
    assert names[0] in modules
    assert names[1:] == wait
    acking = Rotator(client, queue_name, durability=ACKED)
    (job,) = acking.next()  # not a durable call
    Recording.trips.clear()
    assert acking.ack(job) == 1
    ((_, names),) = Recording.trips
    assert names[0] in modules
    assert names[1:] == ["WAIT"]
    assert on_replica(replica, queue_name).pending == 1

    acked = redis.Redis(
        connection_pool=redis.ConnectionPool(
            host=server.host, port=server.port, connection_class=Recording
        )
    )
    Recording.trips.clear()
    assert Rotator(acked, queue_name, durability=ACKED).push("c") == 1
    assert [names[1:] for _, names in Recording.trips if names[0] in modules] == [["WAIT"]]
    assert ["WAITAOF"] not in [names for _, names in Recording.trips]
    assert on_replica(replica, queue_name).pending == 2
    client.close()
    acked.close()


def test_an_async_durable_call_and_its_wait_go_in_one_round_trip_on_one_connection(
    replicated: tuple[ServerProcess, ServerProcess], queue_name: str
) -> None:
    """As the sync test, on redis.asyncio."""
    server, replica = replicated
    modules, wait = durable_trips(server)

    async def main() -> None:
        pool = aredis.ConnectionPool(
            host=server.host, port=server.port, connection_class=AsyncRecording
        )
        client = aredis.Redis(connection_pool=pool)
        queue = AsyncRotator(client, queue_name, durability=ON_REPLICA)
        assert await queue.push("a") == 1
        Recording.trips.clear()
        assert await queue.push("b") == 1
        ((_, names),) = Recording.trips
        assert names[0] in modules
        assert names[1:] == wait
        await client.aclose()

    Recording.trips.clear()
    asyncio.run(main())
    assert on_replica(replica, queue_name).pending == 2


def test_a_durable_push_after_a_flush_sends_the_pair_again_with_the_module_source(
    replicated: tuple[ServerProcess, ServerProcess], queue_name: str
) -> None:
    """After SCRIPT FLUSH the pipelined EVALSHA meets NOSCRIPT (nothing ran): the pair goes
    again as EVAL of the source with its wait, once. With ``functions=True`` after FUNCTION
    FLUSH: "function not found", the library is loaded, the pair goes as EVAL, and the
    next push is an FCALL again. Every push is on the replica."""
    server, replica = replicated
    wait = "WAIT"
    pool = redis.ConnectionPool(host=server.host, port=server.port, connection_class=Recording)
    client = redis.Redis(connection_pool=pool)
    scripts = Rotator(client, queue_name, functions=False, durability=ACKED)
    fcalls = Rotator(client, queue_name, functions=True, durability=ACKED)
    assert scripts.push("warm") == 1
    client.script_flush()
    Recording.trips.clear()
    assert scripts.push("a") == 1
    assert [names for _, names in Recording.trips] == [["EVALSHA", wait], ["EVAL", wait]]
    client.function_flush()
    Recording.trips.clear()
    assert fcalls.push("b") == 1
    assert fcalls.push("c") == 1
    assert [names for _, names in Recording.trips] == [
        ["FCALL", wait],
        ["FUNCTION"],
        ["EVAL", wait],
        ["FCALL", wait],
    ]
    assert len(client.function_list(library=function_name())) == 1
    assert on_replica(replica, queue_name).pending == 4
    client.close()


class HandOverPool(redis.ConnectionPool):
    """A pool that makes the worst moment for a shared client certain: each time the
    ``pusher`` thread gives a connection back while another thread waits for one
    (:meth:`wait_for_return`), the pusher waits (up to 1 s) until that thread took one,
    which is the one given back (a pool hands out the last one returned)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pusher: threading.Thread | None = None
        self.state = threading.Condition()
        self.other_waiting = False
        self.returned = 0  # connections the pusher gave back while the other waited
        self.taken = 0  # of those, the ones the other thread took at once

    def release(self, connection: Any) -> None:
        super().release(connection)
        if threading.current_thread() is self.pusher:
            with self.state:
                if not self.other_waiting:
                    return
                self.returned += 1
                self.state.notify_all()
                self.state.wait_for(lambda: self.taken >= self.returned, timeout=1.0)

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        connection = super().get_connection(*args, **kwargs)
        if threading.current_thread() is not self.pusher:
            with self.state:
                if self.taken < self.returned:
                    self.taken = self.returned
                    self.state.notify_all()
        return connection

    def wait_for_return(self, timeout: float) -> bool:
        """True once the pusher gave a connection back (take one at once); False after
        ``timeout`` (call again: still waiting)."""
        with self.state:
            self.other_waiting = True
            found = self.state.wait_for(lambda: self.taken < self.returned, timeout)
            if found:
                self.other_waiting = False
            return found


def test_a_durable_push_waits_for_the_replica_while_another_thread_uses_its_client(
    replicated: tuple[ServerProcess, ServerProcess], queue_name: str
) -> None:
    """The replica sleeps. Another thread shares the pushing thread's client and takes each
    connection the pusher gives back at once (holding it in a 0.3 s BLPOP, then writing a
    counter): a wait sent after the push, on its own, would get another connection of the
    pool, whose writes the replica acknowledged before it fell asleep, and "confirm" them at
    once (on Valkey 8.1 a fresh connection's WAIT returns at once too). The durable push
    returns only once the replica has the job; with a 0.3 s timeout and the replica asleep
    for longer, it raises NotDurable at that timeout, and the job is in."""
    server, replica = replicated
    pool = HandOverPool(host=server.host, port=server.port)
    client = redis.Redis(connection_pool=pool)
    queue = Rotator(client, queue_name, durability=ACKED)
    impatient = Rotator(client, queue_name, durability=IMPATIENT)
    assert queue.push("warm") == 1
    # Two connections in the pool, each with a write the replica acknowledged.
    held = [pool.get_connection() for _ in range(2)]
    for connection in held:
        connection.send_command("INCR", f"{queue_name}-other-writes")
        connection.read_response()
    held[-1].send_command("WAIT", 1, 2000)
    assert held[-1].read_response() == 1
    for connection in held:
        pool.release(connection)
    stop = threading.Event()
    other_key = f"{queue_name}-other"

    def other() -> None:
        while not stop.is_set():
            if pool.wait_for_return(0.05):
                client.blpop([other_key], timeout=0.3)
                client.incr(f"{other_key}-writes")

    thread = threading.Thread(target=other)
    thread.start()
    pool.pusher = threading.current_thread()
    try:
        with Stall(replica, 0.6):
            began = time.monotonic()
            assert queue.push("a") == 1
            waited = time.monotonic() - began
            seen = on_replica(replica, queue_name)
        with Stall(replica, 1.0):
            began = time.monotonic()
            with pytest.raises(NotDurable, match="0 replicas"):
                impatient.push("b")
            refused_in = time.monotonic() - began
    finally:
        pool.pusher = None
        stop.set()
        thread.join()
    assert pool.taken >= 1  # the other thread did take a connection given back
    assert waited > 0.3  # the replica woke and acked this write
    assert seen.pending == 2
    assert 0.25 < refused_in < 0.9
    assert queue.stats().pending == 3  # the unconfirmed push was applied
    client.close()


# Set in the pushing task (and so in the tasks it starts: redis-py releases a pipeline's
# connection in a task of its own).
PUSHING: contextvars.ContextVar[bool] = contextvars.ContextVar("pushing", default=False)


class AsyncHandOverPool(aredis.ConnectionPool):
    """:class:`HandOverPool` for asyncio tasks, the pusher the task that set PUSHING."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.other_waiting = False
        self.returned = 0
        self.taken = 0

    async def release(self, connection: Any) -> None:
        await super().release(connection)
        if PUSHING.get() and self.other_waiting:
            self.returned += 1
            give_up = time.monotonic() + 1.0
            while self.taken < self.returned and time.monotonic() < give_up:
                await asyncio.sleep(0.001)

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        connection = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        if not PUSHING.get():
            self.taken = self.returned
        return connection


def test_an_async_durable_push_waits_for_the_replica_while_another_task_uses_its_client(
    replicated: tuple[ServerProcess, ServerProcess], queue_name: str
) -> None:
    """As the thread test, with two asyncio tasks sharing one redis.asyncio client."""
    server, replica = replicated
    other_key = f"{queue_name}-other"
    timings: dict[str, float] = {}

    async def main() -> None:
        pool = AsyncHandOverPool(host=server.host, port=server.port)
        client = aredis.Redis(connection_pool=pool)
        queue = AsyncRotator(client, queue_name, durability=ACKED)
        impatient = AsyncRotator(client, queue_name, durability=IMPATIENT)
        assert await queue.push("warm") == 1
        # Two connections in the pool, each with a write the replica acknowledged.
        held = [await pool.get_connection() for _ in range(2)]
        for connection in held:
            await connection.send_command("INCR", f"{other_key}-writes")
            await connection.read_response()
        await held[-1].send_command("WAIT", 1, 2000)
        assert await held[-1].read_response() == 1
        for connection in held:
            await pool.release(connection)
        stop = asyncio.Event()

        async def other() -> None:
            while not stop.is_set():
                if pool.taken < pool.returned:
                    pool.other_waiting = False
                    await client.blpop([other_key], timeout=0.3)
                    await client.incr(f"{other_key}-writes")
                else:
                    pool.other_waiting = True
                    await asyncio.sleep(0.001)

        task = asyncio.create_task(other())
        pushing = PUSHING.set(True)
        try:
            with Stall(replica, 0.6):
                began = time.monotonic()
                assert await queue.push("a") == 1
                timings["waited"] = time.monotonic() - began
                assert on_replica(replica, queue_name).pending == 2
            with Stall(replica, 1.0):
                began = time.monotonic()
                with pytest.raises(NotDurable, match="0 replicas"):
                    await impatient.push("b")
                timings["refused_in"] = time.monotonic() - began
        finally:
            PUSHING.reset(pushing)
            stop.set()
            await task
        assert pool.taken >= 1
        assert (await queue.stats()).pending == 3
        await client.aclose()

    asyncio.run(main())
    assert timings["waited"] > 0.3
    assert 0.25 < timings["refused_in"] < 0.9
