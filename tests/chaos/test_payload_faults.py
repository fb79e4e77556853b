"""Jobs with payloads under worker kills, lost replies and dropped connections.

A payload is deleted by the ack that completes its job: by token, or by a named batch ack
(the batch's packed element sent back, which the module finds in the lease list before it
takes the ids' payloads). An ack whose reply is lost runs again; a producer's push whose
reply is lost runs again too, queueing a second copy of its ids (which share one payload,
counted), and a second producer pushes the first 600 ids again while they are queued. So
this run checks what an ack must never do: delete the payload of a job still to be
delivered (a copy's, or one pushed since). Every job carries its own body (``chaos_body``);
every delivery's payload is compared with it (``bad_payloads``), and once every job was
acked no payload may be left (``payloads_left``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.chaos.faultproxy import PASS, FaultProxy, Mode
from tests.chaos.harness import ChaosRun

AOF_EVERYSEC = {"appendonly": "yes", "appendfsync": "everysec"}

MakeRun = Callable[..., ChaosRun]


@pytest.mark.chaos
@pytest.mark.timeout(90)
def test_payloads_stay_with_their_jobs_through_kills_and_lost_replies(chaos: MakeRun) -> None:
    run = chaos(AOF_EVERYSEC, payloads=True)
    proxy = FaultProxy(run.server.port, seed=run.rng.randrange(2**32))
    proxy.start()
    try:
        producer = run.spawn_producer(
            count=3000, batch=50, rate=600, url=proxy.url, socket_timeout=1.0
        )
        # The first 600 ids once more, meanwhile: copies queued at once, sharing a payload.
        again = run.spawn_producer(count=600, batch=30, rate=150, url=proxy.url, socket_timeout=1.0)
        # Two workers on our loop (one job a call, acked alone: a named batch ack of one),
        # two on Rotator.work with batches of 10 (whole batches acked by name on the next
        # claim); one of each by FCALL.
        workers = [
            run.spawn_worker(
                lease=1.5,
                job_ms=(0.5, 2.0),
                mode=("loop", "work")[n % 2],
                batch=(1, 10)[n % 2],
                url=proxy.url,
                socket_timeout=1.0,
                functions=n < 2,
            )
            for n in range(4)
        ]
        run.wait_booted(workers)
        proxy.set_mode(Mode(drop_after=0.02, drop_before=0.01))

        run.run_for(5.0, every=0.6, action=lambda: run.replace_busy(workers))
        proxy.set_mode(PASS)
        assert run.wait_exit(producer, 40) == 0, run.stderr(producer)
        assert run.wait_exit(again, 20) == 0, run.stderr(again)
        run.notes["settled"] = run.settle(timeout=20)
        report = run.check(allow_leftovers=True)
    finally:
        proxy.stop()
    report.notes["proxy"] = {k: v for k, v in sorted(proxy.stats.items()) if ":" not in k}

    assert report.payload_run, report.summary()
    assert proxy.stats["dropped_after"] > 0, report.summary()
    assert report.faults["worker_kills"] >= 5, report.summary()
    assert report.pushed == 3000, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()
    assert not report.bad_payloads, report.summary()
    assert report.payloads_left == 0, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    assert "unexpected_exits" not in report.notes, report.summary()
