"""Every scenario of tests/lua/scenarios.py on real Redis 7 and Valkey 8, by EVALSHA and by FCALL.

The same scenarios run on the lupa stub (tests/lua/test_rotator_lua.py); running them here as
well is what keeps the stub honest. Scenarios that need the clock moved by hours run on the
stub only. Small scripts below also pin the Lua <-> Redis conversions the stub imitates.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.lua.backend import RealBackend, ReplyError, StubBackend, normalise, strip_script_suffix
from tests.lua.harness import LuaScript, RedisStub, ScriptError
from tests.lua.scenarios import FAKE_CLOCK_ONLY, LIBRARY_ONLY, SCENARIOS, Scenario

REAL_TIME = [s for s in SCENARIOS if s.__name__ not in FAKE_CLOCK_ONLY]
BY_SCRIPT = [s for s in REAL_TIME if s.__name__ not in LIBRARY_ONLY]


@pytest.fixture
def backend(client: redis.Redis, queue_name: str) -> Iterator[RealBackend]:
    real = RealBackend(client, queue_name)
    yield real
    real.cleanup()


@pytest.fixture
def library_backend(client: redis.Redis, queue_name: str) -> Iterator[RealBackend]:
    """The module by FCALL, loaded afresh as a library (see RealBackend)."""
    real = RealBackend(client, queue_name, via="fcall")
    yield real
    real.cleanup()


@pytest.mark.parametrize("scenario", BY_SCRIPT, ids=[s.__name__ for s in BY_SCRIPT])
def test_scenario_on_a_real_server(scenario: Scenario, backend: RealBackend) -> None:
    scenario(backend)


@pytest.mark.parametrize("scenario", REAL_TIME, ids=[s.__name__ for s in REAL_TIME])
def test_scenario_by_fcall(scenario: Scenario, library_backend: RealBackend) -> None:
    """The same, by FCALL of the module loaded as a library: what it keeps from one call to the
    next (the keys it checked, the numbers it read, the packed batches it made, whose ids a
    named batch ack then gets back) must change no reply and no key."""
    scenario(library_backend)


# Small scripts whose replies must be the same from the stub and from the server.
SNIPPETS = [
    "return {1, 2.7, -2.7, false, 'x', true, nil, 3}",
    "return {{1, {2}}, {ok='S'}}",
    "return {err=5}",
    "return {err='ROTATOR_X msg'}",
    "return redis.error_reply('ROTATOR_Y msg')",
    "return redis.status_reply('FINE')",
    "return redis.call('TYPE', KEYS[1])",
    "return type(redis.call('LINDEX', KEYS[1], 0))",
    "redis.call('RPUSH', KEYS[1], 'a', 2.5, 7, -3) return redis.call('LRANGE', KEYS[1], -100, 99)",
    "redis.call('RPUSH', KEYS[1], 'a', 'b', 'c') redis.call('LTRIM', KEYS[1], 5, 2) "
    "return redis.call('LLEN', KEYS[1])",
    "redis.call('RPUSH', KEYS[1], 'a') return redis.call('SADD', KEYS[1], 'x')",
    "redis.call('RPUSH', KEYS[1], 'a') return redis.pcall('SADD', KEYS[1], 'x').err",
    "redis.call('SADD', KEYS[1], 'a') redis.call('SREM', KEYS[1], 'a') "
    "return redis.call('TYPE', KEYS[1])",
    "redis.call('HSET', KEYS[1], 'f', 1, 'g', 2) "
    "return {redis.call('HMGET', KEYS[1], 'f', 'no', 'g'), redis.call('HDEL', KEYS[1], 'f', 'f')}",
    "redis.call('ZADD', KEYS[1], 1, 'a', 2, 'b', 3, 'c') "
    "return {redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(2', 'LIMIT', 0, 5), "
    "redis.call('ZREMRANGEBYRANK', KEYS[1], 0, 0), redis.call('ZMSCORE', KEYS[1], 'a', 'b')}",
    "redis.call('RPUSH', KEYS[1], 'a', 'x', 'b', 'x', 'x') "
    "return {redis.call('LREM', KEYS[1], 2, 'x'), redis.call('LRANGE', KEYS[1], 0, -1)}",
    "redis.call('RPUSH', KEYS[1], 'x', 'a', 'x', 'b', 'x') "
    "return {redis.call('LREM', KEYS[1], -2, 'x'), redis.call('LRANGE', KEYS[1], 0, -1), "
    "redis.call('LREM', KEYS[1], -1, 'no'), redis.call('LREM', KEYS[1], -5, 'x')}",
    "redis.call('RPUSH', KEYS[1], 'x', 'a', 'x', 'b', 'x') "
    "return {redis.call('LPOS', KEYS[1], 'x', 'COUNT', 2), "
    "redis.call('LPOS', KEYS[1], 'x', 'COUNT', 0), "
    "redis.call('LPOS', KEYS[1], 'x', 'COUNT', 2, 'MAXLEN', 2), "
    "redis.call('LPOS', KEYS[1], 'x', 'RANK', -1, 'COUNT', 2), "
    "redis.call('LPOS', KEYS[1], 'no', 'COUNT', 2), "
    "redis.call('LPOS', KEYS[1] .. 'x', 'x', 'COUNT', 2), "
    "redis.call('LPOS', KEYS[1], 'x', 'RANK', 2)}",
    "redis.call('HSET', KEYS[1], 'n', 1) "
    "return {redis.call('HINCRBY', KEYS[1], 'n', -1), redis.call('HINCRBY', KEYS[1], 'm', 2), "
    "redis.pcall('HINCRBY', KEYS[1], 'x', 'y').err ~= nil}",
    "return redis.call('ZADD', KEYS[1], 'nan', 'a')",
    "redis.call('ZADD', KEYS[1], 1, 'a', 2, 'b', 2, 'bb', 3, 'c') "
    "return {redis.call('ZRANGE', KEYS[1], 0, 1), redis.call('ZRANGE', KEYS[1], 5, 9), "
    "redis.call('ZRANGEBYSCORE', KEYS[1], 2, 3, 'LIMIT', 1, 2), "
    "redis.call('ZRANGEBYSCORE', KEYS[1], 4, 9), redis.call('ZREMRANGEBYRANK', KEYS[1], 0, 1), "
    "redis.call('ZRANGE', KEYS[1], 0, -1), redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -1), "
    "redis.call('TYPE', KEYS[1])}",
    "redis.call('HSET', KEYS[1], 'f', 'abc') return {redis.call('HSTRLEN', KEYS[1], 'f'), "
    "redis.call('HSTRLEN', KEYS[1], 'no'), redis.call('HGETALL', KEYS[1]), "
    "redis.call('HGETALL', KEYS[1] .. 'x')}",
    "return redis.call('LRANGE', KEYS[1], '01', 2)",
    "redis.call('ZADD', KEYS[1], 1, 'a', 4, 'b', 9, 'c') "
    "return {redis.call('ZCOUNT', KEYS[1], '-inf', 4), redis.call('ZCOUNT', KEYS[1], '(1', 9), "
    "redis.call('ZCOUNT', KEYS[1], 10, '+inf'), redis.call('ZCOUNT', KEYS[1] .. 'x', 0, 1), "
    "redis.call('ZRANGE', KEYS[1], 1, 9, 'WITHSCORES')}",
    "local before = redis.call('EXISTS', KEYS[1], KEYS[1] .. 'x') "
    "redis.call('SADD', KEYS[1], 'a') redis.call('HSET', KEYS[1] .. 'x', 'f', 1) "
    "return {before, redis.call('EXISTS', KEYS[1]), redis.call('EXISTS', KEYS[1], KEYS[1], "
    "KEYS[1] .. 'x', KEYS[1] .. 'y')}",
    "redis.call('RPUSH', KEYS[1], 'a') return redis.call('LSET', KEYS[1], 5, 'x')",
    "return redis.call('RENAME', KEYS[1], KEYS[1] .. 'x')",
    "redis.call('RPUSH', KEYS[1], 'a', 'b') return {redis.call('RPOP', KEYS[1]), "
    "redis.call('RPOP', KEYS[1]), redis.call('RPOP', KEYS[1]), redis.call('LLEN', KEYS[1])}",
    "redis.call('RPUSH', KEYS[1], 'a', 'b', 'c', 'd') return {redis.call('RPOP', KEYS[1], 3), "
    "redis.call('RPOP', KEYS[1], 3), redis.call('RPOP', KEYS[1], 2), "
    "redis.call('EXISTS', KEYS[1])}",
    "return redis.call('LPUSH', KEYS[1])",
    "leaked = 1 return 1",
    "KEYS = {} return 1",
    "string.extra = 1 return 1",
    "return nope",
]


def _outcome(run: object) -> object:
    """The normalised reply, or ('error', first words) for an error reply."""
    assert callable(run)
    try:
        return normalise(run())
    except (ScriptError, ReplyError, redis.ResponseError) as error:
        # Redis and Valkey word some errors differently after the first words.
        text = strip_script_suffix(str(error)).removeprefix("ERR ")
        return ("error", " ".join(text.split()[:4]))


@pytest.mark.parametrize("source", SNIPPETS)
def test_the_stub_converts_like_the_server(
    source: str, client: redis.Redis, queue_name: str
) -> None:
    key = f"{queue_name}:k"
    try:
        real = _outcome(lambda: client.eval(source, 1, key))
    finally:
        client.delete(key, key + "x")
    script = LuaScript(RedisStub(), source.encode(), "@user_script")
    assert _outcome(lambda: script.run([key.encode()], [])) == real


def test_stub_and_server_leave_the_same_keys_after_a_lifecycle(
    backend: RealBackend,
) -> None:
    # Not just replies: the stored state must match too (tokens differ only in their times).
    stub = StubBackend(backend.name)
    for b in (stub, backend):
        b.call("push", "a", "b", "c")
        b.call("next", 2, 60_000, 1000, 0)
        b.call("push", "d")
    assert {role: kind for role, (kind, _) in stub.snapshot().items()} == {
        role: kind for role, (kind, _) in backend.snapshot().items()
    }
    shape = [e.split("*")[0] for e in stub.ring()]
    assert shape == [e.split("*")[0] for e in backend.ring()]
