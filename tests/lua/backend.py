"""One interface over the lupa harness and a real server, so every scenario runs on both.

Replies are normalised to the same Python shapes on both sides: bytes become str (the ids here
are ASCII), integers stay int, nil is None, error replies raise `ReplyError` whose message is
the reply without Redis's " script: <sha>, on @user_script:N." suffix.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TypeAlias

import redis

from rotator.script import function_name, library_source
from tests.lua.harness import (
    MODULE_PATH,
    ROLES,
    Harness,
    Hash,
    Reply,
    ScriptError,
    Status,
    ZSet,
    queue_keys,
)

Result: TypeAlias = "int | str | list[Result] | None"
Arg: TypeAlias = "str | int | bytes"
# A key's content, comparable across backends: (TYPE, value in a canonical shape).
KeyState: TypeAlias = "tuple[str, object]"

_SCRIPT_SUFFIX = re.compile(r" script: [0-9a-f]{40}, on @user_script:\d+\.$")


def strip_script_suffix(message: str) -> str:
    """A server's script error without the " script: <sha>, on @user_script:N." it appends."""
    return _SCRIPT_SUFFIX.sub("", message)


class ReplyError(Exception):
    """An error reply from the module; str() is the reply text, e.g. 'ROTATOR_BADID ...'."""

    @property
    def code(self) -> str:
        return str(self).split(" ", 1)[0]


def _text(raw: bytes | str) -> str:
    return raw if isinstance(raw, str) else raw.decode("utf-8", "surrogateescape")


def _raw_bytes(text: str) -> bytes:
    """What _text made of a value, given back as its bytes (any bytes, not only UTF-8's)."""
    return text.encode("utf-8", "surrogateescape")


def normalise(reply: object) -> Result:
    """A reply of either backend in the shared shape."""
    if reply is None or isinstance(reply, int):
        return reply
    if isinstance(reply, bytes):
        return _text(reply)
    if isinstance(reply, Status):
        return _text(reply.text)
    if isinstance(reply, str):
        return reply
    if isinstance(reply, list):
        return [normalise(item) for item in reply]
    raise TypeError(f"unexpected reply {reply!r}")


class Backend(ABC):
    """A queue's thirteen keys on some server, the module callable on them, and raw key access."""

    name: str
    keys: tuple[str, ...]
    exact_clock: bool  # True when time moves only through sleep_ms (the stub's fake clock)
    tracked: list[str]  # keys beyond the ten that cleanup deletes (see track)

    @abstractmethod
    def call_keys(self, keys: Sequence[str], *argv: Arg) -> Result:
        """The module with any KEYS; raises ReplyError on an error reply."""

    @abstractmethod
    def call_read_only(self, *argv: Arg) -> Result:
        """The module by its library's read-only function (FCALL_RO) on this queue's thirteen
        keys: a backend that calls it as a library only."""

    @abstractmethod
    def sleep_ms(self, ms: int) -> None:
        """Let `ms` of server time pass."""

    @abstractmethod
    def now_ms(self) -> int:
        """The server's clock (TIME) in unix ms."""

    def state(self, role: str) -> KeyState:
        """(type, value) of one key: list -> list[str] head first, set -> sorted list[str],
        hash -> dict[str, str], zset -> dict[str, float], string -> str, none -> None."""
        return self.key_state(self.key(role))

    @abstractmethod
    def key_state(self, key: str) -> KeyState:
        """state() of any key by name (a topic's keys, a payload hash)."""

    @abstractmethod
    def raw_set_key(self, key: str, value: str) -> None: ...

    @abstractmethod
    def raw_del_key(self, key: str) -> None: ...

    @abstractmethod
    def raw_command(self, *args: str) -> None:
        """One write by hand on any key (a command the stub has), as an older module or a
        person would have made it."""

    def zscores_of(self, key: str) -> dict[str, float]:
        """A zset's members in score order (empty when the key does not exist)."""
        kind, value = self.key_state(key)
        assert kind in ("zset", "none"), f"{key} is a {kind}"
        scores = dict(value) if isinstance(value, dict) else {}
        return dict(sorted(scores.items(), key=lambda item: (item[1], item[0])))

    def track(self, *keys: str) -> None:
        """Keys beyond the queue's ten that a scenario writes: cleaned up with the queue."""
        self.tracked.extend(keys)

    @abstractmethod
    def fresh(self, suffix: str) -> Backend:
        """Another, empty queue on the same server (for cases that each need a clean slate)."""

    @abstractmethod
    def raw_lpush(self, role: str, *values: str) -> None: ...

    @abstractmethod
    def raw_rpush(self, role: str, *values: str) -> None: ...

    @abstractmethod
    def raw_set(self, role: str, value: str) -> None: ...

    @abstractmethod
    def raw_del(self, role: str) -> None: ...

    @abstractmethod
    def raw_hset(self, role: str, field: str, value: str) -> None: ...

    # -- shared on top of the primitives --

    def key(self, role: str) -> str:
        return self.keys[ROLES.index(role)]

    def call(self, *argv: Arg) -> Result:
        """One command of the module on this queue's thirteen keys."""
        return self.call_keys(self.keys, *argv)

    def key_type(self, role: str) -> str:
        return self.state(role)[0]

    def lrange(self, role: str) -> list[str]:
        kind, value = self.state(role)
        assert kind in ("list", "none"), f"{role} is a {kind}"
        return list(value) if isinstance(value, list) else []

    def ring(self) -> list[str]:
        """The ring, head (newest) first; its tail is the last item."""
        return self.lrange("ring")

    def leases(self) -> list[str]:
        """The lease list, head (newest) first; its tail is the last item."""
        return self.lrange("leases")

    def elements(self) -> list[str]:
        """Every element of the queue: the ring's, then the lease list's."""
        return self.ring() + self.leases()

    def llen(self, role: str) -> int:
        return len(self.lrange(role))

    def smembers(self, role: str) -> set[str]:
        kind, value = self.state(role)
        assert kind in ("set", "none"), f"{role} is a {kind}"
        return set(value) if isinstance(value, list) else set()

    def hgetall(self, role: str) -> dict[str, str]:
        kind, value = self.state(role)
        assert kind in ("hash", "none"), f"{role} is a {kind}"
        return dict(value) if isinstance(value, dict) else {}

    def zscores(self, role: str) -> dict[str, float]:
        kind, value = self.state(role)
        assert kind in ("zset", "none"), f"{role} is a {kind}"
        return dict(value) if isinstance(value, dict) else {}

    def exists(self, role: str) -> bool:
        return self.key_type(role) != "none"

    def snapshot(self) -> dict[str, KeyState]:
        """Every key of the queue: compare two snapshots to prove a call wrote nothing."""
        return {role: self.state(role) for role in ROLES}


class StubBackend(Backend):
    """The module under lupa with the Python Redis stand-in and a fake clock."""

    exact_clock = True

    def __init__(self, name: str = "q", path: Path = MODULE_PATH, *, library: bool = False) -> None:
        self.path = path  # another module file: to check that scenarios catch its mistakes
        self.library = library  # loaded as a function library and called as FCALL calls it
        self.harness = Harness(name, path=path, library=library)
        self.name = name
        self.keys = queue_keys(name)
        self.tracked: list[str] = []

    def call_keys(self, keys: Sequence[str], *argv: Arg) -> Result:
        try:
            reply: Reply = self.harness.call_keys(keys, *argv)
        except ScriptError as error:
            raise ReplyError(str(error)) from None
        return normalise(reply)

    def call_read_only(self, *argv: Arg) -> Result:
        assert self.library, "a script has no read-only function"
        try:
            reply: Reply = self.harness.call_read_only(*argv)
        except ScriptError as error:
            raise ReplyError(str(error)) from None
        return normalise(reply)

    def sleep_ms(self, ms: int) -> None:
        self.harness.advance(ms)

    def now_ms(self) -> int:
        return self.harness.now_ms

    def key_state(self, key: str) -> KeyState:
        value = self.harness.stub.data.get(key.encode())
        if value is None:
            return ("none", None)
        if isinstance(value, bytes):
            return ("string", _text(value))
        if isinstance(value, list):
            return ("list", [_text(v) for v in value])
        if isinstance(value, set):
            return ("set", sorted(_text(v) for v in value))
        if isinstance(value, ZSet):
            return ("zset", {_text(k): float(v) for k, v in value.items()})
        if isinstance(value, Hash):
            return ("hash", {_text(k): _text(v) for k, v in value.items()})
        raise TypeError(f"unexpected stub value {value!r}")

    def fresh(self, suffix: str) -> Backend:
        return StubBackend(f"{self.name}-{suffix}", self.path, library=self.library)

    def _raw(self, *args: str) -> None:
        self.harness.stub.execute([_raw_bytes(a) for a in args])

    def raw_lpush(self, role: str, *values: str) -> None:
        self._raw("LPUSH", self.key(role), *values)

    def raw_rpush(self, role: str, *values: str) -> None:
        self._raw("RPUSH", self.key(role), *values)

    def raw_set(self, role: str, value: str) -> None:
        self.raw_set_key(self.key(role), value)

    def raw_set_key(self, key: str, value: str) -> None:
        # SET is not a command the module uses, so the stub has none: write the key directly.
        self.harness.stub.data[key.encode()] = value.encode()

    def raw_del_key(self, key: str) -> None:
        self._raw("DEL", key)

    def raw_command(self, *args: str) -> None:
        self._raw(*args)

    def raw_del(self, role: str) -> None:
        self._raw("DEL", self.key(role))

    def raw_hset(self, role: str, field: str, value: str) -> None:
        self._raw("HSET", self.key(role), field, value)


class RealBackend(Backend):
    """The module on a real Redis/Valkey: by EVALSHA of the source loaded with SCRIPT LOAD, or
    (``via="fcall"``) by FCALL of it loaded as a function library, which keeps what it
    remembers across calls (its checked keys, whole-number arguments, packed batches)."""

    exact_clock = False

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        via: Literal["evalsha", "fcall"] = "evalsha",
        *,
        load: bool = True,
    ) -> None:
        """``load``: (re)load the library for FCALL, so that it starts with nothing kept; a
        queue made by :meth:`fresh` shares its parent's library as it is."""
        self.client = client
        self.name = name
        self.via = via
        self.keys = queue_keys(name)
        if via == "fcall" and load:
            client.function_load(library_source(), replace=True)
        sha = client.script_load(MODULE_PATH.read_text())
        self.sha = _text(sha) if isinstance(sha, bytes) else str(sha)
        self._children: list[RealBackend] = []
        self.tracked: list[str] = []

    def call_keys(self, keys: Sequence[str], *argv: Arg) -> Result:
        try:
            if self.via == "fcall":
                reply = self.client.fcall(function_name(), len(keys), *keys, *argv)
            else:
                reply = self.client.evalsha(self.sha, len(keys), *keys, *argv)
        except redis.ResponseError as error:
            raise ReplyError(strip_script_suffix(str(error))) from None
        return normalise(reply)

    def call_read_only(self, *argv: Arg) -> Result:
        assert self.via == "fcall", "a script has no read-only function"
        keys = self.keys
        try:
            reply = self.client.fcall_ro(f"{function_name()}_ro", len(keys), *keys, *argv)
        except redis.ResponseError as error:
            raise ReplyError(strip_script_suffix(str(error))) from None
        return normalise(reply)

    def sleep_ms(self, ms: int) -> None:
        time.sleep(ms / 1000)

    def now_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def key_state(self, key: str) -> KeyState:
        kind = _text(self.client.type(key))
        if kind == "none":
            return ("none", None)
        if kind == "string":
            return ("string", _text(self.client.get(key) or b""))
        if kind == "list":
            return ("list", [_text(v) for v in self.client.lrange(key, 0, -1)])
        if kind == "set":
            return ("set", sorted(_text(v) for v in self.client.smembers(key)))
        if kind == "hash":
            return ("hash", {_text(k): _text(v) for k, v in self.client.hgetall(key).items()})
        if kind == "zset":
            scores: dict[str, float] = {}
            for pair in self.client.zrange(key, 0, -1, withscores=True):
                assert isinstance(pair, tuple | list), pair
                scores[_text(pair[0])] = float(pair[1])
            return ("zset", scores)
        raise TypeError(f"unexpected key type {kind} at {key}")

    def fresh(self, suffix: str) -> Backend:
        child = RealBackend(self.client, f"{self.name}-{suffix}", self.via, load=False)
        self._children.append(child)
        return child

    def raw_lpush(self, role: str, *values: str) -> None:
        self.client.lpush(self.key(role), *values)

    def raw_rpush(self, role: str, *values: str) -> None:
        self.client.rpush(self.key(role), *values)

    def raw_set(self, role: str, value: str) -> None:
        self.client.set(self.key(role), value)

    def raw_set_key(self, key: str, value: str) -> None:
        self.client.set(key, value)

    def raw_del_key(self, key: str) -> None:
        self.client.delete(key)

    def raw_command(self, *args: str) -> None:
        self.client.execute_command(*args)  # type: ignore[no-untyped-call]  # redis-py's own

    def raw_del(self, role: str) -> None:
        self.client.delete(self.key(role))

    def raw_hset(self, role: str, field: str, value: str) -> None:
        self.client.hset(self.key(role), field, _raw_bytes(value))

    def cleanup(self) -> None:
        """Delete the queue's keys and its fresh() siblings' (tests share a server, not queues)."""
        for child in self._children:
            child.cleanup()
        self.client.delete(*self.keys, *self.tracked)
