"""Sections 8-13 of the module are defined on first use: an EVAL call of a worker's busy loop
(next_packed with the batch ack of the batch before) on a plain queue creates none of their
functions (creating them is a good part of an EVAL call's cost) unless it walks the lists,
which defines the walk (10) and the acks one by one (8) and nothing else; push and ack define
section 8 only; nack, bury and extend their own small section (9), and 8; a call that needs a
section defines that section then, and works.

The harness runs the chunk afresh for every call, as EVAL does; the module's function table M
is the one table the chunk gives the metatable that defines the later sections.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.bounds import whole_batch_ack
from tests.lua.harness import MODULE_CHUNKNAME, Harness, LuaScript, ScriptError

LEASE_MS = 30_000
DEFINERS = {
    "push_ack": b"define_push_ack",
    "setbacks": b"define_setbacks",
    "walk": b"define_walk",
    "later": b"define_later",
    "extensions": b"define_extensions",
}


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
        """The sections the last call defined: "push_ack" (8), "setbacks" (9), "walk" (10),
        "later" (11), "extensions" (12 and 13)."""
        rawget = self.script.rawget
        (functions,) = [t for t in self.tables if rawget(t, b"define_later") is not None]
        return {
            name
            for name, definer in DEFINERS.items()
            if rawget(functions, definer) is False  # (a definer that ran is set to false)
        }


def test_a_workers_loop_on_a_busy_queue_defines_nothing() -> None:
    """The Python client's loop, next_packed with the previous batch's batch ack, takes the
    short way of next once the queue knows its leases' earliest deadline: nothing is defined
    on first use, whether one job or a hundred a call; a push and an ack on its own define
    section 8 only."""
    queue = Watched()
    assert queue.call("push", *[f"job-{n}" for n in range(1000)]) == 1000
    assert queue.defined() == {"push_ack"}
    for count in (1, 100):
        element = bytes(queue.call("next_packed", count, LEASE_MS, 1000, 5)[3])
        for _ in range(3):
            reply = queue.call("next_packed", count, LEASE_MS, 1000, 5, whole_batch_ack(element))
            assert reply[2] == 1  # the previous batch acked (one batch ack)
            assert queue.defined() == set()
            element = bytes(reply[3])
            assert element.count(b"*") - 1 == count
        assert queue.call("ack", whole_batch_ack(element)) == 1
        assert queue.defined() == {"push_ack"}
    assert queue.call("push", "more") == 1
    assert queue.defined() == {"push_ack"}


def test_a_call_that_walks_defines_the_walk_only() -> None:
    """A claim that must walk (a new queue's first, tokens acked one by one, a nacked job due
    again, a buried one to drop, an expired lease) defines the walk and the acks one by one
    (section 8), and no other section; an ack and a push define section 8 only, a claim the
    short way takes nothing; nack, extend and bury define their own section and section 8."""
    queue = Watched()

    def call(*argv: bytes | str | int, walks: bool = False) -> Any:
        reply = queue.call(*argv)
        setback = argv[0] in ("nack", "bury", "extend")
        own = {"walk"} if walks else {"setbacks"} if setback else set()
        section_8 = walks or setback or argv[0] in ("push", "ack")
        assert queue.defined() == own | ({"push_ack"} if section_8 else set()), argv
        return reply

    assert call("push", "a", "b", "c", "d") == 4
    first = bytes(call("next", 1, LEASE_MS, 1000, 5, walks=True)[3])
    packed = call("next_packed", 1, LEASE_MS, 1000, 5, first, walks=True)
    assert packed[2] == 1  # the ack went with it
    assert packed[3].endswith(b"*b")
    assert call("ack", whole_batch_ack(bytes(packed[3]))) == 1
    held = bytes(call("next", 1, LEASE_MS, 1000, 5)[3])
    assert held.startswith(b"c*")
    assert call("extend", LEASE_MS, held)[1:] == [1]
    assert call("nack", 0, held) == [1]
    queue.advance(1)
    retried = bytes(call("next", 1, LEASE_MS, 1000, 5, walks=True)[3])
    assert retried.startswith(b"c*")
    assert retried != held
    assert call("bury", "gave up", retried) == [1]
    # A lease that expires comes round and is leased again.
    last = bytes(call("next", 1, LEASE_MS, 1000, 5, walks=True)[3])
    assert last.startswith(b"d*")
    queue.advance(LEASE_MS + 1)
    again = call("next", 1, LEASE_MS, 1000, 5, walks=True)
    assert again[3].startswith(b"d*")
    assert again[3] != last
    assert again[4] == 1  # reclaimed
    assert call("ack", again[3]) == 1


def test_a_call_that_needs_a_later_section_defines_it_and_works() -> None:
    queue = Watched()
    assert queue.call("push_later", "IN", 0, "x") == 1
    assert queue.defined() == {"later", "push_ack"}  # (a push's bookkeeping: section 8)
    stats = queue.call("stats")
    assert queue.defined() == {"later"}
    assert b"scheduled" in stats
    # A plain call on a queue with scheduled jobs promotes them (section 11), then leases (a
    # new queue's first claim walks: sections 10 and 8).
    assert queue.call("next", 1, LEASE_MS, 1000, 5)[3].startswith(b"x*")
    assert queue.defined() == {"later", "walk", "push_ack"}
    assert queue.call("pause") == 1
    assert queue.defined() == {"later"}
    payloads = (*queue.keys, f"{queue.keys[0][: -len(':ring')]}:payloads")
    queue.tables.clear()
    assert queue.script.run(payloads, ["pushp", "p", "body"]) == 1
    assert queue.defined() == {"extensions", "push_ack"}


def test_an_unknown_command_defines_nothing() -> None:
    queue = Watched()
    with pytest.raises(ScriptError, match="ROTATOR_BADCMD"):
        queue.call("stat")
    assert queue.defined() == set()
