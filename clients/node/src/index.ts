/** rotator-queue: a reliable job queue for Redis/Valkey, the rotator Lua module from Node. */
export * from "./errors";
export { DEFAULT_PREFIX, KEY_ROLES, TOPIC_ROLES, groupKeys, keyOf, publishMarker, pushMarker, queueKeys, topicKeys } from "./keys";
export type { QueueKeys, TopicKeys, KeyRole } from "./keys";
export { decodeNextPacked, encodeId, encodeToken, parseToken } from "./protocol";
export type { Job, JobRef, NextReply } from "./protocol";
export { DEFAULT_BUDGET, DEFAULT_LEASE_TIMEOUT, PUSH_MARKER_TTL_MS, Rotator, decodeStats } from "./rotator";
export type { Claim, JobId, NextOptions, PushOptions, RotatorOptions, Stats } from "./rotator";
export { MODULE_PATH, ModuleCaller, functionName, librarySource, moduleSha, moduleSource } from "./script";
export type { Client, Mode, Replies } from "./script";
export { decodeSchedules, formatG } from "./schedules";
export type { Schedule, ScheduleOptions } from "./schedules";
export { retryDelay } from "./worker";
export type { Handler, WorkOptions, WorkSummary } from "./worker";
export {
  DEFAULT_TOPIC_RETENTION,
  MAX_PUBLISH,
  Topic,
  TopicGroup,
  decodeTopicStats,
  messageSeq,
  retentionArgs,
} from "./topic";
export type { GroupStats, Retention, Start, TopicOptions, TopicStats } from "./topic";
