"""The real module against the executable model (tests/model.py), on Redis 7 and Valkey 8.

A Hypothesis state machine pushes, schedules pushes for later (push_later IN and AT, times
passed included, an id scheduled again moving), pushes at priority levels 1..9 (now, and
for later; an id pushed again at its level moving to the back of it; bad levels refused),
pushes under `once` as retry_for sends them (and sends such a call again: nothing runs),
declares, fills, forgets and lists recurring schedules (intervals of a few ms and due
times), sets and lifts a rate limit, adds processing times (durations, and with the acks of
next and ack), pauses and resumes, claims, acks, nacks, extends, crashes workers, moves the
clock (also backwards, and to the edges of due times), flushes the script cache and
corrupts the ring, and after every step compares every reply and every key of the queue
(and of its meta hash smin, paused, the schedules, the rate limit's cell rate, the counts
since the queue was made, prio and pseq, and the histogram) with the model, and every field
of stats: so which jobs each claim hands out (the jobs waiting at a level join its batch,
most urgent level first and in push order, once no pending id is left in the ring) is
predicted exactly. Apart from the model it checks that a scheduled job leaves the schedule
only once due, that a claim leaves nothing due scheduled, that a paused queue leases
nothing; that a schedule's ticks are never early, follow one another (so no tick's job is
pushed twice), lie on the schedule's grid of whole intervals or at its due times, and that a
claim makes one job per schedule however many ticks it missed; and that the rate limit never
lets more go than its burst of JOBS plus one every PER_MS / JOBS ms, and tells a held claim
when one more may go. Time is the test's: the module is
loaded in a test-only variant whose `M.now_ms()` reads the clock from a field of the queue's
own meta hash (KEYS[9]), so both sides see the same instant. The variant differs from
lua/rotator.lua in that one function only, and is called both ways rotator calls the real
one (each machine runs twice): as a function library by FCALL, the default, loaded again
after FUNCTION FLUSH, which keeps the module's memos (KEPT) from one call to the next and
from one example's queue to the next; and as a redis-py Script (SCRIPT LOAD, then EVALSHA,
reloaded after SCRIPT FLUSH), which keeps nothing between calls.

The main machine's queue does not track ids: its unique pushes and cancels are refused
(ROTATOR_UNTRACKED) and write nothing. A second machine (TrackedMachine) drives a queue that
tracks ids (configure track_ids 1: unique pushes, cancel) through the Python API against
TrackedIds, an id-level model: it says there what it compares exactly and what it bounds.

A further, smaller property test pushes arbitrary bytes into the ring as an admin would and
checks that `next` never fails and every element ends delivered, dead-lettered or still valid.

More examples: ROTATOR_MODEL_PROFILE=model-nightly pytest tests/test_model.py
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rotator import (
    Durations,
    InvalidArgument,
    InvalidJobId,
    InvalidToken,
    Job,
    JobCancelled,
    LeaseLost,
    NotTracked,
    RateLimit,
    Rotator,
    Stats,
    UnknownFormat,
)
from rotator.protocol import Batches, encode_durations
from rotator.script import FunctionCall, module_source, run
from tests import model as spec
from tests.helpers import snapshot
from tests.model import (
    SENTINEL,
    Refused,
    RotatorModel,
    TrackedIds,
    parse_lease,
    unpacked,
    valid_id,
)
from tests.servers import ServerProcess

T = TypeVar("T")

CLOCK_FIELD = "test_clock"
START_MS = 1_700_000_000_000
LEASE_MS = 1000  # the API queue's lease
MAX_DELIVERIES = 3  # the API queue's max_deliveries
BUDGET = 3  # the API queue's budget: small, so laps take several calls
DROPPED_MEMORY_MS = 60_000  # how long an ack that dropped payloads is remembered (LIMIT)
LIVENESS_JUMP_MS = 3 * 86_400_000  # past every lease, nack delay and the revoked memory
MAX_STAMPED_DELIVERIES = 999_999_999  # the most deliveries a token may carry (9 digits)
# A consumer told idle = 1 blocks for wait_ms: it must not be told so while a job is there.
CHECK_IDLE_REPLIES = True
# A claim held by the rate limit was once told a wait_ms 1 ms short of when one more job may
# go (test_a_claim_held_by_the_rate_limit_is_told_when_one_more_may_go); True would tolerate
# that again.
RATE_WAIT_MAY_FALL_SHORT = False
# A job waiting at a priority level scheduled at that level again (push_priority LEVEL IN
# <later>) leaves the level for the schedule; meta prio once kept counting it
# (test_a_waiting_prioritized_job_scheduled_again_is_counted_as_scheduled, now a regression
# test). False kept the machine from scheduling such an id.
SCHEDULE_WAITING_PRIORITIZED_IDS = True

# (at whatever indentation the module defines it: group 1)
_NOW_MS = re.compile(r"^( *)function M\.now_ms\(\)\n.*?^\1end\n", re.MULTILINE | re.DOTALL)
_CLOCKED_NOW_MS = f"""function M.now_ms()
  local ms = tonumber(rcall('HGET', K.meta, '{CLOCK_FIELD}'))
  if not ms then error('test clock not set in ' .. K.meta, 0) end
  return ms
end
"""

settings.register_profile(
    "model",
    max_examples=200,
    stateful_step_count=60,  # 29 rules
    deadline=None,
    # One bug at a time: shrinking several distinct failures would take minutes.
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("model-nightly", parent=settings.get_profile("model"), max_examples=2000)
PROFILE = settings.get_profile(os.environ.get("ROTATOR_MODEL_PROFILE", "model"))
# pytest's timeout (120 s) for the state machine at 200 examples, more for more (nightly).
MACHINE_TIMEOUT_S = max(120, PROFILE.max_examples * 120 // 200)


@functools.cache
def clocked_source() -> str:
    """lua/rotator.lua with `M.now_ms()` reading the test clock instead of TIME."""
    source = module_source()
    found = list(_NOW_MS.finditer(source))
    assert len(found) == 1, f"expected one M.now_ms() in the module, found {len(found)}"
    assert "rcall('TIME')" in found[0][0]
    clocked = _NOW_MS.sub(
        lambda m: "".join(m[1] + line for line in _CLOCKED_NOW_MS.splitlines(keepends=True)),
        source,
    )
    assert "rcall('TIME')" not in clocked
    return clocked


@functools.cache
def clocked_library() -> tuple[str, str]:
    """The clocked variant as a function library: its name (its own, so that it never
    replaces the module's library on the server) and its source."""
    source = clocked_source()
    name = f"rotator_clocked_{hashlib.sha1(source.encode('utf-8')).hexdigest()[:16]}"
    return name, f"#!lua name={name}\nlocal FUNCTION_NAME = '{name}'\n{source}"


class ClockedFunctionCall(FunctionCall):
    """The clocked variant called as rotator calls its library by default: FCALL (through the
    fast lane), loaded again when the server does not have it. A library keeps what the
    module remembers from one call to the next (its memos, see KEPT in the module), where a
    script's call keeps nothing: the machines run both ways."""

    def __init__(self, client: redis.Redis) -> None:  # (FunctionCall's, by the clocked name)
        self.client = client
        self.name, self.source = clocked_library()
        self.lane = self.LANE.serving(client, "FCALL", self.name)

    def load(self) -> None:
        self.client.function_load(self.source, replace=True)


def clocked_rotator(
    client: redis.Redis, name: str, *, library: bool = False, **options: Any
) -> Rotator:
    """A Rotator whose every call goes to the clocked variant of the module: by EVALSHA of a
    redis-py Script, or with ``library`` by FCALL of the variant loaded as a library."""
    queue = Rotator(client, name, **options)
    queue._sender.script = (
        ClockedFunctionCall(client) if library else client.register_script(clocked_source())
    )
    return queue


def flush_module(client: redis.Redis, library: bool) -> None:
    """What a restart or an admin can do to the loaded module: the script cache flushed, or
    with ``library`` every function library deleted (the next call loads it again)."""
    if library:
        client.function_flush()
    else:
        client.script_flush()


def set_clock(client: redis.Redis, queue: Rotator, ms: int) -> None:
    client.hset(queue.keys.meta, CLOCK_FIELD, ms)


# What the module's error codes become in the Python API.
ERRORS: dict[str, type[Exception]] = {
    "ROTATOR_BADID": InvalidJobId,
    "ROTATOR_BADTOKEN": InvalidToken,
    "ROTATOR_BADARG": InvalidArgument,
    "ROTATOR_TOOMANY": InvalidArgument,
    "ROTATOR_UNTRACKED": NotTracked,
}


def same_outcome(real: Callable[[], T], expected: Callable[[], T]) -> T | None:
    """Runs the model first; the real call must give the same reply or the same error type."""
    try:
        want = expected()
    except Refused as refused:
        expect_refusal(refused.code, real)
        return None
    got = real()
    assert got == want, f"the module replied {got!r}, the model {want!r}"
    return got


def expect_refusal(code: str, real: Callable[[], object]) -> None:
    with pytest.raises(ERRORS[code]) as refused:
        real()
    assert type(refused.value) is ERRORS[code], (code, refused.value)


def api_id(value: str | int) -> bytes:
    """The README's id rule for the Python API: text (or an int), 1..1024 bytes, no `*`."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise Refused("ROTATOR_BADID")
    raw = str(value).encode("utf-8", "surrogateescape")
    if not valid_id(raw):
        raise Refused("ROTATOR_BADID")
    return raw


def as_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def expected_job(token: bytes, reclaimed: int) -> Job:
    lease = parse_lease(token)
    assert lease is not None, token
    job_id, deadline, deliveries = lease
    return Job(as_text(job_id), as_text(token), deliveries, reclaimed == 1, deadline)


def client_order(pairs: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
    """A ``next`` reply's (token, reclaimed) pairs in the order the Python client returns them
    (it calls ``next_packed``): the call's batch of first deliveries, then the later ones."""
    first = [pair for pair in pairs if parse_lease(pair[0])[2] == 1]  # type: ignore[index]
    return first + [pair for pair in pairs if pair not in first]


def checked(method: Callable[..., T]) -> Callable[..., T]:
    """Marks the machine failed when a step raises, so teardown skips the liveness check."""

    @functools.wraps(method)
    def wrapper(self: RotatorMachine, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self.failed = True
            raise

    return wrapper


API_IDS = st.one_of(
    st.sampled_from(["a", "b", "c", "a\r\nb", "x\x00y", "ünï", " ", "x" * 1024, "é" * 512]),
    st.sampled_from(["", "a*5", "*lap", "x" * 1025, "é" * 513]),  # refused
    st.integers(-3, 3),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=3),
)
RAW_IDS = st.one_of(
    st.sampled_from([b"a", b"\xff\xfe", b"a\r\nb", b"\x00", b"", b"a*5", b"*lap"]),
    st.binary(min_size=1, max_size=3),
)
PICKS = st.lists(st.integers(0, 2**16), min_size=1, max_size=3)
# A few ids scheduled again and again (so they move), some shared with the pushes.
LATER_IDS = st.lists(st.one_of(st.sampled_from([b"a", b"s", b"t"]), RAW_IDS), max_size=3)
# push_later's TIME: IN that many ms, AT now plus that many ms (a negative IN is refused);
# None: not a number. One ms beyond ten years ahead is refused.
LATER_MS = st.sampled_from([-2500, -1, 0, 1, 999, 2500, spec.SCHEDULE_MS + 1, None])
# Schedule names: lowercase letters only, because `schedules` sorts them with Lua's string
# order (strcoll: the server's collation), which is byte order for these in every locale.
SCHEDULE_NAMES = st.sampled_from([b"a", b"b", b"ab"])
BAD_SCHEDULE_NAMES = st.sampled_from([b"", b"a b", b"x" * 129, b"a*b", "é".encode()])
SCHEDULE_JOBS = st.sampled_from([b"j", b"k", b"x\x00y\r\n", b"\xff", b"j" * spec.SCHEDULE_JOB_ID])
BAD_SCHEDULE_JOBS = st.sampled_from([b"", b"j*1", b"j" * (spec.SCHEDULE_JOB_ID + 1)])
SPECS = st.sampled_from([b"", b"every 1s", b"*/5 * * * *\r\n", b"x" * spec.SPEC_BYTES])
SCHEDULE_FAULTS = ["mode", "name", "job_id", "every", "spec", "dues", "short"]
# DUEs as ms from now: passed ones are due at once, those before the last tick are dropped.
DUE_OFFSETS = st.lists(
    st.sampled_from([-2500, -1000, -1, 0, 1, 999, 1500, 3000, 5000]),
    min_size=1,
    max_size=3,
    unique=True,
)
# Processing times after the acks of next or ack; the last four are refused.
TIMES = st.sampled_from(
    [None] * 8
    + [b"#5,0:1", b"#1200,3:2,10:1", b"#0,25:1000000000,00:1"]
    + [b"#5,26:1", b"#5", b"#5,1:0", b"#x,1:1"]
)
DURATIONS_ARGS = st.one_of(
    st.builds(
        lambda total, pairs: [total, *(n for pair in pairs for n in pair)],
        st.sampled_from([0, 7, 10**15 - 1]),
        st.lists(
            st.tuples(st.integers(0, 25), st.sampled_from([1, 3, spec.RATE_JOBS])),
            min_size=1,
            max_size=3,
        ),
    ),
    st.just([]),
    st.sampled_from(  # refused
        [[5], [5, 1], [5, 26, 1], [5, 1, 0], [b"1e3", 1, 1], [10**15, 1, 1], [5, 1, 10**9 + 1]]
    ),
)
FOREIGN = b"ghost*1700000000999.1.7"  # well formed, never issued by any queue here
CORRUPT = [b"x*nan", b"*1", b"y*inf"]
# Meta fields compared as numbers (absent: 0): the counts since the queue was made, and how
# many schedules there are and how many have a next tick.
META_COUNTS = (
    b"pushed",
    b"taken",
    b"completed",
    b"redelivered",
    b"reclaimed",
    b"retried",
    b"lettered",
    b"schedules",
    b"ticking",
    b"prio",
    b"pseq",
)
HISTOGRAM = re.compile(rb"d\d+|dsum")  # its meta fields, compared as they exist
# push_priority's LEVEL straight to the module: 1..9, "03" (plain digits: 3); refused: 0, 10,
# not a whole number.
RAW_LEVELS = st.sampled_from([1, 3, 3, 9, b"03", 0, 10, b"x", b"-1", b"1.5", b""])
# The API's priority (1..9 here: 0 is a plain push); refused: 10, -1, a bool, a float, text.
API_LEVELS = st.sampled_from([1, 3, 3, 9, 10, -1, True, 2.5, "3"])
# TIME as ms from now: mostly now (IN 0, AT a time passed); None: not a number.
PRIORITY_MS = st.sampled_from([0, 0, 0, -1500, 1, 999, 2500, None])
PRIORITY_IDS = st.lists(st.one_of(st.sampled_from([b"a", b"p", b"q", b"r"]), RAW_IDS), max_size=3)


def arg_bytes(args: list[bytes | int]) -> list[bytes]:
    return [a if isinstance(a, bytes) else b"%d" % a for a in args]


@dataclass
class Series:
    """One schedule's ticks as the test asked for them, apart from the model: since it was
    made or changed (a declaration with another JOB_ID, EVERY_MS or SPEC), on the grid
    `anchor + k * every`, or at the DUEs given since (a declaration as it is adds its DUEs)."""

    job_id: bytes
    every: int
    anchor: int  # an interval's first tick
    dues: set[int]
    last: int | None = None  # its last tick
    # The schedule's tick before this series, which its ticks follow: the module drops DUEs
    # up to the last tick, and an interval starts a period after now (so only when the clock
    # has not been set back before that tick).
    floor: int | None = None


class RotatorMachine(RuleBasedStateMachine):
    client: redis.Redis  # set by on_server()
    library: bool  # (FCALL, or EVALSHA)

    def __init__(self) -> None:
        super().__init__()
        self.admin = client = self.client
        self.failed = False
        self.m = RotatorModel(now=START_MS)
        name = f"m-{uuid.uuid4().hex[:12]}"
        self.q = clocked_rotator(
            client,
            name,
            library=self.library,
            timeout=LEASE_MS / 1000,
            max_deliveries=MAX_DELIVERIES,
            budget=BUDGET,
        )
        self.keys = self.q.keys.all
        set_clock(client, self.q, START_MS)
        self.tokens: list[bytes] = []  # deliveries the test's workers still remember
        # What the test scheduled (id -> due ms), apart from the model: an id leaves when the
        # server's schedule no longer holds it, which it may only do once due.
        self.due_of: dict[bytes, int] = {}
        self.left_schedule: Counter[bytes] = Counter()
        self.ever_scheduled: set[bytes] = set()
        # What self.q knows of the batches it leased: the model is sent the acks it sends.
        self.batches = Batches()
        self.series: dict[bytes, Series] = {}  # per schedule
        self.ticks_seen = 0  # of self.m.ticks

    def raw(self, *args: object) -> Any:
        return run(self.q._sender.script, self.keys, list(args))

    def pick(self, picks: list[int]) -> list[bytes]:
        return [self.tokens[i % len(self.tokens)] for i in picks]

    def has_tokens(self) -> bool:
        return bool(self.tokens)

    def remember(self, tokens: list[bytes]) -> None:
        self.tokens.extend(tokens)

    def client_ack(self, tokens: list[bytes]) -> int:
        """What Rotator.ack sends the module, played on the model: whole batches it leased
        as batch acks, and the tokens one by one when one of those is refused."""
        spec.check_tokens(tokens, required=True)
        args = self.batches.pack(tokens)
        accepted = self.m.ack(args)
        if args is tokens:
            return accepted
        if accepted < len(args):
            return self.m.ack(tokens)
        return len(set(tokens))

    # -- producing -------------------------------------------------------------------------

    @initialize(
        backlog=st.lists(st.sampled_from([b"a", b"b", b"c", b"d"]), max_size=4),
        later=st.sampled_from([None, 1, 999]),
        every=st.sampled_from([None, 1, 700, 2500]),
        rate=st.sampled_from([None, None, 2]),
        level=st.sampled_from([None, None, 2, 7]),
    )
    @checked
    def start(
        self,
        backlog: list[bytes],
        later: int | None,
        every: int | None,
        rate: int | None,
        level: int | None,
    ) -> None:
        """Some queues start with a backlog and a job due soon, so that the short way of next
        (pending ids at the ring's tail, nothing to repair) also meets a schedule: its reply
        must count down to smin as the walk's does. Some start with a recurring schedule, or
        a rate limit (a few jobs a second), or jobs waiting at a priority level."""
        if level is not None:
            self.push_priority_raw(level, b"IN", 0, [b"p", b"q"])
        if backlog:
            self.push_raw(backlog)
        if later is not None:
            self.push_later_raw(b"IN", later, [b"s"])
        if every is not None:
            self.schedule_call([b"SET", b"a", b"j", every, b"every"])
        if rate is not None:
            self.rate_limit(rate, 1000, api=False)

    @rule(ids=st.lists(API_IDS, max_size=3))
    @checked
    def push(self, ids: list[str | int]) -> None:
        def model() -> int:
            return self.m.push([api_id(i) for i in ids])

        same_outcome(lambda: self.q.push(*ids), model)

    @rule(ids=st.lists(RAW_IDS, max_size=3))
    @checked
    def push_raw(self, ids: list[bytes]) -> None:
        """Straight to the module: it re-checks what the client would have refused."""
        same_outcome(lambda: self.raw(b"push", *ids), lambda: self.m.push(ids))

    @rule(mode=st.sampled_from([b"IN", b"AT", b"AT", b"in"]), ms=LATER_MS, ids=LATER_IDS)
    @checked
    def push_later_raw(self, mode: bytes, ms: int | None, ids: list[bytes]) -> None:
        time: object = b"1e3"
        if ms is not None:
            time = self.m.now + ms if mode == b"AT" else ms
        scheduled = same_outcome(
            lambda: self.raw(b"push_later", mode, time, *ids),
            lambda: self.m.push_later(mode, time, ids),
        )
        if scheduled and isinstance(time, int):
            self.note_scheduled(ids, self.m.now + time if mode == b"IN" else time)

    @precondition(lambda self: bool(self.due_of))
    @rule(pick=st.integers(0, 2**16), ms=st.sampled_from([-1500, 0, 1, 2500, 5000]))
    @checked
    def push_later_again(self, pick: int, ms: int) -> None:
        """An id still scheduled, scheduled again: it moves, earlier (AT a time passed, or IN
        0 or 1 ms) or later (then smin, a lower bound, may stay before every due time)."""
        ids = sorted(self.due_of)
        self.push_later_raw(b"AT" if ms < 0 else b"IN", ms, [ids[pick % len(ids)]])

    @rule(
        ids=st.lists(API_IDS, max_size=3),
        delay=st.sampled_from([None, 0.0, 0.25, 1.5, 3.0]),
        at=st.integers(-3, 3),
    )
    @checked
    def push_later_api(self, ids: list[str | int], delay: float | None, at: int) -> None:
        """push(..., delay=) or push(..., at=): `at` whole seconds from now's second (0: a
        time passed or now), so both sides see the same ms."""
        if delay is not None:
            mode, ms, due = b"IN", int(delay * 1000), self.m.now + int(delay * 1000)
            real = functools.partial(self.q.push, *ids, delay=delay)
        else:
            at_s = self.m.now // 1000 + at
            mode, ms, due = b"AT", at_s * 1000, at_s * 1000
            real = functools.partial(self.q.push, *ids, at=at_s)

        def model() -> int:
            return self.m.push_later(mode, ms, [api_id(i) for i in ids])

        if same_outcome(real, model):
            self.note_scheduled([api_id(i) for i in ids], due)

    @rule(
        command=st.sampled_from(["push", "push_later", "push_priority"]),
        ids=st.lists(st.sampled_from([b"a", b"b", b"o"]), min_size=1, max_size=3),
        lost=st.booleans(),
    )
    @checked
    def push_once(self, command: str, ids: list[bytes], lost: bool) -> None:
        """A push as ``retry_for`` sends it: ``once`` under a marker of its own, and, when its
        reply was lost, the same call again. The first runs as the bare command does (the
        model's); the second runs nothing (every key is compared after the step) and replies
        what the first pushed."""
        marker = self.q.keys.push_marker(uuid.uuid4().hex)
        keys = (*self.keys, marker)
        args: list[object]
        model: Callable[[], int]
        if command == "push":
            args, model = [b"push"], functools.partial(self.m.push, ids)
        elif command == "push_later":
            args = [b"push_later", b"IN", 1000]
            model = functools.partial(self.m.push_later, b"IN", 1000, ids)
        else:
            args = [b"push_priority", 3, b"IN", 0]
            model = functools.partial(self.m.push_priority, 3, b"IN", 0, ids)

        def real() -> Any:
            return run(self.q._sender.script, keys, [b"once", 0, 60_000, *args, *ids])

        first = same_outcome(real, model)
        if command == "push_later" and first:
            self.note_scheduled(ids, self.m.now + 1000)
        if lost and first is not None:
            assert real() == first
        self.admin.delete(marker)

    def note_scheduled(self, ids: list[bytes], due: int) -> None:
        self.due_of.update(dict.fromkeys(ids, due))
        self.ever_scheduled.update(ids)

    @rule(
        level=RAW_LEVELS,
        mode=st.sampled_from([b"IN", b"AT", b"IN", b"in"]),
        ms=PRIORITY_MS,
        ids=PRIORITY_IDS,
    )
    @checked
    def push_priority_raw(
        self, level: int | bytes, mode: bytes, ms: int | None, ids: list[bytes]
    ) -> None:
        """push_priority LEVEL IN|AT TIME ID... straight to the module (a negative IN, a bad
        LEVEL or mode, or an id the client would refuse: refused, nothing written)."""
        time: object = b"1e3"
        if ms is not None:
            time = self.m.now + ms if mode == b"AT" else ms
        due = (time if mode == b"AT" else self.m.now + time) if isinstance(time, int) else None
        ids = self.not_waiting_at(level, due, ids)
        same_outcome(
            lambda: self.raw(b"push_priority", level, mode, time, *ids),
            lambda: self.m.push_priority(level, mode, time, ids),
        )

    @precondition(lambda self: bool(self.m.ranked()))
    @rule(pick=st.integers(0, 2**16), later=st.booleans())
    @checked
    def push_priority_again(self, pick: int, later: bool) -> None:
        """A job waiting at a level (or scheduled at one) pushed there again: now, it moves to
        the back of its level, not counted (one scheduled then waits, counted); later, one
        scheduled moves, one waiting leaves its level (SCHEDULE_WAITING_PRIORITIZED_IDS)."""
        members = self.m.ranked()
        member = members[pick % len(members)]
        self.push_priority_raw(int(member[1:2]), b"IN", 2500 if later else 0, [member[3:]])

    @rule(
        ids=st.lists(API_IDS, max_size=3),
        level=API_LEVELS,
        delay=st.sampled_from([None, None, 0.0, 0.25, 1.5]),
    )
    @checked
    def push_priority_api(self, ids: list[str | int], level: object, delay: float | None) -> None:
        """push(..., priority=) now or with a delay: push_priority LEVEL IN <ms>."""
        ms = 0 if delay is None else int(delay * 1000)
        valid = []
        for i in ids:
            try:
                valid.append(api_id(i))
            except Refused:
                valid.append(b"")
        keep = set(self.not_waiting_at(level, self.m.now + ms, valid))
        ids = [i for i, raw in zip(ids, valid, strict=True) if raw in keep or not raw]

        def model() -> int:
            if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 9:
                raise Refused("ROTATOR_BADARG")
            return self.m.push_priority(level, b"IN", ms, [api_id(i) for i in ids])

        same_outcome(lambda: self.q.push(*ids, priority=level, delay=delay), model)  # type: ignore[arg-type]

    def not_waiting_at(self, level: object, due: int | None, ids: list[bytes]) -> list[bytes]:
        """The ids, but for those waiting at `level` when they are to be scheduled at it for
        later while the module mishandles that (SCHEDULE_WAITING_PRIORITIZED_IDS)."""
        if SCHEDULE_WAITING_PRIORITIZED_IDS or due is None or due <= self.m.now:
            return ids
        try:
            member = b"*%d*" % spec.int_arg(level, 1, spec.PRIORITY_LEVELS)
        except Refused:
            return ids
        return [i for i in ids if self.m.scheduled.get(member + i, 0) >= 0]

    @rule(
        command=st.sampled_from(["push", "later", "priority", "cancel"]),
        ids=st.lists(st.sampled_from(["a", "b", "s"]), min_size=1, max_size=2),
    )
    @checked
    def untracked(self, command: str, ids: list[str]) -> None:
        """This queue does not track ids: a unique push (now or later) and a cancel are
        refused and write nothing (every key is compared after the step, as always)."""
        real: Callable[[], int] = {
            "push": lambda: self.q.push(*ids, unique=True),
            "later": lambda: self.q.push(*ids, delay=1.0, unique=True),
            "priority": lambda: self.q.push(*ids, priority=4, unique=True),
            "cancel": lambda: self.q.cancel(*ids),
        }[command]
        same_outcome(real, self.m.untracked)

    @rule(resume=st.booleans())
    @checked
    def pause(self, resume: bool) -> None:
        """Pauses (also a paused queue) or resumes (also one that is not paused)."""
        if resume:
            same_outcome(self.q.resume, lambda: self.m.resume() == 1)
        else:
            same_outcome(self.q.pause, lambda: self.m.pause() == 1)

    # -- recurring schedules, the rate limit, the histogram ----------------------------------

    @rule(
        mode=st.sampled_from([b"SET", b"SET", b"SET", b"FILL"]),
        name=SCHEDULE_NAMES,
        job_id=SCHEDULE_JOBS,
        every=st.sampled_from([0, 1, 700, 1000, 2500]),
        spec_=SPECS,
        offsets=DUE_OFFSETS,
        fault=st.sampled_from([None] * 10 + SCHEDULE_FAULTS),
        bad=st.data(),
    )
    @checked
    def schedule(
        self,
        *,
        mode: bytes,
        name: bytes,
        job_id: bytes,
        every: int,
        spec_: bytes,
        offsets: list[int],
        fault: str | None,
        bad: st.DataObject,
    ) -> None:
        """Declares an interval schedule (a tick every few ms, the first a period from now) or
        a due-time one (EVERY_MS 0: DUEs around now, passed ones due at once), or (`fault`)
        one the module refuses for one reason."""
        dues: list[bytes | int] = [self.m.now + ms for ms in sorted(offsets)]
        args: list[bytes | int] = [mode, name, job_id, every, spec_, *([] if every else dues)]
        if fault == "mode":
            args[0] = b"set"
        elif fault == "name":
            args[1] = bad.draw(BAD_SCHEDULE_NAMES)
        elif fault == "job_id":
            args[2] = bad.draw(BAD_SCHEDULE_JOBS)
        elif fault == "every":
            args[3] = bad.draw(st.sampled_from([b"1e3", b"-1", b"%d" % (spec.SCHEDULE_MS + 1)]))
        elif fault == "spec":
            args[4] = b"x" * (spec.SPEC_BYTES + 1)
        elif fault == "dues":
            # An interval with DUEs, due times without one, or DUEs not ascending.
            args = [*args[:5], *dues] if every else [*args[:5], *(dues[::-1] * 2)[:2]]
        elif fault == "short":
            # No SPEC (nor DUE), for an interval or for due times.
            args = [mode, name, job_id, every]
        self.schedule_call(args)

    @precondition(lambda self: bool(self.m.schedule_defs))
    @rule(
        pick=st.integers(0, 2**16),
        mode=st.sampled_from([b"SET", b"FILL"]),
        offsets=DUE_OFFSETS,
    )
    @checked
    def schedule_again(self, pick: int, mode: bytes, offsets: list[int]) -> None:
        """A schedule declared again as it is (as an application does at every start), or
        filled: it keeps its next and last tick; due times take the DUEs given."""
        names = sorted(self.m.schedule_defs)
        name = names[pick % len(names)]
        d = self.m.schedule_defs[name]
        dues = [] if d.every else [self.m.now + ms for ms in sorted(offsets)]
        self.schedule_call([mode, name, d.job_id, d.every, d.spec, *dues])

    def schedule_call(self, args: list[bytes | int]) -> None:
        raw = arg_bytes(args)
        name = raw[1] if len(raw) > 1 else b""
        before = self.m.schedule_defs.get(name)
        was = None if before is None else (before.job_id, before.every, before.spec)
        changed = same_outcome(lambda: self.raw(b"schedule", *raw), lambda: self.m.schedule(raw))
        if changed is None:
            return  # refused
        mode, job_id, every, spec_ = raw[0], raw[2], int(raw[3]), raw[4]
        dues = {int(due) for due in raw[5:]}
        if was == (job_id, every, spec_):
            assert changed == 0, "declared as it was, yet changed"
            self.series[name].dues |= dues
            return
        if mode == b"FILL":
            assert changed == 0, "FILL of another schedule changed it"
            return
        assert changed == 1
        old = self.series.get(name)
        floor = None if old is None else (old.last if old.last is not None else old.floor)
        if floor is not None and every and self.m.now < floor:
            floor = None  # the clock was set back: a new interval may start before it
        self.series[name] = Series(job_id, every, self.m.now + every, dues, None, floor)

    @precondition(lambda self: bool(self.m.schedule_defs))
    @rule(pick=st.one_of(st.integers(0, 2**16), st.sampled_from([b"zz", b"", None])))
    @checked
    def unschedule(self, pick: int | bytes | None) -> None:
        """Forgets a schedule (or one there is not, or none named at all)."""
        names = sorted(self.m.schedule_defs)
        name = names[pick % len(names)] if isinstance(pick, int) else pick
        args = [] if name is None else [name]
        if same_outcome(lambda: self.raw(b"unschedule", *args), lambda: self.m.unschedule(args)):
            assert name is not None
            del self.series[name]

    @rule()
    @checked
    def schedules(self) -> None:
        same_outcome(lambda: self.raw(b"schedules"), self.m.schedules)

    @rule(
        jobs=st.sampled_from([0, 1, 1, 2, 3, 5, -1, b"1e3"]),
        per=st.sampled_from([1, 500, 1000, 1000, 3000, 0, spec.RATE_MS + 1]),
        api=st.booleans(),
    )
    @checked
    def rate_limit(self, jobs: int | bytes, per: int, api: bool) -> None:
        """Sets (a few jobs per up to three seconds), changes or lifts the rate limit, raw or
        through set_rate_limit (per in seconds; jobs None lifts it)."""
        args = arg_bytes([jobs, per])
        if api and isinstance(jobs, int) and jobs >= 0 and per in (500, 1000, 3000):
            limit = jobs or None
            same_outcome(
                lambda: self.q.set_rate_limit(limit, per=per / 1000),
                lambda: self.m.rate_limit([b"0", b"1"] if limit is None else args) and None,
            )
        else:
            same_outcome(lambda: self.raw(b"rate_limit", *args), lambda: self.m.rate_limit(args))

    @rule(args=DURATIONS_ARGS)
    @checked
    def durations(self, args: list[bytes | int]) -> None:
        raw = arg_bytes(args)
        got = same_outcome(lambda: self.raw(b"durations", *raw), lambda: self.m.durations(raw))
        if got is not None and not args:
            *counts, total_ms = got
            assert self.q.durations() == Durations(tuple(counts), total_ms / 1000)

    # -- consuming -------------------------------------------------------------------------

    @rule(
        count=st.integers(1, 3),
        lease=st.sampled_from([1, 1000, 2500]),
        budget=st.integers(1, 6),
        max_deliveries=st.sampled_from([0, 2, 3]),
        ack_picks=st.lists(st.integers(0, 2**16), max_size=2),
        bad=st.sampled_from([None] * 9 + ["count", "budget", "token"]),
        packed=st.booleans(),
        times=TIMES,
    )
    @checked
    def next_raw(
        self,
        *,
        count: int,
        lease: int,
        budget: int,
        max_deliveries: int,
        ack_picks: list[int],
        bad: str | None,
        packed: bool,
        times: bytes | None = None,
    ) -> None:
        """A claim straight to the module (`times`: processing times after its acks)."""
        acks = self.pick(ack_picks) if self.tokens else []
        args: list[object] = [count, lease, budget, max_deliveries]
        if bad == "count":
            args[0] = 0
        elif bad == "budget":
            args[2] = 1_001
        elif bad == "token":
            acks = [*acks, b"x*1e3.1.1"]
        if times is not None:
            acks = [*acks, times]
        command, model_next = b"next", self.m.next
        if packed:
            command, model_next = b"next_packed", self.m.next_packed
        try:
            want = model_next(args[0], args[1], args[2], args[3], acks)
        except Refused as refused:
            expect_refusal(refused.code, lambda: self.raw(command, *args, *acks))
            return
        due = self.due_now()
        got = self.raw(command, *args, *acks)
        if self.m.paused:  # (to wait for resume, or its own lease time at most)
            assert got[:2] == [1, lease], f"paused, yet not told to wait: {got}"
            assert got[3:] == ([b""] if packed else []), f"paused, yet leased: {got}"
        else:
            self.check_due_jobs_left_the_schedule(due)
        if packed:
            assert got[:4] == want[:4]  # the batch, as one packed element
            batch_tokens = unpacked([got[3]]) if got[3] else []
            got, want = got[:3] + got[4:], want[:3] + want[4:]
            for token in batch_tokens:
                self.m.adopt(token, token)
            self.remember(batch_tokens)
        assert got[:3] == want[:3]
        assert got[4::2] == want[4::2]  # the reclaimed flags
        for expected, token in zip(want[3::2], got[3::2], strict=True):
            self.m.adopt(expected, token)
        self.check_idle_reply(got, lease)
        self.remember(got[3::2])

    @precondition(lambda self: self.m.paused and self.has_tokens())
    @rule(newest=st.integers(1, 3), packed=st.booleans())
    @checked
    def next_while_paused(self, newest: int, packed: bool) -> None:
        """Workers finish what they hold while the queue is paused: next takes their acks (of
        the newest deliveries, most likely live) and leases nothing."""
        n = len(self.tokens)
        self.next_raw(
            count=3,
            lease=1000,
            budget=6,
            max_deliveries=0,
            ack_picks=[n - k for k in range(1, min(newest, n) + 1)],
            bad=None,
            packed=packed,
        )

    @rule(
        count=st.integers(1, 3),
        ack_picks=st.lists(st.integers(0, 2**16), max_size=2),
        durations=st.sampled_from([(), (), (), (0.0004,), (0.003, 1.5, 0.003)]),
    )
    @checked
    def next_api(self, count: int, ack_picks: list[int], durations: tuple[float, ...]) -> None:
        acks = self.pick(ack_picks) if self.tokens else []
        self.next_api_call(count, acks, durations)

    def next_api_call(
        self, count: int, acks: list[bytes], durations: tuple[float, ...] = ()
    ) -> list[Job]:
        """Rotator.next against what it does without `block`: the module is called again
        until it hands out jobs or says a whole lap was idle; processing times ride on the
        first call, after the acks."""
        due = self.due_now()
        jobs = self.q.next(count, ack=[as_text(t) for t in acks], durations=durations)
        packed = self.batches.pack(acks)
        times = encode_durations(durations)
        for _ in range(10_000):
            sent = packed if times is None else [*packed, times]
            times = None
            reply = self.m.next(count, LEASE_MS, BUDGET, MAX_DELIVERIES, sent)
            if packed is not acks and reply[2] < len(packed):
                self.m.ack(acks)  # a batch ack was refused: the client acks one by one
            self.check_idle_reply(reply, LEASE_MS)
            acks = packed = []
            pairs = client_order(list(zip(reply[3::2], reply[4::2], strict=True)))
            if pairs or reply[0] == 1:
                break
        else:
            raise AssertionError("the client's next loop never ended")
        if self.m.paused:
            assert jobs == [], f"paused, yet leased {jobs}"
        else:
            self.check_due_jobs_left_the_schedule(due)
        assert len(jobs) == len(pairs), (jobs, pairs)
        for job, (placeholder, reclaimed) in zip(jobs, pairs, strict=True):
            token = job.token.encode("utf-8", "surrogateescape")
            self.m.adopt(placeholder, token)
            assert job == expected_job(token, reclaimed)
        self.batches.note_jobs(jobs)
        self.remember([job.token.encode("utf-8", "surrogateescape") for job in jobs])
        return jobs

    def due_now(self) -> int:
        """How many jobs the test scheduled are due (the invariant keeps `due_of` equal to
        the server's schedule between steps)."""
        return sum(due <= self.m.now for due in self.due_of.values())

    def check_due_jobs_left_the_schedule(self, due: int) -> None:
        """A claim on a running queue moves the jobs due (`due` of them before it) to the
        ring, at most PROMOTE a call: none is left unless there were more."""
        # (the jobs waiting at a priority level are scored below 0: not scheduled)
        left = self.admin.zrangebyscore(self.q.keys.scheduled, 0, self.m.now)
        assert len(left) <= max(due - spec.PROMOTE, 0), f"{left} stay scheduled at {self.m.now}"

    def check_idle_reply(self, reply: list[Any], lease_ms: int) -> None:
        """A consumer told to block (idle = 1) for wait_ms must not sleep through work, nor
        longer than its own lease time (`lease_ms`): a lease as long, taken by another
        consumer meanwhile, falls due no sooner than it looks again."""
        if reply[0] != 1 or not CHECK_IDLE_REPLIES:
            return
        assert 1 <= reply[1] <= lease_ms, f"told to wait {reply[1]} ms, its lease {lease_ms}"
        if self.m.paused:
            assert reply[1] == lease_ms, f"paused, yet told to wait {reply[1]} ms"
            return
        if self.m.held_wait is not None:
            # At the rate limit: told when one more job may go, not later, not sooner (but 1
            # ms sooner where the module's float rounding makes it so: a known bug, pinned by
            # test_a_claim_held_by_the_rate_limit_is_told_when_one_more_may_go).
            now, wait = self.m.now, reply[1]
            assert wait >= 1, wait
            assert self.m.rate_allowance(now)[0] == 0
            short = RATE_WAIT_MAY_FALL_SHORT and self.m.rate_allowance(now + wait + 1)[0] >= 1
            capped = wait == lease_ms  # (it looks again within its lease time, held or not)
            assert self.m.rate_allowance(now + wait)[0] >= 1 or short or capped, (
                f"{wait} ms: still held"
            )
            assert wait == 1 or self.m.rate_allowance(now + wait - 1)[0] == 0
            return
        assert not self.m.takeable_now(), "idle reply while a job could be leased now"
        dues = self.m.reachable_dues()
        assert not dues or self.m.now + reply[1] <= min(dues), (
            f"wait_ms {reply[1]} sleeps past a lease due at {min(dues)} (now {self.m.now})"
        )

    @precondition(has_tokens)
    @rule(picks=PICKS, foreign=st.booleans(), times=TIMES)
    @checked
    def ack(self, picks: list[int], foreign: bool, times: bytes | None) -> None:
        """Valid, late (re-issued, nacked, dead-lettered) and duplicate acks alike; with
        processing times after them, straight to the module."""
        tokens = self.pick(picks) + ([FOREIGN] if foreign else [])
        if times is not None:
            args = [*tokens, times]
            same_outcome(lambda: self.raw(b"ack", *args), lambda: self.m.ack(args))
            return
        same_outcome(lambda: self.q.ack(*map(as_text, tokens)), lambda: self.client_ack(tokens))

    @precondition(has_tokens)
    @rule(picks=PICKS, delay=st.sampled_from([0.0, 0.5, 2.5]), foreign=st.booleans())
    @checked
    def nack(self, picks: list[int], delay: float, foreign: bool) -> None:
        tokens = self.pick(picks) + ([FOREIGN] if foreign else [])
        same_outcome(
            lambda: self.q.nack(*map(as_text, tokens), delay=delay),
            lambda: sum(self.m.nack(int(delay * 1000), tokens)),
        )

    @precondition(has_tokens)
    @rule(picks=PICKS, error=st.sampled_from(["", "boom", "a*b"]), foreign=st.booleans())
    @checked
    def bury(self, picks: list[int], error: str, foreign: bool) -> None:
        tokens = self.pick(picks) + ([FOREIGN] if foreign else [])
        same_outcome(
            lambda: self.q.bury(*map(as_text, tokens), error=error),
            lambda: sum(self.m.bury(error.encode(), tokens)),
        )

    @precondition(has_tokens)
    @rule(pick=st.integers(0, 2**16), seconds=st.sampled_from([None, 0.5, 3.0]))
    @checked
    def extend(self, pick: int, seconds: float | None) -> None:
        (token,) = self.pick([pick])
        lease_ms = LEASE_MS if seconds is None else int(seconds * 1000)
        kept, deadline = self.m.extend(lease_ms, [token])[1], self.m.now + lease_ms
        if kept:
            assert self.q.extend(as_text(token), seconds) == deadline / 1000
        else:
            with pytest.raises(LeaseLost):
                self.q.extend(as_text(token), seconds)

    @precondition(has_tokens)
    @rule(pick=st.integers(0, 2**16))
    @checked
    def worker_crash(self, pick: int) -> None:
        """A worker dies holding a lease: nobody will ack, nack or extend it."""
        self.tokens.pop(pick % len(self.tokens))

    # -- time, the script cache, corruption ------------------------------------------------

    @rule(dt=st.integers(-2000, 3000))
    @checked
    def tick(self, dt: int) -> None:
        self.m.now += dt
        set_clock(self.admin, self.q, self.m.now)

    @precondition(lambda self: self.m.smin is not None)
    @rule(pick=st.integers(0, 2**16), early=st.booleans())
    @checked
    def tick_to_due(self, pick: int, early: bool) -> None:
        """The clock to smin or to a scheduled job's due time or a schedule's next tick, or 1
        ms before: the edge of "never before its due time" (and of a stale smin, when the
        earliest job moved or its schedule went)."""
        assert self.m.smin is not None
        instants = sorted({self.m.smin, *(at for at in self.m.scheduled.values() if at >= 0)})
        self.tick(instants[pick % len(instants)] - early - self.m.now)

    @rule()
    @checked
    def script_flush(self) -> None:
        flush_module(self.admin, self.library)

    @precondition(lambda self: bool(self.m.ring))
    @rule(raw=st.sampled_from(CORRUPT))
    @checked
    def corrupt(self, raw: bytes) -> None:
        """Outside the contract: an admin LPUSHes an element no client could have made."""
        self.admin.lpush(self.keys[0], raw)
        self.m.raw_lpush(raw)

    @rule(
        call=st.sampled_from(["push", "next", "stats", "peek", "pause"]),
        written=st.sampled_from([b"2", b"0", b""]),
    )
    @checked
    def newer_format(self, call: str, written: bytes) -> None:
        """Outside the contract: a newer module converted the queue (its storage format in
        meta). The call is refused, UnknownFormat, and no key changes; the conversion undone,
        the queue goes on as the model says."""
        meta = self.q.keys.meta
        self.admin.hset(meta, "format", written)
        before = snapshot(self.admin, self.q)
        calls: dict[str, Callable[[], object]] = {
            "push": lambda: self.q.push("f"),
            "next": lambda: self.q.next(1),
            "stats": self.q.stats,
            "peek": self.q.peek,
            "pause": self.q.pause,
        }
        with pytest.raises(UnknownFormat):
            calls[call]()
        assert snapshot(self.admin, self.q) == before
        self.admin.hdel(meta, "format")

    # -- inspecting and maintenance --------------------------------------------------------

    @rule()
    @checked
    def stats(self) -> None:
        """Every field, in order, of the module's reply, and the API's Stats."""
        model = self.m.stats()
        assert self.raw(b"stats") == model
        f = {name.decode(): value for name, value in zip(model[::2], model[1::2], strict=True)}
        age, jobs = f["oldest_pending_age_ms"], f["rate_limit_jobs"]
        expected = Stats(
            **{name: f[name] for name in ("length", "pending", "in_flight", "done")},
            **{name: f[name] for name in ("deferred", "dead", "overdue", "scheduled")},
            oldest_pending_age=None if age < 0 else age / 1000,
            overdue_capped=bool(f["overdue_capped"]),
            paused=bool(f["paused"]),
            schedules=f["schedules"],
            rate_limit=RateLimit(jobs, f["rate_limit_ms"] / 1000) if jobs else None,
            **{name: f[name] for name in ("pushed", "delivered", "completed", "retried")},
            reclaimed=f["reclaimed"],
            dead_lettered=f["dead_lettered"],
            cancelled=f["cancelled"],
            prioritized=f["prioritized"],
            durations=Durations(
                tuple(f[f"d{b}"] for b in range(spec.DURATION_BUCKETS)), f["dsum"] / 1000
            ),
        )
        assert self.q.stats() == expected

    @rule(count=st.integers(1, 6))
    @checked
    def peek(self, count: int) -> None:
        same_outcome(lambda: self.raw(b"peek", count), lambda: self.m.peek(count))

    @rule()
    @checked
    def sweep(self) -> None:
        assert self.q.sweep() == self.api_sweep()

    def api_sweep(self) -> int:
        """What Rotator.sweep does (rotator/flows.py), played on the model."""
        length, visited, removed = len(self.m.ring) + len(self.m.leases), 0, 0
        while visited < length:
            seen, gone, left = self.m.sweep(BUDGET)
            if seen == 0:
                break
            visited += seen
            removed += gone
            if seen >= gone + left + 1:
                break
        return removed

    @rule(count=st.integers(1, 3), ids=st.lists(st.sampled_from(["a", "b", "x"]), max_size=2))
    @checked
    def requeue_dead(self, count: int, ids: list[str]) -> None:
        same_outcome(
            lambda: self.q.requeue_dead(*ids, count=count),
            lambda: self.m.requeue_dead(count, [i.encode() for i in ids]),
        )

    # -- invariants ------------------------------------------------------------------------

    def server_state(self) -> dict[str, Any]:
        ring, done, done_old, marks, marks_old, revoked, dead, wake = self.keys[:8]
        pipe = self.admin.pipeline(transaction=False)
        pipe.lrange(self.q.keys.leases, 0, -1)
        pipe.lrange(ring, 0, -1)
        pipe.smembers(done)
        pipe.smembers(done_old)
        pipe.hgetall(marks)
        pipe.hgetall(marks_old)
        pipe.zrange(revoked, 0, -1, withscores=True)
        pipe.lrange(dead, 0, -1)
        pipe.llen(wake)
        pipe.zrange(self.q.keys.scheduled, 0, -1, withscores=True)
        pipe.hgetall(self.keys[8])
        leases, *got = pipe.execute()
        meta: dict[bytes, bytes] = got[9]
        smin, paused = meta.get(b"smin"), meta.get(b"paused")
        rate = [meta.get(name) for name in (b"rate_n", b"rate_ms", b"rate_tat")]
        return {
            "ring": got[0],
            "leases": leases,
            "done": got[1],
            "done_old": got[2],
            "marks": got[3],
            "marks_old": got[4],
            "revoked": {member: int(score) for member, score in got[5]},
            "dead": got[6],
            "wake": got[7],
            "scheduled": {member: int(score) for member, score in got[8]},
            "smin": None if smin is None else int(smin),
            "paused": paused == b"1",
            # (a count is absent until it is first written)
            "counts": {name: int(meta.get(name, 0)) for name in META_COUNTS},
            "schedules": {k: v for k, v in meta.items() if k.startswith(b"schedule:")},
            "rate": [None if value is None else float(value) for value in rate],
            "histogram": {k: int(v) for k, v in meta.items() if HISTOGRAM.fullmatch(k)},
            "lease_max": None if b"lease_max" not in meta else int(meta[b"lease_max"]),
        }

    def model_state(self) -> dict[str, Any]:
        m = self.m
        return {
            "ring": m.ring,
            "leases": m.leases,
            "done": m.done,
            "done_old": m.done_old,
            "marks": m.marks,
            "marks_old": m.marks_old,
            "revoked": m.revoked,
            "dead": m.dead,
            "wake": m.wake,
            "scheduled": m.scheduled,
            "smin": m.smin,
            "paused": m.paused,
            "counts": {
                **{b"pushed": m.pushed, b"taken": m.taken, b"completed": m.completions},
                **{b"redelivered": m.redelivered, b"reclaimed": m.reclaimed},
                **{b"retried": m.retried, b"lettered": m.lettered},
                **{b"schedules": len(m.schedule_defs), b"ticking": m.ticking()},
                **{b"prio": m.prio, b"pseq": m.pseq},
            },
            "schedules": {b"schedule:" + name: d.field() for name, d in m.schedule_defs.items()},
            "rate": [m.rate_n, m.rate_ms, m.rate_tat],
            "histogram": m.histogram,
            "lease_max": m.lease_max,
        }

    @invariant()
    @checked
    def the_keys_hold_what_the_model_holds(self) -> None:
        real = self.server_state()
        expected = self.model_state()
        for key, value in expected.items():
            assert real[key] == value, key
        ring = real["ring"]
        elements = unpacked(ring + real["leases"])

        # Exactly one sentinel once the ring exists, and none among the leases.
        assert not ring or ring.count(SENTINEL) == 1, ring
        assert SENTINEL not in real["leases"]

        # Acks wait only for elements in the lists; any other ack is a leftover that is dropped
        # within two agings of the acks (see tests/model.py), so nothing grows from normal use.
        for token in (real["done"] | real["done_old"]) - set(elements):
            ages = self.m.ages - self.m.acked_at[token]
            assert ages <= 2, f"the leftover ack {token!r} survived {ages} agings"

        # No id lost: each valid id pushed is in a list (pending, deferred or leased, acked,
        # buried or not), was acked and removed, or is a dead letter with a reason.
        found: Counter[bytes] = Counter()
        for element in elements:
            lease = parse_lease(element)
            if lease is not None:
                found[lease[0]] += 1
            elif lease is None and valid_id(element):
                found[element] += 1
        found.update(letter_ids(real["dead"]))
        # (and the jobs waiting at a priority level, in the scheduled set below 0)
        waiting = [m for m, at in real["scheduled"].items() if at < 0]
        found.update(m.split(b"*", 2)[2] for m in waiting)
        assert found + self.m.completed == self.m.pushed_ids, (elements, real, self.m.completed)
        assert len(waiting) == self.m.prio

        # smin: set while something is scheduled, and no later than its earliest due time (a
        # schedule forgotten may leave it behind, a lower bound of nothing: the next claim
        # after it clears it).
        scheduled = {member: at for member, at in real["scheduled"].items() if at >= 0}
        assert not scheduled or real["smin"] is not None, (real["smin"], scheduled)
        assert not scheduled or real["smin"] <= min(scheduled.values())
        self.check_ticks(scheduled)
        self.check_rate()
        scheduled = {member: ms for member, ms in scheduled.items() if b"*" not in member}

        # A scheduled job stays scheduled, at the time the test gave it, until it is due; one
        # that left was pushed (the model counts each id it promoted, and the ring agrees).
        for job_id, due in list(self.due_of.items()):
            if job_id in scheduled:
                assert scheduled[job_id] == due, (job_id, scheduled[job_id], due)
            else:
                assert due <= self.m.now, f"{job_id!r} left the schedule before {due}"
                self.left_schedule[job_id] += 1
                del self.due_of[job_id]
        assert set(scheduled) == set(self.due_of)
        assert self.left_schedule == self.m.promoted

    def check_ticks(self, scheduled: dict[bytes, int]) -> None:
        """The ticks made since the last step, against what the test asked of each schedule:
        none early, each after the one before (so no tick's job is pushed twice), on the grid
        of whole intervals or at a DUE given; one per schedule and claim however many were
        missed (catch-up), the schedule's next tick then after now."""
        ticked: dict[tuple[int, bytes], Any] = {}
        for tick in self.m.ticks[self.ticks_seen :]:
            series = self.series[tick.name]
            assert tick.ms <= tick.now, f"{tick} came before its time"
            assert tick.job_id == series.job_id + b"@%d" % tick.ms, (tick, series)
            if series.every:
                assert tick.ms >= series.anchor, (tick, series)
                assert (tick.ms - series.anchor) % series.every == 0, (tick, series)
            else:
                assert tick.ms in series.dues, (tick, series)
            after = series.last if series.last is not None else series.floor
            assert after is None or tick.ms > after, f"{tick} does not follow the tick at {after}"
            series.last = tick.ms
            assert (tick.claim, tick.name) not in ticked, f"{tick}: two ticks in one claim"
            ticked[tick.claim, tick.name] = tick
        for tick in ticked.values():
            next_tick = scheduled.get(b"*" + tick.name)
            assert next_tick is None or next_tick > tick.now, (tick, next_tick)
        self.ticks_seen = len(self.m.ticks)

    def check_rate(self) -> None:
        """The claims under the rate limit (since it was last set) never leased more than its
        burst, JOBS, plus one every PER_MS / JOBS ms since the first of them (the module
        rounds the allowance with an epsilon of 1e-9 jobs: 1e-6 is allowed here)."""
        if self.m.rate_n is None:
            return
        jobs, per, log = self.m.rate_n, self.m.rate_ms, self.m.rate_log
        assert per is not None
        for i, (start, _) in enumerate(log):
            total = 0
            for at, leased in log[i:]:
                total += leased
                most = jobs * (at - start + per)  # times per
                assert total * per * 10**6 <= most * 10**6 + per, (
                    f"{total} jobs leased from {start} to {at} at {jobs} per {per} ms: {log}"
                )

    # -- liveness --------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if not self.failed:
                self.drain_everything()
        finally:
            self.admin.delete(*self.keys)

    def drain_everything(self) -> None:
        """Once the queue runs and time moves past every lease, delay and scheduled time,
        every valid job comes out, is acked and leaves the ring, and two laps later nothing
        is left over."""
        if self.m.paused:
            assert self.q.resume() is (self.m.resume() == 1)
        if self.m.rate_n is not None:
            self.q.set_rate_limit(None)
            self.m.rate_limit([b"0", b"1"])
        self.tick(LIVENESS_JUMP_MS)
        for _ in range(1000):
            jobs = self.next_api_call(50, [])
            if not jobs and (CHECK_IDLE_REPLIES or not self.m.takeable_now()):
                break
            if jobs:
                tokens = [job.token.encode("utf-8", "surrogateescape") for job in jobs]
                assert self.q.ack(*jobs) == self.client_ack(tokens) == len(jobs)
        else:
            raise AssertionError("the queue never drained")
        for _ in range(2):
            assert self.q.sweep() == self.api_sweep()
        self.the_keys_hold_what_the_model_holds()
        real = self.server_state()
        assert real["ring"] in ([], [SENTINEL])
        assert real["leases"] == []
        for key in ("done", "done_old", "marks", "marks_old"):
            assert not real[key], key
        assert self.m.completed + letter_ids(real["dead"]) == self.m.pushed_ids
        assert all(self.m.delivered[job_id] >= 1 for job_id in self.m.pushed_ids)
        # Only the schedules' next ticks are left, in the future: each made its catch-up job.
        for member, ms in real["scheduled"].items():
            assert member.startswith(b"*"), member
            assert ms > self.m.now, (member, ms, self.m.now)
        assert all(self.m.delivered[job_id] >= 1 for job_id in self.ever_scheduled)
        counts = self.q.stats()
        assert counts.completed == sum(self.m.completed.values())


def letter_ids(letters: list[bytes]) -> Counter[bytes]:
    """The jobs the dead letters hold, by id: those of max_deliveries (`<id>`) and failed
    (`<id>*<error>`) letters; a corrupt element was never a job pushed."""
    ids: Counter[bytes] = Counter()
    for letter in letters:
        reason, _, _, element = letter.split(b"*", 3)
        if reason in (b"max_deliveries", b"failed"):
            ids[element.split(b"*", 1)[0]] += 1
    return ids


def test_the_clocked_variant_differs_from_the_module_only_in_its_clock() -> None:
    source, clocked = module_source(), clocked_source()
    assert clocked != source
    assert _NOW_MS.sub("", source) == _NOW_MS.sub("", clocked)


Machine = TypeVar("Machine", bound=RuleBasedStateMachine)


def on_server(machine: type[Machine], client: redis.Redis, calls: str) -> type[Machine]:
    """``machine`` bound to ``client``, calling the module as ``calls`` says (``"library"``:
    FCALL, rotator's default; ``"script"``: EVALSHA). Hypothesis makes the instances."""
    bound = {"client": client, "library": calls == "library"}
    return type(f"{machine.__name__}OnServer", (machine,), bound)


# Each machine runs the module both ways rotator calls it: as a library (FCALL, the default),
# which keeps its memos from call to call and from one example's queue to the next, and as a
# script (EVALSHA), which keeps nothing.
CALLS = pytest.mark.parametrize("calls", ["library", "script"])
CALLED_BY = {"library": "fcall", "script": "evalsha"}


@contextmanager
def called_by(client: redis.Redis, calls: str) -> Iterator[None]:
    """Checks that the module was called as ``calls`` says, and never the other way, while
    the block ran (the server's command counts)."""
    client.config_resetstat()
    yield
    counted = client.info("commandstats")
    made = {command: counted.get(f"cmdstat_{command}", {}).get("calls", 0) for command in
            CALLED_BY.values()}  # fmt: skip
    assert made[CALLED_BY[calls]] > 0, made
    assert sum(made.values()) == made[CALLED_BY[calls]], made


@pytest.mark.timeout(MACHINE_TIMEOUT_S)
@CALLS
def test_the_module_behaves_like_the_model(server: ServerProcess, calls: str) -> None:
    with server.client() as client, called_by(client, calls):
        run_state_machine_as_test(on_server(RotatorMachine, client, calls), settings=PROFILE)


# -- a queue that tracks ids: unique pushes and cancel ------------------------------------------

# Once the module lost track of a cancelled element whose id's index entry was later deleted or
# overwritten (the tests test_a_cancelled_* below): the machine then pushed no such id again
# (TrackedIds.may_push_again). A cancelled copy is now recorded apart ("*<id>"), so it may.
PUSH_LINGERING_CANCELLED_IDS = True
TRACKED_IDS = st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=3)
# A third of the main machine's examples: the tracked machine has fewer rules and less state.
TRACKED_PROFILE = settings(PROFILE, max_examples=max(PROFILE.max_examples // 3, 1))


class TrackedMachine(RuleBasedStateMachine):
    """A queue that tracks ids, through the Python API on the clocked module, against
    TrackedIds: unique pushes (now and later, at a priority level or not, an id scheduled
    again moving), cancel (of a job waiting at a level: at once), claims, acks (whole
    batches, or token by token once one is refused), nacks, extends, short leases that
    expire, and sweeps, with `max_deliveries` off (no dead letters).

    Compared exactly: the reply of every push, cancel, ack, nack and extend (extend of a
    cancelled lease: JobCancelled while the index still names it, which a walk may end: then
    either LeaseLost); stats `cancelled`, `scheduled` and `prioritized` after every step;
    each delivery's count and reclaimed flag. Not compared step by step: which jobs a claim
    delivers (the model does not follow the ring's order, the budget or when the walk drops
    a cancelled element), so each delivered id must be one the model says may be delivered
    now (never a cancelled one, never a second live copy), and the other counts of stats
    (they include a cancelled job until the walk drops it): they are compared after a sweep
    of both lists whole (`sweep_whole`), and at teardown, once drained, every copy pushed
    and not cancelled was completed exactly once and the ids hash is empty."""

    client: redis.Redis  # set by on_server()
    library: bool  # (FCALL, or EVALSHA)

    def __init__(self) -> None:
        super().__init__()
        self.admin = self.client
        self.failed = False
        self.t = TrackedIds(now=START_MS)
        self.q = clocked_rotator(
            self.admin, f"t-{uuid.uuid4().hex[:12]}", library=self.library, timeout=LEASE_MS / 1000
        )
        set_clock(self.admin, self.q, START_MS)
        self.tokens: list[bytes] = []  # deliveries the test's workers hold (not given back)

    def pick(self, picks: list[int]) -> list[bytes]:
        return list(dict.fromkeys(self.tokens[i % len(self.tokens)] for i in picks))

    def give_back(self, tokens: list[bytes]) -> None:
        """Workers forget what they acked or nacked (the module's answer to a token used again
        depends on whether the walk removed its element: the main machine covers that)."""
        self.tokens = [token for token in self.tokens if token not in tokens]

    def has_tokens(self) -> bool:
        return bool(self.tokens)

    @initialize(occupied=st.sampled_from([None, "push", "later"]))
    @checked
    def start(self, occupied: str | None) -> None:
        """Before it tracks ids the queue refuses unique pushes and cancel, writing nothing;
        track_ids 1 is refused on a queue that holds a job (pending or scheduled: tried on a
        scratch queue) and changes nothing there; on this empty queue it is taken."""
        refusals: list[Callable[[], int]] = [
            lambda: self.q.push("a", unique=True),
            lambda: self.q.push("a", delay=1.0, unique=True),
            lambda: self.q.cancel("a"),
        ]
        for refused in refusals:
            with pytest.raises(NotTracked):
                refused()
        assert self.admin.exists(self.q.keys.ring, self.q.keys.scheduled, self.q.keys.ids) == 0
        if occupied is not None:
            with scratch_queue(self.admin, self.library) as other:
                other.push("x", delay=None if occupied == "push" else 5.0)
                before = other.stats()
                with pytest.raises(InvalidArgument):
                    other.configure(track_ids=True)
                assert not other.configure().track_ids
                assert other.stats() == before
                assert self.admin.exists(other.keys.ids) == 0
        assert self.q.configure(track_ids=True).track_ids

    def teardown(self) -> None:
        try:
            if not self.failed:
                self.drain_everything()
        finally:
            self.admin.delete(*self.q.keys.all)

    # -- producing and cancelling --------------------------------------------------------------

    @rule(ids=TRACKED_IDS, unique=st.booleans())
    @checked
    def push(self, ids: list[str], unique: bool) -> None:
        """A tracked queue skips ids it holds with or without `unique`."""
        if not PUSH_LINGERING_CANCELLED_IDS:
            ids = [i for i in ids if self.t.may_push_again(i.encode(), later=False)]
        if not ids:
            return
        assert self.q.push(*ids, unique=unique) == self.t.push([i.encode() for i in ids])

    @rule(ids=TRACKED_IDS, delay_ms=st.sampled_from([0, 500, 2500]))
    @checked
    def push_later(self, ids: list[str], delay_ms: int) -> None:
        if not PUSH_LINGERING_CANCELLED_IDS:
            ids = [i for i in ids if self.t.may_push_again(i.encode(), later=True)]
        if not ids:
            return
        due = self.t.now + delay_ms
        got = self.q.push(*ids, delay=delay_ms / 1000, unique=True)
        assert got == self.t.push([i.encode() for i in ids], due=due)

    @rule(ids=TRACKED_IDS, level=st.integers(1, 9), delay_ms=st.sampled_from([0, 0, 500]))
    @checked
    def push_priority(self, ids: list[str], level: int, delay_ms: int) -> None:
        """At a level (index "q<level>", or "s<level>" for later): skipped while held (waiting
        at any level too), a scheduled one moving to the new time and level."""
        if not PUSH_LINGERING_CANCELLED_IDS:
            ids = [i for i in ids if self.t.may_push_again(i.encode(), later=delay_ms > 0)]
        if not ids:
            return
        due = self.t.now + delay_ms if delay_ms else None
        got = self.q.push(*ids, priority=level, delay=delay_ms / 1000 if delay_ms else None)
        assert got == self.t.push([i.encode() for i in ids], due=due, level=level)

    @rule(ids=st.lists(st.sampled_from(["a", "b", "c", "d", "z"]), min_size=1, max_size=3))
    @checked
    def cancel(self, ids: list[str]) -> None:
        assert self.q.cancel(*ids) == self.t.cancel([i.encode() for i in ids])

    # -- consuming -----------------------------------------------------------------------------

    @rule(count=st.integers(1, 3))
    @checked
    def next(self, count: int) -> None:
        self.claim(count)

    def claim(self, count: int) -> list[Job]:
        """A claim (the client calls the module until it leases or a lap was idle): each job
        must be one the model may deliver now, numbered and flagged as the model says."""
        self.t.promote()
        jobs = self.q.next(count)
        self.t.walked()
        assert len({job.id for job in jobs}) == len(jobs), f"one id twice in a claim: {jobs}"
        for job in jobs:
            token = job.token.encode("utf-8", "surrogateescape")
            lease = parse_lease(token)
            assert lease is not None
            job_id, deadline, deliveries = lease
            assert self.t.deliverable(job_id), (
                f"{job} delivered, the model holds {self.t.copies.get(job_id)}"
            )
            assert (deliveries, job.reclaimed) == self.t.deliver(job_id, token, deadline)
            assert deadline == self.t.now + LEASE_MS
            self.tokens.append(token)
        return jobs

    @precondition(has_tokens)
    @rule(picks=PICKS)
    @checked
    def ack(self, picks: list[int]) -> None:
        tokens = self.pick(picks)
        assert self.q.ack(*(as_text(token) for token in tokens)) == self.t.ack(tokens)
        self.give_back(tokens)

    @precondition(has_tokens)
    @rule(pick=st.integers(0, 2**16), delay_ms=st.sampled_from([0, 500]))
    @checked
    def nack(self, pick: int, delay_ms: int) -> None:
        (token,) = self.pick([pick])
        assert self.q.nack(as_text(token), delay=delay_ms / 1000) == self.t.nack(token, delay_ms)
        self.give_back([token])

    @precondition(has_tokens)
    @rule(pick=st.integers(0, 2**16), lease_ms=st.sampled_from([500, 2500]))
    @checked
    def extend(self, pick: int, lease_ms: int) -> None:
        (token,) = self.pick([pick])
        want = self.t.extend(token, lease_ms)
        try:
            deadline = self.q.extend(as_text(token), lease_ms / 1000)
        except JobCancelled:
            assert want in (-1, None), f"JobCancelled, the model says {want}"
            return
        except LeaseLost:
            assert want in (0, None), f"LeaseLost, the model says {want}"
            return
        assert want == 1, f"extended to {deadline}, the model says {want}"
        assert round(deadline * 1000) == self.t.now + lease_ms

    @rule(dt=st.sampled_from([1, 400, 1000, 2500]))
    @checked
    def tick(self, dt: int) -> None:
        """Time moves on: leases of 1 s (or extended by 0.5 s) expire, nacked and scheduled
        jobs fall due."""
        self.t.now += dt
        set_clock(self.admin, self.q, self.t.now)

    @rule()
    @checked
    def sweep(self) -> None:
        self.q.sweep()
        self.t.walked()

    @rule()
    @checked
    def sweep_whole(self) -> None:
        """After a sweep of both lists whole, every acked element is gone and so is every
        cancelled one but a young lease the sweep put back unvisited (TrackedIds.swept): the
        counts of stats are then the model's copies, pending ones and in flight (leased,
        overdue or deferred), plus at most those leases. Three sweeps, not one: the acks the
        client sends again token by token once a batch ack was refused (Batches) leave tokens
        that name nothing in `done`, counted in stats until they age out, two laps later."""
        young = max(self.sweep_all() for _ in range(3))
        s = self.q.stats()
        copies = [c for c in self.t.copies.values() if not c.cancelled]
        waiting = sum(c.state == "waiting" for c in copies)
        flight = sum(c.state == "flight" for c in copies)
        assert (s.pending, s.done) == (waiting, 0), (s, self.t.copies)
        assert waiting + flight <= s.length <= waiting + flight + young, (s, self.t.copies)
        assert s.in_flight + s.overdue + s.deferred == s.length - waiting

    def sweep_all(self) -> int:
        """Raw sweeps (budget 1000) until the visits cover both lists as they were; how many
        cancelled leases may be left (TrackedIds.swept)."""
        keys = self.q.keys
        elements = self.admin.llen(keys.ring) + self.admin.llen(keys.leases)
        visited = 0
        while visited < elements:
            visited += run(self.q._sender.script, keys.all, [b"sweep", 1000])[0]
        return self.t.swept()

    @invariant()
    def counts_as_the_model(self) -> None:
        if self.failed:
            return
        s = self.q.stats()
        assert (s.cancelled, s.scheduled, s.prioritized) == (
            self.t.cancelled,
            self.t.scheduled(),
            self.t.prioritized(),
        )

    # -- liveness ------------------------------------------------------------------------------

    def drain_everything(self) -> None:
        """Past every lease, delay and due time, claims deliver each id the model owes once
        (never a cancelled one), all acked; swept, the queue is empty, the ids hash too, and
        each id was completed once per copy pushed and not cancelled."""
        self.tick(LIVENESS_JUMP_MS)
        owed = self.t.owed()
        drained: Counter[bytes] = Counter()
        for _ in range(1000):
            jobs = self.claim(50)
            if not jobs:
                break
            drained.update(job.id.encode("utf-8", "surrogateescape") for job in jobs)
            tokens = [job.token.encode("utf-8", "surrogateescape") for job in jobs]
            assert self.q.ack(*jobs) == self.t.ack(tokens) == len(jobs)
        else:
            raise AssertionError("the queue never drained")
        assert drained == Counter(owed), (drained, owed)
        for _ in range(2):
            self.sweep_all()
        assert self.admin.hlen(self.q.keys.ids) == 0, self.admin.hgetall(self.q.keys.ids)
        assert self.admin.lrange(self.q.keys.ring, 0, -1) in ([], [SENTINEL])
        assert self.admin.llen(self.q.keys.leases) == 0
        s = self.q.stats()
        assert (s.length, s.scheduled, s.cancelled) == (0, 0, self.t.cancelled)
        assert s.completed == sum(self.t.completed.values())
        assert self.t.completed == self.t.made - self.t.dropped
        assert not self.t.copies  # the cancelled ones went with the sweeps


@pytest.mark.timeout(MACHINE_TIMEOUT_S)
@CALLS
def test_a_tracked_queue_behaves_like_the_id_model(server: ServerProcess, calls: str) -> None:
    with server.client() as client, called_by(client, calls):
        machine = on_server(TrackedMachine, client, calls)
        run_state_machine_as_test(machine, settings=TRACKED_PROFILE)


# -- a queue with payloads: each delivery carries its id's payload, acks take it once ----------

PAYLOAD_IDS = st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1, max_size=4)


class PayloadMachine(RuleBasedStateMachine):
    """A queue with payloads through the Python API on the clocked module, against an
    id-level model: the payload last pushed with each id, and the copies of it queued or in
    flight. Pushes (an id pushed again adds a copy and replaces the payload), claims whose
    acks ride on them (the oldest batch held, whole: a named batch ack), acks of a whole
    batch (named) or job by job (tokens, once the batch's lease may have run out), an ack
    sent again (a retried call whose reply was lost: at once, or after pushes of its ids,
    claims and sweeps that removed its batch, within the module's memory of it), clock moves
    past leases (whole batches reclaimed), and sweeps.

    Compared exactly: every delivery's payload is the one last pushed with its id; after
    every step the payloads hash holds exactly the ids with a copy left, each with its
    payload, and "<id>*" counts the copies beyond the first; acks of a young batch are
    accepted whole. At teardown, drained: the hash is empty."""

    client: redis.Redis  # set by on_server()
    library: bool  # (FCALL, or EVALSHA)

    def __init__(self) -> None:
        super().__init__()
        self.admin = self.client
        self.failed = False
        self.now = START_MS
        self.q = clocked_rotator(
            self.admin,
            f"p-{uuid.uuid4().hex[:12]}",
            library=self.library,
            timeout=LEASE_MS / 1000,
            payloads=True,
        )
        set_clock(self.admin, self.q, START_MS)
        self.payload: dict[str, bytes] = {}  # the payload each queued id is delivered with
        self.copies: Counter[str] = Counter()  # copies queued or in flight, by id
        self.held: list[list[Job]] = []  # each claim's deliveries, oldest first
        self.versions = 0
        self.last_acked: list[Job] = []  # acked whole by the last ack, while remembered
        self.acked_at = START_MS

    def teardown(self) -> None:
        try:
            if not self.failed:
                self.drain()
        finally:
            self.admin.delete(*self.q.keys.all)

    def drain(self) -> None:
        self.tick(LIVENESS_JUMP_MS)
        self.held = []
        for _ in range(200):
            jobs = self.claimed(50, [])
            if not jobs:
                break
            assert self.q.ack(*jobs) == len(jobs)
            self.completed(jobs)
        else:
            raise AssertionError("the queue never drained")
        assert +self.copies == Counter()
        assert self.admin.exists(self.q.keys.payloads) == 0

    def tick(self, ms: int) -> None:
        self.now += ms
        set_clock(self.admin, self.q, self.now)

    def claimed(self, count: int, acks: list[Job]) -> list[Job]:
        jobs = self.q.next(count, ack=acks)
        for job in jobs:
            assert job.payload == self.payload[job.id], (job, self.payload.get(job.id))
        return jobs

    def completed(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.copies[job.id] -= 1
            assert self.copies[job.id] >= 0, job
            if self.copies[job.id] == 0:
                del self.payload[job.id]

    def young(self, jobs: list[Job]) -> bool:
        return all(job.deadline_ms > self.now for job in jobs)

    @rule(ids=PAYLOAD_IDS)
    @checked
    def push(self, ids: list[str]) -> None:
        for job_id in ids:  # one call each: a call's payloads are one per id
            self.versions += 1
            body = f"{job_id}-v{self.versions}".encode()
            assert self.q.push_payloads({job_id: body}) == 1
            self.payload[job_id] = body
            self.copies[job_id] += 1

    @rule(count=st.integers(1, 4), ack_oldest=st.booleans())
    @checked
    def claim(self, count: int, ack_oldest: bool) -> None:
        acks: list[Job] = []
        if ack_oldest and self.held and self.young(self.held[0]):
            acks = self.held.pop(0)  # young: the named batch ack is accepted whole
        jobs = self.claimed(count, acks)
        self.completed(acks)
        if acks:
            self.acked(acks)
        if jobs:
            self.held.append(jobs)

    @precondition(lambda self: bool(self.held))
    @rule(pick=st.integers(0, 10))
    @checked
    def ack(self, pick: int) -> None:
        jobs = self.held.pop(pick % len(self.held))
        if self.young(jobs):
            assert self.q.ack(*jobs) == len(jobs)
            self.completed(jobs)
            self.acked(jobs)
            return
        # Its lease may have run out, and the walk may have given the jobs to another claim:
        # each token tells.
        for job in jobs:
            if self.q.ack(job) == 1:
                self.completed([job])
        self.last_acked = []

    def acked(self, jobs: list[Job]) -> None:
        self.last_acked, self.acked_at = jobs, self.now

    @precondition(
        lambda self: bool(self.last_acked) and self.now - self.acked_at < DROPPED_MEMORY_MS
    )
    @rule()
    @checked
    def ack_again(self) -> None:
        """The last whole ack once more (a retry after a lost reply), whatever ran since: its
        batch may be removed, and its ids pushed, claimed and acked again. Accepted, and it
        takes no payload of a copy left."""
        assert self.q.ack(*self.last_acked) == len(self.last_acked)

    @rule(ms=st.sampled_from([1, 300, LEASE_MS + 1, 3 * LEASE_MS]))
    @checked
    def advance(self, ms: int) -> None:
        self.tick(ms)

    @rule()
    @checked
    def sweep(self) -> None:
        self.q.sweep()

    @invariant()
    def the_payloads_hash_holds_each_queued_id_with_its_payload(self) -> None:
        stored = self.admin.hgetall(self.q.keys.payloads)
        expected: dict[bytes, bytes] = {}
        for job_id, copies in self.copies.items():
            if copies > 0:
                expected[job_id.encode()] = self.payload[job_id]
            if copies > 1:
                expected[f"{job_id}*".encode()] = str(copies - 1).encode()
        assert stored == expected


@pytest.mark.timeout(MACHINE_TIMEOUT_S)
@CALLS
def test_a_payload_queue_behaves_like_the_payload_model(server: ServerProcess, calls: str) -> None:
    with server.client() as client, called_by(client, calls):
        machine = on_server(PayloadMachine, client, calls)
        run_state_machine_as_test(machine, settings=TRACKED_PROFILE)


# -- arbitrary bytes in the ring -------------------------------------------------------------


def digits(low: int, high: int) -> st.SearchStrategy[bytes]:
    return st.text("0123456789", min_size=low, max_size=high).map(str.encode)


ELEMENTS = st.one_of(
    st.binary(max_size=24),
    st.builds(
        lambda i, d, n, s: i + b"*" + d + b"." + n + b"." + s,
        st.binary(max_size=4),
        digits(0, 16),
        digits(0, 10),
        digits(0, 4),
    ),
    st.sampled_from(
        [
            *(SENTINEL, b"x*nan", b"*1", b"y*inf", b"x*-inf", b"x*0x1F", b"x* 12", b"x*1e3"),
            *(b"x*-5", b"x*", b"*", b"x*1*2", b"x" * 1025, b"\xff\xfe", b"a\r\nb", b"a\x00b"),
            *(b"a*1.1.1", b"a*99999999999999.1.1", b"b*1.999999999.1", b"b*1.999999998.1"),
        ]
    ),
)


@contextmanager
def scratch_queue(client: redis.Redis, library: bool) -> Iterator[Rotator]:
    queue = clocked_rotator(client, f"g-{uuid.uuid4().hex[:12]}", library=library)
    try:
        set_clock(client, queue, START_MS)
        yield queue
    finally:
        client.delete(*queue.keys.all)


@CALLS
def test_any_bytes_in_the_ring_end_delivered_dead_lettered_or_valid(
    server: ServerProcess, calls: str
) -> None:
    with server.client() as client:

        @settings(PROFILE, max_examples=100)
        @given(raw=st.lists(ELEMENTS, min_size=1, max_size=8))
        @example(raw=[b"b*1.999999999.1"])  # the next delivery count has 10 digits
        @example(raw=[b"*1", b"x*nan", SENTINEL, b"", b"\xff\xfe", b"a*1.1.1"])
        def check(raw: list[bytes]) -> None:
            with scratch_queue(client, calls == "library") as q:
                q.push("v")
                client.lpush(q.keys.ring, *raw)
                delivered: Counter[bytes] = Counter()
                for _ in range(100):  # `next` must never raise, whatever the ring holds
                    jobs = q.next(100)
                    if not jobs:
                        break
                    delivered.update(job.id.encode("utf-8", "surrogateescape") for job in jobs)
                    assert q.ack(*jobs) == len(jobs)
                q.sweep()

                due: Counter[bytes] = Counter({b"v": 1})
                young: Counter[bytes] = Counter()
                corrupt: Counter[bytes] = Counter()
                for element in raw:
                    lease = parse_lease(element)
                    if element == SENTINEL:
                        continue  # a second sentinel is dropped
                    if valid_id(element):
                        due[element] += 1
                    elif lease is None:
                        corrupt[element] += 1
                    elif lease[1] > START_MS:
                        young[element] += 1
                    elif lease[2] >= MAX_STAMPED_DELIVERIES:
                        # No delivery reaches that count, and the next one would not fit the
                        # grammar: the module dead-letters it as corrupt.
                        corrupt[element] += 1
                    else:
                        due[lease[0]] += 1
                ring = client.lrange(q.keys.ring, 0, -1)
                leases = client.lrange(q.keys.leases, 0, -1)  # young leases move there
                letters = [letter.split(b"*", 3) for letter in client.lrange(q.keys.dead, 0, -1)]
                assert delivered == due
                assert ring.count(SENTINEL) == 1
                assert Counter(e for e in ring + leases if e != SENTINEL) == young
                assert Counter(element for reason, _, _, element in letters) == corrupt
                assert all(reason == b"corrupt" for reason, _, _, _ in letters)

        check()


@CALLS
def test_a_claim_moves_at_most_1000_due_jobs_earliest_first_as_the_model_does(
    server: ServerProcess, calls: str
) -> None:
    """More jobs due than one claim moves (PROMOTE): the earliest go, ties by id bytes, smin
    stays at the earliest left (due already), and the next claim moves the rest; every reply
    and key as the model has them, and the queue then drains."""
    with server.client() as client:
        machine = on_server(RotatorMachine, client, calls)()
        try:
            bulk = [b"x%04d" % i for i in range(spec.PROMOTE + 1)]
            machine.push_later_raw(b"AT", 0, bulk[::-1])  # due now
            machine.push_later_raw(b"AT", -1, [b"z1", b"z0"])  # due before: first
            machine.push_later_raw(b"IN", 1, [bulk[0]])  # moves: not due
            for left in (2, 0):
                machine.next_raw(
                    count=2,
                    lease=1000,
                    budget=3,
                    max_deliveries=0,
                    ack_picks=[],
                    bad=None,
                    packed=False,
                )
                machine.the_keys_hold_what_the_model_holds()
                due = client.zrangebyscore(machine.q.keys.scheduled, "-inf", machine.m.now)
                assert due == bulk[len(bulk) - left :]
            assert set(machine.m.delivered) == {b"z0", b"z1", b"x0001", b"x0002"}
        except BaseException:
            machine.failed = True
            raise
        finally:
            machine.teardown()


def test_the_models_strict_checks_are_on() -> None:
    """CHECK_IDLE_REPLIES exists to confirm, while a fix is under way, that nothing else
    differs; it is not a way to make this file pass. FENCE_TOKENS_NOT_IN_RING stays off: it
    models a promise the module does not make (see tests/model.py)."""
    assert not spec.FENCE_TOKENS_NOT_IN_RING
    assert CHECK_IDLE_REPLIES


# -- what the model found, as plain regressions on the real module and real time ---------------


def test_a_job_pushed_behind_acked_elements_is_delivered_not_reported_idle(
    client: redis.Redis, queue_name: str
) -> None:
    """`idle` counts visits since the last push against the ring's length, and a visit that
    removes an acked element counts too: a partial walk could call a lap idle, delete the
    wake list and return nothing while a job was pending."""
    q = Rotator(client, queue_name, timeout=30.0, budget=3)
    q.push("b", "c")
    q.ack(*q.next(2))
    q.push("p")  # tail to head: *lap, b (acked), c (acked), p
    assert q.stats().pending == 1
    assert [job.id for job in q.next()] == ["p"]


def test_a_blocked_consumer_gets_a_job_pushed_behind_acked_elements_at_once(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name, timeout=30.0, budget=3)
    q.push("b", "c")
    q.ack(*q.next(2))
    q.push("p")
    started = time.monotonic()
    assert [job.id for job in q.next(block=3.0)] == ["p"]
    assert time.monotonic() - started < 1.5, "the push's wake-up was lost"


def test_acking_an_acked_job_again_with_next_keeps_the_ack(
    client: redis.Redis, queue_name: str
) -> None:
    """An ack repeated through next(ack=...) (redis-py retries a call whose reply was lost)
    must neither fail nor undo the first ack."""
    small = Rotator(client, queue_name, timeout=30.0, budget=2)  # a consumer with a small budget
    q = Rotator(client, queue_name, timeout=30.0)
    q.push("a", "b")
    (a,) = small.next(1)
    (b,) = small.next(5)  # its walk ends on the sentinel: tail to head a, b, *lap
    assert q.ack(a, b) == 2
    assert q.next(5, ack=[a, b]) == []
    assert [entry.state for entry in q.peek(5)] == ["lap"]


def test_extend_and_nack_of_a_job_that_was_acked_and_has_left_the_ring_change_no_job(
    client: redis.Redis, queue_name: str
) -> None:
    """Such tokens cannot be told from live ones in O(1): they are accepted, no job is
    redelivered or kept because of them, and what they leave behind is gone in two laps."""
    q = Rotator(client, queue_name, timeout=30.0)
    q.push("a", "b", "c")
    a, b, c = q.next(3)
    assert q.ack(a, b) == 2
    assert q.sweep() == 2  # their elements leave the ring
    q.extend(a)
    q.nack(b)
    assert q.next(5) == []  # b is not delivered again
    assert q.ack(c) == 1
    for _ in range(3):
        q.sweep()
    assert client.lrange(q.keys.ring, 0, -1) == [b"*lap"]
    assert client.hlen(q.keys.all[3]) + client.hlen(q.keys.all[4]) == 0  # no mark is left
    s = q.stats()
    assert (s.length, s.in_flight, s.deferred, s.done) == (0, 0, 0, 0)


# -- module bugs the model found (fixed): each stays as a test ---------------------------------


def test_a_due_time_schedule_without_spec_is_refused(client: redis.Redis, queue_name: str) -> None:
    """The header: `schedule SET|FILL NAME JOB_ID EVERY_MS SPEC [DUE ...]`, and EVERY_MS 0
    takes 1..1000 DUEs. With SPEC left out the module once counted -1 DUEs, which its check
    `(every > 0) ~= (count == 0)` let through for EVERY_MS 0, making a schedule with no due
    time (found by this model)."""
    q = Rotator(client, queue_name)
    with pytest.raises(InvalidArgument):
        run(q._sender.script, q.keys.all, [b"schedule", b"SET", b"n", b"job", b"0"])


def test_processing_times_on_a_claim_take_counts_as_durations_does(
    client: redis.Redis, queue_name: str
) -> None:
    """The header: a next's or an ack's last argument "#<total ms>,<bucket>:<count>,..." holds
    buckets "as durations takes them", whose COUNT is 1..1e9; M.durations_arg once took any
    count of up to 10 digits (found by this model)."""
    q = Rotator(client, queue_name)
    with pytest.raises(InvalidArgument):
        run(q._sender.script, q.keys.all, [b"durations", b"0", b"0", b"2000000000"])
    with pytest.raises(InvalidArgument):
        run(q._sender.script, q.keys.all, [b"next", 1, 1000, 10, 0, b"#0,0:2000000000"])


def test_a_claim_held_by_the_rate_limit_is_told_when_one_more_may_go(
    client: redis.Redis, queue_name: str
) -> None:
    """The header: a claim at the rate limit "replies idle with wait_ms until one more may go".
    At 3 jobs per 1000 ms, a burst of 3 at T and 2 more at T+667 leave rate_tat at
    T+1666.6667 (a double of 1.7e12 ms is exact to about 2e-4 ms); a claim at T+667 is told
    333 ms, and at T+1000 it is held again (and told 1 ms): M.rate_allowance's division comes
    out below 1 by more than its epsilon of 1e-9 jobs, while its wait rounded up to a whole ms
    that the allowance did not reach (found by this model; the wait is now checked with the
    allowance's own sum)."""
    q = clocked_rotator(client, queue_name)
    set_clock(client, q, START_MS)

    def claim(at: int, count: int) -> list[Any]:
        set_clock(client, q, START_MS + at)
        reply: list[Any] = run(q._sender.script, q.keys.all, [b"next", count, 60_000, 100, 0])
        return reply

    q.push(*(f"j{i}" for i in range(6)))
    q.set_rate_limit(3, per=1.0)
    assert len(claim(0, 3)) == 3 + 2 * 3  # the burst
    assert len(claim(667, 2)) == 3 + 2 * 2  # 2 of the 2.001 the rate allows by now
    idle, wait_ms, _ = claim(667, 1)
    assert idle == 1
    assert len(claim(667 + wait_ms, 1)) == 3 + 2, f"held again {wait_ms} ms later"


# -- module bugs the tracked-ids machine found, fixed: each a regression test ----------------------


def tracked_queue(client: redis.Redis, name: str) -> Rotator:
    q = clocked_rotator(client, name)
    set_clock(client, q, START_MS)
    assert q.configure(track_ids=True).track_ids
    return q


def raw_on(q: Rotator, *args: object) -> Any:
    return run(q._sender.script, q.keys.all, list(args))


def test_a_cancelled_job_comes_back_when_its_id_is_scheduled_and_cancelled_again(
    client: redis.Redis, queue_name: str
) -> None:
    """cancel of a waiting id marks its entry "c" and leaves the element for the walk; a
    push_later of the id then writes "s", and cancelling that deletes the entry (ZREM + HDEL):
    the cancelled element now has no entry and is leased as usual."""
    q = tracked_queue(client, queue_name)
    assert raw_on(q, b"push", b"a") == 1
    assert raw_on(q, b"cancel", b"a") == 1
    assert raw_on(q, b"push_later", b"IN", 100_000, b"a") == 1
    assert raw_on(q, b"cancel", b"a") == 1
    assert raw_on(q, b"next", 5, 1000, 10, 0)[3:] == []  # (a was delivered)


def test_a_cancelled_waiting_job_scheduled_again_is_delivered_once(
    client: redis.Redis, queue_name: str
) -> None:
    """A push_later of an id cancelled while it waited takes it as new ("s"); promoted, it is
    "p", which also names the cancelled element still in the ring: both are delivered, two
    live copies of one id on a queue that holds each id once."""
    q = tracked_queue(client, queue_name)
    assert raw_on(q, b"push", b"a", b"b") == 2
    assert raw_on(q, b"cancel", b"a") == 1
    assert raw_on(q, b"push_later", b"IN", 0, b"a") == 1
    reply = raw_on(q, b"next", 5, 1000, 10, 0)
    ids = [token.split(b"*", 1)[0] for token in reply[3::2]]
    assert sorted(ids) == [b"a", b"b"]  # (was [a, a, b])


def test_a_cancelled_lease_stays_cancelled_when_a_sweep_drops_a_later_cancelled_copy(
    client: redis.Redis, queue_name: str
) -> None:
    """A lease cancelled (index "c<stamp>"), its id pushed again and that copy cancelled too
    (index "c"): a sweep drops the waiting copy and deletes the entry, but puts the young
    lease back without visiting it; once it expires the walk finds no entry and leases the
    cancelled job again (reclaimed)."""
    q = tracked_queue(client, queue_name)
    assert raw_on(q, b"push", b"a", b"b") == 2
    assert raw_on(q, b"next_packed", 2, 1000, 1000, 0)[3].endswith(b"*a*b")
    assert raw_on(q, b"cancel", b"b") == 1
    raw_on(q, b"sweep", 1000)  # breaks the touched batch up: a's lease stays, plain
    assert raw_on(q, b"cancel", b"a") == 1
    assert raw_on(q, b"push", b"a") == 1
    assert raw_on(q, b"cancel", b"a") == 1
    raw_on(q, b"sweep", 1000)
    set_clock(client, q, START_MS + LIVENESS_JUMP_MS)
    assert raw_on(q, b"next", 5, 1000, 10, 0)[3:] == []  # (a was leased again)


# -- a module bug the main machine found, fixed: a regression test ---------------------------------


def test_a_waiting_prioritized_job_scheduled_again_is_counted_as_scheduled(
    client: redis.Redis, queue_name: str
) -> None:
    """push_priority 3 IN 0 x, then push_priority 3 IN 60000 x: the one member "*3*x" moves
    from its level to the schedule (as push_later moves an id), but meta prio keeps counting
    it. stats then says 1 pending and 1 prioritized, 0 scheduled (fails here); once promoted,
    prio counts it twice, and after the job is delivered and acked it stays at 1: a queue
    with nothing in it reports a pending prioritized job for good (and never takes the short
    way of next again)."""
    q = clocked_rotator(client, queue_name)
    set_clock(client, q, START_MS)
    assert raw_on(q, b"push_priority", 3, b"IN", 0, b"x") == 1
    assert raw_on(q, b"push_priority", 3, b"IN", 60_000, b"x") == 1
    scheduled = client.zrange(q.keys.scheduled, 0, -1, withscores=True)
    assert scheduled == [(b"*3*x", START_MS + 60_000)]
    moved = q.stats()
    set_clock(client, q, START_MS + 60_000)
    jobs = q.next(5)
    assert [job.id for job in jobs] == ["x"]  # delivered once: no job is lost or doubled
    assert q.ack(*jobs) == 1
    assert q.next(5) == []
    drained = q.stats()
    client.delete(*q.keys.all)
    assert (moved.pending, moved.prioritized, moved.scheduled) == (0, 0, 1), moved  # (1, 1, 0)
    assert (drained.length, drained.pending, drained.prioritized) == (0, 0, 0), drained
