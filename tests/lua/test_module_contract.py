"""The header of lua/rotator.lua is its contract: check it against what the body does."""

from __future__ import annotations

import re

from rotator.meta import WALK_FIELDS
from tests.lua import harness
from tests.lua.harness import MODULE_PATH, ROLES

SOURCE = MODULE_PATH.read_text()
HEADER_MATCH = re.match(r"--\[\[\n(.*?)\n\]\]\n", SOURCE, re.DOTALL)
assert HEADER_MATCH, "lua/rotator.lua must open with a --[[ ... ]] header block"
HEADER = HEADER_MATCH[1]
BODY = SOURCE[HEADER_MATCH.end() :]
SECTIONS = ("KEYS", "ELEMENTS OF THE RING", "LEASES", "COMMANDS", "ERRORS", "REDIS-CLI")
CODE_RE = re.compile(r"ROTATOR_[A-Z]+")
TYPES = {"LIST": "list", "SET": "set", "ZSET": "zset", "HASH": "hash", "STRING": "string"}


def section(title: str) -> str:
    """The lines under a header title (a line starting with it), up to the next title."""
    lines = HEADER.splitlines()
    starts = [i for i, line in enumerate(lines) if line == title or line.startswith(title + " ")]
    assert len(starts) == 1, f"header section {title!r} not found once"
    body = []
    for line in lines[starts[0] + 1 :]:
        if line and not line.startswith(" "):
            break
        body.append(line)
    # A title line may carry text after it, e.g. "ERRORS (replies start with the code)".
    return "\n".join([lines[starts[0]][len(title) :], *body])


def header_keys(title: str = "KEYS") -> list[tuple[int, str, str]]:
    """(slot, name, Redis type) per `KEYS[n]  name  TYPE  meaning` line of a KEYS section."""
    rows = re.findall(r"^  KEYS\[(\d+)\]\s+(\w+)\s+([A-Z]+)\s", section(title), re.MULTILINE)
    return [(int(slot), name, kind) for slot, name, kind in rows]


def header_commands() -> dict[str, str]:
    """Command name -> its block of the COMMANDS section."""
    blocks: dict[str, str] = {}
    current = None
    for line in section("COMMANDS").splitlines()[1:]:
        found = re.match(r"^  ([a-z_]+)\b", line)
        if found:
            current = found[1]
            assert current not in blocks, f"{current} documented twice"
            blocks[current] = line
        elif current is not None:
            blocks[current] += "\n" + line
    return blocks


def body_key_names() -> tuple[dict[str, int], dict[str, int]]:
    """Name -> KEYS slot, as the body binds them: the thirteen queue keys after a base
    (`ring = keys[base + 1]`, by M.queue_keys) and the fixed slots (`payloads = keys[14]`,
    `topic = keys[1]`, ...). The keys come in as `keys` (FCALL) or `KEYS` (EVAL)."""
    queue: dict[str, int] = {}
    fixed: dict[str, int] = {}
    for line in BODY.splitlines():
        found = re.findall(r"(\w+) = keys\[base \+ (\d+)\]", line)
        queue.update((name, int(slot)) for name, slot in found)
        fixed.update((name, int(slot)) for name, slot in re.findall(r"(\w+) = keys\[(\d+)\]", line))
    return queue, fixed


# The type each read command proves a key has (a WRONGTYPE reply otherwise).
READ_TYPES = {
    "LLEN": "list",
    "LRANGE": "list",
    "LINDEX": "list",
    "SCARD": "set",
    "SMISMEMBER": "set",
    "HLEN": "hash",
    "HMGET": "hash",
    "HVALS": "hash",
    "ZCARD": "zset",
    "ZRANGEBYSCORE": "zset",
    "ZCOUNT": "zset",
    "HGETALL": "hash",
}


def checked_key_types() -> dict[str, set[str]]:
    """Key name -> the types implied by the guarded reads (`M.read('CMD', K.name ...)`)."""
    found: dict[str, set[str]] = {}
    for command, name in re.findall(r"M\.read\('([A-Z]+)', [KT]\.(\w+)", BODY):
        found.setdefault(name, set()).add(READ_TYPES[command])
    return found


def called_commands() -> list[str]:
    return harness.called_commands(BODY)


def test_the_header_has_every_section_in_order() -> None:
    positions = [HEADER.find("\n" + title) for title in SECTIONS]
    assert all(p >= 0 for p in positions), dict(zip(SECTIONS, positions, strict=True))
    assert positions == sorted(positions)


def test_keys_are_listed_one_to_fifteen_and_the_body_names_them_the_same_in_order() -> None:
    keys = header_keys()
    assert [slot for slot, _, _ in keys] == list(range(1, 16))
    names = [name for _, name, _ in keys]
    queue, fixed = body_key_names()
    assert queue == {name: slot for slot, name, _ in keys[:13]}
    assert tuple(names[:13]) == ROLES  # the harness builds KEYS in the header's order
    assert fixed["payloads"] == 14
    assert fixed["items"] == 15
    assert names[13:] == ["payloads", "items"]
    topic = header_keys("TOPIC KEYS")
    assert [slot for slot, _, _ in topic] == [1, 2, 3, 4]
    assert {name: slot for slot, name, _ in topic} == {
        name: slot for name, slot in fixed.items() if name not in {"payloads", "items"}
    }
    # Keys are only read into those names (and counted): no keys[i] or KEYS[i] elsewhere.
    assert not re.findall(r"KEYS\[\d+\]", BODY)
    assert len(re.findall(r"keys\[\d+\]", BODY)) == 2 + len(topic)
    assert len(re.findall(r"keys\[base \+ \d+\]", BODY)) == 13


def test_the_body_checks_each_key_for_the_type_the_header_gives() -> None:
    # Every key is read through M.read (which turns WRONGTYPE into ROTATOR_WRONGTYPE) with
    # commands of exactly the type the header documents, except the wake list, which is only
    # ever written by LPUSH (checked with LLEN) and deleted.
    expected = {
        name: {TYPES[kind]} for _, name, kind in [*header_keys(), *header_keys("TOPIC KEYS")]
    }
    assert checked_key_types() == expected


# The KEYS a command's header line gives (none: the thirteen) -> its layout in COMMANDS.
LAYOUT_OF_KEYS = {
    "(KEYS 1..13, or 1..15)": "extras",
    "(KEYS 1..13, 1..14 or 1..15)": "extras",
    "(KEYS 1..13, KEYS[14] a marker hash)": "chunk",
    "(KEYS 1..14, or 1..15)": "payloads",
    "(KEYS 1..15)": "items",
}


def test_header_commands_and_the_dispatch_table_agree() -> None:
    table = re.search(r"local COMMANDS = \[\[\n(.*?)\n *\]\]", BODY, re.DOTALL)
    assert table, "no COMMANDS dispatch string in the body"
    pairs = re.findall(r"(\w+)=(\w+)", table[1])
    dispatch = dict(pairs)
    assert len(dispatch) == len(pairs), "a command listed twice in COMMANDS"
    assert re.fullmatch(r"(?:\s+\w+=\w+)+\s*", table[1]), "COMMANDS holds more than name=layout"
    # (`unique` and `once` are no commands of their own: main takes them off the push command
    # that follows)
    assert set(dispatch) | {"unique", "once"} == set(header_commands())
    for name, layout in dispatch.items():
        # `function M.push(`, indented inside define_module, and further inside a definer
        # for the sections defined on first use (M.define_push_ack, M.define_later, ...):
        # the handler is here.
        assert re.search(rf"^ *function M\.{name}\(", BODY, re.MULTILINE), name
        first_line = header_commands()[name].splitlines()[0]
        given = re.search(r"\((?:TOPIC )?KEYS[^)]*\)", first_line)
        if given and given[0].startswith("(TOPIC"):
            assert layout == "topic", name
        elif given:
            assert layout == LAYOUT_OF_KEYS[given[0]], name
        elif layout not in ("topic", "payloads"):  # (some say "as nextp" further down)
            assert layout == "queue", name


def test_every_command_documents_its_reply() -> None:
    for name, block in header_commands().items():
        assert "reply:" in block, f"{name} has no reply line"


def test_error_codes_in_the_header_and_the_body_agree() -> None:
    listed = set(CODE_RE.findall(section("ERRORS")))
    used = set(CODE_RE.findall(BODY))
    assert used == listed
    per_command = set()
    for name, block in header_commands().items():
        errors = re.search(r"errors: (.*)", block)
        codes = set(CODE_RE.findall(errors[1])) if errors else set()
        assert codes <= listed, name
        per_command |= codes
    # The rest apply to every command: key count, command name, key types, storage format.
    every = {"ROTATOR_KEYS", "ROTATOR_BADCMD", "ROTATOR_WRONGTYPE", "ROTATOR_FORMAT"}
    assert listed - per_command == every


def test_every_redis_call_names_its_command_literally_and_none_scans() -> None:
    calls = called_commands()
    assert calls, "no rcall('...') found"
    direct = len(re.findall(r"\b(?:rcall|M\.read|M\.attempt|M\.call_all)\(", BODY))
    # + the definitions of M.read, M.attempt and M.call_all, and call_all's rcall of the name
    # it is given
    assert direct == len(calls) + 4, "a command name is not a literal"
    # only main binding `rcall = redis.call`, and the one redis.pcall of M.read and M.attempt
    assert sorted(re.findall(r"\bredis\.p?call\b", BODY)) == [
        "redis.call", "redis.pcall", "redis.pcall",
    ]  # fmt: skip
    forbidden = {
        "KEYS",
        "SCAN",
        "SSCAN",
        "HSCAN",
        "ZSCAN",
        "EVAL",
        "EVALSHA",
        "EVAL_RO",
        "FCALL",
        "FLUSHALL",
        "FLUSHDB",
    }
    assert not {c.upper() for c in calls} & forbidden
    # LPOS walks a list: only ever bounded by MAXLEN.
    lpos = re.findall(r"rcall\('LPOS',[^)]*\)", BODY)
    assert lpos
    assert all(
        "'MAXLEN', LIMIT.named_look" in call or "'MAXLEN', LIMIT.take_out_look" in call
        for call in lpos
    ), lpos
    # LREM walks a list: never the ring; on the dead letters (capped, see configure's
    # dead_max) only as far as the letters requeue_dead marked; on the lease list only where
    # it holds at most LIMIT.take_out_look elements (M.takes_out, checked just before).
    assert re.findall(r"rcall\('LREM', ([\w.]+)", BODY) == ["K.leases", "K.leases", "K.dead"]
    takes_out = re.search(r"function M\.takes_out\(.*?\n    end\n", BODY, re.DOTALL)
    assert takes_out
    assert "lease_length > LIMIT.take_out_look then return false" in takes_out[0]
    pieces = re.split(r"\n\s*function M\.", BODY)  # (each function's own text, roughly)
    removing = [piece for piece in pieces if "rcall('LREM', K.leases" in piece]
    assert [piece.split("(", 1)[0] for piece in removing] == ["loop_lease", "take_out"]
    assert all("M.takes_out(" in piece for piece in removing)


def test_the_redis_cli_example_uses_the_thirteen_keys_in_order() -> None:
    example = section("REDIS-CLI")
    found = re.search(r'Q="([^"]+)"', example)
    assert found, "no Q=... key list in the redis-cli example"
    keys = found[1].split()
    assert [k.rsplit(":", 1)[1] for k in keys] == [name for _, name, _ in header_keys()[:13]]
    assert len({k.split(":")[1] for k in keys}) == 1  # one hash tag for all
    assert "EVALSHA $SHA 13 $Q" in example


def test_no_function_of_the_module_is_defined_twice() -> None:
    # The extensions are defined on first use, into the same table: one of theirs named as a
    # core function would silently replace it for every later call of the library.
    names = re.findall(r"^\s*function M\.(\w+)\(", BODY, re.MULTILINE)
    assert len(names) > 100  # (the pattern finds them)
    twice = sorted({name for name in names if names.count(name) > 1})
    assert twice == []


def quoted_list(source: str, name: str) -> list[str]:
    """The quoted names of the Lua table ``local <name> = { ... }``."""
    body = source.split(f"local {name} = {{", 1)[1].split("}", 1)[0]
    return re.findall(r"'([a-z_]+)'", body)


def test_the_loops_meta_fields_are_the_claims_and_its_places_say_so() -> None:
    """One worker's loop (M.loop_lease) reads LOOP_FIELDS by place: each is one of the fields
    every other claim reads (META_FIELDS), once, but the counter `completed`, which the loop
    writes with its other numbers; and the comment the code's l[i] follow names them at their
    places, so that reordering the list cannot go unnoticed."""
    source = MODULE_PATH.read_text(encoding="utf-8")
    meta, loop = quoted_list(source, "META_FIELDS"), quoted_list(source, "LOOP_FIELDS")
    assert len(meta) == len(set(meta)) == 24
    assert len(loop) == len(set(loop)) == 12
    assert set(loop) - set(meta) == {"completed"}
    # (a claim's first read, the fresh start's, by M.run: the loop's, lease_max at its place,
    # and the storage format, which M.run checks in the same HMGET)
    claim = quoted_list(source, "CLAIM_FIELDS")
    assert claim == [*loop, "lease_max", "format"]
    assert f"local LEASE_MAX_AT = {claim.index('lease_max') + 1}" in source
    # (a push's, plain_push's, the format last too)
    assert quoted_list(source, "PUSH_FIELDS")[-1] == "format"
    assert "local FORMAT_ONLY = { 'format' }" in source
    # The walk's twelve numbers are one packed field of both lists, not fields of their own
    # (their names are a queue's from before the packed field: see walk_of).
    walk = quoted_list(source, "WALK_FIELDS")
    assert len(walk) == len(set(walk)) == 12
    assert "walk" in loop
    assert not set(walk) & set(meta)
    assert f"'<{'d' * len(walk)}', {8 * len(walk)}," in source  # WALK_FORMAT, WALK_BYTES
    assert tuple(walk) == WALK_FIELDS  # (rotator.meta decodes the field by these)
    # (the numbers read alone are named at their places)
    for name, place in re.findall(
        r"(\w+) = (\d+)", source.split("local WALK_PLACE = {")[1].split("}")[0]
    ):
        assert walk[int(place) - 1] == name
    places = source.split("-- (l by LOOP_FIELDS' places: ", 1)[1].split(")", 1)[0]
    named = re.findall(r"(\d+) ([a-z_]+)", places.replace("\n    --", ""))
    assert [(int(i), name) for i, name in named] == list(enumerate(loop, 1))
