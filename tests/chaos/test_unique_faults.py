"""Unique pushes and cancels on a queue that tracks its ids (issue 16), under faults: lost
replies and dropped connections (the fault proxy), the server SIGKILLed and restarted from
its AOF, workers SIGKILLed mid-job.

The queue is made with ``configure(track_ids=True)``. Two producers push every batch with
``unique=True`` (30 % of the batches for later) and try again every push whose reply was lost
(redis-py replays it: PUSH_RETRY) or that failed (PUSH_FAIL, then a new attempt): the runs
where a push may have enqueued its ids twice. A canceller in the test's own process cancels,
one id a call, ids the queue holds (sampled from its index: scheduled, waiting, in flight)
whose push was confirmed, and the job a worker was running when it was SIGKILLed; it logs
each cancel and its outcome. The checker (``checker.py``, ``unique=True``) then proves:

* nothing lost: every confirmed id completed, but those a cancel found (and those whose
  cancel's outcome is unknown: an error, or a replay, which finds nothing the first run
  cancelled);
* no id enqueued more often than a push could have enqueued it: a push that runs again
  while the queue holds the id skips it, so a second first delivery needs a run of its push
  that ended after the id was done (an accepted ack frees an id): ``doubled`` is empty, and
  a duplicate DONE is explained only by a reclaim or by such a late run;
* a cancel that found its id is final: no delivery of it claimed by the server after the
  cancel returned (the claim's server time, deadline - lease, from the workers' lines and
  from every token read from the queue), and no ack accepted for a run of it finished after
  the cancel returned (the worker already running it may finish it, but its ack is refused);
* a cancel that found nothing came after the job was done: the id completed;
* after the final drain and sweeps the queue is quiet and its index (the ids hash) is empty,
  and ``stats().cancelled`` counts the cancels that found their id.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from rotator import Rotator, RotatorError
from rotator.protocol import text
from tests.chaos.checker import Report
from tests.chaos.eventlog import EventLog, chaos_client, error_kind, read_logs
from tests.chaos.faultproxy import FaultProxy, Mode
from tests.chaos.harness import ChaosRun, Proc

AOF_ALWAYS = {"appendonly": "yes", "appendfsync": "always"}
AOF_EVERYSEC = {"appendonly": "yes", "appendfsync": "everysec"}
LEASE = 1.5
PER_PRODUCER = 1500
PRODUCERS = ("a", "b")
SPREAD = 3.0  # scheduled pushes fall due over this many seconds after they are made

MakeRun = Callable[..., ChaosRun]


def spawn_unique_producer(
    run: ChaosRun, prefix: str, *, url: str | None = None, socket_timeout: float = 2.0
) -> Proc:
    """A producer process pushing with ``unique=True`` (``--unique``; the harness's
    ``spawn_producer`` has no such option): PER_PRODUCER ids in batches of 10 at 300 a
    second, 30 % of the batches for later (a third of those due at once)."""
    argv = [
        *("--url", url or run.url, "--queue", run.queue, "--prefix", prefix),
        *("--count", str(PER_PRODUCER), "--batch", "10", "--rate", "300"),
        *("--seed", str(run.rng.randrange(2**32)), "--socket-timeout", str(socket_timeout)),
        *("--later", "0.3", "--soon", str(1 / 3), "--spread", str(SPREAD), "--unique"),
    ]
    return run._spawn("producer", "tests.chaos.producer", argv, {}, None)


class ConfirmedIds:
    """The ids of the batches the producers' logs say were confirmed (PUSH_OK), read
    incrementally: no push of them runs any more, so a cancel of one is final."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.ids: set[str] = set()
        self._batches: dict[tuple[str, str], list[str]] = {}
        self._offsets: dict[Path, int] = {}

    def refresh(self) -> set[str]:
        for path in self.logs.glob("producer*.log"):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            end = data.rfind(b"\n")
            if end < 0:
                continue
            for raw in data[:end].decode("utf-8", "surrogateescape").split("\n"):
                parts = raw.split(" ")
                if len(parts) >= 4 and parts[1] == "PUSH_INVOKE":
                    self._batches[(path.stem, parts[2])] = parts[3].split(",")
                elif len(parts) >= 3 and parts[1] == "PUSH_OK":
                    self.ids.update(self._batches.get((path.stem, parts[2]), ()))
            self._offsets[path] = offset + end + 1
        return self.ids


class Canceller:
    """Cancels held ids from a thread of the test, one id a call, each cancel logged to
    ``cancel.log`` (see ``checker.py``). Every ``every`` seconds it samples the queue's index
    (HRANDFIELD with values), keeps the confirmed ids it never cancelled, and cancels one in
    each state it finds (at most ``limit`` in all)."""

    def __init__(
        self, run: ChaosRun, url: str, *, every: float, limit: int, socket_timeout: float = 2.0
    ) -> None:
        self.run = run
        self.every = every
        self.limit = limit
        self.log = EventLog(run.logs / "cancel.log")
        self._current = ""
        self._lock = threading.Lock()
        client = chaos_client(url, socket_timeout=socket_timeout, on_failure=self._on_failure)
        self.rotator = Rotator(client, run.queue)
        self.sampler = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=1.0,
            retry=Retry(NoBackoff(), 0),
        )
        self.confirmed = ConfirmedIds(run.logs)
        self.tried: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="canceller", daemon=True)
        self.cancelled_running = False  # a killed worker's job was cancelled

    def _on_failure(self, error: Exception) -> None:
        self.log.write("CANCEL_RETRY", self._current, error_kind(error))

    def cancel(self, job_id: str, aimed: str) -> None:
        """One cancel, logged: CANCEL_INVOKE, then CANCEL_OK found or CANCEL_FAIL."""
        with self._lock:
            if self.stop.is_set() or job_id in self.tried or len(self.tried) >= self.limit:
                return
            self.tried.add(job_id)
            self._current = job_id
            self.log.write("CANCEL_INVOKE", job_id, aimed)
            try:
                found = self.rotator.cancel(job_id)
            except (RedisError, RotatorError) as error:
                self.log.write("CANCEL_FAIL", job_id, error_kind(error))
                return
            self.log.write("CANCEL_OK", job_id, found)

    def sample(self) -> None:
        sampler: Any = self.sampler  # a flat list: id, value, id, value, ...
        pairs = sampler.hrandfield(self.rotator.keys.ids, 200, withvalues=True) or []
        confirmed = self.confirmed.refresh()
        picked: dict[str, str] = {}
        for raw_id, raw_value in zip(pairs[::2], pairs[1::2], strict=True):
            job_id, where = text(raw_id), text(raw_value)
            if job_id not in confirmed or job_id in self.tried or where.startswith("c"):
                continue
            state = {"p": "waiting", "s": "scheduled"}.get(where, "in_flight")
            picked.setdefault(state, job_id)
        for state, job_id in picked.items():
            self.cancel(job_id, state)

    def cancel_running(self, worker: Proc) -> None:
        """Cancels the job a SIGKILLed worker was running (its last START), if confirmed."""
        starts = [
            e
            for e in read_logs(self.run.logs).events
            if e.source == worker.name and e.kind == "START"
        ]
        if starts and starts[-1].fields[0] in self.confirmed.refresh():
            self.cancel(starts[-1].fields[0], "dead_worker")

    def _loop(self) -> None:
        while not self.stop.wait(self.every):
            # The server down, or the reply lost: the next round samples again.
            with contextlib.suppress(RedisError):
                self.sample()

    def __enter__(self) -> Canceller:
        self.thread.start()
        return self

    def close(self) -> None:
        """Stops the thread; no cancel after this. Idempotent."""
        if self.stop.is_set():
            return
        self.stop.set()
        self.thread.join(15)
        with self._lock:
            self.rotator.client.close()
            self.sampler.close()
            self.log.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


def begin(
    run: ChaosRun, *, url: str | None = None, socket_timeout: float = 2.0
) -> tuple[list[Proc], list[Proc]]:
    """The tracked queue, two unique producers and three workers (two on our loop, one on the
    library's Rotator.work)."""
    assert run.rotator().configure(track_ids=True).track_ids
    producers = [
        spawn_unique_producer(run, prefix, url=url, socket_timeout=socket_timeout)
        for prefix in PRODUCERS
    ]
    workers = [
        run.spawn_worker(
            lease=LEASE,
            job_ms=(2.0, 6.0),
            mode=mode,
            url=url,
            socket_timeout=socket_timeout,
            functions=n == 0,
        )
        for n, mode in enumerate(("loop", "work", "loop"))
    ]
    run.wait_booted(workers)
    return producers, workers


def kill_worker(run: ChaosRun, workers: list[Proc], canceller: Canceller) -> None:
    """SIGKILLs a worker mid-job, replaces it, and cancels the job it held: the first time
    (so that every run cancels a job in flight whenever a kill lands mid-job), then now and
    then."""
    victim, last = run.replace_busy(workers)
    if last == "START" and (not canceller.cancelled_running or run.rng.random() < 0.5):
        canceller.cancelled_running = True
        canceller.cancel_running(victim)


def finish(run: ChaosRun, producers: list[Proc], canceller: Canceller) -> Report:
    for producer in producers:
        assert run.wait_exit(producer, 40) == 0, run.stderr(producer)
    run.notes["settled"] = run.settle(timeout=SPREAD + 20)
    canceller.close()
    report = run.check(allow_leftovers=True, unique=True)
    admin = run.admin()
    report.notes["ids_left"] = int(admin.hlen(run.rotator().keys.ids))
    report.notes["stats_cancelled"] = run.rotator().stats().cancelled
    report.write(run.workdir / "report.json")
    return report


def assert_unique_and_cancels_ok(report: Report) -> None:
    assert report.pushed == PER_PRODUCER * len(PRODUCERS), report.summary()
    assert report.unique, report.summary()
    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert not report.unexplained, report.summary()
    assert not report.doubled, report.summary()
    assert not report.early, report.summary()
    assert not report.after_cancel, report.summary()
    assert not report.false_reclaims, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    assert report.notes["ids_left"] == 0, report.summary()  # the index is empty at the end
    # The cancels did something, and the server counted what they found (a replayed cancel
    # may have found its id the first time: counted there, uncertain here).
    states = report.cancel_states
    assert states.get("scheduled", 0) > 0, report.summary()
    assert states.get("waiting", 0) > 0, report.summary()
    assert states.get("in_flight", 0) + states.get("dead_worker", 0) > 0, report.summary()
    cancelled = report.notes["stats_cancelled"]
    assert report.cancelled <= cancelled <= report.cancelled + report.cancel_uncertain, (
        report.summary()
    )
    assert not [k for k in report.errors if k.startswith("work_died")], report.summary()
    assert "unexpected_exits" not in report.notes, report.summary()


@pytest.mark.chaos
@pytest.mark.timeout(90)
def test_unique_pushes_and_cancels_through_lost_replies_and_worker_kills(
    chaos: MakeRun,
) -> None:
    # Every client behind the fault proxy: 3 % of the requests lose their reply after running,
    # 1 % are dropped before; every ~1 s either every client connection is killed or a worker
    # is SIGKILLed mid-job (4 of them), then a 1.5 s blackhole. The server is fine.
    run = chaos(AOF_EVERYSEC)
    proxy = FaultProxy(run.server.port, seed=run.rng.randrange(2**32))
    proxy.start()
    try:
        producers, workers = begin(run, url=proxy.url, socket_timeout=1.0)
        with Canceller(run, proxy.url, every=0.15, limit=80, socket_timeout=1.0) as canceller:
            proxy.set_mode(Mode(drop_after=0.03, drop_before=0.01))
            faults = ["clients"] * 3 + ["worker"] * 4
            run.rng.shuffle(faults)
            for fault in faults:
                time.sleep(run.rng.uniform(0.5, 1.0))
                if fault == "clients":
                    run.kill_clients()
                else:
                    kill_worker(run, workers, canceller)
                run.snapshot()
            run.blackhole(proxy)
            report = finish(run, producers, canceller)
    finally:
        proxy.stop()
    report.notes["proxy"] = {k: v for k, v in sorted(proxy.stats.items()) if ":" not in k}
    report.write(run.workdir / "report.json")

    assert proxy.stats["dropped_after"] > 0, report.summary()
    assert report.faults["worker_kills"] == 4, report.summary()
    assert report.push_reruns > 0, report.summary()  # pushes ran again: what unique is for
    assert_unique_and_cancels_ok(report)


@pytest.mark.chaos
@pytest.mark.timeout(90)
def test_unique_pushes_and_cancels_survive_server_kill9_with_appendfsync_always(
    chaos: MakeRun,
) -> None:
    # 3 server SIGKILLs (restart gaps shorter than the lease) and 3 worker SIGKILLs, in a
    # seeded order; a push or cancel whose reply the kill cut off is replayed or tried again.
    run = chaos(AOF_ALWAYS)
    producers, workers = begin(run)
    with Canceller(run, run.url, every=0.15, limit=80) as canceller:
        faults = ["server"] * 3 + ["worker"] * 3
        run.rng.shuffle(faults)
        gaps = []
        for fault in faults:
            time.sleep(run.rng.uniform(0.5, 1.0))
            if fault == "server":
                gaps.append(round(run.rng.uniform(0.1, 1.0), 3))
                run.kill9_server(gaps[-1])
            else:
                kill_worker(run, workers, canceller)
            run.snapshot()
        run.notes["restart_gaps"] = gaps
        report = finish(run, producers, canceller)

    assert run.aof_loads() == 3, run.server.log_tail()  # each restart reloaded the AOF
    assert not run.lossy
    assert report.faults["worker_kills"] == 3, report.summary()
    assert not report.stuck, report.summary()
    assert_unique_and_cancels_ok(report)
