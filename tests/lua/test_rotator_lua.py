"""Every scenario of tests/lua/scenarios.py on the lupa harness, plus the harness's own rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lua.backend import StubBackend
from tests.lua.harness import (
    MODULE_PATH,
    Harness,
    LuaScript,
    RedisStub,
    ScriptError,
    Status,
    StubError,
    called_commands,
)
from tests.lua.scenarios import LIBRARY_ONLY, SCENARIOS, Scenario

# (a library's scenario as a library only)
STUB_RUNS = [
    (scenario, library)
    for scenario in SCENARIOS
    for library in (False, True)
    if library or scenario.__name__ not in LIBRARY_ONLY
]


@pytest.mark.parametrize(
    ("scenario", "library"),
    STUB_RUNS,
    ids=[f"{s.__name__}-{'library' if library else 'eval'}" for s, library in STUB_RUNS],
)
def test_scenario_on_the_stub(scenario: Scenario, library: bool) -> None:
    """Each scenario as EVAL runs the module (the whole chunk a call) and as FCALL runs a
    library (its chunk once, then the function it registered, keeping what a library keeps
    between calls)."""
    scenario(StubBackend(library=library))


def test_the_stub_refuses_a_write_while_a_read_only_function_runs() -> None:
    harness = Harness("ro", library=True)
    harness.call("push", "a")
    ring = harness.ring()
    harness.stub.read_only = True
    with pytest.raises(ScriptError, match="Write commands are not allowed from read-only"):
        harness.call("push", "b")  # (the module's own function, not the read-only one)
    harness.stub.read_only = False
    assert harness.ring() == ring


def _script(source: str, stub: RedisStub | None = None) -> LuaScript:
    return LuaScript(stub or RedisStub(), source.encode(), "@user_script")


def test_the_stub_implements_exactly_the_commands_the_module_calls() -> None:
    source = MODULE_PATH.read_text()
    called = {name.upper() for name in called_commands(source)}
    assert called == {name.decode() for name in RedisStub().commands}


def test_an_unknown_command_fails_loudly_even_under_pcall() -> None:
    script = _script("local r = redis.pcall('LINSERT', KEYS[1], 'BEFORE', 'x', 'y') return 1")
    with pytest.raises(StubError, match="LINSERT"):
        script.run([b"k"], [])


def test_creating_or_reading_an_undeclared_global_fails() -> None:
    with pytest.raises(ScriptError, match="readonly table"):
        _script("leaked = 1 return 1").run([], [])
    with pytest.raises(ScriptError, match="nonexistent global variable 'nope'"):
        _script("return nope").run([], [])
    with pytest.raises(ScriptError, match="readonly table"):
        _script("string.extra = 1 return 1").run([], [])
    with pytest.raises(ScriptError, match="readonly table"):
        _script("KEYS = {} return 1").run([], [])
    with pytest.raises(ScriptError, match="nonexistent global variable 'os'"):
        _script("return os.time()").run([], [])


def test_script_replies_convert_like_redis() -> None:
    script = _script("return {1, 2.7, -2.7, false, 'x', true, nil, 3}")
    assert script.run([], []) == [1, 2, -2, None, b"x", 1]
    assert _script("return {{1, {2}}, {ok='S'}}").run([], []) == [[1, [2]], Status(b"S")]
    assert _script("return 1.9e30").run([], []) == -(2**63)
    assert _script("return nil").run([], []) is None
    assert _script("return {err=5}").run([], []) == []
    with pytest.raises(ScriptError, match=r"^ROTATOR_X msg$"):
        _script("return {err='ROTATOR_X msg'}").run([], [])
    with pytest.raises(ScriptError, match=r"^ROTATOR_Y msg$"):
        _script("return redis.error_reply('ROTATOR_Y msg')").run([], [])
    assert _script("return redis.status_reply('FINE')").run([], []) == Status(b"FINE")


def test_command_replies_and_errors_reach_lua_like_redis() -> None:
    stub = RedisStub(now_ms=1_000_123)
    script = _script(
        """
        local t = redis.call('TIME')
        local kind = redis.call('TYPE', KEYS[1])
        redis.call('RPUSH', KEYS[1], 'a', 2.5, 7)
        local gone = redis.call('LINDEX', KEYS[1], 10)
        local caught = redis.pcall('SADD', KEYS[1], 'x')
        return {t[1], t[2], kind.ok, type(gone), caught.err,
                redis.call('LRANGE', KEYS[1], -100, 100)}
        """,
        stub,
    )
    reply = script.run([b"k"], [])
    wrongtype = b"WRONGTYPE Operation against a key holding the wrong kind of value"
    assert reply == [b"1000", b"123000", b"none", b"boolean", wrongtype, [b"a", b"2.5", b"7"]]
    with pytest.raises(ScriptError, match=r"^WRONGTYPE"):
        _script("return redis.call('SCARD', KEYS[1])", stub).run([b"k"], [])
    with pytest.raises(ScriptError, match="must be strings or integers"):
        _script("return redis.call('LPUSH', KEYS[1], true)", stub).run([b"k"], [])
    with pytest.raises(ScriptError, match="Wrong number of args"):
        _script("return redis.call('LPUSH', KEYS[1])", stub).run([b"k"], [])


def test_list_commands_clamp_and_delete_emptied_keys() -> None:
    stub = RedisStub()

    def run(*args: bytes) -> object:
        return stub.execute(list(args))

    assert run(b"RPUSH", b"l", b"a", b"b", b"c") == 3
    assert run(b"LRANGE", b"l", b"-100", b"100") == [b"a", b"b", b"c"]
    assert run(b"LRANGE", b"l", b"2", b"1") == []
    assert run(b"LRANGE", b"l", b"-2", b"-1") == [b"b", b"c"]
    assert run(b"LINDEX", b"l", b"-1") == b"c"
    assert run(b"LPUSH", b"l", b"x", b"y") == 5
    assert run(b"LRANGE", b"l", b"0", b"1") == [b"y", b"x"]
    assert run(b"LTRIM", b"l", b"5", b"2") == Status(b"OK")
    assert b"l" not in stub.data
    assert run(b"TYPE", b"l") == Status(b"none")
    assert run(b"SADD", b"s", b"m") == 1
    assert run(b"SREM", b"s", b"m") == 1
    assert b"s" not in stub.data


def test_harness_runs_the_real_module_file() -> None:
    harness = Harness("orders")
    assert harness.source == MODULE_PATH.read_bytes()
    assert harness.call("push", "job-1") == 1
    assert harness.ring() == [b"job-1", b"*lap"]
    assert harness.keys[0] == "rotator:{orders}:ring"
    with pytest.raises(ScriptError, match=r"^ROTATOR_BADCMD"):
        harness.call("nope")


def test_a_module_that_creates_a_global_fails(tmp_path: Path) -> None:
    # The guard must hold for the module itself, not only for small scripts.
    source = MODULE_PATH.read_text()
    header_end = source.index("]]\n") + 3
    broken = tmp_path / "rotator.lua"
    broken.write_text(source[:header_end] + "counter = 0\n" + source[header_end:])
    with pytest.raises(ScriptError, match="readonly table"):
        Harness(path=broken).call("stats")
