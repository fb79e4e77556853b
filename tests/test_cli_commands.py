"""The everyday commands: ``queues``, ``delete``, ``topic next|ack|nack``, and ``next --block`` on
a queue that does not exist yet."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import redis

from rotator import Rotator, Topic
from rotator.server import EmbeddedServer
from tests.helpers import wait_until
from tests.servers import ServerProcess
from tests.test_cli import ROTATOR, assert_error, cli, ok, ok_json, run_process

# -- rotator queues --------------------------------------------------------------------------


def test_queues_lists_every_queue_and_topic_with_their_counts(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    queue.push("a", "b", "c")
    queue.next()
    topic = Topic(client, f"{queue_name}-t")
    topic.subscribe("mail")
    topic.publish_many(["x", "y"])

    data = ok_json(cli(server, "queues", "--json"))
    text = ok(cli(server, "queues")).splitlines()

    mine = data["queues"][queue_name]
    assert (mine["pending"], mine["in_flight"], mine["dead"]) == (2, 1, 0)
    news = data["topics"][f"{queue_name}-t"]
    assert news["retained"] == 2
    assert news["groups"]["mail"]["pending"] == 2
    row = next(line for line in text if line.startswith(f"queue  {queue_name}  "))
    assert "pending 2" in row
    assert "in_flight 1" in row
    at = text.index(next(line for line in text if line.startswith(f"topic  {queue_name}-t  ")))
    assert "retained 2" in text[at]
    assert text[at + 1].startswith("  group mail  ")
    assert "pending 2" in text[at + 1]


def test_queues_never_lists_a_queue_after_it_is_deleted(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Rotator(client, queue_name).push("a")
    ok(cli(server, "delete", queue_name, "--yes"))

    assert queue_name not in ok_json(cli(server, "queues", "--json"))["queues"]


def test_queues_on_an_empty_server_says_so(rotator_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ROTATOR_URL"}
    env["ROTATOR_HOME"] = str(rotator_home)

    empty = run_process("queues", env=env)
    as_json = run_process("queues", "--json", env=env)

    assert empty.returncode == 0
    assert empty.stdout.startswith("no queues or topics on the embedded server")
    assert json.loads(as_json.stdout) == {"queues": {}, "topics": {}}


# -- rotator delete --------------------------------------------------------------------------


def test_delete_asks_first_and_a_no_keeps_the_queue(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    queue.push("a", "b")

    refused = cli(server, "delete", queue_name, input="n\n")

    assert refused.exit_code == 1
    assert f"Delete queue {queue_name!r} (2 pending, 0 in flight, 0 dead)" in refused.stderr
    assert refused.stderr.rstrip().endswith("rotator: error: nothing deleted")
    assert queue.stats().pending == 2


def test_delete_without_an_answer_deletes_nothing(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    queue.push("a")

    done = run_process("--url", server.url, "delete", queue_name, input="")

    assert done.returncode == 1
    assert "nothing deleted: no answer (--yes deletes without asking)" in done.stderr
    assert queue.exists()


def test_delete_with_a_yes_answer_or_yes_flag_removes_every_key(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    first, second = Rotator(client, queue_name), Rotator(client, f"{queue_name}-2")
    first.push("a")
    second.push("b")
    second.next()

    answered = cli(server, "delete", queue_name, input="y\n")
    flagged = cli(server, "delete", f"{queue_name}-2", "-y", "--json")

    assert answered.exit_code == 0
    # (the last line: an older click's test runner also echoes the answer typed)
    assert answered.stdout.splitlines()[-1] == f"deleted {queue_name}"
    assert json.loads(flagged.stdout) == {"deleted": True}
    # Only where each queue's seq got to stays (the module's delete: no token repeats).
    for name in (queue_name, f"{queue_name}-2"):
        assert client.keys(f"rotator:{{{name}}}:*") == [f"rotator:{{{name}}}:meta".encode()]
        assert set(client.hkeys(f"rotator:{{{name}}}:meta")) == {b"seq", b"origin"}


def test_delete_of_an_unknown_queue_fails(server: ServerProcess, queue_name: str) -> None:
    assert_error(cli(server, "delete", queue_name, "--yes"), f"unknown queue {queue_name!r}")


# -- rotator topic next | ack | nack ---------------------------------------------------------


def test_topic_next_leases_messages_with_their_payloads_and_ack_completes_them(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("mail")
    ids = topic.publish_many(["hello", "two\nlines\tand a tab"])

    rows = ok(cli(server, "topic", "next", queue_name, "mail", "--count", "2")).splitlines()
    jobs = ok_json(cli(server, "topic", "next", queue_name, "mail", "--json"))

    assert len(rows) == 2  # one line per message, whatever its payload holds
    fields = [row.split("\t") for row in rows]
    assert [(f[0], f[2]) for f in fields] == [
        (ids[0], "hello"),
        (ids[1], "two\\nlines\\tand a tab"),
    ]
    assert jobs == []  # both are leased
    acked = ok(cli(server, "topic", "ack", queue_name, "mail", fields[0][1]))
    nacked = ok(cli(server, "topic", "nack", queue_name, "mail", fields[1][1]))
    assert (acked, nacked) == ("1\n", "1\n")
    (again,) = ok_json(cli(server, "topic", "next", queue_name, "mail", "--json"))
    assert (again["id"], again["payload"], again["deliveries"]) == (
        ids[1],
        "two\nlines\tand a tab",
        2,
    )
    # The nacked delivery's token was revoked: its late ack is refused, and says so.
    refused = cli(server, "topic", "ack", queue_name, "mail", fields[1][1])
    assert (refused.exit_code, refused.stdout) == (1, "0\n")
    assert "1 of 1 tokens refused" in refused.stderr


def test_topic_next_on_a_group_not_subscribed_says_how_to_subscribe(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Topic(client, queue_name).publish("x")

    assert_error(
        cli(server, "topic", "next", queue_name, "late"),
        f"rotator topic subscribe {queue_name} late",
    )


# -- next --block on a queue nobody pushed to yet ------------------------------------------


def test_next_block_on_a_queue_that_does_not_exist_yet_waits_for_its_first_push(
    server: ServerProcess, client: redis.Redis
) -> None:
    name = f"t-fresh-{uuid.uuid4().hex[:8]}"
    waiting = subprocess.Popen(
        [ROTATOR, "--url", server.url, "next", name, "--block", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # It is blocked on the queue's wake list, not gone with "unknown queue".
        wait_until(
            lambda: client.info("clients")["blocked_clients"] >= 1 or waiting.poll() is not None
        )
        assert waiting.poll() is None, waiting.communicate()
        began = time.monotonic()
        Rotator(client, name).push("first")
        out, err = waiting.communicate(timeout=20)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()

    assert waiting.returncode == 0, err
    assert time.monotonic() - began < 5  # woken by the push, not by --block running out
    assert out.split("\t")[0] == "first"


def test_next_block_on_an_empty_new_queue_returns_nothing_after_the_wait(
    server: ServerProcess, queue_name: str
) -> None:
    began = time.monotonic()

    result = cli(server, "next", queue_name, "--block", "0.3")

    assert (result.exit_code, result.stdout) == (0, "")
    assert time.monotonic() - began >= 0.3


def test_next_without_block_on_an_unknown_queue_still_says_unknown(
    server: ServerProcess, queue_name: str
) -> None:
    assert_error(cli(server, "next", queue_name), f"unknown queue {queue_name!r}")


# -- rotator demo on the embedded server -----------------------------------------------------


def test_demo_without_url_says_it_leaves_the_embedded_server_running_and_how_to_stop_it(
    rotator_home: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ROTATOR_URL"}
    env["ROTATOR_HOME"] = str(rotator_home)

    done = run_process("demo", "--jobs", "200", "--workers", "2", "--json", env=env)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["lost"] == 0
    status = EmbeddedServer(rotator_home).status()
    assert status.running  # what it said it left running is running
    assert done.stderr.splitlines()[-1] == (
        f"rotator: left running: the embedded server (pid {status.pid}, data in "
        f"{rotator_home}); `rotator server stop` stops it"
    )
    stopped = run_process("server", "stop", env=env)
    assert stopped.stdout == "stopped\n"
