"""The processing-time histogram (``Rotator.durations``): workers add to it with their
heartbeat, and every process reading it sees the same quantiles. On real servers."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
import redis
import redis.asyncio as aredis

from rotator import Durations, Rotator
from rotator.aio import AsyncRotator
from rotator.errors import InvalidArgument
from rotator.models import Job, duration_bucket
from rotator.worker import Worker
from tests.servers import ServerProcess
from tests.test_bury_and_overdue import state


def test_buckets_double_from_one_millisecond() -> None:
    assert [duration_bucket(s) for s in (0, 0.0009, 0.001, 0.0019, 0.002, 0.5, 1e9)] == [
        0,
        0,
        1,
        1,
        2,
        9,  # 0.5 s = 500 ms, in [256, 512)
        25,
    ]
    counts = Durations((0,) * 26)
    assert counts.p50 is None
    histogram = Durations((90,) + (0,) * 9 + (10,) + (0,) * 15)  # 90 under 1 ms, 10 near 1 s
    assert histogram.p50 == 0.001
    assert histogram.p95 == histogram.p99 == 2.0**10 / 1000
    assert Durations.upper_bound(25) == math.inf


def test_durations_add_up_across_clients(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    assert q.durations().total == 0
    q.durations(0.0005, 0.003, 0.003)
    other = Rotator(client, queue_name)
    found = other.durations(0.2)
    assert found.total == 4
    assert found.seconds == pytest.approx(0.2065, abs=0.002)
    assert found.counts[0] == 1
    assert found.counts[2] == 2  # 3 ms, in [2, 4)
    assert found.p50 == 0.004
    before = state(client, q)
    for bad in (-1.0, float("nan"), "1", True):
        with pytest.raises(InvalidArgument):
            q.durations(0.1, bad)  # type: ignore[arg-type]
    assert state(client, q) == before


def test_a_worker_loop_reports_how_long_its_jobs_took(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, timeout=1)  # a heartbeat every 0.25 s
    q.push("fast", "slow")

    def handler(job: Job) -> None:
        time.sleep(0.05 if job.id == "slow" else 0)

    worker = Worker(q, handler)
    runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    runner.start()
    deadline = time.monotonic() + 5
    while q.drained() is False and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.stop()
    runner.join(10)
    found = q.durations()
    assert found.total == 2
    assert sum(found.counts[6:8]) == 1  # the slow one: 50 ms and a little, in [32, 128)
    assert found.p99 is not None
    assert found.p99 >= 0.05


def test_the_async_client_reads_and_adds(server: ServerProcess, queue_name: str) -> None:
    async def run() -> Durations:
        client = aredis.Redis.from_url(server.url)
        q = AsyncRotator(client, queue_name)
        await q.durations(0.01)
        found = await q.durations()
        await client.aclose()
        return found

    assert asyncio.run(run()).counts[4] == 1  # 10 ms, in [8, 16)


def test_metrics_export_the_histogram_once_jobs_are_reported(
    client: redis.Redis, queue_name: str
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest  # noqa: PLC0415
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    from rotator.dashboard.metrics import QueueCollector  # noqa: PLC0415

    def samples() -> dict[tuple[str, str], float]:
        registry = CollectorRegistry()
        registry.register(QueueCollector(client))
        found = {}
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                if sample.labels.get("queue") == queue_name:
                    found[(sample.name, sample.labels.get("le", ""))] = sample.value
        return found

    q = Rotator(client, queue_name)
    q.push("a")
    assert ("rotator_job_duration_seconds_count", "") not in samples()  # absent, not 0
    q.durations(0.003, 0.003, 0.5)
    got = samples()
    assert got[("rotator_job_duration_seconds_count", "")] == 3
    assert got[("rotator_job_duration_seconds_sum", "")] == pytest.approx(0.506)
    assert got[("rotator_job_duration_seconds_bucket", "0.004")] == 2
    assert got[("rotator_job_duration_seconds_bucket", "+Inf")] == 3


def test_processing_times_ride_on_the_claim_with_the_acks(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("a", "b")
    [a] = q.next(1)
    calls = client.info("commandstats")
    [b] = q.next(1, ack=[a], durations=[0.05])  # one round trip: ack, times and claim
    after = client.info("commandstats")
    sent = sum(
        after[name]["calls"] - calls.get(name, {"calls": 0})["calls"]
        for name in after
        if name in ("cmdstat_fcall", "cmdstat_evalsha")
    )
    assert sent == 1
    assert q.durations().counts[6] == 1  # 50 ms, in [32, 64)
    before = state(client, q)
    with pytest.raises(InvalidArgument):
        q.next(1, ack=[b], durations=[-1.0])
    assert state(client, q) == before  # refused before anything was sent
