"""Behaviour of lua/rotator.lua as scenarios over a Backend, run on the stub and on servers.

Each scenario takes a fresh queue and asserts what the module's header promises. Times are
short (leases of SHORT ms, waits a little longer) so the real-server run stays fast; on the stub
time moves only when a scenario sleeps, so some values are checked exactly there and within a
range on a real server. A few scenarios need hours or minutes of clock and run on the stub only
(`fake_clock_only`); tests/test_lua_parity.py leaves those out.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from rotator.keys import KEY_ROLES
from rotator.meta import WALK_FIELDS, walk_numbers
from rotator.models import COUNTER_FIELDS
from rotator.protocol import unpack_element
from tests.lua.backend import Arg, Backend, KeyState, ReplyError, Result

N_QUEUE_KEYS = len(KEY_ROLES)

LONG = 60_000  # a lease that cannot expire during a scenario
SHORT = 100  # a lease a scenario waits out
PAST_SHORT = 160  # sleep this long to see a SHORT lease expired
DELAY = 300  # a nack delay a scenario waits out
BUDGET = 1000  # visits enough for every ring in these scenarios
SENTINEL = "*lap"
TOKEN_RE = re.compile(r"^(?P<id>[^*]+)\*(?P<deadline>\d+)\.(?P<n>\d+)\.(?P<seq>\d+)$")
REVOKED_KEEP_MS = 2 * 86_400_000  # the module keeps refused tokens this long

Scenario = Callable[[Backend], None]
SCENARIOS: list[Scenario] = []
FAKE_CLOCK_ONLY: set[str] = set()
LIBRARY_ONLY: set[str] = set()


def scenario(func: Scenario) -> Scenario:
    SCENARIOS.append(func)
    return func


def library_only(func: Scenario) -> Scenario:
    """A scenario of the module loaded as a function library (FCALL): stub and servers."""
    LIBRARY_ONLY.add(func.__name__)
    return func


def fake_clock_only(func: Scenario) -> Scenario:
    """A scenario that needs the clock moved by hours or minutes: stub only."""
    FAKE_CLOCK_ONLY.add(func.__name__)
    return func


# -- helpers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    text: str
    id: str
    deadline: int
    n: int
    seq: int


def parse_token(text: str) -> Token:
    found = TOKEN_RE.match(text)
    assert found, f"not a delivery token: {text!r}"
    return Token(text, found["id"], int(found["deadline"]), int(found["n"]), int(found["seq"]))


@dataclass(frozen=True)
class Next:
    idle: int
    wait_ms: int
    acked: int
    jobs: list[tuple[Token, int]]  # (token, reclaimed)

    @property
    def ids(self) -> list[str]:
        return [token.id for token, _ in self.jobs]

    @property
    def tokens(self) -> list[str]:
        return [token.text for token, _ in self.jobs]


def ints(reply: Result) -> list[int]:
    assert isinstance(reply, list), reply
    assert all(isinstance(x, int) for x in reply), reply
    return [x for x in reply if isinstance(x, int)]


def nxt(
    b: Backend,
    count: int = 10,
    lease: int = LONG,
    *,
    budget: int = BUDGET,
    max_deliveries: int = 0,
    acks: tuple[str, ...] = (),
) -> Next:
    reply = b.call("next", count, lease, budget, max_deliveries, *acks)
    assert isinstance(reply, list), reply
    assert len(reply) >= 3, reply
    assert len(reply) % 2 == 1, reply
    idle, wait_ms, acked = reply[0], reply[1], reply[2]
    assert isinstance(idle, int), reply
    assert isinstance(wait_ms, int), reply
    assert isinstance(acked, int), reply
    assert idle in (0, 1), reply
    jobs: list[tuple[Token, int]] = []
    for i in range(3, len(reply), 2):
        token, reclaimed = reply[i], reply[i + 1]
        assert isinstance(token, str), reply
        assert isinstance(reclaimed, int), reply
        assert reclaimed in (0, 1), reply
        jobs.append((parse_token(token), reclaimed))
    return Next(idle, wait_ms, acked, jobs)


def push(b: Backend, *ids: str) -> None:
    assert b.call("push", *ids) == len(ids)


def lease_one(b: Backend, job: str, lease: int = LONG) -> Token:
    """Push `job` on an empty queue and lease it."""
    push(b, job)
    got = nxt(b, 1, lease)
    assert got.ids == [job], got
    return got.jobs[0][0]


def ack(b: Backend, *tokens: str) -> int:
    reply = b.call("ack", *tokens)
    assert isinstance(reply, int), reply
    return reply


def batch_of(token: str) -> str | None:
    """The batch `*<deadline>.1.<call seq>` of a first delivery's token (None for a later one)."""
    found = re.fullmatch(r"[^*]+\*(\d+\.1\.\d+)\d{5}", token)
    return "*" + found[1] if found else None


def revoked(b: Backend, token: str) -> bool:
    """Whether the module fences `token`: revoked by name, or its batch revoked whole when it
    expired untouched (member `<batch>*`)."""
    members = b.zscores("revoked")
    batch = batch_of(token)
    return token in members or (batch is not None and batch + "*" in members)


COUNTERS = COUNTER_FIELDS  # (the module's names for them are the Stats fields')
DURATIONS = (*(f"d{bucket}" for bucket in range(26)), "dsum")


def all_stats(b: Backend) -> dict[str, int]:
    reply = b.call("stats")
    assert isinstance(reply, list), reply
    assert len(reply) == 98, reply
    names, values = reply[0::2], reply[1::2]
    assert all(isinstance(v, int) for v in values), reply
    got = {str(k): int(v) for k, v in zip(names, values, strict=True) if isinstance(v, int)}
    parts = ("pending", "in_flight", "done", "deferred", "overdue")
    assert got["length"] == sum(got[name] for name in parts), got
    return got


def stats(b: Backend) -> dict[str, int]:
    """The queue's state now (stats less its counts since the queue was made and its
    processing-time histogram)."""
    got = all_stats(b)
    for name in [*COUNTERS, *DURATIONS]:
        got.pop(name)
    return got


def counters(b: Backend) -> dict[str, int]:
    """stats' counts since the queue was made."""
    got = all_stats(b)
    return {name: got[name] for name in COUNTERS}


def peek(b: Backend, count: int = 100) -> list[tuple[str, str, int]]:
    reply = b.call("peek", count)
    assert isinstance(reply, list), reply
    assert len(reply) % 3 == 0, reply
    rows = []
    for i in range(0, len(reply), 3):
        element, state, at = reply[i : i + 3]
        assert isinstance(element, str)
        assert isinstance(state, str)
        assert isinstance(at, int)
        rows.append((element, state, at))
    return rows


def unpacked(elements: list[str]) -> list[str]:
    """The ring with each packed batch written out as the leases it stands for."""
    out: list[str] = []
    for element in elements:
        batch = unpack_element(element.encode("utf-8", "surrogateescape"))
        if batch is None:
            out.append(element)
        else:
            out += [token.decode("utf-8", "surrogateescape") for token in batch[1]]
    return out


def meta_seq(b: Backend) -> int:
    return int(b.hgetall("meta").get("seq", "0"))


def expect_error(
    b: Backend, code: str, *argv: str | int, keys: tuple[str, ...] | None = None
) -> str:
    """The call fails with `code` and leaves every key of the queue as it was."""
    before = b.snapshot()
    with pytest.raises(ReplyError) as caught:
        b.call_keys(b.keys if keys is None else keys, *argv)
    assert caught.value.code == code, f"{argv!r}: {caught.value}"
    assert b.snapshot() == before, f"{argv!r} failed with {code} but wrote"
    return str(caught.value)


def laps(b: Backend, times: int = 2) -> None:
    """Whole laps that lease nothing new (count 1000 of young or no jobs; budget covers all)."""
    for _ in range(times):
        got = nxt(b, 1000, LONG)
        assert got.jobs == [], got


def within(value: int, low: int, high: int) -> None:
    assert low <= value <= high, f"{value} not in [{low}, {high}]"


# -- push and next ---------------------------------------------------------------------------


@scenario
def push_then_next_returns_jobs_fifo_with_tokens(b: Backend) -> None:
    assert b.call("push", "a", "b", "c") == 3
    assert b.ring() == ["c", "b", "a", SENTINEL]  # LPUSHed: the tail is the oldest
    before = b.now_ms()
    got = nxt(b, 10, LONG)
    after = b.now_ms()
    assert (got.idle, got.acked) == (0, 0)
    assert got.ids == ["a", "b", "c"]
    assert [reclaimed for _, reclaimed in got.jobs] == [0, 0, 0]
    for token, _ in got.jobs:
        assert token.n == 1
        within(token.deadline, before + LONG, after + LONG)
    if b.exact_clock:
        assert all(token.deadline == before + LONG for token, _ in got.jobs)
    assert len({token.seq for token, _ in got.jobs}) == 3
    # The leases wait in the lease list (nothing is lost if the consumer dies); the ring keeps
    # its sentinel.
    assert b.ring() == [SENTINEL]
    assert sorted(unpacked(b.leases())) == sorted(got.tokens)


@scenario
def a_call_stops_its_batch_once_the_ids_reach_256_kb(b: Backend) -> None:
    ids = [f"{i:04d}" + "x" * 996 for i in range(300)]  # 1000 bytes each
    push(b, *ids)
    first = nxt(b, 1000, LONG)
    assert first.ids == ids[:263]  # 263 * 1000 >= 256 * 1024: the 263rd is the last
    assert nxt(b, 1000, LONG).ids == ids[263:]


@scenario
def push_keeps_exactly_one_sentinel(b: Backend) -> None:
    push(b, "a")
    push(b, "b", "c")
    push(b, "d")
    assert b.ring() == ["d", "c", "b", "a", SENTINEL]
    nxt(b, 2, LONG)
    push(b, "e")
    assert b.ring().count(SENTINEL) == 1
    # A deleted ring gets its sentinel back on the next push.
    b.raw_del("ring")
    push(b, "f")
    assert b.ring() == ["f", SENTINEL]


@scenario
def push_of_a_batch_with_one_invalid_id_writes_nothing(b: Backend) -> None:
    fresh = b.fresh("empty")
    for bad in ["a*b", "", "x" * 1025, "*", "*lap"]:
        message = expect_error(fresh, "ROTATOR_BADID", "push", "ok1", bad, "ok2")
        assert "ok1" not in message
        assert fresh.snapshot() == {role: ("none", None) for role in fresh.snapshot()}
    push(b, "first")
    nxt(b, 1, LONG)
    for bad in ["a*b", "", "x" * 1025]:
        expect_error(b, "ROTATOR_BADID", "push", "ok1", bad, "ok2")
        expect_error(b, "ROTATOR_BADID", "push", bad)
    expect_error(b, "ROTATOR_TOOMANY", "push", *[f"j{i}" for i in range(5001)])
    assert b.call("push", "y" * 1024) == 1  # the longest id is fine
    assert b.call("push") == 0


@scenario
def bad_numeric_args_give_badarg_and_change_nothing(b: Backend) -> None:
    token = lease_one(b, "a").text
    push(b, "b")
    bad_numbers = ["0", "1e3", "nan", "-1", "2.5", "", " 1", "+1", "0x10", "1000000000000000"]
    cases: list[tuple[str | int, ...]] = []
    for value in [*bad_numbers, "1001"]:
        cases.append(("next", value, LONG, BUDGET, 0))
    for value in [*bad_numbers, "86400001"]:
        cases.append(("next", 1, value, BUDGET, 0))
    for value in [*bad_numbers, "1001"]:
        cases.append(("next", 1, LONG, value, 0))
    for value in ["-1", "1e3", "nan", "2.5", "1000001"]:
        cases.append(("next", 1, LONG, BUDGET, value))
    for value in ["-1", "1e3", "nan", "2.5", "86400001"]:
        cases.append(("nack", value, token))
    cases.append(("next",))
    cases.append(("next", 1, LONG, BUDGET))
    for value in ["0", "-5", "1e3", "86400001"]:
        cases.append(("extend", value, token))
    for value in ["0", "1001", "x"]:
        cases.append(("peek", value))
        cases.append(("dead", 0, value))
    cases.append(("dead", "-1", 10))
    cases.append(("dead", "1.5", 10))
    for value in ["0", "5001", "-1"]:
        cases.append(("requeue_dead", value))
    for argv in cases:
        expect_error(b, "ROTATOR_BADARG", *argv)
    # The boundaries themselves are accepted.
    nxt(b, 1000, 86_400_000, budget=1000, max_deliveries=1_000_000)
    assert b.call("peek", 1000) is not None
    assert b.call("dead", 0, 1000) == []


@scenario
def bad_tokens_give_badtoken_and_change_nothing(b: Backend) -> None:
    token = lease_one(b, "a").text
    for bad in ["a", "a*", "*1.1.1", "a*1.1", "a*x.1.1", "a*1e3.1.1", ""]:
        expect_error(b, "ROTATOR_BADTOKEN", "ack", token, bad)
        expect_error(b, "ROTATOR_BADTOKEN", "nack", 0, token, bad)
        expect_error(b, "ROTATOR_BADTOKEN", "extend", 1000, bad)
        expect_error(b, "ROTATOR_BADTOKEN", "next", 1, LONG, BUDGET, 0, token, bad)
    expect_error(b, "ROTATOR_BADTOKEN", "ack")
    expect_error(b, "ROTATOR_BADTOKEN", "nack", 0)
    expect_error(b, "ROTATOR_BADTOKEN", "extend", 1000)
    expect_error(b, "ROTATOR_TOOMANY", "ack", *[f"a*1.1.{i}" for i in range(5001)])


# -- ack -------------------------------------------------------------------------------------


@scenario
def ack_removes_the_element_lazily_and_done_sets_end_empty(b: Backend) -> None:
    push(b, "a", "b")
    ta = nxt(b, 1, LONG).tokens[0]
    assert ack(b, ta) == 1
    assert b.smembers("done") == {ta}
    assert ta in unpacked(b.leases())  # lazy: the ack itself never scans a list
    assert b.call("nack", 0, ta) == [0]  # acked: no longer held
    got = nxt(b, 10, LONG)
    assert got.ids == ["b"]
    # The next call's walk of the lease list took the acked lease from its tail.
    assert ta not in unpacked(b.elements())
    assert b.ring() == [SENTINEL]
    assert unpacked(b.leases()) == got.tokens
    assert stats(b)["done"] == 0
    assert ack(b, got.tokens[0]) == 1
    laps(b, 3)
    assert not b.exists("done")
    assert not b.exists("done_old")


@scenario
def ack_piggybacked_on_next_counts_in_the_reply(b: Backend) -> None:
    push(b, "a", "b", "c")
    first = nxt(b, 2, LONG)
    ta, tb = first.tokens
    got = nxt(b, 1, LONG, acks=(ta, tb))
    assert got.acked == 2
    assert got.ids == ["c"]
    laps(b, 1)
    assert ta not in unpacked(b.elements())
    assert tb not in unpacked(b.elements())
    assert stats(b)["done"] == 0
    # A piggybacked ack of a lease that was lost is refused, not counted.
    tc = got.tokens[0]
    assert b.call("nack", 0, tc) == [1]
    again = nxt(b, 1, LONG, acks=(tc,))
    assert again.acked == 0
    assert again.ids == ["c"]


@scenario
def ack_on_a_queue_that_does_not_exist_accepts_nothing(b: Backend) -> None:
    assert b.call("ack", "a*1732233600000.1.1") == 0
    assert b.call("nack", 0, "a*1732233600000.1.1") == [0]
    assert ints(b.call("extend", 1000, "a*1732233600000.1.1"))[1:] == [0]
    assert b.snapshot() == {role: ("none", None) for role in b.snapshot()}


@scenario
def late_ack_of_an_unknown_token_is_forgotten_after_two_laps(b: Backend) -> None:
    real = lease_one(b, "a")
    # A token this queue never issued is refused: its call seq is not one the queue used.
    assert ack(b, "ghost*1732233600000.1.99") == 0
    assert ack(b, f"ghost*{real.deadline}.1.{real.seq + 10**9}") == 0
    # Within the seqs it used, an unknown token cannot be told apart without a ring scan.
    ghost = f"ghost*{real.deadline}.1.{real.seq}"
    assert ack(b, ghost) == 1
    assert ack(b, real.text) == 1  # nothing left in flight: the ring's laps age the acks
    assert ghost in b.smembers("done")
    laps(b, 2)
    assert not b.exists("done")
    assert not b.exists("done_old")


@scenario
def a_leftover_ack_waits_for_a_pass_of_the_lease_list(b: Backend) -> None:
    # With a lease in flight, an ack may concern it until the lease list's walk has passed
    # it, which it does once the lease falls due: only then can the acks age.
    real = lease_one(b, "a", SHORT)
    ghost = f"ghost*{real.deadline}.1.{real.seq}"
    assert ack(b, ghost) == 1
    laps(b, 3)
    assert ghost in b.smembers("done")
    b.sleep_ms(PAST_SHORT)
    again = nxt(b, 1, LONG)
    assert again.ids == ["a"]
    assert ack(b, again.tokens[0]) == 1
    laps(b, 3)
    assert not b.exists("done")
    assert not b.exists("done_old")


# -- leases ----------------------------------------------------------------------------------


@scenario
def young_lease_is_skipped(b: Backend) -> None:
    token = lease_one(b, "a")
    for _ in range(3):
        got = nxt(b, 10, LONG)
        assert got.jobs == []
    assert unpacked(b.leases()).count(token.text) == 1
    assert peek(b) == [(SENTINEL, "lap", 0), (token.text, "leased", token.deadline)]


@scenario
def breaking_up_batches_counts_against_the_budget(b: Backend) -> None:
    # Nine batches of 300, each acked token by token but one (touched): breaking all of them
    # up in one call would be 2700 leases of work, far past the budget.
    ids = [f"j{i:04d}" for i in range(2700)]
    push(b, *ids[:1350])
    push(b, *ids[1350:])
    batches = [nxt(b, 300, SHORT, budget=1000).tokens for _ in range(9)]
    assert all(len(tokens) == 300 for tokens in batches)
    for tokens in batches:
        assert ack(b, *tokens[:299]) == 299
    b.sleep_ms(PAST_SHORT)
    seq = meta_seq(b)
    got = nxt(b, 1000, LONG, budget=700)
    # Three batches from the lease list's tail: the third starts below the budget (602 < 700)
    # and then nothing more (not even the ring's sentinel). Each yields its one unacked,
    # expired lease.
    assert meta_seq(b) - seq == 3
    assert len(got.jobs) == 3
    reclaimed = got.ids
    for _ in range(10):
        reclaimed += nxt(b, 1000, LONG, budget=700).ids
    assert sorted(reclaimed) == sorted(tokens[299].split("*")[0] for tokens in batches)
    assert (stats(b)["length"], stats(b)["in_flight"], stats(b)["done"]) == (9, 9, 0)


@scenario
def an_expired_untouched_batch_is_released_whole_under_one_revocation(b: Backend) -> None:
    push(b, "a", "b", "c")
    first = nxt(b, 3, SHORT)
    batch = batch_of(first.tokens[0])
    assert batch is not None
    assert {batch_of(t) for t in first.tokens} == {batch}
    b.sleep_ms(PAST_SHORT)
    again = nxt(b, 10, LONG)
    assert sorted(again.ids) == ["a", "b", "c"]
    assert all(token.n == 2 and reclaimed == 1 for token, reclaimed in again.jobs)
    # One member fences the batch: each old token, and the batch ack, is refused.
    assert set(b.zscores("revoked")) == {batch + "*"}
    assert ack(b, *first.tokens) == 0
    assert ack(b, f"{batch}/3") == 0
    assert b.call("nack", 0, first.tokens[0]) == [0]
    before = b.now_ms()
    deadline, extended = ints(b.call("extend", LONG, first.tokens[1]))
    within(deadline, before + LONG, b.now_ms() + LONG)
    assert extended == 0
    assert nxt(b, 10, LONG).jobs == []  # each job re-issued to exactly one consumer
    assert ack(b, *again.tokens) == 3
    laps(b, 2)
    assert b.elements() == [SENTINEL]


@scenario
def an_expired_touched_batch_revokes_its_leases_one_by_one(b: Backend) -> None:
    push(b, "a", "b", "c")
    first = nxt(b, 3, SHORT)
    assert ack(b, first.tokens[0]) == 1  # touches the batch
    b.sleep_ms(PAST_SHORT)
    again = nxt(b, 10, LONG)
    assert sorted(again.ids) == ["b", "c"]
    batch = batch_of(first.tokens[0])
    assert batch is not None
    assert set(b.zscores("revoked")) == {batch, *first.tokens[1:]}
    assert ack(b, *first.tokens[1:]) == 0
    assert ack(b, *again.tokens) == 2
    laps(b, 2)
    assert b.elements() == [SENTINEL]


@scenario
def an_ack_of_5000_first_deliveries_checks_each_and_its_batch_for_revocation(
    b: Backend,
) -> None:
    # Two names a token (its own, its batch's expiry): more than one unpack may take.
    ids = [f"j{i:04d}" for i in range(5000)]
    push(b, *ids[:2500])
    push(b, *ids[2500:])
    tokens: list[str] = []
    for _ in range(6):
        tokens += nxt(b, 1000, LONG).tokens
    assert len(tokens) == 5000
    assert b.call("nack", LONG, tokens[0]) == [1]  # the revoked set is not empty
    assert ack(b, *tokens) == 4999


@scenario
def a_call_re_leases_at_most_250_expired_leases_one_by_one(b: Backend) -> None:
    ids = [f"j{i:03d}" for i in range(300)]
    push(b, *ids)
    assert len(nxt(b, 300, SHORT).jobs) == 300
    b.sleep_ms(PAST_SHORT)
    # The expired batch comes back whole (one revocation), as 300 leases of their own.
    singles = nxt(b, 1000, SHORT)
    assert len(singles.jobs) == 300
    b.sleep_ms(PAST_SHORT)
    # Each of those is revoked on its own when it expires: 250 a call, then the rest.
    got = nxt(b, 1000, LONG)
    assert len(got.jobs) == 250
    assert got.wait_ms == 0  # more is due now: the lease list's walk goes on at once
    rest = nxt(b, 1000, LONG)
    assert len(rest.jobs) == 50
    assert sorted(got.ids + rest.ids) == ids
    assert all(revoked(b, token) for token in singles.tokens)
    assert ack(b, *got.tokens, *rest.tokens) == 300
    laps(b, 2)
    assert b.elements() == [SENTINEL]


@scenario
def bury_dead_letters_a_live_lease_with_its_error_and_fences_it(b: Backend) -> None:
    token = lease_one(b, "a")
    assert b.call("bury", "exit 2: no * such file", token.text) == [1]
    assert revoked(b, token.text)
    assert b.hgetall("marks")[token.text] == "fexit 2: no * such file"
    assert (stats(b)["done"], stats(b)["in_flight"], stats(b)["dead"]) == (1, 0, 0)
    assert peek(b)[-1] == (token.text, "buried", 0)
    assert ack(b, token.text) == 0
    assert b.call("nack", 0, token.text) == [0]
    assert b.call("bury", "again", token.text) == [0]  # buried once
    before = b.now_ms()
    assert nxt(b, 10, LONG).jobs == []  # the walk reaches it: the letter is written
    after = b.now_ms()
    [letter] = b.lrange("dead")
    reason, deliveries, at, element = letter.split("*", 3)
    assert (reason, deliveries, element) == ("failed", "1", "a*exit 2: no * such file")
    within(int(at), before, after)
    assert (stats(b)["dead"], stats(b)["done"], stats(b)["length"]) == (1, 0, 0)
    assert not b.exists("marks")
    laps(b, 2)
    assert b.elements() == [SENTINEL]
    # Requeued by its id, it is a fresh pending job.
    assert b.call("requeue_dead", 10, "a") == 1
    assert nxt(b, 10, LONG).ids == ["a"]


@scenario
def bury_of_one_job_of_a_batch_leaves_the_others_held(b: Backend) -> None:
    push(b, "a", "b", "c")
    got = nxt(b, 3, LONG)
    assert b.call("bury", "", got.tokens[1], got.tokens[1]) == [1, 0]
    batch = batch_of(got.tokens[0])
    assert batch is not None
    assert ack(b, f"{batch}/3") == 0  # no more whole-batch acks
    assert ack(b, got.tokens[0], got.tokens[2]) == 2
    b.call("sweep", BUDGET)  # a sweep reaches the buried job too
    assert b.lrange("dead") == [b.lrange("dead")[0]]
    assert b.lrange("dead")[0].endswith("*b*")  # an empty error
    laps(b, 2)
    assert b.elements() == [SENTINEL]
    assert stats(b)["dead"] == 1


@scenario
def bury_of_a_lost_or_finished_lease_or_bad_input_changes_no_job(b: Backend) -> None:
    old = lease_one(b, "a", SHORT)
    b.sleep_ms(PAST_SHORT)
    new = nxt(b, 10, LONG).tokens[0]
    assert b.call("bury", "late", old.text) == [0]  # re-leased since: not this worker's
    expect_error(b, "ROTATOR_BADARG", "bury", "x" * 4097, new)
    expect_error(b, "ROTATOR_BADTOKEN", "bury", "boom")
    expect_error(b, "ROTATOR_BADTOKEN", "bury", "boom", "not-a-token")
    assert ack(b, new) == 1
    laps(b, 1)  # its element is gone: the token is no longer known as acked
    assert b.call("bury", "too late", new) == [1]  # a leftover mark, like a late nack's
    laps(b, 3)
    assert b.lrange("dead") == []  # a job done is never dead-lettered too
    assert b.elements() == [SENTINEL]
    assert not b.exists("marks")
    assert not b.exists("marks_old")
    push(b, "c")
    token = nxt(b, 1, LONG).tokens[0]
    assert b.call("bury", "x" * 4096, token) == [1]
    b.call("sweep", BUDGET)
    assert b.lrange("dead")[0].endswith("*c*" + "x" * 4096)


@scenario
def next_packed_sends_the_batch_as_its_element_and_later_deliveries_as_tokens(
    b: Backend,
) -> None:
    push(b, "a", "b")
    old = nxt(b, 1, SHORT).jobs[0][0]  # a, to be reclaimed
    push(b, "c")
    b.sleep_ms(PAST_SHORT)
    reply = b.call("next_packed", 10, LONG, BUDGET, 0)
    assert isinstance(reply, list), reply
    assert (reply[0], reply[2]) == (0, 0), reply
    within(int(reply[1]), 1, LONG)  # type: ignore[arg-type]
    packed = reply[3]
    assert isinstance(packed, str), reply
    # b and c leased for the first time: one element, the very one now at the lease list's
    # head.
    assert packed == b.leases()[0], (packed, b.leases())
    batch, ids = packed.split("*", 2)[1], packed.split("*")[2:]
    assert ids == ["b", "c"], packed
    tokens = unpacked([packed])
    assert [parse_token(t).n for t in tokens] == [1, 1]
    assert all(t.startswith(f"{i}*{batch}") for i, t in zip(ids, tokens, strict=True))
    # a again (its second delivery), as next sends it: token then reclaimed flag.
    again = parse_token(str(reply[4]))
    assert (again.id, again.n, reply[5], len(reply)) == ("a", 2, 1, 6), reply
    assert ack(b, old.text) == 0
    assert ack(b, *tokens, again.text) == 3
    nothing = b.call("next_packed", 10, LONG, BUDGET, 0)
    assert isinstance(nothing, list), nothing
    assert len(nothing) == 4, nothing
    assert nothing[3] == "", nothing  # no batch
    laps(b, 2)
    assert b.ring() == [SENTINEL]
    assert b.leases() == []


@scenario
def expired_lease_is_reclaimed_once_and_the_old_token_refused(b: Backend) -> None:
    old = lease_one(b, "a", SHORT)
    b.sleep_ms(PAST_SHORT)
    got = nxt(b, 10, LONG)
    assert len(got.jobs) == 1
    new, reclaimed = got.jobs[0]
    assert (new.id, new.n, reclaimed) == ("a", 2, 1)
    assert new.text != old.text
    assert new.seq != old.seq
    assert nxt(b, 10, LONG).jobs == []  # re-issued to exactly one consumer
    assert revoked(b, old.text)
    assert ack(b, old.text) == 0
    assert nxt(b, 1, LONG, acks=(old.text,)).acked == 0
    laps(b, 2)
    assert not b.exists("done")
    assert not b.exists("done_old")
    assert [e for e in unpacked(b.elements()) if e != SENTINEL] == [new.text]
    assert ack(b, new.text) == 1
    laps(b, 2)
    assert b.elements() == [SENTINEL]
    assert not b.exists("done")
    assert not b.exists("done_old")


@scenario
def nack_with_no_delay_redelivers(b: Backend) -> None:
    old = lease_one(b, "a")
    assert b.call("nack", 0, old.text) == [1]
    got = nxt(b, 10, LONG)
    assert len(got.jobs) == 1
    new, reclaimed = got.jobs[0]
    assert (new.id, new.n, reclaimed) == ("a", 2, 0)
    assert new.text != old.text
    assert ack(b, old.text) == 0
    assert b.call("nack", 0, old.text) == [0]
    laps(b, 2)
    assert not b.exists("marks")
    assert not b.exists("marks_old")


@scenario
def nack_of_the_same_token_twice_requeues_once(b: Backend) -> None:
    old = lease_one(b, "a")
    assert b.call("nack", 0, old.text, old.text) == [1, 0]
    got = nxt(b, 10, LONG)
    assert got.ids == ["a"]
    assert nxt(b, 10, LONG).jobs == []


@scenario
def nack_with_a_delay_is_not_delivered_before_it_is_due(b: Backend) -> None:
    old = lease_one(b, "a")
    before = b.now_ms()
    assert b.call("nack", DELAY, old.text) == [1]
    after = b.now_ms()
    assert stats(b)["deferred"] == 1
    rows = {element: (state, at) for element, state, at in peek(b)}
    state, due = rows[old.text]
    assert state == "deferred"
    within(due, before + DELAY, after + DELAY)
    got = nxt(b, 10, LONG)
    assert got.jobs == []
    within(got.wait_ms, 1, DELAY)
    b.sleep_ms(DELAY + 60)
    got = nxt(b, 10, LONG)
    assert len(got.jobs) == 1
    new, reclaimed = got.jobs[0]
    assert (new.id, new.n, reclaimed) == ("a", 2, 0)
    assert stats(b)["deferred"] == 0


@scenario
def extend_keeps_a_lease_past_its_original_deadline(b: Backend) -> None:
    old = lease_one(b, "a", SHORT)
    before = b.now_ms()
    reply = ints(b.call("extend", 500, old.text))
    after = b.now_ms()
    deadline = reply[0]
    assert reply[1:] == [1]
    within(deadline, before + 500, after + 500)
    b.sleep_ms(PAST_SHORT)
    assert nxt(b, 10, LONG).jobs == []  # past SHORT, still leased
    rows = {element: (state, at) for element, state, at in peek(b)}
    assert rows[old.text] == ("leased", deadline)
    b.sleep_ms(500 - PAST_SHORT + 60)
    got = nxt(b, 10, LONG)
    assert len(got.jobs) == 1
    new, reclaimed = got.jobs[0]
    assert (new.id, new.n, reclaimed) == ("a", 2, 1)
    assert ack(b, old.text) == 0
    laps(b, 2)
    assert not b.exists("marks")
    assert not b.exists("marks_old")


@scenario
def extend_and_nack_of_a_lost_lease_reply_zero(b: Backend) -> None:
    old = lease_one(b, "a", SHORT)
    b.sleep_ms(PAST_SHORT)
    new = nxt(b, 10, LONG).tokens[0]
    assert ints(b.call("extend", LONG, old.text))[1:] == [0]
    assert b.call("nack", 0, old.text) == [0]
    assert ints(b.call("extend", LONG, old.text, new))[1:] == [0, 1]
    # An acked lease is lost too: it cannot be extended or nacked back to life.
    assert ack(b, new) == 1
    assert ints(b.call("extend", LONG, new))[1:] == [0]
    assert b.call("nack", 0, new) == [0]
    laps(b, 2)
    assert b.ring() == [SENTINEL]
    assert not b.exists("marks")
    assert not b.exists("marks_old")


@scenario
def extended_then_acked_lease_leaves_no_mark_behind(b: Backend) -> None:
    token = lease_one(b, "a")
    assert ints(b.call("extend", LONG, token.text))[1:] == [1]
    assert token.text in b.hgetall("marks")
    assert ack(b, token.text) == 1
    laps(b, 3)
    assert b.ring() == [SENTINEL]
    assert not b.exists("marks")
    assert not b.exists("marks_old")
    assert not b.exists("done")
    assert not b.exists("done_old")


@scenario
def two_leases_in_the_same_millisecond_get_different_tokens(b: Backend) -> None:
    push(b, "a", "a")
    got = nxt(b, 2, SHORT)
    assert got.ids == ["a", "a"]
    assert got.tokens[0] != got.tokens[1]
    # Both expire and are re-leased by one call: same id, deadline and delivery count.
    b.sleep_ms(PAST_SHORT)
    again = nxt(b, 2, LONG)
    assert [(t.id, t.n, r) for t, r in again.jobs] == [("a", 2, 1), ("a", 2, 1)]
    first, second = again.tokens
    assert first != second
    assert ack(b, first) == 1
    laps(b, 1)
    assert first not in unpacked(b.elements())
    assert second in unpacked(b.elements())
    rows = {element: state for element, state, _ in peek(b)}
    assert rows[second] == "leased"
    # A nack and an immediate re-lease: a new token again.
    assert b.call("nack", 0, second) == [1]
    third = nxt(b, 10, LONG).tokens
    assert len(third) == 1
    assert third[0] not in (*got.tokens, first, second)


# -- dead letters ----------------------------------------------------------------------------


@scenario
def max_deliveries_dead_letters_the_job_and_requeue_dead_brings_it_back(b: Backend) -> None:
    push(b, "a", "b")
    first = nxt(b, 10, SHORT, max_deliveries=2)
    assert first.ids == ["a", "b"]
    b.sleep_ms(PAST_SHORT)
    second = nxt(b, 10, SHORT, max_deliveries=2)
    assert second.ids == ["a", "b"]
    assert [t.n for t, _ in second.jobs] == [2, 2]
    b.sleep_ms(PAST_SHORT)
    before = b.now_ms()
    third = nxt(b, 10, SHORT, max_deliveries=2)
    after = b.now_ms()
    assert third.jobs == []
    assert b.ring() == [SENTINEL]
    letters = b.lrange("dead")
    assert len(letters) == 2
    for letter, job in zip(letters, ["a", "b"], strict=True):
        reason, deliveries, at, element = letter.split("*", 3)
        assert (reason, deliveries, element) == ("max_deliveries", "2", job)
        within(int(at), before, after)
    assert b.call("dead", 0, 10) == letters
    assert b.call("dead", 1, 1) == letters[1:]
    assert stats(b)["dead"] == 2
    for token, _ in second.jobs:
        assert revoked(b, token.text)
        assert ack(b, token.text) == 0
    # Only the letters of the ids asked for; the requeued job is a fresh, pending one.
    assert b.call("requeue_dead", 10, "b") == 1
    assert b.lrange("dead") == letters[:1]
    assert "b" in unpacked(b.ring())
    assert b.llen("wake") >= 1
    got = nxt(b, 10, LONG, max_deliveries=2)
    assert [(t.id, t.n, r) for t, r in got.jobs] == [("b", 1, 0)]
    assert b.call("requeue_dead", 10) == 1
    assert not b.exists("dead")
    assert nxt(b, 10, LONG).ids == ["a"]


@scenario
def nacks_count_towards_max_deliveries(b: Backend) -> None:
    token = lease_one(b, "a")
    assert b.call("nack", 0, token.text) == [1]
    got = nxt(b, 10, LONG, max_deliveries=2)
    assert got.ids == ["a"]
    assert b.call("nack", 0, got.tokens[0]) == [1]
    assert nxt(b, 10, LONG, max_deliveries=2).jobs == []
    letters = b.lrange("dead")
    assert len(letters) == 1
    assert letters[0].startswith("max_deliveries*2*")


@scenario
def corrupt_elements_are_dead_lettered_and_do_not_block_the_others(b: Backend) -> None:
    push(b, "a", "b")
    corrupt = ["x*nan", "x*", "*123", "x*1e3.1.1", "x*12", "", "z" * 1025]
    b.raw_rpush("ring", *corrupt)  # at the tail: visited before a and b
    rows = {element: state for element, state, _ in peek(b, 1000)}
    assert all(rows[element] == "corrupt" for element in corrupt), rows
    before = b.now_ms()
    got = nxt(b, 10, LONG)
    after = b.now_ms()
    assert got.ids == ["a", "b"]
    letters = b.lrange("dead")
    assert len(letters) == len(corrupt)
    # The visit order is tail first, so the last pushed to the tail is dead-lettered first.
    for letter, element in zip(letters, reversed(corrupt), strict=True):
        reason, deliveries, at, rest = letter.split("*", 3)
        assert (reason, deliveries, rest) == ("corrupt", "0", element)
        within(int(at), before, after)
    assert b.ring() == [SENTINEL]
    assert sorted(unpacked(b.leases())) == sorted(got.tokens)
    assert stats(b)["dead"] == len(corrupt)


@scenario
def a_batch_with_empty_ids_written_by_hand_counts_only_its_ids(b: Backend) -> None:
    """A packed batch's jobs are its runs of bytes other than "*": "a**b" and "a**b*" list
    two. Marked acked as two, it goes, two jobs completed; marked acked as any other number
    (the three or four a count of its "*" would give), it is broken up and its two jobs
    leased again."""
    for listed in ("a**b", "a**b*"):
        for mark in ("a2", "a3", "a4"):
            q = b.fresh(f"{len(listed)}{mark}")
            batch = "*1.1.5"  # expired long ago
            q.raw_rpush("leases", f"{batch}*{listed}")
            q.raw_hset("marks", batch, mark)
            got = nxt(q, 10, LONG)
            acked_whole = mark == "a2"
            assert sorted(got.ids) == ([] if acked_whole else ["a", "b"]), (listed, mark)
            assert counters(q)["completed"] == (2 if acked_whole else 0), (listed, mark)
            assert q.hgetall("marks") == {}, (listed, mark)
            assert all(not element.startswith(batch) for element in q.leases()), (listed, mark)


@scenario
def what_the_module_never_writes_in_the_lease_list_is_dead_lettered(b: Backend) -> None:
    token = lease_one(b, "a", SHORT)
    b.raw_rpush("leases", "x*nan", "plain", SENTINEL)  # at the tail: visited first
    b.sleep_ms(PAST_SHORT)
    got = nxt(b, 10, LONG)
    assert got.ids == ["a"]
    assert [letter.split("*", 3)[3] for letter in b.lrange("dead")] == ["plain", "x*nan"]
    assert unpacked(b.leases()) == got.tokens
    assert ack(b, token.text) == 0


# -- the sentinel ----------------------------------------------------------------------------


@scenario
def a_second_sentinel_is_removed(b: Backend) -> None:
    push(b, "a", "b")
    leased = nxt(b, 10, LONG).tokens  # a whole lap: the sentinel's position is known
    b.raw_lpush("ring", SENTINEL)
    assert b.ring().count(SENTINEL) == 2
    laps(b, 2)
    assert b.ring() == [SENTINEL]
    assert sorted(unpacked(b.leases())) == sorted(leased)


@scenario
def a_missing_sentinel_is_put_back(b: Backend) -> None:
    push(b, "a", "b")
    leased = nxt(b, 10, LONG).tokens
    assert b.call("nack", LONG, *leased) == [1, 1]
    assert nxt(b, 10, LONG).jobs == []  # the lease list's walk moves them to the ring to wait
    kept = [e for e in b.ring() if e != SENTINEL]
    assert sorted(kept) == sorted(leased)
    b.raw_del("ring")
    b.raw_rpush("ring", *kept)
    laps(b, 2)
    assert b.ring().count(SENTINEL) == 1
    assert sorted(b.ring()) == sorted([*kept, SENTINEL])


@scenario
def a_sentinel_missing_before_the_first_lap_is_put_back(b: Backend) -> None:
    push(b, "a", "b")
    b.raw_del("ring")
    b.raw_rpush("ring", "b", "a")  # as pushed, without the sentinel: no lap has ended yet
    leased = nxt(b, 10, LONG).tokens
    assert sorted(leased) == sorted(unpacked(b.leases()))
    laps(b, 3)
    assert b.ring().count(SENTINEL) == 1, b.ring()
    # Without a lap, acks of elements already gone would never be swept from `done`.
    assert ack(b, *leased) == 2
    ghost = "ghost" + leased[0][leased[0].index("*") :]  # a seq this queue used
    assert ack(b, ghost) == 1
    laps(b, 3)
    assert not b.exists("done")
    assert not b.exists("done_old")


# -- budget, idle, wait, wake ----------------------------------------------------------------


@scenario
def budget_bounds_the_elements_visited_per_call(b: Backend) -> None:
    ids = [f"j{i}" for i in range(20)]
    push(b, *ids)
    origin = meta_seq(b)  # a new queue counts visits from the server's time in ms
    within(origin, b.now_ms() - 60_000, b.now_ms())
    first = nxt(b, 100, LONG, budget=5)
    assert first.ids == ids[:4]  # the sentinel was one of the five visits
    assert meta_seq(b) - origin == 5
    # One job per call: each call's batch is an element of its own.
    rest = [nxt(b, 1, LONG).ids[0] for _ in range(16)]
    assert rest == ids[4:]
    leases_before = b.leases()
    assert len(leases_before) == 17  # 1 batch of 4, 16 batches of 1
    assert b.ring() == [SENTINEL]
    seq = meta_seq(b)
    # Only young leases now: a call visits none of them, only the ring's sentinel.
    got = nxt(b, 10, LONG, budget=5)
    assert got.jobs == []
    assert meta_seq(b) - seq == 1
    assert b.leases() == leases_before


@scenario
def idle_is_set_only_after_a_whole_lap_found_nothing(b: Backend) -> None:
    assert b.call("next", 10, LONG, BUDGET, 0) == [1, LONG, 0]  # no queue at all
    push(b, "a", "b")
    partial = nxt(b, 10, LONG, budget=1)  # only the sentinel
    assert (partial.jobs, partial.idle) == ([], 0)
    got = nxt(b, 10, LONG)
    assert got.ids == ["a", "b"]
    assert got.idle == 0
    assert nxt(b, 10, LONG).idle == 1
    assert nxt(b, 10, LONG).idle == 1
    # Onto the idle ring "c" goes ahead of the sentinel, "d" behind it.
    push(b, "c")
    push(b, "d")
    got = nxt(b, 10, LONG, budget=1)
    assert (got.ids, got.idle) == (["c"], 0)
    after_c = nxt(b, 10, LONG, budget=1)  # only the sentinel
    assert (after_c.jobs, after_c.idle) == ([], 0)
    got = nxt(b, 10, LONG)
    assert got.ids == ["d"]
    assert got.idle == 0
    assert nxt(b, 10, LONG).idle == 1


@scenario
def a_push_onto_an_idle_queue_goes_ahead_of_its_sentinel(b: Backend) -> None:
    # (a consumer woken by the push then leases its ids without crossing the lap first)
    push(b, "a")
    got = nxt(b, 10, LONG)
    assert ack(b, *got.tokens) == 1
    assert nxt(b, 10, LONG).idle == 1
    assert b.ring() == [SENTINEL]
    lapnext = walk_of(b)["lapnext"]
    push(b, "b", "c")
    assert b.ring() == [SENTINEL, "c", "b"]  # (the tail first: "b" is met first)
    assert walk_of(b)["lapnext"] == lapnext + 2
    push(b, "d")  # behind the sentinel, as the ring holds more than it
    assert b.ring() == ["d", SENTINEL, "c", "b"]
    first = nxt(b, 2, LONG)
    assert (first.ids, first.idle) == (["b", "c"], 0)
    assert b.ring() == ["d", SENTINEL]  # the sentinel not met yet
    then = nxt(b, 10, LONG)
    assert then.ids == ["d"]
    assert ack(b, *first.tokens, *then.tokens) == 3
    laps(b)
    assert stats(b)["length"] == 0
    assert nxt(b, 10, LONG).idle == 1


@scenario
def wait_ms_is_the_time_to_the_earliest_deadline(b: Backend) -> None:
    push(b, "a")
    sentinel_only = nxt(b, 10, LONG, budget=1)
    assert sentinel_only.wait_ms == LONG  # nothing known: at most its own lease
    got = nxt(b, 10, LONG)
    assert got.ids == ["a"]
    within(got.wait_ms, LONG - 1000, LONG)
    if b.exact_clock:
        assert got.wait_ms == LONG
    b.sleep_ms(20)
    push(b, "b")
    got = nxt(b, 10, 30_000)
    assert got.ids == ["b"]
    within(got.wait_ms, 29_000, 30_000)
    b.sleep_ms(20)
    idle = nxt(b, 10, LONG)
    assert idle.jobs == []
    assert idle.idle == 1
    within(idle.wait_ms, 29_000, 30_000 - 20)
    if b.exact_clock:
        assert idle.wait_ms == 30_000 - 20


@scenario
def an_idle_consumer_waits_at_most_its_lease_and_only_a_shorter_lease_wakes_one(
    b: Backend,
) -> None:
    """wait_ms is at most the claim's LEASE_MS, so an idle consumer looks again before a lease
    as long as its own, taken meanwhile, falls due. A claim that makes the earliest deadline
    pushes a wake-up only when its lease is shorter than the longest an idle consumer may be
    waiting (meta lease_max, raised by the claims that lease nothing), and while none is
    known (a queue's first claims)."""
    assert b.call("next", 10, 5_000, BUDGET, 0) == [1, 5_000, 0]  # no queue: its own lease
    assert not b.exists("meta")  # (a claim of no queue writes nothing)
    push(b, "a")
    pushed = b.llen("wake")
    first = nxt(b, 1, LONG)
    assert b.llen("wake") == pushed + 1
    assert "lease_max" not in b.hgetall("meta")  # (a claim that leased: no consumer waits)
    assert ack(b, *first.tokens) == 1
    idle = nxt(b, 10, LONG)
    assert (idle.idle, idle.wait_ms, b.llen("wake")) == (1, LONG, 0)
    assert b.hgetall("meta")["lease_max"] == str(LONG)
    push(b, "b")
    pushed = b.llen("wake")
    same = nxt(b, 1, LONG)  # as long as any before: no wake-up
    assert (same.ids, b.llen("wake")) == (["b"], pushed)
    short_wait = nxt(b, 10, 5_000)  # the young lease falls due later than its own lease
    assert (short_wait.idle, short_wait.wait_ms) == (1, 5_000)
    long_wait = nxt(b, 10, 2 * LONG)  # waits for the lease's deadline, and raises lease_max
    within(long_wait.wait_ms, LONG - 1000, LONG)
    assert b.hgetall("meta")["lease_max"] == str(2 * LONG)
    assert ack(b, *same.tokens) == 1
    assert nxt(b, 10, LONG).idle == 1
    push(b, "c")
    pushed = b.llen("wake")
    shorter = nxt(b, 1, LONG)  # shorter than the 2 * LONG an idle consumer may wait
    assert (shorter.ids, b.llen("wake")) == (["c"], pushed + 1)
    assert b.hgetall("meta")["lease_max"] == str(2 * LONG)


@scenario
def the_wake_list_is_signalled_by_push_and_cleared_by_an_idle_call(b: Backend) -> None:
    push(b, "a", "b", "c")
    assert b.lrange("wake") == ["1", "1", "1"]
    push(b, *[f"j{i}" for i in range(20)])
    assert b.llen("wake") == 16  # bounded: one token per consumer that could use it
    got = nxt(b, 1000, LONG)
    assert len(got.jobs) == 23
    assert got.idle == 0
    assert b.llen("wake") == 16
    idle = nxt(b, 1000, LONG)
    assert idle.idle == 1
    assert not b.exists("wake")
    assert b.call("nack", 0, got.tokens[0]) == [1]
    assert b.llen("wake") == 1  # a nacked job is work again: wake someone
    assert nxt(b, 1000, LONG).idle == 0
    assert nxt(b, 1000, LONG).idle == 1
    assert not b.exists("wake")
    push(b, "d")
    assert b.llen("wake") == 1


@scenario
def a_partial_lap_does_not_clear_the_wake_list(b: Backend) -> None:
    push(b, *[f"j{i}" for i in range(10)])
    nxt(b, 1000, LONG)
    assert nxt(b, 1000, LONG).idle == 1
    push(b, "late")
    for _ in range(3):
        got = nxt(b, 10, LONG, budget=2)
        if got.jobs:
            break
        assert got.idle == 0
        assert b.llen("wake") == 1, "a call that saw part of the ring cleared the wake list"


# -- key and command checks ------------------------------------------------------------------


@scenario
def wrong_key_types_give_wrongtype_and_change_nothing(b: Backend) -> None:
    # Each command checks the keys it reads or writes (and only those), before any write.
    touched_by: dict[str, set[str]] = {
        "ring": {"push", "next", "ack", "nack", "bury", "extend", "stats", "peek", "requeue_dead"},
        "done": {"next", "ack", "nack", "bury", "extend", "stats", "peek"},
        # (every command: the storage format's check reads it first)
        "meta": {
            "push",
            "next",
            "ack",
            "nack",
            "bury",
            "extend",
            "stats",
            "peek",
            "dead",
            "requeue_dead",
        },
        "revoked": {"next", "ack", "nack", "bury", "extend", "peek"},
        "marks_old": {"next", "nack", "bury", "extend", "stats", "peek"},
        "pushlog": {"push", "stats", "requeue_dead"},
    }
    corruptions: list[tuple[str, str]] = [
        ("ring", "string"),
        ("done", "list"),
        ("meta", "string"),
        ("revoked", "list"),
        ("marks_old", "string"),
        ("pushlog", "string"),
    ]
    for role, kind in corruptions:
        q = b.fresh(role)
        token = lease_one(q, "a").text
        push(q, "b")
        q.raw_del(role)
        if kind == "string":
            q.raw_set(role, "oops")
        else:
            q.raw_lpush(role, "oops")
        commands: list[tuple[str | int, ...]] = [
            ("push", "x"),
            ("next", 1, LONG, BUDGET, 0),
            ("next", 1, LONG, BUDGET, 0, token),
            ("ack", token),
            ("nack", 0, token),
            ("bury", "boom", token),
            ("extend", 1000, token),
            ("stats",),
            ("peek", 10),
            ("dead", 0, 10),
            ("requeue_dead", 10),
        ]
        for argv in commands:
            if argv[0] in touched_by[role]:
                message = expect_error(q, "ROTATOR_WRONGTYPE", *argv)
                assert q.key(role) in message


@scenario
def wrong_number_of_keys_gives_rotator_keys(b: Backend) -> None:
    push(b, "a")
    for keys in [b.keys[:9], (*b.keys, b.key("ring") + "x"), b.keys[:1], ()]:
        expect_error(b, "ROTATOR_KEYS", "push", "x", keys=keys)
        expect_error(b, "ROTATOR_KEYS", "stats", keys=keys)


@scenario
def a_key_of_another_queue_in_any_slot_gives_rotator_keys(b: Backend) -> None:
    """Each slot's key must be this queue's own: another queue's key of the same role and
    the same length (a name one byte apart), one whose role is a prefix or suffix of the
    right one, or a ring key too short to end in ":ring", is refused before anything."""
    push(b, "a")
    other = b.name[:-1] + ("x" if b.name[-1] != "x" else "y")
    theirs = [key.replace(b.name, other) for key in b.keys]
    assert all(len(a) == len(o) and a != o for a, o in zip(b.keys, theirs, strict=True))
    for slot in range(len(b.keys)):
        keys = (*b.keys[:slot], theirs[slot], *b.keys[slot + 1 :])
        expect_error(b, "ROTATOR_KEYS", "stats", keys=keys)
    base = b.keys[0].removesuffix(":ring")
    for slot, wrong in [(1, base + ":don"), (2, base + ":done_oldx"), (12, "x" + base + ":ids")]:
        keys = (*b.keys[:slot], wrong, *b.keys[slot + 1 :])
        expect_error(b, "ROTATOR_KEYS", "push", "x", keys=keys)
    expect_error(b, "ROTATOR_KEYS", "push", "x", keys=("ring", *b.keys[1:]))


@scenario
def the_key_check_holds_for_keys_and_bases_with_nul_bytes(b: Backend) -> None:
    """Keys that hold a NUL byte are compared as any bytes: two names in one key (with an
    empty key after them, so that the keys joined by NUL bytes read the same) are refused;
    a queue whose base holds a NUL byte works, and refuses another queue's key in any
    slot."""
    push(b, "a")
    joined_alike = (b.keys[0] + "\0" + b.keys[1], *b.keys[2:], "")
    assert "\0".join(joined_alike) == "\0".join(b.keys) + "\0"
    expect_error(b, "ROTATOR_KEYS", "push", "x", keys=joined_alike)
    shifted = (b.keys[0] + "\0" + b.keys[1], *b.keys[2:-1], b.keys[-1][:-1])
    expect_error(b, "ROTATOR_KEYS", "stats", keys=shifted)
    q, other = b.fresh("nul\0in-base"), b.fresh("nul\0in-basf")
    assert "\0" in q.keys[0]
    push(q, "a", "b")
    reply = q.call("next", 1, LONG, BUDGET, 0)
    assert isinstance(reply, list), reply
    token = reply[3]
    assert isinstance(token, str), reply
    assert token.startswith("a*"), reply
    assert q.call("ack", token) == 1
    for slot in range(len(q.keys)):
        keys = (*q.keys[:slot], other.keys[slot], *q.keys[slot + 1 :])
        expect_error(q, "ROTATOR_KEYS", "stats", keys=keys)


@scenario
def unknown_command_gives_badcmd(b: Backend) -> None:
    push(b, "a")
    for argv in [("frobnicate",), ("PUSH", "x"), ("Next", 1, LONG, BUDGET, 0), ("",)]:
        expect_error(b, "ROTATOR_BADCMD", *argv)
    expect_error(b, "ROTATOR_BADCMD")


# -- the storage format (FORMAT) ------------------------------------------------------------

# What a later module that stores something another way would write in meta's `format`.
NEWER_FORMAT = "2"


@scenario
def a_queue_in_another_storage_format_refuses_every_command_and_changes_nothing(
    b: Backend,
) -> None:
    """A queue whose meta names a storage format other than this module's (a newer module
    converted it, or a person wrote it) refuses every command with ROTATOR_FORMAT, naming
    the format, and nothing changes; this module's format ("1"), or none, goes on. This
    module never writes the field."""
    held = lease_one(b, "a")
    push(b, "b", "c")
    assert "format" not in b.hgetall("meta")
    commands: list[tuple[str | int, ...]] = [
        ("push", "x"),
        ("push_later", "IN", 1000, "x"),
        ("push_priority", 3, "IN", 0, "x"),
        ("next", 1, LONG, BUDGET, 0),
        ("next_packed", 1, LONG, BUDGET, 0, held.text),
        ("ack", held.text),
        ("nack", 0, held.text),
        ("bury", "boom", held.text),
        ("extend", 1000, held.text),
        ("pause",),
        ("configure", "dead_max", 10),
        ("sweep", BUDGET),
        ("stats",),
        ("peek", 10),
        ("dead", 0, 10),
        ("delete",),
    ]
    for written in (NEWER_FORMAT, "0", "1.0", ""):
        b.raw_hset("meta", "format", written)
        for argv in commands:
            message = expect_error(b, "ROTATOR_FORMAT", *argv)
            assert f'storage format "{written}"' in message, message
        expect_error(b, "ROTATOR_BADCMD", "no_such")  # (known before the queue is read)
    for argv in [("pushp", "p", "body"), ("nextp", 1, LONG, BUDGET, 0, 1)]:
        expect_error(b, "ROTATOR_FORMAT", *argv, keys=payload_keys(b))
    b.raw_hset("meta", "format", "1")  # this module's: as if absent
    assert b.call("push", "d") == 1
    assert ack(b, held.text) == 1
    assert nxt(b, 3).ids == ["b", "c", "d"]
    b.raw_command("HDEL", b.key("meta"), "format")
    assert b.call("push", "e") == 1
    assert "format" not in b.hgetall("meta")


@scenario
@library_only
def the_read_only_function_refuses_a_queue_in_another_storage_format(b: Backend) -> None:
    push(b, "a")
    b.raw_hset("meta", "format", NEWER_FORMAT)
    before = b.snapshot()
    for argv in [("stats",), ("peek", 10), ("scan", 0, 100, 100), ("durations",)]:
        with pytest.raises(ReplyError) as caught:
            b.call_read_only(*argv)
        assert caught.value.code == "ROTATOR_FORMAT", (argv, caught.value)
    assert b.snapshot() == before


@scenario
def a_topic_in_another_storage_format_refuses_its_commands_and_changes_nothing(
    b: Backend,
) -> None:
    """A topic command checks the topic's own hash (KEYS[1]); a group's queue commands check
    the group's meta, as any queue's do."""
    subscribe(b, "g")
    publish(b, ("g",), "one")
    everything = with_groups(b, "g")
    meta = topic_keys(b)[0]
    b.raw_command("HSET", meta, "format", NEWER_FORMAT)
    before = state_of(b, everything)
    refused: list[tuple[tuple[str, ...], tuple[str | int, ...]]] = [
        (everything, ("tpublish", 0, 0, "two")),
        (everything, ("tsubscribe", "g")),
        (everything, ("tstats",)),
        (topic_keys(b), ("tseek", 0)),
        (topic_keys(b), ("ttrim", 0, 0, 10)),
    ]
    for keys, argv in refused:
        with pytest.raises(ReplyError) as caught:
            b.call_keys(keys, *argv)
        assert caught.value.code == "ROTATOR_FORMAT", (argv, caught.value)
        assert state_of(b, everything) == before
    assert [i for i, _ in group_next(b, "g")] != []  # the group's own meta: format 1
    b.raw_command("HDEL", meta, "format")
    b.raw_command("HSET", group_keys(b, "g")[8], "format", NEWER_FORMAT)
    with pytest.raises(ReplyError) as caught:
        group_next(b, "g")
    assert caught.value.code == "ROTATOR_FORMAT"
    assert len(publish(b, ("g",), "two")) == 1  # (a topic command: the topic's format)


# -- stats and peek --------------------------------------------------------------------------


@scenario
def stats_follow_a_job_through_its_lifecycle(b: Backend) -> None:
    zero = {
        "length": 0,
        "pending": 0,
        "in_flight": 0,
        "done": 0,
        "deferred": 0,
        "dead": 0,
        "oldest_pending_age_ms": -1,
        "overdue": 0,
        "overdue_capped": 0,
        "scheduled": 0,
        "paused": 0,
        "schedules": 0,
        "rate_limit_jobs": 0,
        "rate_limit_ms": 0,
        "prioritized": 0,
    }
    assert stats(b) == zero

    def expect(age: tuple[int, int] | None = None, **fields: int) -> None:
        got = stats(b)
        oldest = got.pop("oldest_pending_age_ms")
        want = {**zero, **fields}
        want.pop("oldest_pending_age_ms")
        assert got == want
        if age is None:
            assert oldest == -1
        else:
            within(oldest, *age)

    push(b, "a", "b", "c")
    b.sleep_ms(200)
    young = (200, 200) if b.exact_clock else (200, 5000)
    expect(young, length=3, pending=3)
    ta = nxt(b, 1, LONG).tokens[0]
    expect(young, length=3, pending=2, in_flight=1)
    assert ack(b, ta) == 1
    expect(young, length=3, pending=2, done=1)
    tb = nxt(b, 1, LONG).tokens[0]  # its walk of the lease list took a's acked lease
    expect(young, length=2, pending=1, in_flight=1)
    assert b.call("nack", LONG, tb) == [1]
    expect(young, length=2, pending=1, deferred=1)
    tc = nxt(b, 1, LONG).tokens[0]
    expect(None, length=2, in_flight=1, deferred=1)
    assert ack(b, tc) == 1
    expect(None, length=2, done=1, deferred=1)
    laps(b, 1)
    expect(None, length=1, deferred=1)
    b.raw_rpush("ring", "x*")
    laps(b, 1)
    expect(None, length=1, deferred=1, dead=1)


@scenario
def peek_shows_states_without_changing_anything(b: Backend) -> None:
    push(b, "a", "b", "c", "d", "e")
    got = nxt(b, 4, LONG)
    ta, tb, tc, td = got.tokens
    assert ack(b, ta) == 1
    assert b.call("nack", LONG, tb) == [1]
    extended = ints(b.call("extend", 2 * LONG, tc))[0]
    b.raw_rpush("ring", "x*")
    due = int(b.hgetall("marks")[tb][1:])
    before = b.snapshot()
    rows = peek(b)
    assert b.snapshot() == before
    # Tail first: the raw element, then the order the ring will be visited in, then the lease
    # list's from its tail.
    assert rows[0] == ("x*", "corrupt", 0)
    by_element = {element: (state, at) for element, state, at in rows}
    assert by_element == {
        "x*": ("corrupt", 0),
        "e": ("pending", 0),
        SENTINEL: ("lap", 0),
        ta: ("done", 0),
        tb: ("deferred", due),
        tc: ("leased", extended),
        td: ("leased", parse_token(td).deadline),
    }
    # A packed batch is visited (and shown) first job first.
    in_order = unpacked(list(reversed(b.ring())) + list(reversed(b.leases())))
    assert [element for element, _, _ in rows] == in_order
    assert [element for element, _, _ in peek(b, 2)] == [element for element, _, _ in rows[:2]]


# -- the clock over hours (fake clock only) --------------------------------------------------


@scenario
@fake_clock_only
def revoked_tokens_are_forgotten_after_two_days(b: Backend) -> None:
    old = lease_one(b, "a", SHORT)
    b.sleep_ms(PAST_SHORT)
    new = nxt(b, 10, LONG).tokens[0]
    assert revoked(b, old.text)
    assert ack(b, new) == 1
    laps(b, 2)
    assert revoked(b, old.text)  # still refused after laps...
    assert ack(b, old.text) == 0
    b.sleep_ms(REVOKED_KEEP_MS + 1)
    laps(b, 1)
    assert not b.exists("revoked")  # ...but not remembered forever


@scenario
@fake_clock_only
def oldest_pending_age_survives_many_push_checkpoints(b: Backend) -> None:
    # One push a second for 70 s: 70 checkpoints in the push log. Then most are consumed.
    start = b.now_ms()
    for i in range(70):
        push(b, f"j{i}")
        b.sleep_ms(1001)
    got = nxt(b, 65, LONG)
    assert len(got.jobs) == 65
    s = stats(b)
    assert s["pending"] == 5
    # j65 was pushed 65 * 1001 ms after the start.
    want = b.now_ms() - (start + 65 * 1001)
    assert s["oldest_pending_age_ms"] == want, f"{s} (want oldest {want})"


@scenario
def pushes_within_a_second_share_the_newest_checkpoint_unwritten(b: Backend) -> None:
    # Only a push that starts a checkpoint writes the push log; the pushes of its second after
    # it write nothing there, and the age of the oldest pending job still finds that
    # checkpoint once the jobs pushed before it are taken (its count is meta pushed).
    push(b, "a")
    b.sleep_ms(1001)
    push(b, "b")
    log = b.lrange("pushlog")
    assert [entry.split(":")[0] for entry in log] == ["2", "1"], log
    push(b, "c", "d")
    assert b.lrange("pushlog") == log  # (c and d share b's checkpoint)
    assert nxt(b, 2, LONG).ids == ["a", "b"]
    s = stats(b)
    assert s["pending"] == 2
    since_b, since_a = (b.now_ms() - int(entry.split(":")[1]) for entry in log)
    age = s["oldest_pending_age_ms"]
    if b.exact_clock:
        assert age == since_b, f"{s} (want {since_b})"
    else:  # (c was pushed in b's second, a second after a's)
        assert 0 <= age <= since_b < since_a, (age, since_b, since_a)


@scenario
def the_counters_count_what_happened(b: Backend) -> None:
    assert counters(b) == dict.fromkeys(COUNTERS, 0)
    push(b, "a", "b", "c", "d", "e")
    first = nxt(b, 3, SHORT)  # a b c, in one packed batch
    assert b.call("nack", SHORT, first.tokens[1]) == [1]  # b given back for SHORT ms
    assert ack(b, first.tokens[0]) == 1  # a acked (c's lease runs out)
    got = nxt(b, 2, LONG)  # d e
    b.sleep_ms(PAST_SHORT)
    again = nxt(b, 10, LONG, max_deliveries=0)  # b (due) and c (expired)
    assert sorted(again.ids) == ["b", "c"]
    assert sorted(r for _, r in again.jobs) == [0, 1]
    assert ack(b, *got.tokens, *again.tokens) == 4
    b.call("sweep", BUDGET)
    push(b, "f")
    assert nxt(b, 1, SHORT).ids == ["f"]
    b.sleep_ms(PAST_SHORT)
    assert nxt(b, 10, LONG, max_deliveries=1).jobs == []  # f had its one delivery
    b.call("sweep", BUDGET)
    assert counters(b) == {
        "pushed": 6,
        "delivered": 8,  # six first deliveries, b and c again
        "completed": 5,
        "retried": 1,
        "reclaimed": 1,  # c
        "dead_lettered": 1,  # f
        "cancelled": 0,
    }
    assert stats(b)["length"] == 0


@scenario
def a_counter_written_by_hand_starts_again_and_fails_no_call(b: Backend) -> None:
    # The calls add to the counters (HINCRBY) after their other writes: one that is not a
    # whole number must not fail them; the next change starts it again from what it adds.
    for field, value in (("completed", "x"), ("redelivered", "1.5"), ("reclaimed", "-")):
        b.raw_hset("meta", field, value)
    b.raw_hset("meta", "retried", "9" * 30)  # past a 64-bit integer
    push(b, "a", "b", "c")
    first = nxt(b, 3, SHORT)
    assert counters(b)["completed"] == 0
    assert b.call("nack", 0, first.tokens[1]) == [1]
    assert ack(b, first.tokens[0]) == 1
    b.sleep_ms(PAST_SHORT)
    again = nxt(b, 10, LONG, max_deliveries=2)  # b (given back) and c (expired)
    assert sorted(again.ids) == ["b", "c"]
    assert counters(b) == {
        "pushed": 3,
        "delivered": 5,
        "completed": 1,
        "retried": 1,
        "reclaimed": 1,
        "dead_lettered": 0,
        "cancelled": 0,
    }
    assert b.hgetall("meta")["redelivered"] == "2"


@scenario
def durations_add_to_the_histogram_and_check_every_pair_first(b: Backend) -> None:
    assert ints(b.call("durations")) == [0] * 27
    got = ints(b.call("durations", 20_000_060, 0, 3, 5, 2, 25, 1, 5, 1))
    assert got == [3, 0, 0, 0, 0, 3] + [0] * 19 + [1, 20_000_060]
    cases: list[tuple[str | int, ...]] = [
        ("durations", 5, 26, 1),
        ("durations", 5, -1, 1),
        ("durations", 5, 3, 0),
        ("durations", 5, 3),
        ("durations", 5),
        ("durations", -5, 3, 1),
        ("durations", 5, 3, 1, 4, "x"),
    ]
    for argv in cases:
        expect_error(b, "ROTATOR_BADARG", *argv)
    assert ints(b.call("durations"))[5] == 3
    got_stats = all_stats(b)
    assert (got_stats["d5"], got_stats["d25"], got_stats["dsum"]) == (3, 1, 20_000_060)


@scenario
def processing_times_ride_on_a_next_or_an_ack(b: Backend) -> None:
    push(b, "a", "b", "c")
    got = nxt(b, 2)
    reply = b.call("next", 1, LONG, BUDGET, 0, *got.tokens, "#70,5:1,6:1")
    assert isinstance(reply, list)
    assert reply[2] == 2  # both acked; the times were not taken for a token
    [token] = [str(reply[3])]
    assert b.call("ack", token, "#3,2:1") == 1
    assert ints(b.call("durations"))[2:7] == [1, 0, 0, 1, 1]
    assert all_stats(b)["dsum"] == 73
    assert b.call("next", 1, LONG, BUDGET, 0, "#1,0:1") == [1, LONG, 0]  # with no token too
    for bad in ["#", "#5", "#5,", "#5,26:1", "#5,3:0", "#5,3:1,", "#x,1:1", "#5;1:1"]:
        expect_error(b, "ROTATOR_BADARG", "ack", token, bad)
        expect_error(b, "ROTATOR_BADARG", "next", 1, LONG, BUDGET, 0, bad)
    assert b.call("ack", "#5*1.1.1") == 0  # a token that starts with "#": an id may


# -- scheduled jobs (push_later) and pause ----------------------------------------------------


def later(b: Backend, mode: str, ms: int, *ids: str) -> None:
    assert b.call("push_later", mode, ms, *ids) == len(ids)


@scenario
def push_later_is_not_delivered_before_its_time(b: Backend) -> None:
    before = b.now_ms()
    later(b, "IN", DELAY, "x")
    after = b.now_ms()
    assert stats(b)["scheduled"] == 1
    assert stats(b)["length"] == 0  # not in the ring yet
    within(int(b.zscores("scheduled")["x"]), before + DELAY, after + DELAY)
    got = nxt(b)
    assert (got.jobs, got.idle) == ([], 1)
    within(got.wait_ms, 1, DELAY)  # an idle consumer blocks until it falls due
    b.sleep_ms(DELAY + 60)
    got = nxt(b)
    assert [(t.id, t.n, r) for t, r in got.jobs] == [("x", 1, 0)]
    assert stats(b)["scheduled"] == 0
    assert b.key_state(b.keys[KEY_ROLES.index("scheduled")]) == ("none", None)
    assert "smin" not in b.hgetall("meta")


@scenario
def a_due_scheduled_job_queues_behind_the_pending_ones(b: Backend) -> None:
    push(b, "a", "b")
    later(b, "AT", 0, "c")  # a time passed: due at once
    later(b, "AT", b.now_ms() + 60_000, "d")
    assert nxt(b, 10).ids == ["a", "b", "c"]
    assert stats(b)["scheduled"] == 1
    assert b.hgetall("meta")["smin"] == str(int(b.zscores("scheduled")["d"]))


@scenario
def an_id_scheduled_again_moves_to_its_new_time(b: Backend) -> None:
    later(b, "IN", 60_000, "m", "n")
    later(b, "IN", 0, "m", "m")  # one scheduled job per id
    assert stats(b)["scheduled"] == 2
    got = nxt(b, 10)
    assert got.ids == ["m"]
    assert stats(b)["scheduled"] == 1


@scenario
def push_later_wakes_an_idle_consumer_only_when_it_brings_the_time_forward(b: Backend) -> None:
    push(b, "p")
    nxt(b)
    assert nxt(b).idle == 1  # a lap found nothing: the wake-ups are cleared
    assert b.llen("wake") == 0
    later(b, "IN", 60_000, "x")
    assert b.llen("wake") == 1
    got = nxt(b)
    assert got.idle == 1
    within(got.wait_ms, 1, 60_000)  # the consumer blocks until x falls due
    assert b.llen("wake") == 0
    later(b, "IN", 120_000, "y")  # later than what the consumer waits for: no wake-up
    assert b.llen("wake") == 0
    later(b, "IN", 30_000, "z")
    assert b.llen("wake") == 1


@scenario
def push_later_checks_its_arguments_before_writing(b: Backend) -> None:
    later(b, "IN", 60_000, "kept")
    push(b, "p")
    ten_years = 3650 * 86_400_000
    cases: list[tuple[tuple[str | int, ...], str]] = [
        (("push_later", "SOON", 10, "a"), "ROTATOR_BADARG"),
        (("push_later", "in", 10, "a"), "ROTATOR_BADARG"),
        (("push_later", "IN", -1, "a"), "ROTATOR_BADARG"),
        (("push_later", "IN", ten_years + 1, "a"), "ROTATOR_BADARG"),
        (("push_later", "AT", b.now_ms() + ten_years + 60_000, "a"), "ROTATOR_BADARG"),
        (("push_later", "AT", "soon", "a"), "ROTATOR_BADARG"),
        (("push_later", "IN", 10, "a", "b*"), "ROTATOR_BADID"),
        (("push_later", "IN", 10, ""), "ROTATOR_BADID"),
        (("push_later", "IN", 10, *(["i"] * 5001)), "ROTATOR_TOOMANY"),
        (("push_later",), "ROTATOR_BADARG"),
    ]
    for argv, code in cases:
        expect_error(b, code, *argv)
    assert b.call("push_later", "IN", 10) == 0  # no ids: nothing to do
    b.raw_set_key(b.keys[N_QUEUE_KEYS - 1], "oops")
    with pytest.raises(ReplyError) as caught:
        b.call("push_later", "IN", 10, "a")
    assert "WRONGTYPE" in str(caught.value)


@scenario
def a_paused_queue_takes_pushes_and_acks_and_leases_nothing(b: Backend) -> None:
    out = lease_one(b, "a", SHORT)
    push(b, "b")
    assert b.call("pause") == 1
    assert b.call("pause") == 0
    assert stats(b)["paused"] == 1
    push(b, "c")
    b.sleep_ms(PAST_SHORT)  # a's lease expires: not reclaimed while paused
    got = nxt(b, 10, acks=(out.text,))
    assert (got.idle, got.wait_ms, got.acked, got.jobs) == (1, LONG, 1, [])
    assert b.llen("wake") == 0  # no spin on the wake-ups of pushes made while paused
    assert b.call("resume") == 1
    assert b.call("resume") == 0
    assert b.llen("wake") == 16  # the idle consumers wake
    assert stats(b)["paused"] == 0
    assert sorted(nxt(b, 10).ids) == ["b", "c"]  # a was acked


@scenario
def a_paused_queue_holds_its_due_scheduled_jobs(b: Backend) -> None:
    later(b, "AT", 0, "s")
    assert b.call("pause") == 1
    assert nxt(b).jobs == []
    assert stats(b)["scheduled"] == 1
    assert b.call("resume") == 1
    assert nxt(b).ids == ["s"]


@scenario
def pushp_later_keeps_the_payload_and_a_move_counts_no_copy(b: Backend) -> None:
    keys = payload_keys(b)
    assert b.call_keys(keys, "pushp_later", "IN", 60_000, "a", "p1", "b", "pb") == 2
    assert b.call_keys(keys, "pushp_later", "AT", 0, "a", "p2") == 1  # a moves; new payload
    reply = nextp(b, 10, 1)
    assert [parse_token(str(t)).id for t in reply[3::3]] == ["a"]
    assert reply[5::3] == ["p2"]
    assert b.call_keys(keys, "ackp", str(reply[3])) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"b": "pb"})  # a's payload gone
    expect_error(b, "ROTATOR_BADARG", "pushp_later", "IN", 10, "a", keys=keys)
    expect_error(b, "ROTATOR_BADARG", "pushp_later", "IN", -5, "a", "p", keys=keys)
    expect_error(b, "ROTATOR_BADID", "pushp_later", "IN", 10, "a*", "p", keys=keys)


@scenario
def a_rate_limit_holds_every_consumer_to_its_jobs_per_period(b: Backend) -> None:
    assert b.call("rate_limit", 3, 1000) == 1
    push(b, *(f"j{i}" for i in range(10)))
    first = nxt(b, 10)
    assert len(first.jobs) == 3  # the burst: JOBS at once
    held = nxt(b, 10, acks=(first.tokens[0],))
    assert (held.jobs, held.idle, held.acked) == ([], 1, 1)  # acks go on
    within(held.wait_ms, 1, 334)  # one more may go a third of a second on
    assert (stats(b)["rate_limit_jobs"], stats(b)["rate_limit_ms"]) == (3, 1000)
    b.sleep_ms(held.wait_ms + 40)
    assert len(nxt(b, 10).jobs) == 1
    assert b.call("rate_limit", 0, 1) == 1  # lifted
    assert len(nxt(b, 10).jobs) == 6
    assert (stats(b)["rate_limit_jobs"], stats(b)["rate_limit_ms"]) == (0, 0)
    cases: list[tuple[str | int, ...]] = [
        ("rate_limit", -1, 1000),
        ("rate_limit", 5, 0),
        ("rate_limit", "x", 1000),
        ("rate_limit", 5, 86_400_001),
        ("rate_limit", 5),
    ]
    for argv in cases:
        expect_error(b, "ROTATOR_BADARG", *argv)


@scenario
def a_rate_limit_counts_the_jobs_of_a_packed_call(b: Backend) -> None:
    assert b.call("rate_limit", 5, 60_000) == 1
    push(b, *(f"j{i}" for i in range(8)))
    reply = b.call("next_packed", 4, LONG, BUDGET, 0)
    assert isinstance(reply, list)
    assert str(reply[3]).count("*") - 1 == 4
    reply = b.call("next_packed", 4, LONG, BUDGET, 0)
    assert isinstance(reply, list)
    assert str(reply[3]).count("*") - 1 == 1  # five in the period
    assert b.call("next_packed", 4, LONG, BUDGET, 0)[0] == 1  # type: ignore[index]


# -- recurring schedules -----------------------------------------------------------------------


def schedules(b: Backend) -> dict[str, tuple[str, int, str, int, int, int]]:
    """name -> (job_id, every_ms, spec, next_tick_ms, last_tick_ms, dues_left)."""
    reply = b.call("schedules")
    assert isinstance(reply, list), reply
    assert len(reply) % 8 == 0, reply
    rows = {}
    for i in range(0, len(reply), 8):
        name, job, every, spec, next_tick, last, left, last_due = reply[i : i + 8]
        numbers = [every, next_tick, last, left, last_due]
        assert all(isinstance(number, int) for number in numbers), reply
        every_ms, next_ms, last_ms, dues_left, last_due_ms = (int(str(n)) for n in numbers)
        assert (last_due_ms == -1) == (dues_left == 0), reply
        rows[str(name)] = (str(job), every_ms, str(spec), next_ms, last_ms, dues_left)
    return rows


@scenario
def an_interval_schedule_pushes_one_job_per_tick(b: Backend) -> None:
    before = b.now_ms()
    assert b.call("schedule", "SET", "often", "report", DELAY, "every 0.3 s") == 1
    assert b.call("schedule", "SET", "often", "report", DELAY, "every 0.3 s") == 0  # the same
    [(job, every, spec, first, last, left)] = schedules(b).values()
    assert (job, every, spec, last, left) == ("report", DELAY, "every 0.3 s", 0, 0)
    within(first, before + DELAY, b.now_ms() + DELAY)
    assert (stats(b)["schedules"], stats(b)["scheduled"]) == (1, 0)  # a schedule is no job
    got = nxt(b)
    assert (got.jobs, got.idle) == ([], 1)
    within(got.wait_ms, 1, DELAY)  # idle consumers wake for the tick
    b.sleep_ms(DELAY + 60)
    assert nxt(b).ids == [f"report@{first}"]
    assert nxt(b).ids == []  # one job per tick, however many consumers call
    (_, _, _, second, last, _) = schedules(b)["often"]
    assert last == first
    assert second > b.now_ms() - 60 or second == first + DELAY
    assert (second - first) % DELAY == 0


@scenario
def ticks_missed_make_one_catch_up_job(b: Backend) -> None:
    assert b.call("schedule", "SET", "s", "job", SHORT, "every 0.1 s") == 1
    (_, _, _, first, _, _) = schedules(b)["s"]
    b.sleep_ms(5 * SHORT + 30)  # five ticks pass with no consumer
    assert nxt(b, 100).ids == [f"job@{first}"]
    (_, _, _, following, last, _) = schedules(b)["s"]
    assert last == first
    assert following > b.now_ms() - SHORT  # the next tick after now, not the ones missed
    assert (following - first) % SHORT == 0


@scenario
def a_schedule_with_due_times_idles_when_they_run_out_and_fill_gives_more(b: Backend) -> None:
    now = b.now_ms()
    dues = [now + 100, now + 200, now + 300]
    assert b.call("schedule", "SET", "c", "j", 0, "*/5 * * * *", *dues) == 1
    assert schedules(b)["c"] == ("j", 0, "*/5 * * * *", dues[0], 0, 3)
    b.sleep_ms(400)
    assert nxt(b, 10).ids == [f"j@{dues[0]}"]  # all three passed: one catch-up job
    assert schedules(b)["c"] == ("j", 0, "*/5 * * * *", -1, dues[0], 0)
    assert stats(b)["schedules"] == 1
    # FILL only for the same schedule; due times up to the last tick are dropped.
    later_dues = [dues[0], b.now_ms() + 60_000]
    assert b.call("schedule", "FILL", "c", "j", 0, "0 * * * *", *later_dues) == 0
    assert schedules(b)["c"][3] == -1
    assert b.call("schedule", "FILL", "c", "j", 0, "*/5 * * * *", *later_dues) == 0
    assert schedules(b)["c"] == ("j", 0, "*/5 * * * *", later_dues[1], dues[0], 1)
    assert b.call("schedule", "FILL", "nope", "j", 0, "x", later_dues[1]) == 0
    assert "schedule:nope" not in b.hgetall("meta")


@scenario
def unschedule_forgets_the_schedule_and_its_tick(b: Backend) -> None:
    assert b.call("schedule", "SET", "a", "ja", 60_000, "") == 1
    assert b.call("schedule", "SET", "b", "jb", 60_000, "") == 1
    later(b, "IN", 60_000, "plain")
    assert (stats(b)["schedules"], stats(b)["scheduled"]) == (2, 1)
    assert b.call("unschedule", "a") == 1
    assert b.call("unschedule", "a") == 0
    assert list(schedules(b)) == ["b"]
    assert set(b.zscores("scheduled")) == {"*b", "plain"}
    assert (stats(b)["schedules"], stats(b)["scheduled"]) == (1, 1)
    # SET with another interval replaces the schedule (and its next tick).
    assert b.call("schedule", "SET", "b", "jb", 120_000, "") == 1
    within(schedules(b)["b"][3], b.now_ms() + 119_000, b.now_ms() + 120_000)


@scenario
def a_paused_queue_makes_one_catch_up_tick_on_resume(b: Backend) -> None:
    assert b.call("schedule", "SET", "p", "job", SHORT, "") == 1
    assert b.call("pause") == 1
    b.sleep_ms(3 * SHORT + 30)
    assert nxt(b).jobs == []
    assert b.call("resume") == 1
    assert len(nxt(b, 100).ids) == 1


@scenario
def schedule_checks_its_arguments_before_writing(b: Backend) -> None:
    assert b.call("schedule", "SET", "kept", "job", 60_000, "") == 1
    now = b.now_ms()
    cases: list[tuple[tuple[str | int, ...], str]] = [
        (("schedule", "PUT", "n", "j", 1000, ""), "ROTATOR_BADARG"),
        (("schedule", "SET", "", "j", 1000, ""), "ROTATOR_BADARG"),
        (("schedule", "SET", "a b", "j", 1000, ""), "ROTATOR_BADARG"),
        (("schedule", "SET", "n" * 129, "j", 1000, ""), "ROTATOR_BADARG"),
        (("schedule", "SET", "n", "j*k", 1000, ""), "ROTATOR_BADID"),
        (("schedule", "SET", "n", "j" * 1009, 1000, ""), "ROTATOR_BADID"),
        (("schedule", "SET", "n", "j", -1, ""), "ROTATOR_BADARG"),
        (("schedule", "SET", "n", "j", 1000, "", now + 5), "ROTATOR_BADARG"),
        (("schedule", "SET", "n", "j", 0, ""), "ROTATOR_BADARG"),
        (("schedule", "SET", "n", "j", 0, "", now + 5, now + 5), "ROTATOR_BADARG"),
        (("schedule", "SET", "n", "j", 0, "", *range(now, now + 1001)), "ROTATOR_BADARG"),
        (("schedule", "SET", "n", "j", 0, "", now + 3651 * 86_400_000), "ROTATOR_BADARG"),
        (("schedule", "SET", "n", "j", 1000, "s" * 257), "ROTATOR_BADARG"),
        (("schedule", "SET", "n", "j"), "ROTATOR_BADARG"),
    ]
    for argv, code in cases:
        expect_error(b, code, *argv)


@fake_clock_only
@scenario
def a_queue_holds_at_most_1000_schedules(b: Backend) -> None:
    for i in range(1000):
        assert b.call("schedule", "SET", f"s{i}", "j", 60_000, "") == 1
    expect_error(b, "ROTATOR_TOOMANY", "schedule", "SET", "one-more", "j", 60_000, "")
    assert b.call("schedule", "SET", "s0", "j", 30_000, "") == 1  # changing one is fine
    assert stats(b)["schedules"] == 1000


# -- a queue that tracks ids: unique jobs and cancel (IDS) ---------------------------------------


def track(b: Backend) -> None:
    reply = b.call("configure", "track_ids", 1)
    assert isinstance(reply, list), reply
    assert reply[-2:] == ["track_ids", 1], reply


def index(b: Backend) -> dict[str, str]:
    return b.hgetall("ids")


@scenario
def a_tracked_queue_holds_each_id_once(b: Backend) -> None:
    track(b)
    assert b.call("push", "a", "a", "b") == 2
    assert b.call("unique", "push", "b", "c") == 1
    assert index(b) == {"a": "p", "b": "p", "c": "p"}
    got = nxt(b, 2)
    assert got.ids == ["a", "b"]
    # A lease's entry is its stamp: its token less "<id>*".
    assert {i: index(b)[i] for i in ("a", "b")} == {
        t.id: t.text.split("*", 1)[1] for t, _ in got.jobs
    }
    assert b.call("push", "a", "b", "c") == 0  # in flight, in flight, waiting
    assert stats(b)["length"] == 3
    assert ack(b, got.tokens[0]) == 1
    # Acked is gone at once, though its lease waits for a walk to remove it.
    assert b.call("push", "a") == 1
    assert index(b)["a"] == "p"
    b.call("sweep", BUDGET)
    assert index(b)["a"] == "p"  # the old lease's removal leaves the new copy's entry
    assert nxt(b, 10).ids == ["c", "a"]
    assert counters(b)["pushed"] == 4


@scenario
def a_tracked_queue_forgets_each_job_as_it_leaves(b: Backend) -> None:
    track(b)
    push(b, "a", "b", "c", "d")
    first = nxt(b, 2)  # a b, one packed batch
    batch = batch_of(first.tokens[0])
    assert batch is not None
    assert ack(b, f"{batch}/2") == 1  # acked whole
    assert b.call("push", "a") == 1  # free at once
    single = nxt(b, 1, SHORT)  # c, which will expire
    assert single.ids == ["c"]
    b.sleep_ms(PAST_SHORT)
    got = nxt(b, 10, LONG, max_deliveries=1)  # c dead-lettered, d and a leased
    assert sorted(got.ids) == ["a", "d"]
    assert "c" not in index(b)
    assert ack(b, *got.tokens) == 2
    b.call("sweep", BUDGET)
    assert index(b) == {}
    # A dead letter brought back is held again.
    assert b.call("requeue_dead", 10) == 1
    assert index(b) == {"c": "p"}
    assert b.call("push", "c") == 0


@scenario
def unique_and_cancel_need_a_tracked_queue_and_tracking_an_empty_one(b: Backend) -> None:
    expect_error(b, "ROTATOR_UNTRACKED", "unique", "push", "x")
    expect_error(b, "ROTATOR_UNTRACKED", "unique", "push_later", "IN", DELAY, "x")
    expect_error(b, "ROTATOR_UNTRACKED", "cancel", "x")
    expect_error(b, "ROTATOR_BADARG", "unique", "next", 1, LONG, BUDGET, 0)
    expect_error(b, "ROTATOR_BADARG", "configure", "track_ids", 2)
    push(b, "x")
    expect_error(b, "ROTATOR_BADARG", "configure", "track_ids", 1)
    got = nxt(b, 1)
    expect_error(b, "ROTATOR_BADARG", "configure", "track_ids", 1)  # in flight
    assert ack(b, *got.tokens) == 1
    b.call("sweep", BUDGET)
    later(b, "IN", 60_000, "y")
    expect_error(b, "ROTATOR_BADARG", "configure", "track_ids", 1)  # scheduled
    b.call("delete")
    track(b)
    expect_error(b, "ROTATOR_BADID", "cancel", "a*b")
    push(b, "z")
    assert index(b) == {"z": "p"}
    reply = b.call("configure", "track_ids", 0)
    assert isinstance(reply, list), reply
    assert reply[-2:] == ["track_ids", 0], reply
    assert b.key_state(b.keys[KEY_ROLES.index("ids")]) == ("none", None)
    assert b.call("push", "z") == 1  # untracked: a second copy


@scenario
def cancel_finds_scheduled_waiting_and_in_flight_jobs(b: Backend) -> None:
    track(b)
    later(b, "IN", DELAY, "s")
    push(b, "w1", "w2")
    held = nxt(b, 1, SHORT)  # w1 in flight
    assert held.ids == ["w1"]
    assert b.call("cancel", "s", "w1", "w2", "nope", "w2") == 3
    assert b.call("cancel", "s", "w1", "w2") == 0  # cancelled already
    assert stats(b)["scheduled"] == 0
    assert ack(b, held.tokens[0]) == 0  # its token is revoked
    assert ints(b.call("extend", LONG, held.tokens[0]))[1:] == [-1]
    assert b.call("nack", 0, held.tokens[0]) == [0]
    got = nxt(b, 10)
    assert (got.jobs, got.idle) == ([], 1)  # w2 dropped at its visit
    b.sleep_ms(max(PAST_SHORT, DELAY + 60))
    assert nxt(b, 10).jobs == []  # neither w1's expired lease nor s comes back
    b.call("sweep", BUDGET)
    assert index(b) == {}
    assert stats(b)["length"] == 0
    assert counters(b)["cancelled"] == 3


@scenario
def a_batch_with_a_cancelled_job_is_acked_token_by_token(b: Backend) -> None:
    track(b)
    push(b, "a", "b", "c")
    got = nxt(b, 3, SHORT)
    batch = batch_of(got.tokens[0])
    assert batch is not None
    assert b.call("cancel", "b") == 1
    assert ack(b, f"{batch}/3") == 0  # would cover b
    assert ack(b, got.tokens[0], got.tokens[2]) == 2
    b.sleep_ms(PAST_SHORT)
    assert nxt(b, 10).jobs == []  # b is not leased again
    b.call("sweep", BUDGET)
    assert (index(b), stats(b)["length"]) == ({}, 0)


@scenario
def a_cancelled_id_pushed_again_runs_once(b: Backend) -> None:
    track(b)
    push(b, "x")
    assert b.call("cancel", "x") == 1
    assert index(b) == {"*x": "1"}  # one cancelled pending copy, until the walk drops it
    assert b.call("push", "x") == 1  # a new copy: the walk drops one of the two
    assert b.lrange("ring").count("x") == 2
    assert nxt(b, 10).ids == ["x"]
    assert index(b)["x"] != "p"  # leased
    assert "*x" not in index(b)
    push(b, "y")
    old = nxt(b, 1, SHORT)
    assert b.call("cancel", "y") == 1
    assert b.call("push", "y") == 1  # a new copy; the old lease is dropped at its visit
    assert nxt(b, 10).ids == ["y"]
    b.sleep_ms(PAST_SHORT)
    assert nxt(b, 10).jobs == []
    assert ack(b, old.tokens[0]) == 0


@scenario
def a_cancelled_copy_is_dropped_whatever_becomes_of_its_id(b: Backend) -> None:
    """Three ways an id's later history once hid a cancelled copy from the walk (found by the
    model test): cancelled, scheduled and cancelled again; cancelled and scheduled to run at
    once; a lease cancelled, the id pushed and cancelled again."""
    track(b)
    push(b, "a")
    assert b.call("cancel", "a") == 1
    later(b, "IN", 100_000, "a")
    assert b.call("cancel", "a") == 1
    assert nxt(b, 5).jobs == []
    push(b, "c", "d")
    assert b.call("cancel", "c") == 1
    later(b, "IN", 0, "c")
    both = nxt(b, 5)
    assert sorted(both.ids) == ["c", "d"]  # one c, not two
    assert ack(b, *both.tokens) == 2
    push(b, "e", "f")
    held = nxt(b, 2, SHORT)
    assert held.ids == ["e", "f"]
    assert b.call("cancel", "f") == 1
    b.call("sweep", BUDGET)
    assert b.call("cancel", "e") == 1
    assert b.call("push", "e") == 1
    assert b.call("cancel", "e") == 1
    b.call("sweep", BUDGET)
    b.sleep_ms(PAST_SHORT)
    assert nxt(b, 5).jobs == []  # neither e's lease nor f's comes back
    flags = ints(b.call("extend", LONG, *held.tokens))[1:]
    assert set(flags) <= {0, -1}, flags  # lost: dropped (0), or cancelled still held (-1)
    b.call("sweep", BUDGET)
    assert index(b) == {}
    assert b.hgetall("meta")["stale"] == "0"
    assert counters(b)["cancelled"] == 6


@scenario
def a_tracked_queue_schedules_each_id_once(b: Backend) -> None:
    track(b)
    later(b, "IN", DELAY, "s")
    assert b.call("push", "s") == 0  # held, scheduled
    assert b.call("push_later", "IN", DELAY * 2, "s") == 1  # moves, as on any queue
    push(b, "p")
    assert b.call("push_later", "IN", DELAY, "p") == 0  # held, waiting
    assert index(b) == {"s": "s", "p": "p"}
    b.sleep_ms(DELAY * 2 + 60)
    assert sorted(nxt(b, 10).ids) == ["p", "s"]


# -- priorities (PRIORITIES) --------------------------------------------------------------------


def prioritize(b: Backend, level: int, *ids: str, mode: str = "IN", ms: int = 0) -> Result:
    return b.call("push_priority", level, mode, ms, *ids)


@scenario
def priorities_hand_out_the_most_urgent_first(b: Backend) -> None:
    push(b, "a")
    assert prioritize(b, 5, "x1", "x2") == 2
    assert prioritize(b, 1, "y1") == 1
    push(b, "b")
    got = stats(b)
    assert (got["prioritized"], got["pending"], got["length"]) == (3, 5, 5)
    assert got["scheduled"] == 0
    assert nxt(b, 10).ids == ["a", "b", "y1", "x1", "x2"]
    got = stats(b)
    assert (got["prioritized"], got["pending"], got["in_flight"]) == (0, 0, 5)
    assert counters(b)["pushed"] == 5
    assert b.zscores("scheduled") == {}


@scenario
def a_lower_level_waits_while_the_ring_has_pending_ids(b: Backend) -> None:
    assert prioritize(b, 1, "z") == 1
    push(b, "a", "b", "c")
    assert nxt(b, 2).ids == ["a", "b"]
    assert nxt(b, 2).ids == ["c", "z"]
    got = nxt(b, 2)
    assert (got.jobs, got.idle) == ([], 1)


@scenario
def an_id_pushed_again_at_its_level_moves_to_the_back(b: Backend) -> None:
    assert prioritize(b, 3, "a", "b", "a") == 2
    assert prioritize(b, 3, "a") == 0  # waiting there already: moves, not counted
    assert stats(b)["prioritized"] == 2
    assert nxt(b, 10).ids == ["b", "a"]
    assert stats(b)["length"] == 2


@scenario
def a_scheduled_job_keeps_its_level(b: Backend) -> None:
    assert prioritize(b, 2, "p", ms=DELAY) == 1
    assert prioritize(b, 1, "q") == 1
    got = stats(b)
    assert (got["scheduled"], got["prioritized"]) == (1, 1)
    b.sleep_ms(DELAY + 60)
    push(b, "r")
    assert nxt(b, 10).ids == ["r", "q", "p"]
    assert stats(b)["scheduled"] == 0


@scenario
def priority_levels_out_of_range_are_refused(b: Backend) -> None:
    for level in ("0", "10", "-1", "x", "1.5"):
        expect_error(b, "ROTATOR_BADARG", "push_priority", level, "IN", 0, "a")
    expect_error(b, "ROTATOR_BADARG", "push_priority", 3, "SOON", 0, "a")
    expect_error(b, "ROTATOR_BADID", "push_priority", 3, "IN", 0, "a*b")
    expect_error(b, "ROTATOR_BADARG", "push_priority", 3, "IN", -1, "a")


@scenario
def a_tracked_queue_holds_a_prioritized_id_once_and_cancels_it_at_once(b: Backend) -> None:
    track(b)
    assert prioritize(b, 3, "a") == 1
    assert index(b) == {"a": "q3"}
    assert b.call("push", "a") == 0
    assert b.call("unique", "push_priority", 4, "IN", 0, "a") == 0
    assert prioritize(b, 2, "s", ms=DELAY) == 1
    assert prioritize(b, 2, "s", ms=DELAY * 2) == 1  # scheduled again: moves
    assert index(b) == {"a": "q3", "s": "s2"}
    assert b.call("cancel", "a", "s") == 2
    got = stats(b)
    assert (got["prioritized"], got["pending"], got["scheduled"], got["length"]) == (0, 0, 0, 0)
    assert b.zscores("scheduled") == {}
    assert index(b) == {}
    assert nxt(b, 10).jobs == []
    assert prioritize(b, 3, "a") == 1
    leased = nxt(b, 10)
    assert leased.ids == ["a"]
    assert index(b) == {"a": leased.tokens[0].split("*", 1)[1]}


# -- payloads (the fourteenth key) -----------------------------------------------------------


def payload_keys(b: Backend) -> tuple[str, ...]:
    key = f"rotator:{{{b.name}}}:payloads"
    if key not in b.tracked:
        b.track(key)
    return (*b.keys, key)


def nextp(b: Backend, count: int, drop: int, *acks: str) -> list[Result]:
    reply = b.call_keys(payload_keys(b), "nextp", count, LONG, BUDGET, 0, drop, *acks)
    assert isinstance(reply, list), reply
    assert (len(reply) - 3) % 3 == 0, reply
    return reply


@scenario
def pushp_and_nextp_carry_payloads_and_ackp_drops_them(b: Backend) -> None:
    keys = payload_keys(b)
    assert b.call_keys(keys, "pushp", "a", "pa", "b", "") == 2
    push(b, "bare")
    reply = nextp(b, 10, 1)
    assert [parse_token(str(t)).id for t in reply[3::3]] == ["a", "b", "bare"]
    assert reply[5::3] == ["pa", "", None]
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "pa", "b": ""})
    assert b.call_keys(keys, "ackp", str(reply[3])) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"b": ""})
    # Acks carried by nextp drop their payloads only with DROP 1.
    assert nextp(b, 1, 0, str(reply[6]))[2] == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"b": ""})
    assert b.call_keys(keys, "pushp", "c", "pc") == 1
    reply2 = nextp(b, 1, 1, str(reply[6]), str(reply[9]))
    assert reply2[2] == 2  # acking a token again is accepted again (idempotent)
    assert reply2[5] == "pc"
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"c": "pc"})


def nextp_packed(b: Backend, keys: tuple[str, ...], count: int, *acks: str) -> list[Result]:
    """nextp_packed with DROP 1; the reply's shape checked: head, packed element, a payload
    per packed job, then token, flag and payload per later delivery."""
    reply = b.call_keys(keys, "nextp_packed", count, LONG, BUDGET, 0, 1, *acks)
    assert isinstance(reply, list), reply
    packed = str(reply[3])
    size = len(packed.split("*")) - 2 if packed else 0
    assert (len(reply) - 4 - size) % 3 == 0, reply
    return reply


def packed_tokens(packed: str) -> list[str]:
    """The tokens of a packed element's jobs: <id> .. <batch> .. k in 5 digits."""
    _, stamp, *ids = packed.split("*")
    return [f"{job}*{stamp}{k:05d}" for k, job in enumerate(ids, 1)]


@scenario
def nextp_packed_sends_the_batch_packed_and_each_payload_after_it(b: Backend) -> None:
    keys = payload_keys(b)
    assert b.call_keys(keys, "pushp", "a", "pa", "b", "") == 2
    push(b, "bare")
    reply = nextp_packed(b, keys, 10)
    assert str(reply[3]).split("*")[2:] == ["a", "b", "bare"]
    assert reply[4:] == ["pa", "", None]
    a, b_, bare = packed_tokens(str(reply[3]))
    assert [parse_token(t).n for t in (a, b_, bare)] == [1, 1, 1]
    # The tokens it implies are the jobs' own: acked by ackp, the payload goes.
    assert b.call_keys(keys, "ackp", a) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"b": ""})
    # A job given back comes again as a later delivery, its payload after its flag; the
    # ack carried by the same call drops bare's, the next one b's.
    assert ints(b.call("nack", 0, b_)) == [1]
    again = nextp_packed(b, keys, 10, bare)
    assert again[2] == 1
    assert again[3] == ""
    assert len(again) == 7
    token = parse_token(str(again[4]))
    assert (token.id, token.n, again[5], again[6]) == ("b", 2, 0, "")
    assert nextp_packed(b, keys, 10, str(again[4]))[2] == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("none", None)


@scenario
def nextp_packed_notes_each_delivery_in_the_item_stats(b: Backend) -> None:
    keys = (*payload_keys(b), f"rotator:{{{b.name}}}:items")
    b.track(keys[N_QUEUE_KEYS + 1])
    assert b.call_keys(keys, "pushi", "a", "b") == 2
    reply = nextp_packed(b, keys, 2)
    a, b_ = packed_tokens(str(reply[3]))
    assert ints(b.call_keys(keys, "nackp", 0, "broke", a)) == [1]
    again = nextp_packed(b, keys, 2, b_)
    assert parse_token(str(again[4])).id == "a"
    stats = b.call_keys(keys, "items", "a", "b")
    assert isinstance(stats, list)
    assert str(stats[0]).split(":")[1] == "2"  # a: the packed delivery and the later one
    assert stats[1] is None  # b: acked, its stats gone


def named(packed: str) -> str:
    """The named batch ack of a packed batch: the packed element itself."""
    return packed


@scenario
def a_named_batch_ack_drops_its_jobs_payloads_once(b: Backend) -> None:
    keys = payload_keys(b)
    assert b.call_keys(keys, "pushp", "a", "pa", "b", "pb", "c", "pc") == 3
    assert b.call_keys(keys, "pushp", "a", "pa") == 1  # a second copy of "a"
    first = nextp_packed(b, keys, 2)
    element = str(first[3])
    assert element.split("*")[2:] == ["a", "b"]
    assert b.call_keys(keys, "ackp", named(element)) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "pa", "c": "pc"})  # a's copy
    # Sent again (a retried call) while the element waits for its walk: accepted, and drops
    # nothing more (the other copy of "a" keeps its payload).
    assert b.call_keys(keys, "ackp", named(element)) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "pa", "c": "pc"})
    second = nextp_packed(b, keys, 10)
    assert str(second[3]).split("*")[2:] == ["c", "a"]
    assert second[4:6] == ["pc", "pa"]
    # Riding on a claim, after the walk took the first batch away: not found, so refused.
    third = nextp_packed(b, keys, 10, named(str(second[3])), named(element))
    assert third[2] == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("none", None)


@scenario
def named_batch_acks_of_two_batches_in_one_call_leave_each_batch_as_it_was(b: Backend) -> None:
    """Two named batch acks in one call, each sent again alone, and one riding on a claim after
    the walk took its batch: accepted every time, each batch's own payloads dropped once. (By
    FCALL a library gets each batch's ids back from what it kept when it made the batch,
    instead of cutting them out of the element.)"""
    keys = payload_keys(b)
    assert b.call_keys(keys, "pushp", "a", "pa", "b", "pb", "c", "pc", "d", "pd", "e", "pe") == 5
    first = str(nextp_packed(b, keys, 2)[3])
    second = str(nextp_packed(b, keys, 2)[3])
    assert [first.split("*")[2:], second.split("*")[2:]] == [["a", "b"], ["c", "d"]]
    assert b.call_keys(keys, "ackp", named(first), named(second)) == 2
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"e": "pe"})
    assert b.call_keys(keys, "ackp", named(first)) == 1
    assert b.call_keys(keys, "ackp", named(second)) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"e": "pe"})
    last = nextp_packed(b, keys, 10, named(first))
    assert str(last[3]).split("*")[2:] == ["e"]
    assert last[4] == "pe"


@scenario
def meta_counts_the_copies_and_a_queue_without_the_count_still_looks_them_up(b: Backend) -> None:
    """Meta `copies` counts the "<id>*" fields once a push found the payloads hash empty, so
    that an ack of a queue with none skips looking for them; a queue without the count (its
    meta written by an older module) looks them up as before, and keeps a copy's payload."""
    keys = payload_keys(b)

    def copies() -> str | None:
        return b.hgetall("meta").get("copies")

    assert b.call_keys(keys, "pushp", "a", "pa", "b", "pb") == 2
    assert copies() == "0"  # counted from the first push into an empty hash
    assert b.call_keys(keys, "pushp", "a", "pa") == 1
    assert copies() == "1"  # "a*": one copy beyond the first
    first = nextp_packed(b, keys, 1)
    assert str(first[3]).split("*")[2:] == ["a"]
    assert b.call_keys(keys, "ackp", named(str(first[3]))) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "pa", "b": "pb"})  # a's copy
    assert copies() == "0"
    assert b.call_keys(keys, "pushp", "b", "pb") == 1
    assert copies() == "1"
    b.raw_hset("meta", "copies", "")  # unknown, as on a queue of an older module
    second = nextp_packed(b, keys, 2)
    assert str(second[3]).split("*")[2:] == ["b", "a"]
    b_token, a_token = packed_tokens(str(second[3]))
    assert b.call_keys(keys, "ackp", b_token) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "pa", "b": "pb"})  # b's copy
    assert copies() == ""  # (still unknown: only a push into an empty hash counts again)
    assert b.call_keys(keys, "ackp", a_token) == 1
    third = nextp_packed(b, keys, 1)
    assert b.call_keys(keys, "ackp", named(str(third[3]))) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("none", None)
    assert b.call_keys(keys, "pushp", "c", "pc") == 1
    assert copies() == "0"


@scenario
def a_workers_payload_loop_keeps_the_payload_of_a_copy_still_queued(b: Backend) -> None:
    """One worker's loop on a queue with payloads (each claim carrying the named batch ack of
    the one before, which one worker's short way takes): an acked id with a copy still queued
    keeps its payload, whether meta counts the copies or (an older module's meta) not."""
    keys = payload_keys(b)
    assert b.call_keys(keys, "pushp", "a", "pa", "b", "pb") == 2
    assert b.call_keys(keys, "pushp", "a", "pa") == 1
    assert b.hgetall("meta").get("copies") == "1"
    first = str(nextp_packed(b, keys, 1)[3])
    second = nextp_packed(b, keys, 1, named(first))
    assert (str(second[3]).split("*")[2:], second[2]) == (["b"], 1)
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "pa", "b": "pb"})  # a's copy
    assert b.hgetall("meta").get("copies") == "0"
    b.raw_hset("meta", "copies", "")  # unknown, as on a queue of an older module
    assert b.call_keys(keys, "pushp", "b", "pb") == 1  # a copy of the b held
    third = nextp_packed(b, keys, 1, named(str(second[3])))
    assert (str(third[3]).split("*")[2:], third[4]) == (["a"], "pa")
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "pa", "b": "pb"})  # b's copy
    fourth = nextp_packed(b, keys, 1, named(str(third[3])))
    assert (str(fourth[3]).split("*")[2:], fourth[4]) == (["b"], "pb")
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"b": "pb"})
    last = nextp_packed(b, keys, 1, named(str(fourth[3])))
    assert (last[0], last[2]) == (1, 1)  # idle, the last batch acked
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("none", None)


@scenario
def workers_taking_turns_complete_each_job_once(b: Backend) -> None:
    """Three workers of a queue with payloads taking turns, each claim carrying the named
    batch ack of the batch its worker claimed a turn ago (the lease list's tail, which the
    loop takes off as it leases the new batch at the head): every job is delivered once with
    its payload, the lease list holds one batch a worker, and the last acks leave nothing."""
    keys = payload_keys(b)
    ids = [f"j{i:02d}" for i in range(14)]
    assert b.call_keys(keys, "pushp", *[part for i in ids for part in (i, f"p-{i}")]) == 14
    held: list[str] = []
    delivered: list[str] = []
    for turn in range(9):
        acks = (named(held[turn % 3]),) if turn >= 3 else ()
        reply = nextp_packed(b, keys, 2, *acks)
        assert reply[2] == len(acks), reply[:4]
        element = str(reply[3])
        got = element.split("*")[2:] if element else []
        assert reply[4:] == [f"p-{i}" for i in got]
        delivered += got
        if turn >= 3:
            held[turn % 3] = element
        else:
            held.append(element)
        leases = b.lrange("leases")
        assert leases[0] == element or not element  # (the newest at the head)
        assert len(leases) == len([e for e in held if e]), leases
    assert delivered == ids  # each once, in push order (the last two claims found none)
    for worker in (0, 1, 2):  # (the last acks: each worker's claim finds the queue idle)
        if held[worker]:
            reply = nextp_packed(b, keys, 2, named(held[worker]))
            assert (reply[2], reply[3]) == (1, ""), reply[:4]
    assert b.lrange("leases") == []
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("none", None)  # every payload dropped
    assert counters(b)["completed"] == 14


@scenario
def two_copies_of_an_id_acked_in_one_call_take_its_payload(b: Backend) -> None:
    """Found by the payload model: the copies count was read once for both, so the second
    copy's ack took the count again and the payload stayed for good."""
    keys = payload_keys(b)
    for _ in range(2):
        assert b.call_keys(keys, "pushp", "a", "pa") == 1
    assert b.call_keys(keys, "pushp", "b", "pb") == 1
    element = str(nextp_packed(b, keys, 3)[3])
    assert element.split("*")[2:] == ["a", "a", "b"]
    first, second, _ = packed_tokens(element)
    assert b.call_keys(keys, "ackp", first, second) == 2
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"b": "pb"})
    for _ in range(3):
        assert b.call_keys(keys, "pushp", "c", "pc") == 1
    again = str(nextp_packed(b, keys, 3)[3])
    assert b.call_keys(keys, "ackp", again) == 1  # by name: c, c, c
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"b": "pb"})


@scenario
def tokens_of_a_batch_acked_by_name_drop_no_payload_again(b: Backend) -> None:
    """A client whose other batch ack was refused sends every token of the call: those of a
    batch its named ack already completed leave the payload of a copy pushed since alone."""
    keys = payload_keys(b)
    assert b.call_keys(keys, "pushp", "a", "p1", "b", "pb") == 2
    element = str(nextp_packed(b, keys, 2)[3])
    assert b.call_keys(keys, "ackp", element) == 1
    assert b.call_keys(keys, "pushp", "a", "p2") == 1  # pushed again, a new payload
    assert b.call_keys(keys, "ackp", *packed_tokens(element)) == 2
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "p2"})
    again = nextp_packed(b, keys, 5)
    assert str(again[3]).split("*")[2:] == ["a"]
    assert again[4] == "p2"


@scenario
def a_batch_acked_out_of_order_by_name_leaves_the_lease_list_at_once(b: Backend) -> None:
    """Workers of a queue with payloads ack out of order: a claim's named ack of a batch that
    is not the lease list's tail takes the batch out where it lies (no mark), drops its
    payloads, and counts its jobs completed; sent again (its reply lost), it is refused and
    drops nothing."""
    keys = payload_keys(b)
    ids = [f"j{i}" for i in range(12)]
    assert b.call_keys(keys, "pushp", *[part for i in ids for part in (i, f"p-{i}")]) == 12
    held = [str(nextp_packed(b, keys, 2)[3]) for _ in range(3)]  # (the tail: held[0])
    before = counters(b)
    claimed = nextp_packed(b, keys, 2, held[1])  # (the middle batch: out of order)
    assert claimed[2] == 1
    assert str(claimed[3]).split("*")[2:] == ["j6", "j7"]
    leases = b.key_state(b.keys[10])
    assert leases == ("list", [str(claimed[3]), held[2], held[0]])
    assert b.key_state(b.keys[3]) == ("none", None)  # (no mark written)
    assert payload_ids(b, keys) == {f"j{i}" for i in (0, 1, *range(4, 12))}
    assert counters(b)["completed"] == before["completed"] + 2
    state = stats(b)
    assert (state["in_flight"], state["pending"], state["done"]) == (6, 4, 0)
    # The same ack again, on the next claim: refused, nothing dropped or taken out.
    assert b.call_keys(keys, "pushp", "j2", "p-again") == 1
    again = nextp_packed(b, keys, 1, held[1])
    assert again[2] == 0
    assert b.key_state(keys[N_QUEUE_KEYS])[1] == {
        **{f"j{i}": f"p-j{i}" for i in (0, 1, *range(4, 12))},
        "j2": "p-again",
    }
    assert b.key_state(b.keys[10])[0] == "list"
    assert str(again[3]) in str(b.key_state(b.keys[10])[1])
    assert str(again[3]).split("*")[2:] == ["j8"]
    # Acked by ackp (no claim), they are marked, and the next claim's walk drops them.
    for element in (held[0], held[2], str(claimed[3]), str(again[3])):
        assert b.call_keys(keys, "ackp", element) == 1
    last = nextp_packed(b, keys, 10)
    assert str(last[3]).split("*")[2:] == ["j9", "j10", "j11", "j2"]
    assert counters(b)["completed"] == before["completed"] + 9
    assert b.key_state(b.keys[3]) == ("none", None)
    assert b.key_state(b.keys[10]) == ("list", [str(last[3])])
    assert payload_ids(b, keys) == {"j9", "j10", "j11", "j2"}


def payload_ids(b: Backend, keys: tuple[str, ...]) -> set[str]:
    """The ids whose payloads a queue with payloads keeps."""
    kind, value = b.key_state(keys[N_QUEUE_KEYS])
    assert kind == "hash", kind
    assert isinstance(value, dict), value
    return set(value)


@scenario
def a_named_batch_ack_that_names_other_ids_is_refused_and_changes_nothing(b: Backend) -> None:
    keys = payload_keys(b)
    assert b.call_keys(keys, "pushp", "a", "pa", "b", "pb", "x", "px") == 3
    element = str(nextp_packed(b, keys, 2)[3])
    stamp = element.split("*")[1]
    before = b.snapshot()
    longest = "y" * 1024  # (an id's most bytes: a forged ack, not a malformed one)
    for forged in (f"*{stamp}*a*x", f"*{stamp}*b*a", f"*{stamp}*a", f"*{stamp}*a*{longest}"):
        assert b.call_keys(keys, "ackp", forged) == 0, forged
        assert b.snapshot() == before, forged
    # Only a batch ack that names its jobs: the bare one, or a malformed one, is refused.
    too_long = "y" * 1025  # (an id too long, first, between, or last)
    for bad in (
        f"*{stamp}/2",
        f"*{stamp}*a**b",
        f"*{stamp}*a*b*",
        f"*{stamp}*",
        f"*{stamp}*{too_long}*b",
        f"*{stamp}*a*{too_long}*b",
        f"*{stamp}*a*{too_long}",
    ):
        expect_error(b, "ROTATOR_BADTOKEN", "ackp", bad, keys=keys)
        expect_error(b, "ROTATOR_BADTOKEN", "nextp_packed", 1, LONG, BUDGET, 0, 1, bad, keys=keys)
    too_many = [f"*{stamp}*" + "*".join(f"i{k}" for k in range(1000))] * 6
    expect_error(b, "ROTATOR_TOOMANY", "ackp", *too_many, keys=keys)
    # Riding on a claim while the lease list holds that batch alone (one worker's loop's
    # state, which compares the named element with it): refused as well, nothing dropped.
    claimed = nextp_packed(b, keys, 1, f"*{stamp}*a*x")
    assert (claimed[2], str(claimed[3]).split("*")[2:]) == (0, ["x"])
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "pa", "b": "pb", "x": "px"})
    assert b.call_keys(keys, "ackp", element) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"x": "px"})


@scenario
def a_named_batch_ack_of_an_expired_batch_is_refused(b: Backend) -> None:
    keys = payload_keys(b)
    assert b.call_keys(keys, "pushp", "a", "pa", "b", "pb") == 2
    reply = b.call_keys(keys, "nextp_packed", 2, SHORT, BUDGET, 0, 1)
    assert isinstance(reply, list)
    element = str(reply[3])
    b.sleep_ms(PAST_SHORT)
    again = nextp_packed(b, keys, 2)  # re-leased to another consumer
    assert str(again[3]) == ""
    assert len(again) == 10  # two later deliveries
    assert b.call_keys(keys, "ackp", element) == 0
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "pa", "b": "pb"})


@scenario
def an_ack_sent_twice_leaves_the_payload_of_another_copy(b: Backend) -> None:
    """Found by the conformance work: two copies of "a" queued, the first acked twice by
    ackp (as a retried ack is) took the second's payload, delivered nil."""
    keys = payload_keys(b)
    assert b.call_keys(keys, "pushp", "a", "pa") == 1
    assert b.call_keys(keys, "pushp", "a", "pa") == 1
    first = nextp(b, 1, 1)
    token = str(first[3])
    assert b.call_keys(keys, "ackp", token) == 1
    assert b.call_keys(keys, "ackp", token) == 1  # accepted again, and drops nothing more
    second = nextp(b, 1, 1, token)  # and once more, riding on a claim
    assert (parse_token(str(second[3])).id, second[5]) == ("a", "pa")
    assert b.call_keys(keys, "ackp", str(second[3])) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("none", None)


@scenario
def an_ack_sent_again_after_its_lease_was_removed_drops_nothing(b: Backend) -> None:
    """Found by the chaos payload run: a named batch ack whose reply was lost came again after
    a claim had removed its batch. Refused (the element was gone), the client acked its
    tokens, which were taken for first acks and dropped the payload of a copy queued since.
    The same held for a token acked, removed and sent again."""
    keys = payload_keys(b)
    for _ in range(2):
        assert b.call_keys(keys, "pushp", "a", "pa") == 1  # two copies of "a"
    element = str(nextp_packed(b, keys, 1)[3])
    # Acked by name on the next claim, which removes the batch and leases the copy.
    second = nextp_packed(b, keys, 1, named(element))
    assert (second[2], str(second[3]).split("*")[2:], second[4]) == (1, ["a"], "pa")
    assert b.state("leases") == ("list", [str(second[3])])
    # The call again: by name it is refused; its tokens are accepted, and drop nothing.
    assert b.call_keys(keys, "ackp", named(element)) == 0
    assert b.call_keys(keys, "ackp", *packed_tokens(element)) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "pa"})
    # By token: the copy's ack drops the payload; "a" is pushed again with a new one, and a
    # claim removes the acked lease and leases the new job. The token sent again drops
    # nothing of it.
    (token,) = packed_tokens(str(second[3]))
    assert b.call_keys(keys, "ackp", token) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("none", None)
    assert b.call_keys(keys, "pushp", "a", "p2") == 1
    third = nextp_packed(b, keys, 1)
    assert (third[2], third[4]) == (0, "p2")
    assert b.state("leases") == ("list", [str(third[3])])
    assert b.call_keys(keys, "ackp", token) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("hash", {"a": "p2"})
    assert b.call_keys(keys, "ackp", named(str(third[3]))) == 1
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("none", None)


@scenario
def acks_that_dropped_payloads_are_remembered_for_the_fence_window_at_most(b: Backend) -> None:
    keys = payload_keys(b)
    b.call("configure", "fence_ms", 1000)
    assert b.call_keys(keys, "pushp", "a", "pa", "b", "pb") == 2
    element = str(nextp_packed(b, keys, 1)[3])
    assert b.call_keys(keys, "ackp", named(element)) == 1
    (token,) = packed_tokens(str(nextp_packed(b, keys, 1)[3]))
    assert b.call_keys(keys, "ackp", token) == 1
    batch = element[: element.index("*", 1)]
    remembered = b.zscores("revoked")
    assert set(remembered) == {batch + "+", token + "+"}
    # Scored a fence window before the ack, plus the memory kept: trimmed by the fence.
    assert all(score <= b.now_ms() for score in remembered.values())
    b.sleep_ms(1100)
    nextp_packed(b, keys, 1)  # a claim's walk trims the fence
    assert not [name for name in b.zscores("revoked") if name.endswith("+")]


@scenario
def payload_commands_check_arguments_keys_and_types_before_writing(b: Backend) -> None:
    keys = payload_keys(b)
    push(b, "x")
    expect_error(b, "ROTATOR_BADARG", "pushp", "a", "pa", "b", keys=keys)
    expect_error(b, "ROTATOR_BADID", "pushp", "a", "pa", "b*", "pb", keys=keys)
    expect_error(b, "ROTATOR_TOOMANY", "pushp", *(["i", "p"] * 2501), keys=keys)
    expect_error(b, "ROTATOR_BADARG", "nextp", 1, LONG, BUDGET, 0, 2, keys=keys)
    expect_error(b, "ROTATOR_BADARG", "nextp_packed", 1, LONG, BUDGET, 0, 2, keys=keys)
    expect_error(
        b, "ROTATOR_BADTOKEN", "nextp_packed", 1, LONG, BUDGET, 0, 1, "*1.1.1/2", keys=keys
    )
    expect_error(b, "ROTATOR_BADTOKEN", "ackp", "nope", keys=keys)
    expect_error(b, "ROTATOR_KEYS", "pushp", "a", "pa")  # the queue's keys only
    expect_error(b, "ROTATOR_KEYS", "push", "a", keys=keys)  # one too many for a queue command
    b.call_keys(keys, "pushp", "k", "v")
    b.raw_del_key(keys[N_QUEUE_KEYS])
    b.raw_set_key(keys[N_QUEUE_KEYS], "oops")
    before = b.snapshot()
    calls = [
        ("pushp", "z", "pz"),
        ("nextp", 1, LONG, BUDGET, 0, 1),
        ("nextp_packed", 1, LONG, BUDGET, 0, 1),
        ("ackp", "a*1.1.1"),
    ]
    for argv in calls:
        with pytest.raises(ReplyError) as caught:
            b.call_keys(keys, *argv)
        assert caught.value.code == "ROTATOR_WRONGTYPE", argv
        assert b.snapshot() == before, argv


# -- topics ----------------------------------------------------------------------------------

# -- the walk's numbers: one packed field, and a queue an older module kept ---------------------


def walk_of(b: Backend) -> dict[str, int]:
    """The meta's walk field, decoded (rotator.meta): its numbers by name."""
    packed = b.hgetall("meta").get("walk")
    assert packed is not None, b.hgetall("meta")
    return walk_numbers(packed.encode("utf-8", "surrogateescape"))


def as_an_older_module_kept_it(b: Backend) -> dict[str, int]:
    """Rewrites the walk's numbers as a module before the packed field kept them: a field each,
    in decimal, and "" where it had cleared a deadline (qmin, lstop). Returns the numbers."""
    numbers = walk_of(b)
    b.raw_command("HDEL", b.key("meta"), "walk")
    for name in WALK_FIELDS:
        if name in numbers:
            b.raw_hset("meta", name, str(numbers[name]))
        elif name in ("qmin", "lstop"):
            b.raw_hset("meta", name, "")
    return numbers


def no_field_of_its_own(b: Backend) -> None:
    meta = b.hgetall("meta")
    assert not set(WALK_FIELDS) & set(meta), meta
    assert "walk" in meta


@scenario
def the_walks_numbers_are_one_field_and_every_claim_keeps_them_there(b: Backend) -> None:
    push(b, "a", "b", "c")
    assert walk_of(b)["qstart"] == meta_seq(b)  # the push: its lap starts at the seq
    first = nxt(b, 2, SHORT)
    no_field_of_its_own(b)
    numbers = walk_of(b)
    assert numbers["lmin"] == first.jobs[0][0].deadline  # the earliest deadline in flight
    b.sleep_ms(PAST_SHORT)
    again = nxt(b, 10, LONG)  # c, then a and b again
    assert sorted(again.ids) == ["a", "b", "c"]
    assert walk_of(b)["lmin"] == again.jobs[0][0].deadline
    no_field_of_its_own(b)


@scenario
def a_walk_field_written_by_hand_reads_as_no_numbers_and_loses_no_job(b: Backend) -> None:
    """A walk field of another size, or holding a NaN, reads as absent (as a field that is not
    a number always did): the claims go on with the lap guessed again, every job delivered once
    and its lease still found when it runs out; the next write packs the field anew."""
    nan = struct.pack("<12d", *[math.nan] * 12).decode("utf-8", "surrogateescape")
    for junk in ("x", "", "\x00" * 95, nan):
        q = b.fresh(f"junk{len(junk)}")  # (the NaNs' field is 96 bytes: the right size)
        push(q, "a", "b", "c")
        first = nxt(q, 1, SHORT)
        assert first.ids == ["a"]
        q.raw_hset("meta", "walk", junk)
        rest = nxt(q, 10, LONG)
        assert rest.ids == ["b", "c"]
        assert len(walk_of(q)) > 0  # packed anew, whole
        q.sleep_ms(PAST_SHORT)
        again = nxt(q, 10, LONG)  # a's lease ran out: delivered again, not lost
        assert again.ids == ["a"]
        assert [r for _, r in again.jobs] == [1]
        assert ack(q, *rest.tokens, *again.tokens) == 3


@scenario
def a_queue_an_older_module_kept_claims_from_its_walk_fields_and_packs_them(b: Backend) -> None:
    """A queue written before the walk's numbers were packed keeps them as a field each: the
    next claim reads them there, goes on where they say (the lap, the leases in flight), and
    writes the packed field in their place."""
    twin = b.fresh("packed")
    for q in (b, twin):
        push(q, "a", "b", "c", "d", "e")
    held = {q.name: nxt(q, 2, SHORT) for q in (b, twin)}
    numbers = as_an_older_module_kept_it(b)
    assert "walk" not in b.hgetall("meta")
    for q in (b, twin):
        q.sleep_ms(PAST_SHORT)  # (each: a stub's fresh queue has a clock of its own)
    got = {q.name: nxt(q, 10, LONG) for q in (b, twin)}
    # The same jobs as the queue that never lost its packed field: the pending ones, and the
    # two whose leases ran out (the lease list's walk found them where lmin said).
    assert sorted(got[b.name].ids) == sorted(got[twin.name].ids) == ["a", "b", "c", "d", "e"]
    assert [r for _, r in got[b.name].jobs] == [r for _, r in got[twin.name].jobs]
    assert held[b.name].ids == ["a", "b"]
    no_field_of_its_own(b)
    assert walk_of(b)["qstart"] > numbers["qstart"]
    assert ack(b, *got[b.name].tokens) == 5
    laps(b)  # (acked elements leave with the walk that reaches them)
    assert stats(b)["length"] == 0


@scenario
def a_queue_an_older_module_kept_takes_pushes_acks_and_nacks_and_packs_its_walk(
    b: Backend,
) -> None:
    push(b, "a", "b", "c")
    first = nxt(b, 3, LONG)
    # A push reads the lap from the fields, and writes them packed with its own.
    lapnext = as_an_older_module_kept_it(b)["lapnext"]
    push(b, "d")
    no_field_of_its_own(b)
    assert walk_of(b)["lapnext"] == lapnext + 1  # (onto a ring of its sentinel: ahead of it)
    assert walk_of(b)["qstart"] == meta_seq(b)
    # A nack reads them too (due work: the idle lap starts again).
    as_an_older_module_kept_it(b)
    assert b.call("nack", 0, first.tokens[0]) == [1]
    no_field_of_its_own(b)
    assert walk_of(b)["qmin"] <= b.now_ms()
    # An ack of the lease the lease list's walk stopped at reads it there, and clears it.
    stop = nxt(b, 10, LONG)
    assert sorted(stop.ids) == ["a", "d"]
    as_an_older_module_kept_it(b)
    assert ack(b, *first.tokens[1:], *stop.tokens) == 4
    no_field_of_its_own(b)
    laps(b)
    assert stats(b)["length"] == 0


TOPIC_ROLES = ("meta", "groups", "log", "bodies")
QUEUE_ROLES = KEY_ROLES


def topic_keys(b: Backend) -> tuple[str, ...]:
    keys = tuple(f"rotator:{{{b.name}}}:topic:{role}" for role in TOPIC_ROLES)
    b.track(*(k for k in keys if k not in b.tracked))
    return keys


def group_keys(b: Backend, group: str) -> tuple[str, ...]:
    keys = tuple(f"rotator:{{{b.name}}}:group:{group}:{role}" for role in QUEUE_ROLES)
    b.track(*(k for k in keys if k not in b.tracked))
    return keys


def with_groups(b: Backend, *groups: str) -> tuple[str, ...]:
    return topic_keys(b) + tuple(k for g in groups for k in group_keys(b, g))


def subscribe(b: Backend, group: str) -> list[int]:
    return ints(b.call_keys(with_groups(b, group), "tsubscribe", group))


def publish(b: Backend, groups: tuple[str, ...], *payloads: str, keep: int = 0) -> list[str]:
    reply = b.call_keys(with_groups(b, *groups), "tpublish", keep, 0, *payloads)
    assert isinstance(reply, list), reply
    return [str(i) for i in reply]


def group_ring(b: Backend, group: str) -> list[str]:
    kind, elements = b.key_state(group_keys(b, group)[0])
    assert kind == "list"
    assert isinstance(elements, list)
    return [str(e) for e in elements]


def group_next(b: Backend, group: str, count: int = 100) -> list[tuple[str, Result]]:
    keys = (*group_keys(b, group), topic_keys(b)[3])
    reply = b.call_keys(keys, "nextp", count, LONG, BUDGET, 0, 0)
    assert isinstance(reply, list), reply
    return [(parse_token(str(reply[i])).id, reply[i + 2]) for i in range(3, len(reply), 3)]


def state_of(b: Backend, keys: tuple[str, ...]) -> list[KeyState]:
    return [b.key_state(k) for k in keys]


@scenario
def tpublish_reaches_every_registered_group_with_ordered_ids(b: Backend) -> None:
    assert subscribe(b, "a") == [1, 0]
    assert subscribe(b, "b") == [1, 0]
    assert subscribe(b, "a") == [0, 0]
    ids = publish(b, ("a", "b"), "one", "two")
    assert [re.fullmatch(r"(\d{13})-(\d+)", i) is not None for i in ids] == [True, True]
    assert [i.split("-")[1] for i in ids] == ["1", "2"]
    assert subscribe(b, "c") == [1, 2]
    ids += publish(b, ("a", "b", "c"), "three")
    assert ids[2].endswith("-3")
    everything = [(ids[0], "one"), (ids[1], "two"), (ids[2], "three")]
    assert group_next(b, "a") == everything
    assert group_next(b, "b") == everything
    assert group_next(b, "c") == [(ids[2], "three")]
    tkeys = topic_keys(b)
    assert b.key_state(tkeys[1])[1] == {g: group_keys(b, g)[0] for g in ("a", "b", "c")}
    # One log entry a publish: "<ms>-<first seq>-<payload bytes>", scored by the first seq.
    assert b.key_state(tkeys[2]) == ("zset", {f"{ids[0]}-6": 1.0, f"{ids[2]}-5": 3.0})
    assert b.key_state(tkeys[0])[1] == {"seq": "3", "ms": ids[2].split("-")[0], "bytes": "11"}


@scenario
def tpublish_with_other_groups_than_registered_is_refused_and_writes_nothing(b: Backend) -> None:
    subscribe(b, "a")
    subscribe(b, "b")
    publish(b, ("a", "b"), "first")
    everything = with_groups(b, "a", "b", "c")
    before = state_of(b, everything)
    for groups in [("a",), ("a", "a"), ("a", "b", "c"), (), ("b", "c")]:
        with pytest.raises(ReplyError) as caught:
            b.call_keys(with_groups(b, *groups), "tpublish", 0, 0, "x")
        assert caught.value.code == "ROTATOR_STALE", groups
        assert state_of(b, everything) == before
    for argv in [("tpublish", 0, 0), ("tpublish", "x", 0, "p"), ("tpublish", 0, -1, "p")]:
        with pytest.raises(ReplyError) as caught:
            b.call_keys(with_groups(b, "a", "b"), *argv)
        assert caught.value.code == "ROTATOR_BADARG", argv
    with pytest.raises(ReplyError) as caught:
        b.call_keys(with_groups(b, "a", "b"), "tpublish", 0, 0, *(["p"] * 1001))
    assert caught.value.code == "ROTATOR_TOOMANY"
    for keys in [topic_keys(b)[:3], (*with_groups(b, "a"), "extra")]:
        with pytest.raises(ReplyError) as caught:
            b.call_keys(keys, "tpublish", 0, 0, "p")
        assert caught.value.code == "ROTATOR_KEYS"
    assert state_of(b, everything) == before


def publish_marker(b: Backend, run: str) -> str:
    marker = f"rotator:{{{b.name}}}:publish:{run}"
    b.track(marker)
    return marker


def published(b: Backend, keys: tuple[str, ...], *argv: Arg) -> list[str]:
    """The ids a tpublish_chunk call (ARGV after the command) replied with."""
    reply = b.call_keys(keys, "tpublish_chunk", *argv)
    assert isinstance(reply, list), reply
    return [str(i) for i in reply]


@scenario
def tpublish_chunk_publishes_each_chunk_once_and_replies_with_its_ids_again(b: Backend) -> None:
    subscribe(b, "a")
    subscribe(b, "b")
    marker = publish_marker(b, "run-1")
    keys = (*with_groups(b, "a", "b"), marker)
    first = published(b, keys, 0, 60_000, 0, 0, "x", "y")
    assert [i.split("-")[1] for i in first] == ["1", "2"]
    ms = first[0].split("-")[0]
    assert b.key_state(marker) == ("hash", {"chunks": "1", "ms": ms, "first": "1", "n": "2"})
    everything = (*with_groups(b, "a", "b"), marker)
    before = state_of(b, everything)
    # Sent again (its reply lost): nothing published; the same ids.
    assert published(b, keys, 0, 60_000, 0, 0, "x", "y") == first
    assert state_of(b, everything) == before
    second = published(b, keys, 1, 60_000, 0, 0, "z")
    assert [i.split("-")[1] for i in second] == ["3"]
    assert published(b, keys, 1, 60_000, 0, 0, "z") == second
    assert published(b, keys, 0, 60_000, 0, 0, "x", "y") == []  # not the last
    everything_once = [(first[0], "x"), (first[1], "y"), (second[0], "z")]
    assert group_next(b, "a") == everything_once
    assert group_next(b, "b") == everything_once
    meta = b.key_state(topic_keys(b)[0])[1]
    assert isinstance(meta, dict)
    assert meta["seq"] == "3"


@scenario
def tpublish_chunk_refuses_bad_calls_and_writes_nothing(b: Backend) -> None:
    subscribe(b, "a")
    marker = publish_marker(b, "run-2")
    keys = (*with_groups(b, "a"), marker)
    b.call_keys(keys, "tpublish_chunk", 0, 60_000, 0, 0, "first")
    everything = (*with_groups(b, "a", "b"), marker)
    before = state_of(b, everything)
    cases: list[tuple[tuple[Arg, ...], str]] = [
        (("tpublish_chunk", 5, 60_000, 0, 0, "p"), "ROTATOR_BADARG"),  # beyond the marker
        (("tpublish_chunk", 1, 0, 0, 0, "p"), "ROTATOR_BADARG"),  # TTL_MS
        (("tpublish_chunk", -1, 60_000, 0, 0, "p"), "ROTATOR_BADARG"),
        (("tpublish_chunk", 1, 60_000, 0, 0), "ROTATOR_BADARG"),  # no payload
        (("tpublish_chunk", 0, 60_000, 0, 0), "ROTATOR_BADARG"),  # even for a chunk that is in
        (("tpublish_chunk", 1, 60_000, "x", 0, "p"), "ROTATOR_BADARG"),
        (("tpublish_chunk", 1, 60_000, 0, 0, *(["p"] * 1001)), "ROTATOR_TOOMANY"),
    ]
    for argv, code in cases:
        with pytest.raises(ReplyError) as caught:
            b.call_keys(keys, *argv)
        assert caught.value.code == code, argv
    subscribe(b, "b")  # the groups changed: the keys naming only "a" are stale now
    before = state_of(b, everything)
    with pytest.raises(ReplyError) as caught:
        b.call_keys(keys, "tpublish_chunk", 1, 60_000, 0, 0, "p")
    assert caught.value.code == "ROTATOR_STALE"
    # ... but a chunk the marker records publishes nothing: its ids, whatever the groups.
    (again,) = published(b, keys, 0, 60_000, 0, 0, "first")
    assert again.endswith("-1")
    assert state_of(b, everything) == before
    for bad in [
        with_groups(b, "a", "b"),  # no marker: a key count that fits no layout
        (*with_groups(b, "a", "b"), f"rotator:{{{b.name}}}:publish:"),  # no run after it
        (*with_groups(b, "a", "b"), f"rotator:{{{b.name}}}:push:run-2"),  # not under :publish:
        (*with_groups(b, "a", "b"), group_keys(b, "a")[0]),
    ]:
        with pytest.raises(ReplyError) as caught:
            b.call_keys(bad, "tpublish_chunk", 1, 60_000, 0, 0, "p")
        assert caught.value.code == "ROTATOR_KEYS", bad[-1]
    assert state_of(b, everything) == before
    # A marker of the wrong type: refused, nothing written.
    wrong = publish_marker(b, "wrong")
    b.raw_set_key(wrong, "oops")
    everything = (*everything, wrong)
    before = state_of(b, everything)
    with pytest.raises(ReplyError) as caught:
        b.call_keys((*with_groups(b, "a", "b"), wrong), "tpublish_chunk", 0, 60_000, 0, 0, "p")
    assert caught.value.code == "ROTATOR_WRONGTYPE"
    assert state_of(b, everything) == before


@scenario
def retention_by_count_drops_the_oldest_payloads(b: Backend) -> None:
    subscribe(b, "g")
    ids = publish(b, ("g",), "a", "b", "c", "d", keep=3)
    assert b.key_state(topic_keys(b)[3]) == ("hash", {ids[1]: "b", ids[2]: "c", ids[3]: "d"})
    assert b.key_state(topic_keys(b)[0])[1]["bytes"] == "3"  # type: ignore[index]
    ids += publish(b, ("g",), "e", keep=2)
    # The first publish's run lost its first three messages, so it begins at seq 4.
    assert b.zscores_of(topic_keys(b)[2]) == {f"{ids[3]}-1": 4.0, f"{ids[4]}-1": 5.0}
    # The group still gets every id (its backlog is within the bound's margin of 16); those
    # past retention come without a payload.
    assert group_next(b, "g") == [
        (ids[0], None),
        (ids[1], None),
        (ids[2], None),
        (ids[3], "d"),
        (ids[4], "e"),
    ]


@scenario
def an_idle_groups_backlog_is_bounded_by_the_retained_count(b: Backend) -> None:
    subscribe(b, "g")
    meta = group_keys(b, "g")[8]

    def ring() -> list[str]:
        return group_ring(b, "g")

    ids = publish(b, ("g",), *[f"p{i}" for i in range(40)], keep=10)
    # 30 over the count: the oldest 30 pending ids left the ring, counted in `expired`.
    assert b.key_state(meta)[1]["expired"] == "30"  # type: ignore[index]
    assert ring() == [*reversed(ids[-10:]), SENTINEL]  # the sentinel stays at the tail
    for i in range(16):  # up to 16 over the count is let be
        ids += publish(b, ("g",), f"q{i}", keep=10)
    assert len(ring()) == 27
    ids += publish(b, ("g",), "r", keep=10)  # 17 over: back to the count
    assert b.key_state(meta)[1]["expired"] == "47"  # type: ignore[index]
    assert ring() == [*reversed(ids[-10:]), SENTINEL]
    assert [i for i, _ in group_next(b, "g")] == ids[-10:]


@scenario
def a_publish_onto_an_idle_group_goes_ahead_of_its_sentinel(b: Backend) -> None:
    # (as a push onto an idle queue: a consumer woken by the publish leases without crossing
    # the lap first; behind the sentinel where the backlog's bound drops some again)
    subscribe(b, "g")
    gkeys = group_keys(b, "g")
    keys, meta = (*gkeys, topic_keys(b)[3]), gkeys[8]

    def ring() -> list[str]:
        return group_ring(b, "g")

    def lapnext() -> int:
        packed = b.key_state(meta)[1]["walk"]  # type: ignore[index]
        return walk_numbers(str(packed).encode("utf-8", "surrogateescape"))["lapnext"]

    def drained() -> None:
        reply = b.call_keys(keys, "nextp", 100, LONG, BUDGET, 0, 0)
        assert isinstance(reply, list)
        tokens = [str(t) for t in reply[3::3]]
        if tokens:
            assert b.call_keys(keys, "ackp", *tokens) == len(tokens)
        idle = b.call_keys(keys, "nextp", 100, LONG, BUDGET, 0, 0)
        assert isinstance(idle, list)
        assert idle[0] == 1
        assert ring() == [SENTINEL]

    publish(b, ("g",), "a")
    drained()
    before = lapnext()
    ids = publish(b, ("g",), "b", "c")
    assert ring() == [SENTINEL, ids[1], ids[0]]  # (the tail first: "b" is met first)
    assert lapnext() == before + 2
    later = publish(b, ("g",), "d")  # behind the sentinel, as the ring holds more than it
    assert ring() == [later[0], SENTINEL, ids[1], ids[0]]
    assert [i for i, _ in group_next(b, "g", 2)] == ids
    assert ring() == [later[0], SENTINEL]
    assert [i for i, _ in group_next(b, "g")] == later
    drained()
    cut = publish(b, ("g",), *[f"p{i}" for i in range(30)], keep=10)  # 20 over: 20 dropped
    assert ring() == [*reversed(cut[-10:]), SENTINEL]
    assert [i for i, _ in group_next(b, "g")] == cut[-10:]


@scenario
def ttrim_drops_by_age_and_tseek_finds_the_first_message_at_a_time(b: Backend) -> None:
    tkeys = topic_keys(b)
    subscribe(b, "g")
    old = publish(b, ("g",), "o1", "o2")
    b.sleep_ms(50)
    new = publish(b, ("g",), "n1")
    new_ms = int(new[0].split("-")[0])
    assert b.call_keys(tkeys, "tseek", new_ms) == 3
    assert b.call_keys(tkeys, "tseek", 0) == 1
    assert b.call_keys(tkeys, "tseek", new_ms + 10**6) == 4
    assert b.call_keys(tkeys, "ttrim", 0, 10**9, 100) == 0
    b.sleep_ms(30)
    age = b.now_ms() - int(old[0].split("-")[0]) - 20  # the old two, not the new one
    assert b.call_keys(tkeys, "ttrim", 0, age, 100) == 2
    assert list(b.zscores_of(tkeys[2])) == [f"{new[0]}-2"]
    assert b.call_keys(tkeys, "ttrim", 1, 0, 100) == 0
    expect = "ROTATOR_BADARG"
    for argv in [("ttrim", 0, 0, 0), ("tseek", "x")]:
        with pytest.raises(ReplyError) as caught:
            b.call_keys(tkeys, *argv)
        assert caught.value.code == expect, argv


@scenario
def a_publish_tops_each_groups_wake_list_up_to_sixteen_tokens(b: Backend) -> None:
    subscribe(b, "g")
    wake = group_keys(b, "g")[QUEUE_ROLES.index("wake")]
    publish(b, ("g",), "a", "b", "c")
    assert b.key_state(wake) == ("list", ["1"] * 3)
    publish(b, ("g",), *["x"] * 20)
    assert b.key_state(wake) == ("list", ["1"] * 16)
    publish(b, ("g",), "y")  # a full list: it stays as it is
    assert b.key_state(wake) == ("list", ["1"] * 16)
    assert len(group_next(b, "g")) == 24


@scenario
def the_log_keeps_a_run_a_publish_and_retention_splits_a_run_it_drops_in_part(b: Backend) -> None:
    tkeys = topic_keys(b)
    subscribe(b, "g")
    first = publish(b, ("g",), *["aa"] * 5)  # seqs 1-5, 10 bytes
    second = publish(b, ("g",), "b", "b", "b")  # seqs 6-8, 3 bytes
    assert b.zscores_of(tkeys[2]) == {f"{first[0]}-10": 1.0, f"{second[0]}-3": 6.0}
    assert b.call_keys(tkeys, "ttrim", 6, 0, 100) == 2  # seqs 1 and 2: part of the first run
    assert b.zscores_of(tkeys[2]) == {f"{first[2]}-6": 3.0, f"{second[0]}-3": 6.0}
    assert b.key_state(tkeys[0])[1]["bytes"] == "9"  # type: ignore[index]
    assert b.call_keys(tkeys, "ttrim", 2, 0, 100) == 4  # the rest of the first, seq 6
    assert b.zscores_of(tkeys[2]) == {f"{second[1]}-2": 7.0}
    assert b.key_state(tkeys[3])[1] == {second[1]: "b", second[2]: "b"}
    assert b.key_state(tkeys[0])[1]["bytes"] == "2"  # type: ignore[index]
    stats = b.call_keys(with_groups(b, "g"), "tstats")
    assert isinstance(stats, list)
    assert stats[:6] == ["retained", 2, "bytes", 2, "last_seq", 8]
    assert b.call_keys(tkeys, "tseek", 0) == 7
    assert b.call_keys(tkeys, "ttrim", 0, 0, 100) == 0  # no limit: nothing goes


@scenario
def a_log_written_a_message_an_entry_is_read_as_runs_of_one(b: Backend) -> None:
    """A topic published by a module before runs: entries "<ms>-<seq>", bytes unknown."""
    tkeys = topic_keys(b)
    subscribe(b, "g")
    ms = b.now_ms() - 1000
    for seq, body in ((1, "xyz"), (2, "pq")):
        b.raw_command("ZADD", tkeys[2], str(seq), f"{ms}-{seq}")
        b.raw_command("HSET", tkeys[3], f"{ms}-{seq}", body)
    b.raw_command("HSET", tkeys[0], "seq", "2", "ms", str(ms), "bytes", "5")
    ids = publish(b, ("g",), "new")
    assert ids[0].endswith("-3")
    assert b.call_keys(tkeys, "tseek", ms) == 1
    assert b.call_keys(tkeys, "tseek", ms + 1) == 3
    drained = group_next(b, "g")
    assert drained == [(ids[0], "new")]
    assert ints(b.call_keys(with_groups(b, "g"), "treplay", "g", 2, 0, 10)) == [2, 4, 3]
    assert group_next(b, "g") == [(f"{ms}-2", "pq"), (ids[0], "new")]
    assert b.call_keys(tkeys, "ttrim", 1, 0, 100) == 2  # their bytes read one by one
    assert b.zscores_of(tkeys[2]) == {f"{ids[0]}-3": 3.0}
    assert b.key_state(tkeys[0])[1]["bytes"] == "3"  # type: ignore[index]


@scenario
def treplay_pushes_the_retained_range_in_pages(b: Backend) -> None:
    subscribe(b, "g")
    # Three runs in the log (seqs 1-3, 4-5, 6-7): pages begin and end inside them.
    ids = publish(b, ("g",), "p0", "p1", "p2")
    ids += publish(b, ("g",), "p3", "p4")
    ids += publish(b, ("g",), "p5", "p6")
    assert len(group_next(b, "g")) == 7
    keys = with_groups(b, "g")
    assert ints(b.call_keys(keys, "treplay", "g", 3, 0, 2)) == [2, 5, 7]
    assert ints(b.call_keys(keys, "treplay", "g", 5, 7, 2)) == [2, 7, 7]
    assert ints(b.call_keys(keys, "treplay", "g", 7, 7, 2)) == [1, 8, 7]
    assert ints(b.call_keys(keys, "treplay", "g", 8, 7, 2)) == [0, 8, 7]
    assert [i for i, _ in group_next(b, "g")] == ids[2:]
    with pytest.raises(ReplyError) as caught:
        b.call_keys(with_groups(b, "nope"), "treplay", "nope", 1, 0, 10)
    assert caught.value.code == "ROTATOR_NOGROUP"
    with pytest.raises(ReplyError) as caught:
        b.call_keys(keys, "treplay", "g", 1, 0, 0)
    assert caught.value.code == "ROTATOR_BADARG"


@scenario
def tunsubscribe_forgets_the_group_and_deletes_its_ring(b: Backend) -> None:
    subscribe(b, "a")
    subscribe(b, "b")
    publish(b, ("a", "b"), "x")
    assert b.call_keys(with_groups(b, "b"), "tunsubscribe", "b") == 1
    assert b.call_keys(with_groups(b, "b"), "tunsubscribe", "b") == 0
    assert all(kind == "none" for kind, _ in state_of(b, group_keys(b, "b")))
    assert b.key_state(topic_keys(b)[1])[1] == {"a": group_keys(b, "a")[0]}
    publish(b, ("a",), "y")
    for bad in ["", "a:b", "x" * 65, "a b"]:
        with pytest.raises(ReplyError) as caught:
            b.call_keys(with_groups(b, "a"), "tsubscribe", bad)
        assert caught.value.code == "ROTATOR_BADARG", bad
    with pytest.raises(ReplyError) as caught:  # the keys of another group's ring
        b.call_keys(with_groups(b, "b"), "tsubscribe", "a")
    assert caught.value.code == "ROTATOR_BADARG"


@scenario
def tstats_report_retention_and_each_group(b: Backend) -> None:
    subscribe(b, "a")
    subscribe(b, "b")
    publish(b, ("a", "b"), "xx", "yyy")
    group_next(b, "a", 1)
    reply = b.call_keys(with_groups(b, "a", "b"), "tstats")
    assert isinstance(reply, list), reply
    assert reply[:8] == ["retained", 2, "bytes", 5, "last_seq", 2, "groups", 2]
    assert reply[8:13] == ["a", 2, 1, 1, 0]
    assert reply[18:23] == ["b", 2, 2, 0, 0]  # each group: its name and 9 counts
    with pytest.raises(ReplyError) as caught:
        b.call_keys(with_groups(b, "a"), "tstats")
    assert caught.value.code == "ROTATOR_STALE"


@scenario
def topic_keys_of_the_wrong_type_give_wrongtype_and_change_nothing(b: Backend) -> None:
    subscribe(b, "g")
    publish(b, ("g",), "x")
    tkeys = topic_keys(b)
    everything = with_groups(b, "g")
    for index in range(4):
        q = b.fresh(f"t{index}")
        subscribe(q, "g")
        publish(q, ("g",), "x")
        bad = topic_keys(q)[index]
        q.raw_del_key(bad)
        q.raw_set_key(bad, "oops")
        keys = with_groups(q, "g")
        before = state_of(q, keys)
        with pytest.raises(ReplyError) as caught:
            q.call_keys(keys, "tpublish", 0, 0, "y")
        assert caught.value.code == "ROTATOR_WRONGTYPE", bad
        assert state_of(q, keys) == before
    assert state_of(b, everything)[0] != ("none", None)
    assert tkeys


# -- per-item stats (the twelfth key) --------------------------------------------------------


@scenario
def item_stats_count_deliveries_and_keep_the_last_error_until_acked(b: Backend) -> None:
    keys = (*payload_keys(b), f"rotator:{{{b.name}}}:items")
    b.track(keys[N_QUEUE_KEYS + 1])
    pushed_at = b.now_ms()
    assert b.call_keys(keys, "pushi", "a", "b") == 2
    assert b.call_keys(keys, "pushp", "c", "pc") == 1
    stats = b.call_keys(keys, "items", "a", "c", "zz")
    assert isinstance(stats, list)
    enqueued = int(str(stats[0]).split(":")[0])
    within(enqueued, pushed_at, pushed_at + 5000)
    assert [str(s).split(":", 1)[1] for s in stats[:2]] == ["0:0:", "0:0:"]
    assert stats[2] is None
    reply = b.call_keys(keys, "nextp", 3, LONG, BUDGET, 0, 1)
    assert isinstance(reply, list)
    tokens = [str(t) for t in reply[3::3]]
    assert ints(b.call_keys(keys, "nackp", 0, "it: broke", tokens[0])) == [1]
    assert ints(b.call_keys(keys, "nackp", 0, "late", tokens[0])) == [0]  # lease already lost
    again = b.call_keys(keys, "nextp", 1, LONG, BUDGET, 0, 1)
    assert isinstance(again, list)
    first = b.call_keys(keys, "items", "a")
    assert isinstance(first, list)
    parts = str(first[0]).split(":", 3)
    assert parts[0] == str(enqueued)
    assert parts[1] == "2"
    assert parts[3] == "it: broke"
    assert b.call_keys(keys, "ackp", str(again[3]), tokens[1], tokens[2]) == 3
    assert b.key_state(keys[N_QUEUE_KEYS + 1]) == ("none", None)
    assert b.key_state(keys[N_QUEUE_KEYS]) == ("none", None)
    for argv, code in [
        (("nackp", 0, "x" * 4097, str(again[3])), "ROTATOR_BADARG"),
        (("pushi", "bad*"), "ROTATOR_BADID"),
        (("items", "bad*"), "ROTATOR_BADID"),
    ]:
        expect_error(b, code, *argv, keys=keys)
    expect_error(b, "ROTATOR_KEYS", "pushi", "a", keys=keys[:N_QUEUE_KEYS])
    expect_error(b, "ROTATOR_KEYS", "pushp", "a", "p", keys=(*keys, "extra"))


# -- bulk loads and reading the whole ring ----------------------------------------------------


@scenario
def push_chunk_pushes_each_chunk_once_whatever_the_attempts(b: Backend) -> None:
    marker = f"rotator:{{{b.name}}}:spark:push:run:0"
    b.track(marker)
    keys = (*b.keys, marker)
    assert ints(b.call_keys(keys, "push_chunk", 0, 60_000, "a", "b")) == [2, 1, 0]
    # A retry: nothing pushed now; the chunk is the marker's last, so it says what was.
    assert ints(b.call_keys(keys, "push_chunk", 0, 60_000, "a", "b")) == [0, 1, 2]
    assert ints(b.call_keys(keys, "push_chunk", 1, 60_000, "c")) == [1, 2, 0]
    assert ints(b.call_keys(keys, "push_chunk", 1, 60_000, "c")) == [0, 2, 1]
    assert ints(b.call_keys(keys, "push_chunk", 0, 60_000, "a", "b")) == [0, 2, 0]  # not the last
    assert stats(b)["pending"] == 3
    assert b.key_state(marker) == ("hash", {"chunks": "2", "pushed": "1"})
    expect_error(b, "ROTATOR_BADARG", "push_chunk", 5, 60_000, "d", keys=keys)
    expect_error(b, "ROTATOR_BADID", "push_chunk", 2, 60_000, "ok", "bad*", keys=keys)
    expect_error(b, "ROTATOR_BADARG", "push_chunk", 2, 0, "d", keys=keys)
    expect_error(b, "ROTATOR_KEYS", "push_chunk", 2, 60_000, "d")
    assert [job for job in nxt(b, 10).ids] == ["a", "b", "c"]


@scenario
def once_runs_each_push_command_once_per_chunk_whatever_the_attempts(b: Backend) -> None:
    marker = f"rotator:{{{b.name}}}:push:once-1"
    b.track(marker)
    items = f"rotator:{{{b.name}}}:items"
    b.track(items)
    plain, extended = (*b.keys, marker), (*payload_keys(b), items, marker)
    calls: list[tuple[tuple[str, ...], tuple[Arg, ...]]] = [
        (plain, ("push", "a", "b")),
        (plain, ("push_later", "IN", DELAY, "c")),
        (plain, ("push_priority", 3, "IN", 0, "d")),
        (extended, ("pushp", "e", "pe", "f", "pf")),
        (extended, ("pushp_later", "IN", 0, "g", "pg")),
        (extended, ("pushi", "h")),
    ]
    for chunk, (keys, argv) in enumerate(calls):
        pushed = b.call_keys(keys, "once", chunk, 60_000, *argv)
        before = b.snapshot()
        # Sent again (its reply lost): nothing pushed; what the first call pushed.
        assert b.call_keys(keys, "once", chunk, 60_000, *argv) == pushed, argv
        assert b.snapshot() == before, argv
        assert b.key_state(marker) == ("hash", {"chunks": str(chunk + 1), "pushed": str(pushed)})
    assert b.call_keys(plain, "once", 0, 60_000, "push", "a", "b") == 0  # an older chunk
    assert stats(b)["pending"] == 6  # a b d e f h (d at priority 3; g due now, c later)
    assert stats(b)["scheduled"] == 2
    expect_error(b, "ROTATOR_BADARG", "once", 9, 60_000, "push", "x", keys=plain)
    expect_error(b, "ROTATOR_BADARG", "once", len(calls), 0, "push", "x", keys=plain)
    expect_error(b, "ROTATOR_BADARG", "once", "x", 60_000, "push", "x", keys=plain)
    expect_error(b, "ROTATOR_BADID", "once", len(calls), 60_000, "push", "bad*", keys=plain)
    expect_error(b, "ROTATOR_BADARG", "once", len(calls), 60_000, "next", 1, LONG, BUDGET, 0)
    expect_error(b, "ROTATOR_BADARG", "once", len(calls), 60_000, "once", 0, 1, "push", "x")
    expect_error(b, "ROTATOR_UNTRACKED", "once", len(calls), 60_000, "unique", "push", "x",
                 keys=plain)  # fmt: skip
    for bad in [b.keys, (*b.keys, b.keys[0]), (*b.keys, f"rotator:{{{b.name}}}:items"),
                (*b.keys, "rotator:{other}:push:once-1"), (*b.keys, "x", marker)]:  # fmt: skip
        expect_error(b, "ROTATOR_KEYS", "once", len(calls), 60_000, "push", "x", keys=bad)
    wrong = f"rotator:{{{b.name}}}:push:wrong"
    b.track(wrong)
    b.raw_set_key(wrong, "oops")
    expect_error(b, "ROTATOR_WRONGTYPE", "once", 0, 60_000, "push", "x", keys=(*b.keys, wrong))
    assert b.call_keys(plain, "once", len(calls), 60_000, "push", "x") == 1  # and on it goes


@scenario
def once_with_unique_on_a_queue_that_tracks_ids(b: Backend) -> None:
    b.call("configure", "track_ids", 1)
    marker = f"rotator:{{{b.name}}}:push:once-2"
    b.track(marker)
    keys = (*b.keys, marker)
    assert b.call_keys(keys, "once", 0, 60_000, "unique", "push", "a", "a", "b") == 2
    assert b.call_keys(keys, "once", 0, 60_000, "unique", "push", "a", "a", "b") == 2
    assert b.call_keys(keys, "once", 1, 60_000, "unique", "push", "b", "c") == 1
    assert [job for job in nxt(b, 10).ids] == ["a", "b", "c"]


@scenario
def push_chunk_of_a_chunk_already_in_renews_the_markers_expiry(b: Backend) -> None:
    """A retry is a write (so a WAIT after it covers the first try's push) and keeps the
    marker for the retries after it."""
    marker = f"rotator:{{{b.name}}}:spark:push:run:1"
    b.track(marker)
    keys = (*b.keys, marker)
    assert ints(b.call_keys(keys, "push_chunk", 0, 400, "a")) == [1, 1, 0]
    b.sleep_ms(250)
    assert ints(b.call_keys(keys, "push_chunk", 0, 400, "a")) == [0, 1, 1]  # renewed: 400 ms
    b.sleep_ms(250)  # 500 ms after the first push: the marker would have expired at 400
    assert b.key_state(marker) == ("hash", {"chunks": "1", "pushed": "1"})
    assert ints(b.call_keys(keys, "push_chunk", 1, 400, "b")) == [1, 2, 0]
    assert stats(b)["pending"] == 2


@scenario
def scan_pages_through_the_ring_as_peek_shows_it_and_changes_nothing(b: Backend) -> None:
    push(b, *(f"j{n}" for n in range(12)))
    leased = nxt(b, 4)
    assert ack(b, leased.tokens[0]) == 1
    before = b.snapshot()
    shown: list[tuple[str, str, int]] = []
    start = 0
    while True:
        reply = b.call("scan", start, 1000, 5)
        assert isinstance(reply, list), reply
        following, length = int(str(reply[0])), int(str(reply[1]))
        assert length == 10  # eight pending, the sentinel, the packed batch of four
        for i in range(4, len(reply), 3):
            shown.append((str(reply[i]), str(reply[i + 1]), int(str(reply[i + 2]))))
        if following >= length:
            break
        assert following > start
        start = following
    assert shown == peek(b, 1000)
    assert [state for _, state, _ in shown].count("pending") == 8
    assert [state for _, state, _ in shown].count("done") == 1
    assert [state for _, state, _ in shown].count("leased") == 3
    assert b.snapshot() == before
    expect_error(b, "ROTATOR_BADARG", "scan", 0, 10, 0)
    expect_error(b, "ROTATOR_BADARG", "scan", -1, 10, 5)


@scenario
def a_batch_ack_after_one_of_its_jobs_was_acked_alone_is_refused(b: Backend) -> None:
    push(b, "a", "b", "c")
    got = nxt(b, 3)
    assert ack(b, got.tokens[0]) == 1  # alone: its batch is touched
    stamp = got.tokens[0][got.tokens[0].index("*") : -5]
    assert ack(b, f"{stamp}/3") == 0  # the whole batch would count a twice
    assert ack(b, *got.tokens) == 3  # token by token: a again (idempotent), b, c
    assert stats(b)["done"] == 3
    laps(b)
    assert stats(b)["length"] == 0


# -- one worker's loop (M.loop_lease) ---------------------------------------------------------


def loop_claim(b: Backend, count: int, ack_of: str | None) -> tuple[str, str]:
    """One worker's call: next_packed of `count`, acking the batch it claimed before
    (`ack_of`, its packed element) whole. Its packed element and its ids joined by "*"."""
    acks = () if ack_of is None else (ack_of[: ack_of.index("*", 1)] + f"/{ack_of.count('*') - 1}",)
    reply = b.call("next_packed", count, LONG, BUDGET, 0, *acks)
    assert isinstance(reply, list), reply
    element = reply[3]
    assert isinstance(element, str), reply
    return element, element[element.index("*", 1) + 1 :]


def a_worker_in_its_loop(b: Backend, jobs: int = 10) -> str:
    """A queue of `jobs` ids whose one worker has claimed twice, acking as it claims: the
    state one worker's loop serves. The element of its batch in flight."""
    push(b, *[f"j{i}" for i in range(jobs)])
    element, _ = loop_claim(b, 1, None)
    element, _ = loop_claim(b, 1, element)
    return element


@scenario
def one_workers_loop_refuses_a_ring_of_another_type_and_writes_nothing(b: Backend) -> None:
    """The loop reads the ring by its pop alone: a ring of another type (written by hand)
    is refused by its type, and nothing is written."""
    element = a_worker_in_its_loop(b)
    b.raw_del("ring")
    b.raw_set("ring", "oops")
    ack_of = element[: element.index("*", 1)] + "/1"
    message = expect_error(b, "ROTATOR_WRONGTYPE", "next_packed", 1, LONG, BUDGET, 0, ack_of)
    assert b.key("ring") in message


@scenario
def one_workers_loop_puts_back_a_ring_too_short_for_its_claim(b: Backend) -> None:
    """A ring holding fewer ids than the claim asks for, its sentinel gone (written by hand):
    the loop's pop finds too few, puts them back as they were, and the walk leases them; no
    job is lost or delivered twice."""
    element = a_worker_in_its_loop(b)
    b.raw_del("ring")
    b.raw_rpush("ring", "j8", "j9")  # (j2..j7 taken out by hand: only these two are left)
    element, ids = loop_claim(b, 3, element)
    assert sorted(ids.split("*")) == ["j8", "j9"]
    assert counters(b)["completed"] == 2  # j0, j1
    assert b.state("ring") == ("list", ["*lap"])


@scenario
def one_workers_loop_leaves_a_completed_count_it_cannot_add_to_to_the_walk(b: Backend) -> None:
    """The loop writes `completed` in the HSET of its numbers, so it reads it: one written by
    hand that is not a whole number, or too large to add to exactly, goes the walk's way,
    whose HINCRBY starts it again or adds to it; no call fails."""
    for value, after in (("x", "1"), ("1.5", "1"), ("9007199254740993", "9007199254740994")):
        q = b.fresh(f"completed{len(value)}")
        element = a_worker_in_its_loop(q)  # (completed: 1)
        q.raw_hset("meta", "completed", value)
        element, ids = loop_claim(q, 1, element)
        assert ids == "j2"
        assert q.hgetall("meta")["completed"] == after
        element, ids = loop_claim(q, 1, element)  # the loop's again where it can add
        assert ids == "j3"
        assert q.hgetall("meta")["completed"] == str(int(after) + 1)


# -- the library's read-only function ----------------------------------------------------------


@scenario
@library_only
def the_read_only_function_replies_to_each_read_as_the_module_and_refuses_the_rest(
    b: Backend,
) -> None:
    """FCALL_RO of the library's read-only function: each read replies as by FCALL and writes
    nothing (the stub refuses a write while it runs, as a server does), and any other command
    is refused before anything is read: ROTATOR_BADCMD, nothing changed."""
    push(b, "a", "b", "c", "d")
    buried = nxt(b, 1).tokens[0]
    assert b.call("bury", "bad input", buried) == [1]
    assert nxt(b, 2).ids == ["b", "c"]  # (the claim writes a's letter)
    assert b.call("schedule", "SET", "nightly", "report", 86_400_000, "every day") == 1
    b.call("durations", 90, 6, 2)
    before = b.snapshot()
    reads: list[tuple[str | int, ...]] = [
        ("peek", 10),
        ("scan", 0, 100, 100),
        ("dead", 0, 10),
        ("schedules",),
        ("durations",),
    ]
    for read in reads:
        assert b.call_read_only(*read) == b.call(*read), read
    by_fcall, read_only = all_stats(b), b.call_read_only("stats")
    assert isinstance(read_only, list)
    got = {str(k): v for k, v in zip(read_only[0::2], read_only[1::2], strict=True)}
    got.pop("oldest_pending_age_ms"), by_fcall.pop("oldest_pending_age_ms")  # (time moves)
    assert got == by_fcall
    assert b.snapshot() == before
    refused = [
        ("push", "e"),
        ("next", 1, LONG, BUDGET, 0),
        ("unique", "push", "e"),
        ("once", 0, 60_000, "push", "e"),
        ("durations", 90, 6, 2),
        ("ack", buried),
        ("sweep", 100),
        ("no_such",),
        ("STATS",),
    ]
    for argv in refused:
        with pytest.raises(ReplyError) as caught:
            b.call_read_only(*argv)
        assert caught.value.code == "ROTATOR_BADCMD", (argv, caught.value)
        assert "may write: call it by FCALL, not FCALL_RO" in str(caught.value), argv
    assert b.snapshot() == before
