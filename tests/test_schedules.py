"""Recurring schedules (``Rotator.schedule``) through the Python API, the worker loop and the
CLI, on real servers: one job per tick whatever the consumers, one catch-up for missed
ticks, cron due times kept topped up, and bad input refused before anything is written."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest
import redis
import redis.asyncio as aredis

from rotator import Rotator, Schedule
from rotator.aio import AsyncRotator
from rotator.errors import InvalidArgument, InvalidJobId
from rotator.models import Job
from rotator.schedules import CRON_WINDOW
from rotator.worker import Worker
from tests.servers import ServerProcess
from tests.test_bury_and_overdue import state
from tests.test_cli import assert_one_line_error, cli, ok, ok_json
from tests.test_scheduled import server_ms


def tick_ms(job: Job, name: str) -> int:
    head, _, ms = job.id.rpartition("@")
    assert head == name, job.id
    return int(ms)


def test_an_interval_schedule_pushes_one_job_per_tick(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    assert q.schedule("often", every=0.3) is True
    assert q.schedule("often", every=0.3) is False  # declared again as it is: nothing changes
    [schedule] = q.schedules()
    assert (schedule.name, schedule.spec, schedule.job_id) == ("often", "every 0.3s", "often")
    assert (schedule.every, schedule.last_run, schedule.cron) == (0.3, None, None)
    assert schedule.next_due is not None
    assert q.stats().schedules == 1
    assert q.stats().scheduled == 0  # a schedule is not a job
    [job] = q.next(5, block=3)
    assert tick_ms(job, "often") == round(schedule.next_due * 1000)
    assert server_ms(client) >= tick_ms(job, "often")  # never before its time
    assert q.next(5) == []
    [after] = q.schedules()
    assert after.last_run == schedule.next_due
    assert q.unschedule("often") is True
    assert q.unschedule("often") is False
    assert q.schedules() == []


def test_concurrent_consumers_get_each_tick_once(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.schedule("fast", every=0.05, job_id="tick")
    seen: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + 1.5

    def consume() -> None:
        mine = Rotator(client, queue_name)
        while time.monotonic() < stop:
            jobs = mine.next(10, block=0.2)
            mine.ack(*jobs)
            with lock:
                seen.extend(job.id for job in jobs)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ticks = sorted(int(job_id.rpartition("@")[2]) for job_id in seen)
    assert len(ticks) >= 5
    assert len(set(seen)) == len(seen)  # no tick twice
    assert all(b > a and (b - a) % 50 == 0 for a, b in itertools.pairwise(ticks))


def test_missed_ticks_make_one_catch_up_job(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.schedule("s", every=0.1)
    time.sleep(0.65)  # six ticks pass with no consumer
    assert len(q.next(100)) == 1
    [schedule] = q.schedules()
    assert schedule.next_due is not None
    assert schedule.next_due * 1000 > server_ms(client) - 100


def test_a_cron_schedule_ticks_at_its_times_in_its_zone(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    assert q.schedule("each-second", cron="* * * * * *", tz="Europe/Paris", job_id="beat")
    [schedule] = q.schedules()
    assert (schedule.spec, schedule.cron, schedule.tz) == ("* * * * * *",) * 2 + ("Europe/Paris",)
    assert (schedule.every, schedule.dues_left) == (None, CRON_WINDOW)
    [job] = q.next(5, block=3)
    assert tick_ms(job, "beat") % 1000 == 0  # on the second
    assert q.schedule("each-second", cron="* * * * * *", tz="Europe/Paris", job_id="beat") is False
    assert q.schedule("each-second", cron="0 * * * *", job_id="beat") is True  # replaced
    [changed] = q.schedules()
    assert changed.cron == "0 * * * *"
    assert changed.next_due is not None
    assert round(changed.next_due) % 3600 == 0


def test_keep_schedules_tops_up_cron_due_times_and_catches_up_once(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    now = server_ms(client)
    # A cron schedule that ran out long ago (as if no worker had run for a while).
    q._call("schedule", "SET", "c", "c", 0, "* * * * * *", now - 60_000, now - 59_000)
    assert q.next(10) != []  # its catch-up tick
    [ran_out] = q.schedules()
    assert (ran_out.next_due, ran_out.dues_left) == (None, 0)
    assert q.keep_schedules() == 1
    [kept] = q.schedules()
    assert kept.dues_left == CRON_WINDOW
    assert len(q.next(10)) == 1  # one catch-up for the ticks missed while it had none
    assert q.keep_schedules() == 0  # a window that reaches far enough is left alone
    q.schedule("i", every=60)
    assert q.keep_schedules() == 0  # interval schedules need nothing


def test_a_worker_loop_keeps_the_cron_due_times(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, timeout=1)  # a heartbeat every 0.25 s
    now = server_ms(client)
    q._call("schedule", "SET", "c", "c", 0, "0 * * * *", now + 3_600_000)
    worker = Worker(q, lambda job: None)
    runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    runner.start()
    deadline = time.monotonic() + 5
    while q.schedules()[0].dues_left == 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.stop()
    runner.join(10)
    assert q.schedules()[0].dues_left == CRON_WINDOW


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({}, InvalidArgument),
        ({"every": 5, "cron": "* * * * *"}, InvalidArgument),
        ({"every": 0}, InvalidArgument),
        ({"every": -1}, InvalidArgument),
        ({"every": float("nan")}, InvalidArgument),
        ({"every": 11 * 365 * 86400}, InvalidArgument),
        ({"every": "5"}, InvalidArgument),
        ({"every": 5, "tz": "UTC"}, InvalidArgument),
        ({"cron": "61 * * * *"}, InvalidArgument),
        ({"cron": "* * *"}, InvalidArgument),
        ({"cron": ""}, InvalidArgument),
        ({"cron": "0 0 30 2 *"}, InvalidArgument),  # February 30th never comes
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, InvalidArgument),
        ({"every": 5, "job_id": "a*b"}, InvalidJobId),
        ({"every": 5, "job_id": "j" * 1009}, InvalidJobId),
    ],
)
def test_bad_schedules_are_refused_and_change_nothing(
    client: redis.Redis, queue_name: str, options: dict[str, object], error: type[Exception]
) -> None:
    q = Rotator(client, queue_name)
    q.schedule("kept", every=60)
    before = state(client, q)
    with pytest.raises(error):
        q.schedule("new", **options)  # type: ignore[arg-type]
    for name in ["", "a b", "n" * 129, "x*y"]:
        with pytest.raises(InvalidArgument):
            q.schedule(name, every=5)
        with pytest.raises(InvalidArgument):
            q.unschedule(name)
    assert state(client, q) == before


def test_the_async_client_schedules(server: ServerProcess, queue_name: str) -> None:
    async def run() -> list[Schedule]:
        client = aredis.Redis.from_url(server.url)
        q = AsyncRotator(client, queue_name)
        assert await q.schedule("a", every=0.2, job_id="job") is True
        [job] = await q.next(1, block=3)
        assert job.id.startswith("job@")
        assert await q.keep_schedules() == 0
        found = await q.schedules()
        assert await q.unschedule("a") is True
        await client.aclose()
        return found

    [schedule] = asyncio.run(run())
    assert schedule.last_run is not None


def test_cli_schedule_add_list_rm(server: ServerProcess, queue_name: str) -> None:
    assert ok(cli(server, "schedule", "add", queue_name, "nightly", "--cron", "0 2 * * *")) == (
        "scheduled nightly\n"
    )
    beat = ("schedule", "add", queue_name, "beat", "--every", "60", "--job-id", "hb")
    assert ok(cli(server, *beat)) == "scheduled beat\n"
    assert ok(cli(server, *beat)) == "unchanged beat\n"
    rows = ok(cli(server, "schedule", "list", queue_name)).splitlines()
    assert [row.split("  ")[0] for row in rows] == ["beat", "nightly"]
    assert rows[0].split("  ")[1] == "every 60s"
    assert rows[0].endswith("  hb")
    listed = ok_json(cli(server, "schedule", "list", queue_name, "--json"))
    assert [item["name"] for item in listed] == ["beat", "nightly"]
    assert listed[1]["cron"] == "0 2 * * *"
    assert ok_json(cli(server, "stats", queue_name, "--json"))["schedules"] == 2
    assert ok(cli(server, "schedule", "rm", queue_name, "beat")) == "removed beat\n"
    cases: list[tuple[tuple[str, ...], str]] = [
        (("rm", queue_name, "beat"), "no schedule 'beat'"),
        (("add", queue_name, "x"), "--every or --cron"),
        (("add", queue_name, "x", "--every", "5", "--cron", "* * * * *"), "--every or --cron"),
        (("add", queue_name, "x", "--cron", "99 * * * *"), "malformed cron"),
        (("add", queue_name, "x", "--cron", "* * * * *", "--tz", "Nowhere/At_All"), "time zone"),
    ]
    for args, fragment in cases:
        result = cli(server, "schedule", *args)
        assert_one_line_error(result.exit_code, result.stdout, result.stderr, fragment)
    assert [
        item["name"] for item in ok_json(cli(server, "schedule", "list", queue_name, "--json"))
    ] == ["nightly"]
