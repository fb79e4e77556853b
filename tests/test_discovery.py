"""rotator.discovery: every queue and topic on a server, found by SCAN (never KEYS). On a Redis
Cluster: tests/test_cluster_discovery.py.

The test servers are shared, so each test looks for the names it made among whatever else is
there, and proves "no KEYS" with an ACL user that may not run it.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
import redis.asyncio as aredis

from rotator import InvalidArgument, InvalidQueueName, Rotator, Topic
from rotator.commands import ClientCall
from rotator.discovery import Seen, discover, find, find_async, keep_live, scan_names
from rotator.keys import discovered, discovery_pattern, queue_keys, topic_keys
from tests.servers import ServerProcess


def test_a_queue_is_found_by_its_meta_and_a_topic_by_its_meta_or_groups() -> None:
    q, t = queue_keys("orders"), topic_keys("news")

    found = {key: discovered(key) for key in (*q.all, q.payloads, q.items, *t.all)}
    group = {key: discovered(key) for key in t.group("mail").all}

    assert {key: hit for key, hit in found.items() if hit} == {
        "rotator:{orders}:meta": ("queue", "orders"),
        "rotator:{news}:topic:meta": ("topic", "news"),
        "rotator:{news}:topic:groups": ("topic", "news"),
    }
    assert set(group.values()) == {None}  # a group's ring is not a queue of its own
    assert discovered("rotator:{a b}:meta") is None  # not a name rotator makes
    assert discovered("other:{orders}:meta") is None
    assert discovered("rotator:{orders}:meta", prefix="jobs") is None
    assert discovered("jobs:{orders}:meta", prefix="jobs") == ("queue", "orders")


def test_the_pattern_matches_only_keys_under_the_prefix_with_a_hash_tag() -> None:
    assert discovery_pattern() == "rotator:{*}:*"
    with pytest.raises(InvalidQueueName):
        discovery_pattern("a*")


def test_find_lists_queues_and_topics_with_their_names_sorted_and_skips_the_rest(
    client: redis.Redis, queue_name: str
) -> None:
    queues = [f"{queue_name}-b", f"{queue_name}-a", f"{queue_name}:with:colons"]
    for name in queues:
        Rotator(client, name).push("x")
    Topic(client, f"{queue_name}-subscribed").subscribe("mail")  # groups only, no message yet
    Topic(client, f"{queue_name}-published").publish("m")  # meta only, no group
    client.hset(f"rotator:{{{queue_name}-not-a-queue}}:marks", "k", "v")
    client.set(f"rotator:{{{queue_name}-string}}:meta", "a string, not a hash")

    found = find(client)

    mine_q = [name for name in found.queues if name.startswith(queue_name)]
    mine_t = [name for name in found.topics if name.startswith(queue_name)]
    assert mine_q == sorted(queues)
    assert mine_t == [f"{queue_name}-published", f"{queue_name}-subscribed"]
    assert list(found.queues) == sorted(found.queues)


def test_a_deleted_queue_is_no_longer_found(client: redis.Redis, queue_name: str) -> None:
    queue = Rotator(client, queue_name)
    queue.push("a")
    assert queue_name in find(client).queues

    queue.delete()

    assert queue_name not in find(client).queues


def test_many_small_scan_steps_find_the_same_as_one_big_one(
    client: redis.Redis, queue_name: str
) -> None:
    for n in range(30):
        Rotator(client, f"{queue_name}-{n}").push("x")

    small = find(client, count=3)
    big = find(client, count=100_000)

    assert small == big
    assert sum(name.startswith(f"{queue_name}-") for name in small.queues) == 30


def test_find_runs_scan_steps_bounded_by_count_and_never_keys(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Rotator(client, queue_name).push("x")
    user, password = f"nokeys-{uuid.uuid4().hex[:8]}", "pw"
    client.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all", "-keys"]
    )
    try:
        url = f"redis://{user}:{password}@{server.host}:{server.port}/0"
        with redis.Redis.from_url(url) as limited:
            with pytest.raises(redis.exceptions.NoPermissionError):
                limited.keys("*")
            found = find(limited)
    finally:
        client.acl_deluser(user)

    assert queue_name in found.queues


def test_the_flow_asks_for_hash_keys_matching_the_pattern_in_count_sized_steps() -> None:
    flow = discover("rotator", 50)

    first = next(flow)
    second = flow.send((b"7", [b"rotator:{a}:meta", b"rotator:{a}:ring"]))
    third = flow.send((0, [b"rotator:{t}:topic:groups"]))
    try:
        flow.send(1)  # a's ring exists: a queue, not what a delete left
    except StopIteration as stop:
        result = stop.value

    assert isinstance(first, ClientCall)
    assert isinstance(second, ClientCall)
    assert (first.method, first.args) == ("scan", (0, "rotator:{*}:*", 50, "hash"))
    assert second.args == (b"7", "rotator:{*}:*", 50, "hash")
    assert third == ClientCall(
        "exists", ("rotator:{a}:ring", "rotator:{a}:scheduled", "rotator:{a}:dead")
    )
    assert (result.queues, result.topics) == (("a",), ("t",))


def test_find_async_finds_the_same_as_find(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Rotator(client, queue_name).push("x")
    Topic(client, f"{queue_name}-t").subscribe("g")

    async def scenario() -> object:
        aclient = aredis.Redis.from_url(server.url)
        try:
            return await find_async(aclient)
        finally:
            await aclient.aclose()

    found = asyncio.run(scenario())

    assert found == find(client)


def test_the_scan_and_the_liveness_check_are_flows_of_their_own() -> None:
    scan = scan_names("rotator", 10)
    assert next(scan) == ClientCall("scan", (0, "rotator:{*}:*", 10, "hash"))
    try:
        scan.send((0, [b"rotator:{b}:meta", b"rotator:{a}:meta", b"rotator:{t}:topic:meta"]))
    except StopIteration as stop:
        seen = stop.value
    check = keep_live(seen, "rotator")
    asked = [next(check), check.send(0)]  # a is gone (a deleted queue); b is asked next
    try:
        check.send(1)
    except StopIteration as stop:
        result = stop.value

    assert seen == Seen(frozenset({"a", "b"}), frozenset({"t"}))
    assert asked == [
        ClientCall("exists", (keys.ring, keys.scheduled, keys.dead))
        for keys in (queue_keys("a"), queue_keys("b"))
    ]
    assert (result.queues, result.topics) == (("b",), ("t",))


def test_a_bad_count_is_refused_before_any_call() -> None:
    with pytest.raises(InvalidArgument, match="count"):
        next(scan_names("rotator", 0))


def test_a_queue_with_only_scheduled_jobs_is_found(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.push("later", delay=3600)
    assert queue_name in find(client).queues
    assert q.exists()
