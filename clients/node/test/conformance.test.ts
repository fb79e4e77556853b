/**
 * The conformance scenarios (tests/conformance/*.json), run by Node on Redis 7.0, Valkey 8.1,
 * and Redis 6.2 and 8.2 (6.2 has no functions: the module by EVALSHA there): the very files
 * tests/test_conformance.py runs. The format: tests/conformance/README.md.
 * Keys come from this package's own queueKeys, so the scenarios check them too.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import type Redis from "ioredis";
import {
  KEY_ROLES,
  type KeyRole,
  type QueueKeys,
  TOPIC_ROLES,
  type TopicKeys,
  groupKeys,
  moduleSha,
  moduleSource,
  queueKeys,
  topicKeys,
} from "../dist/index";
import { KINDS, ROOT, serveTests } from "./servers";

type Value = string | number | null | Value[];
type Step = Record<string, unknown> & {
  call?: Array<string | number>;
  keys?: number;
  /** TOPIC KEYS, then each named group's thirteen. */
  topic?: string[];
  /** A group's thirteen (and with keys 14 the topic's bodies). */
  group?: string;
  /** The queue's thirteen, then "<base>:<marker>" (push_chunk's marker). */
  marker?: string;
  note?: string;
};
interface Scenario {
  name: string;
  steps: Step[];
}
interface ScenarioFile {
  description: string;
  scenarios: Scenario[];
}

const HERE = join(ROOT, "tests", "conformance");
const FILES = readdirSync(HERE).filter((name) => name.endsWith(".json")).sort();
const ROLES = [...KEY_ROLES, "payloads", "items"];
const VAR = /\$\{([A-Za-z_][A-Za-z0-9_]*)\}/g;
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

class Mismatch extends Error {}

class Runner {
  private readonly vars = new Map<string, string>();
  private sentMs = 0;
  private readonly allKeys: string[];
  private readonly base: string;

  constructor(
    private readonly redis: Redis,
    keys: QueueKeys,
    private readonly topic: TopicKeys,
  ) {
    this.allKeys = [...keys.all, keys.payloads, keys.items];
    this.base = (keys.all[0] as string).replace(/:ring$/, "");
  }

  /** A queue role, "topic:<role>" (the topic's own keys), "group:<GROUP>:<role>" (a
   * group's thirteen; its "payloads" are the topic's bodies) or "marker:<NAME>" (the key
   * "<base>:<NAME>" under the queue's base: push_chunk's marker). */
  private key(role: string): string {
    if (role.startsWith("marker:")) return `${this.base}:${role.slice("marker:".length)}`;
    if (role.startsWith("topic:")) {
      const index = (TOPIC_ROLES as readonly string[]).indexOf(role.slice("topic:".length));
      if (index < 0) throw new Mismatch(`unknown role ${role}`);
      return this.topic.all[index] as string;
    }
    if (role.startsWith("group:")) {
      const rest = role.slice("group:".length);
      const cut = rest.lastIndexOf(":");
      const keys = groupKeys(this.topic, rest.slice(0, cut));
      const own = rest.slice(cut + 1);
      if (own === "payloads") return keys.payloads;
      if (!(KEY_ROLES as readonly string[]).includes(own)) throw new Mismatch(`unknown role ${role}`);
      return keys.all[KEY_ROLES.indexOf(own as KeyRole)] as string;
    }
    const index = ROLES.indexOf(role);
    if (index < 0) throw new Mismatch(`unknown role ${role}`);
    return this.allKeys[index] as string;
  }

  private subst(text: string): string {
    return text.replace(VAR, (_, name: string) => {
      const value = this.vars.get(name);
      if (value === undefined) throw new Mismatch(`nothing captured as ${name}`);
      return value;
    });
  }

  private callKeys(step: Step): string[] {
    // A marker "<base>:<NAME>" comes last: after the queue's keys (push_chunk's thirteen, or
    // as many as "keys" says: once), or after the topic's and its groups' (tpublish_chunk).
    const marker = step.marker === undefined ? [] : [this.key(`marker:${step.marker}`)];
    if (step.topic !== undefined) {
      return [...this.topic.all, ...step.topic.flatMap((group) => groupKeys(this.topic, group).all), ...marker];
    }
    if (step.marker !== undefined) return [...this.allKeys.slice(0, step.keys ?? 13), ...marker];
    if (step.group !== undefined) {
      const keys = groupKeys(this.topic, step.group);
      return [...keys.all, keys.payloads].slice(0, step.keys ?? 13);
    }
    return this.allKeys.slice(0, step.keys ?? 13);
  }

  private async call(step: Step): Promise<Value> {
    const keys = this.callKeys(step);
    const args = (step.call ?? []).map((arg) => (typeof arg === "string" ? this.subst(arg) : String(arg)));
    this.sentMs = Date.now();
    try {
      return (await this.redis.evalsha(moduleSha(), keys.length, ...keys, ...args)) as Value;
    } catch (error) {
      if (!(error instanceof Error) || !error.message.startsWith("NOSCRIPT")) throw error;
      await this.redis.script("LOAD", moduleSource());
      return (await this.redis.evalsha(moduleSha(), keys.length, ...keys, ...args)) as Value;
    }
  }

  private async read(role: string): Promise<unknown> {
    const key = this.key(role);
    const kind = await this.redis.type(key);
    if (kind === "list") return this.redis.lrange(key, 0, -1);
    if (kind === "set") return (await this.redis.smembers(key)).sort();
    if (kind === "zset") return this.redis.zrange(key, "0", "-1");
    if (kind === "hash") {
      // (by field: HGETALL's order is the hash table's, which a rehash step moves on a read)
      const fields = Object.entries(await this.redis.hgetall(key));
      return Object.fromEntries(fields.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
    }
    if (kind === "none") return null;
    return this.redis.get(key);
  }

  /** The queue's keys, the topic's, and those of every group the call names. */
  private async snapshot(step: Step): Promise<string> {
    const named = [...(step.topic ?? []), ...(step.group === undefined ? [] : [step.group])];
    const roles = [
      ...ROLES,
      ...TOPIC_ROLES.map((role) => `topic:${role}`),
      ...named.flatMap((group) => KEY_ROLES.map((role) => `group:${group}:${role}`)),
      ...(step.marker === undefined ? [] : [`marker:${step.marker}`]),
    ];
    const state: unknown[] = [];
    for (const role of roles) state.push(await this.read(role));
    return JSON.stringify(state);
  }

  match(want: unknown, got: unknown, where: string): void {
    if (Array.isArray(want)) {
      if (!Array.isArray(got) || got.length !== want.length) {
        throw new Mismatch(`${where}: want ${JSON.stringify(want)}, got ${JSON.stringify(got)}`);
      }
      want.forEach((item, i) => this.match(item, got[i], `${where}[${i}]`));
    } else if (want !== null && typeof want === "object") {
      this.matchSpecial(want as Record<string, unknown>, got, where);
    } else {
      const expected = typeof want === "string" ? this.subst(want) : want;
      if (got !== expected) throw new Mismatch(`${where}: want ${JSON.stringify(expected)}, got ${JSON.stringify(got)}`);
    }
  }

  private matchSpecial(want: Record<string, unknown>, got: unknown, where: string): void {
    if ("capture" in want || "match" in want) {
      if ("match" in want) {
        const found = typeof got === "string" ? new RegExp(this.subst(String(want["match"]))).exec(got) : null;
        if (found === null) throw new Mismatch(`${where}: ${JSON.stringify(got)} does not match ${String(want["match"])}`);
        if ("capture" in want) this.vars.set(String(want["capture"]), found.length > 1 ? (found[1] ?? "") : String(got));
      } else {
        this.vars.set(String(want["capture"]), String(got));
      }
    } else if ("any" in want) {
      // anything
    } else if ("range" in want || "time" in want) {
      const [low, high] = (want["range"] ?? want["time"]) as [number, number];
      const base = "time" in want ? this.sentMs : 0;
      if (typeof got !== "number" || !Number.isInteger(got) || got - base < low || got - base > high) {
        throw new Mismatch(`${where}: ${JSON.stringify(got)} not within ${JSON.stringify(want)} (sent at ${this.sentMs})`);
      }
    } else if ("pairs" in want) {
      if (!Array.isArray(got)) throw new Mismatch(`${where}: want pairs, got ${JSON.stringify(got)}`);
      const found = new Map<unknown, unknown>();
      for (let i = 0; i + 1 < got.length; i += 2) found.set(got[i], got[i + 1]);
      for (const [name, value] of Object.entries(want["pairs"] as Record<string, unknown>)) {
        if (!found.has(name)) throw new Mismatch(`${where}: no ${name} in ${JSON.stringify(got)}`);
        this.match(value, found.get(name), `${where}.${name}`);
      }
    } else if ("fields" in want) {
      if (got === null || typeof got !== "object" || Array.isArray(got)) {
        throw new Mismatch(`${where}: want a hash, got ${JSON.stringify(got)}`);
      }
      const hash = got as Record<string, string>;
      for (const [name, value] of Object.entries(want["fields"] as Record<string, unknown>)) {
        const field = this.subst(name);
        this.match(value, hash[field] ?? null, `${where}.${field}`);
      }
    } else if ("len" in want) {
      if (!Array.isArray(got) || got.length !== want["len"]) {
        throw new Mismatch(`${where}: want ${String(want["len"])} items, got ${JSON.stringify(got)}`);
      }
    } else {
      throw new Mismatch(`${where}: unknown matcher ${JSON.stringify(want)}`);
    }
  }

  async step(step: Step, where: string): Promise<void> {
    if ("sleep_ms" in step) {
      await sleep(Number(step["sleep_ms"]));
    } else if ("plant" in step) {
      for (const [role, value] of Object.entries(step["plant"] as Record<string, string>)) {
        await this.redis.set(this.key(role), value);
      }
    } else if ("plant_fields" in step) {
      for (const [role, fields] of Object.entries(step["plant_fields"] as Record<string, Record<string, string>>)) {
        await this.redis.hset(this.key(role), fields);
      }
    } else if ("state" in step) {
      for (const [role, want] of Object.entries(step["state"] as Record<string, unknown>)) {
        this.match(want, await this.read(role), `${where} state ${role}`);
      }
    } else if ("error" in step) {
      const before = await this.snapshot(step);
      let reply: Value;
      try {
        reply = await this.call(step);
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        const code = message.replace(/^ERR /, "").split(" ", 1)[0];
        if (code !== step["error"]) throw new Mismatch(`${where}: want ${String(step["error"])}, got ${message}`);
        if ((await this.snapshot(step)) !== before) throw new Mismatch(`${where}: the failed call wrote something`);
        return;
      }
      throw new Mismatch(`${where}: want ${String(step["error"])}, got the reply ${JSON.stringify(reply)}`);
    } else {
      this.match(step["reply"] ?? null, await this.call(step), `${where} reply`);
    }
  }
}

test("the scenario files are there", () => {
  assert.ok(FILES.length >= 11, FILES.join(", "));
});

// (and on Redis 6.2 and 8.2, the oldest and the newest Redis: the module by EVALSHA on 6.2)
for (const kind of [...KINDS, "redis6" as const, "redis8" as const]) {
  describe(`conformance on ${kind}`, () => {
    let redis: Redis;
    serveTests(kind, (client) => (redis = client));
    for (const file of FILES) {
      const data = JSON.parse(readFileSync(join(HERE, file), "utf8")) as ScenarioFile;
      describe(file, () => {
        for (const scenario of data.scenarios) {
          test(scenario.name, async () => {
            const name = `conf-${randomBytes(6).toString("hex")}`;
            const runner = new Runner(redis, queueKeys(name), topicKeys(name));
            for (const [i, step] of scenario.steps.entries()) {
              await runner.step(step, `${file} / ${scenario.name} / step ${i + 1}`);
            }
          });
        }
      });
    }
  });
}
