/**
 * The Lua module: its source (the package's copy of lua/rotator.lua), its SHA, and calling
 * it by EVALSHA with typed errors. A NOSCRIPT reply (after SCRIPT FLUSH, a restart or a
 * failover) means nothing ran: the module is loaded with SCRIPT LOAD and the call sent once
 * more; if the cache was flushed again meanwhile, the source itself goes with EVAL. So no
 * retry here can apply a command twice.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Cluster, Redis } from "ioredis";
import { errorFromReply } from "./errors";

export type Client = Redis | Cluster;
export type Arg = string | number | Buffer;

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

export function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith("NOSCRIPT");
}

/** Calls the module on one client. */
export class ModuleCaller {
  readonly sha: string;

  constructor(readonly client: Client) {
    this.sha = moduleSha();
  }

  /** Runs ARGV on the given KEYS; raises the module's errors as typed errors. */
  async call(keys: readonly string[], args: readonly Arg[]): Promise<unknown> {
    try {
      return await this.raw(keys, args);
    } catch (error) {
      throw errorFromReply(error);
    }
  }

  private async raw(keys: readonly string[], args: readonly Arg[]): Promise<unknown> {
    try {
      return await this.client.evalsha(this.sha, keys.length, ...keys, ...args);
    } catch (error) {
      if (!isNoScript(error)) throw error;
    }
    await this.load(this.client);
    try {
      return await this.client.evalsha(this.sha, keys.length, ...keys, ...args);
    } catch (error) {
      if (!isNoScript(error)) throw error;
    }
    return await this.client.eval(moduleSource(), keys.length, ...keys, ...args);
  }

  /** SCRIPT LOAD on the client (a Cluster loads it on the node of the call's slot when the
   * call is sent, so there it is left to EVAL's fallback). */
  async load(client: Client = this.client): Promise<void> {
    if ("isCluster" in client && client.isCluster) return;
    await (client as Redis).script("LOAD", moduleSource());
  }
}
