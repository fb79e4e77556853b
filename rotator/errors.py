"""The exceptions rotator raises. Every one derives from :class:`RotatorError`.

Lua replies carry stable ``ROTATOR_*`` codes; :func:`error_from_reply` is the one place that
turns them (and the server's own WRONGTYPE/BUSY replies) into these types.
"""

from __future__ import annotations

import re

from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError


class RotatorError(Exception):
    """Root of every error raised by rotator."""


class InvalidArgument(RotatorError, ValueError):
    """An argument is out of range or of the wrong kind; nothing was written."""


class InvalidJobId(InvalidArgument):
    """A job id is empty, longer than 1024 bytes, contains ``*`` or is not text."""


class InvalidToken(InvalidArgument):
    """A delivery token is not of the form ``<id>*<deadline>.<deliveries>.<seq>``."""


class InvalidQueueName(InvalidArgument):
    """A queue name could break the ``{queue}`` hash tag or widen an ACL key pattern."""


class WrongKeyType(RotatorError):
    """One of the queue's keys holds another Redis type (someone else wrote to it)."""


class LeaseLost(RotatorError):
    """The lease was re-issued, nacked, dead-lettered or already acked."""


class JobCancelled(LeaseLost):
    """The job was cancelled (:meth:`rotator.Rotator.cancel`) while it was held: stop working
    on it; its ack would be refused."""


class NotTracked(RotatorError):
    """A unique push or a cancel on a queue that does not track its ids: call
    ``configure(track_ids=True)`` on the queue while it is empty first. Nothing was written."""


class UnknownFormat(RotatorError):
    """The queue (or topic) is in a storage format this client's module does not know: a
    newer rotator converted it, so upgrade this client (README: Upgrades). Nothing was
    written. Not transient: a worker loop stops on it."""


class ServerBusy(RotatorError):
    """The server is running someone else's slow script (BUSY); retry later."""


class GroupsChanged(RotatorError):
    """A topic's consumer groups changed while a call that names them all was on its way;
    nothing was written. Topic methods retry it themselves."""


class UnknownGroup(RotatorError):
    """The topic has no consumer group of that name (subscribe first)."""


class NotDurable(RotatorError):
    """The write was applied, but not confirmed persisted/replicated within the timeout."""


class DurabilityUnavailable(RotatorError):
    """The durability asked for cannot be had from this server (``local_aof`` where its
    appendonly is off); nothing was written. Not a NotDurable, whose write was applied: a
    caller that takes NotDurable for "written" must not take this one for it."""


class EmbeddedServerError(RotatorError):
    """The embedded server could not be found, started or stopped."""


class ShardsMismatch(RotatorError):
    """A sharded queue was opened with another shard count (or layout) than the one stored
    with it; nothing was written. Drain it and switch (see the README's Redis Cluster
    section), or open it with the stored count."""


class ProtocolError(RotatorError):
    """The Lua module refused a call this client should never make (a bug)."""


class FunctionsUnavailable(RotatorError):
    """``functions=True`` on a server without functions (Redis before 7): nothing ran. Leave
    ``functions`` to its default, which calls the module by EVALSHA there, or pass False."""


_CODES: dict[str, type[RotatorError]] = {
    "ROTATOR_BADARG": InvalidArgument,
    "ROTATOR_TOOMANY": InvalidArgument,
    "ROTATOR_BADID": InvalidJobId,
    "ROTATOR_BADTOKEN": InvalidToken,
    "ROTATOR_WRONGTYPE": WrongKeyType,
    "WRONGTYPE": WrongKeyType,
    "BUSY": ServerBusy,
    "ROTATOR_STALE": GroupsChanged,
    "ROTATOR_NOGROUP": UnknownGroup,
    "ROTATOR_BADCMD": ProtocolError,
    "ROTATOR_KEYS": ProtocolError,
    "ROTATOR_UNTRACKED": NotTracked,
    "ROTATOR_FORMAT": UnknownFormat,
}


# A server without functions (Redis before 7) does not know FCALL, FCALL_RO or FUNCTION; its
# reply names the command, quoted 'so' by Redis 7 and `so` by Redis 6.2.
NO_FUNCTIONS = re.compile(r"unknown command ['`](fcall|fcall_ro|function)['`]", re.IGNORECASE)


# Redis 6.2 wraps a server error met by a command a script calls in the script's own error:
# "Error running script (call to f_<sha>): @user_script:<line>: @user_script: <line>: -OOM
# command not allowed ...", where Redis 7 replies with the server's error as it is. The two
# refusals that come at a script's first write, before it wrote anything (OOM, READONLY), are
# raised as redis-py raises the server's own reply (its class, the message after the code):
# the same error on every server, which a caller (and a sharded queue's retry) can tell.
SCRIPT_WRAPPED = re.compile(
    r"^Error running script \(call to f_[0-9a-f]{40}\): @user_script:\d+: "
    r"(?:@user_script: \d+: )?-(?P<code>OOM|READONLY) (?P<rest>.*)$",
    re.DOTALL,
)
_UNWRAPPED: dict[str, type[ResponseError]] = {"OOM": OutOfMemoryError, "READONLY": ReadOnlyError}


def error_from_reply(error: ResponseError) -> Exception:
    """The typed error for a server error reply; the reply itself when it is not ours."""
    message = str(error)
    wrapped = SCRIPT_WRAPPED.match(message)
    if wrapped:
        return _UNWRAPPED[wrapped["code"]](wrapped["rest"])
    if NO_FUNCTIONS.search(message):
        return FunctionsUnavailable(
            "this server has no functions (Redis before 7): leave functions= to its default "
            f"(EVALSHA there) or pass False ({message})"
        )
    code = message.split(" ", 1)[0]
    kind = _CODES.get(code)
    return kind(message) if kind is not None else error
