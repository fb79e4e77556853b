"""A topic's publisher on a faulty network: with ``retry_for`` no message is published twice
and none is lost; without it, redis-py's own retries publish lost replies twice.

The publisher talks through a fault proxy that loses a tenth of the replies after the call ran
and drops a twentieth of the requests before it did. The Topic's retries are its own (redis-py's
off), so a publish sent again goes under the marker of its first try: the ids it returns are
the topic's seqs 1..N in order, each group receives each payload once, and the topic's last
seq is N. The groups are drained as the messages come, by one consumer each, on their own
connections without faults, so a duplicate or a gap is the publisher's doing. The control,
with redis-py's retries and no ``retry_for``, shows the duplicates the marker prevents.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import redis

from rotator import Topic
from rotator.topic import message_seq
from tests.chaos.conftest import on_the_oldest_too
from tests.chaos.eventlog import RETRIES, chaos_client
from tests.chaos.faultproxy import PASS, FaultProxy, Mode
from tests.chaos.harness import ChaosRun

AOF_EVERYSEC = {"appendonly": "yes", "appendfsync": "everysec"}
GROUPS = ("mail", "audit")
MESSAGES = 2000
BATCH = 20  # payloads a publish call

# Each try of a call is a new connection: its handshake's four requests (HELLO, CLIENT
# MAINT_NOTIFICATIONS, two CLIENT SETINFO) and the call each meet the proxy's faults, so a try
# fails about half the time, and a streak of 14 (10 s of pauses) came up in one run of 100
# calls. 30 s makes a streak that outlasts it about one in a billion.
RETRY_FOR = 30.0

MakeRun = Callable[..., ChaosRun]


class Drain(threading.Thread):
    """One group's consumer: claims and acks as messages come, until stopped; keeps each
    delivery's payload and whether it was a redelivery."""

    def __init__(self, client: redis.Redis, topic: str, group: str) -> None:
        super().__init__(name=f"drain-{group}", daemon=True)
        self.group = Topic(client, topic).group(group, timeout=30)
        self.payloads: Counter[bytes] = Counter()
        self.redelivered = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                jobs = self.group.next(100, block=0.2)
                for job in jobs:
                    assert job.payload is not None
                    self.payloads[job.payload] += 1
                    self.redelivered += job.deliveries > 1
                if jobs:
                    self.group.ack(*jobs)
        except BaseException as error:  # raised in the test by finish()
            self.error = error

    def finish(self) -> Counter[bytes]:
        self.stopping.set()
        self.join(10)
        assert not self.is_alive(), f"{self.name} did not stop"
        if self.error is not None:
            raise self.error
        return self.payloads


@dataclass
class Published:
    """What a publisher behind the fault proxy did: the ids its publishes returned, each
    group's payloads received, the redeliveries seen and the proxy's figures."""

    ids: list[str]
    received: dict[str, Counter[bytes]]
    redelivered: int
    proxy: dict[str, int]


def publish_through_faults(run: ChaosRun, retry_for: float) -> Published:
    """Topic "news" on a client behind a fault proxy of its own: the Topic's retries alone
    (redis-py's off) with ``retry_for``, else redis-py's default retries. Subscribes the
    groups, publishes MESSAGES payloads in calls of BATCH with the proxy's faults on, and
    drains every group meanwhile, on connections without faults."""
    proxy = FaultProxy(run.server.port, seed=run.rng.randrange(2**32))
    proxy.start()
    client = chaos_client(proxy.url, socket_timeout=1.0, retries=0 if retry_for else RETRIES)
    try:
        topic = Topic(client, "news", retry_for=retry_for)
        ids, received, redelivered = publish_and_drain(run, topic, proxy, resend=not retry_for)
    finally:
        client.close()
        proxy.stop()
    return Published(ids, received, redelivered, dict(proxy.stats))


def publish_and_drain(
    run: ChaosRun, topic: Topic, proxy: FaultProxy, *, resend: bool
) -> tuple[list[str], dict[str, Counter[bytes]], int]:
    """``resend``: a publish that raises a connection error is sent again, as an application
    without ``retry_for`` would (redis-py's own retries can all fail: each try's new
    connection meets the faults in its handshake too); else an error fails the test."""
    for group in GROUPS:
        topic.subscribe(group)
    drains = [Drain(run.admin(), topic.name, group) for group in GROUPS]
    for drain in drains:
        drain.start()
    sent = [f"m{n:06d}".encode() for n in range(MESSAGES)]
    ids: list[str] = []
    proxy.set_mode(Mode(drop_after=0.1, drop_before=0.05))
    try:
        for start in range(0, MESSAGES, BATCH):
            for attempt in itertools.count():
                try:
                    ids += topic.publish_many(sent[start : start + BATCH])
                    break
                except (redis.ConnectionError, redis.TimeoutError):
                    if not resend or attempt == 20:
                        raise
    finally:
        proxy.set_mode(PASS)
    received: dict[str, Counter[bytes]] = {}
    published = Topic(run.admin(), topic.name).stats().last_seq  # copies among them
    for drain in drains:
        deadline = 150  # x 0.1 s: the drains catch up with the last publish (every message)
        while drain.payloads.total() < published and deadline and drain.is_alive():
            deadline -= 1
            drain.stopping.wait(0.1)
        received[drain.group.group] = drain.finish()
    return ids, received, sum(drain.redelivered for drain in drains)


@on_the_oldest_too
@pytest.mark.chaos
@pytest.mark.timeout(120)
def test_with_retry_for_lost_publish_replies_publish_nothing_twice(chaos: MakeRun) -> None:
    run = chaos(AOF_EVERYSEC)
    done = publish_through_faults(run, retry_for=RETRY_FOR)
    assert done.proxy["dropped_after"] > 5  # replies lost after the publish ran
    assert done.proxy["dropped_before"] > 0
    assert [message_seq(i) for i in done.ids] == list(range(1, MESSAGES + 1))  # none twice
    assert Topic(run.admin(), "news").stats().last_seq == MESSAGES
    everything = Counter(f"m{n:06d}".encode() for n in range(MESSAGES))
    assert done.received == {group: everything for group in GROUPS}  # each once, none lost
    assert done.redelivered == 0


@pytest.mark.chaos
@pytest.mark.timeout(120)
def test_without_retry_for_redis_pys_retries_publish_lost_replies_twice(chaos: MakeRun) -> None:
    """The control: the same faults, redis-py's default retries, no marker."""
    run = chaos(AOF_EVERYSEC)
    done = publish_through_faults(run, retry_for=0)
    twice = Topic(run.admin(), "news").stats().last_seq - MESSAGES
    assert twice > 0, done.proxy  # publishes that ran twice, under new ids
    assert len(done.ids) == MESSAGES  # the caller sees one id a payload: copies are silent
    for group in GROUPS:
        assert set(done.received[group]) == {f"m{n:06d}".encode() for n in range(MESSAGES)}
        assert sum(done.received[group].values()) == MESSAGES + twice
