"""Shell commands as job handlers, for ``rotator work`` and ``rotator topic work``.

Each job runs ``COMMAND`` once, with ``{}`` replaced by the job id (or the id appended when the
command has no ``{}``), in a session and process group of its own. So the terminal's Ctrl-C
reaches the worker alone, not the running commands: :class:`Stopper` turns the signals the
worker gets into steps, the first stopping the claims and letting the running commands finish
(the worker acks them), the second sending SIGTERM to every running command's process group,
any later one SIGKILL.

A command exiting 0 completes its job; any other status, or a signal, fails it (the worker
gives it back for a retry, or to the dead letters on its last delivery).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from rotator.models import Job

log = logging.getLogger("rotator.shell")

PLACEHOLDER = "{}"


class CommandFailed(Exception):
    """A job's command exited with a non-zero status or was killed by a signal."""


def command_argv(command: Sequence[str], job_id: str) -> list[str]:
    """``command`` for one job: every ``{}`` replaced by the id, else the id appended."""
    if any(PLACEHOLDER in part for part in command):
        return [part.replace(PLACEHOLDER, job_id) for part in command]
    return [*command, job_id]


def missing_program(command: Sequence[str]) -> str | None:
    """The program of ``command`` when it cannot be run (not found, not executable)."""
    program = command[0]
    if os.sep in program:
        return None if os.access(program, os.X_OK) else program
    return None if shutil.which(program) else program


def describe_exit(argv: Sequence[str], returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{shlex.join(argv)} was killed by {name}"
    return f"{shlex.join(argv)} exited with {returncode}"


class CommandHandler:
    """Runs the command for each job (a :data:`rotator.models.Handler`); thread-safe.

    The job's command gets ``ROTATOR_JOB_ID`` and ``ROTATOR_DELIVERIES`` in its environment.
    With ``payload_stdin`` its stdin is the job's payload (a topic message's body), else
    /dev/null: commands running side by side never read the terminal.
    """

    def __init__(self, command: Sequence[str], *, payload_stdin: bool = False) -> None:
        self.command = list(command)
        self.payload_stdin = payload_stdin
        # pid -> its process; a dict so that a signal handler can copy it without a lock.
        self._running: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def running(self) -> int:
        return len(self._running)

    def __call__(self, job: Job) -> None:
        argv = command_argv(self.command, job.id)
        env = {**os.environ, "ROTATOR_JOB_ID": job.id, "ROTATOR_DELIVERIES": str(job.deliveries)}
        began = time.monotonic()
        # A session of its own: the terminal's SIGINT and SIGTSTP go to the worker's group
        # only, and a signal to the child's group reaches what the command started too.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if self.payload_stdin else subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self._running[proc.pid] = proc
        try:
            if self.payload_stdin:
                proc.communicate(job.payload or b"")
            else:
                proc.wait()
        finally:
            self._running.pop(proc.pid, None)
        if proc.returncode != 0:
            raise CommandFailed(describe_exit(argv, proc.returncode))
        log.info(
            "job %s completed in %.2f s (delivery %d)",
            job.id,
            time.monotonic() - began,
            job.deliveries,
        )

    def signal_all(self, signum: int) -> int:
        """Sends ``signum`` to the process group of every running command; how many."""
        sent = 0
        for pid in tuple(self._running):
            try:
                os.killpg(pid, signum)  # the child leads its own group: pgid == pid
            except ProcessLookupError:
                continue
            sent += 1
        return sent


class Stopper:
    """SIGINT/SIGTERM for a worker running commands: the first stops claiming (running
    commands finish and are acked), the second sends SIGTERM to the commands' process
    groups, any later one SIGKILL. Install it in the main thread."""

    def __init__(self, stop: Callable[[], None], handler: CommandHandler) -> None:
        self.stop = stop
        self.handler = handler
        self.signals = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        name = signal.Signals(signum).name
        running = self.handler.running
        if self.signals == 1:
            self.stop()
            if running:
                log.warning(
                    "%s: no new jobs; waiting for %d running job(s) to finish "
                    "(Ctrl-C again stops them)",
                    name,
                    running,
                )
            else:
                log.warning("%s: stopping", name)
        elif self.signals == 2:
            sent = self.handler.signal_all(signal.SIGTERM)
            log.warning(
                "%s again: sent SIGTERM to %d running job(s), which are given back "
                "(Ctrl-C again kills them)",
                name,
                sent,
            )
        else:
            sent = self.handler.signal_all(signal.SIGKILL)
            log.warning("%s again: killed %d running job(s)", name, sent)
