/**
 * Every error rotator raises derives from RotatorError. The Lua module answers with stable
 * ROTATOR_* codes; errorFromReply is the one place that turns them (and the server's own
 * WRONGTYPE/BUSY replies) into these classes, as rotator/errors.py does for Python.
 */
import { ReplyError } from "ioredis";

export class RotatorError extends Error {
  override name = "RotatorError";
}

/** An argument is out of range or of the wrong kind; nothing was written. */
export class InvalidArgument extends RotatorError {
  override name = "InvalidArgument";
}

/** A job id is empty, longer than 1024 bytes, contains "*" or is not text. */
export class InvalidJobId extends InvalidArgument {
  override name = "InvalidJobId";
}

/** A delivery token is not of the form "<id>*<deadline>.<deliveries>.<seq>". */
export class InvalidToken extends InvalidArgument {
  override name = "InvalidToken";
}

/** A queue name could break the {queue} hash tag or widen an ACL key pattern. */
export class InvalidQueueName extends InvalidArgument {
  override name = "InvalidQueueName";
}

/** One of the queue's keys holds another Redis type (someone else wrote to it). */
export class WrongKeyType extends RotatorError {
  override name = "WrongKeyType";
}

/** The lease was re-issued, nacked, dead-lettered or already acked. */
export class LeaseLost extends RotatorError {
  override name = "LeaseLost";
}

/** The job was cancelled while it was held: stop working on it; its ack would be refused. */
export class JobCancelled extends LeaseLost {
  override name = "JobCancelled";
}

/** A unique push or a cancel on a queue that does not track its ids; nothing was written. */
export class NotTracked extends RotatorError {
  override name = "NotTracked";
}

/** The server is running someone else's slow script (BUSY); retry later. */
export class ServerBusy extends RotatorError {
  override name = "ServerBusy";
}

/** A topic's groups changed while a call naming them all was on its way; nothing written. */
export class GroupsChanged extends RotatorError {
  override name = "GroupsChanged";
}

/** The queue (or topic) is in a storage format this client's module does not know: a newer
 * rotator converted it, so upgrade this client (README: Upgrades). Nothing was written. A
 * worker loop stops on it. */
export class UnknownFormat extends RotatorError {
  override name = "UnknownFormat";
}

/** The topic has no consumer group of that name (subscribe first). */
export class UnknownGroup extends RotatorError {
  override name = "UnknownGroup";
}

/** The Lua module refused a call this client should never make (a bug). */
export class ProtocolError extends RotatorError {
  override name = "ProtocolError";
}

/** `functions: true` on a server without functions (Redis before 7): nothing ran. Leave
 * `functions` to its default, which calls the module by EVALSHA there, or pass false. */
export class FunctionsUnavailable extends RotatorError {
  override name = "FunctionsUnavailable";
}

/** A server without functions (Redis before 7) does not know FCALL, FCALL_RO or FUNCTION; its
 * reply names the command, quoted 'so' by Redis 7 and `so` by Redis 6.2. */
export const NO_FUNCTIONS = /unknown command ['`](fcall|fcall_ro|function)['`]/i;

/** Redis 6.2 wraps a server error met by a command a script calls in the script's own error:
 * "ERR Error running script (call to f_<sha>): @user_script:<line>: @user_script: <line>: -OOM
 * command not allowed ...", where Redis 7 replies with the server's error as it is. The two
 * refusals that come at a script's first write, before it wrote anything (OOM, READONLY), are
 * rejected with the server's own reply: the same error on every server (rotator/errors.py's
 * SCRIPT_WRAPPED). */
export const SCRIPT_WRAPPED =
  /^(?:ERR )?Error running script \(call to f_[0-9a-f]{40}\): @user_script:\d+: (?:@user_script: \d+: )?-((?:OOM|READONLY) .*)$/s;

type ErrorClass = new (message: string) => RotatorError;

/** The module's error codes (and the server's own) and the class each one raises. */
export const ERROR_CODES: Readonly<Record<string, ErrorClass>> = {
  ROTATOR_BADARG: InvalidArgument,
  ROTATOR_TOOMANY: InvalidArgument,
  ROTATOR_BADID: InvalidJobId,
  ROTATOR_BADTOKEN: InvalidToken,
  ROTATOR_WRONGTYPE: WrongKeyType,
  WRONGTYPE: WrongKeyType,
  BUSY: ServerBusy,
  ROTATOR_STALE: GroupsChanged,
  ROTATOR_NOGROUP: UnknownGroup,
  ROTATOR_BADCMD: ProtocolError,
  ROTATOR_KEYS: ProtocolError,
  ROTATOR_UNTRACKED: NotTracked,
  ROTATOR_FORMAT: UnknownFormat,
};

/** The typed error for a server error reply; the error itself when it is not ours. */
export function errorFromReply(error: unknown): unknown {
  if (!(error instanceof Error)) return error;
  const wrapped = SCRIPT_WRAPPED.exec(error.message);
  if (wrapped) {
    const own = new ReplyError(wrapped[1]) as Error;
    (own as { cause?: unknown }).cause = error;
    return own;
  }
  if (NO_FUNCTIONS.test(error.message)) {
    const typed = new FunctionsUnavailable(
      "this server has no functions (Redis before 7): leave functions to its default " +
        `(EVALSHA there) or pass false (${error.message})`,
    );
    (typed as { cause?: unknown }).cause = error;
    return typed;
  }
  // Redis 7.0 prefixes a script's error reply with "ERR " (and appends " script: ..."); the
  // code is the first word after that.
  const code = error.message.replace(/^ERR /, "").split(" ", 1)[0] ?? "";
  const kind = ERROR_CODES[code];
  if (kind === undefined) return error;
  const typed = new kind(error.message);
  (typed as { cause?: unknown }).cause = error;
  return typed;
}
