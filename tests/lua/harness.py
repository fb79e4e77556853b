"""Runs lua/rotator.lua in-process under lupa's Lua 5.1, against a Python stand-in for Redis.

This is the one sanctioned stub. It implements only the commands the module calls, with the
Redis semantics the module can observe (empty collections vanish, WRONGTYPE, list index
clamping, reply conversions in both directions, readonly globals). A command or a command form
it does not know raises `StubError`, which fails the test: the stub must never quietly guess.
tests/test_lua_parity.py runs the same scenarios on real servers, so the stub cannot drift.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import lupa.lua51 as lupa

from rotator.keys import KEY_ROLES

ROOT = Path(__file__).resolve().parents[2]
MODULE_PATH = ROOT / "lua" / "rotator.lua"
# How the module names a Redis command: rcall('X', ...), its guarded read M.read('X', ...), its
# write that may be refused M.attempt('X', ...) or its sliced call M.call_all('X', ...).
COMMAND_CALL = re.compile(r"\b(?:rcall|M\.read|M\.attempt|M\.call_all)\(\s*'([A-Za-z]+)'")


def called_commands(source: str) -> list[str]:
    """Every command the module source calls, as written, once per call site."""
    return COMMAND_CALL.findall(source)


MODULE_CHUNKNAME = "@lua/rotator.lua"  # error messages then read "lua/rotator.lua:123: ..."

# KEYS[1..10] of a queue, in the order the module's header lists them: the layout the Python
# client builds (the contract test checks the header against it).
ROLES = KEY_ROLES

START_MS = 1_732_233_600_000  # the fake clock's start: a realistic unix time in ms

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
NOT_INTEGER = "ERR value is not an integer or out of range"
NOT_FLOAT = "ERR value is not a valid float"
ARITY = "Wrong number of args calling Redis command from script"
BAD_ARG_TYPE = "Lua redis lib command arguments must be strings or integers"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_T = TypeVar("_T")


def queue_keys(name: str) -> tuple[str, ...]:
    """The ten KEYS of queue `name`, sharing the `{name}` hash tag."""
    return tuple(f"rotator:{{{name}}}:{role}" for role in ROLES)


def as_text(value: object) -> object:
    """A reply with its strings as text (bytes that are not UTF-8 kept by surrogates), so
    that two replies, or a reply and what a test expects, compare and print readably."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, list):
        return [as_text(v) for v in value]
    return value


class StubError(AssertionError):
    """The script used a command or form the stub does not implement: extend the stub."""


class CommandError(Exception):
    """An error reply of one Redis command (what redis.call raises and redis.pcall returns)."""


class ScriptError(Exception):
    """The script's error reply: a returned {err=...} or an uncaught error, as Redis sends it."""


@dataclass(frozen=True, slots=True)
class Status:
    """A status reply (+OK, TYPE's +list): Lua sees it as {ok=...}."""

    text: bytes


class Hash(dict[bytes, bytes]):
    """A Redis hash (a subclass, so TYPE can tell it from a zset)."""


class ZSet(dict[bytes, float]):
    """A Redis sorted set: member -> score."""


Value: TypeAlias = "list[bytes] | set[bytes] | Hash | ZSet | bytes"
Reply: TypeAlias = "int | bytes | Status | list[Reply] | None"
_INT_RE = re.compile(rb"0|-?[1-9][0-9]*")


def format_double(number: float) -> bytes:
    """A Lua number as Redis 7.0 turns it into a command argument (and a score into a reply)."""
    return b"%.17g" % number


def parse_int(raw: bytes) -> int:
    """Redis's string2ll: no sign but '-', no leading zeros or spaces, within int64."""
    if not _INT_RE.fullmatch(raw):
        raise CommandError(NOT_INTEGER)
    value = int(raw)
    if not INT64_MIN <= value <= INT64_MAX:
        raise CommandError(NOT_INTEGER)
    return value


def parse_float(raw: bytes, error: str = NOT_FLOAT) -> float:
    """Redis's strtod check: the whole string, no surrounding space, never NaN."""
    text = raw.decode("ascii", "replace")
    if not text or text[0].isspace() or text[-1].isspace() or "_" in text:
        raise CommandError(error)
    try:
        value = float(text)
    except ValueError:
        try:
            value = float.fromhex(text)  # strtod reads hex floats too
        except ValueError:
            raise CommandError(error) from None
    if math.isnan(value):
        raise CommandError(error)
    return value


def _parse_score_bound(raw: bytes) -> tuple[float, bool]:
    """A ZRANGEBYSCORE bound: (value, exclusive)."""
    error = "ERR min or max is not a float"
    if raw.startswith(b"("):
        return parse_float(raw[1:], error), True
    return parse_float(raw, error), False


def _clamp_range(length: int, start: int, stop: int) -> tuple[int, int] | None:
    """LRANGE/LTRIM index semantics: negative from the end, clamped; None when empty."""
    if start < 0:
        start += length
    if stop < 0:
        stop += length
    start = max(start, 0)
    if start > stop or start >= length:
        return None
    return start, min(stop, length - 1)


class RedisStub:
    """An in-memory keyspace and the subset of Redis commands rotator.lua calls."""

    # The commands that only read: all a read-only function may call (read_only).
    READS = frozenset(
        b"TIME TYPE EXISTS LLEN LRANGE LINDEX LPOS SCARD SMISMEMBER HMGET HLEN ZCARD ZMSCORE "
        b"ZSCORE HGET HGETALL HSTRLEN ZRANGE ZRANGEBYSCORE ZCOUNT".split()
    )

    def __init__(self, now_ms: int = START_MS) -> None:
        self.now_ms = now_ms
        # While a 'no-writes' function runs (FCALL_RO): a write is refused, as Redis does.
        self.read_only = False
        self.data: dict[bytes, Value] = {}
        self.calls: list[tuple[bytes, ...]] = []  # every command the script ran, for tests
        # name -> (Redis arity: exact if >= 0, at least -arity if < 0; implementation)
        self.commands: dict[bytes, tuple[int, Callable[[list[bytes]], Reply]]] = {
            b"TIME": (1, self._time),
            b"TYPE": (2, self._type),
            b"DEL": (-2, self._del),
            b"EXISTS": (-2, self._exists),
            b"UNLINK": (-2, self._del),
            b"RENAME": (3, self._rename),
            b"LLEN": (2, self._llen),
            b"LRANGE": (4, self._lrange),
            b"LTRIM": (4, self._ltrim),
            b"LINDEX": (3, self._lindex),
            b"LPOS": (-3, self._lpos),
            b"LSET": (4, self._lset),
            b"LPUSH": (-3, self._lpush),
            b"RPUSH": (-3, self._rpush),
            b"RPOP": (-2, self._rpop),
            b"SADD": (-3, self._sadd),
            b"SREM": (-3, self._srem),
            b"SCARD": (2, self._scard),
            b"SMISMEMBER": (-3, self._smismember),
            b"HSET": (-4, self._hset),
            b"HSETNX": (4, self._hsetnx),
            b"HMGET": (-3, self._hmget),
            b"HDEL": (-3, self._hdel),
            b"HLEN": (2, self._hlen),
            b"ZADD": (-4, self._zadd),
            b"ZCARD": (2, self._zcard),
            b"ZMSCORE": (-3, self._zmscore),
            b"ZSCORE": (3, self._zscore),
            b"HGET": (3, self._hget),
            b"HGETALL": (2, self._hgetall),
            b"HSTRLEN": (3, self._hstrlen),
            b"ZRANGE": (-4, self._zrange),
            b"ZREM": (-3, self._zrem),
            b"ZRANGEBYSCORE": (-4, self._zrangebyscore),
            b"ZCOUNT": (4, self._zcount),
            b"ZREMRANGEBYRANK": (4, self._zremrangebyrank),
            b"PEXPIRE": (3, self._pexpire),
            b"LREM": (4, self._lrem),
            b"HINCRBY": (4, self._hincrby),
        }
        self.expires: dict[bytes, int] = {}  # key -> ms at which it is gone

    def advance(self, ms: int) -> None:
        self.now_ms += ms

    def execute(self, args: Sequence[bytes]) -> Reply:
        """Run one command; raises CommandError for a Redis error, StubError for a gap."""
        if not args:
            raise CommandError("Please specify at least one argument for this redis lib call")
        name = args[0].upper()
        if name not in self.commands:
            raise StubError(f"the Redis stub does not implement {args[0]!r}; add it with tests")
        arity, run = self.commands[name]
        if (arity >= 0 and len(args) != arity) or (arity < 0 and len(args) < -arity):
            raise CommandError(ARITY)
        if self.read_only and name not in self.READS:
            raise CommandError("ERR Write commands are not allowed from read-only scripts.")
        self.calls.append(tuple(args))
        for key, at in list(self.expires.items()):  # a key past its expiry is gone
            if at <= self.now_ms:
                self.data.pop(key, None)
                del self.expires[key]
        return run(list(args[1:]))

    # -- typed access: WRONGTYPE like Redis, and empty collections deleted after writes --

    def _get(self, key: bytes, kind: type[_T]) -> _T | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, kind) or type(value) is not kind:  # a Hash is not a ZSet
            raise CommandError(WRONGTYPE)
        return value

    def _list(self, key: bytes) -> list[bytes] | None:
        return self._get(key, list)

    def _set(self, key: bytes) -> set[bytes] | None:
        return self._get(key, set)

    def _hash(self, key: bytes) -> Hash | None:
        return self._get(key, Hash)

    def _zset(self, key: bytes) -> ZSet | None:
        return self._get(key, ZSet)

    def _vacuum(self, key: bytes) -> None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, bytes) and len(value) == 0:
            del self.data[key]

    # -- keyspace --

    def _time(self, _: list[bytes]) -> Reply:
        seconds, ms = divmod(self.now_ms, 1000)
        return [str(seconds).encode(), str(ms * 1000).encode()]

    def _type(self, args: list[bytes]) -> Reply:
        value = self.data.get(args[0])
        kinds: list[tuple[type, bytes]] = [
            (list, b"list"),
            (set, b"set"),
            (Hash, b"hash"),
            (ZSet, b"zset"),
            (bytes, b"string"),
        ]
        for kind, name in kinds:
            if type(value) is kind:
                return Status(name)
        return Status(b"none")

    def _exists(self, args: list[bytes]) -> Reply:
        return sum(1 for key in args if key in self.data)  # (a key named twice counts twice)

    def _del(self, args: list[bytes]) -> Reply:
        for key in args:
            self.expires.pop(key, None)
        return sum(1 for key in dict.fromkeys(args) if self.data.pop(key, None) is not None)

    def _pexpire(self, args: list[bytes]) -> Reply:
        key, ms = args
        if key not in self.data:
            return 0
        self.expires[key] = self.now_ms + int(ms)
        return 1

    def _rename(self, args: list[bytes]) -> Reply:
        source, target = args
        if source not in self.data:
            raise CommandError("ERR no such key")
        self.data[target] = self.data.pop(source)
        return Status(b"OK")

    # -- lists: index 0 is the head (LPUSH side), -1 the tail --

    def _llen(self, args: list[bytes]) -> Reply:
        return len(self._list(args[0]) or [])

    def _lrange(self, args: list[bytes]) -> Reply:
        start, stop = parse_int(args[1]), parse_int(args[2])
        items = self._list(args[0]) or []
        span = _clamp_range(len(items), start, stop)
        return [] if span is None else list(items[span[0] : span[1] + 1])

    def _ltrim(self, args: list[bytes]) -> Reply:
        start, stop = parse_int(args[1]), parse_int(args[2])
        items = self._list(args[0])
        if items is not None:
            span = _clamp_range(len(items), start, stop)
            items[:] = [] if span is None else items[span[0] : span[1] + 1]
            self._vacuum(args[0])
        return Status(b"OK")

    def _lpos(self, args: list[bytes]) -> Reply:
        """LPOS key element [RANK r] [COUNT c] [MAXLEN m]: the head-based index of the first
        match found, or nil; with COUNT, a list of the first c found (0: all)."""
        rank, maxlen, count = 1, 0, None
        options = args[2:]
        if len(options) % 2:
            raise CommandError("ERR syntax error")
        for name, value in zip(options[::2], options[1::2], strict=True):
            if name.upper() == b"RANK":
                rank = parse_int(value)
                if rank == 0:
                    raise CommandError("ERR RANK can't be zero")
            elif name.upper() == b"MAXLEN":
                maxlen = parse_int(value)
                if maxlen < 0:
                    raise CommandError("ERR MAXLEN can't be negative")
            elif name.upper() == b"COUNT":
                count = parse_int(value)
                if count < 0:
                    raise CommandError("ERR COUNT can't be negative")
            else:
                raise StubError(f"the Redis stub's LPOS does not take {name!r}; add it with tests")
        items = self._list(args[0]) or []
        order = range(len(items)) if rank > 0 else range(len(items) - 1, -1, -1)
        skip = abs(rank) - 1
        found: list[Reply] = []
        for compared, index in enumerate(order, 1):
            if maxlen and compared > maxlen:
                break
            if items[index] == args[1]:
                if skip == 0:
                    found.append(index)
                    if count is None or len(found) == count:
                        break
                else:
                    skip -= 1
        if count is not None:
            return found
        return found[0] if found else None

    def _lindex(self, args: list[bytes]) -> Reply:
        index = parse_int(args[1])
        items = self._list(args[0]) or []
        if index < 0:
            index += len(items)
        return items[index] if 0 <= index < len(items) else None

    def _lset(self, args: list[bytes]) -> Reply:
        index = parse_int(args[1])
        items = self._list(args[0])
        if items is None:
            raise CommandError("ERR no such key")
        if index < 0:
            index += len(items)
        if not 0 <= index < len(items):
            raise CommandError("ERR index out of range")
        items[index] = args[2]
        return Status(b"OK")

    def _list_for_push(self, key: bytes) -> list[bytes]:
        items = self._list(key)
        if items is None:
            items = self.data[key] = []
        return items

    def _lpush(self, args: list[bytes]) -> Reply:
        items = self._list_for_push(args[0])
        items[:0] = reversed(args[1:])  # each value goes to the head in turn
        return len(items)

    def _rpush(self, args: list[bytes]) -> Reply:
        items = self._list_for_push(args[0])
        items.extend(args[1:])
        return len(items)

    def _lrem(self, args: list[bytes]) -> Reply:
        key, count_raw, value = args
        count = parse_int(count_raw)
        items = self._list(key) or []
        order = items if count >= 0 else reversed(items)  # (a negative count: from the tail)
        kept, removed = [], 0
        for item in order:
            if item == value and (count == 0 or removed < abs(count)):
                removed += 1
            else:
                kept.append(item)
        items[:] = kept if count >= 0 else kept[::-1]
        self._vacuum(key)
        return removed

    def _rpop(self, args: list[bytes]) -> Reply:
        if len(args) > 2:
            raise StubError("RPOP takes a key and at most a count")
        count = parse_int(args[1]) if len(args) == 2 else None
        if count is not None and count < 1:
            raise StubError("RPOP with a count below 1 is not implemented in the stub")
        items = self._list(args[0])
        if not items:
            return None
        if count is None:
            value = items.pop()
            self._vacuum(args[0])
            return value
        popped: list[Reply] = [items.pop() for _ in range(min(count, len(items)))]  # tail first
        self._vacuum(args[0])
        return popped

    # -- sets --

    def _sadd(self, args: list[bytes]) -> Reply:
        members = self._set(args[0])
        if members is None:
            members = self.data[args[0]] = set()
        before = len(members)
        members.update(args[1:])
        return len(members) - before

    def _srem(self, args: list[bytes]) -> Reply:
        members = self._set(args[0])
        if members is None:
            return 0
        before = len(members)
        members.difference_update(args[1:])
        self._vacuum(args[0])
        return before - len(members)

    def _scard(self, args: list[bytes]) -> Reply:
        return len(self._set(args[0]) or ())

    def _smismember(self, args: list[bytes]) -> Reply:
        members = self._set(args[0]) or set()
        return [int(member in members) for member in args[1:]]

    # -- hashes --

    def _hset(self, args: list[bytes]) -> Reply:
        if len(args) % 2 == 0:
            raise CommandError("ERR wrong number of arguments for 'hset' command")
        fields = self._hash(args[0])
        if fields is None:
            fields = self.data[args[0]] = Hash()
        added = 0
        for i in range(1, len(args), 2):
            added += args[i] not in fields
            fields[args[i]] = args[i + 1]
        return added

    def _hsetnx(self, args: list[bytes]) -> Reply:
        fields = self._hash(args[0])
        if fields is None:
            fields = self.data[args[0]] = Hash()
        if args[1] in fields:
            return 0
        fields[args[1]] = args[2]
        return 1

    def _hincrby(self, args: list[bytes]) -> Reply:
        key, name, by = args
        fields = self._hash(key)
        if fields is None:
            fields = self.data[key] = Hash()
        increment = parse_int(by)
        try:
            value = parse_int(fields.get(name, b"0")) + increment
        except CommandError:
            # (as Redis's string2ll: no spaces, no leading zeros, within 64 bits)
            raise CommandError("ERR hash value is not an integer") from None
        if not INT64_MIN <= value <= INT64_MAX:
            raise CommandError("ERR increment or decrement would overflow")
        fields[name] = str(value).encode()
        return value

    def _hmget(self, args: list[bytes]) -> Reply:
        fields = self._hash(args[0]) or Hash()
        return [fields.get(name) for name in args[1:]]

    def _hget(self, args: list[bytes]) -> Reply:
        return (self._hash(args[0]) or Hash()).get(args[1])

    def _hdel(self, args: list[bytes]) -> Reply:
        fields = self._hash(args[0])
        if fields is None:
            return 0
        removed = sum(1 for name in dict.fromkeys(args[1:]) if fields.pop(name, None) is not None)
        self._vacuum(args[0])
        return removed

    def _hlen(self, args: list[bytes]) -> Reply:
        return len(self._hash(args[0]) or ())

    def _hgetall(self, args: list[bytes]) -> Reply:
        flat: list[Reply] = []
        for name, value in (self._hash(args[0]) or Hash()).items():
            flat += [name, value]
        return flat

    def _hstrlen(self, args: list[bytes]) -> Reply:
        return len((self._hash(args[0]) or Hash()).get(args[1], b""))

    # -- sorted sets --

    def _zsorted(self, key: bytes) -> list[bytes]:
        """Members in Redis order: by score, then by member bytes."""
        members = self._zset(key) or ZSet()
        return [m for m, _ in sorted(members.items(), key=lambda item: (item[1], item[0]))]

    def _zrange(self, args: list[bytes]) -> Reply:
        options = [option.upper() for option in args[3:]]
        if options not in ([], [b"WITHSCORES"]):
            raise StubError("ZRANGE supports only WITHSCORES in the stub")
        start, stop = parse_int(args[1]), parse_int(args[2])
        ordered = self._zsorted(args[0])
        span = _clamp_range(len(ordered), start, stop)
        chosen = [] if span is None else ordered[span[0] : span[1] + 1]
        if not options:
            return list[Reply](chosen)
        members = self._zset(args[0]) or ZSet()
        return [item for m in chosen for item in (m, format_double(members[m]))]

    def _zrem(self, args: list[bytes]) -> Reply:
        members = self._zset(args[0])
        if members is None:
            return 0
        removed = 0
        for member in args[1:]:
            if member in members:
                del members[member]
                removed += 1
        self._vacuum(args[0])
        return removed

    def _zrangebyscore(self, args: list[bytes]) -> Reply:
        key, low_raw, high_raw, *rest = args
        offset, count = 0, -1
        scores = bool(rest) and rest[0].upper() == b"WITHSCORES"
        if scores:
            rest = rest[1:]
        if rest:
            if len(rest) != 3 or rest[0].upper() != b"LIMIT":
                raise StubError(
                    "ZRANGEBYSCORE supports only WITHSCORES and LIMIT offset count in the stub"
                )
            offset, count = parse_int(rest[1]), parse_int(rest[2])
        low, low_open = _parse_score_bound(low_raw)
        high, high_open = _parse_score_bound(high_raw)
        members = self._zset(key) or ZSet()
        inside = [
            m
            for m in self._zsorted(key)
            if (members[m] > low if low_open else members[m] >= low)
            and (members[m] < high if high_open else members[m] <= high)
        ]
        inside = inside[offset:]
        chosen = inside if count < 0 else inside[:count]
        if not scores:
            return list[Reply](chosen)
        return [item for m in chosen for item in (m, format_double(members[m]))]

    def _zcount(self, args: list[bytes]) -> Reply:
        chosen = self._zrangebyscore(args[:3])
        assert isinstance(chosen, list)
        return len(chosen)

    def _zremrangebyrank(self, args: list[bytes]) -> Reply:
        start, stop = parse_int(args[1]), parse_int(args[2])
        ordered = self._zsorted(args[0])
        span = _clamp_range(len(ordered), start, stop)
        if span is None:
            return 0
        members = self._zset(args[0])
        assert members is not None
        for member in ordered[span[0] : span[1] + 1]:
            del members[member]
        self._vacuum(args[0])
        return span[1] - span[0] + 1

    def _zadd(self, args: list[bytes]) -> Reply:
        pairs = args[1:]
        if pairs and pairs[0].upper() in {b"NX", b"XX", b"GT", b"LT", b"CH", b"INCR"}:
            raise StubError("ZADD flags are not implemented in the stub")
        if len(pairs) % 2:
            raise CommandError("ERR syntax error")
        scores = [parse_float(pairs[i]) for i in range(0, len(pairs), 2)]  # all before writing
        members = self._zset(args[0])
        if members is None:
            members = self.data[args[0]] = ZSet()
        added = 0
        for score, member in zip(scores, pairs[1::2], strict=True):
            added += member not in members
            members[member] = score
        return added

    def _zcard(self, args: list[bytes]) -> Reply:
        return len(self._zset(args[0]) or ())

    def _zscore(self, args: list[bytes]) -> Reply:
        members = self._zset(args[0]) or ZSet()
        return None if args[1] not in members else format_double(members[args[1]])

    def _zmscore(self, args: list[bytes]) -> Reply:
        members = self._zset(args[0]) or ZSet()
        return [None if m not in members else format_double(members[m]) for m in args[1:]]


# Builds the sandbox once per runtime: the redis table, readonly globals, a runner per chunk.
# The part of Redis's `struct` library the module uses: little-endian doubles ("<ddd..."). Its
# unpack reads from an optional position and returns the values and then the position after
# them, as Redis's does.
_STRUCT_FORMAT = re.compile(rb"<d+")


def _struct_format(fmt: bytes) -> str:
    if not _STRUCT_FORMAT.fullmatch(fmt):
        raise StubError(f"struct format {fmt!r} is not one the stub knows")
    return "<" + "d" * (len(fmt) - 1)


def _struct_pack(fmt: bytes, *values: float) -> bytes:
    return struct.pack(_struct_format(fmt), *values)


def _struct_unpack(fmt: bytes, data: bytes, init: int = 1) -> tuple[float | int, ...]:
    """From byte ``init`` (1-based, as Lua counts), as Redis's struct.unpack."""
    layout, start = _struct_format(fmt), int(init) - 1
    if start < 0 or len(data) < start + struct.calcsize(layout):
        raise StubError("struct.unpack of a string too short: the module checks sizes first")
    return (*struct.unpack_from(layout, data, start), start + struct.calcsize(layout) + 1)


_SANDBOX_LUA = r"""
function(dispatch, source, chunkname, watch, struct_pack, struct_unpack, as_library)
  local chunk, compile_error = loadstring(source, chunkname)
  if not chunk then return nil, compile_error end
  local registered -- (a library's function, once its chunk has run: FUNCTION LOAD's part)
  local functions = {} -- (a library's functions by name)

  local function readonly(t, what)
    return setmetatable({}, {
      __index = t,
      __newindex = function() error('Attempt to modify a readonly table', 2) end,
      __metatable = what,
    })
  end

  local redis = {}
  function redis.call(...)
    local ok, value = dispatch(...)
    if not ok then error(value, 0) end
    return value
  end
  function redis.pcall(...)
    local _, value = dispatch(...)
    return value
  end
  function redis.error_reply(message)
    if string.sub(message, 1, 1) == '-' then message = string.sub(message, 2) end
    return { err = message }
  end
  function redis.status_reply(message) return { ok = message } end
  if as_library then
    -- Both forms: (name, callback), and { function_name =, callback =, flags = }. Calls run
    -- the first function registered (the module's FCALL one) unless they name another.
    function redis.register_function(name, f)
      if type(name) == 'table' then name, f = name.function_name, name.callback end
      functions[name] = f
      registered = registered or f
    end
  end

  -- What Redis 7 offers a script, minus what the module has no business using (os, loadstring).
  local library = {
    assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs,
    pcall = pcall, rawequal = rawequal, rawget = rawget, rawset = rawset, select = select,
    setmetatable = watch and function(t, meta) watch(t); return setmetatable(t, meta) end
      or setmetatable,
    getmetatable = getmetatable, tonumber = tonumber,
    tostring = tostring, type = type, unpack = unpack, xpcall = xpcall,
    string = readonly(string, 'string'), table = readonly(table, 'table'),
    math = readonly(math, 'math'), redis = readonly(redis, 'redis'),
    struct = readonly({ pack = struct_pack, unpack = struct_unpack }, 'struct'),
  }

  return function(keys, argv, name)
    -- A library's calls run only a function it registered (FCALL), with no KEYS or ARGV.
    if registered then return pcall(name and functions[name] or registered, keys, argv) end
    -- Empty, so every assignment reaches __newindex (KEYS = ... fails too, as in Redis).
    local globals, per_call = {}, as_library and {} or { KEYS = keys, ARGV = argv }
    setmetatable(globals, {
      __index = function(_, name)
        local value = per_call[name]
        if value == nil then value = library[name] end
        if value == nil then
          error("Script attempted to access nonexistent global variable '" ..
            tostring(name) .. "'", 2)
        end
        return value
      end,
      __newindex = function() error('Attempt to modify a readonly table', 2) end,
      __metatable = 'globals',
    })
    setfenv(chunk, globals)
    if not as_library then return pcall(chunk) end
    -- A library's first call runs its chunk first, as FUNCTION LOAD does.
    local ok, load_error = pcall(chunk)
    if not ok then return ok, load_error end
    if not registered then return false, 'the library registered no function' end
    return pcall(name and functions[name] or registered, keys, argv)
  end
end
"""


class LuaScript:
    """One script compiled in its own Lua 5.1 runtime, run against a RedisStub."""

    def __init__(
        self,
        stub: RedisStub,
        source: bytes,
        chunkname: str,
        watch: Callable[[Any], None] | None = None,
        library: bool = False,
    ) -> None:
        """``watch``, when given, sees every table the chunk gives a metatable (a test reads
        the module's function table M that way). ``library``: the chunk is a function library
        (``redis.register_function`` exists while it runs, the first call), and every call
        runs the function it registered, as FCALL does."""
        self.stub = stub
        self._lua = lupa.LuaRuntime(encoding=None, unpack_returned_tuples=True, register_eval=False)
        self._gap: StubError | None = None
        make = self._lua.eval(_SANDBOX_LUA)
        made = make(
            self._dispatch, source, chunkname.encode(), watch, _struct_pack, _struct_unpack, library
        )
        if isinstance(made, tuple):  # (nil, message): the chunk does not compile
            raise SyntaxError(made[1].decode(errors="replace"))
        self._runner = made

    def runtime_eval(self, code: str) -> Any:
        """``code`` evaluated in the script's own Lua runtime, outside its sandbox (a bench
        sets a debug hook there: bench.lua_steps)."""
        return self._lua.eval(code)

    def rawget(self, table: Any, key: bytes) -> Any:
        """``table[key]`` without its metatable (a table ``watch`` saw)."""
        return self._lua.eval("rawget")(table, key)

    def run(
        self,
        keys: Sequence[bytes | str],
        argv: Sequence[bytes | str | int],
        function: bytes | None = None,
    ) -> Reply:
        """Run the chunk with KEYS/ARGV; the reply as redis-py would see it, or ScriptError.
        ``function``: a library's function of that name (by default the first registered)."""
        self._gap = None
        lua_keys = self._lua.table_from([_arg_bytes(k) for k in keys])
        lua_argv = self._lua.table_from([_arg_bytes(a) for a in argv])
        result = self._runner(lua_keys, lua_argv, function)
        # pcall's results: (true, reply...) or (false, error); a bare true when nothing returned.
        ok, value = (result[0], result[1]) if isinstance(result, tuple) else (result, None)
        if self._gap is not None:
            raise self._gap  # even if a pcall in the script swallowed it
        if isinstance(value, BaseException):
            raise value  # a Python exception from the stub, carried through Lua's pcall
        if not ok:
            raise ScriptError(_error_text(value))
        reply = self._to_redis(value)
        if isinstance(reply, ScriptError):
            raise reply
        return reply

    # -- Lua -> Redis (command arguments), Redis -> Lua (command replies) --

    def _dispatch(self, *args: Any) -> tuple[bool, Any]:
        try:
            argv = [self._command_arg(arg) for arg in args]
            return True, self._to_lua(self.stub.execute(argv))
        except CommandError as error:
            return False, self._lua.table_from({b"err": str(error).encode()})
        except StubError as error:
            self._gap = error
            raise

    @staticmethod
    def _command_arg(arg: Any) -> bytes:
        if isinstance(arg, bytes):
            return arg
        if isinstance(arg, int | float) and not isinstance(arg, bool):
            return format_double(float(arg))
        raise CommandError(BAD_ARG_TYPE)

    def _to_lua(self, reply: Reply) -> Any:
        if reply is None:
            return False  # a nil bulk or nil array reaches Lua as false
        if isinstance(reply, Status):
            return self._lua.table_from({b"ok": reply.text})
        if isinstance(reply, list):
            return self._lua.table_from([self._to_lua(item) for item in reply])
        return reply  # int -> number, bytes -> string

    # -- Lua -> Redis (the script's reply) --

    def _to_redis(self, value: Any) -> Reply | ScriptError:
        if value is None or value is False:
            return None
        if value is True:
            return 1
        if isinstance(value, int | float):
            number = int(value) if math.isfinite(value) else INT64_MIN
            # C's (long long) cast of an out-of-range double, as Redis does it.
            return number if INT64_MIN <= number <= INT64_MAX else INT64_MIN
        if isinstance(value, bytes):
            return value
        if lupa.lua_type(value) == "table":
            err, ok = value[b"err"], value[b"ok"]
            if isinstance(err, bytes):
                return ScriptError(err.decode(errors="surrogateescape"))
            if isinstance(ok, bytes):
                return Status(ok)
            items: list[Any] = []
            index = 1
            while (item := value[index]) is not None:  # an array ends at its first nil
                items.append(self._to_redis(item))
                index += 1
            return items
        raise StubError(f"a script reply Redis cannot convert: {value!r}")


def _arg_bytes(value: bytes | str | int) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _error_text(value: Any) -> str:
    """The message of an uncaught script error: an {err=...} table or a string."""
    if lupa.lua_type(value) == "table" and isinstance(value[b"err"], bytes):
        return str(value[b"err"].decode(errors="surrogateescape"))
    if isinstance(value, bytes):
        return value.decode(errors="surrogateescape")
    return str(value)


class Harness:
    """The real module on a RedisStub, with one queue's thirteen keys and a fake clock."""

    def __init__(
        self,
        name: str = "q",
        now_ms: int = START_MS,
        path: Path = MODULE_PATH,
        *,
        library: bool = False,
    ) -> None:
        """``library``: the module loaded as a function library and called as FCALL calls it
        (rotator.script.library_source's name line, on the module's first line, so that line
        numbers stay the file's)."""
        self.stub = RedisStub(now_ms)
        self.name = name
        self.keys = queue_keys(name)
        self.source = path.read_bytes()
        source = b"local FUNCTION_NAME = 'rotator_stub' " + self.source if library else self.source
        self.script = LuaScript(self.stub, source, MODULE_CHUNKNAME, library=library)

    @property
    def now_ms(self) -> int:
        return self.stub.now_ms

    def advance(self, ms: int) -> None:
        self.stub.advance(ms)

    def call(self, *argv: bytes | str | int) -> Reply:
        """Run one command of the module on this queue's thirteen keys."""
        return self.script.run(self.keys, argv)

    def call_read_only(self, *argv: bytes | str | int) -> Reply:
        """Run one command by the library's read-only function, as FCALL_RO does: a write
        it makes is refused (the harness must be a ``library``)."""
        self.stub.read_only = True
        try:
            return self.script.run(self.keys, argv, function=b"rotator_stub_ro")
        finally:
            self.stub.read_only = False

    def call_keys(self, keys: Sequence[bytes | str], *argv: bytes | str | int) -> Reply:
        """Run the module with any KEYS (to test its key checks)."""
        return self.script.run(keys, argv)

    def key(self, role: str) -> bytes:
        return self.keys[ROLES.index(role)].encode()

    def raw(self, role: str) -> Value | None:
        """The stored value of one of the queue's keys (None when the key does not exist)."""
        return self.stub.data.get(self.key(role))

    def ring(self) -> list[bytes]:
        """The ring, head (newest) first, as LRANGE 0 -1 shows it."""
        value = self.raw("ring")
        return list(value) if isinstance(value, list) else []
