"""A command on a pseudo-terminal of its own, as a user runs it in a shell: it leads its own
session with the terminal as its controlling terminal and is the foreground process group, so
a Ctrl-C pressed on the terminal (``\\x03`` written to the master side) reaches exactly the
processes a real terminal would signal. Test-only.
"""

from __future__ import annotations

import contextlib
import os
import pty
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Self

CTRL_C = b"\x03"


class Terminal:
    """Runs ``argv`` (a path to a program, then its arguments) on a new pty; collects what it
    writes there (stdout and stderr) in the background."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: exec at once, nothing else from this forked test process
            try:
                os.execve(argv[0], list(argv), dict(env))
            finally:
                os._exit(127)
        self.pid = pid
        self.fd = fd
        self._output = bytearray()
        self._lock = threading.Lock()
        self._status: int | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # EIO: every process holding the terminal has gone
                return
            if not chunk:
                return
            with self._lock:
                self._output += chunk

    @property
    def output(self) -> str:
        with self._lock:
            return self._output.decode(errors="replace")

    def press(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        give_up = time.monotonic() + timeout
        while text not in self.output:
            assert time.monotonic() < give_up, f"{text!r} never shown; output:\n{self.output}"
            time.sleep(0.02)

    def wait(self, timeout: float = 30.0) -> int:
        """The exit code (negative: the signal that ended it)."""
        give_up = time.monotonic() + timeout
        while self._status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self._status = os.waitstatus_to_exitcode(status)
                break
            assert time.monotonic() < give_up, f"still running; output:\n{self.output}"
            time.sleep(0.02)
        self._reader.join(5)
        return self._status

    def close(self) -> None:
        if self._status is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self._status = -signal.SIGKILL
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
