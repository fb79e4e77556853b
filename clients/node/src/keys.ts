/**
 * Queue and topic key names: the only place this package builds them, exactly as
 * rotator/keys.py does. Every key of a queue shares the hash tag {name}, so one script call
 * can touch them all on Redis Cluster. The order of KEY_ROLES is the KEYS order documented
 * at the top of lua/rotator.lua.
 */
import { InvalidQueueName } from "./errors";

export const DEFAULT_PREFIX = "rotator";

/** The thirteen queue keys' roles, in KEYS order. */
export const KEY_ROLES = [
  "ring", "done", "done_old", "marks", "marks_old", "revoked", "dead", "wake", "meta",
  "pushlog", "leases", "scheduled", "ids",
] as const;
export type KeyRole = (typeof KEY_ROLES)[number];

/** A topic's own four keys, in TOPIC KEYS order. */
export const TOPIC_ROLES = ["meta", "groups", "log", "bodies"] as const;

const NAME = /^[A-Za-z0-9._:@/-]{1,128}$/;
export const MAX_GROUP_BYTES = 64;
const GROUP = new RegExp(`^[A-Za-z0-9._@/-]{1,${MAX_GROUP_BYTES}}$`);

export interface QueueKeys {
  readonly name: string;
  /** The thirteen queue keys, KEYS[1..13]. */
  readonly all: readonly string[];
  /** KEYS[14]: the queue's payloads (a topic group: the topic's bodies). */
  readonly payloads: string;
  /** KEYS[15]: per-item stats ("" where there are none). */
  readonly items: string;
}

export function validateQueueName(name: unknown, what = "queue name"): string {
  if (typeof name !== "string" || !NAME.test(name)) {
    throw new InvalidQueueName(
      `${what} must be 1..128 of A-Z a-z 0-9 . _ : @ / -, got ${JSON.stringify(name)}`,
    );
  }
  return name;
}

export function validateGroupName(group: unknown): string {
  if (typeof group !== "string" || !GROUP.test(group)) {
    throw new InvalidQueueName(
      `group name must be 1..${MAX_GROUP_BYTES} of A-Z a-z 0-9 . _ @ / -, got ${JSON.stringify(group)}`,
    );
  }
  return group;
}

function roles(base: string): string[] {
  return KEY_ROLES.map((role) => `${base}:${role}`);
}

/** "<prefix>:{<name>}:<role>" for the thirteen roles, then payloads and items. */
export function queueKeys(name: string, prefix: string = DEFAULT_PREFIX): QueueKeys {
  validateQueueName(name);
  validateQueueName(prefix, "key prefix");
  const base = `${prefix}:{${name}}`;
  return { name, all: roles(base), payloads: `${base}:payloads`, items: `${base}:items` };
}

/** The marker hash of push call `run` (push_chunk's KEYS[14]), as rotator/keys.py names it:
 * a key under the queue's base, so in its slot. */
export function pushMarker(keys: QueueKeys, run: string): string {
  const ring = keys.all[0] as string;
  return `${ring.slice(0, ring.lastIndexOf(":"))}:push:${run}`;
}

/** The marker hash of publish call `run` (tpublish_chunk's last key), as rotator/keys.py
 * names it: a key under "<prefix>:{<topic>}:publish:", so in the topic's slot. */
export function publishMarker(topic: TopicKeys, run: string): string {
  return `${topic.prefix}:{${topic.name}}:publish:${run}`;
}

/** The role's key among a queue's thirteen. */
export function keyOf(keys: QueueKeys, role: KeyRole): string {
  return keys.all[KEY_ROLES.indexOf(role)] as string;
}

export interface TopicKeys {
  readonly name: string;
  readonly prefix: string;
  /** meta, groups, log, bodies: the TOPIC KEYS. */
  readonly all: readonly string[];
}

export function topicKeys(name: string, prefix: string = DEFAULT_PREFIX): TopicKeys {
  validateQueueName(name, "topic name");
  validateQueueName(prefix, "key prefix");
  return { name, prefix, all: TOPIC_ROLES.map((role) => `${prefix}:{${name}}:topic:${role}`) };
}

/** Group GROUP's thirteen queue keys "<prefix>:{<topic>}:group:<GROUP>:<role>"; its
 * payloads are the topic's bodies. */
export function groupKeys(topic: TopicKeys, group: string): QueueKeys {
  validateGroupName(group);
  const base = `${topic.prefix}:{${topic.name}}:group:${group}`;
  return { name: `${topic.name}.${group}`, all: roles(base), payloads: topic.all[3] as string, items: "" };
}
