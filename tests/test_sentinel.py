"""rotator behind Redis Sentinel, on a real group (a server, its replica, three Sentinels:
conftest's ``sentinel_group``) of Redis 7.0 and of Valkey 8.1: the ``redis+sentinel://`` URL
every entry point takes and what a bad one is told, the Python clients and the CLI through
it, a master killed mid-run (durable pushes and acks: no confirmed push lost, no job run
again after its confirmed ack; the producer resending, or its Rotator's ``retry_for``
waiting it out; and a Node worker on ioredis's Sentinel client), a failover
that leaves the old master up and taking writes for seconds (its durable pushes are refused,
its plain ones lost: the control), and ``min-replicas-to-write`` refusing a push with
nothing written. The dashboard's Sentinel tests are in test_dashboard.py."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from rotator import Durability, InvalidArgument, NotDurable, Rotator
from rotator.aio import AsyncRotator
from rotator.cli import main
from rotator.urls import SENTINEL_PORT, SentinelURL, check_url, parse_sentinel_url
from tests.helpers import (
    NODE_SCRIPT,
    NODE_TIMEOUT,
    built_node,
    confirmed_acks,
    runs_after_confirmed_ack,
    worker_notes,
)
from tests.servers import SENTINEL_SERVICE, SentinelGroup, ServerProcess, free_ports

ROOT = Path(__file__).resolve().parent.parent
DURABLE = Durability(replicas=1, timeout=2)


# -- the URL -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("redis+sentinel://s1/jobs", SentinelURL((("s1", SENTINEL_PORT),), "jobs")),
        (
            "redis+sentinel://:p%40ss@s1:5000,[::1]:5001,[::2]/jobs/3",
            SentinelURL(
                (("s1", 5000), ("::1", 5001), ("::2", SENTINEL_PORT)), "jobs", 3, None, "p@ss"
            ),
        ),
        (
            "redis+sentinel://ann:pw@s1/my%20jobs/",
            SentinelURL((("s1", SENTINEL_PORT),), "my jobs", 0, "ann", "pw"),
        ),
    ],
)
def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database(
    url: str, parsed: SentinelURL
) -> None:
    assert parse_sentinel_url(url) == parsed


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://s1", "/SERVICE"),
        ("redis+sentinel://s1/", "/SERVICE"),
        ("redis+sentinel://s1/jobs/0/extra", "/SERVICE"),
        ("redis+sentinel://s1/jobs/zero", "whole number"),
        ("redis+sentinel://s1:0/jobs", "1..65535"),
        ("redis+sentinel://s1:26379,:26380/jobs", "no host"),
        ("redis+sentinel://[::1/jobs", "[IPV6]"),
        ("redis+sentinel://s1/jobs?socket_timeout=1", "no query"),
        ("sentinel://s1/jobs", "no scheme"),
    ],
)
def test_a_bad_sentinel_url_is_refused_saying_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        check_url(url)


def test_the_cli_refuses_a_bad_sentinel_url_in_one_line_naming_the_flag() -> None:
    result = CliRunner().invoke(main, ["stats", "q", "--url", "redis+sentinel://s1:26379"])

    assert result.exit_code == 2
    assert "'--url'" in result.stderr
    assert "/SERVICE" in result.stderr


def test_a_sentinel_url_for_a_cluster_is_refused_before_connecting() -> None:
    url = "redis+sentinel://127.0.0.1:1/jobs"
    with pytest.raises(InvalidArgument, match="named by one of its nodes"):
        Rotator.from_url(url, "q", cluster=True)
    with pytest.raises(InvalidArgument, match="named by one of its nodes"):
        AsyncRotator.from_url(url, "q", cluster=True)
    result = CliRunner().invoke(main, ["--url", url, "stats", "q", "--shards", "3"])

    assert result.exit_code == 1
    assert "named by one of its nodes" in result.stderr


def test_no_sentinel_answering_is_one_line_naming_the_url_and_the_service() -> None:
    (port,) = free_ports(1)
    url = f"redis+sentinel://127.0.0.1:{port}/jobs"
    result = CliRunner().invoke(main, ["--url", url, "stats", "q"])

    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"rotator: error: cannot reach {url}: No master found for 'jobs': no Sentinel of the "
        "URL answered with one"
    ]


# -- through the group -------------------------------------------------------------------------


def test_rotator_by_a_sentinel_url_works_on_the_master_the_sentinels_name(
    sentinel_group: SentinelGroup, queue_name: str
) -> None:
    q = Rotator.from_url(sentinel_group.url, queue_name)
    q.push("a", "b")
    jobs = q.next(2)

    assert [job.id for job in jobs] == ["a", "b"]
    assert q.ack(*jobs) == 2
    master, replica = sentinel_group.master(), sentinel_group.replica()
    with master.client() as on_master, replica.client() as on_replica:
        assert on_master.wait(1, 2000) == 1
        on_each = [Rotator(client, queue_name).stats() for client in (on_master, on_replica)]
    # (both acks on the master, and replicated: the replica answers by FCALL_RO)
    assert [(stats.pushed, stats.done) for stats in on_each] == [(2, 2), (2, 2)]
    q.client.close()


def test_async_rotator_by_a_sentinel_url_claims_and_blocks(
    sentinel_group: SentinelGroup, queue_name: str
) -> None:
    async def scenario() -> list[str]:
        q = AsyncRotator.from_url(sentinel_group.url, queue_name)
        try:
            waiting = asyncio.ensure_future(q.next(1, block=5))
            await asyncio.sleep(0.3)
            await q.push("woken")
            jobs = await waiting
            assert await q.ack(*jobs) == 1
            return [job.id for job in jobs]
        finally:
            await q.client.aclose()

    assert asyncio.run(scenario()) == ["woken"]


def test_the_cli_by_a_sentinel_url(sentinel_group: SentinelGroup, queue_name: str) -> None:
    runner = CliRunner()
    pushed = runner.invoke(main, ["--url", sentinel_group.url, "push", queue_name, "x", "y"])
    stats = runner.invoke(main, ["--url", sentinel_group.url, "stats", queue_name, "--json"])

    assert pushed.exit_code == 0, pushed.output
    assert stats.exit_code == 0, stats.output
    assert '"pending": 2' in stats.stdout


# -- failovers ---------------------------------------------------------------------------------

# A worker process that claims with Durability(replicas=1) and acks each batch the same way,
# noting each job id with the time it ran it (OUT) and the time its ack was confirmed
# (OUT.acked).
DURABLE_WORKER = """
import sys
import time
from pathlib import Path
from rotator import Durability, Rotator

url, name, out = sys.argv[1:]
queue = Rotator.from_url(url, name, timeout=5, durability=Durability(replicas=1, timeout=2))
ran = Path(out).open("w", encoding="utf-8")
acked = Path(out + ".acked").open("w", encoding="utf-8")

def note(lines, ids):
    lines.write("".join(f"{job_id} {time.time():.6f}\\n" for job_id in ids))
    lines.flush()

while True:
    try:
        jobs = queue.next(20, block=0.2)
    except Exception as error:  # NotDurable, or the master gone: the jobs come back
        print("worker: claim failed:", type(error).__name__, error)
        time.sleep(0.05)
        continue
    note(ran, [job.id for job in jobs])
    try:
        accepted = queue.ack(*jobs) if jobs else 0
    except Exception as error:  # NotDurable: applied, not confirmed
        print("worker: ack not confirmed:", type(error).__name__, error)
        continue
    if jobs and accepted == len(jobs):
        note(acked, [job.id for job in jobs])
"""


class Producer(threading.Thread):
    """Pushes ``batches`` of 50 ids, 20 batches a second, sorting them by what the push said:
    confirmed, unconfirmed (NotDurable: applied where it was sent, not confirmed), failed
    (no reply for 20 s of tries). A push that got no reply (the master gone, the Sentinels
    not yet agreed on another) is sent again, as a user would: it may have been applied, and
    a job pushed twice runs twice (``retried`` counts those batches)."""

    def __init__(self, queue: Rotator, tag: str, batches: int = 60) -> None:
        super().__init__()
        self.queue, self.tag, self.batches = queue, tag, batches
        self.confirmed: list[str] = []
        self.unconfirmed: list[str] = []
        self.failed: list[str] = []
        self.retried = 0

    def run(self) -> None:
        for batch in range(self.batches):
            ids = [f"{self.tag}-{batch}-{i}" for i in range(50)]
            self.confirmed.extend(self.push(ids))
            time.sleep(0.05)

    def push(self, ids: list[str]) -> list[str]:
        give_up = time.monotonic() + 20
        while True:
            try:
                self.queue.push(*ids)
            except NotDurable:
                self.unconfirmed.extend(ids)
            except redis.RedisError as error:
                if time.monotonic() < give_up:
                    self.retried += 1
                    time.sleep(0.1)
                    continue
                print("push failed:", type(error).__name__, error)
                self.failed.extend(ids)
            else:
                return ids
            return []


def drained(queue: Rotator) -> bool:
    """Nothing pending, in flight or deferred (on the master of the moment)."""
    try:
        stats = queue.stats()
    except redis.RedisError:  # (the master gone, for a moment)
        return False
    return stats.pending == stats.in_flight == stats.deferred == 0


def run_workers_through(
    group: SentinelGroup, name: str, workdir: Path, producer: Producer, change: Any
) -> dict[str, Any]:
    """``producer`` and two DURABLE_WORKER processes on ``name``; ``change`` runs one second
    in. Returns once every confirmed push was completed and the queue is empty (or 30 s
    after the producer's end) with what happened: lost and doubled ids, runs after a
    confirmed ack, workers alive."""
    outs = [workdir / f"worker-{n}.txt" for n in range(2)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", DURABLE_WORKER, group.url, name, str(out)], cwd=ROOT
        )
        for out in outs
    ]

    def completed() -> Counter[str]:
        return Counter(job_id for out in outs for job_id, _ in worker_notes(out))

    try:
        producer.start()
        time.sleep(1.0)
        change()
        producer.join()
        deadline = time.monotonic() + 30
        while not (set(producer.confirmed) <= set(completed()) and drained(producer.queue)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        alive = [worker.poll() is None for worker in workers]
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=30)
        producer.join()
    done = completed()
    acked = confirmed_acks(outs)
    late = runs_after_confirmed_ack(outs, acked)
    result = {
        "confirmed": len(producer.confirmed),
        "unconfirmed": len(producer.unconfirmed),
        "failed": len(producer.failed),
        "retried": producer.retried,
        "lost": len(set(producer.confirmed) - set(done)),
        "doubled": sum(n - 1 for n in done.values()),
        "confirmed_acks": len(acked),
        "ran_after_a_confirmed_ack": late,
        "workers_alive": alive,
        "drained": drained(producer.queue),
    }
    print(result)
    return result


def wait_for_a_new_master(group: SentinelGroup, old: ServerProcess, within: float = 20) -> float:
    """Seconds until every Sentinel names another server than ``old`` as the master."""
    began = time.monotonic()
    while True:
        try:
            if group.master() is not old:
                return time.monotonic() - began
        except Exception:  # (while the Sentinels disagree)
            pass
        assert time.monotonic() - began < within, "the Sentinels promoted no replica"
        time.sleep(0.05)


def kill_the_master(group: SentinelGroup, events: dict[str, Any]) -> None:
    """SIGKILL of the master, its replica cut off for the half second before: the master dies
    holding writes its replica never got (``events["unreplicated"]``, bytes). Returns once
    the Sentinels promoted the replica (``events["promoted"]``, seconds) and the killed
    server is back as its replica, as a supervisor would bring it back."""
    victim, heir = group.master(), group.replica()
    with heir.client(socket_timeout=2) as client:
        client.config_set("masterauth", "not-the-password")  # it cannot sync again
    with victim.client(socket_timeout=2) as client:
        client.execute_command("CLIENT", "KILL", "TYPE", "replica")
        time.sleep(0.5)  # the master alone takes writes
        written = int(client.info("replication")["master_repl_offset"])
    with heir.client(socket_timeout=2) as client:
        replicated = int(client.info("replication")["slave_repl_offset"])
    victim.kill9()
    events["promoted"] = wait_for_a_new_master(group, victim)
    with heir.client(socket_timeout=2) as client:
        client.config_set("masterauth", "")
    group.heal()
    events["unreplicated"] = written - replicated


@pytest.mark.timeout(120)
@pytest.mark.parametrize("retry_for", [0, 30], ids=["producer-resends", "retry_for"])
def test_a_master_killed_mid_run_fails_over_and_no_durable_push_or_ack_is_lost(
    sentinel_group: SentinelGroup,
    queue_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    retry_for: float,
) -> None:
    """SIGKILL of the master while a producer pushes and two worker processes claim and ack
    with ``Durability(replicas=1)``, its replica cut off for the half second before: the
    master dies holding writes its replica never got. The Sentinels promote the replica, the
    clients follow through the URL without a restart, and the killed server comes back as
    the new master's replica. Every confirmed push is completed, and no job whose ack was
    confirmed runs again (a claim is durable too: a job runs only once its lease reached the
    replica). Without ``retry_for`` the producer sends again the pushes that got an error;
    with it, the Rotator waits the failover out and no error but NotDurable reaches the
    producer."""
    monkeypatch.setattr("rotator.durability._warned_no_waitaof", True)
    events: dict[str, Any] = {}
    queue = Rotator.from_url(
        sentinel_group.url, queue_name, durability=DURABLE, retry_for=retry_for
    )
    producer = Producer(queue, "job")
    result = run_workers_through(
        sentinel_group,
        queue_name,
        tmp_path,
        producer,
        lambda: kill_the_master(sentinel_group, events),
    )
    print(events)

    assert events["unreplicated"] > 0  # acknowledged writes were lost with the master
    assert result["workers_alive"] == [True, True]  # no restart
    assert (result["failed"], result["lost"]) == (0, 0), result
    assert result["confirmed"] + result["unconfirmed"] == 60 * 50
    assert result["confirmed"] >= 30 * 50, result  # NotDurable only around the failover
    assert result["ran_after_a_confirmed_ack"] == [], result
    if retry_for:
        assert result["retried"] == 0, result
    else:
        assert result["retried"] > 0, result  # the failover's errors reached the producer


@pytest.mark.timeout(120)
def test_while_a_failed_over_master_still_takes_writes_durable_pushes_are_refused_and_kept(
    sentinel_group: SentinelGroup, queue_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SENTINEL FAILOVER promotes the replica and leaves the old master up: clients already
    connected to it go on writing there (two masters) until the Sentinels make it the new
    master's replica, some 8 s later, and its data is replaced by the new master's. A
    durable push sent there cannot reach a replica, so it raises NotDurable: every push that
    was confirmed is completed. The control, a plain producer on the same old master: pushes
    it was told had succeeded are lost."""
    monkeypatch.setattr("rotator.durability._warned_no_waitaof", True)
    old = sentinel_group.master()
    plain = Producer(Rotator.from_url(sentinel_group.url, queue_name), "plain", batches=100)
    events: dict[str, Any] = {}

    def fail_over() -> None:
        with redis.Redis(old.host, sentinel_group.sentinel_ports[0], socket_timeout=2) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", SENTINEL_SERVICE)
        events["promoted"] = wait_for_a_new_master(sentinel_group, old)
        plain.start()  # (its client connected before: it keeps writing to the old master)

    producer = Producer(
        Rotator.from_url(sentinel_group.url, queue_name, durability=DURABLE), "durable", batches=200
    )
    plain.queue.stats()  # connects to the master of the moment
    result = run_workers_through(sentinel_group, queue_name, tmp_path, producer, fail_over)
    plain.join()  # (long done: it pushes for half the time the other one does)
    done = Counter(
        job_id for out in tmp_path.glob("worker-?.txt") for job_id, _ in worker_notes(out)
    )
    plain_lost = set(plain.confirmed) - set(done)
    print(events, "plain: confirmed", len(plain.confirmed), "lost", len(plain_lost))

    assert result["workers_alive"] == [True, True]
    assert result["drained"]  # (so a confirmed push not completed is lost, not pending)
    assert result["unconfirmed"] > 0  # the durable pushes sent to the old master
    assert (result["failed"], result["lost"]) == (0, 0), result
    assert result["ran_after_a_confirmed_ack"] == [], result
    assert plain_lost, "the control lost nothing: the old master took no writes after the failover"


def test_a_master_that_requires_a_replica_refuses_pushes_without_one_and_writes_nothing(
    sentinel_group: SentinelGroup, queue_name: str
) -> None:
    """``min-replicas-to-write 1`` (what Redis advises beside Sentinel, to bound what a cut
    off master accepts) with the replica's link down: a push fails with the server's
    NOREPLICAS and writes nothing, reads still answer, and once the replica is back the
    same push goes through."""
    master, replica = sentinel_group.master(), sentinel_group.replica()
    q = Rotator.from_url(sentinel_group.url, queue_name)
    q.push("before")
    with (
        master.client(socket_timeout=2) as on_master,
        replica.client(socket_timeout=2) as on_replica,
    ):
        on_master.config_set("min-replicas-max-lag", "1")
        on_master.config_set("min-replicas-to-write", "1")
        on_replica.config_set("masterauth", "not-the-password")  # it cannot sync again
        try:
            on_master.execute_command("CLIENT", "KILL", "TYPE", "replica")
            time.sleep(0.2)
            with pytest.raises(redis.ResponseError, match=r"^NOREPLICAS"):
                q.push("refused")
            assert [entry.element for entry in q.peek(10)] == ["*lap", "before"]
            assert q.stats().pushed == 1
        finally:
            on_replica.config_set("masterauth", "")
        sentinel_group.heal()
        q.push("after")
        on_master.config_set("min-replicas-to-write", "0")
    assert [job.id for job in q.next(5)] == ["before", "after"]
    q.client.close()


def runs(out: Path) -> list[str]:
    """The ids of the jobs a Node worker (scripts/interop.js) noted as done, once a run."""
    found = out.read_text().splitlines() if out.exists() else []
    return [line.split(" ", 1)[1] for line in found if line.startswith("done ")]


def test_the_node_client_on_iorediss_sentinel_client_works_on_through_a_killed_master(
    sentinel_group: SentinelGroup, queue_name: str, tmp_path: Path
) -> None:
    """A Node worker (4 loops, 1 s leases, jobs of 50 ms) on ioredis's client for a master
    found through the Sentinels (``new Redis({ sentinels, name })``), the master killed a
    second in: it reconnects to the promoted replica and works until the queue is empty.
    Every job pushed (and replicated before the kill) is done; an ack lost with the master
    only makes its job run again."""
    node = built_node()
    ids = [f"js-{i}" for i in range(300)]
    q = Rotator.from_url(sentinel_group.url, queue_name, durability=DURABLE)
    q.push(*ids)
    out = tmp_path / "out.txt"
    worker = subprocess.Popen(
        [
            node,
            str(NODE_SCRIPT),
            "work",
            sentinel_group.url,
            queue_name,
            str(out),
            "0.05",
            "until-empty",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    victim = sentinel_group.master()
    victim.kill9()
    done_before = len(runs(out))
    promoted = wait_for_a_new_master(sentinel_group, victim)
    _, stderr = worker.communicate(timeout=NODE_TIMEOUT)
    done = runs(out)
    print(f"done {done_before} before the kill; promoted in {promoted:.1f} s; {len(done)} runs")

    assert worker.returncode == 0, stderr
    assert 0 < done_before < len(ids) / 2  # (the kill came mid-run)
    assert set(done) == set(ids)
    stats = Rotator.from_url(sentinel_group.url, queue_name).stats()
    assert stats.pending + stats.in_flight + stats.deferred == 0
