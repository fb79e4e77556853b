"""A topic's log against a model of its retained messages, on Redis 7 and Valkey 8.

A Hypothesis state machine publishes (batches of 1..40 split into calls of 1, 3 or 1000, under
retention counts from 1 to 60, plain or under a marker as ``retry_for`` sends them), sends a
marked publish's last call again (as after a lost reply: it must publish nothing and reply with
the same ids, however many calls came between), trims, replays from a seq into a group, drains
that group, and may start from a log written an entry a message, as a module before runs wrote
it. The model is the list of retained messages (seq, id, body) and the group's pending ids.
Compared after every step: the bodies hash (exactly the retained messages), the topic's seq and
bytes, `stats()`, and the log itself: its runs cover exactly the retained seqs, in order and
without overlap, each run's messages share their ms, and a run's byte count is the sum of its
bodies (a run of the older kind has none). Rules also compare `tseek` at the times of the
retained messages (and a ms either side), Spark's `read_messages` over a seq range that may
begin before the oldest retained seq, and every drain of the group (ids in order, each with its
body while retained, None once retention dropped it), whose backlog bound (the retained count,
16 over let be, at most the call's messages plus 16 dropped) is part of the model.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import cast

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rotator import Job, Retention, Topic
from rotator.defaults import MAX_PUBLISH
from tests.servers import ServerProcess

try:
    from rotator.spark_source import read_messages
except ImportError as missing:
    pytest.fail(
        f"{missing}: the topic model reads like Spark does: pip install -e '.[dev]'",
        pytrace=False,
    )

MARGIN = 16  # how far past its bound a group's backlog may be (LIMIT.trim_extra)
GROUP = "r"
RUN = re.compile(rb"^(\d+)-(\d+)(?:-(\d+))?$")

PROFILE = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
BODIES = st.binary(max_size=5)


@dataclass(frozen=True)
class Message:
    seq: int
    id: str
    body: bytes

    @property
    def ms(self) -> int:
        return int(self.id.partition("-")[0])


class TopicMachine(RuleBasedStateMachine):
    client: redis.Redis  # set by on_server()

    def __init__(self) -> None:
        super().__init__()
        self.name = f"tm-{uuid.uuid4().hex[:12]}"
        self.topic = Topic(self.client, self.name, retention=Retention(count=1000))
        self.retained: list[Message] = []
        self.last_seq = 0
        self.pending: list[str] = []  # the group's ids, oldest first (nothing leased)
        self.body: dict[str, bytes] = {}  # every message's body, retained or not
        # The last call of the last publish under a marker: marker, chunk, ARGV after, ids.
        self.marked: tuple[str, int, list[bytes | int], list[str]] | None = None
        self.markers: set[bytes] = set()

    def teardown(self) -> None:
        self.topic.delete()
        self.client.delete(*self.topic.keys.all, *self.markers)

    def with_retention(self, keep: int, retry_for: float = 0.0) -> Topic:
        return Topic(self.client, self.name, retention=Retention(count=keep), retry_for=retry_for)

    @initialize(old=st.lists(BODIES, max_size=4))
    def start(self, old: list[bytes]) -> None:
        """Messages an earlier module published (an entry "<ms>-<seq>" each), then a group."""
        keys, ms = self.topic.keys, int(self.client.time()[0]) * 1000 - 5000
        for seq, body in enumerate(old, 1):
            message = Message(seq, f"{ms}-{seq}", body)
            self.client.zadd(keys.log, {message.id: seq})
            self.client.hset(keys.bodies, message.id, body)
            self.retained.append(message)
            self.body[message.id] = body
        if old:
            self.last_seq = len(old)
            self.client.hset(
                keys.all[0], mapping={"seq": len(old), "ms": ms, "bytes": sum(map(len, old))}
            )
        assert self.topic.subscribe(GROUP)

    @rule(
        bodies=st.lists(BODIES, min_size=1, max_size=40),
        chunk=st.sampled_from([1, 3, MAX_PUBLISH]),
        keep=st.sampled_from([1, 5, 20, 60]),
        marked=st.booleans(),
    )
    def publish(self, bodies: list[bytes], chunk: int, keep: int, marked: bool) -> None:
        ids = self.with_retention(keep, retry_for=5 if marked else 0).publish_many(
            bodies, chunk=chunk
        )
        assert len(ids) == len(bodies)
        if marked:  # its marker: the one key under publish: that is new
            (marker,) = set(self.client.scan_iter(self.topic.keys.publish_marker("*"))) - (
                self.markers
            )
            self.markers.add(marker)
            last = (len(bodies) - 1) // chunk
            argv: list[bytes | int] = [last, 60_000, keep, 0, *bodies[last * chunk :]]
            self.marked = (marker.decode(), last, argv, ids[last * chunk :])
        for at in range(0, len(bodies), chunk):
            part = list(zip(ids[at : at + chunk], bodies[at : at + chunk], strict=True))
            for message_id, body in part:
                self.last_seq += 1
                assert message_id.endswith(f"-{self.last_seq}"), (message_id, self.last_seq)
                self.retained.append(Message(self.last_seq, message_id, body))
                self.body[message_id] = body
            # Each call drops at most its messages plus 16 beyond retention, oldest first...
            excess = len(self.retained) - keep
            del self.retained[: max(0, min(excess, len(part) + MARGIN))]
            # ...and bounds the group's backlog by the retained count, 16 over let be.
            self.pending += [message_id for message_id, _ in part]
            over = len(self.pending) - keep
            if over > MARGIN:
                del self.pending[: min(over, len(part) + MARGIN)]
        assert len({Message(0, i, b"").ms for i in ids[:chunk]}) == 1  # a call shares its ms

    @precondition(lambda self: self.marked is not None)
    @rule()
    def publish_sent_again(self) -> None:
        """The last call of the last marked publish, sent again: nothing is published (the
        invariants compare the whole topic with the model) and the reply is its ids."""
        assert self.marked is not None
        marker, _, argv, ids = self.marked
        keys = (*self.topic.keys.all, *self.topic.keys.group(GROUP).all, marker)
        reply = self.topic._call(keys, "tpublish_chunk", *argv)
        assert [i.decode() for i in reply] == ids

    @rule(keep=st.sampled_from([1, 5, 20]))
    def trim(self, keep: int) -> None:
        dropped = max(0, len(self.retained) - keep)
        assert self.with_retention(keep).trim() == dropped
        del self.retained[:dropped]

    @rule(back=st.integers(0, 50))
    def replay(self, back: int) -> None:
        first = max(1, self.last_seq - back)
        pushed = self.topic.replay(GROUP, from_id=f"0-{first}")
        again = [m.id for m in self.retained if m.seq >= first]
        assert pushed == len(again)
        self.pending += again

    @rule()
    def drain(self) -> None:
        group = self.topic.group(GROUP, timeout=60)
        got: list[Job] = []
        while jobs := group.next(100):
            got += jobs
            assert group.ack(*jobs) == len(jobs)
        retained = {m.id for m in self.retained}
        assert [(job.id, job.payload) for job in got] == [
            (i, self.body[i] if i in retained else None) for i in self.pending
        ]
        self.pending = []

    @precondition(lambda self: bool(self.retained))
    @rule(pick=st.integers(0, 10**6), shift=st.sampled_from([-1, 0, 1]))
    def seek(self, pick: int, shift: int) -> None:
        at = self.retained[pick % len(self.retained)].ms + shift
        found = self.topic._call(self.topic.keys.all, b"tseek", at)
        later = [m.seq for m in self.retained if m.ms >= at]
        assert found == (later[0] if later else self.last_seq + 1)

    @rule(back=st.integers(0, 60), span=st.integers(0, 60))
    def read_like_spark(self, back: int, span: int) -> None:
        first = max(1, self.last_seq - back)
        last = first + span
        rows, gaps = [], []
        for batch, page_gaps in read_messages(self.client, self.topic.keys, first, last):
            rows += [(r["id"], r["seq"], r["ms"], r["payload"]) for r in batch.to_pylist()]
            gaps += page_gaps
        inside = [m for m in self.retained if first <= m.seq <= last]
        assert rows == [(m.id, m.seq, m.ms, m.body) for m in inside]
        # The seqs missing below the oldest retained one (and past the last published).
        missing = sorted(set(range(first, last + 1)) - {m.seq for m in inside})
        assert sum(b - a + 1 for a, b in gaps) == len(missing)

    @invariant()
    def the_topic_holds_exactly_the_retained_messages(self) -> None:
        keys = self.topic.keys
        bodies = cast("dict[bytes, bytes]", self.client.hgetall(keys.bodies))
        assert bodies == {m.id.encode(): m.body for m in self.retained}
        meta = cast("dict[bytes, bytes]", self.client.hgetall(keys.all[0]))
        assert int(meta.get(b"seq", 0)) == self.last_seq
        assert int(meta.get(b"bytes", 0)) == sum(len(m.body) for m in self.retained)
        stats = self.topic.stats()
        assert (stats.retained, stats.last_seq) == (len(self.retained), self.last_seq)

    @invariant()
    def the_logs_runs_cover_the_retained_seqs_in_order(self) -> None:
        entries = cast(
            "list[tuple[bytes, float]]",
            self.client.zrange(self.topic.keys.log, 0, -1, withscores=True),
        )
        by_seq = {m.seq: m for m in self.retained}
        covered: list[int] = []
        for i, (member, score) in enumerate(entries):
            found = RUN.match(member)
            assert found, member
            ms, first, size = int(found[1]), int(score), found[3]
            assert int(found[2]) == first, member
            end = int(entries[i + 1][1]) - 1 if i + 1 < len(entries) else self.last_seq
            run = [by_seq[seq] for seq in range(first, end + 1)]
            assert {m.ms for m in run} == {ms}, member
            if size is not None:
                assert int(size) == sum(len(m.body) for m in run), member
            covered += [m.seq for m in run]
        assert covered == [m.seq for m in self.retained]


def on_server(client: redis.Redis) -> type[TopicMachine]:
    return type("TopicMachineOnServer", (TopicMachine,), {"client": client})


@pytest.mark.timeout(300)
def test_a_topics_log_behaves_like_the_model(server: ServerProcess) -> None:
    with server.client() as client:
        run_state_machine_as_test(on_server(client), settings=PROFILE)


def test_the_run_pattern_reads_both_kinds_of_entry() -> None:
    assert [m and m.groups() for m in map(RUN.match, [b"17-4-9", b"17-4", b"17-4-", b"x"])] == [
        (b"17", b"4", b"9"),
        (b"17", b"4", None),
        None,
        None,
    ]
