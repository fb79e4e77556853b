"""An executable model of rotator: the spec the stateful test holds the real module to.

Pure Python, no server. It keeps the queue as the module's header and the README describe it:
the ring (a list, head first, like LRANGE), the two generations of acks and marks, revoked
tokens, dead letters, the wake list's length, the counters, the scheduled jobs (id -> due ms)
with meta smin (a lower bound of the earliest due time), the recurring schedules (each a meta
field and, while it has a next tick, a member "*<name>" of the same sorted set), the jobs
waiting at a priority level (members "*<level>*<id>" of that set, scored below 0 by level and
push order, counted in meta prio; scheduled at a level: scored by due ms), the pause
flag, the rate limit's cell rate, the counts since the queue was made and the processing-time
histogram, and a clock that only moves when the test says so. Everything is bytes, so ids with
NUL, CRLF or invalid UTF-8 are modelled exactly.

Where the module works on slices of the ring (one LRANGE, one SMISMEMBER, one LTRIM and one
LPUSH per call), the model visits one element at a time, as a sequence of RPOPLPUSHes would:
the README promises that both orders agree, and the stateful test checks it.

Replies have the shapes the server sends (ints and bytes); refusals raise `Refused` with the
module's error code. A call's first deliveries go back into the ring as one packed batch
(`*<deadline>.1.<seq>*<id>*<id>...`), so the model knows the module's token numbering: the
call's first visit number, then a five-digit place (in the batch, or among the call's later
deliveries). The test `adopt`s each token the server hands out: it must be the model's, and
never issued before.
TrackedIds models a queue that tracks ids (the header's IDS) at the level of its ids only:
which copy each id has and which tokens are live, not the elements of the ring.
Besides the spec, the model keeps bookkeeping for the test's invariants (`pushed_ids`,
`promoted`, `completed`, `delivered`, `laps`, `acked_at`, `ticks`, `rate_log`, `held_wait`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rotator.defaults import MAX_ERROR_BYTES, MAX_STAMP_BYTES

SENTINEL = b"*lap"
ID_BYTES = 1024
STAMP_BYTES = MAX_STAMP_BYTES
BATCH = 5000
COUNT = 1000
BUDGET = 1000
LEASE_MS = 86_400_000
REVOKED_KEEP_MS = 2 * 86_400_000
LEASE_BYTES = 2 * 1024 * 1024  # bytes of elements one walk of the lease list reads at most
REVOKES = 250  # expired leases one call re-leases one by one (each revoked) at most
OVERDUE_LOOK = 100  # lease list elements stats reads at most, from the tail
STAMPED_DELIVERIES = 999_999_999  # a delivery count no real lease reaches (9 digits)
BATCH_BYTES = 256 * 1024  # a call leases no more once its batch's ids reach this
WAKE_TOKENS = 16
PUSHLOG_BUCKET_MS = 1000
PUSH_CHUNK = 1000  # rotator.defaults.DEFAULT_PUSH_CHUNK: ids per push call of the Python API
PROMOTE = 1000  # scheduled jobs one next moves to the ring at most
SCHEDULE_MS = 3650 * 86_400_000  # push_later: at most ten years ahead
PRIORITY_LEVELS = 9  # push_priority's LEVEL: 1..9 (the ring's pending ids are level 0)
PRIO_SPAN = 2**40  # level L waits at (L - 10) * PRIO_SPAN + its push order (meta pseq)
NO_BOUND = 10**15  # an argument with no range of its own (15 digits bound it)
SCHEDULES = 1000  # recurring schedules per queue
SCHEDULE_NAME = 128  # bytes of a schedule's name
SCHEDULE_JOB_ID = ID_BYTES - 15 - 1  # a schedule's job id: room for "@<tick ms>"
SPEC_BYTES = 256  # a schedule's SPEC
SCHEDULE_DUES = 1000  # DUEs one schedule call gives
RATE_JOBS = 10**9  # rate_limit's JOBS; durations' COUNT
RATE_MS = LEASE_MS  # rate_limit's PER_MS: at most a day
DURATION_BUCKETS = 26  # durations: under 1 ms, then doubling up to 2^24 ms and beyond

# The spec for nack and extend: only a lease that is still in the ring, not acked and not
# revoked can be given back or extended ("0 = lease lost (re-issued, acked or unknown queue)";
# `extend` "raises LeaseLost when the lease was re-issued, nacked, dead-lettered or acked").
# Whether nack/extend refuse a token whose element has left the ring (acked and removed, or
# never issued by this queue). The module cannot tell such a token from a live one without
# scanning the ring, so it accepts it, with no effect on any job; the mark it leaves is swept
# within two laps (README, "Guarantees"). True would model a stricter contract than promised.
# `ack` likewise: any well-formed token that is not revoked is accepted (counted), and one
# that names nothing in the ring is a leftover, swept within two laps.
FENCE_TOKENS_NOT_IN_RING = False

_TOKEN_STAMP = re.compile(rb"(\d+)\.(\d+)\.\d+")
_BATCH = re.compile(rb"\*(\d+)\.1\.\d+")
_BATCH_ACK = re.compile(rb"\*\d+\.1\.\d+/(\d+)")
_MARK = re.compile(rb"([enw])(\d+)")

_DEAD_LETTER = re.compile(rb"[^*]*\*\d+\*\d+\*(.*)", re.DOTALL)
_TOKEN_DEADLINE = re.compile(rb"\*(\d+)\.")
_PUSHLOG = re.compile(rb"(\d+):(\d+)")
_SCHEDULE_NAME = re.compile(rb"[A-Za-z0-9._:@/-]+")
_TIMES = re.compile(rb"#(\d{1,15})((?:,\d{1,2}:\d{1,10})+)")
_TIMES_BUCKET = re.compile(rb",(\d+):(\d+)")
_RANKED = re.compile(rb"\*([1-9])\*(.+)", re.DOTALL)  # "*<level>*<id>" (Lua's "." is any byte)


def moved_deadline(mark: bytes | None) -> int | None:
    """The deadline a "w" mark holds: an extended lease moved to the lease list's head waits by
    it (the module's moved_deadline); None for any other mark."""
    found = _MARK.fullmatch(mark) if mark else None
    return int(found[2]) if found and found[1] == b"w" else None


class Refused(Exception):
    """The module refused a call (nothing was written); `code` is e.g. ROTATOR_BADID."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def valid_id(element: bytes) -> bool:
    """The id grammar: 1..1024 bytes without `*`."""
    return 0 < len(element) <= ID_BYTES and b"*" not in element


def parse_lease(element: bytes) -> tuple[bytes, int, int] | None:
    """`(id, deadline, deliveries)` of `<id>*<deadline>.<n>.<seq>`; None for anything else.

    Digits only (strtod-isms like `nan` or `1e3` are corrupt), at most 15 digits of deadline,
    9 of deliveries and 48 bytes of stamp, an id of 1..1024 bytes."""
    star = element.find(b"*")
    if star <= 0 or star > ID_BYTES or len(element) - star - 1 > STAMP_BYTES:
        return None
    stamp = _TOKEN_STAMP.fullmatch(element, star + 1)
    if stamp is None or len(stamp[1]) > 15 or len(stamp[2]) > 9:
        return None
    return element[:star], int(stamp[1]), int(stamp[2])


def check_tokens(tokens: list[bytes], required: bool, batches: bool = False) -> None:
    """Delivery tokens, and where `batches` allows, batch acks `*<deadline>.1.<seq>/<jobs>`."""
    if required and not tokens:
        raise Refused("ROTATOR_BADTOKEN")
    if len(tokens) > BATCH:
        raise Refused("ROTATOR_TOOMANY")
    for token in tokens:
        star = token.find(b"*", 1)
        if (
            star < 0
            or star > ID_BYTES
            or len(token) - star - 1 > STAMP_BYTES
            or not re.fullmatch(rb"\d+\.\d+\.\d+", token[star + 1 :])
        ):
            batch_ack = _BATCH_ACK.fullmatch(token) if batches and len(token) <= 60 else None
            if batch_ack is None or not 1 <= int(batch_ack[1]) <= COUNT:
                raise Refused("ROTATOR_BADTOKEN")


def batch_of(token: bytes) -> bytes | None:
    """`*<deadline>.1.<call seq>` of a first delivery's token, None for a later delivery."""
    star = token.find(b"*", 1)
    if not re.match(rb"\d+\.1\.\d{6}", token[star + 1 :]):
        return None
    return b"*" + token[star + 1 : -5]


def packed_parts(element: bytes) -> tuple[bytes, list[bytes]] | None:
    """`(batch, ids)` of an element that starts with `*` and has a second `*`, else None."""
    star = element.find(b"*", 1)
    if not element.startswith(b"*") or star < 0:
        return None
    return element[:star], [i for i in element[star + 1 :].split(b"*") if i]


def unpacked(ring: list[bytes]) -> list[bytes]:
    """The ring with each packed batch written out as the leases it stands for."""
    out: list[bytes] = []
    for element in ring:
        parts = packed_parts(element)
        if parts is not None and _BATCH.fullmatch(parts[0]):
            batch, ids = parts
            out += [job_id + batch + b"%05d" % k for k, job_id in enumerate(ids, 1)]
        else:
            out.append(element)
    return out


def own_deadline(element: bytes) -> int | None:
    """The deadline a well-formed lease or packed batch was made with, else None."""
    parts = packed_parts(element)
    if parts is None:
        lease = parse_lease(element)
        return lease[1] if lease is not None else None
    header = _BATCH.fullmatch(parts[0])
    if header is None or len(header[1]) > 15 or len(parts[0]) > STAMP_BYTES or not parts[1]:
        return None
    return int(header[1])


def split_times(args: list[bytes]) -> tuple[list[bytes], list[tuple[bytes, int]]]:
    """The processing times a next or an ack may carry as its last argument,
    `#<total ms>,<bucket>:<count>,...` (no token starts with "#" and lacks a "*"): the
    arguments without them, and the histogram's adds (none without them). COUNT as
    `durations` takes it (the header: "as durations takes them"), at most RATE_JOBS."""
    if not args or not args[-1].startswith(b"#") or b"*" in args[-1]:
        return args, []
    found = _TIMES.fullmatch(args[-1])
    if found is None:
        raise Refused("ROTATOR_BADARG")
    adds = [(b"dsum", int(found[1]))]
    for bucket, count in _TIMES_BUCKET.findall(found[2]):
        if int(bucket) >= DURATION_BUCKETS or not 1 <= int(count) <= RATE_JOBS:
            raise Refused("ROTATOR_BADARG")
        adds.append((b"d%d" % int(bucket), int(count)))
    return args[:-1], adds


def check_ids(ids: list[bytes]) -> None:
    if len(ids) > BATCH:
        raise Refused("ROTATOR_TOOMANY")
    if not all(valid_id(job_id) for job_id in ids):
        raise Refused("ROTATOR_BADID")


def int_arg(value: object, low: int, high: int) -> int:
    raw = value if isinstance(value, bytes) else str(value).encode()
    if not re.fullmatch(rb"\d{1,15}", raw) or not low <= int(raw) <= high:
        raise Refused("ROTATOR_BADARG")
    return int(raw)


@dataclass
class Schedule:
    """A recurring schedule: the meta field "schedule:<name>"
    ("<job_id>*<last tick ms>*<every ms>*<due,due,...>*<spec>"); its next tick is the member
    "*<name>" of the scheduled set, kept in RotatorModel.scheduled."""

    job_id: bytes
    last: int  # the last tick's ms, 0 before one
    every: int  # ms between ticks; 0: ticks at `dues`
    dues: list[int]  # due times after the last tick, ascending
    spec: bytes

    def field(self) -> bytes:
        dues = b",".join(b"%d" % due for due in self.dues)
        return b"%s*%d*%d*%s*%s" % (self.job_id, self.last, self.every, dues, self.spec)

    def next_tick(self, due: int, after: int) -> int | None:
        """The first tick after `after`: for an interval, the first of due + k * every beyond
        it; for due times, the first given beyond it (those passed are dropped)."""
        if self.every > 0:
            # (float division and floor, as the module computes it)
            return due + self.every * (math.floor((after - due) / self.every) + 1)
        self.dues = [d for d in self.dues if d > after]
        return self.dues[0] if self.dues else None


@dataclass(frozen=True)
class Tick:
    """Bookkeeping: one tick a claim made (the job `job_id` pushed for it)."""

    name: bytes
    ms: int  # the tick's due time, in the job's id
    now: int  # when the claim made it
    claim: int  # which claim (RotatorModel.claims) made it
    job_id: bytes


@dataclass
class Walk:
    """One walk over the tail of the ring (a `next` or `sweep` call)."""

    now: int
    deadline: int
    max_deliveries: int
    sweeping: bool
    live: int
    lapnext: int
    lapguess: bool
    seq_base: int = 0
    packed: int = 0  # jobs in packed elements beyond one per element
    count: int = 0
    visited: int = 0
    leased: int = 0
    released: int = 0  # later deliveries handed out by this call
    expanded: int = 0  # leases of broken-up batches: they count against the budget too
    revokes: int = 0  # tokens (and batches) this call revoked
    soonest: int | None = None
    batch: list[bytes] = field(default_factory=list)  # this call's first deliveries
    batch_bytes: int = 0  # the bytes of their ids
    reply: list[Any] = field(default_factory=list)
    # The lease list: its length when the call began, the elements taken from its tail, those
    # put back there and those pushed at its head (in order), the earliest deadline pushed.
    ring_length: int = 0
    lease_length: int = 0
    lease_visited: int = 0
    back: list[bytes] = field(default_factory=list)
    to_leases: list[bytes] = field(default_factory=list)
    pushed_min: int | None = None
    back_young: int | None = None
    leases_walk: bool = False  # visiting the lease list (not the ring)
    in_place: bool = False  # what the lease walk keeps goes back to the tail, in its place
    lease_more: bool = False  # the lease walk stopped for want of room, budget or bytes
    ring_live: int = 0  # the ring's length while the lease walk runs
    lmin_before: int | None = None  # meta lmin when the call began
    lease_ms: int = 0  # the claim's LEASE_MS
    lease_max_before: int | None = None  # meta lease_max when the call began
    moved: int = 0  # deferred jobs the lease walk moved to the ring
    aged: bool = False  # the acks and marks aged in this call (once a call at most)


@dataclass
class RotatorModel:
    now: int
    ring: list[bytes] = field(default_factory=list)  # head first, like LRANGE 0 -1
    leases: list[bytes] = field(default_factory=list)  # the lease list, head first
    done: set[bytes] = field(default_factory=set)
    done_old: set[bytes] = field(default_factory=set)
    marks: dict[bytes, bytes] = field(default_factory=dict)
    marks_old: dict[bytes, bytes] = field(default_factory=dict)
    revoked: dict[bytes, int] = field(default_factory=dict)
    dead: list[bytes] = field(default_factory=list)
    wake: int = 0  # LLEN of the wake list
    pushlog: list[tuple[int, int]] = field(default_factory=list)  # (pushed, ms), newest first
    seq: int = 0
    seeded: bool = False  # a new queue's seq starts at the server's time (module: read_meta)
    origin: int = 0  # the first seq of the queue: tokens from before are refused
    lapnext: int | None = None
    lapguess: bool = False
    qstart: int | None = None
    qlen: int | None = None  # ring length at qstart: visits needed before an idle reply
    qmin: int | None = None
    pushed: int = 0
    taken: int = 0
    packed: int = 0  # meta "packed": jobs in packed elements beyond one per element
    # The lease list's walk (meta lmin lstop lpass lskip rpasses lpasses): see the module.
    lmin: int | None = None
    lstop: int | None = None
    lpass: int | None = None
    lskip: int | None = None
    rpasses: int = 0
    lpasses: int = 0
    issued: set[bytes] = field(default_factory=set)  # every token the server handed out
    # push_later's jobs (KEYS[12]: id -> due ms), meta smin (no later than the earliest due
    # time, None when nothing is scheduled) and meta paused.
    # The same set holds the jobs waiting at a priority level, "*<level>*<id>" scored below 0
    # ((level - 10) * PRIO_SPAN + push order), and those scheduled at one (by due ms).
    scheduled: dict[bytes, int] = field(default_factory=dict)
    smin: int | None = None
    prio: int = 0  # meta prio: the jobs waiting at a priority level
    pseq: int = 0  # meta pseq: their push order so far
    paused: bool = False
    # The recurring schedules by name (meta "schedule:<name>"); each one's next tick is the
    # member "*<name>" of `scheduled`. Meta `schedules` and `ticking` are their counts.
    schedule_defs: dict[bytes, Schedule] = field(default_factory=dict)
    # The rate limit (meta rate_n rate_ms; None: no limit) and its cell rate's theoretical
    # arrival time (meta rate_tat: a float, as Lua computes it).
    rate_n: int | None = None
    rate_ms: int | None = None
    rate_tat: float | None = None
    # Counts since the queue was made (meta completed redelivered reclaimed retried lettered;
    # pushed and taken are above), and the histogram's meta fields that exist (d0..d25, dsum).
    completions: int = 0
    redelivered: int = 0
    reclaimed: int = 0
    retried: int = 0
    lettered: int = 0
    # Meta `cancelled`: this queue never tracks ids (TrackedIds models one that does), so it
    # stays 0; stats answers it all the same.
    cancelled: int = 0
    histogram: dict[bytes, int] = field(default_factory=dict)
    # Bookkeeping for the test, not part of the queue.
    pushed_ids: Counter[bytes] = field(default_factory=Counter)  # valid ids that entered the ring
    promoted: Counter[bytes] = field(default_factory=Counter)  # of them, from the schedule
    completed: Counter[bytes] = field(default_factory=Counter)  # acked elements removed, by id
    delivered: Counter[bytes] = field(default_factory=Counter)  # deliveries handed out, by id
    laps: int = 0  # sentinel visits
    ages: int = 0  # times the acks and marks aged
    acked_at: dict[bytes, int] = field(default_factory=dict)  # token -> ages when last acked
    claims: int = 0  # next calls
    ticks: list[Tick] = field(default_factory=list)  # every tick a claim made, in order
    # (ms, jobs) of each claim that leased under the rate limit since it was last set.
    rate_log: list[tuple[int, int]] = field(default_factory=list)
    held_wait: int | None = None  # the last claim's wait_ms when the rate limit held it
    # The longest LEASE_MS of a claim that leased nothing (meta lease_max): an idle consumer
    # waits at most its own, so only a shorter lease may fall due while one waits.
    lease_max: int | None = None

    # -- commands -------------------------------------------------------------------------

    def push(self, ids: list[bytes]) -> int:
        check_ids(ids)
        if not ids:
            return 0
        self._seed()
        self._ensure_ring()
        lapnext = self.lapnext
        if len(self.ring) == 1 and lapnext == self.seq + 1 and not self.lapguess:
            # Onto a ring of its sentinel alone (by the lap's numbers): ahead of it, at the
            # tail, in push order; the lap ends as many visits later.
            self.ring.extend(reversed(ids))
            self.lapnext = lapnext + len(ids)
        else:
            self.ring[:0] = reversed(ids)
        self.pushed_ids.update(ids)
        self._record_push(len(ids))
        return len(ids)

    def next(
        self,
        count: object,
        lease: object,
        budget: object,
        max_deliveries: object,
        acks: list[bytes],
    ) -> list[Any]:
        """A claim; processing times after the acks (split_times) go to the histogram."""
        acks, times = split_times(acks)
        reply = self._claim(count, lease, budget, max_deliveries, acks)
        self._add(times)
        # An idle consumer waits at most its own lease time (see _note_leases).
        lease_ms = int_arg(lease, 1, LEASE_MS)
        if reply[1] < 0 or reply[1] > lease_ms:
            reply[1] = lease_ms
        return reply

    def _claim(
        self,
        count: object,
        lease: object,
        budget: object,
        max_deliveries: object,
        acks: list[bytes],
    ) -> list[Any]:
        n = int_arg(count, 1, COUNT)
        lease_ms = int_arg(lease, 1, LEASE_MS)
        limit = int_arg(budget, 1, BUDGET)
        most = int_arg(max_deliveries, 0, 1_000_000)
        check_tokens(acks, required=False, batches=True)
        self.claims += 1
        self.held_wait = None
        if self.paused:
            return self._held(acks, -1, lease_ms)
        if self.smin is not None and self.smin <= self.now:
            self._promote()
        if self.rate_n is None:
            return self._lease_now(n, lease_ms, limit, most, acks)
        allowed, wait, tat, step = self.rate_allowance(self.now)
        if allowed < 1:
            self.held_wait = wait
            return self._held(acks, wait, lease_ms)
        reply = self._lease_now(min(n, allowed), lease_ms, limit, most, acks)
        leased = (len(reply) - 3) // 2
        if leased > 0:
            self.rate_tat = tat + leased * step
            self.rate_log.append((self.now, leased))
        return reply

    def _held(self, acks: list[bytes], wait_ms: int, lease_ms: int) -> list[Any]:
        """A claim that may lease nothing (paused, or at the rate limit): it takes its acks
        and idles for wait_ms; wake-ups would only spin the idle consumers."""
        acked = self._ack_tokens(acks)
        self.wake = 0
        self._raise_lease_max(lease_ms)
        return [1, wait_ms, acked]

    def _raise_lease_max(self, lease_ms: int) -> None:
        """A claim that leased nothing: its consumer may wait its lease time (see
        _note_leases)."""
        if self.lease_max is None or lease_ms > self.lease_max:
            self.lease_max = lease_ms

    def rate_allowance(self, now: int) -> tuple[int, int, float, float]:
        """The generic cell rate at `now`: (jobs a claim may lease, ms until one more may go,
        the theoretical arrival time, ms per job), in the module's float arithmetic."""
        assert self.rate_n is not None
        assert self.rate_ms is not None
        step = self.rate_ms / self.rate_n
        tat = max(self.rate_tat if self.rate_tat is not None else now, now)
        per = self.rate_ms

        def allowed_at(t: float) -> int:
            return math.floor((t + per - tat) / step + 1e-9)

        wait = max(math.ceil(tat + step - per - now), 1)
        while allowed_at(now + wait) < 1:
            wait += 1
        return max(allowed_at(now), 0), wait, tat, step

    def _lease_now(
        self, n: int, lease_ms: int, limit: int, most: int, acks: list[bytes]
    ) -> list[Any]:
        """next's work once the queue may lease: the walk."""
        walk = self._start_walk(lease_ms, most)
        length = len(self.ring)
        acked = self._ack_tokens(acks)
        if length == 0 and walk.lease_length == 0:
            return [1, -1 if self.smin is None else max(self.smin - self.now, 1), acked]
        walk.reply = [0, -1, acked]
        if self.qmin is not None and self.qmin <= self.now:
            # Something came due since the last idle lap: look at a whole lap again.
            self.qmin, self.qstart, self.qlen = None, self.seq, length
        self._walk_lists(walk, n, limit)
        self._lease_prioritized(walk)
        self._finish_walk(walk)
        reply = walk.reply
        if walk.leased == 0:
            self._raise_lease_max(lease_ms)
        assert self.qstart is not None
        assert self.qlen is not None
        if walk.leased == 0 and self.seq - self.qstart >= self.qlen and not walk.lease_more:
            self.wake = 0
            reply[0] = 1
        dues = (self.qmin, self.lmin, self.smin)
        soonest = min((t for t in dues if t is not None), default=None)
        if soonest is not None:
            reply[1] = soonest - self.now
        return reply

    def push_later(self, mode: bytes, time: object, ids: list[bytes]) -> int:
        """Schedules ids for `IN` ms from now or `AT` a unix ms (a time passed: due at once);
        an id scheduled already moves. A due time before smin brings smin forward and wakes
        an idle consumer."""
        due = self._due_arg(mode, time)
        check_ids(ids)
        if not ids:
            return 0
        self._schedule(ids, due)
        return len(ids)

    def push_priority(self, level: object, mode: bytes, time: object, ids: list[bytes]) -> int:
        """`push_priority LEVEL IN|AT TIME ID...`: ids wait at LEVEL (1..9) behind the ring's
        pending ids, as members "*<level>*<id>" of the scheduled set, most urgent level first
        and in push order within one; an id given twice in a call waits once, at its first
        place; one waiting at that level already moves to the back of it and is not counted
        (nor pushed again). Due later: scheduled as push_later schedules, keeping its level;
        the reply then counts every id given. A job waiting at the level and scheduled again
        leaves the level for the schedule (the test's SCHEDULE_WAITING_PRIORITIZED_IDS: the
        module does not do so yet): counted as taken, as a cancel of one counts it."""
        lvl = int_arg(level, 1, PRIORITY_LEVELS)
        due = self._due_arg(mode, time)
        check_ids(ids)
        if not ids:
            return 0
        members = [b"*%d*" % lvl + job_id for job_id in ids]
        if due > self.now:
            waiting = [m for m in dict.fromkeys(members) if self.scheduled.get(m, 0) < 0]
            for member in waiting:
                self.pushed_ids[member[3:]] -= 1
            self.prio -= len(waiting)
            self.taken += len(waiting)
            self._schedule(members, due)
            return len(ids)
        self._ensure_ring()
        added = self._rank(members)
        if added:
            self._seed()
            self._record_push(added)
        return added

    def _due_arg(self, mode: bytes, time: object) -> int:
        """push_later's IN|AT TIME: the due ms (at most ten years from now)."""
        if mode not in (b"IN", b"AT"):
            raise Refused("ROTATOR_BADARG")
        ms = int_arg(time, 0, SCHEDULE_MS if mode == b"IN" else NO_BOUND)
        due = self.now + ms if mode == b"IN" else ms
        if due > self.now + SCHEDULE_MS:
            raise Refused("ROTATOR_BADARG")
        return due

    def _schedule(self, members: list[bytes], due: int) -> None:
        self.scheduled.update(dict.fromkeys(members, due))
        if self.smin is None or due < self.smin:
            self.smin = due
            self.wake = min(self.wake + 1, WAKE_TOKENS)

    def _rank(self, members: list[bytes]) -> int:
        """The module's rank: members "*<level>*<id>" wait at their levels, in this order (an
        id given twice at its first place), behind those waiting there; meta pseq moves on by
        every member given, meta prio by those that were not waiting already (new, or
        scheduled at the level until now), which are returned."""
        added = 0
        seen: set[bytes] = set()
        for i, member in enumerate(members, 1):
            if member in seen:
                continue  # given twice in this call: it waits once, at its first place
            seen.add(member)
            score = self.scheduled.get(member)
            if score is None or score >= 0:
                added += 1
                self.pushed_ids[member[3:]] += 1
            self.scheduled[member] = (int(member[1:2]) - 10) * PRIO_SPAN + self.pseq + i
        self.prio += added
        self.pseq += len(members)
        return added

    def ranked(self) -> list[bytes]:
        """The members "*<level>*<id>" of the scheduled set: waiting or scheduled at a level."""
        return sorted(m for m in self.scheduled if _RANKED.fullmatch(m))

    def waiting(self) -> list[bytes]:
        """The members waiting at a priority level, in the order a claim takes them."""
        return [m for _, m in sorted((s, m) for m, s in self.scheduled.items() if s < 0)]

    def schedule(self, args: list[bytes]) -> int:
        """`schedule SET|FILL NAME JOB_ID EVERY_MS SPEC [DUE ...]` (`args`: what follows the
        command's name). A NAME declared again with the same JOB_ID, EVERY_MS and SPEC keeps
        its next and last tick but takes the DUEs given; FILL changes nothing else."""

        def at(i: int) -> bytes | None:
            return args[i] if i < len(args) else None

        mode = at(0)
        if mode not in (b"SET", b"FILL"):
            raise Refused("ROTATOR_BADARG")
        name, job_id, spec = at(1) or b"", at(2) or b"", at(4) or b""
        if len(name) > SCHEDULE_NAME or not _SCHEDULE_NAME.fullmatch(name):
            raise Refused("ROTATOR_BADARG")
        if not valid_id(job_id) or len(job_id) > SCHEDULE_JOB_ID:
            raise Refused("ROTATOR_BADID")
        every = int_arg(at(3), 0, SCHEDULE_MS)
        if len(spec) > SPEC_BYTES:
            raise Refused("ROTATOR_BADARG")
        count = len(args) - 5  # DUEs
        # (the header: SPEC is not optional; an interval takes no DUE, due times 1..1000)
        if count < 0 or (every > 0) != (count == 0) or count > SCHEDULE_DUES:
            raise Refused("ROTATOR_BADARG")
        dues: list[int] = []
        for raw in args[5:]:
            dues.append(int_arg(raw, 0, self.now + SCHEDULE_MS))
            if len(dues) > 1 and dues[-1] <= dues[-2]:
                raise Refused("ROTATOR_BADARG")
        old = self.schedule_defs.get(name)
        same = old is not None and (old.job_id, old.every, old.spec) == (job_id, every, spec)
        if mode == b"FILL" and not same:
            return 0
        if old is None and len(self.schedule_defs) >= SCHEDULES:
            raise Refused("ROTATOR_TOOMANY")
        member = b"*" + name
        current = self.scheduled.get(member)
        d = Schedule(job_id, old.last if old else 0, every, dues, spec)
        next_due = current
        if not same or current is None:
            next_due = self.now + every if every > 0 else None
        if every == 0:
            next_due = d.next_tick(0, d.last)
        self.schedule_defs[name] = d
        if next_due is not None:
            self.scheduled[member] = next_due
            if self.smin is None or next_due < self.smin:
                self.smin = next_due
                self.wake = min(self.wake + 1, WAKE_TOKENS)
        elif current is not None:
            del self.scheduled[member]
        return 0 if same else 1

    def unschedule(self, args: list[bytes]) -> int:
        """Forgets a schedule and its next tick; smin stays (a lower bound still)."""
        name = args[0] if args else b""
        if name not in self.schedule_defs:
            return 0
        del self.schedule_defs[name]
        self.scheduled.pop(b"*" + name, None)
        return 1

    def schedules(self) -> list[Any]:
        reply: list[Any] = []
        for name in sorted(self.schedule_defs):
            d = self.schedule_defs[name]
            next_due = self.scheduled.get(b"*" + name, -1)
            last_due = d.dues[-1] if d.dues else -1
            reply += [name, d.job_id, d.every, d.spec, next_due, d.last, len(d.dues), last_due]
        return reply

    def rate_limit(self, args: list[bytes]) -> int:
        """Sets the limit (its cell rate goes on from where it was), or lifts it (JOBS 0)."""
        jobs = int_arg(args[0] if args else None, 0, RATE_JOBS)
        per = int_arg(args[1] if len(args) > 1 else None, 1, RATE_MS)
        if jobs == 0:
            self.rate_n = self.rate_ms = self.rate_tat = None
        else:
            self.rate_n, self.rate_ms = jobs, per
        self.rate_log = []
        return 1

    def durations(self, args: list[bytes]) -> list[int]:
        """`durations [TOTAL_MS BUCKET COUNT ...]`: every argument checked, then added."""
        if len(args) == 1 or (len(args) > 1 and len(args) % 2 == 0):
            raise Refused("ROTATOR_BADARG")
        adds: list[tuple[bytes, int]] = []
        if args:
            adds.append((b"dsum", int_arg(args[0], 0, NO_BOUND)))
        for i in range(1, len(args), 2):
            bucket = int_arg(args[i], 0, DURATION_BUCKETS - 1)
            adds.append((b"d%d" % bucket, int_arg(args[i + 1], 1, RATE_JOBS)))
        self._add(adds)
        return self.histogram_counts()

    def _add(self, adds: list[tuple[bytes, int]]) -> None:
        for name, n in adds:
            self.histogram[name] = self.histogram.get(name, 0) + n

    def histogram_counts(self) -> list[int]:
        """d0..d25, then dsum (0 where the field is absent), as replies give them: read back
        into Lua numbers, doubles (HINCRBY keeps them exact; a sum beyond 2^53 ms, some
        285,000 years of processing, comes back rounded)."""
        names = [b"d%d" % b for b in range(DURATION_BUCKETS)] + [b"dsum"]
        return [int(float(self.histogram.get(name, 0))) for name in names]

    def untracked(self) -> int:
        """`unique <push command> ...` and `cancel ...` on this queue, which does not track
        ids: refused with ROTATOR_UNTRACKED, nothing written (the test gives valid ids only,
        so which check comes first does not matter)."""
        raise Refused("ROTATOR_UNTRACKED")

    def pause(self) -> int:
        was = self.paused
        self.paused = True
        return 0 if was else 1

    def resume(self) -> int:
        if not self.paused:
            return 0
        self.paused = False
        self.wake = WAKE_TOKENS
        return 1

    def next_packed(
        self,
        count: object,
        lease: object,
        budget: object,
        max_deliveries: object,
        acks: list[bytes],
    ) -> list[Any]:
        """`next`, with the call's first deliveries as their packed element (job k's token is
        `<id k><batch><k as 5 digits>`), then the later deliveries."""
        reply = self.next(count, lease, budget, max_deliveries, acks)
        pairs = list(zip(reply[3::2], reply[4::2], strict=True))
        first = [token for token, _ in pairs if parse_lease(token)[2] == 1]  # type: ignore[index]
        packed = b""
        if first:
            batch = first[0][first[0].index(b"*") : -5]
            packed = batch + b"*" + b"*".join(token[: token.index(b"*")] for token in first)
            assert first == unpacked([packed]), "the batch's tokens are its places, in order"
        later = [part for token, flag in pairs if token not in first for part in (token, flag)]
        return [*reply[:3], packed, *later]

    def ack(self, tokens: list[bytes]) -> int:
        tokens, times = split_times(tokens)
        check_tokens(tokens, required=True, batches=True)
        acked = self._ack_tokens(tokens)
        self._add(times)
        return acked

    def nack(self, delay: object, tokens: list[bytes]) -> list[int]:
        delay_ms = int_arg(delay, 0, LEASE_MS)
        check_tokens(tokens, required=True)
        alive = self._live_tokens(tokens)
        due = self.now + delay_ms
        reply = []
        touched: list[bytes] = []
        given: list[bytes] = []
        for token in tokens:
            if token in alive:
                alive.discard(token)  # a token given twice is requeued once
                self.marks[token] = b"n%d" % due
                self.marks_old.pop(token, None)
                self.revoked[token] = self.now
                given.append(token)
                batch = batch_of(token)
                if batch is not None:  # no more whole-batch acks; its element is broken up
                    self.revoked[batch] = self.now
                    touched.append(batch)
                reply.append(1)
            else:
                reply.append(0)
        self._touch(touched)
        if given:
            self.retried += len(given)
            self.qmin = due if self.qmin is None else min(self.qmin, due)
            self.lmin = due if self.lmin is None else min(self.lmin, due)
            if self._frees_tail(given):
                self.lstop = None
            self.qstart, self.qlen = self.seq, len(self.ring)
            self.wake = min(self.wake + 1, WAKE_TOKENS)
        return reply

    def bury(self, error: bytes, tokens: list[bytes]) -> list[int]:
        """Marks live leases `f<error>` and revokes them (with their batch), as nack does;
        the walk that reaches one dead-letters it (_visit_stamped)."""
        if len(error) > MAX_ERROR_BYTES:
            raise Refused("ROTATOR_BADARG")
        check_tokens(tokens, required=True)
        alive = self._live_tokens(tokens)
        reply = []
        buried: list[bytes] = []
        touched: list[bytes] = []
        for token in tokens:
            if token not in alive:
                reply.append(0)
                continue
            alive.discard(token)  # a token given twice is buried once
            self.marks[token] = b"f" + error
            self.marks_old.pop(token, None)
            self.revoked[token] = self.now
            batch = batch_of(token)
            if batch is not None and batch not in touched:
                self.revoked[batch] = self.now
                touched.append(batch)
            buried.append(token)
            reply.append(1)
        self._touch(touched)
        if buried:
            self.lmin = self.now if self.lmin is None else min(self.lmin, self.now)
            if self._frees_tail(buried):
                self.lstop = None
        return reply

    def extend(self, lease: object, tokens: list[bytes]) -> list[int]:
        lease_ms = int_arg(lease, 1, LEASE_MS)
        check_tokens(tokens, required=True)
        alive = self._live_tokens(tokens)
        deadline = self.now + lease_ms
        reply = [deadline]
        touched: list[bytes] = []
        for token in tokens:
            if token in alive:
                self.marks[token] = b"e%d" % deadline
                self.marks_old.pop(token, None)
                batch = batch_of(token)
                if batch is not None:
                    touched.append(batch)
            reply.append(1 if token in alive else 0)
        self._touch(touched)
        if alive and (self.lmin is None or deadline < self.lmin):
            self.lmin = deadline  # a shortened lease may be the next thing due
        return reply

    def sweep(self, budget: object) -> list[int]:
        limit = int_arg(budget, 1, BUDGET)
        walk = self._start_walk(0, 0)
        length = len(self.ring)
        if length == 0 and walk.lease_length == 0:
            return [0, 0, 0]
        walk.sweeping = True
        packed = walk.packed
        self._walk_lists(walk, 1, limit)
        # A sweep leases nothing: what it passed may still be pending, so the quiet lap
        # starts again.
        self.qstart, self.qlen = self.seq + walk.visited, walk.live
        self._finish_walk(walk)
        before = length + walk.lease_length + packed
        after = max(walk.live, 0) + len(self.leases) + walk.packed
        return [
            walk.visited + walk.lease_visited,
            max(before - after, 0),
            max(after - (1 if walk.live > 0 else 0), 0),
        ]

    def stats(self) -> list[Any]:
        length = max(len(self.ring) - 1, 0) + len(self.leases) + self.packed + self.prio
        pending = max(0, min(length, self.pushed - self.taken))
        acked = self._acked_waiting()
        deferred = sum(
            mark.startswith(b"n")
            for marks in (self.marks, self.marks_old)
            for mark in marks.values()
        )
        overdue, capped = self._overdue()
        in_flight = max(0, length - pending - acked - deferred - overdue)
        oldest = -1
        if pending > 0:
            # The oldest checkpoint whose cumulative push count exceeds what was taken (the
            # newest one's count is `pushed`: the pushes of its second since did not write it).
            found = [
                ms
                for i, (pushed, ms) in enumerate(self.pushlog)
                if (self.pushed if i == 0 else pushed) > self.taken
            ]
            if found:
                oldest = max(0, self.now - found[-1])
        return [
            *(b"length", length, b"pending", pending, b"in_flight", in_flight),
            *(b"done", acked, b"deferred", deferred, b"dead", len(self.dead)),
            *(b"oldest_pending_age_ms", oldest),
            *(b"overdue", overdue, b"overdue_capped", int(capped)),
            *(b"scheduled", max(len(self.scheduled) - self.ticking() - self.prio, 0)),
            *(b"paused", int(self.paused)),
            *(b"schedules", len(self.schedule_defs)),
            *(b"rate_limit_jobs", self.rate_n or 0, b"rate_limit_ms", self.rate_ms or 0),
            *(b"pushed", self.pushed, b"delivered", self.taken + self.redelivered),
            *(b"completed", self.completions, b"retried", self.retried),
            *(b"reclaimed", self.reclaimed, b"dead_lettered", self.lettered),
            *(b"cancelled", self.cancelled, b"prioritized", self.prio),
            *(x for b, n in enumerate(self.histogram_counts()[:-1]) for x in (b"d%d" % b, n)),
            *(b"dsum", self.histogram_counts()[-1]),
        ]

    def ticking(self) -> int:
        """Schedules with a next tick (meta ticking): their members are no jobs."""
        return sum(m.startswith(b"*") and not _RANKED.fullmatch(m) for m in self.scheduled)

    def _overdue(self) -> tuple[int, bool]:
        """The module's overdue: expired leases from the lease list's tail up to its first
        young one, at most OVERDUE_LOOK elements, BATCH_BYTES bytes and COUNT tokens."""
        names: list[tuple[bytes, bytes | None]] = []  # (token, its batch)
        batches: list[bytes] = []
        seen = read = 0
        young = capped = False
        for element in reversed(self.leases[-OVERDUE_LOOK:]):
            parts = packed_parts(element)
            deadline = own_deadline(element)
            if deadline is not None and deadline > self.now:
                young = True
                break
            ids = parts[1] if deadline is not None and parts is not None else []
            if read + len(element) > BATCH_BYTES or len(names) + len(ids) + 1 > COUNT:
                capped = True
                break
            seen, read = seen + 1, read + len(element)
            if deadline is not None and parts is not None:
                batches.append(parts[0])
                names += [(i + parts[0] + b"%05d" % k, parts[0]) for k, i in enumerate(ids, 1)]
            elif deadline is not None:
                names.append((element, None))
        if not young and not capped and seen < len(self.leases):
            capped = True
        acked_whole = {b for b in batches if (self._batch_mark(b)[0] or b"").startswith(b"a")}
        overdue = 0
        for token, batch in names:
            marks = [m[token] for m in (self.marks, self.marks_old) if token in m]
            gone = (
                token in self.done
                or token in self.done_old
                or any(m.startswith((b"n", b"f")) for m in marks)
                or any(m.startswith((b"e", b"w")) and int(m[1:]) > self.now for m in marks)
            )
            if not gone and batch not in acked_whole:
                overdue += 1
        return overdue, capped

    def peek(self, count: object) -> list[Any]:
        n = int_arg(count, 1, COUNT)
        rows: list[bytes] = []
        batch_acked: set[int] = set()
        for elements, first in ((self.ring, True), (self.leases, False)):
            room = n if first else n - len(rows)
            if room <= 0:
                break
            found = 0
            for element in reversed(elements[-room:]):
                parts = packed_parts(element)
                if parts is not None and _BATCH.fullmatch(parts[0]):
                    batch, ids = parts
                    acked = (self._batch_mark(batch)[0] or b"").startswith(b"a")
                    for k, job_id in enumerate(ids, 1):
                        if acked:
                            batch_acked.add(len(rows))
                        rows.append(job_id + batch + b"%05d" % k)
                        found += 1
                else:
                    rows.append(element)
                    found += 1
                if found >= room:
                    break
        reply: list[Any] = []
        for i, element in enumerate(rows[:n]):
            state, at = b"pending", 0
            if element == SENTINEL:
                state = b"lap"
            elif not valid_id(element):
                lease = parse_lease(element)
                mark = self._mark_of(element)[0]
                when = _MARK.fullmatch(mark) if mark else None
                if lease is None:
                    state = b"corrupt"
                elif element in self.done or element in self.done_old or i in batch_acked:
                    state = b"done"
                elif when and when[1] == b"n":
                    state, at = b"deferred", int(when[2])
                elif mark is not None and mark.startswith(b"f"):
                    state = b"buried"
                else:
                    state, at = b"leased", int(when[2]) if when else lease[1]
            reply += [element, state, at]
        return reply

    def requeue_dead(self, count: object, ids: list[bytes]) -> int:
        most = int_arg(count, 1, BATCH)
        check_ids(ids)
        wanted = set(ids) if ids else None
        letters = self.dead[:BUDGET]
        found: list[bytes] = []
        kept: list[bytes] = []
        reasons: list[bytes] = []
        for letter in letters:
            job_id = dead_letter_id(letter) if len(found) < most else None
            if job_id is not None and (wanted is None or job_id in wanted):
                found.append(job_id)
                reasons.append(letter.split(b"*", 1)[0])
            else:
                kept.append(letter)
        if not found:
            return 0
        self.dead[: len(letters)] = kept
        self._ensure_ring()
        self.ring[:0] = reversed(found)
        # A corrupt element's id becomes a job here: for the accounting it is a new push.
        self.pushed_ids.update(
            i for i, why in zip(found, reasons, strict=True) if why == b"corrupt"
        )
        self._record_push(len(found))
        return len(found)

    def adopt(self, expected: bytes, token: bytes) -> None:
        """The server's token for a delivery the model handed out as `expected`."""
        assert token == expected, (token, expected)
        assert token not in self.issued, f"token {token!r} was issued twice"
        self.issued.add(token)

    # -- outside the contract: an admin writing the ring -----------------------------------

    def raw_lpush(self, *elements: bytes) -> None:
        self.ring[:0] = reversed(elements)

    # -- helpers --------------------------------------------------------------------------

    def _promote(self) -> None:
        """The due members of the scheduled set (at most PROMOTE, earliest first, ties by
        bytes) leave it. A job id goes to the ring; a schedule's member ticks: one job
        "<job_id>@<tick ms>" however many ticks were missed, and the member moves to the
        schedule's first tick after now (none: due times ran out); a job scheduled at a
        priority level waits at it, behind the jobs waiting there, in the order found. The
        ids go to the ring as a push of them does, the jobs before the ticks, and the push
        counts them with those now waiting; smin becomes the earliest due time left."""
        due = sorted((at, m) for m, at in self.scheduled.items() if 0 <= at <= self.now)
        due = due[:PROMOTE]
        ranked = [member for _, member in due if _RANKED.fullmatch(member)]
        for _, member in due:
            if not _RANKED.fullmatch(member):
                del self.scheduled[member]
        ids = [member for _, member in due if not member.startswith(b"*")]
        self.promoted.update(ids)
        for at, member in due:
            d = self.schedule_defs.get(member[1:]) if member.startswith(b"*") else None
            if d is None:
                continue
            job_id = d.job_id + b"@%d" % at
            ids.append(job_id)
            self.ticks.append(Tick(member[1:], at, self.now, self.claims, job_id))
            d.last = at
            next_due = d.next_tick(at, self.now)
            if next_due is not None:
                self.scheduled[member] = next_due
        if ids or ranked:
            self._seed()
            self._ensure_ring()
            self.ring[:0] = reversed(ids)
            self.pushed_ids.update(ids)
            self._rank(ranked)
            self._record_push(len(ids) + len(ranked))
        self.smin = min((at for at in self.scheduled.values() if at >= 0), default=None)

    def _ensure_ring(self) -> None:
        if not self.ring:
            self.ring = [SENTINEL]
            self.lapnext = None

    def _record_push(self, n: int) -> None:
        self.pushed += n
        head_ms = self.pushlog[0][1] if self.pushlog else None
        # A push within the newest checkpoint's second writes no checkpoint: that one's count
        # is `pushed`. One that starts a checkpoint drops a few fully consumed ones.
        if head_ms is None or not 0 <= self.now - head_ms < PUSHLOG_BUCKET_MS:
            self.pushlog.insert(0, (self.pushed, self.now))
            for _ in range(4):
                if not self.pushlog or self.pushlog[-1][0] > self.taken:
                    break
                self.pushlog.pop()
        self.qstart, self.qlen = self.seq, len(self.ring)
        self.wake = min(self.wake + min(n, WAKE_TOKENS), WAKE_TOKENS)

    def _ack_tokens(self, args: list[bytes]) -> int:
        """Tokens go into the done set and touch their batch; a batch ack marks its batch
        `a<jobs>` (refused, like a token, once its batch was revoked, and once the batch was
        touched before the call: a job of it acked, given back or extended alone)."""
        if not args or not (self.ring or self.leases):
            return 0
        accepted: list[bytes] = []
        for arg in dict.fromkeys(args):  # given twice, counted once
            if not self._fenced(arg) and self._issued(arg) and not self._touched(arg):
                accepted.append(arg)
        tokens = [a for a in accepted if not a.startswith(b"*")]
        self.done |= set(tokens)
        self.acked_at.update(dict.fromkeys(tokens, self.ages))
        batches = []
        for arg in accepted:
            if arg.startswith(b"*"):
                batch, _, jobs = arg.partition(b"/")
                self.marks[batch] = b"a" + jobs
                batches.append(batch)
        self._touch([b for b in map(batch_of, tokens) if b is not None])
        if self._frees_tail(tokens + batches):
            self.lstop = None
        return len(accepted)

    def _frees_tail(self, tokens: list[bytes]) -> bool:
        """Whether one of these tokens (or batch names) may be the young lease the lease
        list's walk stopped at (it has its deadline): the walk may go on."""
        if self.lstop is None:
            return False
        for token in tokens:
            found = _TOKEN_DEADLINE.search(token)
            if found is not None and found[1] == b"%d" % self.lstop:
                return True
        return False

    def _fenced(self, arg: bytes) -> bool:
        """Whether a token (or batch ack) was revoked: by its own name, or (a first delivery,
        a batch ack) by its batch's expiry, `<batch>*` (the module's refused_among)."""
        batch = arg.split(b"/")[0] if arg.startswith(b"*") else batch_of(arg)
        name = batch if arg.startswith(b"*") else arg
        return name in self.revoked or (batch is not None and batch + b"*" in self.revoked)

    def _touched(self, arg: bytes) -> bool:
        """Whether `arg` is a batch ack of a batch marked touched (`t`) in either generation
        (the module's refuse_touched): acking it whole could count a job twice."""
        batch = arg.split(b"/")[0]
        return arg.startswith(b"*") and b"t" in (self.marks.get(batch), self.marks_old.get(batch))

    def _issued(self, arg: bytes) -> bool:
        """Whether this queue could have issued the token (or batch ack): its call seq is in
        origin <= seq < seq (the module's refused_among)."""
        if arg.startswith(b"*"):
            found = re.match(rb"^\*\d+\.1\.(\d+)/", arg)
            call = int(found[1]) if found else None
        else:
            digits = re.search(rb"\.(\d+)$", arg)
            head = digits[1][:-5] if digits else b""
            call = int(head) if head else None
        return call is not None and self.origin <= call < self.seq

    def _touch(self, batches: list[bytes]) -> None:
        for batch in batches:
            self.marks.setdefault(batch, b"t")

    def _live_tokens(self, tokens: list[bytes]) -> set[bytes]:
        if not self.ring and not self.leases:
            return set()
        alive = {
            t
            for t in tokens
            if not self._fenced(t)
            and self._issued(t)
            and t not in self.done
            and t not in self.done_old
            and not self._batch_acked(t)
        }
        if FENCE_TOKENS_NOT_IN_RING:
            alive &= set(unpacked(self.ring))
        return alive

    def _batch_acked(self, token: bytes) -> bool:
        batch = batch_of(token)
        return batch is not None and any(
            marks.get(batch, b"").startswith(b"a") for marks in (self.marks, self.marks_old)
        )

    def _mark_of(self, element: bytes) -> tuple[bytes | None, dict[bytes, bytes] | None]:
        for marks in (self.marks, self.marks_old):
            if element in marks:
                return marks[element], marks
        return None, None

    def _batch_mark(self, batch: bytes) -> tuple[bytes | None, dict[bytes, bytes] | None]:
        """A packed element's mark: a batch ack wins over a touch, in either generation."""
        found: tuple[bytes | None, dict[bytes, bytes] | None] = (None, None)
        for marks in (self.marks, self.marks_old):
            mark = marks.get(batch)
            if mark is not None and (
                found[0] is None or (mark.startswith(b"a") and not found[0].startswith(b"a"))
            ):
                found = (mark, marks)
        return found

    def _start_walk(self, lease_ms: int, max_deliveries: int) -> Walk:
        length = len(self.ring)
        if length or self.leases:
            self._seed()  # an empty queue's call writes nothing, so its seed is not kept
        if self.qlen is None:
            self.qlen = length
        if self.qstart is None:
            self.qstart = self.seq
        return Walk(
            now=self.now,
            deadline=self.now + lease_ms,
            max_deliveries=max_deliveries,
            sweeping=False,
            live=length,
            lapnext=self.lapnext if self.lapnext is not None else self.seq + length + 1,
            lapguess=self.lapguess or self.lapnext is None,
            seq_base=self.seq,
            packed=self.packed,
            ring_length=length,
            lease_length=len(self.leases),
            lmin_before=self.lmin,
            lease_ms=lease_ms,
            lease_max_before=self.lease_max,
        )

    def _seed(self) -> None:
        if not self.seeded:
            self.seq = self.origin = self.now
            self.seeded = True

    def _walk_lists(self, w: Walk, count: int, budget: int) -> None:
        """The lease list's walk when it is due, then the ring's, within one budget."""
        w.count = count
        if self._leases_due(w):
            self._walk_leases(w, budget)
        left = budget - w.lease_visited
        self._walk(w, count, min(left, w.ring_length), left)

    def _lease_prioritized(self, w: Walk) -> None:
        """After the ring's walk, the jobs waiting at a priority level join the call's batch
        (the most urgent level first, in push order within one) while the call has room, once
        no pending id is left in the ring: the counters say none is (pushed - taken - prio),
        or this walk visited the whole ring as it was (the module's lease_prioritized)."""
        if self.prio <= 0 or w.sweeping or w.leased >= w.count:
            return
        if self.pushed - self.taken - self.prio > 0 and w.visited < w.ring_length:
            return
        taken: list[bytes] = []
        for member in self.waiting()[: w.count - w.leased]:
            taken.append(member)
            found = _RANKED.fullmatch(member)
            if found is None or not valid_id(found[2]):  # (only by hand)
                self.dead.append(b"corrupt*0*%d*" % w.now + member)
                self.lettered += 1
                continue
            job_id = found[2]
            w.batch.append(job_id)
            w.reply += [job_id + b"*%d.1.%d%05d" % (w.deadline, w.seq_base, len(w.batch)), 0]
            w.leased += 1
            self.delivered[job_id] += 1
            w.batch_bytes += len(job_id)
            if w.batch_bytes >= BATCH_BYTES:
                break
        for member in taken:
            del self.scheduled[member]
        self.taken += len(taken)
        self.prio -= len(taken)

    def _leases_due(self, w: Walk) -> bool:
        """Whether the call walks the lease list (the module's leases_due)."""
        if w.lease_length == 0:
            return False
        if w.sweeping or self.lmin is None or self.lmin <= self.now:
            return True
        if self.lstop is not None:
            return False
        deferred = sum(
            m.startswith(b"n") for marks in (self.marks, self.marks_old) for m in marks.values()
        )
        return self._acked_waiting() + deferred > 0

    def _acked_waiting(self) -> int:
        """Acks waiting for their element: tokens, and the jobs of batch acks."""
        return (
            len(self.done)
            + len(self.done_old)
            + sum(
                int(m[1:] or b"0")
                for marks in (self.marks, self.marks_old)
                for m in marks.values()
                if m.startswith(b"a")
            )
            + sum(  # buried jobs: done with, their letter written when the walk reaches them
                m.startswith(b"f") for marks in (self.marks, self.marks_old) for m in marks.values()
            )
        )

    def _walk_leases(self, w: Walk, budget: int) -> None:
        """The lease list from its tail while what is there is done with or due (the module's
        walk_leases), one element at a time."""
        live, expanded = w.live, w.expanded
        w.leases_walk, w.in_place, w.ring_live, w.moved = True, w.sweeping, live, 0
        skip = self.lskip or 0
        if self.lpass is None or self.lpass <= 0:
            self.lpass, skip = w.lease_length, 0
        stop: int | None = None
        stop_named: int | None = None  # (the deadline its tokens carry: see the module)
        pass_ended = False
        read = 0
        while w.lease_visited < w.lease_length:
            if (
                w.lease_visited + w.expanded - expanded >= budget
                or read > LEASE_BYTES
                or (w.leased >= w.count and not w.sweeping)
                or w.revokes >= REVOKES
            ):
                w.lease_more = True
                break
            element = self.leases[-(w.lease_visited + 1)]
            parts = packed_parts(element)
            stamped = parts is None and b"*" in element[1:]
            done = stamped and (element in self.done or element in self.done_old)
            if parts is not None:
                mark, marks = self._batch_mark(parts[0])
            elif stamped and not done:
                mark, marks = self._mark_of(element)
            else:
                mark, marks = None, None
            gone = done or (
                mark is not None and (mark[:1] in (b"n", b"e", b"f") or parts is not None)
            )
            moved = moved_deadline(mark)
            deadline = None if gone else moved if moved is not None else own_deadline(element)
            if deadline is not None and deadline > w.now and not w.sweeping:
                # lstop names it by the deadline its tokens carry: an ack of it clears lstop
                stop, stop_named = deadline, own_deadline(element)
                break
            w.lease_visited += 1
            read += len(element)
            if deadline is not None and deadline > w.now:
                self._keep(w, element, deadline, mark, marks)  # a sweep: back in its place
            elif done:
                self._visit_stamped(w, element)
            elif parts is not None:
                self._visit_packed(w, element, *parts)
            elif stamped:
                self._visit_stamped(w, element)
            elif element != SENTINEL:
                self._dead_letter(w, b"corrupt", 0, element)
            if skip > 0:
                skip -= 1
            elif not pass_ended:
                self.lpass -= 1
                if self.lpass <= 0:
                    pass_ended = self._end_lease_pass(w)
        if not pass_ended and w.lease_visited == w.lease_length:
            pass_ended = self._end_lease_pass(w)
        w.live, w.leases_walk, w.in_place = live + w.moved, False, False
        if pass_ended:
            left = w.lease_length - w.lease_visited + len(w.back) + len(w.to_leases)
            self.lpass, self.lskip = left, 0
        else:
            self.lskip = len(w.back) + skip
        self.lmin = stop if stop is not None else (w.now if w.lease_more else None)
        self.lstop = stop_named
        if w.back_young is not None and (self.lstop is None or w.back_young < self.lstop):
            self.lstop = w.back_young
            if self.lmin is None or w.back_young < self.lmin:
                self.lmin = w.back_young
        # The visits number this call's tokens like the ring's: the ring's positions move on.
        n = w.lease_visited
        self.seq += n
        w.lapnext += n
        assert self.qstart is not None
        self.qstart += n

    def _end_lease_pass(self, w: Walk) -> bool:
        self.lpasses += 1
        if self._may_age(w):
            self._age(w)
            self.lpasses, self.rpasses = 0, -1
        return True

    def _may_age(self, w: Walk) -> bool:
        if w.aged:
            return False  # once a call
        ring = w.ring_live if w.leases_walk else w.live
        leases_left = w.lease_length - w.lease_visited + len(w.back) + len(w.to_leases)
        return (self.rpasses >= 1 or ring <= 1) and (self.lpasses >= 1 or leases_left == 0)

    def _age(self, w: Walk) -> None:
        """The acks and marks age: whatever the old generation still holds is a leftover."""
        w.aged = True
        self.done_old, self.done = self.done, set()
        self.marks_old, self.marks = self.marks, {}
        self.ages += 1

    def _walk(self, w: Walk, count: int, limit: int, budget: int) -> None:
        w.count = count
        while w.visited < limit and w.visited + w.expanded < budget and w.leased < w.count:
            element = self.ring.pop()  # the tail
            w.visited += 1
            index = self.seq + w.visited
            if index > w.lapnext:
                w.lapnext, w.lapguess = index + w.live, True  # lost track: guess again
            if element == SENTINEL:
                if index < w.lapnext and not w.lapguess:
                    w.live -= 1  # a second sentinel: dropped
                else:
                    self._end_lap(w)
                continue
            if index == w.lapnext:
                # The sentinel is missing: one goes back just before this element.
                w.live += 1
                self._end_lap(w)
                w.lapnext -= 1
            self._visit(w, element)
        assert w.live == len(self.ring), "model: live count drifted from the ring"

    def _visit(self, w: Walk, element: bytes) -> None:
        if b"*" not in element[1:]:  # no stamp: a pending id, or not even that
            if not valid_id(element):
                self.taken += 1  # as the module counts it; only an admin can put one there
                self._dead_letter(w, b"corrupt", 0, element)
            elif w.sweeping:
                self.ring.insert(0, element)
            else:
                # Leased: it joins the call's batch, which goes back as one element.
                self.taken += 1
                w.batch.append(element)
                token = element + b"*%d.1.%d%05d" % (w.deadline, w.seq_base, len(w.batch))
                w.reply += [token, 0]
                w.leased += 1
                w.live -= 1
                self.delivered[element] += 1
                w.batch_bytes += len(element)
                if w.batch_bytes >= BATCH_BYTES:
                    w.count = w.leased  # the batch is big enough: no more this call
            return
        parts = packed_parts(element)
        if parts is not None:
            self._visit_packed(w, element, *parts)
            return
        self._visit_stamped(w, element)

    def _visit_packed(self, w: Walk, element: bytes, batch: bytes, ids: list[bytes]) -> None:
        header = _BATCH.fullmatch(batch)
        mark, marks = self._batch_mark(batch)
        if header is None or len(header[1]) > 15 or len(batch) > STAMP_BYTES or not ids:
            if marks is not None:
                del marks[batch]
            self._dead_letter(w, b"corrupt", 0, element)
            return
        due = int(header[1])
        if mark is None and (due > w.now or w.sweeping):
            self._keep(w, element, due, None, None)
            return
        if mark is not None and mark.startswith(b"a") and mark[1:] == b"%d" % len(ids):
            assert marks is not None  # acked as a whole
            del marks[batch]
            w.live -= 1
            w.packed -= len(ids) - 1
            self.completed.update(ids)
            self.completions += len(ids)
            return
        if mark is None and not w.sweeping and w.count - w.leased >= len(ids):
            # Expired, never touched: every job leased again, one revocation for the batch.
            self.revoked[batch + b"*"] = w.now
            w.revokes += 1
            w.live += len(ids) - 1
            w.packed -= len(ids) - 1
            w.expanded += len(ids)
            for job_id in ids:
                self._lease_again(w, job_id, 1, 1)
            return
        if marks is not None:
            del marks[batch]  # the touch (or a batch ack of another size) is used up
        self.revoked[batch] = w.now
        w.revokes += 1
        w.in_place = w.in_place or (w.leases_walk and due > w.now)
        w.live += len(ids) - 1
        w.packed -= len(ids) - 1
        w.expanded += len(ids)
        for k, job_id in enumerate(ids, 1):
            self._visit_stamped(w, job_id + batch + b"%05d" % k)
        w.in_place = w.sweeping

    def _visit_stamped(self, w: Walk, element: bytes) -> None:
        if element in self.done or element in self.done_old:
            (self.done if element in self.done else self.done_old).discard(element)
            w.live -= 1
            self.completions += 1
            lease = parse_lease(element)
            if lease is not None:
                self.completed[lease[0]] += 1
            return
        mark, marks = self._mark_of(element)
        lease = parse_lease(element)
        if lease is None:
            if marks is not None:
                del marks[element]
            self._dead_letter(w, b"corrupt", 0, element)
            return
        job_id, deadline, n = lease
        if mark is not None and mark.startswith(b"f"):  # buried: its letter, with its error
            assert marks is not None
            del marks[element]
            self._dead_letter(w, b"failed", n, job_id + b"*" + mark[1:])
            return
        when = _MARK.fullmatch(mark) if mark else None
        if when and when[1] in (b"e", b"w"):
            deadline = int(when[2])
        deferred = bool(when and when[1] == b"n")
        due = int(when[2]) if deferred and when else deadline
        if (
            due > w.now
            or w.sweeping
            or w.leased >= w.count
            or (not deferred and w.revokes >= REVOKES)
        ):
            # Extended beyond a lease made now: it waits in the ring, as a nacked job does.
            extended = mark is not None and mark[:1] in (b"e", b"w")
            waits = deferred or (extended and not w.sweeping and due > w.deadline)
            self._keep(w, element, due, mark, marks, waits)
            return
        if marks is not None:
            del marks[element]
        if not deferred:  # a deferred job's copy was never handed out
            self.revoked[element] = w.now
            w.revokes += 1
        if n >= STAMPED_DELIVERIES:
            self._dead_letter(w, b"corrupt", 0, element)
            return
        self._lease_again(w, job_id, n, 0 if deferred else 1)

    def _lease_again(self, w: Walk, job_id: bytes, n: int, reclaimed: int) -> None:
        if w.max_deliveries > 0 and n >= w.max_deliveries:
            self.dead.append(b"max_deliveries*%d*%d*" % (n, w.now) + job_id)
            self.lettered += 1
            w.live -= 1
            return
        # At least 2 (a hand-written lease may say 0): first deliveries are the batch's.
        self._hand_out(w, job_id, max(n, 1) + 1, reclaimed)

    def _keep(  # noqa: PLR0917 (the module's keep, argument for argument)
        self,
        w: Walk,
        element: bytes,
        at: int,
        mark: bytes | None,
        marks: dict[bytes, bytes] | None,
        deferred: bool = False,
    ) -> None:
        """The module's keep: a deferred job at the ring's head; a lease met in the lease list
        back at its tail (due, or kept in place) or at its head (extended); one met in the
        ring to the lease list's head while young, or staying in the ring."""
        if w.leases_walk and not deferred:
            where = "back" if at <= w.now or w.in_place else "head"
        elif not deferred and at > w.now:
            where = "head"
        else:
            where = "ring"
        if where == "ring":
            self.ring.insert(0, element)
            w.soonest = at if w.soonest is None else min(w.soonest, at)
            if w.leases_walk:
                w.moved += 1  # a deferred job, to the ring
        else:
            (w.back if where == "back" else w.to_leases).append(element)
            if where == "back" and at > w.now:
                w.back_young = at if w.back_young is None else min(w.back_young, at)
            w.pushed_min = at if w.pushed_min is None else min(w.pushed_min, at)
            w.live -= 1
        # An extended lease moved to the lease list's head is marked "w": there it waits in
        # deadline order, and the walk stops at it while it is young.
        if mark is not None:
            kept = b"w" + mark[1:] if where == "head" and mark[:1] == b"e" else mark
            if marks is self.marks_old:
                del self.marks_old[element]
                self.marks[element] = kept
            elif kept != mark:
                self.marks[element] = kept

    def _hand_out(self, w: Walk, job_id: bytes, deliveries: int, reclaimed: int) -> None:
        w.released += 1
        token = job_id + b"*%d.%d.%d%05d" % (w.deadline, deliveries, w.seq_base, w.released)
        w.to_leases.append(token)
        w.live -= 1
        w.reply += [token, reclaimed]
        w.leased += 1
        self.delivered[job_id] += 1
        self.redelivered += 1
        self.reclaimed += reclaimed

    def _dead_letter(self, w: Walk, reason: bytes, n: int, element: bytes) -> None:
        self.dead.append(b"%s*%d*%d*" % (reason, n, w.now) + element)
        self.lettered += 1
        w.live -= 1

    def _end_lap(self, w: Walk) -> None:
        """A lap of the ring ends; the acks and marks age if the lease list allows."""
        self.rpasses += 1
        if self._may_age(w):
            self._age(w)
            self.rpasses, self.lpasses = 0, -1
        cutoff = w.now - REVOKED_KEEP_MS
        self.revoked = {t: ms for t, ms in self.revoked.items() if ms >= cutoff}
        self.ring.insert(0, SENTINEL)
        w.lapnext, w.lapguess = self.seq + w.visited + w.live, False
        self.laps += 1

    def _finish_walk(self, w: Walk) -> None:
        if w.batch:
            w.to_leases.append(b"*%d.1.%d*" % (w.deadline, w.seq_base) + b"*".join(w.batch))
            w.packed += len(w.batch) - 1
        if w.ring_length > 0 and w.live <= 0 and not self.ring:
            # The ring had no sentinel and is left empty: it gets one back.
            self.ring = [SENTINEL]
            w.lapnext, w.lapguess = self.seq + w.visited + 1, False
        kept = self.leases[: len(self.leases) - w.lease_visited]
        self.leases = list(reversed(w.to_leases)) + kept + list(reversed(w.back))
        self.packed = max(w.packed, 0)
        self.seq += w.visited
        if w.soonest is not None and (self.qmin is None or w.soonest < self.qmin):
            self.qmin = w.soonest
        self._note_leases(w)
        self.lapnext, self.lapguess = w.lapnext, w.lapguess

    def _note_leases(self, w: Walk) -> None:
        """The earliest deadline the lease list may hold; a wake-up for new leases that fall
        due before anything known, and sooner than an idle consumer may be waiting: shorter
        than the longest lease a claim gave before (the module's note_leases)."""
        lmin = self.lmin
        if w.leased > 0:
            before = w.lmin_before
            if self.qmin is not None and (before is None or self.qmin < before):
                before = self.qmin
            shorter = w.lease_max_before is None or w.lease_ms < w.lease_max_before
            if (before is None or w.deadline < before) and shorter:
                self.wake = min(self.wake + 1, WAKE_TOKENS)
            if lmin is None or w.deadline < lmin:
                lmin = w.deadline
        if w.pushed_min is not None and (lmin is None or w.pushed_min < lmin):
            lmin = w.pushed_min
        before_count = w.lease_length - w.lease_visited + len(w.back)
        if before_count + len(w.to_leases) == 0:
            lmin = None
        if before_count == 0 and w.to_leases:
            # (named by the deadline the tail's tokens carry, as the module's note_leases)
            found = _TOKEN_DEADLINE.search(w.to_leases[0])
            self.lstop = int(found[1]) if found is not None else None
        self.lmin = lmin

    # -- what the invariants ask ----------------------------------------------------------

    def held(self) -> dict[bytes, tuple[bytes, int]]:
        """Leased or deferred elements in either list: token -> (id, when it falls due), the
        acked and the given back left out."""
        found = {}
        for element in unpacked(self.ring + self.leases):
            lease = parse_lease(element)
            if lease is None or element in self.done or element in self.done_old:
                continue
            if self._batch_acked(element):
                continue
            when = _MARK.fullmatch(self._mark_of(element)[0] or b"")
            found[element] = (lease[0], int(when[2]) if when else lease[1])
        return found

    def reachable_dues(self) -> list[int]:
        """When what a claim can reach falls due: the scheduled jobs (promoted once due), the
        ring's stamped elements (deferred jobs), and the lease list's from its tail up to the
        first live lease still young by its own deadline, which stops the walk (the list is in
        deadline order; a lease behind a younger one waits for it, see the README's "How it
        works"). Nacked and extended leases, and marked batches, do not stop it; an extended
        lease moved to the head ("w") stops it by its new deadline."""
        held = self.held()
        dues = [held[e][1] for e in unpacked(self.ring) if e in held]
        for element in reversed(self.leases):
            parts = packed_parts(element)
            if parts is not None:
                marked = self._batch_mark(parts[0])[0] is not None
            else:
                marked = (self._mark_of(element)[0] or b"")[:1] in (b"n", b"e")
            live = [job for job in unpacked([element]) if job in held]
            moved = moved_deadline(self._mark_of(element)[0]) if parts is None else None
            own = moved if moved is not None else own_deadline(element)
            if live and own is not None and own > self.now and not marked:
                dues.append(own)
                break
            dues += [held[job][1] for job in live]
        return dues + [at for at in self.scheduled.values() if at >= 0]

    def takeable_now(self) -> bool:
        """Would a `next` lease something at this instant: a pending id (in the ring, or
        waiting at a priority level), or a due job it can
        reach (see reachable_dues), a due scheduled job or tick among them? Not while paused,
        nor while the rate limit lets no job go."""
        if self.paused:
            return False
        if self.rate_n is not None and self.rate_allowance(self.now)[0] < 1:
            return False
        if self.prio > 0 or any(valid_id(e) for e in self.ring):
            return True
        return any(due <= self.now for due in self.reachable_dues())


def dead_letter_id(letter: bytes) -> bytes | None:
    """The job id inside a dead letter, or None when it holds no valid id."""
    found = _DEAD_LETTER.fullmatch(letter)
    if found is None:
        return None
    job_id = found[1].split(b"*", 1)[0]
    return job_id if valid_id(job_id) else None


# -- a queue that tracks ids (configure track_ids 1, the header's IDS) ---------------------------


@dataclass
class Copy:
    """The one copy a tracked queue holds of an id: waiting in the ring, scheduled (due at
    `due`), or in flight (leased until `due`, or given back by nack and due again at `due`,
    then with no live `token`). A cancelled copy is never delivered again; its id may be
    pushed again at once, as a new copy."""

    state: str  # "waiting", "scheduled" or "flight"
    due: int = 0
    level: int = 0  # its priority level (0: the ring's): waiting or scheduled at it
    token: bytes | None = None  # the live delivery token (flight, not given back)
    deliveries: int = 0
    cancelled: bool = False


@dataclass
class TrackedIds:
    """A tracked queue at the level of its ids, not of its elements: which copy each id has
    and which of its tokens are live. It predicts every reply of push, push_later (at a
    priority level or not), cancel, ack, nack and extend, and the stats `cancelled`,
    `scheduled` and `prioritized`; it does not predict which jobs a claim delivers (its
    budget, the ring's order, when the walk reaches a cancelled element), so the test checks
    each delivery against it (`deliver`) instead.
    Tokens the test's workers gave back (acked, nacked) are no longer used by them."""

    now: int
    copies: dict[bytes, Copy] = field(default_factory=dict)
    # token -> its id, for every token delivered and not given back: live, or revoked (its
    # lease re-issued, or cancelled), see token_state.
    tokens: dict[bytes, bytes] = field(default_factory=dict)
    # Tokens of leases cancelled, recorded under "*<id>" until a walk drops the lease:
    # extend answers -1 for them. True until a walk (next, sweep) may have dropped the lease
    # and forgotten the entry, then None: -1 or 0 (LeaseLost either way).
    cancelled_tokens: dict[bytes, bool | None] = field(default_factory=dict)
    # Leases cancelled in flight: token -> deadline (see swept).
    ghosts: dict[bytes, int] = field(default_factory=dict)
    # Ids with a cancelled element that may still be in the ring or the lease list (until a
    # sweep drops it, a young lease only once due): see the test's SCHEDULE_CANCELLED_IDS.
    lingering: set[bytes] = field(default_factory=set)
    cancelled: int = 0  # meta `cancelled`
    # Bookkeeping for the invariants: copies made per id (a scheduled id moving makes none),
    # copies cancelled, and acks accepted.
    made: Counter[bytes] = field(default_factory=Counter)
    dropped: Counter[bytes] = field(default_factory=Counter)
    completed: Counter[bytes] = field(default_factory=Counter)

    def push(self, ids: list[bytes], due: int | None = None, level: int = 0) -> int:
        """push (`due` None) or push_later, at a priority `level` or not: each id once per
        call, skipped while the queue holds it (waiting at any level too); an acked copy is
        gone already (ack), a cancelled one frees its id; a scheduled one scheduled again
        moves, to the new time and level."""
        taken = 0
        for job_id in dict.fromkeys(ids):
            copy = self.copies.get(job_id)
            if copy is None or copy.cancelled:  # (a cancelled element stays recorded apart)
                if due is None:
                    self.copies[job_id] = Copy("waiting", level=level)
                else:
                    self.copies[job_id] = Copy("scheduled", due, level=level)
                self.made[job_id] += 1
            elif copy.state == "scheduled" and due is not None:
                copy.due, copy.level = due, level  # scheduled again: it moves
            else:
                continue
            taken += 1
        return taken

    def promote(self) -> None:
        """A claim moves every due scheduled job to the ring (the test schedules far fewer
        than PROMOTE)."""
        for copy in self.copies.values():
            if copy.state == "scheduled" and copy.due <= self.now:
                copy.state = "waiting"

    def cancel(self, ids: list[bytes]) -> int:
        found = 0
        for job_id in dict.fromkeys(ids):
            copy = self.copies.get(job_id)
            if copy is None or copy.cancelled:
                continue
            found += 1
            self.dropped[job_id] += 1
            if copy.state == "scheduled" or (copy.state == "waiting" and copy.level > 0):
                del self.copies[job_id]  # it leaves the schedule (or its level) at once
                continue
            copy.cancelled = True
            self.lingering.add(job_id)
            if copy.token is not None:
                self.cancelled_tokens[copy.token] = True
                self.ghosts[copy.token] = copy.due
        self.cancelled += found
        return found

    def walked(self) -> None:
        """A next or sweep ran: it may have dropped cancelled leases (and their entries)."""
        self.cancelled_tokens = dict.fromkeys(self.cancelled_tokens)

    def swept(self) -> int:
        """A sweep of both lists whole dropped every cancelled element it visits and forgot
        its entry: those ids are free as if never pushed, their tokens' extend answers 0.
        It does not visit a young lease it puts back (see LEASES), so a cancelled one (in
        `ghosts`) may stay, counted in stats, until its deadline: how many may, which the test
        allows; their extend answers -1 or 0."""
        self.ghosts = {token: due for token, due in self.ghosts.items() if due > self.now}
        self.copies = {i: copy for i, copy in self.copies.items() if not copy.cancelled}
        self.cancelled_tokens = dict.fromkeys(self.ghosts)
        self.lingering = {token.split(b"*", 1)[0] for token in self.ghosts}
        return len(self.ghosts)

    def deliverable(self, job_id: bytes) -> bool:
        """Could a claim hand out `job_id` now: its copy is not cancelled and is waiting, or
        due (a lease expired, a nacked job's delay passed)?"""
        copy = self.copies.get(job_id)
        if copy is None or copy.cancelled:
            return False
        return copy.state == "waiting" or copy.due <= self.now

    def deliver(self, job_id: bytes, token: bytes, deadline: int) -> tuple[int, bool]:
        """A claim handed out `job_id` with `token`: (its delivery count, whether it
        reclaimed an expired lease), as the module must number and flag it."""
        assert self.deliverable(job_id), (job_id, self.copies.get(job_id))
        copy = self.copies[job_id]
        reclaimed = copy.state == "flight" and copy.token is not None
        copy.state, copy.due, copy.token = "flight", deadline, token
        copy.deliveries += 1
        self.tokens[token] = job_id
        return copy.deliveries, reclaimed

    def live(self, token: bytes) -> Copy | None:
        """The copy whose live token this is (not re-issued, given back or cancelled)."""
        copy = self.copies.get(self.tokens.get(token, b""))
        if copy is None or copy.cancelled or copy.token != token:
            return None
        return copy

    def ack(self, tokens: list[bytes]) -> int:
        """Accepted acks free their ids at once."""
        accepted = 0
        for token in dict.fromkeys(tokens):
            if self.live(token) is None:
                continue
            job_id = self.tokens[token]
            del self.copies[job_id]
            self.completed[job_id] += 1
            accepted += 1
        return accepted

    def nack(self, token: bytes, delay_ms: int) -> int:
        copy = self.live(token)
        if copy is None:
            return 0
        copy.token, copy.due = None, self.now + delay_ms
        return 1

    def extend(self, token: bytes, lease_ms: int) -> int | None:
        """1 extended, 0 lease lost, -1 its job cancelled; None: -1 or 0 (see
        cancelled_tokens)."""
        copy = self.live(token)
        if copy is not None:
            copy.due = self.now + lease_ms
            return 1
        if token in self.cancelled_tokens:
            return -1 if self.cancelled_tokens[token] else None
        return 0

    def scheduled(self) -> int:
        return sum(copy.state == "scheduled" for copy in self.copies.values())

    def prioritized(self) -> int:
        """The copies waiting at a priority level (stats `prioritized`)."""
        return sum(c.state == "waiting" and c.level > 0 for c in self.copies.values())

    def owed(self) -> set[bytes]:
        """The ids whose copy is to be delivered and completed yet."""
        return {job_id for job_id, copy in self.copies.items() if not copy.cancelled}

    def may_push_again(self, job_id: bytes, later: bool) -> bool:
        """Whether the test may push `job_id` (now, or later) while the module mishandles
        ids whose cancelled element lingers (the test's PUSH_LINGERING_CANCELLED_IDS): not
        while a cancelled lease of it may be in the lease list, and not later while any
        cancelled element of it may be (a cancelled waiting id pushed now comes back in
        place, which is safe)."""
        if any(token.split(b"*", 1)[0] == job_id for token in self.ghosts):
            return False
        return not later or job_id not in self.lingering
