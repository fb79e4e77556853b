"""What a library remembers between calls (KEPT) changes nothing it replies or writes.

Loaded as a function library the module keeps texts it read or made with what they convert
to (TIME's seconds, a queue's origin, a push log's head, the whole ack of each batch it
made); run as a script it keeps nothing. Two harnesses run the same random programs, one
loading the module as a library, one as a script, on two queues in turn (so that what one
queue's calls remembered meets the other's), with time moving by less and more than a
second and queues deleted and made again (a new origin, against which the acks of before,
still sent, are refused): after every step the replies and every key must be equal.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.lua.harness import ROLES, Harness, ScriptError, as_text, queue_keys

LEASE_MS = 1000
QUEUES = (queue_keys("kept-a"), queue_keys("kept-b"))
ADVANCES = (1, 300, 999, 1000, 1500, 2 * LEASE_MS)
KINDS = ("push", "push", "loop", "loop", "loop", "next", "ack", "advance", "delete", "stats")
Step = tuple[str, int, int]
step = st.tuples(st.sampled_from(KINDS), st.integers(0, 1), st.integers(0, 40))


class Pair:
    """The module as a library and as a script, the same calls on both."""

    def __init__(self) -> None:
        self.library = Harness("kept-a", library=True)
        self.script = Harness("kept-a")
        self.acks: list[list[str]] = [[], []]  # each queue's batch ack to send next
        self.tokens: list[list[str]] = [[], []]  # each queue's later deliveries
        self.pushed = 0

    def both(self, queue: int, *argv: str | int) -> object:
        replies = []
        for harness in (self.library, self.script):
            try:
                replies.append(("ok", as_text(harness.call_keys(QUEUES[queue], *argv))))
            except ScriptError as error:
                replies.append(("error", str(error)))
        assert replies[0] == replies[1], (queue, argv, replies)
        assert self.library.stub.data == self.script.stub.data, (queue, argv)
        return replies[0][1]

    def claim(self, queue: int, count: int, acks: list[str]) -> None:
        reply = self.both(queue, "next_packed", count, LEASE_MS, 1000, 0, *acks)
        if not isinstance(reply, list):
            return
        element = reply[3]
        assert isinstance(element, str)
        self.acks[queue] = (
            [element[: element.index("*", 1)] + "/" + str(element.count("*") - 1)]
            if element
            else []
        )
        self.tokens[queue] += [str(t) for t in reply[4::2]]


def run(pair: Pair, program: list[Step]) -> None:
    for kind, queue, a in program:
        if kind == "push":
            ids = [f"j{pair.pushed + i}" for i in range(a % 5 + 1)]
            pair.pushed += len(ids)
            pair.both(queue, "push", *ids)
        elif kind == "loop":  # one worker: the batch ack of its last claim, as it claims again
            acks, pair.acks[queue] = pair.acks[queue], []
            pair.claim(queue, a % 3 + 1, acks)
        elif kind == "next":  # a claim acking nothing (its batch stays in flight)
            pair.claim(queue, a % 3 + 1, [])
        elif kind == "ack" and pair.tokens[queue]:
            pair.both(queue, "ack", pair.tokens[queue].pop(a % len(pair.tokens[queue])))
        elif kind == "advance":
            for harness in (pair.library, pair.script):
                harness.advance(ADVANCES[a % len(ADVANCES)])
        elif kind == "delete":  # made again by the next push: a new origin
            pair.both(queue, "delete")  # (its acks kept: sent late, both must refuse them)
        elif kind == "stats":
            pair.both(queue, "stats")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.lists(step, min_size=1, max_size=80))
def test_a_library_replies_and_writes_what_a_script_does(program: list[Step]) -> None:
    run(Pair(), program)


def test_two_queues_in_turn_across_seconds_and_a_new_origin() -> None:
    """A fixed program through everything the library remembers: both queues' loops in turn,
    pushes within a second and a second apart (a push log's head kept, then a new one), and a
    queue deleted and made again while the other's origin is the one remembered."""
    pair = Pair()
    program: list[Step] = [("push", 0, 20), ("push", 1, 20)]
    for second in range(3):
        program += [("loop", 0, 0), ("loop", 1, 1), ("push", 0, 2), ("push", 1, 3)]
        program += [("advance", 0, 1), ("loop", 0, 2), ("loop", 1, 0), ("advance", 0, 3)]
        if second == 1:
            program += [("delete", 0, 0), ("push", 0, 4), ("loop", 1, 0), ("loop", 0, 0)]
    program += [("stats", 0, 0), ("stats", 1, 0)]
    run(pair, program)
    # The program crossed seconds: each queue's push log started more than one checkpoint.
    for keys in QUEUES:
        pushlog = keys[ROLES.index("pushlog")].encode()
        started = [c for c in pair.library.stub.calls if c[:2] == (b"LPUSH", pushlog)]
        assert len(started) >= 2, started
