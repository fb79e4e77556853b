"""Every limit is defined once on each side of the wire, and the two agree: the Python
constants in rotator.defaults against the Lua module's LIMIT table (evaluated under lupa)."""

from __future__ import annotations

import re
from typing import Any

import lupa.lua51 as lupa

from rotator import defaults
from rotator.script import module_source


def lua_limits() -> dict[str, Any]:
    table = re.search(r"^local LIMIT = (\{.*?^\})", module_source(), re.MULTILINE | re.DOTALL)
    assert table is not None, "lua/rotator.lua has no LIMIT table"
    runtime = lupa.LuaRuntime(unpack_returned_tuples=True)
    found = runtime.execute("return " + table[1])
    return {str(name): value for name, value in found.items()}


def test_python_limits_match_the_lua_limit_table() -> None:
    lua = lua_limits()
    assert lua["id_bytes"] == defaults.MAX_ID_BYTES
    assert lua["stamp_bytes"] == defaults.MAX_STAMP_BYTES
    assert lua["batch"] == defaults.MAX_BATCH
    assert lua["count"] == defaults.MAX_COUNT
    assert lua["budget"] == defaults.MAX_BUDGET
    assert lua["trim_budget"] == defaults.MAX_TRIM_BUDGET
    assert lua["lease_ms"] == defaults.MAX_LEASE_SECONDS * 1000
    assert lua["max_deliveries"] == defaults.MAX_DELIVERIES_LIMIT
    assert lua["error_bytes"] == defaults.MAX_ERROR_BYTES
    assert lua["groups"] == defaults.MAX_GROUPS
    assert lua["group_bytes"] == defaults.MAX_GROUP_BYTES
    assert lua["retention"] == defaults.MAX_RETENTION_COUNT
    assert lua["retention"] >= defaults.MAX_RETENTION_SECONDS * 1000
    # A publish is at most one `count` of messages, and half a batch of payload pairs.
    assert lua["count"] >= defaults.MAX_PUBLISH
    assert lua["batch"] % 2 == 0


def test_python_defaults_are_within_the_limits() -> None:
    assert 1 <= defaults.DEFAULT_BUDGET <= defaults.MAX_BUDGET
    assert 1 <= defaults.DEFAULT_PUSH_CHUNK <= defaults.MAX_BATCH
    assert 1 <= defaults.DEFAULT_WORK_BATCH <= defaults.MAX_COUNT
    assert 0 < defaults.DEFAULT_LEASE_TIMEOUT <= defaults.MAX_LEASE_SECONDS
    assert 1 <= defaults.DEFAULT_SPARK_PUSH_BATCH <= defaults.MAX_BATCH
    assert 1 <= defaults.DEFAULT_DRAIN_BATCH <= defaults.MAX_COUNT
