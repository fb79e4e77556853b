"""Bad input and bad servers: the rows of RELIABILITY-PLAN §3 that test_bad_input.py leaves out.

Every case ends the same way: a typed error (or, for input that is valid, an exact round trip)
and every key of the queue byte for byte as it was (`tests.helpers.snapshot`). Servers with a
special configuration (a low busy-reply-threshold, a replica, AOF for a stop and start) are
started by the test itself, of both kinds.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rotator import InvalidJobId, InvalidToken, Rotator, ServerBusy
from rotator.protocol import text
from tests.helpers import drain, snapshot, without_age
from tests.servers import Kind, ServerProcess, free_ports, replicated_pair

T = TypeVar("T")
KINDS = pytest.mark.parametrize("kind", ["redis", "valkey"], ids=["redis7", "valkey8"])
MEGABYTE = 2**20
ROTATOR = str(Path(sys.executable).parent / "rotator")  # the console script
PROMPT = 10.0  # seconds: a refused connection must fail well within this (redis-py retries)


@pytest.fixture
def q(client: redis.Redis, queue_name: str) -> Rotator:
    queue = Rotator(client, queue_name, timeout=30.0)
    queue.push("existing-1", "existing-2")
    queue.next()  # one leased, one pending: a queue with some state to protect
    return queue


def unreachable_client() -> redis.Redis:
    """A client of a loopback port nobody listens on: any I/O fails at once."""
    (port,) = free_ports(1)
    return redis.Redis(
        host="127.0.0.1", port=port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
    )


def module_calls(client: redis.Redis) -> int:
    """Calls of the module so far, by EVALSHA or by FCALL."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{via}", {}).get("calls", 0)) for via in ("evalsha", "fcall"))


# -- row 5: non-UTF-8 bytes --------------------------------------------------------------------

NON_UTF8 = [b"\xff\xfe", b"caf\xe9", b"\xed\xa0\x80", b"ok-\x80"]  # \xed\xa0\x80: a surrogate


def test_non_utf8_ids_in_the_ring_are_delivered_exactly_and_acked(
    client: redis.Redis, q: Rotator
) -> None:
    client.lpush(q.keys.ring, *NON_UTF8)  # as an admin or another client library would
    jobs = q.next(10)
    assert [job.id for job in jobs] == ["existing-2", *(text(raw) for raw in NON_UTF8)]
    assert [job.id.encode("utf-8", "surrogateescape") for job in jobs[1:]] == NON_UTF8
    assert q.ack(*jobs) == len(jobs)
    assert q.sweep() == len(jobs)
    assert q.stats().in_flight == 1  # existing-1, still leased


def test_a_worker_runs_jobs_with_non_utf8_ids_without_a_decode_error(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=30.0)
    queue.push("plain")
    client.lpush(queue.keys.ring, *NON_UTF8)
    seen: list[bytes] = []
    summary = queue.work(
        lambda job: seen.append(job.id.encode("utf-8", "surrogateescape")),
        stop_when_empty=True,
        poll=0.1,
        install_signal_handlers=False,
    )
    assert summary.processed == 1 + len(NON_UTF8)
    assert seen == [b"plain", *NON_UTF8]
    assert client.lrange(queue.keys.ring, 0, -1) == [b"*lap"]


def test_the_cli_prints_a_non_utf8_id_in_a_real_process(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    """`rotator next` is a worker too: its output keeps the id's bytes, it does not crash."""
    queue = Rotator(client, queue_name)
    client.lpush(queue.keys.ring, b"*lap")
    client.lpush(queue.keys.ring, b"caf\xe9")
    done = subprocess.run(
        [ROTATOR, "--url", server.url, "next", queue_name],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(b"caf\xe9\t")


# -- rows 6 to 8: size, NUL, CR/LF, unencodable text -------------------------------------------


@pytest.mark.parametrize(
    "ids",
    [["x" * MEGABYTE], ["good", "x" * MEGABYTE], ["é" * (MEGABYTE // 2)]],
    ids=["alone", "in-a-batch", "two-byte-chars"],
)
def test_a_1mb_id_is_refused_before_any_io(ids: list[str]) -> None:
    queue = Rotator(unreachable_client(), "never-reached")
    with pytest.raises(InvalidJobId):
        queue.push(*ids)  # a ConnectionError here would mean something was sent
    with pytest.raises(InvalidJobId):
        queue.requeue_dead(*ids)


def test_a_token_with_a_1mb_id_is_refused_before_any_io() -> None:
    """The client's token check is the module's: at most 1024 bytes of id."""
    queue = Rotator(unreachable_client(), "never-reached")
    token = "x" * MEGABYTE + "*1732233600000.1.1"
    for call in (lambda: queue.ack(token), lambda: queue.nack(token), lambda: queue.extend(token)):
        with pytest.raises(InvalidToken):
            call()


def test_a_1mb_id_sent_straight_to_the_module_is_refused_and_changes_nothing(
    client: redis.Redis, q: Rotator
) -> None:
    before = snapshot(client, q)
    with pytest.raises(InvalidJobId):
        q._call(b"push", b"x" * MEGABYTE)  # what a client that skips the checks would send
    assert snapshot(client, q) == before


ODD_IDS = ["a\x00b", "\x00", "a\r\nb", "\r\n", "line1\nline2", "\t", "a\rb", "\x1b[31mred"]


def test_nul_and_crlf_ids_are_valid_text_and_round_trip_exactly(
    client: redis.Redis, queue_name: str
) -> None:
    """By the spec ("1..1024 bytes without *") these are ids: each comes back byte for byte,
    from `next`, from the dead letters and through `requeue_dead`'s id filter."""
    queue = Rotator(client, queue_name, timeout=30.0, max_deliveries=1)
    assert queue.push(*ODD_IDS) == len(ODD_IDS)
    jobs = queue.next(len(ODD_IDS))
    assert [job.id for job in jobs] == ODD_IDS
    assert queue.extend_many(jobs) == [True] * len(ODD_IDS)
    assert queue.ack(*jobs[:2]) == 2
    assert queue.nack(*jobs[2:]) == len(ODD_IDS) - 2
    assert queue.next(10) == []  # one delivery each was allowed: they are dead letters now
    assert [letter.id for letter in queue.dead()] == ODD_IDS[2:]
    assert queue.requeue_dead(*ODD_IDS[2:]) == len(ODD_IDS) - 2
    assert drain(queue) == ODD_IDS[2:]


@pytest.mark.parametrize("bad", ["a*\r\nINJECTED", "*\n", "a*\x00\x1b[2J"], ids=repr)
def test_refusals_never_echo_a_raw_line_break_or_control_byte(
    client: redis.Redis, q: Rotator, bad: str
) -> None:
    """An error message is safe to log as one line: the client's and the module's alike."""
    before = snapshot(client, q)
    with pytest.raises(InvalidJobId) as by_client:
        q.push(bad)
    with pytest.raises(InvalidJobId) as by_module:
        q._call(b"push", bad.encode())
    for error in (by_client.value, by_module.value):
        assert not re.search(r"[\x00-\x1f]", str(error)), str(error)
    assert snapshot(client, q) == before


@pytest.mark.parametrize("bad", ["\ud800", "ok\udfff", "\udc80" * 2000], ids=repr)
def test_text_that_utf8_cannot_encode_is_an_invalid_job_id(
    client: redis.Redis, q: Rotator, bad: str
) -> None:
    """A lone surrogate is not text a server can store: refused like any other bad id.

    (Surrogates U+DC80..U+DCFF are the escapes of non-UTF-8 bytes and encode back to those
    bytes, so "\\udc80" * 2000 is refused for its length, 2000 bytes.)"""
    before = snapshot(client, q)
    with pytest.raises(InvalidJobId):
        q.push(bad)
    with pytest.raises(InvalidJobId):
        q.push("good", bad)
    assert snapshot(client, q) == before


# -- row 48: a huge ack batch ------------------------------------------------------------------

FOREIGN = [f"someone-else-{i}*1732233600000.1.{i}" for i in range(100_000)]


def test_100000_acks_of_an_unknown_queue_go_in_chunks_and_write_nothing(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    queue.stats()  # loads the script, so the count below is of ack calls only
    calls = module_calls(client)
    assert queue.ack(*FOREIGN) == 0
    assert module_calls(client) - calls == 20  # 5,000 tokens per call: unpack() stays safe
    assert all(kind == "none" for kind in snapshot(client, queue).values())


def test_100000_acks_of_another_queues_tokens_keep_this_queue_working(
    client: redis.Redis, q: Rotator
) -> None:
    """Nothing breaks: the queue's own lease, pending job and acks are untouched, no single
    call runs long, and whatever the foreign acks left is gone within two laps."""
    (mine,) = q.next()  # existing-2; existing-1 stays leased by the fixture's consumer
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    try:
        q.ack(*FOREIGN)
        for _ in range(2):
            q.sweep()  # two laps: the acks that named nothing here are dropped
        slowest = max(int(entry["duration"]) for entry in client.slowlog_get(1000))
    finally:
        client.config_set("slowlog-log-slower-than", 10_000)
    assert q.stats().done == 0
    assert q.ack(mine) == 1
    assert q.stats().in_flight == 1
    assert slowest < 1_000_000, f"a call took {slowest} us"  # far below busy-reply-threshold


def test_acks_of_tokens_this_queue_never_issued_touch_no_job_and_are_swept(
    client: redis.Redis, q: Rotator
) -> None:
    """A token with a call seq this queue never used is refused; one within the seqs it used
    cannot be told from a live one without scanning the ring, so it is counted (README,
    "Guarantees"): it completes nothing and is gone within two laps."""
    ring = client.lrange(q.keys.ring, 0, -1)
    assert q.ack(*FOREIGN[:10]) == 0
    (held,) = [job for job in q.peek() if job.state == "leased"]
    lookalikes = [f"someone-else-{i}{held.element[held.element.index('*') :]}" for i in range(10)]
    assert q.ack(*lookalikes) == 10
    assert client.lrange(q.keys.ring, 0, -1) == ring  # no job was touched
    for _ in range(3):
        q.sweep()
    assert client.scard(q.keys.all[1]) + client.scard(q.keys.all[2]) == 0
    assert q.stats().done == 0


# -- row 32: SCRIPT FLUSH between calls --------------------------------------------------------


def test_every_call_after_script_flush_reloads_once_and_runs_once(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=30.0, max_deliveries=2)

    def flushed(call: Callable[[], T]) -> T:
        client.script_flush()
        return call()

    assert flushed(lambda: queue.push("a", "b", "c")) == 3
    assert client.llen(queue.keys.ring) == 4  # pushed once: NOSCRIPT means nothing ran
    a, b, c = flushed(lambda: queue.next(3))
    assert flushed(lambda: queue.ack(a)) == 1
    assert flushed(lambda: queue.nack(b)) == 1
    assert flushed(lambda: queue.extend(c, 60.0)) > time.time() + 50
    assert flushed(queue.stats).in_flight == 1
    states = [entry.state for entry in flushed(lambda: queue.peek(5))]
    # The ring (its sentinel), then the lease list (a acked, b deferred, c).
    assert states == ["lap", "done", "deferred", "leased"]
    assert flushed(queue.sweep) == 1  # a's element
    (again,) = flushed(queue.next)
    assert (again.id, again.deliveries) == ("b", 2)
    assert flushed(lambda: queue.nack(again)) == 1
    assert flushed(queue.next) == []  # b had its two deliveries: a dead letter now
    assert [letter.id for letter in flushed(queue.dead)] == ["b"]
    assert flushed(lambda: queue.requeue_dead("b")) == 1
    assert flushed(lambda: [job.id for job in queue.next()]) == ["b"]


def test_a_refused_call_after_script_flush_is_typed_and_changes_nothing(
    client: redis.Redis, q: Rotator
) -> None:
    before = snapshot(client, q)
    client.script_flush()
    with pytest.raises(InvalidToken):  # the module's own check: a 1025-byte id
        q.ack("x" * 1025 + "*1732233600000.1.1")
    client.script_flush()
    with pytest.raises(InvalidJobId):
        q._call(b"push", b"bad*id")
    assert snapshot(client, q) == before


# -- row 39: BUSY from someone else's slow script ---------------------------------------------


def wait_for_busy(client: redis.Redis) -> None:
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up:
        try:
            client.ping()
        except redis.ResponseError as error:
            if str(error).startswith("BUSY"):
                return
            raise
        time.sleep(0.02)
    raise AssertionError("the server never answered BUSY")


def kill_script(client: redis.Redis) -> None:
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up:
        try:
            client.script_kill()
            return
        except redis.ResponseError as error:
            if "NOTBUSY" in str(error):
                return
        time.sleep(0.02)


@KINDS
def test_busy_from_someone_elses_script_is_server_busy_and_changes_nothing(
    kind: Kind, tmp_path: Path
) -> None:
    with ServerProcess(kind, tmp_path, {"busy-reply-threshold": "100"}) as server:
        admin = server.client(socket_timeout=10)
        queue = Rotator(server.client(socket_timeout=10), "busy", timeout=30.0)
        queue.push("a", "b")
        (job,) = queue.next()
        before = snapshot(admin, queue)
        outcome: list[BaseException] = []

        def spin() -> None:
            with server.client(socket_timeout=30) as other:
                try:
                    other.eval("while true do end", 0)
                except redis.RedisError as error:
                    outcome.append(error)

        spinner = threading.Thread(target=spin)
        spinner.start()
        try:
            wait_for_busy(admin)
            calls: list[Callable[[], object]] = [
                lambda: queue.push("c"),
                queue.next,
                lambda: queue.ack(job),
                lambda: queue.nack(job),
                lambda: queue.extend(job),
                queue.stats,
            ]
            for call in calls:
                with pytest.raises(ServerBusy):
                    call()
        finally:
            kill_script(admin)
            spinner.join(10)
        assert "kill" in str(outcome[0]).lower()
        assert snapshot(admin, queue) == before
        assert queue.ack(job) == 1
        assert [j.id for j in queue.next()] == ["b"]


# -- row 36: a read-only replica ---------------------------------------------------------------


# Redis 6.2 and 8.2 too: 6.2 runs the module by EVALSHA, which meets the refusal at its first
# write, and wraps it in the script's error (rotator.errors.SCRIPT_WRAPPED).
@pytest.mark.parametrize(
    "kind", ["redis", "valkey", "redis6", "redis8"], ids=["redis7", "valkey8", "redis6", "redis8"]
)
def test_a_read_only_replica_refuses_every_write_with_read_only_error_and_nothing_changes(
    kind: Kind, tmp_path: Path
) -> None:
    with replicated_pair(kind, tmp_path) as (primary, replica):
        to_primary, to_replica = primary.client(), replica.client()
        on_primary = Rotator(to_primary, "ro", timeout=30.0)
        on_replica = Rotator(to_replica, "ro", timeout=30.0)
        on_primary.push("a", "b")
        (job,) = on_primary.next()
        give_up = time.monotonic() + 20
        while snapshot(to_replica, on_replica) != snapshot(to_primary, on_primary):
            assert time.monotonic() < give_up, "the replica never caught up"
            time.sleep(0.05)
        before = snapshot(to_primary, on_primary)
        calls: dict[str, Callable[[], object]] = {
            "push": lambda: on_replica.push("c"),
            "next": on_replica.next,
            "ack": lambda: on_replica.ack(job),
            "nack": lambda: on_replica.nack(job),
            "extend": lambda: on_replica.extend(job),
            "sweep": on_replica.sweep,
        }
        errors: dict[str, redis.RedisError] = {}
        for name, call in calls.items():
            with pytest.raises(redis.RedisError) as refused:
                call()
            errors[name] = refused.value
        assert without_age(on_replica.stats()) == without_age(on_primary.stats())
        assert snapshot(to_primary, on_primary) == before
        assert snapshot(to_replica, on_replica) == before
        for name, error in errors.items():
            assert "READONLY" in f"{type(error).__name__} {error}".upper(), (name, error)
        # The type too: redis-py's Sentinel client reconnects to the new master on it.
        assert {name: type(error) for name, error in errors.items()} == dict.fromkeys(
            calls, redis.ReadOnlyError
        )


# -- row 41: a server that refuses connections -------------------------------------------------


def test_a_port_nobody_listens_on_is_a_prompt_connection_error() -> None:
    (port,) = free_ports(1)
    queue = Rotator.from_url(f"redis://127.0.0.1:{port}/0", "gone")
    calls: list[Callable[[], object]] = [
        lambda: queue.push("a"),
        lambda: queue.work(print, stop_when_empty=True, install_signal_handlers=False),
    ]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(redis.ConnectionError):
            call()
        assert time.monotonic() - started < PROMPT


@KINDS
def test_a_stopped_server_is_a_connection_error_and_the_queue_is_intact_after(
    kind: Kind, tmp_path: Path
) -> None:
    aof = {"appendonly": "yes", "appendfsync": "always"}
    with ServerProcess(kind, tmp_path, aof) as server:
        client = server.client()
        queue = Rotator(client, "stopped", timeout=30.0)
        queue.push("a", "b")
        (job,) = queue.next()
        before = snapshot(client, queue)
        server.stop()
        started = time.monotonic()
        with pytest.raises(redis.ConnectionError):
            queue.push("c")
        assert time.monotonic() - started < PROMPT
        server.start()
        assert snapshot(client, queue) == before
        assert queue.ack(job) == 1
        assert drain(queue) == ["b"]
