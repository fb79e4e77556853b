"""Sections 8-10 of the module are defined on first use: an EVAL call of a worker's command
on a plain queue creates none of their functions (creating them is a good part of an EVAL
call's cost), and a call that needs one defines its section then, and works.

The harness runs the chunk afresh for every call, as EVAL does; the module's function table M
is the one table the chunk gives the metatable that defines the later sections.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.lua.harness import MODULE_CHUNKNAME, Harness, LuaScript, ScriptError

LEASE_MS = 30_000


class Watched(Harness):
    """A harness that keeps the module's function table of its last call."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[Any] = []
        self.script = LuaScript(self.stub, self.source, MODULE_CHUNKNAME, self.tables.append)

    def call(self, *argv: bytes | str | int) -> Any:
        self.tables.clear()
        return super().call(*argv)

    def defined(self) -> set[str]:
        """The sections the last call defined: "later" (8), "extensions" (9 and 10)."""
        rawget = self.script.rawget
        (functions,) = [t for t in self.tables if rawget(t, b"define_later") is not None]
        return {
            name
            for name, definer in (("later", b"define_later"), ("extensions", b"define_extensions"))
            if rawget(functions, definer) is False  # (a definer that ran is set to false)
        }


def test_a_workers_calls_on_a_plain_queue_define_no_later_section() -> None:
    queue = Watched()

    def claim(*acks: bytes) -> bytes:
        reply = queue.call("next", 1, LEASE_MS, 1000, 5, *acks)
        assert queue.defined() == set()
        return bytes(reply[3])

    assert queue.call("push", "a", "b", "c", "d") == 4
    assert queue.defined() == set()
    first = claim()
    packed = queue.call("next_packed", 1, LEASE_MS, 1000, 5, first)
    assert packed[2] == 1  # the ack went with it
    assert packed[3].endswith(b"*b")
    assert queue.defined() == set()
    batch = packed[3][: packed[3].index(b"*", 1)]
    assert queue.call("ack", batch + b"/1") == 1
    held = claim()
    assert held.startswith(b"c*")
    assert queue.call("extend", LEASE_MS, held)[1:] == [1]
    assert queue.call("nack", 0, held) == [1]
    assert queue.defined() == set()
    queue.advance(1)
    retried = claim()
    assert retried.startswith(b"c*")
    assert retried != held
    assert queue.call("bury", "gave up", retried) == [1]
    assert queue.defined() == set()
    # A lease that expires comes round and is leased again.
    last = claim()
    queue.advance(LEASE_MS + 1)
    again = queue.call("next", 1, LEASE_MS, 1000, 5)
    assert again[3].startswith(b"d*")
    assert again[3] != last
    assert again[4] == 1  # reclaimed
    assert queue.call("ack", again[3]) == 1
    assert queue.defined() == set()


def test_a_call_that_needs_a_later_section_defines_it_and_works() -> None:
    queue = Watched()
    assert queue.call("push_later", "IN", 0, "x") == 1
    assert queue.defined() == {"later"}
    stats = queue.call("stats")
    assert queue.defined() == {"later"}
    assert b"scheduled" in stats
    # A plain call on a queue with scheduled jobs promotes them (section 8), then leases.
    assert queue.call("next", 1, LEASE_MS, 1000, 5)[3].startswith(b"x*")
    assert queue.defined() == {"later"}
    assert queue.call("pause") == 1
    assert queue.defined() == {"later"}
    payloads = (*queue.keys, f"{queue.keys[0][: -len(':ring')]}:payloads")
    queue.tables.clear()
    assert queue.script.run(payloads, ["pushp", "p", "body"]) == 1
    assert queue.defined() == {"extensions"}


def test_an_unknown_command_defines_nothing() -> None:
    queue = Watched()
    with pytest.raises(ScriptError, match="ROTATOR_BADCMD"):
        queue.call("stat")
    assert queue.defined() == set()
