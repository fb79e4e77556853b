"""Bad input gets a typed error and leaves every key of the queue exactly as it was."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import redis

from rotator import (
    InvalidArgument,
    InvalidJobId,
    InvalidQueueName,
    InvalidToken,
    Rotator,
    RotatorError,
    WrongKeyType,
)
from rotator.keys import KEY_ROLES
from rotator.script import module_source
from tests.helpers import drain, snapshot


@pytest.fixture
def q(client: redis.Redis, queue_name: str) -> Rotator:
    queue = Rotator(client, queue_name)
    queue.push("existing-1", "existing-2")
    queue.next()  # one leased, one pending: a queue with some state to protect
    return queue


BAD_IDS: list[Any] = ["a*5", "", "*lap", "x" * 1025, None, True, 1.5, {"a": 1}, b"bytes"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_an_invalid_id_is_refused_and_nothing_is_written(
    client: redis.Redis, q: Rotator, bad: Any
) -> None:
    before = snapshot(client, q)
    with pytest.raises(InvalidJobId):
        q.push(bad)
    with pytest.raises(InvalidJobId):
        q.push("good-1", bad, "good-2")  # the whole batch is refused
    assert snapshot(client, q) == before


def test_a_long_batch_with_one_bad_id_at_the_end_writes_nothing(
    client: redis.Redis, q: Rotator
) -> None:
    before = snapshot(client, q)
    with pytest.raises(InvalidJobId):
        q.push(*[f"ok-{i}" for i in range(2500)], "bad*id")
    assert snapshot(client, q) == before


def test_ids_may_be_any_text_without_a_star(q: Rotator) -> None:
    odd: list[str | int] = ["with space", "ünïcødé", "x" * 1024, "a\nb", "{braces}", 42]
    assert q.push(*odd) == len(odd)
    assert drain(q)[1:] == ["with space", "ünïcødé", "x" * 1024, "a\nb", "{braces}", "42"]


def test_a_batch_larger_than_one_call_is_split_and_delivered_in_order(q: Rotator) -> None:
    ids = [str(i) for i in range(12_000)]
    assert q.push(*ids) == 12_000
    assert drain(q, count=1000)[1:] == ids


BAD_NUMBERS: list[Any] = [0, -1, math.nan, math.inf, True, "5", None]


@pytest.mark.parametrize("bad", BAD_NUMBERS, ids=repr)
def test_bad_timeouts_are_refused(client: redis.Redis, queue_name: str, bad: Any) -> None:
    with pytest.raises(InvalidArgument):
        Rotator(client, queue_name, timeout=bad)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda q: q.next(0), InvalidArgument),
        (lambda q: q.next(1001), InvalidArgument),
        (lambda q: q.next(2.5), InvalidArgument),
        (lambda q: q.next(1, block=-1), InvalidArgument),
        (lambda q: q.next(1, block=math.nan), InvalidArgument),
        (lambda q: q.nack("x*1.1.1", delay=-1), InvalidArgument),
        (lambda q: q.nack("x*1.1.1", delay=math.inf), InvalidArgument),
        (lambda q: q.extend("x*1.1.1", 0), InvalidArgument),
        (lambda q: q.extend("x*1.1.1", 10**9), InvalidArgument),
        (lambda q: q.ack("not-a-token"), InvalidToken),
        (lambda q: q.ack("x*nan.1.1"), InvalidToken),
        (lambda q: q.ack("x*1e3.1.1"), InvalidToken),
        (lambda q: q.ack("*1.1.1"), InvalidToken),
        (lambda q: q.next(1, ack=["x*1.1.1", "broken"]), InvalidToken),
        (lambda q: q.dead(-1), InvalidArgument),
        (lambda q: q.peek(0), InvalidArgument),
        (lambda q: q.requeue_dead(count=0), InvalidArgument),
    ],
)
def test_bad_arguments_raise_typed_errors_and_change_nothing(
    client: redis.Redis,
    q: Rotator,
    call: Callable[[Rotator], object],
    error: type[RotatorError],
) -> None:
    before = snapshot(client, q)
    with pytest.raises(error):
        call(q)
    assert snapshot(client, q) == before


@pytest.mark.parametrize(
    "options",
    [{"budget": 0}, {"budget": 1_001}, {"max_deliveries": 0}, {"max_deliveries": -3}],
    ids=repr,
)
def test_bad_queue_options_are_refused(
    client: redis.Redis, queue_name: str, options: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgument):
        Rotator(client, queue_name, **options)


@pytest.mark.parametrize("name", ["", "a}b", "a{b", "a*", "q?", "[x]", "a b", "a\\b", "x" * 129])
def test_queue_names_that_could_break_the_hash_tag_or_acl_patterns_are_refused(
    client: redis.Redis, name: str
) -> None:
    with pytest.raises(InvalidQueueName):
        Rotator(client, name)


# Which calls touch which key: a call checks the type of every key it reads or writes.
TOUCHED_BY = {
    "ring": {"push", "next", "ack", "stats"},
    "done": {"next", "ack", "stats"},
    "marks": {"next", "stats"},
    "revoked": {"next", "ack"},
    "dead": {"next", "stats"},
    "meta": {"push", "next", "stats"},
    "pushlog": {"push", "stats"},
}


@pytest.mark.parametrize("role", sorted(TOUCHED_BY))
def test_a_key_of_the_wrong_type_is_reported_and_nothing_is_written(
    client: redis.Redis, q: Rotator, role: str
) -> None:
    key = q.keys.all[KEY_ROLES.index(role)]
    client.delete(key)
    client.set(key, "someone else's value")
    before = snapshot(client, q)
    calls: dict[str, Callable[[], object]] = {
        "push": lambda: q.push("new"),
        "next": lambda: q.next(5),
        "ack": lambda: q.ack("existing-1*1.1.1"),
        "stats": q.stats,
    }
    for name in sorted(TOUCHED_BY[role]):
        with pytest.raises(WrongKeyType, match=re.escape(key)):
            calls[name]()
        assert snapshot(client, q) == before, name


@pytest.mark.parametrize("count", [1, 3])
def test_a_wrong_wake_list_refuses_a_claim_that_would_wake_before_it_pops(
    client: redis.Redis, queue_name: str, count: int
) -> None:
    """The wake list is written only by a claim that makes the earliest deadline (an idle
    consumer then wakes to wait for it), so only such a claim checks its type: before it
    pops the ring, or the popped ids would be lost with the refusal (a bug once, on the
    short way of a worker's loop: the module called as redis-cli would, by EVAL)."""
    q = Rotator(client, queue_name)
    q.push(*[f"job-{i}" for i in range(10)])
    keys = q.keys.all

    def next_packed(lease_ms: int, *acks: str) -> list[Any]:
        reply = client.eval(module_source(), len(keys), *keys, "next_packed", count, lease_ms,
                            1000, 0, *acks)  # fmt: skip
        assert isinstance(reply, list)
        return reply

    element = next_packed(100_000)[3].decode()  # the earliest deadline is 100 s away
    batch_ack = element[: element.index("*", 1)] + f"/{count}"
    client.set(keys[KEY_ROLES.index("wake")], "someone else's value")
    before = snapshot(client, q)
    with pytest.raises(redis.ResponseError, match=r"ROTATOR_WRONGTYPE .*:wake "):
        next_packed(1_000, batch_ack)  # acks the lone batch, and leases for 1 s
    assert snapshot(client, q) == before
