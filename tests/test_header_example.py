"""The REDIS-CLI block of the module header (lua/rotator.lua), run as written.

The README's redis-cli block is run by tests/test_readme.py; this runs the header's, which
shows one line per command, against Redis 7 and Valkey 8. A redis-cli shim on PATH talks to
the test server with `-e` (an error reply exits non-zero, so `set -e` stops the block at the
first failing line) and records each call with its reply, so each command's reply can be
checked by name rather than by its place in the output.
"""

from __future__ import annotations

import re
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import redis

from rotator.script import function_name
from tests.lua.test_module_contract import header_commands, section
from tests.servers import ServerProcess, find_cli_binary

ROOT = Path(__file__).resolve().parent.parent
# One record per redis-cli call: its arguments, each ended by \x1f, then its reply lines.
RECORD, FIELD = "\x1e", "\x1f"
# `EVALSHA $SHA 13 $Q [unique] COMMAND` (keys: variables, or a name like push_chunk's marker):
# the commands a line of the block calls.
CALL_RE = re.compile(r"EVALSHA \$SHA \d+ (?:\$[A-Z]+ |rotator:\S+ )+(unique )?([a-z_]+)")
# The hash tags the block writes under; cleared before it runs.
TAGS = ("orders", "emails", "news")


@dataclass(frozen=True)
class Call:
    verb: str  # EVALSHA, FCALL or FCALL_RO
    command: str  # the module command (`unique` calls: the push command after it)
    args: list[str]  # its ARGV after the command
    reply: list[str]  # redis-cli's output lines


def header_example() -> str:
    """The REDIS-CLI section of the header as a shell script."""
    return textwrap.dedent(section("REDIS-CLI")).strip("\n") + "\n"


def functions_example() -> str:
    """The FUNCTIONS section's shell lines (after its text) as a script."""
    text = textwrap.dedent(section("FUNCTIONS").split("\n", 1)[1])
    return text[text.index("\nL=") + 1 :].strip("\n") + "\n"


def run_with_logging_cli(server: ServerProcess, script: str, tmp_path: Path) -> list[Call]:
    """Runs `script` with `set -euo pipefail` and a redis-cli on PATH that talks to `server`;
    returns the module calls it made, in order. Fails on a non-zero exit (an error reply)."""
    log = tmp_path / "calls.log"
    shim = tmp_path / "redis-cli"
    shim.write_text(
        "#!/bin/bash\n"
        f'out=$({find_cli_binary("redis")} -e -p {server.port} "$@"); rc=$?\n'
        "printf '%s\\n' \"$out\"\n"
        f"{{ printf '{RECORD}'; printf '%s{FIELD}' \"$@\"; printf '\\n%s\\n' \"$out\"; }}"
        f' >> "{log}"\n'
        "exit $rc\n"
    )
    shim.chmod(0o755)
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=ROOT,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    records = log.read_text().split(RECORD)[1:] if log.exists() else []
    last = records[-1] if records else "(no call)"
    assert result.returncode == 0, f"{result.stderr}\nlast call: {last!r}"
    calls = []
    for record in records:
        args_line, _, output = record.partition("\n")
        args = args_line.split(FIELD)[:-1]
        verb = args[0].upper()
        if verb not in ("EVALSHA", "FCALL", "FCALL_RO"):
            continue  # SCRIPT LOAD, FUNCTION LOAD
        argv = args[3 + int(args[2]) :]
        if argv[0] == "unique":
            argv = argv[1:]
        calls.append(Call(verb, argv[0], argv[1:], output.rstrip("\n").split("\n")))
    return calls


def test_the_header_example_has_a_line_for_every_command() -> None:
    called = set()
    for found in CALL_RE.finditer(header_example()):
        called |= {found[2], "unique"} if found[1] else {found[2]}
    assert set(header_commands()) - called == set()


def test_the_header_redis_cli_example_runs_as_written(
    server: ServerProcess, client: redis.Redis, tmp_path: Path
) -> None:
    for tag in TAGS:
        if leftovers := client.keys(f"rotator:{{{tag}}}:*"):
            client.delete(*leftovers)
    calls = run_with_logging_cli(server, header_example(), tmp_path)
    # Each documented command ran (the coverage test above reads the text; this, the calls).
    assert set(header_commands()) - {"unique"} <= {call.command for call in calls}
    for call in calls:
        assert not any(line.startswith(("ERR", "ROTATOR_")) for line in call.reply), call

    def replies(command: str) -> list[list[str]]:
        return [call.reply for call in calls if call.command == command]

    assert replies("push")[:2] == [["4"], ["1"]]  # job-1..4, job-5
    assert replies("push")[2] == ["2"]  # unique push mail-1 mail-1 mail-2: each id once
    (extend,) = replies("extend")
    assert extend[1] == "1"
    assert int(extend[0]) > 0
    assert replies("ack") == [["1"], ["1"]]  # a token, then a batch ack of two jobs
    assert replies("nack") == [["1"]]
    assert replies("bury") == [["1"]]
    ((letter,),) = replies("dead")
    assert letter.startswith("failed*1*")
    assert letter.endswith("*job-5*bad input")
    assert replies("requeue_dead") == [["1"]]
    assert replies("requeue_dead_from") == [["0", "-1"]]
    stats = replies("stats")[0]
    counts = dict(zip(stats[::2], stats[1::2], strict=True))
    assert (counts["pushed"], counts["completed"], counts["retried"]) == ("6", "3", "1")
    assert (counts["dead_lettered"], counts["pending"], counts["deferred"]) == ("1", "1", "1")
    assert replies("push_later") == [["1"], ["1"]]
    assert replies("push_priority") == [["1"]]
    assert replies("schedule") == [["1"], ["1"]]
    (schedules,) = replies("schedules")
    assert [schedules[0], schedules[8]] == ["at-nine", "nightly"]
    assert replies("unschedule") == [["1"]]
    assert replies("pause") == replies("resume") == replies("rate_limit") == [["1"]]
    assert replies("push_chunk") == [["1", "1", "0"]]
    assert replies("pushp") == replies("pushp_later") == replies("ackp") == [["1"]]
    assert replies("nackp") == [["1"]]
    ((item,),) = replies("items")
    assert re.fullmatch(r"\d+:1:\d+:timed out", item), item
    assert replies("cancel") == replies("delete") == [["1"]]
    assert replies("once") == [["1"], ["1"]]  # a push_later sent again pushed nothing
    assert replies("treplay") == [["2", "3", "2"]]
    assert replies("tseek") == replies("ttrim") == replies("tunsubscribe") == [["1"]]
    first, again = replies("tpublish_chunk")  # a publish sent again publishes nothing
    assert first == again
    assert re.fullmatch(r"\d+-3", first[0]), first
    # What it leaves: job-6, job-7, job-11 and the nightly schedule's tick scheduled; job-11's
    # payload (the nextp_packed batch's went with its ackp); the emails queue deleted but for
    # its seq; the topic's log trimmed to its last message, and no group.
    assert client.zcard("rotator:{orders}:scheduled") == 4
    assert client.hkeys("rotator:{orders}:payloads") == [b"job-11"]
    assert sorted(client.keys("rotator:{emails}:*")) == [
        b"rotator:{emails}:meta",
        b"rotator:{emails}:push:run-2",  # once's marker, kept its minute
    ]
    assert client.zcard("rotator:{news}:topic:log") == 1
    assert not client.keys("rotator:{news}:group:*")


def test_the_header_functions_example_runs_as_written(
    server: ServerProcess, client: redis.Redis, tmp_path: Path
) -> None:
    if leftovers := client.keys("rotator:{reports}:*"):
        client.delete(*leftovers)
    client.function_flush()
    calls = run_with_logging_cli(server, functions_example(), tmp_path)
    assert [(call.verb, call.command) for call in calls] == [
        ("FCALL", "push"),
        ("FCALL_RO", "stats"),
    ]
    assert calls[0].reply == ["2"]
    stats = calls[1].reply
    counts = dict(zip(stats[::2], stats[1::2], strict=True))
    assert (counts["length"], counts["pending"], counts["pushed"]) == ("2", "2", "2")
    # The library it loaded is the clients' own: the same name, both functions.
    (library,) = client.function_list()
    fields = dict(zip(library[::2], library[1::2], strict=True))
    assert fields[b"library_name"] == function_name().encode()
    names = {dict(zip(f[::2], f[1::2], strict=True))[b"name"] for f in fields[b"functions"]}
    assert names == {function_name().encode(), f"{function_name()}_ro".encode()}
