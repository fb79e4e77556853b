"""The short way of `next` (M.fast_lease) against the walk it stands in for.

Two harnesses run the same random programs: one with the module as it ships, one with the
short way switched off (FAST_LEASE = false), so every `next` takes the walk. After every
step the replies and every key (the meta hash's counters included) must be equal. The
programs lean towards what the short way handles (one job or a batch per call, batch acks
of the previous calls, in order as one consumer sends them or out of order as several do)
and mix in what sends a call the long way (tokens acked one by one,
nacks, extensions, expiry, sweeps, pushes into a ring that is running dry), so both the
taking and the declining of the short way are compared.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.lua_steps import OUT_OF_ORDER, counted, function_names
from tests.lua.harness import MODULE_PATH, Harness, Hash, ScriptError, as_text, queue_keys

SWITCH = "local FAST_LEASE = true"
TAKE_OUT = "  take_out_look = 64,"
LEASE_MS = 1000


def walk_only_module(directory: Path, take_out: bool = True) -> Path:
    source = MODULE_PATH.read_text(encoding="utf-8")
    assert source.count(SWITCH) == 1
    path = directory / "rotator-walk-only.lua"
    path.write_text(
        without_take_out(source, take_out).replace(SWITCH, "local FAST_LEASE = false"),
        encoding="utf-8",
    )
    return path


def no_take_out_module(directory: Path) -> Path:
    """The module as it ships, but no named ack takes its batch out of the lease list at once
    (M.takes_out): as on a lease list longer than LIMIT.take_out_look, a batch acked out of
    order is marked until the walk reaches it."""
    path = directory / "rotator-no-take-out.lua"
    path.write_text(without_take_out(MODULE_PATH.read_text(encoding="utf-8"), False), "utf-8")
    return path


def without_take_out(source: str, take_out: bool) -> str:
    assert source.count(TAKE_OUT) == 1
    return source if take_out else source.replace(TAKE_OUT, "  take_out_look = 0,")


def batch_ack(tokens: list[str]) -> str:
    """The batch ack of a call's first deliveries: "*<deadline>.1.<call seq>/<jobs>"."""
    star = tokens[0].index("*")
    return tokens[0][star:-5] + f"/{len(tokens)}"


def named_ack(tokens: list[str]) -> str:
    """The named batch ack of a call's first deliveries: its packed element."""
    star = tokens[0].index("*")
    return tokens[0][star:-5] + "".join("*" + t[: t.index("*")] for t in tokens)


class Twins:
    """``payloads``: a queue with payloads, called as the Python client calls one (pushp,
    nextp_packed DROP 1 with named batch acks, ackp). ``library``: both modules loaded as
    function libraries (FCALL), which keep what they learn across calls (KEPT)."""

    def __init__(
        self,
        walk_only: Path,
        payloads: bool = False,
        library: bool = False,
        fast: Path = MODULE_PATH,
    ) -> None:
        self.fast = Harness("fast-twin", path=fast, library=library)
        self.walk = Harness("fast-twin", path=walk_only, library=library)
        self.payloads = payloads
        base = self.fast.keys[0].removesuffix(":ring")
        self.payload_keys = [*self.fast.keys, f"{base}:payloads"]
        self.batches: list[list[str]] = []  # first deliveries of each call, newest last
        self.tokens: list[str] = []  # every token handed out, newest last
        self.later: list[str] = []  # tokens of later deliveries (not in a batch) not acked
        self.shortcuts = 0

    def both(self, *argv: str | int, keys: list[str] | None = None) -> object:
        """``argv`` called on both twins (on ``keys``, or the queue's own), which must reply
        the same and leave the same data."""
        replies = []
        extended = self.payloads and argv[0] in {"pushp", "nextp_packed", "ackp"}
        if extended:
            keys = self.payload_keys
        for harness in (self.fast, self.walk):
            try:
                if keys is not None:
                    replies.append(("ok", as_text(harness.call_keys(keys, *argv))))
                else:
                    replies.append(("ok", as_text(harness.call(*argv))))
            except ScriptError as error:
                replies.append(("error", str(error)))
        assert replies[0] == replies[1], (argv, replies)
        assert self.fast.stub.data == self.walk.stub.data, argv
        return replies[0][1]

    def advance(self, ms: int) -> None:
        self.fast.advance(ms)
        self.walk.advance(ms)

    def next(self, count: int, acks: list[str], compact: bool, lease_ms: int = LEASE_MS) -> None:
        if self.payloads:
            reply = self.both("nextp_packed", count, lease_ms, 1000, 0, 1, *acks)
            assert isinstance(reply, list)
            element = reply[3]
            assert isinstance(element, str)
            if element:
                star = element.index("*", 1)
                stamp, ids = element[:star], element[star + 1 :].split("*")
                assert reply[4 : 4 + len(ids)] == [f"p-{i}" for i in ids]
                firsts = [f"{i}{stamp}{place:05d}" for place, i in enumerate(ids, 1)]
                self.batches.append(firsts)
                self.tokens += firsts
                reply = reply[len(ids) :]
            self.later += [str(t) for t in reply[4::3]]
            self.tokens += [str(t) for t in reply[4::3]]
            return
        reply = self.both("next_packed" if compact else "next", count, lease_ms, 1000, 0, *acks)
        assert isinstance(reply, list)
        if compact:
            element = reply[3]
            assert isinstance(element, str)
            if element:
                star = element.index("*", 1)
                stamp, ids = element[:star], element[star + 1 :].split("*")
                firsts = [f"{i}{stamp}{place:05d}" for place, i in enumerate(ids, 1)]
                self.batches.append(firsts)
                self.tokens += firsts
            self.later += [str(t) for t in reply[4::2]]
            self.tokens += [str(t) for t in reply[4::2]]
        else:
            tokens = [str(t) for t in reply[3::2]]
            firsts = [t for t in tokens if t.split("*", 1)[1].split(".")[1] == "1"]
            if firsts:
                self.batches.append(firsts)
            self.later += [t for t in tokens if t not in firsts]
            self.tokens += tokens


Step = tuple[str, int, int, bool]
KINDS = [
    "push", "next", "next", "next", "next_any", "next_any", "ack_one", "nack", "extend",
    "advance", "sweep",
]  # fmt: skip
step = st.tuples(st.sampled_from(KINDS), st.integers(0, 50), st.integers(0, 3), st.booleans())
ADVANCES = [1, 200, 900, 1500, 5000]
# Programs of a worker's loop (M.loop_lease's state) broken now and then by the others.
LOOP_KINDS = [
    "push", *["loop"] * 16, "next_any", "ack_one", "nack", "extend", "advance", "advance", "sweep",
]  # fmt: skip
loop_step = st.tuples(st.sampled_from(LOOP_KINDS), st.integers(0, 50), st.integers(0, 3),
                      st.booleans())  # fmt: skip
LOOP_LEASES = [LEASE_MS, LEASE_MS // 4, 4 * LEASE_MS]
# Programs of workers taking turns (M.loop_lease with several workers' batches in flight)
# broken now and then by the others.
TURN_KINDS = [
    *["turn"] * 12, "push", "loop", "next_any", "ack_one", "nack", "extend", "advance", "sweep",
]  # fmt: skip
turn_step = st.tuples(st.sampled_from(TURN_KINDS), st.integers(0, 50), st.integers(0, 3),
                      st.booleans())  # fmt: skip
# Programs of a consumer whose queue runs dry and is woken by pushes (M.fresh_lease's state)
# broken now and then by the others.
WAKE_KINDS = [
    *["wake"] * 10, "push", "next", "next_any", "ack_one", "nack", "extend", "advance", "sweep",
]  # fmt: skip
wake_step = st.tuples(st.sampled_from(WAKE_KINDS), st.integers(0, 50), st.integers(0, 3),
                      st.booleans())  # fmt: skip


def run(twins: Twins, program: list[Step], backlog: int = 0) -> None:
    """``backlog``: jobs pushed before the program, so that a loop does not run dry at once."""
    pushed = 0
    old = [f"old-{i}" for i in range(backlog)]
    if old and twins.payloads:
        twins.both("pushp", *[part for i in old for part in (i, f"p-{i}")])
    elif old:
        twins.both("push", *old)

    def push(n: int) -> None:
        nonlocal pushed
        ids = [f"job-{pushed + i}" for i in range(n)]
        if twins.payloads:
            twins.both("pushp", *[part for i in ids for part in (i, f"p-{i}")])
        else:
            twins.both("push", *ids)
        pushed += n

    for kind, a, b, flag in program:
        if kind == "push":
            push(a % 6 + 1)
        elif kind == "wake":
            # A consumer's cycle on a queue that runs dry: it acks what it holds, each token
            # alone (`flag`) or by batch acks on its claim, which finds the queue idle (or
            # not), then claims what a push brings, acking nothing: a fresh start, where
            # nothing else is in flight.
            acked = named_ack if twins.payloads else batch_ack
            held, twins.batches = twins.batches, []
            if flag:
                for token in [token for batch in held for token in batch] + twins.later:
                    twins.both("ackp" if twins.payloads else "ack", token)
                twins.later = []
                twins.next(1, [], True)
            else:
                twins.next(1, [acked(batch) for batch in held], True)
            twins.advance(ADVANCES[b % 2])
            push(a % 3 + 1)
            twins.next(a % 3 + 1, [], True, lease_ms=LOOP_LEASES[b % len(LOOP_LEASES)])
        elif kind == "next":
            # Batch acks of the oldest calls not yet acked: what a worker sends most.
            chosen, twins.batches = twins.batches[:b], twins.batches[b:]
            acked = named_ack if twins.payloads else batch_ack
            twins.next(a % 4 + 1, [acked(batch) for batch in chosen], flag)
        elif kind == "loop":
            # One worker's loop: every batch and later delivery not yet acked acked as it
            # claims again, for a lease as long as the others, shorter (the earliest deadline:
            # a wake-up) or longer.
            acked = named_ack if twins.payloads else batch_ack
            acks = [acked(batch) for batch in twins.batches] + twins.later
            twins.batches, twins.later = [], []
            twins.next(a % 3 + 1, acks, flag, lease_ms=LOOP_LEASES[b % len(LOOP_LEASES)])
        elif kind == "turn":
            # Workers taking turns: each acks the batch it claimed a turn ago, the oldest
            # held, as it claims again (a batch or none, held `b` turns: up to 4 workers).
            acked = named_ack if twins.payloads else batch_ack
            chosen = twins.batches[:1] if len(twins.batches) > b else []
            twins.batches = twins.batches[len(chosen) :]
            twins.next(a % 3 + 1, [acked(batch) for batch in chosen], flag,
                       lease_ms=LOOP_LEASES[a % len(LOOP_LEASES)])  # fmt: skip
        elif kind == "next_any":
            # Batch acks of calls other than the oldest: several consumers finishing out of
            # order, so batches are acked before the one at the lease list's tail.
            picked = sorted(
                {(a + 3 * i) % len(twins.batches) for i in range(b)} if twins.batches else set()
            )
            chosen = [twins.batches[i] for i in picked]
            twins.batches = [batch for i, batch in enumerate(twins.batches) if i not in picked]
            acked = named_ack if twins.payloads else batch_ack
            twins.next(a % 4 + 1, [acked(batch) for batch in reversed(chosen)], flag)
        elif kind == "advance":
            twins.advance(ADVANCES[a % len(ADVANCES)])
        elif kind == "sweep":
            twins.both("sweep", 1000)
        elif twins.tokens:
            token = twins.tokens[a % len(twins.tokens)]
            if kind == "ack_one":
                twins.both("ackp" if twins.payloads else "ack", token)
            elif kind == "nack":
                twins.both("nack", 300 if flag else 0, token)
            else:
                twins.both("extend", 2 * LEASE_MS, token)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(step, min_size=1, max_size=120))
def test_the_short_way_writes_what_the_walk_writes(
    tmp_path_factory: pytest.TempPathFactory, program: list[Step]
) -> None:
    run(Twins(walk_only_module(tmp_path_factory.mktemp("fast"))), program)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(loop_step, min_size=1, max_size=120))
def test_in_a_workers_loop_the_short_way_writes_what_the_walk_writes(
    tmp_path_factory: pytest.TempPathFactory, program: list[Step]
) -> None:
    """The same, on programs that stay in one worker's loop (M.loop_lease) most of the time."""
    run(Twins(walk_only_module(tmp_path_factory.mktemp("fast"))), program, backlog=150)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(loop_step, min_size=1, max_size=120))
def test_in_a_workers_loop_a_library_writes_what_the_walk_writes(
    tmp_path_factory: pytest.TempPathFactory, program: list[Step]
) -> None:
    """The same, both modules as libraries: the loop then knows the batch acks of the
    batches it made (M.loop_ack) and takes them without parsing them."""
    walk_only = walk_only_module(tmp_path_factory.mktemp("fast"))
    run(Twins(walk_only, library=True), program, backlog=150)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(turn_step, min_size=30, max_size=100), payloads=st.booleans(),
       library=st.booleans())  # fmt: skip
# A lease pass that ends at the acked batch after an ageing whose lease pass had not ended
# (its count -1): the ring walked whole, but not the rest of the lease list, so nothing ages
# (walked_whole). Found by a random run, then shrunk; about 1 program in 100 reaches it.
@example(program=[
    ("next_any", 27, 0, True), ("loop", 2, 0, False), ("turn", 1, 0, True), ("turn", 2, 0, False),
    ("turn", 2, 0, False), ("turn", 1, 0, True), ("turn", 0, 0, True), ("turn", 0, 0, True),
    ("turn", 1, 1, False), ("turn", 0, 2, True), ("turn", 2, 3, False), ("turn", 2, 0, False),
    ("turn", 0, 0, True), ("next_any", 35, 1, True), ("turn", 0, 0, False), ("turn", 0, 0, False),
    ("next_any", 1, 3, True), ("sweep", 0, 0, True), ("turn", 0, 3, False), ("push", 2, 0, False),
    ("turn", 2, 0, True), ("next_any", 0, 1, False),
], payloads=False, library=False)  # fmt: skip
def test_workers_taking_turns_write_what_the_walk_writes(
    tmp_path_factory: pytest.TempPathFactory, program: list[Step], payloads: bool, library: bool
) -> None:
    """The same, on programs of up to four workers taking turns, each acking the batch it
    claimed a turn ago (M.loop_lease with the lease list longer than one), with or without
    payloads, as a script or as libraries; a short backlog, so that the ring's laps end and
    the acks age among the turns."""
    walk_only = walk_only_module(tmp_path_factory.mktemp("fast"))
    run(Twins(walk_only, payloads=payloads, library=library), program, backlog=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(wake_step, min_size=1, max_size=60), library=st.booleans())
def test_a_consumer_woken_on_a_queue_that_runs_dry_writes_what_the_walk_writes(
    tmp_path_factory: pytest.TempPathFactory, program: list[Step], library: bool
) -> None:
    """The same, on programs of a consumer whose queue runs dry and is woken by pushes
    (M.fresh_lease, and the pushes ahead of an idle ring's sentinel), as a script or as
    libraries."""
    walk_only = walk_only_module(tmp_path_factory.mktemp("fast"))
    run(Twins(walk_only, library=library), program)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(loop_step, min_size=1, max_size=120), library=st.booleans())
def test_in_a_workers_loop_with_payloads_the_short_way_writes_what_the_walk_writes(
    tmp_path_factory: pytest.TempPathFactory, program: list[Step], library: bool
) -> None:
    """The same, on a queue with payloads: one worker's loop takes named batch acks too
    (M.loop_lease, named), and drops the same payloads and remembers the same acks as the walk,
    as a script or as libraries."""
    walk_only = walk_only_module(tmp_path_factory.mktemp("fast"))
    run(Twins(walk_only, payloads=True, library=library), program, backlog=150)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(step, min_size=1, max_size=120), take_out=st.booleans())
def test_with_payloads_the_short_way_writes_what_the_walk_writes(
    tmp_path_factory: pytest.TempPathFactory, program: list[Step], take_out: bool
) -> None:
    """The same, on a queue with payloads: named batch acks drop the same payloads either
    way, and every payload delivered is the job's own; with a batch acked out of order taken
    out of the lease list at once (M.takes_out), or marked (take-out off, as on a long lease
    list)."""
    directory = tmp_path_factory.mktemp("fast")
    fast = MODULE_PATH if take_out else no_take_out_module(directory)
    run(Twins(walk_only_module(directory, take_out), payloads=True, fast=fast), program)


# Every call's first command is the storage format's check, an HMGET of the meta's `format`
# (the module's FORMAT), in each list below. For a claim (next, nextp and their packed forms)
# and a push that HMGET also reads the fields their short ways read first (the module's
# first_reads), so those send no HMGET of their own.

# What one worker's loop sends on a queue with payloads (nextp_packed DROP 1, its ack the named
# batch ack): the loop's commands, the fencing window's settings and the copies count (for the
# memory of the acks whose payloads go, and for the payloads that go), the payloads delivered,
# that memory, and the payloads dropped; with the fencing set, its size, the batch looked up in
# it, and its trim.
PAYLOAD_LOOP_COMMANDS = [b"HMGET", b"HLEN", b"LRANGE", b"EXISTS", b"TIME",
                         b"HMGET", b"RPOP", b"LSET", b"HSET", b"HMGET", b"ZADD",
                         b"HDEL"]  # fmt: skip
FENCED_PAYLOAD_LOOP_COMMANDS = [b"HMGET", b"HLEN", b"LRANGE", b"EXISTS", b"TIME",
                                b"ZCARD", b"ZMSCORE", b"HMGET", b"RPOP", b"LSET", b"ZRANGEBYSCORE",
                                b"HSET", b"HMGET", b"ZADD", b"HDEL"]  # fmt: skip


def test_with_payloads_a_busy_queue_takes_the_short_way(tmp_path: Path) -> None:
    twins = Twins(walk_only_module(tmp_path), payloads=True)
    twins.both("pushp", *[part for i in range(300) for part in (f"j{i}", f"p-j{i}")])
    for call, count in enumerate((1, 1, 100, 1, 50)):
        acks = [named_ack(b) for b in twins.batches]
        twins.batches = []
        before = len(twins.fast.stub.calls)
        twins.next(count, acks, compact=True)
        made = [c[0] for c in twins.fast.stub.calls[before:]]
        assert made.count(b"LPOS") == 0, made  # the short way reads the element itself
        assert made.count(b"HSET") == 1, made  # the meta hash only
        if call == 1:  # (the fencing set does not exist yet)
            assert made == PAYLOAD_LOOP_COMMANDS, made
        if call >= 2:
            # The fencing set holds the memory of the acks before (see remember_dropped), and
            # nothing else exists beside it: its size is read alone, not every side structure's.
            assert made == FENCED_PAYLOAD_LOOP_COMMANDS, made
        twins.advance(10)
    # Every payload acked is gone: 300 pushed, the calls of 1, 1, 100 and 1 acked.
    assert sorted(twins.fast.stub.data[twins.payload_keys[-1].encode()]) == sorted(
        f"j{i}".encode() for i in range(103, 300)
    )


def test_a_busy_queue_takes_the_short_way(tmp_path: Path) -> None:
    """The one-job loop and the batch loop of a steady queue do take it (and still agree)."""
    twins = Twins(walk_only_module(tmp_path))
    meta = twins.fast.keys[8].encode()
    twins.both("push", *[f"job-{i}" for i in range(300)])
    for count in (1, 1, 1, 100, 1, 50):
        acks = [batch_ack(b) for b in twins.batches]
        twins.batches = []
        before = len(twins.fast.stub.calls)
        twins.next(count, acks, compact=True)
        calls = twins.fast.stub.calls[before:]
        made = [c[0] for c in calls]
        # The short way reads no side structure beyond their sizes and writes no mark. (The
        # first call, which acks nothing, reads the meta hash twice: a fresh start's fields,
        # then, declined (the lap not known yet), the rest.)
        assert made.count(b"HSET") == 1, made  # the meta hash only
        assert {c[1] for c in calls if c[0] == b"HMGET"} == {meta}, made
        assert b"HDEL" not in made, made
        assert b"SMISMEMBER" not in made, made
        twins.advance(10)


def short_way_taken(twins: Twins, count: int, since: int) -> bool:
    """The short way pops exactly `count` ids off the ring's tail; the walk reads a slice
    a little larger than it wants, and pops nothing."""
    ring = twins.fast.keys[0].encode()
    return any(
        call[:3] == (b"RPOP", ring, str(count).encode()) for call in twins.fast.stub.calls[since:]
    )


def workers_twins(
    tmp_path: Path, payloads: bool, library: bool = False
) -> tuple[Twins, Callable[[list[str]], str]]:
    """Twins of a queue of 400 jobs (with payloads or not) for several workers, and the
    batch ack a worker sends for a batch it holds (named, with payloads)."""
    twins = Twins(walk_only_module(tmp_path), payloads=payloads, library=library)
    ids = [f"j{i}" for i in range(400)]
    if payloads:
        twins.both("pushp", *[part for i in ids for part in (i, f"p-{i}")])
    else:
        twins.both("push", *ids)
    return twins, named_ack if payloads else batch_ack


@pytest.mark.parametrize("library", [False, True], ids=["eval", "library"])
@pytest.mark.parametrize("payloads", [False, True], ids=["plain", "payloads"])
def test_consumers_acking_out_of_order_take_the_short_way(
    tmp_path: Path, payloads: bool, library: bool
) -> None:
    """Four consumers, each acking its previous batch as it asks for the next, in an order
    that changes every round: a batch acked before the one at the lease list's tail is
    marked, and dropped when the tail reaches it, the short way (and as the walk would); a
    named ack (payloads) takes its batch out of the short lease list at once, on one worker's
    loop (and as the walk's ack does), so no mark is written."""
    twins, acked = workers_twins(tmp_path, payloads, library)
    held: dict[int, list[str]] = {}
    taken = calls = 0
    for order in ([0, 1, 2, 3], [1, 0, 3, 2], [3, 2, 1, 0], [2, 0, 3, 1], [0, 3, 1, 2]):
        for consumer in order:
            acks = [acked(held[consumer])] if consumer in held else []
            before = len(twins.fast.stub.calls)
            twins.next(10, acks, compact=True)
            held[consumer] = twins.batches.pop()
            calls += 1
            taken += short_way_taken(twins, 10, before)
            twins.advance(5)
    assert calls == 20
    assert taken == calls, f"{taken} of {calls} calls took the short way"
    # Plain: at most the batches acked ahead of the tail's are marked. Payloads: none (each
    # was taken out).
    marks = twins.fast.stub.data.get(twins.fast.keys[3].encode(), ())
    assert len(marks) <= 3 if not payloads else not marks
    assert len(twins.fast.stub.data[twins.fast.keys[10].encode()]) == 4  # (the batches held)
    if payloads:  # (both took batches out: the loop, and the walk's ack)
        for harness in (twins.fast, twins.walk):
            assert b"LREM" in [call[0] for call in harness.stub.calls]


# What a fresh start (M.fresh_lease) sends: the lease list's first two elements (none), the
# meta's fields, the side structures' count, the time, the pop, a wake-up for its deadline
# (guarded: the wake list's type is not read apart), the batch pushed onto the lease list,
# the meta's numbers; with a fencing set, its size and settings, and its trim.
FRESH_COMMANDS = [b"HMGET", b"LRANGE", b"EXISTS", b"TIME", b"RPOP",
                  b"LPUSH", b"HSET"]  # fmt: skip
FENCED_FRESH_COMMANDS = [b"HMGET", b"LRANGE", b"EXISTS", b"TIME", b"ZCARD", b"HMGET",
                         b"RPOP", b"LPUSH", b"ZRANGEBYSCORE", b"HSET"]  # fmt: skip
# A fresh start whose lease is shorter than one given before: an idle consumer may be waiting
# longer than it lasts, and is woken (the wake list's LPUSH, after the pop).
WAKING_FRESH_COMMANDS = [b"HMGET", b"LRANGE", b"EXISTS", b"TIME", b"RPOP",
                         b"LPUSH", b"LPUSH", b"HSET"]  # fmt: skip


@pytest.mark.parametrize("library", [False, True], ids=["eval", "library"])
@pytest.mark.parametrize("acks", ["batch", "token"])
def test_a_consumer_woken_by_a_push_takes_a_fresh_start(
    tmp_path: Path, acks: str, library: bool
) -> None:
    """A consumer of an idle queue woken by a push (of one id or a few): the ids went ahead
    of the ring's sentinel, so its claim takes them by a fresh start's fixed commands (and
    the walk agrees), without crossing the lap first. It acks them as its next claim finds
    the queue idle again (a batch ack), or each by its token before (which fences the batch:
    the fresh start then trims the fencing set)."""
    twins = Twins(walk_only_module(tmp_path), library=library)
    twins.both("push", "first")
    twins.next(1, [], compact=True)
    for round_, n in enumerate((1, 1, 3, 1, 2)):
        held = twins.batches.pop()
        if acks == "token":
            for token in held:
                twins.both("ack", token)
        idle = [batch_ack(held)] if acks == "batch" else []
        reply = twins.both("next_packed", 1, LEASE_MS, 1000, 0, *idle)
        assert isinstance(reply, list)
        assert (reply[0], reply[2], reply[3]) == (1, len(idle), ""), reply  # idle
        twins.advance(20)
        twins.both("push", *[f"r{round_}-{i}" for i in range(n)])
        before = len(twins.fast.stub.calls)
        twins.next(n, [], compact=True)
        expected = FENCED_FRESH_COMMANDS if acks == "token" else FRESH_COMMANDS
        assert commands_since(twins, before) == expected
        assert [token.split("*")[0] for token in twins.batches[-1]] == [
            f"r{round_}-{i}" for i in range(n)
        ]


# What a plain push (M.plain_push) sends within its checkpoint's second: the ring's length,
# the meta's fields, the push log's head, the wake list's length, the time; the push, the
# meta's numbers, a wake-up. Onto an idle ring (its sentinel alone): the wake-up first, in
# place of the wake list's length, and the push at the tail.
PLAIN_PUSH_COMMANDS = [b"HMGET", b"LLEN", b"LINDEX", b"LLEN", b"TIME",
                       b"LPUSH", b"HSET", b"LPUSH"]  # fmt: skip
IDLE_PLAIN_PUSH_COMMANDS = [b"HMGET", b"LLEN", b"LINDEX", b"LPUSH", b"TIME",
                            b"RPUSH", b"HSET"]  # fmt: skip


@pytest.mark.parametrize("library", [False, True], ids=["eval", "library"])
def test_a_plain_push_takes_its_own_path(tmp_path: Path, library: bool) -> None:
    """Valid ids pushed onto a queue that exists and does not track ids: fixed commands (and
    push_ids, which the walk-only twin takes, writes the same), ahead of an idle ring's
    sentinel too, with a checkpoint once a second."""
    twins = Twins(walk_only_module(tmp_path), library=library)

    def pushed(*ids: str) -> list[bytes]:
        before = len(twins.fast.stub.calls)
        assert twins.both("push", *ids) == len(ids)
        return commands_since(twins, before)

    assert pushed("first") != PLAIN_PUSH_COMMANDS  # (a new queue: push_ids makes it)
    twins.next(1, [], compact=True)
    idle = twins.both("next_packed", 1, LEASE_MS, 1000, 0, batch_ack(twins.batches.pop()))
    assert isinstance(idle, list)
    assert idle[0] == 1, idle
    ahead = pushed("a")  # onto the idle ring: ahead of its sentinel
    assert ahead == IDLE_PLAIN_PUSH_COMMANDS
    assert pushed("b", "c") == PLAIN_PUSH_COMMANDS
    twins.advance(1500)  # a new second: a checkpoint
    made = pushed("d")
    assert made[:5] == PLAIN_PUSH_COMMANDS[:5]
    assert made[-3:] == PLAIN_PUSH_COMMANDS[-3:]
    assert made.count(b"LPUSH") == 3, made
    pushlog = twins.fast.stub.data[twins.fast.keys[9].encode()]
    assert isinstance(pushlog, list)
    assert pushlog[0].startswith(b"5:"), pushlog  # (5 pushed so far, this second's)


# What push_chunk sends on a plain push's path: the meta's fields (by the call's first HMGET)
# and the marker's, a plain push's commands, then the marker's count and expiry.
PLAIN_PUSH_CHUNK_COMMANDS = [b"HMGET", b"HMGET", *PLAIN_PUSH_COMMANDS[1:], b"HSET", b"PEXPIRE"]


@pytest.mark.parametrize("library", [False, True], ids=["eval", "library"])
def test_a_chunk_pushed_under_a_marker_takes_the_plain_push_path(
    tmp_path: Path, library: bool
) -> None:
    """push_chunk (a bulk load's, or a plain push with retry_for) pushes its ids as push
    does, by the same path and with the same result (the walk-only twin takes push_ids);
    a chunk sent again pushes nothing, and says what its first call pushed."""
    twins = Twins(walk_only_module(tmp_path), library=library)
    base = twins.fast.keys[0].removesuffix(":ring")
    marked = [*twins.fast.keys, f"{base}:push:run-1"]
    twins.both("push", "first")  # (a new queue: push_ids makes it; a busy ring from here)
    before = len(twins.fast.stub.calls)
    assert twins.both("push_chunk", 0, 60_000, "a", "b", keys=marked) == [2, 1, 0]
    assert commands_since(twins, before) == PLAIN_PUSH_CHUNK_COMMANDS
    assert twins.both("push_chunk", 0, 60_000, "a", "b", keys=marked) == [0, 1, 2]
    assert twins.both("push_chunk", 1, 60_000, "c", keys=marked) == [1, 2, 0]
    # Another push call, its own marker (a library checks the thirteen keys once, then the
    # marker alone): the same path; a marker that is one of the queue's keys is refused.
    before = len(twins.fast.stub.calls)
    second = [*marked[:-1], f"{base}:push:run-2"]
    assert twins.both("push_chunk", 0, 60_000, "d", keys=second) == [1, 1, 0]
    assert commands_since(twins, before) == PLAIN_PUSH_CHUNK_COMMANDS
    for taken in (f"{base}:ring", f"{base}:meta", f"{base}:payloads", "elsewhere:push:run-3"):
        refused = twins.both("push_chunk", 0, 60_000, "e", keys=[*marked[:-1], taken])
        assert isinstance(refused, str), refused
        assert "ROTATOR_KEYS" in refused
    twins.next(5, [], compact=True)
    assert [token.split("*")[0] for token in twins.batches[-1]] == ["first", "a", "b", "c", "d"]


# What the one-worker loop (M.loop_lease) sends: the claim's reads (the lease list's length
# and element by one LRANGE), the pop (which is the ring's read too), the batch in the acked
# one's place, and the meta's numbers and counters by one HSET.
LOOP_COMMANDS = [b"HMGET", b"LRANGE", b"EXISTS", b"TIME", b"RPOP", b"LSET",
                 b"HSET"]  # fmt: skip


def commands_since(twins: Twins, since: int) -> list[bytes]:
    return [call[0] for call in twins.fast.stub.calls[since:]]


# What the loop sends for workers taking turns: the lease list's last two elements and its
# length, the claim's reads, the pop, the acked batch off the tail and the new one onto the
# head, the meta's numbers; with payloads, as PAYLOAD_LOOP_COMMANDS (the fencing set there).
TURNS_COMMANDS = [b"HMGET", b"LRANGE", b"LLEN", b"EXISTS", b"TIME", b"RPOP",
                  b"RPOP", b"LPUSH", b"HSET"]  # fmt: skip
PAYLOAD_TURNS_COMMANDS = [b"HMGET", b"HLEN", b"LRANGE", b"LLEN", b"EXISTS", b"TIME",
                          b"ZCARD", b"ZMSCORE", b"HMGET", b"RPOP", b"RPOP", b"LPUSH",
                          b"ZRANGEBYSCORE", b"HSET", b"HMGET", b"ZADD", b"HDEL"]  # fmt: skip


@pytest.mark.parametrize("library", [False, True], ids=["eval", "library"])
@pytest.mark.parametrize("payloads", [False, True], ids=["plain", "payloads"])
def test_workers_taking_turns_take_the_loop(tmp_path: Path, payloads: bool, library: bool) -> None:
    """Four workers, each acking the batch it claimed a turn ago (the lease list's tail) as
    it claims again: from the third turn on (with payloads, the fencing set is there by
    then), every claim is the loop's fixed commands, the acked batch off the tail and the
    new one onto the head (and the walk agrees)."""
    twins, acked = workers_twins(tmp_path, payloads, library)
    leases = twins.fast.keys[10].encode()
    held: dict[int, list[str]] = {}
    for turn in range(5):
        for worker in range(4):
            acks = [acked(held[worker])] if worker in held else []
            before = len(twins.fast.stub.calls)
            twins.next(10, acks, compact=True)
            held[worker] = twins.batches.pop()
            made = twins.fast.stub.calls[before:]
            if turn > 1:
                assert [c[0] for c in made] == (PAYLOAD_TURNS_COMMANDS if payloads
                                                else TURNS_COMMANDS), made  # fmt: skip
                assert (b"RPOP", leases) in [c[:2] for c in made]
                assert len(twins.fast.stub.data[leases]) == 4
            twins.advance(5)
    if payloads:  # (every batch acked has its payloads dropped: 16 of 10 jobs)
        assert len(twins.fast.stub.data[twins.payload_keys[-1].encode()]) == 400 - 160


@pytest.mark.parametrize(
    ("young", "looped"),
    [
        ("{batch2}", True),  # the next worker's batch
        ("x*{deadline2}.2.{call2}", True),  # a later delivery's lease (a token)
        ("{batch1}*y", False),  # the acked batch again: a copy written by hand
        ("*{deadline2}.1.{call2}", False),  # a batch name with no ids
        ("x*1.2.{call2}", False),  # a lease that is due
        ("garbage", False),  # neither
    ],
)
def test_workers_taking_turns_leave_what_they_do_not_recognise_to_the_others(
    tmp_path: Path, young: str, looped: bool
) -> None:
    """The lease before the acked tail must be a young lease of another batch or job; with
    anything else there the claim goes the way it always went, and both harnesses agree."""
    twins = Twins(walk_only_module(tmp_path))
    twins.both("push", *[f"job-{i}" for i in range(10)])
    twins.next(1, [], compact=True)
    twins.next(1, [], compact=True)
    first, second = (b[0] for b in twins.batches)
    batch1, batch2 = (t[t.index("*") : -5] for t in (first, second))
    deadline2, _, call2 = batch2[1:].split(".")
    leases = twins.fast.keys[10]
    element = young.format(batch1=batch1, batch2=batch2, deadline2=deadline2, call2=call2)
    if young != "{batch2}":  # (the second batch's element written over by hand, in both)
        for harness in (twins.fast, twins.walk):
            listed = harness.stub.data[leases.encode()]
            assert isinstance(listed, list)
            listed[0] = element.encode()
    before = len(twins.fast.stub.calls)
    twins.next(1, [batch_ack([first])], compact=True)
    assert (commands_since(twins, before) == TURNS_COMMANDS) == looped


@pytest.mark.parametrize("library", [False, True], ids=["eval", "library"])
@pytest.mark.parametrize("compact", [True, False], ids=["next_packed", "next"])
def test_one_workers_loop_takes_its_own_path(tmp_path: Path, compact: bool, library: bool) -> None:
    """A worker acking its previous batch as it claims the next, of one job or several: from
    the second call on, every call is the loop's fixed commands (and the walk agrees)."""
    twins = Twins(walk_only_module(tmp_path), library=library)
    twins.both("push", *[f"job-{i}" for i in range(100)])
    for call, count in enumerate((1, 1, 1, 3, 1, 5, 1, 1)):
        acks = [batch_ack(b) for b in twins.batches]
        twins.batches = []
        before = len(twins.fast.stub.calls)
        twins.next(count, acks, compact=compact)
        if call > 0:
            assert commands_since(twins, before) == LOOP_COMMANDS
        twins.advance(7)


def test_one_workers_loop_wakes_an_idle_consumer_for_an_earlier_deadline(tmp_path: Path) -> None:
    """A claim whose lease ends before the one it acks makes the earliest deadline: it checks
    the wake list's type before it pops, and leaves a wake-up token, as the walk does."""
    twins = Twins(walk_only_module(tmp_path))
    twins.both("push", *[f"job-{i}" for i in range(10)])
    reply = twins.both("next_packed", 1, 5 * LEASE_MS, 1000, 0)
    assert isinstance(reply, list)
    element = str(reply[3])
    wake = twins.fast.keys[7].encode()
    tokens = len(twins.fast.stub.data.get(wake, []))  # (pushes wake consumers too)
    before = len(twins.fast.stub.calls)
    twins.both("next_packed", 1, LEASE_MS, 1000, 0, element[: element.index("*", 1)] + "/1")
    made = twins.fast.stub.calls[before:]
    assert [call[0] for call in made].index(b"RPOP") > made.index((b"LLEN", wake))
    assert (b"LSET", twins.fast.keys[10].encode(), b"0") == made[-3][:3]
    assert len(twins.fast.stub.data[wake]) == min(tokens + 1, 16)  # (LIMIT.wake_tokens)


@pytest.mark.parametrize(
    ("ack", "looped"),
    [
        ("{batch}/1", True),
        ("{batch}/01", True),  # the job count with a leading zero: the same ack
        ("{batch}/2", False),  # more jobs than the batch holds
        ("*1{deadline}.1.{call}/1", False),  # a deadline the batch was not made with
        ("*{deadline}.1.9{call}/1", False),  # a call seq not reached yet
        ("*{deadline}.1.1/1", False),  # a call seq from before the queue's origin
        ("*{deadline}.1.{call}/0", False),  # no job: refused
        ("{batch}/1x", False),  # not a batch ack: refused
    ],
)
@pytest.mark.parametrize("library", [False, True], ids=["eval", "library"])
def test_one_workers_loop_leaves_what_it_does_not_recognise_to_the_others(
    tmp_path: Path, ack: str, looped: bool, library: bool
) -> None:
    """An ack that is not exactly the lone batch's goes the way it always went (fast_lease
    or the walk, which refuse it or keep it as they did), and both harnesses still agree."""
    twins = Twins(walk_only_module(tmp_path), library=library)
    twins.both("push", *[f"job-{i}" for i in range(10)])
    reply = twins.both("next_packed", 1, LEASE_MS, 1000, 0)
    assert isinstance(reply, list)
    element = str(reply[3])
    batch = element[: element.index("*", 1)]
    deadline, _, call = batch[1:].split(".")
    before = len(twins.fast.stub.calls)
    twins.both("next_packed", 1, LEASE_MS, 1000, 0, ack.format(batch=batch, deadline=deadline,
                                                              call=call))  # fmt: skip
    assert (commands_since(twins, before) == LOOP_COMMANDS) == looped


def loop_state(tmp_path: Path, jobs: int = 10, library: bool = False) -> tuple[Twins, str]:
    """Twins in one worker's loop: `jobs` pushed, one claimed; the batch ack to send next."""
    twins = Twins(walk_only_module(tmp_path), library=library)
    twins.both("push", *[f"job-{i}" for i in range(jobs)])
    reply = twins.both("next_packed", 1, LEASE_MS, 1000, 0)
    assert isinstance(reply, list)
    element = str(reply[3])
    return twins, element[: element.index("*", 1)] + "/1"


def test_one_workers_loop_refuses_a_ring_of_another_type_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """The loop reads the ring only by its pop, guarded: a ring of another type (written by
    hand) is declined there, and the walk refuses it by its type, as before anything else."""
    twins, ack = loop_state(tmp_path)
    ring = twins.fast.keys[0].encode()
    for harness in (twins.fast, twins.walk):
        harness.stub.data[ring] = b"not a list"
    before = {key: repr(value) for key, value in twins.fast.stub.data.items()}
    reply = twins.both("next_packed", 1, LEASE_MS, 1000, 0, ack)
    assert isinstance(reply, str), reply
    assert reply.startswith("ROTATOR_WRONGTYPE"), reply
    assert {key: repr(value) for key, value in twins.fast.stub.data.items()} == before


@pytest.mark.parametrize("library", [False, True], ids=["eval", "library"])
def test_a_wake_list_of_another_type_leaves_an_idle_queue_as_it_was(
    tmp_path: Path, library: bool
) -> None:
    """A plain push onto an idle ring and a fresh start make their wake-up first among their
    writes (the fresh start after its pop), guarded: a wake list of another type (written by
    hand) sends the call to the general path, which refuses it by its type, and nothing
    changes (the fresh start's pop put back), as with the walk."""
    twins = Twins(walk_only_module(tmp_path), library=library)
    twins.both("push", "first")
    twins.next(1, [], compact=True)
    idle = twins.both("next_packed", 1, LEASE_MS, 1000, 0, batch_ack(twins.batches.pop()))
    assert isinstance(idle, list)
    assert idle[0] == 1, idle
    wake = twins.fast.keys[7].encode()
    assert wake.endswith(b":wake")

    def refused(*argv: str | int) -> list[bytes]:
        for harness in (twins.fast, twins.walk):
            harness.stub.data[wake] = b"not a list"
        before = {key: repr(value) for key, value in twins.fast.stub.data.items()}
        since = len(twins.fast.stub.calls)
        reply = twins.both(*argv)
        assert isinstance(reply, str), reply
        assert reply.startswith("ROTATOR_WRONGTYPE"), reply
        assert {key: repr(value) for key, value in twins.fast.stub.data.items()} == before
        return commands_since(twins, since)

    made = refused("push", "a")  # onto the idle ring
    tried = IDLE_PLAIN_PUSH_COMMANDS.index(b"LPUSH") + 1  # (its wake-up tried first)
    assert made[:tried] == IDLE_PLAIN_PUSH_COMMANDS[:tried], made
    for harness in (twins.fast, twins.walk):
        del harness.stub.data[wake]
    twins.both("push", "a")  # ahead of the sentinel, waking
    made = refused("next_packed", 1, LEASE_MS // 2, 1000, 0)  # a fresh start's, waking
    tried = WAKING_FRESH_COMMANDS.index(b"LPUSH") + 1  # (popped, its wake-up tried)
    assert made[:tried] == WAKING_FRESH_COMMANDS[:tried], made
    assert made[tried] == b"RPUSH", made  # (the pop put back)
    for harness in (twins.fast, twins.walk):
        del harness.stub.data[wake]
    twins.next(1, [], compact=True)  # and once the list is a list again, the fresh start
    assert [token.split("*")[0] for token in twins.batches[-1]] == ["a"]


def test_one_workers_loop_puts_back_a_pop_that_is_not_its_jobs(tmp_path: Path) -> None:
    """A ring holding fewer ids than the claim asks for, its sentinel gone (written by hand):
    the loop pops, sees the ring was too short, puts the ids back as they were and declines;
    the walk then leases them, as it always did, and no job is lost."""
    twins, ack = loop_state(tmp_path)
    ring = twins.fast.keys[0].encode()
    for harness in (twins.fast, twins.walk):
        harness.stub.data[ring] = [b"job-1", b"job-2"]  # (head first: job-2 is the tail)
    before = len(twins.fast.stub.calls)
    reply = twins.both("next_packed", 3, LEASE_MS, 1000, 0, ack)
    assert commands_since(twins, before) != LOOP_COMMANDS
    assert [c[0] for c in twins.fast.stub.calls[before:]].count(b"RPOP") >= 1
    assert isinstance(reply, list)
    leases = twins.fast.raw("leases")
    assert isinstance(leases, list)
    held = [part for element in [*leases, *twins.fast.ring()] for part in element.split(b"*")]
    assert b"job-1" in held
    assert b"job-2" in held


@pytest.mark.parametrize("completed", [b"garbage", b"1.5", b"9007199254740993"])
def test_one_workers_loop_leaves_a_counter_it_cannot_add_to_to_the_walk(
    tmp_path: Path, completed: bytes
) -> None:
    """The loop writes `completed` with its other numbers (one HSET, no HINCRBY), so it reads
    it: one that is not a whole number it can add to exactly (written by hand) sends the call
    the walk's way, whose HINCRBY starts it again, as before, and no call fails."""
    twins, ack = loop_state(tmp_path)
    meta = twins.fast.keys[8].encode()
    for harness in (twins.fast, twins.walk):
        stored = harness.stub.data[meta]
        assert isinstance(stored, Hash)
        stored[b"completed"] = completed
    before = len(twins.fast.stub.calls)
    reply = twins.both("next_packed", 1, LEASE_MS, 1000, 0, ack)
    assert commands_since(twins, before) != LOOP_COMMANDS
    stored = twins.fast.stub.data[meta]
    assert isinstance(stored, Hash)
    big = completed.startswith(b"9")
    assert stored[b"completed"] == (b"9007199254740994" if big else b"1")
    # The loop's next call is its own again where the counter is exact, and adds to it.
    assert isinstance(reply, list)
    element = str(reply[3])
    before = len(twins.fast.stub.calls)
    twins.both("next_packed", 1, LEASE_MS, 1000, 0, element[: element.index("*", 1)] + "/1")
    assert (commands_since(twins, before) == LOOP_COMMANDS) == (not big)
    assert stored[b"completed"] == (b"9007199254740995" if big else b"2")


@pytest.mark.parametrize("library", [False, True], ids=["eval", "library"])
def test_one_workers_loop_checks_the_element_of_an_ack_it_knows(
    tmp_path: Path, library: bool
) -> None:
    """A library knows the batch ack of each batch it made (M.loop_ack), and then takes the
    lease list's element only if it is that very batch: one written over by hand (the same
    stamp, another id) is the walk's, where a script's loop, which checks the element as it
    is, takes it; both harnesses agree either way (the ack completes the batch of that stamp),
    and the next claim leases the ring's next id."""
    twins, ack = loop_state(tmp_path, library=library)
    reply = twins.both("next_packed", 1, LEASE_MS, 1000, 0, ack)  # (a batch the loop made)
    assert isinstance(reply, list)
    made = str(reply[3])
    ack = made[: made.index("*", 1)] + "/1"
    leases = twins.fast.key("leases")
    stored = twins.fast.stub.data[leases]
    assert isinstance(stored, list)
    (element,) = stored
    other = element[: element.index(b"*", 1)] + b"*other-job"
    for harness in (twins.fast, twins.walk):
        harness.stub.data[leases] = [other]
    before = len(twins.fast.stub.calls)
    reply = twins.both("next_packed", 1, LEASE_MS, 1000, 0, ack)
    assert (commands_since(twins, before) == LOOP_COMMANDS) == (not library)
    assert isinstance(reply, list)
    assert reply[2] == 1  # the ack accepted either way
    # The batch made before the hand's write is not in the lease list (acked whole), and the
    # next call's batch is leased from the ring as usual.
    leased = str(reply[3])
    assert leased.endswith("*job-2")
    twins.both("next_packed", 1, LEASE_MS, 1000, 0, leased[: leased.index("*", 1)] + "/1")


def test_one_workers_loop_of_a_library_checks_each_queues_own_origin(tmp_path: Path) -> None:
    """A library converts the origin the loop reads once (KEPT), for its check that an ack
    is from after the queue was made: with two queues in turn, made a second apart, each
    ack is held against its own queue's origin, not the last one read (the first queue's
    acks are older than the second queue's origin, and still loop after its turn)."""
    harness = Harness("first", library=True)
    queues = [queue_keys("second"), harness.keys]  # (the later queue's turn first)
    harness.call_keys(queues[1], "push", *[f"a{i}" for i in range(10)])
    harness.advance(1000)
    harness.call_keys(queues[0], "push", *[f"b{i}" for i in range(10)])
    acks: list[list[str]] = [[], []]
    looped = []
    for turn in range(6):
        keys = queues[turn % 2]
        before = len(harness.stub.calls)
        reply = harness.call_keys(keys, "next_packed", 1, LEASE_MS, 1000, 0, *acks[turn % 2])
        assert isinstance(reply, list)
        element = as_text(reply[3])
        assert isinstance(element, str)
        acks[turn % 2] = [element[: element.index("*", 1)] + "/1"]
        looped.append([call[0] for call in harness.stub.calls[before:]] == LOOP_COMMANDS)
        harness.advance(5)
    assert looped == [False, False, True, True, True, True]


def four_payload_workers_out_of_order(harness: Harness) -> set[str | None]:
    """The module's functions that ran while four workers of a queue with payloads, each
    acking its last batch by name, made 100 claims out of order: each once a round, the order
    changing from round to round (bench.lua_steps.OUT_OF_ORDER; one order repeated would
    settle into turns, each acking the oldest batch)."""
    keys = [*harness.keys, harness.keys[0].removesuffix(":ring") + ":payloads"]
    ids = [f"job-{i}" for i in range(11_000)]
    for start in range(0, len(ids), 1000):
        harness.call_keys(
            keys, "pushp", *[part for i in ids[start : start + 1000] for part in (i, "p")]
        )
    held: list[bytes] = []
    for _ in range(4):
        reply = harness.call_keys(keys, "nextp_packed", 100, LEASE_MS, 1000, 0, 1)
        assert isinstance(reply, list)
        assert isinstance(reply[3], bytes)
        held.append(reply[3])
    turn = 0

    def claims() -> None:
        nonlocal turn
        for _ in range(100):
            worker = OUT_OF_ORDER[turn % len(OUT_OF_ORDER)]
            reply = harness.call_keys(keys, "nextp_packed", 100, LEASE_MS, 1000, 0, 1, held[worker])
            assert isinstance(reply, list)
            assert reply[2] == 1, reply[:4]  # (its named ack accepted)
            assert isinstance(reply[3], bytes)
            held[worker], turn = reply[3], turn + 1

    called = counted(harness, 1, claims, None)
    names = function_names()
    return {names.get(line) for line in called}


def test_a_library_knows_the_batches_several_workers_hold_as_its_memory_turns(
    tmp_path: Path,
) -> None:
    """Four workers acking out of order where their batches are not taken out (take-out off,
    as on a lease list longer than LIMIT.take_out_look): their claims take the short way,
    whose marks stand for the batches acked. A library keeps the batches it made (the last
    LIMIT.known_batches, and as many before: M.keep_packed), so over 100 claims, six turns of
    that memory, none splits a named ack or counts an element's ids again."""
    harness = Harness("known", path=no_take_out_module(tmp_path), library=True)
    ran = four_payload_workers_out_of_order(harness)
    assert "M.fast_lease" in ran  # (several workers: the short way, not one worker's loop)
    assert not {"M.split_ids", "M.count_ids"} & ran, sorted(n for n in ran if n)


def test_workers_acking_out_of_order_take_their_batches_out_on_one_workers_loop() -> None:
    """Four workers of a queue with no marks, acking out of order: each claim's named ack
    takes its batch out of the short lease list where it lies (M.takes_out), or drops the
    tail's, so every claim is one worker's loop's, no mark is written, and nothing is split
    or counted again."""
    harness = Harness("taken-out", library=True)
    ran = four_payload_workers_out_of_order(harness)
    assert {"M.loop_lease", "M.takes_out"} <= ran
    assert not {"M.fast_lease", "M.take_out", "M.split_ids", "M.count_ids"} & ran, sorted(
        n for n in ran if n
    )
    base = harness.keys[0].removesuffix(":ring")
    assert not harness.stub.data.get(f"{base}:marks".encode())
    leases = harness.stub.data[f"{base}:leases".encode()]
    assert isinstance(leases, list)
    assert len(leases) == 4
