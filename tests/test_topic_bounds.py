"""Topics stay bounded (issue 22): an idle group's backlog by the topic's retention, trims of any
size within Lua's limits, and group keys checked by name before a command writes or deletes."""

from __future__ import annotations

from typing import cast

import pytest
import redis

from rotator import Job, ProtocolError, Retention, Topic
from rotator.defaults import MAX_TRIM_BUDGET
from rotator.keys import KEY_ROLES, QueueKeys
from rotator.meta import meta_fields

MARGIN = 16  # how far past the bound a backlog may be before a publish brings it back


def meta_of(client: redis.Redis, keys: QueueKeys) -> dict[str, str]:
    return meta_fields(cast(dict[bytes, bytes], client.hgetall(keys.meta)))


def assert_one_lap_where_the_walk_expects_it(client: redis.Redis, keys: QueueKeys) -> None:
    """The ring holds one sentinel, and the meta's lap position (lapnext, counted in visits
    from seq) names it: removing elements before it must move that position with it, or a
    lap ends early (acks forgotten) or the sentinel is taken for a stray copy."""
    ring = client.lrange(keys.ring, 0, -1)
    assert ring.count(b"*lap") == 1
    meta = meta_of(client, keys)
    if meta.get("lapguess") != "1" and "lapnext" in meta:
        from_tail = len(ring) - ring.index(b"*lap")
        assert int(meta["lapnext"]) - int(meta["seq"]) == from_tail


def drain(topic: Topic, group: str) -> list[Job]:
    consumer = topic.group(group, timeout=60)
    got: list[Job] = []
    while jobs := consumer.next(500):
        got += jobs
        assert consumer.ack(*jobs) == len(jobs)
    return got


def test_an_idle_group_keeps_at_most_the_retained_count_and_counts_what_it_dropped(
    client: redis.Redis, queue_name: str
) -> None:
    keep, chunk = 100, 37
    topic = Topic(client, queue_name, retention=Retention(count=keep))
    topic.subscribe("idle")
    keys = topic.group_keys("idle")
    published: list[str] = []
    for _ in range(10 * keep // chunk + 1):
        published += topic.publish_many([b"m"] * chunk)
        stats = topic.stats().groups["idle"]
        assert stats.pending <= keep + min(chunk, MARGIN)
        assert client.llen(keys.ring) <= keep + min(chunk, MARGIN) + 1  # and the sentinel
        assert_one_lap_where_the_walk_expects_it(client, keys)
    assert len(published) >= 10 * keep
    assert topic.stats().groups["idle"].pending == keep
    assert topic.expired("idle") == len(published) - keep
    assert [job.id for job in drain(topic, "idle")] == published[-keep:]
    topic.delete()


def test_age_only_retention_leaves_a_group_below_the_cap_alone(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name, retention=Retention(count=None, age=3600))
    topic.subscribe("idle")
    published = topic.publish_many([b"m"] * 3000)
    assert topic.stats().groups["idle"].pending == 3000
    assert topic.expired("idle") == 0
    assert [job.id for job in drain(topic, "idle")] == published
    topic.delete()


def test_a_consuming_groups_leases_are_never_dropped(client: redis.Redis, queue_name: str) -> None:
    keep = 50
    topic = Topic(client, queue_name, retention=Retention(count=keep))
    topic.subscribe("work")
    keys = topic.group_keys("work")
    consumer = topic.group("work", timeout=60)
    topic.publish_many([b"m"] * 40)
    first = consumer.next(20)  # one packed batch; the sentinel went behind it
    assert consumer.nack(*first[:5]) == 5  # the batch is broken up at its next visit
    second = consumer.next(25)  # the 20 others, and the 5 given back as single leases
    assert len(second) == 25
    held = first[5:] + second
    assert len({job.id for job in held}) == 40
    in_flight = topic.stats().groups["work"].in_flight
    assert in_flight == 40
    published = []
    for _ in range(60):
        published += topic.publish_many([b"m"] * 25)
        assert topic.stats().groups["work"].pending <= keep + MARGIN
        assert topic.stats().groups["work"].in_flight == in_flight
        assert_one_lap_where_the_walk_expects_it(client, keys)
    assert consumer.ack(*held) == len(held)
    assert topic.expired("work") == len(published) - keep
    # Every lease acked was dropped from nothing; the newest `keep` follow, each once.
    assert [job.id for job in drain(topic, "work")] == published[-keep:]
    topic.delete()


def test_pending_ids_behind_a_hundred_single_leases_are_still_dropped(
    client: redis.Redis, queue_name: str
) -> None:
    keep = 50
    topic = Topic(client, queue_name, retention=Retention(count=keep))
    topic.subscribe("g")
    keys = topic.group_keys("g")
    consumer = topic.group("g", timeout=60)
    # Retention is each publisher's setting: this one keeps the hundred.
    Topic(client, queue_name, retention=Retention(count=100)).publish_many([b"m"] * 100)
    assert consumer.nack(*consumer.next(100)) == 100
    held = consumer.next(100)  # the batch broken up: a hundred leases of their own
    assert len(held) == 100
    # The leases wait in the lease list; the ring's tail is its sentinel, then what is published.
    assert client.lrange(keys.ring, 0, -1) == [b"*lap"]
    assert client.llen(keys.leases) == 100
    published = []
    for _ in range(20):
        published += topic.publish_many([b"m"] * 10)
        stats = topic.stats().groups["g"]
        assert stats.pending <= keep + MARGIN
        assert stats.in_flight == 100
        assert_one_lap_where_the_walk_expects_it(client, keys)
    assert consumer.ack(*held) == 100
    left = topic.stats().groups["g"].pending
    assert topic.expired("g") == len(published) - left
    assert [job.id for job in drain(topic, "g")] == published[-left:]
    topic.delete()


def test_drops_reaching_past_the_sentinel_keep_the_lap_in_place(
    client: redis.Redis, queue_name: str
) -> None:
    keep = 100
    topic = Topic(client, queue_name, retention=Retention(count=keep))
    topic.subscribe("g")
    keys = topic.group_keys("g")
    consumer = topic.group("g", timeout=60)
    topic.publish_many([b"m"] * 200)
    leased = consumer.next(20)  # from the tail: 80 pending, the sentinel, the batch
    topic.publish_many([b"m"] * 10)  # 90 pending: nothing dropped
    assert topic.expired("g") == 100
    topic.publish_many([b"m"] * 50)  # 40 dropped, all before the sentinel
    assert_one_lap_where_the_walk_expects_it(client, keys)
    newest = topic.publish_many([b"m"] * 100)  # 40 before the sentinel, 60 after it
    assert_one_lap_where_the_walk_expects_it(client, keys)
    assert topic.expired("g") == 100 + 40 + 100
    assert consumer.ack(*leased) == 20
    assert [job.id for job in drain(topic, "g")] == newest
    topic.delete()


def test_a_group_whose_ring_was_lost_or_deleted_is_bounded_afresh(
    client: redis.Redis, queue_name: str
) -> None:
    keep = 5
    topic = Topic(client, queue_name, retention=Retention(count=keep))
    topic.subscribe("g")
    keys = topic.group_keys("g")
    consumer = topic.group("g", timeout=60)
    topic.publish_many([b"m"] * keep)
    assert consumer.ack(*consumer.next(1)) == 1  # a walk: the meta knows where the lap ends
    assert "lapnext" in meta_of(client, keys)
    client.delete(keys.ring)  # the ring alone is lost, its 4 pending ids too; its meta is not
    newest = topic.publish_many([b"m"] * 20)[-keep:]
    assert_one_lap_where_the_walk_expects_it(client, keys)
    assert [job.id for job in drain(topic, "g")] == newest
    consumer.delete()
    newest = topic.publish_many([b"m"] * 30)[-keep:]
    assert topic.expired("g") == 25
    assert_one_lap_where_the_walk_expects_it(client, keys)
    assert [job.id for job in drain(topic, "g")] == newest
    topic.delete()


def test_trim_of_twenty_thousand_messages_over_retention_works(
    client: redis.Redis, queue_name: str
) -> None:
    Topic(client, queue_name, retention=Retention(count=20_000)).publish_many([b"m"] * 20_000)
    topic = Topic(client, queue_name, retention=Retention(count=10))
    # The module's largest budget in one call, then the client's calls for the rest.
    assert topic._call(topic.keys.all, b"ttrim", 10, 0, MAX_TRIM_BUDGET) == MAX_TRIM_BUDGET
    assert topic.trim() == 19_990 - MAX_TRIM_BUDGET
    # What is left is part of the last publish's run of 1000, now beginning at seq 19991.
    log = cast("list[tuple[bytes, float]]", client.zrange(topic.keys.log, 0, -1, withscores=True))
    assert [score for _, score in log] == [19_991]
    assert client.hlen(topic.keys.bodies) == 10
    assert topic.stats().bytes == 10
    topic.delete()


def group_with(topic: Topic, group: str, slot: int, key: str) -> tuple[str, ...]:
    keys = list(topic.group_keys(group).all)
    keys[slot] = key
    return (*topic.keys.all, *keys)


def test_unsubscribe_refuses_a_foreign_key_in_a_group_slot_and_writes_nothing(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("mail")
    topic.subscribe("news")
    topic.publish(b"x")
    victim = f"rotator:{{{queue_name}}}:victim"
    client.zadd(victim, {"keep": 1})
    others = topic.group_keys("news").all
    for slot, key in [(KEY_ROLES.index("revoked"), victim), (KEY_ROLES.index("dead"), others[6])]:
        with pytest.raises(ProtocolError, match="ROTATOR_KEYS"):
            topic._call(group_with(topic, "mail", slot, key), b"tunsubscribe", b"mail")
    assert client.zrange(victim, 0, -1, withscores=True) == [(b"keep", 1.0)]
    assert topic.groups() == ["mail", "news"]
    assert client.exists(*topic.group_keys("mail").all) > 0
    assert topic.stats().groups["news"].pending == 1
    client.delete(victim)
    topic.delete()


@pytest.mark.parametrize("slot", range(4))
def test_a_foreign_key_among_the_topics_own_keys_is_refused(
    client: redis.Redis, queue_name: str, slot: int
) -> None:
    topic = Topic(client, queue_name, retention=Retention(count=1))
    topic.subscribe("mail")
    topic.publish_many([b"x", b"y"])
    victim = f"rotator:{{{queue_name}}}:victim"
    client.hset(victim, "keep", "1")
    mine = [*topic.keys.all]
    mine[slot] = victim
    groups = (*topic.group_keys("mail").all,)
    before = {key: client.dump(key) for key in (*topic.keys.all, *groups, victim)}
    for keys, argv in [
        ((*mine, *groups), (b"tpublish", 1, 0, b"z")),
        ((*mine, *groups), (b"tunsubscribe", b"mail")),
        ((*mine, *groups), (b"tstats",)),
        (tuple(mine), (b"ttrim", 0, 1, 100)),
        (tuple(mine), (b"tseek", 0)),
    ]:
        with pytest.raises(ProtocolError, match="ROTATOR_KEYS"):
            topic._call(keys, *argv)
    assert {key: client.dump(key) for key in before} == before
    client.delete(victim)
    topic.delete()


@pytest.mark.parametrize(
    "argv",
    [
        (b"tsubscribe", b"fresh"),
        (b"treplay", b"mail", 1, 0, 10),
        (b"tpublish", 100, 0, b"x"),
        (b"tstats",),
    ],
)
def test_every_topic_command_refuses_keys_outside_the_groups_layout(
    client: redis.Redis, queue_name: str, argv: tuple[bytes | int, ...]
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("mail")
    topic.publish(b"x")
    victim = f"rotator:{{{queue_name}}}:victim"
    client.rpush(victim, b"keep")
    group = "fresh" if argv[0] == b"tsubscribe" else "mail"
    keys = group_with(topic, group, KEY_ROLES.index("wake"), victim)
    before = {key: client.dump(key) for key in (*topic.keys.all, *topic.group_keys("mail").all)}
    with pytest.raises(ProtocolError, match="ROTATOR_KEYS"):
        topic._call(keys, *argv)
    assert client.lrange(victim, 0, -1) == [b"keep"]
    assert {key: client.dump(key) for key in before} == before
    assert topic.groups() == ["mail"]
    client.delete(victim)
    topic.delete()


def commandstat_calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def test_unsubscribe_unlinks_the_groups_keys(client: redis.Redis, queue_name: str) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("mail")
    topic.publish_many([b"x"] * 10)
    consumer = topic.group("mail", timeout=60)
    consumer.nack(*consumer.next(10))  # a revoked set, marks: keys worth freeing
    dels, unlinks = commandstat_calls(client, "del"), commandstat_calls(client, "unlink")
    assert topic.unsubscribe("mail")
    assert commandstat_calls(client, "del") == dels
    # The module's UNLINK of the group's keys, and the client's of its worker registry.
    assert commandstat_calls(client, "unlink") == unlinks + 2
    assert client.exists(*topic.group_keys("mail").all) == 0
    topic.delete()
