"""The ``rotator`` command against real servers: every command, its --json form, and its errors.

Most tests drive the click group in-process with ``CliRunner`` and ``--url``; a few run the
installed console script as a real process, for real stdin, stderr and exit codes. Errors
must be one ``rotator: error: ...`` line on stderr with a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from rotator import Rotator
from rotator.cli import main, rates
from rotator.keys import queue_keys
from rotator.script import function_name, module_sha
from rotator.server import EmbeddedServer
from tests.helpers import drain, snapshot
from tests.servers import ServerProcess

ROTATOR = str(Path(sys.executable).parent / "rotator")
UNREACHABLE = "redis://127.0.0.1:1"
STATS_KEYS = {
    "length",
    "pending",
    "in_flight",
    "done",
    "deferred",
    "dead",
    "oldest_pending_age",
    "overdue",
    "scheduled",
    "paused",
    "schedules",
    "rate_limit",
    "prioritized",
    "pushed",
    "delivered",
    "completed",
    "retried",
    "reclaimed",
    "dead_lettered",
    "cancelled",
    "durations",
}


def run(*args: str, input: str | None = None, env: dict[str, str | None] | None = None) -> Result:
    """The CLI in-process; an exception the CLI did not turn into an error fails the test."""
    return CliRunner().invoke(main, list(args), input=input, env=env, catch_exceptions=False)


def cli(server: ServerProcess, *args: str, input: str | None = None) -> Result:
    return run("--url", server.url, *args, input=input)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result.stdout


def ok_json(result: Result) -> Any:
    return json.loads(ok(result))


def assert_one_line_error(exit_code: int, stdout: str, stderr: str, *fragments: str) -> str:
    assert exit_code != 0
    assert stdout == ""
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("rotator: error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def assert_error(result: Result, *fragments: str) -> str:
    return assert_one_line_error(result.exit_code, result.stdout, result.stderr, *fragments)


def run_process(
    *args: str, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ROTATOR, *args],
        input=input,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def queue(client: redis.Redis, queue_name: str) -> Rotator:
    """A Python handle on the queue the CLI works on, for setting up and checking."""
    return Rotator(client, queue_name, timeout=30)


# `work --json` when every job completed at its first delivery.
WORK_CLEAN = {
    "completed": 0,
    "retried": 0,
    "dead": 0,
    "failed_deliveries": 0,
    "leases_lost": 0,
    "cancelled": 0,
}


def tokens(result: Result) -> dict[str, str]:
    """``ID<TAB>TOKEN`` lines of ``next`` as {id: token}."""
    pairs = [line.split("\t") for line in ok(result).splitlines()]
    assert all(len(pair) == 2 for pair in pairs)
    return {job_id: token for job_id, token in pairs}


# -- push ------------------------------------------------------------------------------------


def test_push_prints_the_count_and_keeps_the_order(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    assert ok(cli(server, "push", queue_name, "a", "b", "c")) == "3\n"

    assert queue.stats().pending == 3
    assert drain(queue) == ["a", "b", "c"]


def test_push_dash_reads_one_id_per_line_from_stdin_between_arguments(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    result = cli(server, "push", queue_name, "first", "-", "last", input="x\r\ny\n\nz\n")

    assert ok(result) == "5\n"
    assert drain(queue) == ["first", "x", "y", "z", "last"]


def test_push_of_2500_ids_from_stdin_in_a_real_process_prints_the_count(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    ids = [f"job-{i}" for i in range(2500)]  # more than two push chunks

    done = run_process("--url", server.url, "push", queue_name, "-", input="\n".join(ids) + "\n")

    assert (done.returncode, done.stdout, done.stderr) == (0, "2500\n", "")
    assert queue.stats().pending == 2500
    assert drain(queue, count=1000) == ids


def test_push_json(server: ServerProcess, queue_name: str) -> None:
    assert ok_json(cli(server, "push", queue_name, "a", "b", "--json")) == {"pushed": 2}


def test_rotator_url_from_the_environment_is_used_without_url(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    assert ok(run("push", queue_name, "a", env={"ROTATOR_URL": server.url})) == "1\n"

    assert drain(queue) == ["a"]


# -- next ------------------------------------------------------------------------------------


def test_next_count_leases_that_many_and_prints_id_tab_token(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    queue.push("a", "b", "c", "d")

    leased = tokens(cli(server, "next", queue_name, "--count", "3"))

    assert list(leased) == ["a", "b", "c"]
    assert all(token.startswith(f"{job_id}*") for job_id, token in leased.items())
    stats = queue.stats()
    assert (stats.pending, stats.in_flight) == (1, 3)
    assert list(tokens(cli(server, "next", queue_name, "--count", "3"))) == ["d"]
    assert ok(cli(server, "next", queue_name)) == ""  # everything leased: nothing, exit 0


def test_next_json_has_id_token_deliveries_reclaimed_and_the_lease_deadline(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    queue.push("a")
    before_ms = time.time() * 1000

    jobs = ok_json(cli(server, "next", queue_name, "--timeout", "60", "--json"))

    assert len(jobs) == 1
    job = jobs[0]
    assert {"id", "token", "deliveries", "reclaimed"} <= set(job)
    assert (job["id"], job["deliveries"], job["reclaimed"]) == ("a", 1, False)
    assert job["token"].startswith("a*")
    assert before_ms + 50_000 < job["deadline_ms"] < time.time() * 1000 + 61_000


def test_next_timeout_is_the_lease_and_an_expired_lease_is_reclaimed(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    queue.push("a")
    first = ok_json(cli(server, "next", queue_name, "--timeout", "0.2", "--json"))
    time.sleep(0.3)

    second = ok_json(cli(server, "next", queue_name, "--timeout", "60", "--json"))

    assert [job["id"] for job in first] == [job["id"] for job in second] == ["a"]
    assert (second[0]["deliveries"], second[0]["reclaimed"]) == (2, True)
    assert second[0]["token"] != first[0]["token"]


# -- ack and nack ----------------------------------------------------------------------------


def test_ack_prints_how_many_were_accepted(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    queue.push("a", "b")
    leased = tokens(cli(server, "next", queue_name, "--count", "2"))

    assert ok(cli(server, "ack", queue_name, *leased.values())) == "2\n"

    stats = queue.stats()
    assert (stats.pending, stats.in_flight, stats.done) == (0, 0, 2)


def test_ack_exits_1_when_a_token_is_refused(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    queue.push("a")
    stale = tokens(cli(server, "next", queue_name, "--timeout", "0.1"))["a"]
    time.sleep(0.2)
    current = tokens(cli(server, "next", queue_name))["a"]  # the lease, re-issued

    refused = cli(server, "ack", queue_name, stale)
    mixed = cli(server, "ack", queue_name, "--json", stale, current)

    assert (refused.exit_code, refused.stdout) == (1, "0\n")
    assert mixed.exit_code == 1
    assert json.loads(mixed.stdout) == {"acked": 1}
    assert queue.stats().done == 1


def test_nack_with_delay_defers_and_without_delivers_again_now(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    queue.push("a", "b")
    leased = tokens(cli(server, "next", queue_name, "--count", "2"))

    assert ok(cli(server, "nack", queue_name, leased["a"], "--delay", "60")) == "1\n"
    assert ok_json(cli(server, "nack", queue_name, leased["b"], "--json")) == {"nacked": 1}

    again = ok_json(cli(server, "next", queue_name, "--count", "2", "--json"))
    assert [(job["id"], job["deliveries"]) for job in again] == [("b", 2)]
    stats = queue.stats()
    assert (stats.deferred, stats.in_flight) == (1, 1)
    assert {e.element: e.state for e in queue.peek(10)}[leased["a"]] == "deferred"


def test_nack_of_a_token_no_longer_held_exits_1(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    queue.push("a")
    token = tokens(cli(server, "next", queue_name))["a"]
    ok(cli(server, "ack", queue_name, token))

    result = cli(server, "nack", queue_name, token)

    assert (result.exit_code, result.stdout) == (1, "0\n")


# -- stats, peek, dead -----------------------------------------------------------------------


def test_stats_json_has_every_count(server: ServerProcess, queue: Rotator, queue_name: str) -> None:
    queue.push("a", "b", "c")
    queue.next()

    values = ok_json(cli(server, "stats", queue_name, "--json"))

    assert set(values) == STATS_KEYS | {"overdue_capped"}  # the table shows it as "N+"
    assert (values["overdue"], values["overdue_capped"]) == (0, False)
    assert (values["pending"], values["in_flight"], values["done"]) == (2, 1, 0)
    assert (values["deferred"], values["dead"]) == (0, 0)
    assert isinstance(values["oldest_pending_age"], float)
    assert values["oldest_pending_age"] >= 0
    assert values["length"] >= 3


def test_stats_text_is_a_table_of_the_same_counts(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    queue.push("a", "b")

    text = ok(cli(server, "stats", queue_name)).splitlines()

    assert text[0] == f"queue {queue_name}"
    rows = dict(line.split(maxsplit=1) for line in text[1:])
    assert set(rows) == STATS_KEYS
    assert (rows["pending"], rows["in_flight"], rows["dead"]) == ("2", "0", "0")
    assert rows["oldest_pending_age"].endswith(" s")


def test_stats_of_an_empty_queue_shows_no_oldest_pending_age(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    queue.push("a")
    drain(queue)

    values = ok_json(cli(server, "stats", queue_name, "--json"))
    text = ok(cli(server, "stats", queue_name)).splitlines()

    rows = dict(line.split(maxsplit=1) for line in text[1:])
    assert values["oldest_pending_age"] is None
    assert rows["oldest_pending_age"] == "-"


def test_peek_shows_every_state_and_changes_nothing(
    server: ServerProcess, client: redis.Redis, queue: Rotator, queue_name: str
) -> None:
    queue.push("a", "b", "c", "d")
    a, b, c = queue.next(3)
    queue.ack(a)
    queue.nack(b, delay=60)
    before = snapshot(client, queue)

    entries = ok_json(cli(server, "peek", queue_name, "--json"))
    text = ok(cli(server, "peek", queue_name)).splitlines()

    assert snapshot(client, queue) == before
    states = {entry["element"]: entry["state"] for entry in entries}
    assert states == {
        a.token: "done",
        b.token: "deferred",
        c.token: "leased",
        "d": "pending",
        "*lap": "lap",
    }
    times = {entry["state"]: entry["time_ms"] for entry in entries}
    assert time.time() * 1000 < times["leased"] < times["deferred"]  # 30 s lease, 60 s delay
    assert times["pending"] == 0
    assert sorted(line.split()[0] for line in text) == sorted(states.values())
    assert {line.split()[-1] for line in text} == set(states)


def test_peek_limit(server: ServerProcess, queue: Rotator, queue_name: str) -> None:
    queue.push(*range(10))

    assert len(ok_json(cli(server, "peek", queue_name, "--limit", "3", "--json"))) == 3


def make_dead_letters(client: redis.Redis, queue_name: str, *ids: str) -> None:
    """Each of ``ids`` delivered once and never acked, with max_deliveries=1."""
    doomed = Rotator(client, queue_name, timeout=0.1, max_deliveries=1)
    doomed.push(*ids)
    assert len(doomed.next(len(ids))) == len(ids)
    time.sleep(0.2)
    assert doomed.next(len(ids)) == []  # the expired leases go to the dead letters instead
    assert doomed.stats().dead == len(ids)


def test_dead_lists_the_reason_after_max_deliveries(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    make_dead_letters(client, queue_name, "x")

    text = ok(cli(server, "dead", queue_name))
    letters = ok_json(cli(server, "dead", queue_name, "--json"))

    assert text == "x\tmax_deliveries\t1\n"
    assert len(letters) == 1
    assert {k: letters[0][k] for k in ("id", "reason", "deliveries")} == {
        "id": "x",
        "reason": "max_deliveries",
        "deliveries": 1,
    }
    assert letters[0]["died_ms"] > 0


def test_dead_requeue_moves_all_letters_back(
    server: ServerProcess, client: redis.Redis, queue: Rotator, queue_name: str
) -> None:
    make_dead_letters(client, queue_name, "x", "y")

    assert ok(cli(server, "dead", queue_name, "--requeue")) == "2\n"

    assert ok(cli(server, "dead", queue_name)) == ""
    stats = queue.stats()
    assert (stats.dead, stats.pending) == (0, 2)
    assert sorted(drain(queue)) == ["x", "y"]


def test_dead_requeue_of_given_ids_moves_only_those(
    server: ServerProcess, client: redis.Redis, queue: Rotator, queue_name: str
) -> None:
    make_dead_letters(client, queue_name, "x", "y")

    assert ok_json(cli(server, "dead", queue_name, "--requeue", "y", "--json")) == {"requeued": 1}

    assert ok(cli(server, "dead", queue_name)) == "x\tmax_deliveries\t1\n"
    assert drain(queue) == ["y"]


def test_dead_with_ids_but_without_requeue_is_an_error(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    make_dead_letters(client, queue_name, "x")

    assert_error(cli(server, "dead", queue_name, "x"), "--requeue")

    assert Rotator(client, queue_name).stats().dead == 1


# -- work ------------------------------------------------------------------------------------


def test_work_until_empty_runs_the_command_once_per_job_with_braces_replaced(
    server: ServerProcess, queue: Rotator, queue_name: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    ids = [f"job-{i}" for i in range(20)]
    queue.push(*ids)

    done = run_process(
        "--url", server.url, "work", queue_name, "--until-empty", "--concurrency", "2",
        "--", "sh", "-c", f"echo {{}} >> {out}",
    )  # fmt: skip

    assert (done.returncode, done.stdout) == (0, "completed 20, retried 0, dead 0\n"), done.stderr
    assert sorted(out.read_text().splitlines()) == sorted(ids)
    stats = queue.stats()
    assert (stats.pending, stats.in_flight, stats.deferred) == (0, 0, 0)


def test_work_appends_the_id_when_the_command_has_no_braces(
    server: ServerProcess, queue: Rotator, queue_name: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    queue.push("a", "b")

    result = cli(
        server, "work", queue_name, "--until-empty", "--json",
        "--", "sh", "-c", f'echo "$1 $#" >> {out}', "sh",
    )  # fmt: skip

    assert ok_json(result) == WORK_CLEAN | {"completed": 2}
    assert out.read_text().splitlines() == ["a 1", "b 1"]


def test_work_retries_a_command_that_exits_nonzero(
    server: ServerProcess, queue: Rotator, queue_name: str, tmp_path: Path
) -> None:
    out, tried = tmp_path / "out", tmp_path / "tried"
    queue.push("a")
    script = f"if [ -e {tried} ]; then echo {{}} >> {out}; else touch {tried}; exit 3; fi"

    result = cli(server, "work", queue_name, "--until-empty", "--json", "--", "sh", "-c", script)

    assert ok_json(result) == WORK_CLEAN | {"completed": 1, "retried": 1, "failed_deliveries": 1}
    assert out.read_text() == "a\n"
    assert queue.stats().pending == 0


# -- scripts and demo ------------------------------------------------------------------------


def test_scripts_shows_the_module_sha_path_and_a_load_line() -> None:
    data = ok_json(run("scripts", "--json"))
    text = ok(run("scripts"))

    assert data["sha"] == module_sha()
    assert Path(data["path"]).is_file()
    assert data["path"] in data["load"]
    assert data["load"].startswith("redis-cli -x SCRIPT LOAD < ")
    assert text.splitlines()[0].split() == ["sha", module_sha()]


def test_scripts_with_a_url_says_how_clients_call_the_module_there(
    server: ServerProcess, client: redis.Redis
) -> None:
    data = ok_json(cli(server, "scripts", "--json"))
    text = ok(cli(server, "scripts"))

    assert data["library"] == function_name()
    assert data["reads"] == f"{function_name()}_ro"
    assert ["reads", data["reads"]] in [line.split() for line in text.splitlines()]
    assert data["mode"] == "fcall"  # Redis 7 and Valkey 8 have functions; the default user may
    assert ["mode", "fcall"] in [line.split() for line in text.splitlines()]
    assert "mode" not in ok_json(run("scripts", "--json", env={"ROTATOR_URL": None}))


def test_demo_on_a_real_server_loses_nothing(server: ServerProcess, client: redis.Redis) -> None:
    result = cli(server, "demo", "--jobs", "300", "--workers", "2", "--json")

    data = ok_json(result)
    expected = {"pushed", "completed", "reclaimed", "duplicates_prevented", "lost", "jobs_per_s"}
    assert expected <= set(data)
    assert data["lost"] == 0
    assert data["completed"] == data["pushed"] == 300
    assert data["duplicates_processed"] == 0
    assert client.keys("*{demo-*}*") == []  # the demo removes its queue and counters


def test_demo_refuses_fewer_than_two_workers(server: ServerProcess) -> None:
    assert_error(cli(server, "demo", "--jobs", "10", "--workers", "1"), "--workers")


# -- the embedded server ---------------------------------------------------------------------


def test_server_start_status_stop(rotator_home: Path) -> None:
    env: dict[str, str | None] = {"ROTATOR_HOME": str(rotator_home), "ROTATOR_URL": None}

    down = run("server", "status", "--json", env=env)
    assert down.exit_code == 1  # status says what it found, and that it is not running
    before = json.loads(down.stdout)
    started = ok_json(run("server", "start", "--json", env=env))
    again = ok_json(run("server", "start", "--json", env=env))
    status_text = ok(run("server", "status", env=env))
    stopped = ok(run("server", "stop", env=env))
    stopped_again = ok_json(run("server", "stop", "--json", env=env))
    stopped_status = run("server", "status", "--json", env=env)
    assert stopped_status.exit_code == 1
    after = json.loads(stopped_status.stdout)

    socket_url = f"unix://{rotator_home}/valkey.sock"
    assert (before["running"], before["pid"], before["url"]) == (False, None, socket_url)
    assert started["running"] is True
    assert started["url"] == socket_url
    assert started["data_dir"] == str(rotator_home)
    assert started["version"].startswith("8.")
    assert isinstance(started["pid"], int)
    assert again["pid"] == started["pid"]
    rows = dict(line.split(maxsplit=1) for line in status_text.splitlines())
    assert (rows["running"], rows["pid"], rows["url"]) == ("True", str(started["pid"]), socket_url)
    assert stopped == "stopped\n"
    assert stopped_again == {"stopped": False}
    assert (after["running"], after["pid"]) == (False, None)


def test_commands_without_url_use_the_embedded_server_in_rotator_home(
    rotator_home: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ROTATOR_URL"}
    env["ROTATOR_HOME"] = str(rotator_home)

    pushed = run_process("push", "orders", "a", "b", env=env)
    stats = run_process("stats", "orders", "--json", env=env)

    assert (pushed.returncode, pushed.stdout, pushed.stderr) == (0, "2\n", "")
    assert json.loads(stats.stdout)["pending"] == 2
    status = EmbeddedServer(rotator_home).status()
    assert status.running
    with EmbeddedServer(rotator_home).client() as conn:
        assert Rotator(conn, "orders").stats().pending == 2


# -- errors ----------------------------------------------------------------------------------

QUEUE_COMMANDS: dict[str, list[str]] = {
    "push": ["push", "{q}", "a"],
    "next": ["next", "{q}"],
    "ack": ["ack", "{q}", "a*1700000000000.1.1"],
    "nack": ["nack", "{q}", "a*1700000000000.1.1"],
    "stats": ["stats", "{q}"],
    "peek": ["peek", "{q}"],
    "dead": ["dead", "{q}"],
    "requeue": ["dead", "{q}", "--requeue"],
    "work": ["work", "{q}", "--until-empty", "--", "true"],
}


def command(name: str, queue_name: str) -> list[str]:
    return [queue_name if arg == "{q}" else arg for arg in QUEUE_COMMANDS[name]]


@pytest.mark.parametrize("name", [*QUEUE_COMMANDS, "demo"])
def test_unreachable_server_is_one_line_naming_the_url(name: str) -> None:
    args = ["demo", "--jobs", "10"] if name == "demo" else command(name, "q")

    assert_error(run("--url", UNREACHABLE, *args), "cannot reach", UNREACHABLE)


def test_errors_of_a_real_process_are_one_line_without_traceback(
    server: ServerProcess, queue_name: str
) -> None:
    unreachable = run_process("--url", UNREACHABLE, "stats", "q")
    bad_id = run_process("--url", server.url, "push", queue_name, "ok", "a*b")

    assert unreachable.returncode == bad_id.returncode == 1
    assert_one_line_error(1, unreachable.stdout, unreachable.stderr, UNREACHABLE)
    assert_one_line_error(1, bad_id.stdout, bad_id.stderr, "'a*b'")


def test_invalid_id_is_refused_and_nothing_is_pushed(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    assert_error(cli(server, "push", queue_name, "ok", "a*b"), "'a*b'")
    assert_error(cli(server, "push", queue_name, "-", input="ok\na*b\n"), "'a*b'")

    assert not queue.exists()


@pytest.mark.parametrize("name", list(QUEUE_COMMANDS))
def test_a_queue_key_of_the_wrong_type_is_one_line(
    server: ServerProcess, client: redis.Redis, queue_name: str, name: str
) -> None:
    # Listing dead letters reads only the dead list, so that is the key to spoil for it.
    keys = queue_keys(queue_name)
    spoiled = keys.dead if name == "dead" else keys.ring
    client.set(spoiled, "not a list")

    assert_error(cli(server, *command(name, queue_name)), spoiled)

    assert client.get(spoiled) == b"not a list"


@pytest.mark.parametrize("name", ["next", "ack", "nack", "stats", "peek", "dead", "requeue"])
def test_a_queue_never_pushed_is_unknown(
    server: ServerProcess, client: redis.Redis, queue_name: str, name: str
) -> None:
    assert_error(cli(server, *command(name, queue_name)), f"unknown queue {queue_name!r}")

    assert client.exists(*queue_keys(queue_name).all) == 0


@pytest.mark.parametrize("name", list(QUEUE_COMMANDS))
def test_a_bad_queue_name_is_refused_before_connecting(name: str) -> None:
    # The unreachable URL shows that the name is checked before any connection is tried.
    result = run("--url", UNREACHABLE, *command(name, "a{b"))

    assert_error(result, "queue name", "'a{b'")


def test_stats_watch_shows_rates_beside_the_counts(
    server: ServerProcess, queue: Rotator, queue_name: str
) -> None:
    queue.push("a")
    watch = subprocess.Popen(
        [ROTATOR, "--url", server.url, "stats", queue_name, "--json", "--watch"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())
        queue.push(*[f"j{i}" for i in range(30)])
        second = json.loads(watch.stdout.readline())
    finally:
        watch.terminate()
        watch.wait(10)
    assert "rates" not in first  # nothing to compare with yet
    assert second["pushed"] == 31
    assert second["rates"]["pushed"] > 0
    assert second["rates"]["completed"] == 0
    assert rates({"pushed": 5}, {"pushed": 3}, 1.0) == {}  # made again in between: no rate
