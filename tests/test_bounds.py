"""Bounded everywhere: each way an adversarial run made the queue lose a job, grow without
bound, fail after a partial write or hold the server too long, as a test on both servers.

Call time is asserted by counting work (the commands a call runs, from INFO commandstats),
never by timing; the bench measures it with SLOWLOG.
"""

from __future__ import annotations

import time

import pytest
import redis

from rotator import (
    InvalidToken,
    Job,
    ProtocolError,
    Rotator,
    Topic,
    WrongKeyType,
)
from rotator.keys import queue_keys
from rotator.script import module_caller, run
from tests.helpers import snapshot


def command_calls(client: redis.Redis, command: str) -> int:
    """How many times the server ran ``command``, scripts' calls included."""
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0


def seq_of(token: str) -> int:
    return int(token.rsplit(".", 1)[1])


# -- jobs lost or data deleted -----------------------------------------------------------------


def test_tokens_never_repeat_after_the_queue_is_deleted_and_made_again(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=60)
    q.push("a")
    (old,) = q.next()
    assert q.delete()
    q.push("a")
    (new,) = q.next()
    assert seq_of(new.token) > seq_of(old.token)
    # The late ack of the old delivery does not complete the new one.
    q.ack(old)
    q.sweep()
    assert q.stats().in_flight == 1
    assert q.ack(new) == 1


def test_a_batch_ack_naming_fewer_jobs_than_its_batch_completes_none(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=0.2)
    q.push(*(f"j{n}" for n in range(10)))
    jobs = q.next(10)
    stamp = jobs[0].token.split("*", 1)[1][:-5]
    assert q._call(b"ack", f"*{stamp}/1".encode()) == 1  # the module cannot tell yet
    time.sleep(0.3)
    again = q.next(10)
    assert sorted(job.id for job in again) == sorted(job.id for job in jobs)
    assert all(job.reclaimed for job in again)


def test_keys_in_the_wrong_slots_are_refused_before_any_write(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=30)
    q.push(*(f"j{n}" for n in range(100)))
    q.next(100)
    before = snapshot(client, q)
    keys = list(q.keys.all)
    swapped = [keys[7], *keys[1:7], keys[0], *keys[8:]]  # the ring in the wake slot
    script = module_caller(client, False)
    with pytest.raises(ProtocolError, match="ROTATOR_KEYS"):
        run(script, tuple(swapped), [b"next", 1, 30000, 1000, 0])
    other = queue_keys(queue_name + "-other").all
    with pytest.raises(ProtocolError, match="ROTATOR_KEYS"):
        run(script, (*keys[:9], other[9]), [b"stats"])
    assert snapshot(client, q) == before


def test_an_idle_next_refuses_a_wake_key_of_another_type(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=30)
    q.push("a")
    q.ack(*q.next())
    client.delete(q.keys.wake)
    client.set(q.keys.wake, "not a list")
    with pytest.raises(WrongKeyType):
        q.next()
    assert client.get(q.keys.wake) == b"not a list"


@pytest.mark.parametrize("token", [b"*x*1732233600000.1.100000", b"*", b"**1.1.1", b"*a/2"])
def test_a_token_whose_id_starts_with_a_star_is_a_typed_error(
    client: redis.Redis, queue_name: str, token: bytes
) -> None:
    q = Rotator(client, queue_name, timeout=30)
    q.push("a")
    q.next()
    before = snapshot(client, q)
    with pytest.raises(InvalidToken):
        q._call(b"ack", token)
    with pytest.raises(InvalidToken):
        q._call(b"nack", 0, token)
    with pytest.raises(InvalidToken):
        q._call(b"extend", 1000, token)
    assert snapshot(client, q) == before


def test_a_payload_pushed_twice_stays_until_its_last_delivery_is_done(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=30, payloads=True)
    q.push_payloads({"a": b"body"})
    q.push_payloads({"a": b"body"})  # a push retried after a lost reply
    (first,) = q.next()
    assert first.payload == b"body"
    assert q.ack(first) == 1
    (second,) = q.next()
    assert second.payload == b"body"
    assert q.ack(second) == 1
    assert client.hlen(q.keys.payloads) == 0  # nothing left behind


# -- calls that failed after writing (Lua's unpack limit) -------------------------------------


def test_failing_more_jobs_than_unpack_allows_is_whole(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=30, item_stats=True)
    q.push_many((f"j{n}" for n in range(6000)), chunk=5000)
    jobs: list[Job] = []
    while len(jobs) < 6000:
        jobs += q.next(1000)
    assert q.fail(*jobs, error="boom") == 6000
    stats = q.item_stats("j0", "j5999")
    assert [s.last_error if s else None for s in stats] == ["boom", "boom"]


def test_acking_thousands_of_batches_at_once_is_whole(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, timeout=30)
    q.push_many(f"j{n}" for n in range(9000))
    jobs = []
    for _ in range(4500):
        jobs += q.next(2)
    assert q.ack(*jobs) == 9000
    assert q.sweep() == 9000
    assert q.stats().length == 0


def test_revoked_tokens_are_forgotten_after_the_fencing_window_a_little_per_call(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=30)
    q.configure(fence_window=1.0)
    q.push_many(f"j{n}" for n in range(3000))
    for _ in range(3):
        q.nack(*q.next(1000))
    revoked = q.keys.all[5]
    assert client.zcard(revoked) >= 3000
    time.sleep(1.1)
    for _ in range(3):  # each call forgets at most 1000 beyond what it adds
        q.sweep()
    # Left: only what the sweeps revoked themselves (nacked batches they broke up: at most the
    # three, fewer when a claim's walk broke one up before the window ended).
    fresh = time.time() * 1000 - 1000
    scores = client.zrange(revoked, 0, -1, withscores=True)
    assert 1 <= len(scores) <= 3
    assert all(float(pair[1]) >= fresh for pair in scores)


def test_revoked_tokens_are_capped_by_count(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, timeout=30)
    q.configure(fence_max=1000)
    q.push_many(f"j{n}" for n in range(3000))
    for _ in range(3):
        q.nack(*q.next(1000))
    for _ in range(3):
        q.sweep()
    assert client.zcard(q.keys.all[5]) == 1000


def test_dead_letters_are_capped_by_count_and_age(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, timeout=0.05, max_deliveries=1)
    q.configure(dead_max=100)
    q.push_many(f"j{n}" for n in range(150))
    q.next(150)
    time.sleep(0.1)
    q.next(150)
    q.next(150)
    letters = q.dead(0, 1000)
    assert len(letters) == 100
    assert letters[-1].id == "j149"  # the newest are kept
    q.configure(dead_max_age=1.0)
    time.sleep(1.1)
    q.push("y")
    q.next()
    assert q.dead(0, 1000) == []


def test_a_dead_letter_far_down_the_list_is_requeued_by_id(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=30)
    now_ms = int(time.time() * 1000)
    letters = [f"max_deliveries*1*{now_ms}*j{n}" for n in range(25_000)]
    for start in range(0, len(letters), 5000):
        client.rpush(q.keys.dead, *letters[start : start + 5000])
    assert q.requeue_dead("j24999") == 1
    assert [job.id for job in q.next()] == ["j24999"]
    assert client.llen(q.keys.dead) == 24_999


def test_stats_reads_no_hash_whole_however_many_jobs_are_deferred(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=30)
    q.push_many(f"j{n}" for n in range(3000))
    nacked = 0
    while nacked < 3000:
        nacked += q.nack(*q.next(1000), delay=60)
    whole_reads = sum(command_calls(client, c) for c in ("hvals", "hgetall", "smembers"))
    stats = q.stats()
    assert (stats.deferred, stats.pending, stats.in_flight) == (3000, 0, 0)
    assert sum(command_calls(client, c) for c in ("hvals", "hgetall", "smembers")) == whole_reads


def test_topic_stats_are_counters_too(client: redis.Redis, queue_name: str) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("a")
    topic.publish_many([b"m"] * 10)
    group = topic.group("a", timeout=30)
    group.nack(*group.next(10), delay=60)
    whole_reads = command_calls(client, "hvals")
    assert topic.stats().groups["a"].deferred == 10
    assert command_calls(client, "hvals") == whole_reads


@pytest.mark.parametrize("payloads", [False, True])
def test_a_push_onto_a_full_wake_list_writes_no_wake_token(
    client: redis.Redis, queue_name: str, payloads: bool
) -> None:
    """Nobody waits on a busy queue's wake list, so it stays full (16 tokens); a push then
    adds no token and trims nothing, where it used to push one and trim it off again."""
    q = Rotator(client, queue_name, timeout=30, payloads=payloads)
    wake = q.keys.wake
    for n in range(20):
        q.push(f"j{n}")
    assert client.llen(wake) == 16
    lpushes, ltrims = command_calls(client, "lpush"), command_calls(client, "ltrim")
    if payloads:
        assert q.push_payloads({"p": b"body"}) == 1
    else:
        assert q.push("one more") == 1
    assert command_calls(client, "ltrim") == ltrims
    assert client.llen(wake) == 16
    # The ring's LPUSH, and the push log's when the push opened a new second's checkpoint.
    assert command_calls(client, "lpush") - lpushes in (1, 2)
    assert q.stats().pending == 21


def test_counters_stay_true_through_laps(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name, timeout=30)
    q.push_many(f"j{n}" for n in range(50))
    jobs = q.next(50)
    q.nack(*jobs[:10], delay=60)
    q.ack(*jobs[10:20])
    q.ack(*jobs[20:30])
    for _ in range(5):
        q.sweep()
    stats = q.stats()
    assert (stats.deferred, stats.in_flight, stats.done) == (10, 20, 0)
    assert stats.length == 30
