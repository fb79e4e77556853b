"""The wire grammar, no I/O: job ids, tokens, packed batches and argument checks.

Arguments are checked here before anything is sent (the Lua module checks them again, for
callers that use it directly). Replies are decoded here whatever the client's
``decode_responses`` setting is.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from operator import is_
from typing import Any, NamedTuple, TypeVar

from rotator.defaults import (
    MAX_BUDGET,
    MAX_COUNT,
    MAX_DELIVERIES_LIMIT,
    MAX_ERROR_BYTES,
    MAX_ID_BYTES,
    MAX_LEASE_SECONDS,
    MAX_SCHEDULE_SECONDS,
    MAX_STAMP_BYTES,
)
from rotator.errors import InvalidArgument, InvalidJobId, InvalidToken
from rotator.models import Job, NextReply, duration_bucket

JobRef = Job | str | bytes
T = TypeVar("T")
# Elements may hold any bytes if someone wrote the ring by hand; surrogateescape keeps them
# round-trippable instead of crashing a worker with UnicodeDecodeError.
BYTES_ERRORS = "surrogateescape"


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", BYTES_ERRORS)
    return str(value)


def encode_id(job_id: object) -> bytes:
    if isinstance(job_id, bool) or not isinstance(job_id, str | int):
        raise InvalidJobId(f"job id must be a str (or an int), got {type(job_id).__name__}")
    try:
        raw = str(job_id).encode("utf-8", BYTES_ERRORS)
    except UnicodeEncodeError:  # a lone surrogate that is not an escaped byte
        raise InvalidJobId(f"job id is not encodable text: {str(job_id)[:64]!r}") from None
    if not raw or len(raw) > MAX_ID_BYTES or b"*" in raw:
        raise InvalidJobId(
            f'job id must be 1..{MAX_ID_BYTES} bytes without "*", got {str(job_id)[:64]!r}'
        )
    return raw


def encode_ids(ids: Iterable[object]) -> list[bytes]:
    return [encode_id(job_id) for job_id in ids]


# A token as the Lua module checks it: an id without "*", then "<deadline>.<deliveries>.<seq>"
# in ASCII digits (parse_token adds the length limits).
_TOKEN = re.compile(r"([^*]+)\*([0-9]{1,15})\.([0-9]{1,9})\.[0-9]+")
_MAX_STAMP = MAX_STAMP_BYTES
# An id of at most this many characters fits MAX_ID_BYTES whatever it holds (UTF-8: <= 4 bytes).
_SURELY_SHORT_ID = MAX_ID_BYTES // 4


def _token_match(token: str) -> re.Match[str] | None:
    match = _TOKEN.fullmatch(token)
    if match is None or len(token) - match.end(1) - 1 > _MAX_STAMP:
        return None
    if (
        match.end(1) > _SURELY_SHORT_ID
        and len(match.group(1).encode("utf-8", BYTES_ERRORS)) > MAX_ID_BYTES
    ):
        return None
    return match


def parse_token(token: str) -> tuple[str, int, int] | None:
    """``(id, deadline_ms, deliveries)`` of a well-formed token, else None: the same rules
    as the Lua module's (an id of 1..1024 bytes, a stamp of at most 48 characters)."""
    match = _token_match(token)
    if match is None:
        return None
    return match.group(1), int(match.group(2)), int(match.group(3))


def encode_token(ref: JobRef) -> bytes:
    if isinstance(ref, Job):
        # Handed out by the module (a Job made by hand with a bad token is refused by the
        # module just the same: ROTATOR_BADTOKEN, nothing written).
        return ref.token.encode("utf-8", BYTES_ERRORS)
    token = text(ref)
    if _token_match(token) is None:
        raise InvalidToken(f"not a delivery token: {token[:80]!r}")
    return token.encode("utf-8", BYTES_ERRORS)


def encode_tokens(refs: Iterable[JobRef]) -> list[bytes]:
    return [encode_token(ref) for ref in refs]


class PackedAcks(NamedTuple):
    """Acks ready to send: ``args`` (tokens, and batch acks where a whole batch is acked),
    whether any batch ack is among them, and how many distinct deliveries they name."""

    args: list[bytes]
    packed: bool
    jobs: int


class Batches:
    """The batches this client leased and how many jobs each holds, so that acking a whole
    batch can be sent as one batch ack instead of every token.

    A ``next`` call's first deliveries are one batch (one packed element in the ring); their
    tokens are ``<id>*<stamp><5-digit place>`` with one ``stamp`` (``<deadline>.1.<seq>``).
    The batch ack ``*<stamp>/<jobs>`` completes them all, unless one of them was given back
    or its element was broken up meanwhile: then the module refuses it and the tokens are
    sent one by one. Bounded: the oldest batches are forgotten first.

    The jobs of the last few batches are kept too: acking them as ``next`` returned them
    (the common loop) is then recognised by identity, without encoding a token per job.
    """

    def __init__(self, limit: int = 4096, kept: int = 16) -> None:
        self._sizes: dict[bytes, int] = {}
        self._limit = limit
        # stamp -> the batch's jobs, in order, and its packed element as the reply sent it
        self._jobs: dict[bytes, tuple[tuple[Job, ...], bytes]] = {}
        self._kept = kept
        # Worker threads share one client: every change to the two dicts holds the lock.
        self._lock = threading.Lock()

    def note(self, reply: NextReply) -> None:
        """Remembers the batch one ``next`` reply leased."""
        if not reply.batch:
            self.note_jobs(reply.jobs)
            return
        jobs = tuple(reply.jobs[: reply.batch_jobs])
        self._remember(reply.batch, reply.batch_jobs, (jobs, reply.element))

    def note_jobs(self, jobs: list[Job]) -> None:
        """Remembers the batch among the jobs of one ``next`` reply (its first deliveries)."""
        first = [job for job in jobs if job.deliveries == 1]
        if first:
            self._remember(batch_stamp(first[0].token.encode("utf-8", BYTES_ERRORS)), len(first))

    def _remember(
        self, stamp: bytes, size: int, kept: tuple[tuple[Job, ...], bytes] | None = None
    ) -> None:
        """A batch's size, and its very jobs and packed element where given (the last few
        kept), under one lock."""
        with self._lock:
            self._sizes[stamp] = size
            while len(self._sizes) > self._limit:
                self._sizes.pop(next(iter(self._sizes)))
            if kept is not None:
                self._jobs[stamp] = kept
                while len(self._jobs) > self._kept:
                    self._jobs.pop(next(iter(self._jobs)))

    def pack_refs(self, refs: Sequence[JobRef], *, named: bool = False) -> PackedAcks:
        """The acks for ``refs``: a batch among them as its batch ack, the rest as tokens.
        ``named``: a batch ack names its jobs (see :func:`batch_ack`)."""
        first = refs[0] if refs else None
        if isinstance(first, Job) and first.deliveries == 1:
            token = first.token
            stamp = token[token.find("*") + 1 : -5].encode("utf-8", BYTES_ERRORS)
            jobs, element = self._jobs.get(stamp, ((), b""))
            size = len(jobs)
            # The batch's very Job objects, first and in order: nothing to check per job.
            # Taken: a batch is acked whole once (threads may share this client).
            if size and len(refs) >= size and all(map(is_, jobs, refs)) and self._take(stamp):
                if len(refs) == size:  # the batch alone, the common loop: no token encoded
                    if named and element:  # (its ids named as the module sent them)
                        return PackedAcks([element], True, size)
                    return PackedAcks([whole_batch_ack(stamp, jobs, named=named)], True, size)
                # (a job of the batch named again is acked by the batch ack alone)
                own = encode_tokens(jobs)
                mine = set(own)
                rest = [token for token in encode_tokens(refs[size:]) if token not in mine]
                count = size if not rest else len(mine.union(rest))
                ack = batch_ack(stamp, own, named=named)
                return PackedAcks([*self.pack(rest, named=named), ack], True, count)
        tokens = encode_tokens(refs)
        args = self.pack(tokens, named=named)
        return PackedAcks(args, args is not tokens, len(set(tokens)))

    def _take(self, stamp: bytes) -> bool:
        """Forgets a batch about to be acked whole; False when it already was."""
        with self._lock:
            self._jobs.pop(stamp, None)
            return self._sizes.pop(stamp, None) is not None

    def pack(self, tokens: list[bytes], *, named: bool = False) -> list[bytes]:
        """``tokens`` with every whole batch among them replaced by its batch ack (``named``:
        naming its jobs); the very list given when there is none."""
        sizes = self._sizes
        if not sizes:
            return tokens
        stamps = [batch_stamp(token) for token in tokens]
        groups: dict[bytes, set[bytes]] = {}
        for stamp, token in zip(stamps, tokens, strict=True):
            if stamp in sizes:
                members = groups.get(stamp)
                if members is None:
                    members = groups[stamp] = set()
                members.add(token)
        # Taken: a batch is acked whole once (threads may share this client).
        whole = {
            stamp: len(members)
            for stamp, members in groups.items()
            if sizes.get(stamp) == len(members) and self._take(stamp)
        }
        if not whole:
            return tokens
        rest = [token for stamp, token in zip(stamps, tokens, strict=True) if stamp not in whole]
        return rest + [
            batch_ack(stamp, sorted(groups[stamp], key=place), named=named) for stamp in whole
        ]


def batch_ack(stamp: bytes, tokens: Sequence[bytes], *, named: bool = False) -> bytes:
    """The batch ack of a whole batch, given its jobs' tokens in their order:
    ``*<stamp>/<jobs>``, or ``named``, the batch's packed element ``*<stamp>*<id>*<id>...``
    (a call that drops payloads needs the ids; the module finds that very element)."""
    if not named:
        return b"*%s/%d" % (stamp, len(tokens))
    return b"*%s*%s" % (stamp, b"*".join(token[: token.find(b"*")] for token in tokens))


def whole_batch_ack(stamp: bytes, jobs: Sequence[Job], *, named: bool = False) -> bytes:
    """:func:`batch_ack` of a batch's very jobs, in their order, from their ids."""
    if not named:
        return b"*%s/%d" % (stamp, len(jobs))
    ids = "*".join([job.id for job in jobs]).encode("utf-8", BYTES_ERRORS)
    return b"*%s*%s" % (stamp, ids)


def place(token: bytes) -> bytes:
    """A first delivery's place in its batch: the token's last 5 digits."""
    return token[-5:]


_PACKED_BATCH = re.compile(rb"\*[0-9]+\.1\.[0-9]+")
PACKED_STAMP = re.compile(r"([0-9]{1,15})\.1\.[0-9]+")


def unpack_element(element: bytes) -> tuple[bytes, list[bytes]] | None:
    """``(batch, tokens)`` of a packed ring element ``<batch>*<id>*<id>...``, whose job k
    has the token ``<id><batch><k as 5 digits>``; None for any other element."""
    star = element.find(b"*", 1)
    if not element.startswith(b"*") or star < 0 or not _PACKED_BATCH.fullmatch(element, 0, star):
        return None
    batch = element[:star]
    ids = [job_id for job_id in element[star + 1 :].split(b"*") if job_id]
    return batch, [job_id + batch + b"%05d" % k for k, job_id in enumerate(ids, 1)]


def batch_stamp(token: bytes) -> bytes:
    """``<deadline>.<deliveries>.<call seq>`` of a token: its stamp less the 5-digit place."""
    return token[token.find(b"*") + 1 : -5]


def seconds_to_ms(
    seconds: object, name: str, *, allow_zero: bool = False, limit: float = MAX_LEASE_SECONDS
) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgument(f"{name} must be a number of seconds, got {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0 or seconds > limit:
        raise InvalidArgument(f"{name} must be finite and in 0..{limit:g} s")
    ms = math.ceil(seconds * 1000)
    if ms == 0 and not allow_zero:
        raise InvalidArgument(f"{name} must be positive, got {seconds!r}")
    return ms


# When a scheduled job is due: unix seconds, or a timezone-aware datetime.
When = float | int | datetime


class Due(NamedTuple):
    """When a scheduled push is due, as push_later takes it: ``IN`` ms from the server's
    time, or ``AT`` a unix ms."""

    mode: bytes
    ms: int


def check_priority(priority: object) -> int:
    """A push's priority level: 0 (the default, delivered first) to 9."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise InvalidArgument(
            f"priority must be an int from 0 (most urgent) to 9, got {priority!r}"
        )
    return priority


def check_due(delay: object, at: object) -> Due | None:
    """The due time of a push given ``delay`` (seconds from now) or ``at`` (unix seconds, or
    a timezone-aware datetime); None for neither (push at once)."""
    if delay is not None and at is not None:
        raise InvalidArgument("give delay or at, not both")
    if delay is not None:
        ms = seconds_to_ms(delay, "delay", allow_zero=True, limit=MAX_SCHEDULE_SECONDS)
        return Due(b"IN", ms)
    if at is None:
        return None
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise InvalidArgument(f"at must be a timezone-aware datetime, got {at!r}")
        at = at.timestamp()
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise InvalidArgument(f"at must be unix seconds or an aware datetime, got {at!r}")
    # The module refuses a time more than MAX_SCHEDULE_SECONDS after its own clock; this
    # bound only keeps the number within what it parses.
    if not 0 <= at < 10**12:
        raise InvalidArgument(f"at must be unix seconds in 0..10^12, got {at!r}")
    return Due(b"AT", math.ceil(at * 1000))


def duration_counts(seconds: Iterable[object]) -> tuple[int, dict[int, int]]:
    """Processing times as the module's histogram takes them: their total in ms and how many
    fall in each bucket (:func:`rotator.models.duration_bucket`)."""
    counts: dict[int, int] = {}
    total = 0.0
    for one in seconds:
        if isinstance(one, bool) or not isinstance(one, int | float) or not 0 <= one < 1e9:
            raise InvalidArgument(f"a duration is a number of seconds >= 0, got {one!r}")
        bucket = duration_bucket(one)
        counts[bucket] = counts.get(bucket, 0) + 1
        total += one
    return round(total * 1000), counts


def encode_durations(seconds: Iterable[object]) -> bytes | None:
    """The last argument of a next or an ack that adds ``seconds`` to the histogram,
    ``#<total ms>,<bucket>:<count>,...``; None for no times."""
    total_ms, counts = duration_counts(seconds)
    if not counts:
        return None
    return b"#%d" % total_ms + b"".join(b",%d:%d" % (b, counts[b]) for b in sorted(counts))


def whole(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{name} must be a whole number in {low}..{high}, got {value!r}")
    return value


def check_count(count: object) -> int:
    return whole(count, "count", 1, MAX_COUNT)


def check_budget(budget: object) -> int:
    return whole(budget, "budget", 1, MAX_BUDGET)


def check_max_deliveries(max_deliveries: object) -> int:
    """0 means no limit."""
    if max_deliveries is None:
        return 0
    return whole(max_deliveries, "max_deliveries", 1, MAX_DELIVERIES_LIMIT)


def job_from_token(
    raw: Any,
    reclaimed: bool,
    payload: bytes | None = None,
    stamps: dict[str, tuple[int, int]] | None = None,
) -> Job:
    """The Job of a token the module handed out. Its shape is the module's to guarantee, so
    this only splits it (the hot path of every ``next``); anything else is refused.
    ``stamps`` remembers parsed stamps across one reply, whose tokens mostly share one."""
    token = text(raw)
    job_id, _, stamp = token.partition("*")
    head = stamp[:-5]  # "<deadline>.<deliveries>.<call seq>": the same for a whole batch
    known = stamps.get(head) if stamps is not None else None
    if known is None:
        try:
            deadline_ms, deliveries, seq = stamp.split(".")
            known = (int(deliveries), int(deadline_ms)) if seq.isdigit() else None
        except ValueError:
            known = None
        if known is None:
            raise InvalidToken(f"server returned a malformed token {token!r}")
        if stamps is not None:
            stamps[head] = known
    return Job(job_id, token, known[0], reclaimed, known[1], payload)


def encode_payload(payload: object) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode("utf-8", BYTES_ERRORS)
    raise InvalidArgument(f"a payload must be bytes or str, got {type(payload).__name__}")


def encode_error(error: object) -> bytes:
    """The last-error text of a nack: at most MAX_ERROR_BYTES bytes (None: no error)."""
    if error is None:
        return b""
    if not isinstance(error, str):
        raise InvalidArgument(f"error must be a str, got {type(error).__name__}")
    raw = error.encode("utf-8", BYTES_ERRORS)
    if len(raw) > MAX_ERROR_BYTES:
        raise InvalidArgument(f"error must be at most {MAX_ERROR_BYTES} bytes")
    return raw


# A batch job's place in its token, for every place a batch can have.
PLACES = tuple(f"{k:05d}" for k in range(MAX_COUNT + 1))


def check_block(block: float | None) -> float | None:
    if block is None:
        return None
    if isinstance(block, bool) or not isinstance(block, int | float) or not math.isfinite(block):
        raise InvalidArgument(f"block must be a finite number of seconds, got {block!r}")
    if block < 0:
        raise InvalidArgument(f"block must not be negative, got {block!r}")
    return float(block)


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in slices of at most ``size``: every call the module gets stays bounded."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
