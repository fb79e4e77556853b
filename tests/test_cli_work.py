"""``rotator work`` and ``rotator topic work`` as a user runs them: in a terminal, with Ctrl-C.

The worker runs as a real process on a pseudo-terminal of its own (tests.ptys), so a Ctrl-C
reaches what a real terminal's Ctrl-C reaches: the foreground process group. Each job's command
runs in a session of its own, so the first Ctrl-C reaches the worker alone, which lets the
running job finish and acks it; a second one stops the running commands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import redis

from rotator import Rotator, Topic
from rotator.defaults import DEFAULT_WORK_MAX_DELIVERIES
from tests.helpers import wait_until
from tests.ptys import CTRL_C, Terminal
from tests.servers import ServerProcess
from tests.test_cli import ROTATOR, assert_error, cli, ok, ok_json, run, run_process


def terminal(server: ServerProcess, *args: str) -> Terminal:
    env = {k: v for k, v in os.environ.items() if k != "ROTATOR_URL"}
    return Terminal([ROTATOR, "--url", server.url, *args], env)


def lap(queue: Rotator) -> None:
    """Acked elements leave the ring when a consumer next reaches them: make one go round."""
    queue.sweep()


def test_ctrl_c_lets_the_running_command_finish_and_acks_its_job_once(
    server: ServerProcess, client: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    queue = Rotator(client, queue_name, timeout=30)
    queue.push("first", "second")
    done = tmp_path / "done"
    command = f"echo started {{}}; sleep 2; echo {{}} >> {done}"

    with terminal(server, "work", queue_name, "--", "sh", "-c", command) as term:
        term.wait_for("started first")
        term.press(CTRL_C)
        code = term.wait(timeout=20)
        output = term.output

    assert code == 0, output
    assert "no new jobs; waiting for 1 running job(s) to finish" in output
    assert done.read_text() == "first\n"  # the job ran to its end: the SIGINT never reached it
    assert "completed 1, retried 0, dead 0" in output
    assert "started second" not in output  # nothing new was started after Ctrl-C
    lap(queue)
    stats = queue.stats()
    assert (stats.pending, stats.in_flight, stats.deferred, stats.dead) == (1, 0, 0, 0)
    (left,) = queue.next()
    assert (left.id, left.deliveries) == ("second", 1)  # "first" was acked once: it is gone
    queue.ack(left)
    lap(queue)
    assert queue.stats().length == 0


def test_a_second_ctrl_c_stops_the_running_command_and_its_whole_process_group(
    server: ServerProcess, client: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    queue = Rotator(client, queue_name, timeout=30)
    queue.push("long")
    pids = tmp_path / "pids"
    # The shell and a sleep it starts: SIGTERM to the group must reach both.
    command = f"sleep 60 & echo $$ $! > {pids}; echo started; wait"

    with terminal(server, "work", queue_name, "--", "sh", "-c", command) as term:
        term.wait_for("started")
        wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2)
        shell, sleeper = (int(pid) for pid in pids.read_text().split())
        term.press(CTRL_C)
        term.wait_for("Ctrl-C again stops them")
        began = time.monotonic()
        term.press(CTRL_C)
        code = term.wait(timeout=20)
        output = term.output

    assert time.monotonic() - began < 10, output
    assert code == 0, output  # stopped on request, nothing died
    assert "sent SIGTERM to 1 running job(s)" in output
    assert "was killed by SIGTERM; retrying in 1 s" in output
    assert "completed 0, retried 1, dead 0" in output
    wait_until(lambda: gone(shell) and gone(sleeper))
    (job,) = queue.next(block=5)  # given back, delivered again after its backoff
    assert (job.id, job.deliveries) == ("long", 2)


def gone(pid: int) -> bool:
    """Exited (a zombie nobody reaped yet counts: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_sigterm_to_the_worker_alone_finishes_the_running_job_too(
    server: ServerProcess, client: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    queue = Rotator(client, queue_name, timeout=30)
    queue.push("job")
    done = tmp_path / "done"
    proc = subprocess.Popen(
        [ROTATOR, "--url", server.url, "work", queue_name, "--",
         "sh", "-c", f"echo started; sleep 1; echo {{}} >> {done}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        wait_until(lambda: queue.stats().in_flight == 1)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert proc.returncode == 0, err
    assert done.read_text() == "job\n"
    assert out.endswith("completed 1, retried 0, dead 0\n")
    assert "SIGTERM: no new jobs" in err
    lap(queue)
    assert queue.stats().length == 0


def test_the_start_line_names_the_queue_server_and_limits_and_v_shows_each_job(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Rotator(client, queue_name).push("a", "b")

    done = run_process("--url", server.url, "work", queue_name, "--until-empty", "-v", "--", "true")

    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"rotator: working on queue {queue_name} (2 pending) at {server.url}")
    assert "at most 5 deliveries" in first  # the default
    assert "lease 30 s" in first
    per_job = [line for line in done.stderr.splitlines() if "completed in" in line]
    assert [line.split()[2] for line in per_job] == ["a", "b"]
    assert done.stdout == "completed 2, retried 0, dead 0\n"


def test_without_v_a_clean_run_prints_no_line_per_job(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Rotator(client, queue_name).push("a", "b")

    done = run_process("--url", server.url, "work", queue_name, "--until-empty", "--", "true")

    assert done.returncode == 0
    assert "completed in" not in done.stderr
    assert len(done.stderr.splitlines()) <= 2  # the start line (and maybe a server warning)


def test_a_job_that_keeps_failing_goes_to_the_dead_letters_and_the_worker_exits_1(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    queue.push("ok", "bad")
    script = 'test "$1" = ok'

    done = run_process(
        "--url", server.url, "work", queue_name, "--until-empty", "--max-deliveries", "2",
        "--", "sh", "-c", script, "sh",
    )  # fmt: skip

    assert done.returncode == 1
    assert done.stdout == "completed 1, retried 1, dead 1\n"
    lines = done.stderr.splitlines()
    assert "job bad failed (delivery 1 of 2): sh -c " in lines[-3]
    assert lines[-3].endswith("exited with 1; retrying in 1 s")
    assert "job bad failed (delivery 2 of 2)" in lines[-2]
    assert lines[-2].endswith("no deliveries left: it goes to the dead letters")
    assert "retrying" not in lines[-2]
    assert lines[-1] == (
        f"rotator: error: 1 job(s) went to the dead letters: rotator dead {queue_name}"
    )
    [letter] = queue.dead()
    assert (letter.id, letter.reason, letter.deliveries) == ("bad", "failed", 2)
    assert letter.error is not None
    assert letter.error.endswith("exited with 1")  # why it died, kept in its dead letter
    shown = ok(cli(server, "dead", queue_name))
    assert shown.startswith("bad\tfailed\t2\t")
    assert shown.rstrip().endswith("exited with 1")


def test_work_json_counts_jobs_and_deliveries(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Rotator(client, queue_name).push("bad")

    result = cli(
        server, "work", queue_name, "--until-empty", "--max-deliveries", "2", "--json",
        "--", "false",
    )  # fmt: skip

    assert result.exit_code == 1
    assert json.loads(result.stdout.splitlines()[0]) == {
        "completed": 0,
        "retried": 1,
        "dead": 1,
        "failed_deliveries": 2,
        "leases_lost": 0,
        "cancelled": 0,
    }


def test_the_command_gets_the_job_in_its_environment_and_no_terminal_stdin(
    server: ServerProcess, client: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    Rotator(client, queue_name).push("a")
    out = tmp_path / "out"
    script = f'echo "$ROTATOR_JOB_ID $ROTATOR_DELIVERIES $(cat | wc -c)" > {out}'

    ok(cli(server, "work", queue_name, "--until-empty", "--", "sh", "-c", script))

    assert out.read_text() == "a 1 0\n"


def test_a_command_that_does_not_exist_is_one_line_before_any_job_is_taken(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    queue.push("a")

    assert_error(cli(server, "work", queue_name, "--", "no-such-program-here"), "not found")
    stray = cli(server, "work", queue_name, "--no-such-flag", "--", "true")

    assert stray.exit_code == 2
    assert_error(stray, "--no-such-flag")
    assert queue.stats().pending == 1


def test_work_help_explains_braces_signals_and_the_default_max_deliveries() -> None:
    text = ok(run("work", "-h"))

    assert "`{}` in it becomes the job id" in text
    assert "Ctrl-C" in text
    assert "[default: 5;" in text  # --max-deliveries
    for option in ("--concurrency", "--timeout", "--until-empty", "-v, --verbose"):
        assert option in text


# -- rotator topic work --------------------------------------------------------------------


def test_topic_work_runs_the_command_per_message_with_the_payload_on_stdin(
    server: ServerProcess, client: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("mail")
    ids = topic.publish_many(["hello", "two\nlines"])
    inbox = tmp_path / "inbox"
    inbox.mkdir()

    result = cli(
        server, "topic", "work", queue_name, "mail", "--until-empty",
        "--", "sh", "-c", f"cat > {inbox}/{{}}",
    )  # fmt: skip

    assert ok(result) == "completed 2, retried 0, dead 0\n"
    assert (inbox / ids[0]).read_text() == "hello"
    assert (inbox / ids[1]).read_text() == "two\nlines"
    assert topic.stats().groups["mail"].pending == 0


def test_topic_work_on_a_group_that_was_never_subscribed_is_one_line(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Topic(client, queue_name).subscribe("mail")

    assert_error(
        cli(server, "topic", "work", queue_name, "nosuch", "--", "true"),
        f"topic {queue_name!r} has no group 'nosuch'",
    )
    never = cli(server, "topic", "work", "t-never-made", "mail", "--", "true")
    assert_error(never, "unknown topic")


def test_topic_work_json_summary(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("g")
    topic.publish("x")

    data = ok_json(
        cli(server, "topic", "work", queue_name, "g", "--until-empty", "--json", "--", "true")
    )

    assert (data["completed"], data["dead"]) == (1, 0)


def test_the_readme_states_the_default_max_deliveries_the_cli_uses() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()

    assert f"**`--max-deliveries` (default {DEFAULT_WORK_MAX_DELIVERIES})**" in readme
    assert f"at most {DEFAULT_WORK_MAX_DELIVERIES} deliveries" in readme
