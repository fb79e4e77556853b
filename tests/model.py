"""An executable model of rotator: the spec the stateful test holds the real module to.

Pure Python, no server. It keeps the queue as the module's header and the README describe it:
the ring (a list, head first, like LRANGE), the two generations of acks and marks, revoked
tokens, dead letters, the wake list's length, the counters, and a clock that only moves when
the test says so. Everything is bytes, so ids with NUL, CRLF or invalid UTF-8 are modelled
exactly.

Where the module works on slices of the ring (one LRANGE, one SMISMEMBER, one LTRIM and one
LPUSH per call), the model visits one element at a time, as a sequence of RPOPLPUSHes would:
the README promises that both orders agree, and the stateful test checks it.

Replies have the shapes the server sends (ints and bytes); refusals raise `Refused` with the
module's error code. The `<seq>` of a new token is the module's business (only its uniqueness
is promised), so the model hands out tokens ending in a placeholder (`.?<n>`); the test checks
the rest of the token, then `adopt`s the server's token, which must never have been issued.
Besides the spec, the model keeps bookkeeping for the test's invariants (`pushed_ids`,
`completed`, `delivered`, `laps`, `acked_at`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

SENTINEL = b"*lap"
ID_BYTES = 1024
BATCH = 5000
COUNT = 1000
BUDGET = 10_000
LEASE_MS = 86_400_000
REVOKED_KEEP_MS = 2 * 86_400_000
WAKE_TOKENS = 16
PUSHLOG_BUCKET_MS = 1000
PUSH_CHUNK = 1000  # rotator.defaults.DEFAULT_PUSH_CHUNK: ids per push call of the Python API

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
_MARK = re.compile(rb"([en])(\d+)")
_DEAD_LETTER = re.compile(rb"[^*]*\*\d+\*\d+\*(.*)", re.DOTALL)
_PUSHLOG = re.compile(rb"(\d+):(\d+)")


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
    9 of deliveries and 40 bytes of stamp, an id of 1..1024 bytes."""
    star = element.find(b"*")
    if star <= 0 or star > ID_BYTES or len(element) - star - 1 > 40:
        return None
    stamp = _TOKEN_STAMP.fullmatch(element, star + 1)
    if stamp is None or len(stamp[1]) > 15 or len(stamp[2]) > 9:
        return None
    return element[:star], int(stamp[1]), int(stamp[2])


def check_tokens(tokens: list[bytes], required: bool) -> None:
    if required and not tokens:
        raise Refused("ROTATOR_BADTOKEN")
    if len(tokens) > BATCH:
        raise Refused("ROTATOR_TOOMANY")
    for token in tokens:
        star = token.find(b"*", 1)
        if (
            star < 0
            or star > ID_BYTES
            or len(token) - star - 1 > 40
            or not re.fullmatch(rb"\d+\.\d+\.\d+", token[star + 1 :])
        ):
            raise Refused("ROTATOR_BADTOKEN")


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
class Walk:
    """One walk over the tail of the ring (a `next` or `sweep` call)."""

    now: int
    deadline: int
    max_deliveries: int
    sweeping: bool
    live: int
    lapnext: int
    lapguess: bool
    visited: int = 0
    leased: int = 0
    soonest: int | None = None
    reply: list[Any] = field(default_factory=list)


@dataclass
class RotatorModel:
    now: int
    ring: list[bytes] = field(default_factory=list)  # head first, like LRANGE 0 -1
    done: set[bytes] = field(default_factory=set)
    done_old: set[bytes] = field(default_factory=set)
    marks: dict[bytes, bytes] = field(default_factory=dict)
    marks_old: dict[bytes, bytes] = field(default_factory=dict)
    revoked: dict[bytes, int] = field(default_factory=dict)
    dead: list[bytes] = field(default_factory=list)
    wake: int = 0  # LLEN of the wake list
    pushlog: list[tuple[int, int]] = field(default_factory=list)  # (pushed, ms), newest first
    seq: int = 0
    lapnext: int | None = None
    lapguess: bool = False
    qstart: int | None = None
    qlen: int | None = None  # ring length at qstart: visits needed before an idle reply
    qmin: int | None = None
    pushed: int = 0
    taken: int = 0
    issued: set[bytes] = field(default_factory=set)  # every token the server handed out
    placeholders: int = 0
    # Bookkeeping for the test, not part of the queue.
    pushed_ids: Counter[bytes] = field(default_factory=Counter)  # valid ids that entered the ring
    completed: Counter[bytes] = field(default_factory=Counter)  # acked elements removed, by id
    delivered: Counter[bytes] = field(default_factory=Counter)  # deliveries handed out, by id
    laps: int = 0  # sentinel visits
    acked_at: dict[bytes, int] = field(default_factory=dict)  # token -> laps when last acked

    # -- commands -------------------------------------------------------------------------

    def push(self, ids: list[bytes]) -> int:
        check_ids(ids)
        if not ids:
            return 0
        self._ensure_ring()
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
        n = int_arg(count, 1, COUNT)
        lease_ms = int_arg(lease, 1, LEASE_MS)
        limit = int_arg(budget, 1, BUDGET)
        most = int_arg(max_deliveries, 0, 1_000_000)
        check_tokens(acks, required=False)
        walk = self._start_walk(lease_ms, most)
        length = len(self.ring)
        acked = self._ack_tokens(acks)
        if length == 0:
            return [1, -1, acked]
        if self.qlen is None:
            self.qlen = length
        if self.qmin is not None and self.qmin <= self.now:
            # Something came due since the last idle lap: look at a whole lap again.
            self.qmin, self.qstart, self.qlen = None, self.seq, length
        walk.reply = [0, -1, acked]
        self._walk(walk, n, min(limit, length))
        self._finish_walk(walk)
        reply = walk.reply
        assert self.qstart is not None
        if walk.leased == 0 and self.seq - self.qstart >= self.qlen:
            self.wake = 0
            reply[0] = 1
        if self.qmin is not None:
            reply[1] = self.qmin - self.now
        return reply

    def ack(self, tokens: list[bytes]) -> int:
        check_tokens(tokens, required=True)
        return self._ack_tokens(tokens)

    def nack(self, delay: object, tokens: list[bytes]) -> list[int]:
        delay_ms = int_arg(delay, 0, LEASE_MS)
        check_tokens(tokens, required=True)
        alive = self._live_tokens(tokens)
        due = self.now + delay_ms
        reply = []
        for token in tokens:
            if token in alive:
                alive.discard(token)  # a token given twice is requeued once
                self.marks[token] = b"n%d" % due
                self.marks_old.pop(token, None)
                self.revoked[token] = self.now
                reply.append(1)
            else:
                reply.append(0)
        if any(reply):
            self.qmin = due if self.qmin is None else min(self.qmin, due)
            self.qstart, self.qlen = self.seq, len(self.ring)
            self.wake = min(self.wake + 1, WAKE_TOKENS)
        return reply

    def extend(self, lease: object, tokens: list[bytes]) -> list[int]:
        lease_ms = int_arg(lease, 1, LEASE_MS)
        check_tokens(tokens, required=True)
        alive = self._live_tokens(tokens)
        deadline = self.now + lease_ms
        reply = [deadline]
        for token in tokens:
            if token in alive:
                self.marks[token] = b"e%d" % deadline
                self.marks_old.pop(token, None)
            reply.append(1 if token in alive else 0)
        if alive and (self.qmin is None or deadline < self.qmin):
            self.qmin = deadline  # a shortened lease may be the next thing due
        return reply

    def sweep(self, budget: object) -> list[int]:
        limit = int_arg(budget, 1, BUDGET)
        walk = self._start_walk(0, 0)
        length = len(self.ring)
        if length == 0:
            return [0, 0, 0]
        if self.qlen is None:
            self.qlen = length
        walk.sweeping = True
        self._walk(walk, 1, min(limit, length))
        self._finish_walk(walk)
        # A sweep leases nothing: what it passed may still be pending, so the quiet lap
        # starts again.
        self.qstart, self.qlen = self.seq, walk.live
        return [walk.visited, length - walk.live, max(walk.live - 1, 0)]

    def stats(self) -> list[Any]:
        length = max(len(self.ring) - 1, 0)
        pending = max(0, min(length, self.pushed - self.taken))
        acked = len(self.done) + len(self.done_old)
        deferred = sum(
            mark.startswith(b"n")
            for marks in (self.marks, self.marks_old)
            for mark in marks.values()
        )
        in_flight = max(0, length - pending - acked - deferred)
        oldest = -1
        if pending > 0:
            # The oldest checkpoint whose cumulative push count exceeds what was taken.
            found = [ms for pushed, ms in self.pushlog if pushed > self.taken]
            if found:
                oldest = max(0, self.now - found[-1])
        return [
            *(b"length", length, b"pending", pending, b"in_flight", in_flight),
            *(b"done", acked, b"deferred", deferred, b"dead", len(self.dead)),
            *(b"oldest_pending_age_ms", oldest),
        ]

    def peek(self, count: object) -> list[Any]:
        n = int_arg(count, 1, COUNT)
        reply: list[Any] = []
        for element in reversed(self.ring[-n:]):
            state, at = b"pending", 0
            if element == SENTINEL:
                state = b"lap"
            elif not valid_id(element):
                lease = parse_lease(element)
                mark = self._mark_of(element)[0]
                when = _MARK.fullmatch(mark) if mark else None
                if lease is None:
                    state = b"corrupt"
                elif element in self.done or element in self.done_old:
                    state = b"done"
                elif when and when[1] == b"n":
                    state, at = b"deferred", int(when[2])
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

    def adopt(self, placeholder: bytes, token: bytes) -> None:
        """The server's token for a delivery the model handed out as `placeholder`."""
        stem, _, mark = placeholder.rpartition(b".")
        assert mark.startswith(b"?"), placeholder
        assert token.startswith(stem + b"."), (token, placeholder)
        assert token[len(stem) + 1 :].isdigit(), token
        assert token not in self.issued, f"token {token!r} was issued twice"
        self.issued.add(token)
        self.ring[self.ring.index(placeholder)] = token

    # -- outside the contract: an admin writing the ring -----------------------------------

    def raw_lpush(self, *elements: bytes) -> None:
        self.ring[:0] = reversed(elements)

    # -- helpers --------------------------------------------------------------------------

    def _ensure_ring(self) -> None:
        if not self.ring:
            self.ring = [SENTINEL]
            self.lapnext = None

    def _record_push(self, n: int) -> None:
        self.pushed += n
        head_ms = self.pushlog[0][1] if self.pushlog else None
        if head_ms is not None and 0 <= self.now - head_ms < PUSHLOG_BUCKET_MS:
            self.pushlog[0] = (self.pushed, head_ms)
        else:
            self.pushlog.insert(0, (self.pushed, self.now))
        for _ in range(4):  # drop a few fully consumed checkpoints
            if not self.pushlog or self.pushlog[-1][0] > self.taken:
                break
            self.pushlog.pop()
        self.qstart, self.qlen = self.seq, len(self.ring)
        self.wake = min(self.wake + min(n, WAKE_TOKENS), WAKE_TOKENS)

    def _ack_tokens(self, tokens: list[bytes]) -> int:
        if not tokens or not self.ring:
            return 0
        accepted = {t for t in tokens if t not in self.revoked}
        self.done |= accepted
        self.acked_at.update(dict.fromkeys(accepted, self.laps))
        return len(accepted)

    def _live_tokens(self, tokens: list[bytes]) -> set[bytes]:
        if not self.ring:
            return set()
        alive = {
            t
            for t in tokens
            if t not in self.revoked and t not in self.done and t not in self.done_old
        }
        if FENCE_TOKENS_NOT_IN_RING:
            alive &= set(self.ring)
        return alive

    def _mark_of(self, element: bytes) -> tuple[bytes | None, dict[bytes, bytes] | None]:
        for marks in (self.marks, self.marks_old):
            if element in marks:
                return marks[element], marks
        return None, None

    def _start_walk(self, lease_ms: int, max_deliveries: int) -> Walk:
        length = len(self.ring)
        return Walk(
            now=self.now,
            deadline=self.now + lease_ms,
            max_deliveries=max_deliveries,
            sweeping=False,
            live=length,
            lapnext=self.lapnext if self.lapnext is not None else self.seq + length + 1,
            lapguess=self.lapguess or self.lapnext is None,
        )

    def _walk(self, w: Walk, count: int, limit: int) -> None:
        if self.qstart is None:
            self.qstart = self.seq
        while w.visited < limit and w.leased < count:
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
                self.taken += 1
                self._hand_out(w, element, 1, 0)
            return
        if element in self.done or element in self.done_old:
            (self.done if element in self.done else self.done_old).discard(element)
            w.live -= 1
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
        when = _MARK.fullmatch(mark) if mark else None
        if when and when[1] == b"e":
            deadline = int(when[2])
        due = int(when[2]) if when and when[1] == b"n" else deadline
        if due > w.now or w.sweeping:
            self.ring.insert(0, element)
            w.soonest = due if w.soonest is None else min(w.soonest, due)
            if mark is not None and marks is self.marks_old:
                self.marks[element] = self.marks_old.pop(element)
            return
        if marks is not None:
            del marks[element]
        self.revoked[element] = w.now
        if w.max_deliveries > 0 and n >= w.max_deliveries:
            self.dead.append(b"max_deliveries*%d*%d*" % (n, w.now) + job_id)
            w.live -= 1
            return
        self._hand_out(w, job_id, n + 1, 0 if when and when[1] == b"n" else 1)

    def _hand_out(self, w: Walk, job_id: bytes, deliveries: int, reclaimed: int) -> None:
        self.placeholders += 1
        token = job_id + b"*%d.%d.?%d" % (w.deadline, deliveries, self.placeholders)
        self.ring.insert(0, token)
        w.reply += [token, reclaimed]
        w.leased += 1
        self.delivered[job_id] += 1

    def _dead_letter(self, w: Walk, reason: bytes, n: int, element: bytes) -> None:
        self.dead.append(b"%s*%d*%d*" % (reason, n, w.now) + element)
        w.live -= 1

    def _end_lap(self, w: Walk) -> None:
        """A lap ends: whatever the old generations still hold was a leftover."""
        self.done_old, self.done = self.done, set()
        self.marks_old, self.marks = self.marks, {}
        cutoff = w.now - REVOKED_KEEP_MS
        self.revoked = {t: ms for t, ms in self.revoked.items() if ms >= cutoff}
        self.ring.insert(0, SENTINEL)
        w.lapnext, w.lapguess = self.seq + w.visited + w.live, False
        self.laps += 1

    def _finish_walk(self, w: Walk) -> None:
        self.seq += w.visited
        if w.leased > 0 and (w.soonest is None or w.deadline < w.soonest):
            w.soonest = w.deadline
        if w.soonest is not None and (self.qmin is None or w.soonest < self.qmin):
            self.qmin = w.soonest
        self.lapnext, self.lapguess = w.lapnext, w.lapguess

    # -- what the invariants ask ----------------------------------------------------------

    def leases(self) -> dict[bytes, tuple[bytes, int]]:
        """Leased elements in the ring: token -> (id, when it falls due), acked ones left out."""
        found = {}
        for element in self.ring:
            lease = parse_lease(element)
            if lease is None or element in self.done or element in self.done_old:
                continue
            mark = _MARK.fullmatch(self._mark_of(element)[0] or b"")
            found[element] = (lease[0], int(mark[2]) if mark else lease[1])
        return found

    def takeable_now(self) -> bool:
        """Would a `next` lease something at this instant (a pending id or a due lease)?"""
        if any(valid_id(e) for e in self.ring):
            return True
        return any(due <= self.now for _, due in self.leases().values())


def dead_letter_id(letter: bytes) -> bytes | None:
    """The job id inside a dead letter, or None when it holds no valid id."""
    found = _DEAD_LETTER.fullmatch(letter)
    if found is None:
        return None
    job_id = found[1].split(b"*", 1)[0]
    return job_id if valid_id(job_id) else None
