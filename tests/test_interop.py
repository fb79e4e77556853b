"""Python and Node on one queue: either side pushes, the other works, and a Node worker
killed mid-job loses nothing to a Python worker (the idempotency callback honoured).

Drives `node clients/node/scripts/interop.js` over the built package (clients/node/dist).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from rotator import Job, Rotator, Topic
from tests.helpers import NODE_PACKAGE, NODE_SCRIPT, NODE_TIMEOUT, built_node, wait_until
from tests.servers import ServerProcess


@pytest.fixture(scope="module")
def node() -> str:
    return built_node()


@pytest.fixture
def out_file(tmp_path: Path) -> Path:
    """Where the Node worker notes "start <id>" and "done <id>"."""
    return tmp_path / "out.txt"


def lines(path: Path, kind: str) -> list[str]:
    if not path.exists():
        return []
    found = path.read_text().splitlines()
    return [line.split(" ", 1)[1] for line in found if line.startswith(kind + " ")]


def test_python_pushes_and_node_works(
    node: str, server: ServerProcess, client: redis.Redis, queue_name: str, out_file: Path
) -> None:
    q = Rotator(client, queue_name)
    ids = [f"py-{i}" for i in range(40)]
    assert q.push(*ids) == 40
    result = subprocess.run(
        [node, str(NODE_SCRIPT), "work", server.url, queue_name, str(out_file), "0", "until-empty"],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["completed"] == 40
    assert sorted(lines(out_file, "done")) == sorted(ids)
    stats = q.stats()
    assert stats.pending + stats.in_flight + stats.deferred == 0
    assert stats.done + (stats.completed or 0) == 40  # acked (elements go at the next walk)


def test_node_pushes_and_python_works(
    node: str, server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    ids = [f"js-{i}" for i in range(40)]
    result = subprocess.run(
        [node, str(NODE_SCRIPT), "push", server.url, queue_name, *ids],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "40"
    q = Rotator(client, queue_name)
    seen: list[str] = []
    while jobs := q.next(15, block=0.5):
        seen.extend(job.id for job in jobs)
        assert q.ack(*jobs) == len(jobs)
    assert seen == ids  # in push order, each once
    assert q.stats().pushed == 40


def node_run(node: str, *args: str) -> str:
    """``interop.js`` with ``args``: its output, once it exited 0."""
    result = subprocess.run(
        [node, str(NODE_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


BODIES = {f"p-{n}": bytes([n, 0x80, 0x2A, n]) + f"body {n}".encode() for n in range(30)}


def test_python_pushes_payloads_and_node_works_them(
    node: str, server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, payloads=True)
    assert q.push_payloads(BODIES) == 30
    seen = json.loads(node_run(node, "drainp", server.url, queue_name))
    assert [(job["id"], bytes.fromhex(job["hex"])) for job in seen] == list(BODIES.items())
    assert client.hlen(q.keys.payloads) == 0  # Node's acks dropped them
    stats = q.stats()
    assert (stats.pending, stats.in_flight, stats.done + (stats.completed or 0)) == (0, 0, 30)


def test_node_pushes_payloads_and_python_works_them(
    node: str, server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    pairs = [half for job_id, body in BODIES.items() for half in (job_id, body.hex())]
    assert node_run(node, "pushp", server.url, queue_name, *pairs).strip() == "30"
    q = Rotator(client, queue_name, payloads=True)
    seen = []
    previous: list[Job] = []
    while jobs := q.next(8, ack=previous):  # (the last, empty, claim acks the last batch)
        seen += [(job.id, job.payload) for job in jobs]
        previous = jobs
    assert seen == list(BODIES.items())
    assert client.hlen(q.keys.payloads) == 0


def test_either_client_declares_the_same_schedule_as_the_other_and_reads_the_others(
    node: str, server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    """The spec Node writes for an interval is Python's, so declaring it again from the other
    side changes nothing; a Python cron schedule reads the same in Node."""
    assert node_run(node, "schedule", server.url, queue_name, "tick", "90").strip() == "true"
    q = Rotator(client, queue_name)
    assert q.schedule("tick", every=90) is False
    assert q.schedule("half", every=0.5) is True
    assert node_run(node, "schedule", server.url, queue_name, "half", "0.5").strip() == "false"
    q.schedule("nightly", cron="0 3 * * *", tz="Europe/Paris", job_id="report")
    seen = {
        found["name"]: found
        for found in json.loads(node_run(node, "schedules", server.url, queue_name))
    }
    mine = {found.name: found for found in q.schedules()}
    assert set(seen) == set(mine) == {"tick", "half", "nightly"}
    for name, found in mine.items():
        assert (seen[name]["spec"], seen[name]["jobId"], seen[name]["every"]) == (
            found.spec,
            found.job_id,
            found.every,
        )
        assert (seen[name]["cron"], seen[name]["tz"], seen[name]["duesLeft"]) == (
            found.cron,
            found.tz,
            found.dues_left,
        )
        assert seen[name]["nextDue"] == found.next_due


def test_a_node_worker_killed_mid_job_loses_nothing_to_a_python_worker(
    node: str, server: ServerProcess, client: redis.Redis, queue_name: str, out_file: Path
) -> None:
    ids = [f"job-{i}" for i in range(10)]
    q = Rotator(client, queue_name, timeout=5.0, idempotency=lambda job_id: job_id == "job-0")
    q.push(*ids)
    # Node claims four at a time (concurrency 4, lease 1 s, its heartbeat extending them)
    # and sleeps 30 s in each: killed mid-job.
    worker = subprocess.Popen(
        [node, str(NODE_SCRIPT), "work", server.url, queue_name, str(out_file), "30"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_until(lambda: len(lines(out_file, "start")) == 4, timeout=NODE_TIMEOUT)
        time.sleep(1.2)  # past the first lease: only the heartbeat's extends keep them now
        assert q.stats().in_flight == 4
        assert q.stats().overdue == 0
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=NODE_TIMEOUT)
    started = lines(out_file, "start")
    assert lines(out_file, "done") == []
    assert "job-0" in started  # the oldest first
    # Python works the rest, and takes the killed worker's jobs back once their leases run
    # out; the idempotency callback says job-0 was done already, so it is acked, not run.
    seen: list[str] = []
    reclaimed: list[str] = []
    give_up = time.monotonic() + 15
    while len(seen) < len(ids) - 1 and time.monotonic() < give_up:
        jobs = q.next(10, block=1.0)
        seen.extend(job.id for job in jobs)
        reclaimed.extend(job.id for job in jobs if job.reclaimed)
        q.ack(*jobs)
    assert sorted(seen) == sorted(set(ids) - {"job-0"})
    assert sorted(reclaimed) == sorted(set(started) - {"job-0"})
    stats = q.stats()
    assert stats.pending + stats.in_flight + stats.deferred + stats.overdue == 0
    assert stats.reclaimed == 4


def test_a_python_topic_publishes_and_a_node_group_consumes(
    node: str, server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    assert topic.subscribe("node")
    assert topic.subscribe("python")
    payloads = [f"msg-{i} ✓" for i in range(9)]
    binary = bytes([0x00, 0xFF, 0xFE, 0x80, 0x2A, 0x0A, 0xC3, 0x28])  # not UTF-8
    ids = topic.publish_many([*payloads, binary])
    result = subprocess.run(
        [node, str(NODE_SCRIPT), "consume", server.url, queue_name, "node", "10"],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert [m["id"] for m in seen] == ids  # in publish order, each once
    assert [m["payload"] for m in seen[:9]] == payloads
    # Byte for byte, as Python published them (job.payloadBuffer; job.payload decodes it).
    assert [bytes.fromhex(m["hex"]) for m in seen] == [p.encode() for p in payloads] + [binary]
    stats = topic.stats()
    node_group = stats.groups["node"]
    assert node_group.pending + node_group.in_flight + node_group.deferred == 0
    assert stats.groups["python"].pending == 10  # the other group still has every message
    assert stats.retained == 10  # acks leave the payloads to retention


def test_a_node_topic_publishes_and_a_python_group_consumes(
    node: str, server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    assert topic.subscribe("python")
    payloads = ["hello", "wörld", "!"]
    result = subprocess.run(
        [node, str(NODE_SCRIPT), "publish", server.url, queue_name, *payloads],
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    ids = json.loads(result.stdout)
    group = topic.group("python")
    jobs = group.next(10, block=1.0)
    assert [job.id for job in jobs] == ids
    assert [job.payload for job in jobs] == [p.encode() for p in payloads]
    assert group.ack(*jobs) == 3
    assert topic.stats().last_seq == 3


def test_the_readme_node_topic_example_runs_as_written(
    node: str, server: ServerProcess, client: redis.Redis, tmp_path: Path
) -> None:
    readme = (NODE_PACKAGE.parent.parent / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- node-topic-example -->\s*```js\n(.*?)```", readme, re.DOTALL)
    assert match, "README has no Node topic example"
    if leftovers := client.keys("rotator:{news}:*"):
        client.delete(*leftovers)
    modules = tmp_path / "node_modules"  # `require("rotator-queue")` as an installed package
    modules.mkdir()
    (modules / "rotator-queue").symlink_to(NODE_PACKAGE)
    script = tmp_path / "example.js"
    script.write_text(match.group(1).replace("redis://localhost:6379/0", server.url))
    result = subprocess.run(
        [node, str(script)],
        env={"PATH": "/usr/bin:/bin", "NODE_PATH": f"{modules}:{NODE_PACKAGE / 'node_modules'}"},
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["hello world 2", "2 0"]
    assert not client.keys("rotator:{news}:group:*")  # unsubscribed: the group's keys went
    assert client.hlen("rotator:{news}:topic:bodies") == 2  # retained for replay
    assert client.zcard("rotator:{news}:topic:log") == 1  # one publish call: one run
    client.delete(*client.keys("rotator:{news}:*"))
