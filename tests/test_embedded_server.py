"""The embedded valkey-server: start, reuse, status, stop, stale pid files, persistence, races.

Each test gets a data directory of its own under /tmp with a short name (a unix socket path
must fit in 107 bytes, which pytest's tmp_path does not promise) and stops its server in the
fixture's teardown, whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rotator import Rotator
from rotator.errors import EmbeddedServerError
from rotator.server import EmbeddedServer

ROTATOR = str(Path(sys.executable).parent / "rotator")


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rot", dir="/tmp"))
    try:
        yield path
    finally:
        EmbeddedServer(path).stop()
        shutil.rmtree(path, ignore_errors=True)


def alive(pid: int) -> bool:
    """Running, and not merely a zombie that init has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not alive(proc.pid)
    return proc.pid


def servers_on(socket: Path) -> list[int]:
    """Pids of valkey-server main processes listening on ``socket`` (from their titles)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().split()
        except OSError:  # exited while we looked
            continue
        if title and Path(title[0]).name == "valkey-server" and f"unixsocket:{socket}" in title:
            found.append(int(entry.name))
    return found


def test_start_returns_running_status_with_pid_version_url_and_data_dir(data_dir: Path) -> None:
    server = EmbeddedServer(data_dir)

    status = server.start()

    assert status.running
    assert status.pid is not None
    assert alive(status.pid)
    assert status.version is not None
    assert status.version.startswith("8.")
    assert status.url == f"unix://{data_dir}/valkey.sock"
    assert status.data_dir == str(data_dir)
    assert server.pid_file.read_text().strip() == str(status.pid)
    with server.client() as conn:
        assert conn.config_get("appendonly") == {"appendonly": "yes"}


def test_starting_twice_reuses_the_running_server(data_dir: Path) -> None:
    server = EmbeddedServer(data_dir)
    first = server.start()

    second = EmbeddedServer(data_dir).start()

    assert second.running
    assert second.pid == first.pid
    assert servers_on(server.socket) == [first.pid]


def test_status_of_a_server_never_started_is_not_running(data_dir: Path) -> None:
    status = EmbeddedServer(data_dir).status()

    assert not status.running
    assert status.pid is None
    assert status.version is None
    assert status.url == f"unix://{data_dir}/valkey.sock"
    assert status.data_dir == str(data_dir)


def test_stop_returns_true_then_false_and_the_process_is_gone(data_dir: Path) -> None:
    server = EmbeddedServer(data_dir)
    pid = server.start().pid
    assert pid is not None

    assert server.stop() is True
    assert server.stop() is False

    assert not alive(pid)
    assert not server.pid_file.exists()
    assert not server.socket.exists()
    assert server.status().running is False


def test_stale_pid_file_is_detected_and_cleaned_and_start_still_works(data_dir: Path) -> None:
    server = EmbeddedServer(data_dir)
    stale = dead_pid()
    server.pid_file.write_text(f"{stale}\n")
    server.socket.write_text("")  # a leftover socket file from the crashed server

    status = server.status()

    assert not status.running
    assert status.pid is None
    assert not server.pid_file.exists()
    assert not server.socket.exists()
    started = server.start()
    assert started.running
    assert started.pid not in (None, stale)


def test_pid_file_naming_a_live_unrelated_process_is_stale_and_never_signalled(
    data_dir: Path,
) -> None:
    # After a crash or reboot the pid in the file can belong to any other program by now.
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        server = EmbeddedServer(data_dir)
        server.pid_file.write_text(f"{bystander.pid}\n")

        assert server.status().pid is None
        started = server.start()
        assert server.stop() is True

        assert started.running
        assert started.pid != bystander.pid
        assert bystander.poll() is None, "start/stop signalled a process that is not ours"
    finally:
        bystander.kill()
        bystander.wait()


def test_pushed_jobs_survive_stop_and_start(data_dir: Path) -> None:
    queue = Rotator.embedded("durable", data_dir=str(data_dir), timeout=30)
    try:
        assert queue.push("job-1", "job-2", "job-3") == 3
    finally:
        queue.client.close()
    server = EmbeddedServer(data_dir)
    old_pid = server.status().pid
    assert server.stop() is True

    restarted = server.start()

    assert restarted.pid != old_pid
    queue = Rotator.embedded("durable", data_dir=str(data_dir), timeout=30)
    try:
        assert queue.stats().pending == 3
        jobs = queue.next(10)
        assert [job.id for job in jobs] == ["job-1", "job-2", "job-3"]
        assert queue.ack(*jobs) == 3
    finally:
        queue.client.close()


def test_rotator_embedded_starts_the_server_when_it_is_not_running(data_dir: Path) -> None:
    assert not EmbeddedServer(data_dir).status().running

    queue = Rotator.embedded("auto", data_dir=str(data_dir))
    try:
        assert queue.push("a") == 1
        assert [job.id for job in queue.next()] == ["a"]
    finally:
        queue.client.close()

    status = EmbeddedServer(data_dir).status()
    assert status.running
    assert status.pid is not None
    assert servers_on(data_dir / "valkey.sock") == [status.pid]


def test_two_processes_racing_to_start_end_with_exactly_one_server(data_dir: Path) -> None:
    env = {**os.environ, "ROTATOR_HOME": str(data_dir)}
    racers = [
        subprocess.Popen(
            [ROTATOR, "server", "start", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [racer.communicate(timeout=60) for racer in racers]

    assert [racer.returncode for racer in racers] == [0, 0], outputs
    statuses = [json.loads(out) for out, _ in outputs]
    assert all(status["running"] for status in statuses)
    assert statuses[0]["pid"] == statuses[1]["pid"]
    assert servers_on(data_dir / "valkey.sock") == [statuses[0]["pid"]]


def test_data_dir_too_long_for_a_unix_socket_is_refused_before_anything_is_created(
    data_dir: Path,
) -> None:
    too_long = data_dir / ("d" * 120)

    with pytest.raises(EmbeddedServerError, match="too long"):
        EmbeddedServer(too_long).start()

    assert not too_long.exists()
