"""What every ``rotator`` command shares: -h, --url before or after the subcommand (and
ROTATOR_URL), an example in its help, help on every option, one-line errors naming the flag
for every bad argument, and exit statuses that say whether the command did what was asked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import redis

from rotator import Rotator, Topic
from rotator.cli import main
from tests.ptys import Terminal
from tests.servers import ServerProcess
from tests.test_cli import ROTATOR, UNREACHABLE, assert_error, cli, ok, ok_json, run

# The commands that only concern this machine (the embedded server, the module's file).
LOCAL = {("scripts",), ("server", "start"), ("server", "stop"), ("server", "status")}


def walk(group: click.Group = main, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from walk(command, (*path, name))


def command_of(path: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


EVERY = list(walk())
LEAVES = [path for path in EVERY if not isinstance(command_of(path), click.Group)]


def test_the_walk_sees_every_command() -> None:
    assert {"push", "next", "work", "queues", "delete"} <= {p[0] for p in LEAVES}
    assert {("topic", "next"), ("topic", "work"), ("server", "status")} <= set(LEAVES)


@pytest.mark.parametrize("path", [(), *EVERY], ids=lambda p: " ".join(p) or "rotator")
def test_h_shows_the_help_with_an_example(path: tuple[str, ...]) -> None:
    short = ok(run(*path, "-h"))

    assert short == ok(run(*path, "--help"))
    assert short.startswith("Usage: ")
    assert "Example" in short


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_option_says_what_it_does(path: tuple[str, ...]) -> None:
    undocumented = [
        param.opts
        for param in command_of(path).params
        if isinstance(param, click.Option) and not param.help
    ]

    assert undocumented == []


@pytest.mark.parametrize("path", [p for p in LEAVES if p not in LOCAL], ids=" ".join)
def test_every_command_that_talks_to_a_server_takes_url_after_its_name(
    path: tuple[str, ...],
) -> None:
    options = [p for p in command_of(path).params if isinstance(p, click.Option)]

    assert any("--url" in option.opts for option in options)


def test_url_after_the_subcommand_is_used(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    assert ok(run("push", queue_name, "a", "--url", server.url)) == "1\n"
    assert ok_json(run("stats", "--url", server.url, queue_name, "--json"))["pending"] == 1
    assert Rotator(client, queue_name).stats().pending == 1


def test_url_after_the_subcommand_wins_over_url_before_it_and_the_environment(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    env: dict[str, str | None] = {"ROTATOR_URL": UNREACHABLE}

    assert ok(run("--url", UNREACHABLE, "push", queue_name, "a", "--url", server.url)) == "1\n"
    assert ok(run("push", queue_name, "b", "--url", server.url, env=env)) == "1\n"
    assert ok(run("--url", server.url, "push", queue_name, "c", env=env)) == "1\n"

    assert Rotator(client, queue_name).stats().pending == 3


@pytest.mark.parametrize(
    "args",
    [
        ["--url", "localhost:6379", "stats", "q"],
        ["stats", "q", "--url", "localhost:6379"],
        ["topic", "stats", "t", "--url", "127.0.0.1"],
        ["stats", "q", "--url", "redis://localhost:notaport"],
    ],
    ids=["before", "after", "topic", "bad-port"],
)
def test_a_url_that_is_not_one_is_one_line_naming_the_flag(args: list[str]) -> None:
    result = run(*args)

    assert result.exit_code == 2
    assert_error(result, "'--url'")


def test_a_rotator_url_without_a_scheme_is_one_line_naming_the_variable() -> None:
    result = run("stats", "q", env={"ROTATOR_URL": "localhost:6379"})

    assert result.exit_code == 2
    assert_error(result, "ROTATOR_URL", "'localhost:6379'", "redis://")


BAD_ARGUMENTS = {
    "count 0": (["next", "q", "--count", "0"], "--count"),
    "count 1001": (["next", "q", "--count", "1001"], "--count"),
    "lease 0": (["next", "q", "--timeout", "0"], "--timeout"),
    "lease nan": (["next", "q", "--timeout", "nan"], "--timeout"),
    "block negative": (["next", "q", "--block", "-1"], "--block"),
    "delay negative": (["nack", "q", "a*1.1.1", "--delay", "-1"], "--delay"),
    "interval 0": (["stats", "q", "--interval", "0"], "--interval"),
    "interval text": (["stats", "q", "--interval", "soon"], "--interval"),
    "peek limit 0": (["peek", "q", "--limit", "0"], "--limit"),
    "dead limit": (["dead", "q", "--limit", "100000"], "--limit"),
    "concurrency 0": (["work", "q", "--concurrency", "0", "--", "true"], "--concurrency"),
    "max deliveries": (["work", "q", "--max-deliveries", "-1", "--", "true"], "--max-deliveries"),
    "topic lease": (["topic", "next", "t", "g", "--timeout", "-5"], "--timeout"),
    "max age": (["topic", "publish", "t", "m", "--max-age", "inf"], "--max-age"),
    "from time": (["topic", "replay", "t", "g", "--from-time", "x"], "--from-time"),
    "replay neither": (["topic", "replay", "t", "g"], "--from-id and --from-time"),
    "replay both": (
        ["topic", "replay", "t", "g", "--from-id", "1-1", "--from-time", "1"],
        "--from-id and --from-time",
    ),
    "retention 0 alone": (["topic", "publish", "t", "m", "--retention", "0"], "--max-age"),
    "workers 1": (["demo", "--workers", "1"], "--workers"),
    "unknown option": (["push", "q", "a", "--bogus"], "--bogus"),
    "missing argument": (["push"], "QUEUE"),
    "unknown command": (["pish", "q"], "pish"),
}


@pytest.mark.parametrize("name", list(BAD_ARGUMENTS))
def test_a_bad_argument_is_one_line_naming_the_flag_before_any_connection(name: str) -> None:
    args, flag = BAD_ARGUMENTS[name]

    # The unreachable URL shows that nothing was tried: a connection would fail with exit 1.
    result = run("--url", UNREACHABLE, *args)

    assert result.exit_code == 2, result.stderr
    line = assert_error(result, flag)
    assert "from_id" not in line  # flags, never Python's parameter names
    assert line.endswith("-h)")  # and where to read more


def test_server_status_exits_1_when_the_server_is_down(rotator_home: Path) -> None:
    env: dict[str, str | None] = {"ROTATOR_HOME": str(rotator_home), "ROTATOR_URL": None}

    result = run("server", "status", env=env)

    assert result.exit_code == 1
    assert "running   False" in result.stdout


def test_topic_commands_on_an_unknown_topic_fail_as_queue_commands_do(
    server: ServerProcess, queue_name: str
) -> None:
    for args in (["stats"], ["groups"], ["replay", "--from-id", "1-1"]):
        sub, rest = args[0], args[1:]
        extra = ["g"] if sub == "replay" else []
        assert_error(
            cli(server, "topic", sub, queue_name, *extra, *rest), f"unknown topic {queue_name!r}"
        )
    assert_error(cli(server, "stats", queue_name), f"unknown queue {queue_name!r}")


def test_unsubscribing_a_group_that_is_not_there_exits_1(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Topic(client, queue_name).subscribe("mail")

    assert_error(cli(server, "topic", "unsubscribe", queue_name, "post"), "no group 'post'")
    assert ok(cli(server, "topic", "unsubscribe", queue_name, "mail")) == "unsubscribed mail\n"


def test_replay_of_a_group_that_is_not_subscribed_names_the_group(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Topic(client, queue_name).publish("m")

    result = cli(server, "topic", "replay", queue_name, "nosuch", "--from-time", "0")

    assert_error(result, "no group 'nosuch'", f"rotator topic subscribe {queue_name} nosuch")


# -- progress of a push from stdin, on a terminal ------------------------------------------


def push_on_a_terminal(server: ServerProcess, queue_name: str, shell: str) -> str:
    """Runs ``shell`` (a pipeline ending in ``rotator push``) with its stderr on a terminal."""
    env = {k: v for k, v in os.environ.items() if k != "ROTATOR_URL"}
    env["Q"], env["URL"], env["ROTATOR"] = queue_name, server.url, ROTATOR
    with Terminal(["/bin/sh", "-c", shell], env) as term:
        assert term.wait(timeout=60) == 0, term.output
        return term.output


def test_a_push_from_a_pipe_shows_a_running_count_on_a_terminal(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    output = push_on_a_terminal(
        server, queue_name, 'seq 1 2500 | "$ROTATOR" --url "$URL" push "$Q" - 2>&1'
    )

    counts = [part.split()[-1] for part in output.split("\r") if part.startswith("pushed ")]
    assert counts[:2] == ["1000", "2000"]
    assert counts[-1].startswith("2500")
    assert output.rstrip().endswith("2500")  # the count printed on stdout
    assert Rotator(client, queue_name).stats().pending == 2500


def test_a_push_from_a_file_shows_a_bar_that_moves(
    server: ServerProcess, client: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    ids = tmp_path / "ids"
    ids.write_text("".join(f"{n}\n" for n in range(1, 5001)))

    output = push_on_a_terminal(
        server, queue_name, f'"$ROTATOR" --url "$URL" push "$Q" - < {ids} 2>&1'
    )

    shown = [int(part) for part in re.findall(r"(\d+)%", output)]
    assert shown[0] == 0  # it starts empty...
    assert any(0 < pct < 100 for pct in shown)  # ...moves...
    assert shown[-1] == 100  # ...and ends full
    assert shown == sorted(shown)
    assert Rotator(client, queue_name).stats().pending == 5000


def test_a_push_without_a_terminal_prints_only_the_count(
    server: ServerProcess, queue_name: str
) -> None:
    result = cli(server, "push", queue_name, "-", input="a\nb\n")

    assert (result.stdout, result.stderr) == ("2\n", "")
