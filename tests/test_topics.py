"""Topics on real servers: fan-out to groups, offline groups, crashes, replay, retention."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
import redis
import redis.asyncio as aredis
from click.testing import CliRunner
from redis.cluster import RedisCluster

from rotator import (
    GroupsChanged,
    InvalidArgument,
    InvalidQueueName,
    Job,
    Retention,
    Topic,
    UnknownGroup,
)
from rotator.aio import AsyncTopic
from rotator.cli import main
from rotator.topic import message_seq
from tests.servers import ServerProcess


def drain(topic: Topic, group: str, limit: int = 100_000, **options: float) -> list[Job]:
    """Leases and acks everything the group has now; returns the deliveries in order."""
    consumer = topic.group(group, **options)
    got: list[Job] = []
    previous: list[Job] = []
    while len(got) < limit and (jobs := consumer.next(500, ack=previous)):
        got += jobs
        previous = jobs
    consumer.ack(*previous)
    return got


def topic_keys_now(client: redis.Redis, topic: Topic) -> list[bytes]:
    return sorted(client.scan_iter(match=f"rotator:{{{topic.name}}}:*", count=1000))


def memory(client: redis.Redis, keys: list[bytes]) -> int:
    return sum(int(client.memory_usage(key) or 0) for key in keys)


def test_fan_out_reaches_every_group_once_and_no_two_instances_of_a_group(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    groups = ["billing", "mail", "search"]
    for group in groups:
        assert topic.subscribe(group)
    total = 5000
    received: dict[str, list[tuple[str, bytes | None]]] = {g: [] for g in groups}
    lock = threading.Lock()
    published: list[str] = []

    def publisher() -> None:
        for start in range(0, total, 250):
            published.extend(topic.publish_many(f"m{i}" for i in range(start, start + 250)))

    def instance(group: str) -> None:
        consumer = topic.group(group, timeout=30)
        previous: list[Job] = []
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            jobs = consumer.next(50, block=0.2, ack=previous)
            with lock:
                received[group] += [(job.id, job.payload) for job in jobs]
                if len(received[group]) >= total and not jobs:
                    break
            previous = jobs
        consumer.ack(*previous)

    threads = [threading.Thread(target=publisher)]
    threads += [threading.Thread(target=instance, args=(g,)) for g in groups for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(published) == total
    payload_of = {mid: f"m{i}".encode() for i, mid in enumerate(published)}
    for group in groups:
        ids = Counter(mid for mid, _ in received[group])
        # Leases of 30 s never expire here, so a second delivery would be a duplicate.
        assert len(received[group]) == total, group
        assert set(ids) == set(published), group
        assert all(payload == payload_of[mid] for mid, payload in received[group])
    stats = topic.stats()
    assert all(s.pending == 0 and s.in_flight == 0 for s in stats.groups.values())
    topic.delete()


def test_message_ids_are_ordered_and_distinct(client: redis.Redis, queue_name: str) -> None:
    topic = Topic(client, queue_name)
    ids = topic.publish_many(["a"] * 300) + [topic.publish("b") for _ in range(20)]
    seqs = [message_seq(mid) for mid in ids]
    assert seqs == list(range(1, 321))
    stamps = [int(mid.split("-")[0]) for mid in ids]
    assert stamps == sorted(stamps)
    topic.delete()


def test_a_group_offline_while_publishing_gets_everything_when_back(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("online")
    topic.subscribe("offline")
    ids = topic.publish_many(f"p{i}" for i in range(1200))
    assert [j.id for j in drain(topic, "online")] == ids
    later = drain(topic, "offline")
    assert [j.id for j in later] == ids
    assert [j.payload for j in later] == [f"p{i}".encode() for i in range(1200)]
    topic.delete()


def test_a_killed_instance_jobs_are_reclaimed_within_its_group_only(
    client: redis.Redis, server: ServerProcess, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("a")
    topic.subscribe("b")
    ids = topic.publish_many(f"job{i}" for i in range(5))
    code = (
        "import sys, time, redis\n"
        "from rotator import Topic\n"
        "t = Topic(redis.Redis.from_url(sys.argv[1]), sys.argv[2])\n"
        "jobs = t.group('a', timeout=2).next(5)\n"
        "print(' '.join(j.id for j in jobs), flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, server.url, queue_name],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ids
        os.kill(child.pid, signal.SIGKILL)  # mid-job: its leases are never acked
    finally:
        child.wait(10)
    b_jobs = topic.group("b", timeout=30).next(10)
    assert [(j.id, j.reclaimed, j.deliveries) for j in b_jobs] == [(i, False, 1) for i in ids]
    survivor = topic.group("a", timeout=30)
    assert survivor.next(10) == []  # still leased by the dead instance
    time.sleep(2.1)
    again = survivor.next(10, block=3)
    assert [(j.id, j.reclaimed, j.deliveries) for j in again] == [(i, True, 2) for i in ids]
    assert [j.payload for j in again] == [f"job{i}".encode() for i in range(5)]
    # Group b's leases (30 s) are untouched by a's reclaim.
    assert topic.group("b", timeout=30).next(10) == []
    stats = topic.stats()
    assert stats.groups["b"].in_flight == 5
    assert stats.groups["a"].in_flight == 5
    topic.delete()


def test_replay_from_an_id_and_from_a_time_redelivers_exactly_the_retained_tail(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name, retention=Retention(count=8))
    topic.subscribe("g")
    ids = []
    for i in range(12):
        ids.append(topic.publish(f"v{i}"))
        time.sleep(0.003)  # distinct milliseconds, so a time names one message
    assert len(drain(topic, "g")) == 12  # all delivered (4 of them past retention)
    retained = ids[4:]
    assert topic.stats().retained == 8

    assert topic.replay("g", from_id=ids[6]) == 6
    assert [(j.id, j.payload) for j in drain(topic, "g")] == [
        (mid, f"v{i}".encode()) for i, mid in enumerate(ids) if i >= 6
    ]
    at = int(ids[9].split("-")[0]) / 1000
    assert topic.replay("g", from_time=at) == 3
    assert [j.id for j in drain(topic, "g")] == ids[9:]
    # From before the retained start: only what is retained, in order.
    assert topic.replay("g", from_id=ids[0]) == 8
    assert [j.id for j in drain(topic, "g")] == retained
    assert topic.replay("g", from_time=0) == 8
    assert [j.id for j in drain(topic, "g")] == retained
    assert topic.replay("g", from_time=time.time() + 60) == 0
    topic.delete()


def test_subscribe_earliest_and_from_an_id_push_the_retained_messages(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name, retention=Retention(count=10))
    ids = topic.publish_many(f"x{i}" for i in range(15))
    assert topic.subscribe("late", start="earliest")
    assert topic.subscribe("mid", start=ids[12])
    assert topic.subscribe("new")
    assert not topic.subscribe("new", start="earliest")  # known: nothing changes
    more = topic.publish("y")
    assert [j.id for j in drain(topic, "late")] == [*ids[5:], more]
    assert [j.id for j in drain(topic, "mid")] == [*ids[12:], more]
    assert [j.id for j in drain(topic, "new")] == [more]
    topic.delete()


def test_retention_drops_payloads_and_acks_do_not(client: redis.Redis, queue_name: str) -> None:
    topic = Topic(client, queue_name, retention=Retention(count=None, age=0.3))
    topic.subscribe("g")
    ids = topic.publish_many(["abc"] * 50)
    assert len(drain(topic, "g")) == 50
    # Acked by every group, but retained for replay: the payloads stay.
    assert client.hlen(topic.keys.bodies) == 50
    assert topic.stats().bytes == 150
    time.sleep(0.35)
    assert topic.trim() == 50
    assert not client.exists(topic.keys.bodies, topic.keys.log)
    assert topic.stats().retained == 0
    assert topic.stats().bytes == 0
    assert topic.replay("g", from_id=ids[0]) == 0
    topic.delete()


def test_key_count_and_memory_return_to_baseline_after_many_acked_messages(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name, retention=Retention(count=10))
    for group in ("a", "b"):
        topic.subscribe(group)

    def cycle(n: int) -> None:
        # Publishes of the retained count, each consumed by both groups before the next, so
        # every message is acked (an idle group keeps at most the retained count and 16).
        for start in range(0, n, 10):
            topic.publish_many(f"payload-{i:06d}" for i in range(start, start + 10))
            for group in ("a", "b"):
                assert len(drain(topic, group)) == 10
        for group in ("a", "b"):
            topic.group(group).sweep()  # acked elements leave the ring on its next lap
            topic.group(group).sweep()

    # The baseline: after a warm-up of the same batch size, since a zset or hash that once
    # held more than 128 entries keeps its larger encoding.
    cycle(1000)
    base_keys = topic_keys_now(client, topic)
    base_memory = memory(client, base_keys)
    assert base_memory < 64 * 1024
    cycle(5000)
    assert topic_keys_now(client, topic) == base_keys
    assert topic.stats().retained == 10
    assert client.hlen(topic.keys.bodies) == 10
    # Same keys holding the same number of entries: no growth with acked messages.
    assert memory(client, base_keys) <= base_memory + 2048
    topic.delete()
    assert topic_keys_now(client, topic) == []


def test_subscribing_while_publishing_loses_nothing_and_never_fails(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("g0")
    published: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def publisher() -> None:
        other = Topic(client, queue_name)  # redis-py clients are thread-safe (a pool)
        try:
            while not stop.is_set() and len(published) < 20_000:
                published.extend(other.publish_many(["m"] * 5))
        except BaseException as error:  # reported below
            errors.append(error)

    thread = threading.Thread(target=publisher)
    thread.start()
    groups = [f"g{i}" for i in range(1, 10)]
    for group in groups:
        time.sleep(0.01)
        assert topic.subscribe(group)
    time.sleep(0.05)
    stop.set()
    thread.join(30)
    assert not errors
    assert published
    everything = [j.id for j in drain(topic, "g0")]
    assert everything == published
    for group in groups:
        got = [j.id for j in drain(topic, group)]
        # Everything from the first message it got to the last one: a suffix, no gaps.
        assert got, group
        assert got == published[published.index(got[0]) :], group
    topic.delete()


def test_publishing_reads_the_groups_once_and_again_only_after_they_changed(
    client: redis.Redis, queue_name: str
) -> None:
    def group_reads() -> int:
        return int(client.info("commandstats").get("cmdstat_hkeys", {}).get("calls", 0))

    publisher, other = Topic(client, queue_name), Topic(client, queue_name)
    other.subscribe("a")
    before = group_reads()
    first = [publisher.publish("1"), *publisher.publish_many(["2", "3"]), publisher.publish("4")]
    assert group_reads() - before == 1  # then the module's check of every call is enough
    other.subscribe("b")  # another client: this publisher's groups are stale
    fifth = publisher.publish("5")  # refused (nothing written), groups read again, sent again
    assert group_reads() - before == 2
    other.unsubscribe("a")
    sixth = publisher.publish("6")
    assert group_reads() - before == 3
    publisher.subscribe("c")  # its own changes: it reads them before the next publish
    seventh = publisher.publish("7")
    assert group_reads() - before == 4
    assert [j.id for j in drain(publisher, "b")] == [fifth, sixth, seventh]
    assert [j.id for j in drain(publisher, "c")] == [seventh]
    assert [message_seq(i) for i in first] == [1, 2, 3, 4]
    assert publisher.stats().last_seq == 7  # nothing published twice
    publisher.delete()


def test_a_topic_exists_from_its_first_subscribe_or_publish_until_it_is_deleted(
    client: redis.Redis, queue_name: str
) -> None:
    subscribed, published = Topic(client, queue_name), Topic(client, f"{queue_name}-p")
    assert not subscribed.exists()
    assert not published.exists()

    subscribed.subscribe("mail")
    published.publish("hello")

    assert subscribed.exists()
    assert published.exists()
    subscribed.delete()
    published.delete()
    assert not subscribed.exists()
    assert not published.exists()


def test_unsubscribe_removes_the_group_and_its_keys(client: redis.Redis, queue_name: str) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("stay")
    topic.subscribe("go")
    topic.publish("one")
    assert topic.groups() == ["go", "stay"]
    assert topic.unsubscribe("go")
    assert not topic.unsubscribe("go")
    assert topic.groups() == ["stay"]
    assert not client.exists(*topic.group_keys("go").all)
    topic.publish("two")
    assert [j.payload for j in drain(topic, "stay")] == [b"one", b"two"]
    assert drain(topic, "go") == []
    with pytest.raises(UnknownGroup):
        topic.replay("go", from_time=0)
    topic.delete()


def test_stats_show_backlog_oldest_age_retained_and_bytes(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("fast")
    topic.subscribe("slow")
    topic.publish_many(["12345"] * 4)
    time.sleep(0.05)
    drain(topic, "fast")
    stats = topic.stats()
    assert (stats.retained, stats.bytes, stats.last_seq) == (4, 20, 4)
    assert sorted(stats.groups) == ["fast", "slow"]
    assert stats.groups["slow"].pending == 4
    age = stats.groups["slow"].oldest_pending_age
    assert age is not None
    assert age >= 0.04
    assert stats.groups["fast"].pending == 0
    assert stats.groups["fast"].oldest_pending_age is None
    topic.delete()


def test_publish_with_a_stale_group_list_is_refused_and_writes_nothing(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("a")
    topic.subscribe("b")
    only_a = (*topic.keys.all, *topic.group_keys("a").all)
    with pytest.raises(GroupsChanged):
        topic._call(only_a, b"tpublish", 100, 0, b"x")
    twice = (*only_a, *topic.group_keys("a").all)
    with pytest.raises(GroupsChanged):
        topic._call(twice, b"tpublish", 100, 0, b"x")
    assert topic.stats().last_seq == 0
    assert not client.exists(topic.keys.bodies, topic.keys.log)
    topic.delete()


def test_bad_arguments_are_refused_before_anything_is_sent(
    client: redis.Redis, queue_name: str
) -> None:
    with pytest.raises(InvalidArgument):
        Topic(client, queue_name, retention=Retention(count=None, age=None))
    topic = Topic(client, queue_name)
    for bad in ["", "a:b", "x" * 65, "a b", "{t}"]:
        with pytest.raises(InvalidQueueName):
            topic.subscribe(bad)
    with pytest.raises(InvalidArgument):
        topic.subscribe("g", start="1-")
    with pytest.raises(InvalidArgument):
        topic.replay("g")
    with pytest.raises(InvalidArgument):
        topic.replay("g", from_id="1-1", from_time=1.0)
    with pytest.raises(InvalidArgument):
        topic.publish(12)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        topic.group("g").push_payloads({"x": "y"})
    assert topic_keys_now(client, topic) == []


def test_a_topic_works_through_fcall(client: redis.Redis, queue_name: str) -> None:
    topic = Topic(client, queue_name, functions=True)
    topic.subscribe("g")
    ids = topic.publish_many(["f1", "f2"])
    assert [(j.id, j.payload) for j in drain(topic, "g")] == [(ids[0], b"f1"), (ids[1], b"f2")]
    topic.delete()


@pytest.mark.cluster
def test_a_topic_and_its_groups_live_in_one_cluster_slot(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    topic = Topic(cluster_client, queue_name)
    for group in ("a", "b", "c"):
        topic.subscribe(group)
    slots = {
        cluster_client.keyslot(key)  # type: ignore[no-untyped-call]
        for key in (*topic.keys.all, *topic.group_keys("a").all, *topic.group_keys("c").all)
    }
    assert len(slots) == 1
    ids = topic.publish_many(f"c{i}" for i in range(300))
    for group in ("a", "b", "c"):
        consumer = topic.group(group)
        got: list[Job] = []
        while jobs := consumer.next(100):
            got += jobs
            consumer.ack(*jobs)
        assert [j.id for j in got] == ids
        assert got[-1].payload == b"c299"
    assert topic.replay("b", from_id=ids[-2]) == 2
    assert topic.stats().groups["b"].pending == 2
    topic.delete()


def test_the_cli_publishes_subscribes_replays_and_reports(
    client: redis.Redis, server: ServerProcess, queue_name: str
) -> None:
    def cli(*args: str, input: str | None = None) -> str:
        result = CliRunner().invoke(main, ["--url", server.url, "topic", *args], input=input)
        assert result.exit_code == 0, result.output
        return result.output

    assert cli("subscribe", queue_name, "mail").strip() == "subscribed mail"
    assert "already" in cli("subscribe", queue_name, "mail")
    ids = cli("publish", queue_name, "hello", "-", input="a\nb\n").split()
    assert [message_seq(i) for i in ids] == [1, 2, 3]
    assert cli("groups", queue_name).split() == ["mail"]
    stats = json.loads(cli("stats", queue_name, "--json"))
    assert stats["retained"] == 3
    assert stats["groups"]["mail"]["pending"] == 3
    topic = Topic(client, queue_name)
    assert [j.payload for j in drain(topic, "mail")] == [b"hello", b"a", b"b"]
    assert json.loads(cli("replay", queue_name, "mail", "--from-id", ids[1], "--json")) == {
        "replayed": 2
    }
    assert cli("subscribe", queue_name, "late", "--start", "earliest")
    assert len(drain(topic, "late")) == 3
    assert "unsubscribed" in cli("unsubscribe", queue_name, "late")
    bad = CliRunner().invoke(main, ["--url", server.url, "topic", "replay", queue_name, "mail"])
    assert bad.exit_code != 0
    assert "--from-id and --from-time" in bad.output  # the flags, not Python's from_id
    assert "from_id" not in bad.output
    topic.delete()


def test_the_asyncio_topic_fans_out_replays_and_reports(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario() -> None:
        client = aredis.Redis.from_url(server.url)
        try:
            topic = AsyncTopic(client, queue_name, retention=Retention(count=3))
            assert await topic.subscribe("a")
            assert await topic.subscribe("b")
            ids = await topic.publish_many(["1", "2", "3", "4"])
            assert await topic.groups() == ["a", "b"]
            for group in ("a", "b"):
                consumer = topic.group(group)
                jobs = await consumer.next(10)
                assert [(j.id, j.payload) for j in jobs] == [
                    (ids[0], None),
                    (ids[1], b"2"),
                    (ids[2], b"3"),
                    (ids[3], b"4"),
                ]
                assert await consumer.ack(*jobs) == 4
                assert await topic.expired(group) == 0  # within the bound's margin of 16
            assert await topic.replay("a", from_id=ids[2]) == 2
            assert await topic.subscribe("c", start="earliest")
            stats = await topic.stats()
            assert (stats.retained, stats.last_seq) == (3, 4)
            assert {n: s.pending for n, s in stats.groups.items()} == {"a": 2, "b": 0, "c": 3}
            assert await topic.trim() == 0
            await topic.delete()
            assert not await client.exists(*topic.keys.all)
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_subscribing_from_the_earliest_to_an_empty_topic_replays_nothing_later_published(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    assert topic.subscribe("g", start="earliest")
    ids = topic.publish_many(["a", "b"])
    assert topic.subscribe("h", start=ids[0])
    assert [j.id for j in drain(topic, "g")] == ids  # each once
    assert [j.id for j in drain(topic, "h")] == ids
    topic.delete()
