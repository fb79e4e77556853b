"""The server misbehaves: SIGKILL and restart, no persistence (the negative control), down for
a while, out of memory. Producers and workers keep running through all of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from rotator import Rotator
from tests.chaos.conftest import on_the_oldest_too
from tests.chaos.harness import ChaosRun, cpu_seconds
from tests.helpers import snapshot

AOF_ALWAYS = {"appendonly": "yes", "appendfsync": "always"}
AOF_EVERYSEC = {"appendonly": "yes", "appendfsync": "everysec"}
NO_PERSISTENCE = {"appendonly": "no", "save": ""}

MakeRun = Callable[..., ChaosRun]


@on_the_oldest_too
@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_server_kill9_with_appendfsync_always_loses_no_confirmed_job(chaos: MakeRun) -> None:
    # 3,000 jobs pushed over ~10 s by a producer, 3 workers (one calling the module by FCALL,
    # whose library the AOF must bring back, one on the library's Rotator.work); 3 server
    # SIGKILLs with restart gaps shorter than the lease and 3 worker SIGKILLs, in a seeded
    # order.
    run = chaos(AOF_ALWAYS)
    lease, workers_count = 1.5, 3
    producer = run.spawn_producer(count=3000, batch=25, rate=300)
    workers = [
        run.spawn_worker(
            lease=lease, job_ms=(1.0, 4.0), functions=n == 0, mode="work" if n == 2 else "loop"
        )
        for n in range(workers_count)
    ]
    run.wait_booted(workers)
    schedule = ["server"] * 3 + ["worker"] * 3
    run.rng.shuffle(schedule)
    gaps = []
    for fault in schedule:
        time.sleep(run.rng.uniform(0.6, 1.2))
        if fault == "server":
            gaps.append(round(run.rng.uniform(0.1, 1.0), 3))
            run.kill9_server(gaps[-1])
        else:
            run.replace_busy(workers)
        run.snapshot()
    run.notes["restart_gaps"] = gaps
    assert run.wait_exit(producer, 30) == 0, run.stderr(producer)
    run.notes["settled"] = run.settle(timeout=15)

    report = run.check(allow_leftovers=True)

    assert run.aof_loads() == 3, run.server.log_tail()  # each restart reloaded the AOF
    assert not [k for k in report.errors if k.startswith("work_died")], report.summary()
    assert report.pushed == 3000, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.stuck, report.summary()  # no uncertain id left behind either
    assert not report.unexplained, report.summary()
    push_copies = sum(d["copies"] - 1 for d in report.duplicate_detail.values())
    bound = report.faults["worker_kills"] + 3 * workers_count + push_copies
    assert report.duplicates <= bound, report.summary()
    assert not report.false_reclaims, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    assert "unexpected_exits" not in report.notes, report.summary()


@on_the_oldest_too
@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_negative_control_without_persistence_the_checker_reports_the_loss(
    chaos: MakeRun,
) -> None:
    # Proof that the checker is not vacuous: with nothing persisted, a server SIGKILL must
    # show up as lost jobs.
    run = chaos(NO_PERSISTENCE)
    producer = run.spawn_producer(count=1000, batch=100, rate=5000)
    worker = run.spawn_worker(lease=1.0, job_ms=(5.0, 10.0))  # ~130 jobs/s: most still wait
    assert run.wait_exit(producer, 15) == 0, run.stderr(producer)
    run.wait_booted([worker])
    time.sleep(0.3)
    run.kill9_server(gap=0.2)
    run.notes["settled"] = run.settle(timeout=5)

    report = run.check()
    report.notes["negative_control"] = "loss expected"

    assert report.pushed == 1000, report.summary()
    assert report.lost, report.summary()  # the checker saw the loss
    assert report.processed + len(report.lost) == 1000, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()


@on_the_oldest_too
@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_workers_back_off_while_the_server_is_down_and_finish_after(chaos: MakeRun) -> None:
    run = chaos(AOF_EVERYSEC)
    producer = run.spawn_producer(count=1500, batch=50, rate=300)
    # Two workers on our loop and one on the library's Rotator.work.
    workers = [run.spawn_worker(lease=1.5, mode=mode) for mode in ("loop", "loop", "work")]
    run.wait_booted(workers)
    time.sleep(1.0)
    procs = [*workers, producer]

    run.server.stop()
    started = time.monotonic()
    before = {p.name: cpu_seconds(p.pid) for p in procs}
    time.sleep(2.0)
    after = {p.name: cpu_seconds(p.pid) for p in procs}
    down_for = time.monotonic() - started
    run.server.start()
    run.faults["server_downs"] += 1

    cpu = {name: round(after[name] - before[name], 3) for name in before}
    run.notes["cpu_while_down"] = cpu
    run.notes["down_seconds"] = round(down_for, 3)
    assert run.wait_exit(producer, 30) == 0, run.stderr(producer)
    run.notes["settled"] = run.settle(timeout=15)
    report = run.check(allow_leftovers=True)

    # A hot loop would burn the whole window; backing off costs a few milliseconds.
    assert max(cpu.values()) < 0.15 * down_for, report.summary()
    assert not [k for k in report.errors if k.startswith("work_died")], report.summary()
    assert report.pushed == 1500, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    assert "unexpected_exits" not in report.notes, report.summary()


@on_the_oldest_too
@pytest.mark.chaos
@pytest.mark.timeout(60)
def test_oom_with_noeviction_refuses_writes_without_writing_and_loses_nothing(
    chaos: MakeRun,
) -> None:
    run = chaos({**AOF_EVERYSEC, "maxmemory-policy": "noeviction"})
    producer = run.spawn_producer(count=2000, batch=50, rate=400)
    # Two workers on our loop, one on the library's Rotator.work, which must ride it out.
    # One loop worker's jobs take 250-400 ms, so that it holds one when memory runs out and
    # its ack is refused: a loop worker whose `next` meets the limit first holds nothing
    # while it lasts (with 1-3 ms jobs both did so in about one run in four, and no ack was
    # refused; with 50-100 ms, one CI run in some tens).
    workers = [
        run.spawn_worker(lease=1.5, mode="loop"),
        run.spawn_worker(lease=1.5, mode="loop", job_ms=(250.0, 400.0)),
        run.spawn_worker(lease=1.5, mode="work"),
    ]
    run.wait_booted(workers)
    time.sleep(1.0)

    # A backlog, so the workers are busy when memory runs out: their acks are refused then.
    assert run.inline_producer().push([f"b{n:04d}" for n in range(1500)])
    admin = run.admin()
    probe = Rotator(admin, "oom-probe")  # a queue no worker touches, for an exact before/after
    probe.push(*[f"p{n}" for n in range(100)])
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + 256 * 1024)
    run.faults["oom_windows"] += 1
    refused: redis.ResponseError | None = None
    for attempt in range(200):
        before = snapshot(admin, probe)
        try:
            probe.push(*[f"q{attempt}-{n:04d}-padding-padding" for n in range(500)])
        except redis.ResponseError as error:
            refused = error
            after = snapshot(admin, probe)
            break
    assert refused is not None, "the server never ran out of memory"
    # How it reaches the caller: not as a RotatorError. A module that replies with the
    # server's own error gives redis-py's OutOfMemoryError; one that re-raises it as ERR
    # gives a plain ResponseError "OOM command not allowed ...". Either is a ResponseError.
    run.notes["oom_error"] = f"{type(refused).__module__}.{type(refused).__name__}: {refused}"
    assert isinstance(refused, redis.exceptions.OutOfMemoryError) or str(refused).startswith(
        "OOM command not allowed"
    ), repr(refused)
    assert after == before  # the refused push wrote nothing
    # Hold the server out of memory for 2 s. Just above the usage is not enough to hold it:
    # workers still lease under OOM (their `next` frees memory) and pushes creep back in.
    admin.config_set("maxmemory", 1)
    time.sleep(2.0)
    admin.config_set("maxmemory", 0)
    probe.delete()

    assert run.wait_exit(producer, 40) == 0, run.stderr(producer)
    run.notes["settled"] = run.settle(timeout=15)
    report = run.check()

    # The limit did bite: pushes and acks were refused (a refused ack is retried, and once
    # the lease ran out the job comes back and the idempotency callback finds it done).
    assert report.errors.get("push:oom", 0) > 0, report.summary()
    assert report.errors.get("ack:oom", 0) > 0, report.summary()
    assert not [k for k in report.errors if k.startswith("work_died")], report.summary()
    assert report.pushed == 3500, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    assert "unexpected_exits" not in report.notes, report.summary()
