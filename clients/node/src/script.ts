/**
 * The Lua module: its source (the package's copy of lua/rotator.lua), its SHA, and calling
 * it with typed errors, as rotator/script.py does for Python.
 *
 * By default a client's calls go by FCALL of the module loaded as a function library, where
 * the server has functions (Redis 7+, Valkey) and the ACL allows FCALL (and FUNCTION LOAD
 * while the library is missing): a library call does not define the module's functions
 * again, as every EVALSHA call does. Otherwise, and always on a Cluster client, by EVALSHA.
 * The choice is made at a client's first call and kept for it; `functions: true` forces
 * FCALL, `functions: false` EVALSHA. The library has the Python client's name and source,
 * so both share it.
 *
 * By FCALL, the commands that only read (see readsOnly) go by FCALL_RO to the library's
 * read-only function (registered 'no-writes'): a server runs it out of memory under
 * noeviction and on a read-only replica, where it refuses FCALL of a function that may
 * write, so stats and the other reads answer there as they do by EVALSHA.
 *
 * A reply saying the script or library is missing (after SCRIPT FLUSH, FUNCTION FLUSH, a
 * restart or a failover) means nothing ran: it is loaded and the call sent once more; if it
 * was flushed again meanwhile, the source itself goes with EVAL. A refusal of FCALL itself
 * (no such command, NOPERM) also means nothing ran. So no retry here can apply a command
 * twice.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { ChainableCommander, Cluster, Redis } from "ioredis";
import { NO_FUNCTIONS, errorFromReply } from "./errors";

export type Client = Redis | Cluster;
export type Arg = string | number | Buffer;
/** How a client calls the module. */
export type Mode = "fcall" | "evalsha";
/** How a call's bulk-string replies come: decoded as UTF-8, or as Buffers byte for byte. */
export type Replies = "strings" | "buffers";

/** Where the package carries the module: beside dist/, copied there by the build. */
export const MODULE_PATH = join(__dirname, "..", "lua", "rotator.lua");

let source: string | undefined;

export function moduleSource(): string {
  source ??= readFileSync(MODULE_PATH, "utf8");
  return source;
}

/** The SHA1 that SCRIPT LOAD returns for the module. */
export function moduleSha(): string {
  return createHash("sha1").update(moduleSource(), "utf8").digest("hex");
}

/** The library and function name: versioned, so two rotator versions can share a server. */
export function functionName(): string {
  return `rotator_${moduleSha().slice(0, 16)}`;
}

/** The commands the module's read-only function runs (its READS); durations only without
 * counts to add, when it reads the histogram. */
export const READ_COMMANDS: ReadonlySet<string> = new Set([
  "stats",
  "peek",
  "scan",
  "dead",
  "schedules",
  "items",
  "tstats",
  "durations",
]);

/** A module call (its ARGV) that only reads: FCALL_RO's. */
export function readsOnly(args: readonly Arg[]): boolean {
  const command = args[0];
  const name = Buffer.isBuffer(command) ? command.toString("utf8") : String(command);
  return READ_COMMANDS.has(name) && (name !== "durations" || args.length === 1);
}

/** The module as a function library: a shebang naming it, and the name it registers. */
export function librarySource(): string {
  const name = functionName();
  return `#!lua name=${name}\nlocal FUNCTION_NAME = '${name}'\n${moduleSource()}`;
}

function lowerMessage(error: unknown): string {
  return error instanceof Error ? error.message.toLowerCase() : "";
}

export function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith("NOSCRIPT");
}

/** The library is not on the server (nothing ran). */
export function isFunctionMissing(error: unknown): boolean {
  return lowerMessage(error).includes("function not found");
}

/** A reply saying the module is not loaded, either way: call again through `call`. */
export function isNotLoaded(error: unknown): boolean {
  return isNoScript(error) || isFunctionMissing(error);
}

/** The server cannot run the library for this client: it has no functions, or the ACL refuses
 * FCALL, FCALL_RO (the reads') or FUNCTION LOAD (a refusal of a command the module calls is
 * not this). */
function isFcallRefused(error: unknown): boolean {
  const text = lowerMessage(error);
  if (text.startsWith("noperm")) {
    return ["fcall", "fcall_ro", "function|load", "function"].some((name) => text.includes(`'${name}'`));
  }
  return NO_FUNCTIONS.test(text);
}

function isCluster(client: Client): boolean {
  return "isCluster" in client && client.isCluster;
}

/** The mode chosen at each client's first call (functions left to the default). */
const chosen = new WeakMap<Client, Mode>();

/** Calls the module on one client. */
export class ModuleCaller {
  readonly sha: string;
  readonly functionName: string;

  /** `functions`: true forces FCALL, false EVALSHA; left out, the faster the server allows. */
  constructor(
    readonly client: Client,
    readonly functions?: boolean,
  ) {
    this.sha = moduleSha();
    this.functionName = functionName();
  }

  /** How calls go now: "evalsha" until a default client's first call has chosen. */
  get mode(): Mode {
    return this.decided ?? "evalsha";
  }

  /** The mode forced, or chosen for the client; undefined while a default client's first
   * call has yet to choose. */
  private get decided(): Mode | undefined {
    if (this.functions === false || isCluster(this.client)) return "evalsha";
    if (this.functions === true) return "fcall";
    return chosen.get(this.client);
  }

  /** Runs ARGV on the given KEYS; raises the module's errors as typed errors. `replies`
   * "buffers": its bulk strings come as Buffers, byte for byte (a payload need not be UTF-8);
   * by default they are decoded as UTF-8 strings. */
  async call(keys: readonly string[], args: readonly Arg[], replies: Replies = "strings"): Promise<unknown> {
    try {
      return await this.raw(keys, args, replies);
    } catch (error) {
      throw errorFromReply(error);
    }
  }

  /** Adds this call to a pipeline the way calls go now (a reply saying the module is not
   * loaded, see isNotLoaded: nothing ran, call again through `call`). */
  pipelined(
    pipeline: ChainableCommander,
    keys: readonly string[],
    args: readonly Arg[],
    replies: Replies = "strings",
  ): ChainableCommander {
    const [verb, name] = this.mode === "fcall" ? this.functionCommand(args) : (["EVALSHA", this.sha] as const);
    const rest = [name, keys.length, ...keys, ...args];
    return replies === "buffers" ? pipeline.callBuffer(verb, ...rest) : pipeline.call(verb, ...rest);
  }

  /** One command on the client, its reply read as `replies` says. */
  private send(replies: Replies, command: string, ...rest: Arg[]): Promise<unknown> {
    const client = this.client as Redis;
    return replies === "buffers" ? client.callBuffer(command, ...rest) : client.call(command, ...rest);
  }

  private async raw(keys: readonly string[], args: readonly Arg[], replies: Replies): Promise<unknown> {
    if (this.decided !== "evalsha") {
      try {
        const reply = await this.fcall(keys, args, replies);
        if (this.functions === undefined) chosen.set(this.client, "fcall");
        return reply;
      } catch (error) {
        if (this.functions === true || !this.asScript(error)) throw error;
      }
    }
    return await this.evalsha(keys, args, replies);
  }

  /** After FCALL raised `error`: true when nothing ran and the call goes as a script (noting
   * the choice), false when the error is the command's own. */
  private asScript(error: unknown): boolean {
    if (lowerMessage(error).startsWith("readonly")) {
      // A read-only replica refuses FCALL of a library that may write before it runs; a
      // script runs there, and fails at its first write (this call only).
      return true;
    }
    const refused = isFcallRefused(error);
    chosen.set(this.client, refused ? "evalsha" : "fcall");
    return refused;
  }

  /** The verb and function that call the module with `args` by a function: FCALL_RO of the
   * read-only function for a call that only reads, FCALL of the module otherwise. */
  private functionCommand(args: readonly Arg[]): readonly [string, string] {
    return readsOnly(args) ? ["FCALL_RO", `${this.functionName}_ro`] : ["FCALL", this.functionName];
  }

  private async fcall(keys: readonly string[], args: readonly Arg[], replies: Replies): Promise<unknown> {
    const [verb, name] = this.functionCommand(args);
    const call = [name, keys.length, ...keys, ...args];
    return this.sendLoading(replies, verb, call, isFunctionMissing, () => this.loadLibrary());
  }

  private async evalsha(keys: readonly string[], args: readonly Arg[], replies: Replies): Promise<unknown> {
    const call = [this.sha, keys.length, ...keys, ...args];
    return this.sendLoading(replies, "EVALSHA", call, isNoScript, () => this.load(this.client));
  }

  /** `command` (FCALL or EVALSHA) with `call` (the name, then numkeys, KEYS and ARGV); when
   * the reply says the module is `missing` (nothing ran), `load` it and send once more, and
   * if it was flushed again meanwhile, run the same module as a script (EVAL). */
  private async sendLoading(
    replies: Replies,
    command: string,
    call: Arg[],
    missing: (error: unknown) => boolean,
    load: () => Promise<void>,
  ): Promise<unknown> {
    for (let attempt = 0; attempt < 2; attempt += 1) {
      try {
        return await this.send(replies, command, ...call);
      } catch (error) {
        if (!missing(error)) throw error;
      }
      if (attempt === 0) await load();
    }
    return await this.send(replies, "EVAL", moduleSource(), ...call.slice(1));
  }

  /** FUNCTION LOAD of the library (REPLACE: a library of the same name is this module). */
  async loadLibrary(): Promise<void> {
    await (this.client as Redis).call("FUNCTION", "LOAD", "REPLACE", librarySource());
  }

  /** SCRIPT LOAD on the client (a Cluster loads it on the node of the call's slot when the
   * call is sent, so there it is left to EVAL's fallback). */
  async load(client: Client = this.client): Promise<void> {
    if (isCluster(client)) return;
    await (client as Redis).script("LOAD", moduleSource());
  }
}
