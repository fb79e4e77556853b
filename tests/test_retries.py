"""``retry_for`` on Rotator and AsyncRotator: calls sent again after a lost reply, a restart or
a refusal that says nothing ran, within a bound, and a plain push that is never pushed twice.

The replies are lost for real: the calls go through tests/chaos/faultproxy.py, a TCP relay
that forwards a module call to the server, waits for its reply to start and closes the
connection instead of relaying it (the call ran; its caller never hears). The clients have
redis-py's own retries off, so what is sent again is the Rotator's doing; one control keeps
them on, without ``retry_for``, and shows the duplicate that a marker prevents.
(tests/test_sentinel.py has a failover ridden through with ``retry_for``.)
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from rotator import InvalidArgument, Rotator, Topic
from rotator.aio import AsyncRotator, AsyncTopic
from rotator.protocol import text
from rotator.retries import CONNECT_TIMEOUT, MARKER_TTL, SOCKET_TIMEOUT
from rotator.topic import message_seq
from tests.chaos.faultproxy import PASS, FaultProxy, Mode
from tests.helpers import drain, later, monitored
from tests.servers import ClusterProcess, ServerProcess
from tests.test_cli import assert_error, ok, run

MODULE_CALLS = {"FCALL", "EVALSHA"}


class LostReplies:
    """The fault proxy's ``on_request``: after ``skip`` module calls (FCALL or EVALSHA), the
    replies of the next ``count`` are lost; every other request is relayed."""

    def __init__(self) -> None:
        self.proxy: FaultProxy | None = None
        self.skip = 0
        self.left = 0

    def lose(self, count: int, skip: int = 0) -> None:
        self.skip, self.left = skip, count

    def __call__(self, name: str, connection: int) -> None:
        assert self.proxy is not None
        lost = False
        if name in MODULE_CALLS and self.skip > 0:
            self.skip -= 1
        elif name in MODULE_CALLS and self.left > 0:
            self.left -= 1
            lost = True
        self.proxy.set_mode(Mode(drop_after=1.0) if lost else PASS)


@pytest.fixture
def lossy(server: ServerProcess) -> Iterator[tuple[FaultProxy, LostReplies]]:
    """A fault proxy in front of ``server`` whose losses the test sets."""
    losses = LostReplies()
    proxy = FaultProxy(server.port, seed=0, on_request=losses)
    losses.proxy = proxy
    proxy.start()
    yield proxy, losses
    proxy.stop()


def retries_off(port: int, socket_timeout: float = 2.0) -> redis.Redis:
    """A client through ``port`` with redis-py's own retries off and a short socket timeout."""
    return redis.Redis(port=port, retry=Retry(NoBackoff(), 0), socket_timeout=socket_timeout)


def retrying(proxy: FaultProxy, queue_name: str) -> Rotator:
    """The queue through ``proxy`` with ``retry_for=5`` (redis-py's retries off), its first
    job "warm-up" pushed: the module is loaded, so no call below is refused and sent again
    for that."""
    queue = Rotator(retries_off(proxy.port), queue_name, retry_for=5)
    queue.push("warm-up")
    return queue


def ring_ids(client: redis.Redis, queue_name: str) -> Counter[str]:
    """The job ids waiting in the ring (its elements that are a bare id), with how many
    copies of each."""
    ring = Rotator(client, queue_name).keys.ring
    elements = [text(element) for element in client.lrange(ring, 0, -1)]
    return Counter(element for element in elements if "*" not in element)


# -- the option --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 3601, True, "5", None, float("nan")])
def test_retry_for_must_be_0_to_3600_seconds(
    server: ServerProcess, client: redis.Redis, bad: Any
) -> None:
    for make in (
        lambda: Rotator(client, "q", retry_for=bad),
        lambda: AsyncRotator(aredis.Redis(port=server.port), "q", retry_for=bad),
        lambda: Rotator.from_url(server.url, "q", retry_for=bad),
        lambda: AsyncRotator.from_url(server.url, "q", retry_for=bad),
    ):
        with pytest.raises(InvalidArgument, match=r"retry_for must be 0\.\.3600 seconds"):
            make()


def test_from_url_with_retry_for_turns_redis_pys_retries_off_and_bounds_each_try(
    server: ServerProcess,
) -> None:
    for queue in (
        Rotator.from_url(server.url, "q", retry_for=5),
        AsyncRotator.from_url(server.url, "q", retry_for=5),
    ):
        options = queue.client.connection_pool.connection_kwargs  # type: ignore[union-attr]
        assert options["socket_timeout"] == SOCKET_TIMEOUT
        assert options["socket_connect_timeout"] == CONNECT_TIMEOUT
        assert options["retry"].get_retries() == 0
    plain = Rotator.from_url(server.url, "q").client.connection_pool.connection_kwargs  # type: ignore[union-attr]
    assert "socket_timeout" not in plain  # without retry_for, redis-py's defaults


def test_a_plain_push_goes_as_push_chunk_under_a_marker_of_its_own(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, retry_for=5)
    queue.stats()  # (the module is loaded: no first call refused and sent again below)
    with monitored(client) as seen:
        assert queue.push_many((f"j{n}" for n in range(2500)), chunk=1000) == 2500
        assert queue.push("x") == 1
    calls = [line for line in seen if queue_name in line and "push" in line]
    assert [line.split(" push_chunk ")[1].split(" ")[0] for line in calls] == ["0", "1", "2", "0"]
    markers = sorted(client.scan_iter(f"rotator:{{{queue_name}}}:push:*"))
    assert len(markers) == 2  # one a push call, whatever its chunks
    fields = sorted(client.hgetall(marker)[b"chunks"] for marker in markers)
    assert fields == [b"1", b"3"]
    assert all(0 < client.pttl(marker) <= MARKER_TTL * 1000 for marker in markers)
    assert queue.stats().pending == 2501
    plain = Rotator(client, queue_name)
    with monitored(client) as seen:
        plain.push("y")
    assert [line for line in seen if queue_name in line and " push " in line]


def test_other_pushes_go_as_once_under_a_marker_of_their_own(
    client: redis.Redis, queue_name: str
) -> None:
    """Scheduled, prioritised, payload and item-stats pushes go as ``once`` before their own
    command, a marker each push call; a unique push goes as it is (the id index makes it
    harmless twice)."""
    queue = Rotator(client, queue_name, retry_for=5, item_stats=True)
    queue.stats()
    with monitored(client) as seen:
        queue.push("later", delay=60)
        queue.push("urgent", priority=3)
        queue.push("counted")
    words = [line.split() for line in seen if queue_name in line]
    sent = [w[w.index("once") + 3] if "once" in w else None for w in words if "once" in w]
    assert sent == ["push_later", "push_priority", "pushi"]
    assert len(list(client.scan_iter(queue.keys.push_marker("*")))) == 3
    payloads = Rotator(client, f"{queue_name}-p", retry_for=5, payloads=True)
    with monitored(client) as seen:
        payloads.push_payloads({f"j{n}": b"x" for n in range(600)}, chunk=250)
    calls = [line.split() for line in seen if f"{queue_name}-p" in line and " pushp " in line]
    assert [(w[w.index("once") + 1], w[w.index("once") + 3]) for w in calls] == [
        ("0", "pushp"),
        ("1", "pushp"),
        ("2", "pushp"),
    ]
    tracked = Rotator(client, f"{queue_name}-u", retry_for=5)
    tracked.configure(track_ids=True)
    with monitored(client) as seen:
        tracked.push("a", unique=True)
    assert not [line for line in seen if f"{queue_name}-u" in line and " once " in line]


@pytest.mark.cluster
def test_on_a_cluster_a_plain_push_goes_under_a_marker_in_the_queues_slot(
    cluster: ClusterProcess, queue_name: str
) -> None:
    """``from_url(..., cluster=True, retry_for=...)``: the marker is a key under the queue's
    hash tag, so the push stays one single-slot call; claims and acks go as on any queue."""
    queue = Rotator.from_url(cluster.nodes[0].url, queue_name, cluster=True, retry_for=5)
    try:
        assert queue.push("a", "b") == 2
        (marker,) = queue.client.scan_iter(match=f"rotator:{{{queue_name}}}:push:*")
        assert key_slot(marker) == key_slot(queue.keys.ring.encode())
        jobs = queue.next(5)
        assert [job.id for job in jobs] == ["a", "b"]
        assert queue.ack(*jobs) == 2
    finally:
        queue.client.close()


def test_a_claim_blocked_longer_than_the_socket_timeout_is_no_timeout(
    server: ServerProcess, queue_name: str
) -> None:
    """The client a retry_for queue is given has a socket timeout (from_url sets 5 s); a
    claim blocked longer waits its block out, in both APIs, and is not cut short as a
    timeout to retry."""
    queue = Rotator(retries_off(server.port, socket_timeout=0.4), queue_name, retry_for=5)
    began = time.monotonic()
    assert queue.next(block=1.0) == []
    assert time.monotonic() - began >= 1.0

    async def blocked() -> list[Any]:
        aclient = aredis.Redis(
            port=server.port, retry=AsyncRetry(NoBackoff(), 0), socket_timeout=0.4
        )
        try:
            return await AsyncRotator(aclient, queue_name, retry_for=5).next(block=1.0)
        finally:
            await aclient.aclose()

    began = time.monotonic()
    assert asyncio.run(blocked()) == []
    assert time.monotonic() - began >= 1.0


# -- lost replies --------------------------------------------------------------------------------


def test_a_push_whose_reply_was_lost_is_sent_again_and_pushes_nothing_twice(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    proxy, losses = lossy
    queue = retrying(proxy, queue_name)
    losses.lose(1)
    assert queue.push("a", "b", "c") == 3  # the count the first try pushed
    losses.lose(1, skip=1)  # a push of three chunks whose second reply is lost
    assert queue.push_many((f"j{n}" for n in range(2500)), chunk=1000) == 2500
    assert proxy.stats["dropped_after"] == 2
    waiting = ring_ids(client, queue_name)
    assert max(waiting.values()) == 1
    assert set(waiting) == {"warm-up", "a", "b", "c", *(f"j{n}" for n in range(2500))}


def test_without_retry_for_redis_pys_own_retry_pushes_a_lost_reply_twice(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    """The control: redis-py's default retries send the push again, and it lands twice."""
    proxy, losses = lossy
    queue = Rotator(redis.Redis(port=proxy.port, socket_timeout=2), queue_name)
    queue.push("warm-up")
    losses.lose(1)
    assert queue.push("a") == 1
    assert proxy.stats["dropped_after"] == 1
    assert ring_ids(client, queue_name)["a"] == 2


def test_with_retry_for_redis_pys_own_retries_resend_the_marker_too(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    """A client left with redis-py's default retries: they resend the marked call first, and
    it still lands once (the README's advice to turn them off is for the calls rotator would
    not send again, and for the bound)."""
    proxy, losses = lossy
    own_retries = redis.Redis(port=proxy.port, socket_timeout=2)
    queue = Rotator(own_retries, queue_name, retry_for=5)
    queue.push("warm-up")
    losses.lose(1)
    assert queue.push("a") == 1
    topic = Topic(own_retries, queue_name, retry_for=5)
    topic.subscribe("g")
    topic.publish("warm-up")
    losses.lose(1)
    assert [message_seq(i) for i in topic.publish_many(["x"])] == [2]
    assert proxy.stats["dropped_after"] == 2
    assert ring_ids(client, queue_name) == Counter(["warm-up", "a"])
    assert group_messages(client, queue_name, "g") == Counter(["warm-up", "x"])


def test_other_pushes_whose_replies_were_lost_are_sent_again_and_land_once(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    proxy, losses = lossy
    queue = Rotator(retries_off(proxy.port), queue_name, retry_for=5, payloads=True)
    queue.push("warm-up")
    pushes: list[Callable[[], int]] = [
        lambda: queue.push("later", delay=60),
        lambda: queue.push("soon", at=time.time() - 1),
        lambda: queue.push_payloads({"p1": b"one", "p2": b"two"}),
        lambda: queue.push_payloads({"p3": b"three"}, delay=60),
    ]
    for push in pushes:
        losses.lose(1)
        assert push() in (1, 2)  # what the first try pushed
    assert proxy.stats["dropped_after"] == 4
    stats = Rotator(client, queue_name).stats()
    assert (stats.pushed, stats.scheduled) == (3, 3)  # later, soon (due, not moved yet), p3
    assert ring_ids(client, queue_name) == Counter(["warm-up", "p1", "p2"])
    assert client.hlen(queue.keys.payloads) == 3
    prioritised = Rotator(retries_off(proxy.port), f"{queue_name}-p", retry_for=5)
    prioritised.push("warm-up")
    losses.lose(1)
    assert prioritised.push("urgent", priority=3) == 1
    assert Rotator(client, f"{queue_name}-p").stats().prioritized == 1
    assert proxy.stats["dropped_after"] == 5


def test_claims_and_acks_whose_replies_were_lost_are_sent_again_and_lose_nothing(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    """A claim whose reply was lost leaves its leases to nobody: they run out and those jobs
    come back, reclaimed, on their second delivery; an ack sent again is harmless. Every job
    is done once."""
    proxy, losses = lossy
    queue = Rotator(retries_off(proxy.port), queue_name, timeout=0.5, retry_for=5)
    queue.push(*(f"j{n}" for n in range(10)))
    losses.lose(1)
    first = queue.next(3)  # the first try's three are leased to nobody
    assert [job.id for job in first] == ["j3", "j4", "j5"]
    losses.lose(1)
    assert queue.ack(*first) == 3  # the first try accepted them; the second finds them done
    done = list(first)
    while len(done) < 10:
        jobs = queue.next(10, block=2)
        assert jobs, f"nothing to claim after {sorted(job.id for job in done)}"
        assert queue.ack(*jobs) == len(jobs)
        done += jobs
    assert Counter(job.id for job in done) == Counter(f"j{n}" for n in range(10))
    orphaned = {job.id: (job.reclaimed, job.deliveries) for job in done if job.reclaimed}
    assert orphaned == {"j0": (True, 2), "j1": (True, 2), "j2": (True, 2)}
    assert proxy.stats["dropped_after"] == 2
    assert drain(Rotator(client, queue_name)) == []


def test_the_async_rotator_sends_a_lost_reply_again_the_same_way(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    proxy, losses = lossy

    async def scenario() -> tuple[int, list[str]]:
        no_retries = AsyncRetry(NoBackoff(), 0)
        aclient = aredis.Redis(port=proxy.port, retry=no_retries, socket_timeout=2)
        queue = AsyncRotator(aclient, queue_name, retry_for=5)
        try:
            await queue.push("warm-up")
            losses.lose(1)
            pushed = await queue.push("a", "b")
            losses.lose(1)
            jobs = await queue.next(5)
            return pushed, [job.id for job in jobs]
        finally:
            await aclient.aclose()

    pushed, claimed = asyncio.run(scenario())
    assert pushed == 2
    assert claimed == []  # the first try took all three; they come back after the lease
    assert proxy.stats["dropped_after"] == 2
    stats = Rotator(client, queue_name).stats()
    assert (stats.pushed, stats.pending, stats.in_flight) == (3, 0, 3)


def test_a_buffered_producers_flush_whose_reply_was_lost_pushes_nothing_twice(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    proxy, losses = lossy
    queue = retrying(proxy, queue_name)
    with queue.producer(max_batch=100, max_delay=60) as producer:
        losses.lose(2)  # the first two calls of 100, sent as soon as they are full
        producer.push(*(f"j{n}" for n in range(250)))
        producer.flush()
    assert proxy.stats["dropped_after"] == 2
    waiting = ring_ids(client, queue_name)
    assert max(waiting.values()) == 1
    assert len(waiting) == 251


# -- topics ------------------------------------------------------------------------------------


def topic_through(proxy: FaultProxy, name: str, *groups: str) -> Topic:
    """Topic ``name`` through ``proxy`` with ``retry_for=5`` (redis-py's retries off), its
    ``groups`` subscribed and one message "warm-up" published (the groups read, the module
    loaded: no call below is refused and sent again for that)."""
    topic = Topic(retries_off(proxy.port), name, retry_for=5)
    for group in groups:
        topic.subscribe(group)
    topic.publish("warm-up")
    return topic


def group_messages(client: redis.Redis, topic: str, group: str) -> Counter[str]:
    """The payloads waiting in ``group``'s ring, with how many copies of each message."""
    keys = Topic(client, topic).keys
    ring = keys.group(group).ring
    waiting = [text(e) for e in client.lrange(ring, 0, -1) if b"*" not in e]
    bodies = client.hmget(keys.bodies, waiting) if waiting else []
    return Counter(text(body) for body in bodies if body is not None)


def test_with_retry_for_a_publish_goes_as_tpublish_chunk_under_a_marker_of_its_own(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name, retry_for=5)
    topic.subscribe("g")
    with monitored(client) as seen:
        assert len(topic.publish_many((f"m{n}" for n in range(2500)), chunk=1000)) == 2500
        topic.publish("x")
    calls = [line for line in seen if queue_name in line and " tpublish" in line]
    chunks = [line.split(" tpublish_chunk ")[1].split(" ")[0] for line in calls]
    assert chunks == ["0", "1", "2", "0"]
    markers = sorted(client.scan_iter(f"rotator:{{{queue_name}}}:publish:*"))
    assert len(markers) == 2  # one a publish call, whatever its chunks
    assert sorted(client.hgetall(marker)[b"chunks"] for marker in markers) == [b"1", b"3"]
    assert all(0 < client.pttl(marker) <= MARKER_TTL * 1000 for marker in markers)
    assert topic.group("g").retry_for == 5  # its groups' default
    assert topic.group("g", retry_for=0).retry_for == 0
    plain = Topic(client, queue_name)
    with monitored(client) as seen:
        plain.publish("y")
    assert [line for line in seen if queue_name in line and " tpublish " in line]


@pytest.mark.cluster
def test_on_a_cluster_a_publish_goes_under_a_marker_in_the_topics_slot(
    cluster: ClusterProcess, queue_name: str
) -> None:
    client = redis.RedisCluster.from_url(cluster.nodes[0].url)
    try:
        topic = Topic(client, queue_name, retry_for=5)
        topic.subscribe("g")
        ids = topic.publish_many(["a", "b"])
        (marker,) = client.scan_iter(match=topic.keys.publish_marker("*"))
        assert key_slot(marker) == key_slot(topic.keys.all[0].encode())
        jobs = topic.group("g").next(5)
        assert [(job.id, job.payload) for job in jobs] == [(ids[0], b"a"), (ids[1], b"b")]
    finally:
        client.close()


def test_a_publish_whose_reply_was_lost_is_sent_again_and_publishes_nothing_twice(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    proxy, losses = lossy
    topic = topic_through(proxy, queue_name, "a", "b")
    losses.lose(1)
    ids = topic.publish_many(["x", "y"])
    assert [message_seq(i) for i in ids] == [2, 3]  # the ids the first try published
    losses.lose(1, skip=1)  # a publish of three chunks whose second reply is lost
    more = topic.publish_many((f"m{n}" for n in range(2500)), chunk=1000)
    assert [message_seq(i) for i in more] == list(range(4, 2504))
    assert proxy.stats["dropped_after"] == 2
    assert topic.stats().last_seq == 2503
    everything = {"warm-up", "x", "y", *(f"m{n}" for n in range(2500))}
    for group in ("a", "b"):
        waiting = group_messages(client, queue_name, group)
        assert max(waiting.values()) == 1
        assert set(waiting) == everything


def test_without_retry_for_redis_pys_own_retry_publishes_a_lost_reply_twice(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    """The control: redis-py's default retries send the publish again; it is published
    twice, under two ids."""
    proxy, losses = lossy
    topic = Topic(redis.Redis(port=proxy.port, socket_timeout=2), queue_name)
    topic.subscribe("a")
    topic.publish("warm-up")
    losses.lose(1)
    assert message_seq(topic.publish("x")) == 3
    assert proxy.stats["dropped_after"] == 1
    assert group_messages(client, queue_name, "a")["x"] == 2


def test_a_subscribe_whose_reply_was_lost_raises_and_ran_once(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    """Not sent again: a second try would find the group registered and skip the replay of
    the retained messages that start="earliest" asks for."""
    proxy, losses = lossy
    topic = topic_through(proxy, queue_name, "a")
    losses.lose(1)
    with pytest.raises(redis.ConnectionError):
        topic.subscribe("b", start="earliest")
    assert Topic(client, queue_name).groups() == ["a", "b"]


def test_a_topic_groups_claims_and_acks_whose_replies_were_lost_lose_nothing(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    proxy, losses = lossy
    topic = topic_through(proxy, queue_name, "a")
    topic.publish_many(f"m{n}" for n in range(9))
    group = topic.group("a", timeout=0.5)
    losses.lose(1)
    first = group.next(3)  # the first try's three are leased to nobody
    assert [job.payload for job in first] == [b"m2", b"m3", b"m4"]
    done: list[Any] = []
    jobs = first
    while len(done) < 10:
        losses.lose(1)
        assert group.ack(*jobs) == len(jobs)  # the first try accepted them
        done += jobs
        jobs = group.next(10, block=2)
        assert jobs or len(done) == 10, f"nothing to claim after {[j.payload for j in done]}"
    sent = [b"warm-up", *(f"m{n}".encode() for n in range(9))]
    assert Counter(job.payload for job in done) == Counter(sent)
    orphaned = {job.payload: job.deliveries for job in done if job.reclaimed}
    assert orphaned == {b"warm-up": 2, b"m0": 2, b"m1": 2}
    assert proxy.stats["dropped_after"] >= 3


def test_the_async_topic_sends_a_lost_publish_again_the_same_way(
    lossy: tuple[FaultProxy, LostReplies], queue_name: str, client: redis.Redis
) -> None:
    proxy, losses = lossy

    async def scenario() -> list[str]:
        no_retries = AsyncRetry(NoBackoff(), 0)
        aclient = aredis.Redis(port=proxy.port, retry=no_retries, socket_timeout=2)
        topic = AsyncTopic(aclient, queue_name, retry_for=5)
        try:
            await topic.subscribe("a")
            await topic.publish("warm-up")
            losses.lose(1)
            ids = await topic.publish_many(["x", "y"])
            assert (await topic.group("a").stats()).pending == 3
            return ids
        finally:
            await aclient.aclose()

    ids = asyncio.run(scenario())
    assert [message_seq(i) for i in ids] == [2, 3]
    assert proxy.stats["dropped_after"] == 1
    assert set(group_messages(client, queue_name, "a").values()) == {1}


# -- restarts and outages -------------------------------------------------------------------


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[ServerProcess]:
    """A Valkey server of the test's own, AOF always: it may be killed and started again."""
    config = {"appendonly": "yes", "appendfsync": "always"}
    with ServerProcess("valkey", tmp_path, config) as server:
        yield server


@contextmanager
def down_for(server: ServerProcess, seconds: float) -> Iterator[None]:
    """``server`` killed (``kill -9``) as the block begins, and started again on its port
    ``seconds`` later while the block runs: the block's calls meet it down."""
    server.kill9()
    with later(seconds, server.start):
        yield


def test_calls_made_while_the_server_restarts_go_through_once_it_is_back(
    restartable: ServerProcess, queue_name: str
) -> None:
    """kill -9, then the server back on its port 1.5 s later: a push and a blocked claim
    made meanwhile wait for it instead of failing, and the push lands once."""
    queue = Rotator.from_url(restartable.url, queue_name, retry_for=20)
    queue.push("before")
    assert [job.id for job in queue.next(1)] == ["before"]

    with down_for(restartable, 1.5):
        began = time.monotonic()
        assert queue.push("during") == 1
        waited = time.monotonic() - began
    assert waited > 0.5  # it waited for the server, it did not fail
    (job,) = queue.next(1, block=5)
    assert job.id == "during"
    assert queue.stats().pending == 0


def test_async_calls_made_while_the_server_restarts_go_through_once_it_is_back(
    restartable: ServerProcess, queue_name: str
) -> None:
    async def scenario() -> list[str]:
        queue = AsyncRotator.from_url(restartable.url, queue_name, retry_for=20)
        try:
            await queue.push("before")
            with down_for(restartable, 1.0):
                assert await queue.push("during") == 1
            return [job.id for job in await queue.next(5)]
        finally:
            await queue.client.aclose()

    assert asyncio.run(scenario()) == ["before", "during"]


def test_a_call_gives_up_after_retry_for_and_raises_what_it_last_got(
    restartable: ServerProcess, queue_name: str
) -> None:
    queue = Rotator.from_url(restartable.url, queue_name, retry_for=0.5)
    queue.push("a")
    restartable.kill9()
    began = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        queue.push("b")
    took = time.monotonic() - began
    assert 0.5 <= took < 0.5 + CONNECT_TIMEOUT + 1.0  # retry_for, then one try at most


# -- the command line ---------------------------------------------------------------------------


def test_the_cli_takes_retry_for_and_its_variable_and_pushes_under_a_marker(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    ok(run("--url", server.url, "--retry-for", "5", "push", queue_name, "a", "b"))
    ok(run("--url", server.url, "push", queue_name, "c", env={"ROTATOR_RETRY_FOR": "5"}))
    ok(run("--url", server.url, "push", queue_name, "d"))  # off: a plain push, no marker
    markers = list(client.scan_iter(match=Rotator(client, queue_name).keys.push_marker("*")))
    assert len(markers) == 2
    assert ring_ids(client, queue_name) == Counter("abcd")
    for bad in ("-1", "3601", "soon"):
        assert_error(run("--retry-for", bad, "stats", queue_name), "--retry-for")


def test_a_cli_push_for_later_or_at_a_priority_goes_under_a_marker_with_retry_for(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    ok(run("--url", server.url, "--retry-for", "5", "push", queue_name, "a", "--delay", "60"))
    ok(run("--url", server.url, "--retry-for", "5", "push", queue_name, "b", "--priority", "4"))
    markers = list(client.scan_iter(match=Rotator(client, queue_name).keys.push_marker("*")))
    assert sorted(client.hgetall(marker)[b"pushed"] for marker in markers) == [b"1", b"1"]
    stats = Rotator(client, queue_name).stats()
    assert (stats.scheduled, stats.prioritized) == (1, 1)


def test_a_cli_push_made_while_the_server_restarts_lands_once(
    restartable: ServerProcess, queue_name: str
) -> None:
    with down_for(restartable, 1.0):
        pushed = run("--url", restartable.url, "--retry-for", "20", "push", queue_name, "x")
    assert ok(pushed).strip() == "1"
    with restartable.client() as client:
        assert ring_ids(client, queue_name) == Counter(["x"])


def test_the_cli_publishes_under_a_marker_with_retry_for(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    ok(run("--url", server.url, "topic", "subscribe", queue_name, "g"))
    ok(run("--url", server.url, "--retry-for", "5", "topic", "publish", queue_name, "a"))
    ok(run("--url", server.url, "topic", "publish", queue_name, "b"))  # off: no marker
    markers = list(client.scan_iter(match=Topic(client, queue_name).keys.publish_marker("*")))
    assert len(markers) == 1
    assert group_messages(client, queue_name, "g") == Counter("ab")
