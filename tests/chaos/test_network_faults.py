"""Lost replies, dropped connections and a blackhole, through the fault proxy.

redis-py retries a command after a connection error or a timeout, so a command whose reply
was lost runs again: a `next` leaves an orphaned lease (handed out again when it runs out, not
processed twice), an ack is applied twice (harmless), and a push enqueues its ids twice.
Without ``retry_for`` rotator does not dedup a push sent again, so those duplicates are
expected and the checker explains them by the producer's PUSH_RETRY lines. With it (the
Rotator's own retries, redis-py's off) a plain push goes under a marker, and a copy would be
a duplicate nothing explains.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.chaos.checker import Report
from tests.chaos.conftest import on_the_oldest_too
from tests.chaos.faultproxy import FaultProxy, Mode, RequestFramer
from tests.chaos.harness import ChaosRun

AOF_EVERYSEC = {"appendonly": "yes", "appendfsync": "everysec"}

MakeRun = Callable[..., ChaosRun]


@on_the_oldest_too
@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_lost_replies_and_dropped_connections_lose_nothing(chaos: MakeRun) -> None:
    run = chaos(AOF_EVERYSEC)
    proxy = FaultProxy(run.server.port, seed=run.rng.randrange(2**32))
    proxy.start()
    try:
        producer = run.spawn_producer(
            count=2000, batch=20, rate=300, url=proxy.url, socket_timeout=1.0
        )
        workers = [
            run.spawn_worker(lease=1.5, url=proxy.url, socket_timeout=1.0, functions=n == 0)
            for n in range(3)
        ]
        run.wait_booted(workers)
        proxy.set_mode(Mode(drop_after=0.02, drop_before=0.01))
        faults_end = time.monotonic() + 5.0
        while time.monotonic() < faults_end:
            time.sleep(run.rng.uniform(0.7, 1.3))
            run.kill_clients()
            run.snapshot()
        run.blackhole(proxy)
        assert run.wait_exit(producer, 40) == 0, run.stderr(producer)
        run.notes["settled"] = run.settle(timeout=15)
        report = run.check(allow_leftovers=True)
    finally:
        proxy.stop()
    report.notes["proxy"] = {k: v for k, v in sorted(proxy.stats.items()) if ":" not in k}

    assert proxy.stats["dropped_after"] > 0, report.summary()
    assert proxy.stats["dropped_before"] > 0, report.summary()
    assert proxy.stats["blackholed_reads"] > 0, report.summary()
    assert report.pushed == 2000, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()
    assert not report.false_reclaims, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    assert "unexpected_exits" not in report.notes, report.summary()


def with_a_retrying_producer(run: ChaosRun, count: int, **options: Any) -> Report:
    """Runs a producer of ``count`` jobs whose Rotator has ``retry_for`` (redis-py's retries
    off) behind a proxy of its own, which loses a tenth of its replies after the call ran
    and drops a twentieth of its requests, and two workers, until every job is done; the
    checker's report, with the proxy's figures in its notes. Every push is sent again by
    the Rotator alone, unlogged, so a copy of an id would be a duplicate nothing explains."""
    pushes = FaultProxy(run.server.port, seed=run.rng.randrange(2**32))
    pushes.start()
    try:
        producer = run.spawn_producer(
            count=count,
            batch=20,
            rate=400,
            url=pushes.url,
            socket_timeout=1.0,
            retry_for=30,  # (a try is a new connection: see test_topic_faults.RETRY_FOR)
            **options,
        )
        workers = [run.spawn_worker(lease=1.5) for _ in range(2)]
        run.wait_booted([producer, *workers])
        pushes.set_mode(Mode(drop_after=0.1, drop_before=0.05))
        assert run.wait_exit(producer, 40) == 0, run.stderr(producer)
        pushes.set_mode(Mode())
        run.notes["settled"] = run.settle(timeout=15)
        report = run.check()
    finally:
        pushes.stop()
    report.notes["proxy"] = {k: v for k, v in sorted(pushes.stats.items()) if ":" not in k}
    return report


@on_the_oldest_too
@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_with_retry_for_lost_push_replies_enqueue_nothing_twice(chaos: MakeRun) -> None:
    """Plain pushes (``push_chunk``): no id twice, nothing lost, no error reached the
    producer."""
    report = with_a_retrying_producer(chaos(AOF_EVERYSEC), 2000)
    proxy = report.notes["proxy"]
    assert proxy["dropped_after"] > 5, report.summary()  # replies lost after it ran
    assert proxy["dropped_before"] > 0, report.summary()
    assert report.pushed == 2000, report.summary()
    assert (report.push_failures, report.push_retries) == (0, 0), report.summary()
    assert not report.lost, report.summary()
    assert not report.unexplained, report.summary()  # no id enqueued twice
    assert report.ok, report.summary()


@pytest.mark.parametrize("kind", ["redis", "valkey"], ids=["redis7", "valkey8"])
@pytest.mark.parametrize("what", ["payloads", "priorities"])
@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_with_retry_for_every_kind_of_push_enqueues_nothing_twice(
    chaos: MakeRun, what: str
) -> None:
    """The pushes that go as ``once``: payload pushes, a third of them scheduled (``pushp``,
    ``pushp_later``), or pushes at priorities 0, 3 and 9 in turn (``push_chunk`` and
    ``push_priority``). A copy of an id, or a payload left behind, would be the marker's
    failure."""
    options: dict[str, Any] = (
        {"later": 0.3, "soon": 0.5, "spread": 2.0}
        if what == "payloads"
        else {"priorities": (0, 3, 9)}
    )
    report = with_a_retrying_producer(
        chaos(AOF_EVERYSEC, payloads=what == "payloads"), 1500, **options
    )
    assert report.notes["proxy"]["dropped_after"] > 3, report.summary()
    assert report.pushed == 1500, report.summary()
    assert (report.push_failures, report.push_retries) == (0, 0), report.summary()
    assert not report.lost, report.summary()
    assert not report.unexplained, report.summary()  # no id enqueued twice
    assert not report.bad_payloads, report.summary()
    assert report.payloads_left == 0, report.summary()
    assert report.ok, report.summary()


@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_the_proxy_frames_whole_requests_across_reads() -> None:
    framer = RequestFramer()
    one = b"*3\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n0\r\n"
    two = b"*2\r\n$6\r\nSCRIPT\r\n$4\r\nload\r\n"
    stream = one + two
    assert framer.feed(stream[:5]) == []
    assert framer.feed(stream[5:30]) == []
    assert framer.feed(stream[30:]) == [(one, "EVALSHA"), (two, "SCRIPT LOAD")]
    assert framer.feed(b"") == []
