"""Defaults and limits, in one place. The CLI, worker and Spark code import these."""

from __future__ import annotations

# The name on PyPI ("rotator" there is an unrelated package); the import name is rotator.
DISTRIBUTION = "rotator-queue"

# Seconds a consumer holds a job before others may take it back.
DEFAULT_LEASE_TIMEOUT = 30.0
# Elements one `next` call may visit; bounds the time a single script runs.
DEFAULT_BUDGET = 1000
# Ids sent per `push` call; each call is all-or-nothing.
DEFAULT_PUSH_CHUNK = 1000
# Seconds an idle worker waits for work per `next` call before checking for a stop.
DEFAULT_POLL = 1.0
# The most jobs one worker claim takes, and about how many seconds of the handler's recent
# pace a claim takes: fast jobs are claimed many per round trip, slow ones one at a time so
# that workers elsewhere can take the rest.
DEFAULT_WORK_BATCH = 100
WORK_CLAIM_SECONDS = 0.1
# Key prefix before the {queue} hash tag.
DEFAULT_PREFIX = "rotator"
# Keyspace slots one SCAN call visits when finding the queues and topics on a server.
DEFAULT_SCAN_COUNT = 1000

# Messages a topic retains when no retention is given (payloads beyond it are dropped).
DEFAULT_TOPIC_RETENTION = 100_000
# Times a topic call that names every group is retried when a group registers meanwhile.
TOPIC_STALE_RETRIES = 50

# Limits enforced by the Lua module; checked here first so bad calls never reach the server.
MAX_ID_BYTES = 1024
MAX_STAMP_BYTES = 48  # of a stamp "<deadline>.<deliveries>.<seq>", a token after its "*"
MAX_BATCH = 5000
MAX_COUNT = 1000
MAX_BUDGET = 1000  # elements one next or sweep visits: under 10 ms of server time
MAX_TRIM_BUDGET = 2000  # messages one Topic.trim call drops (about 3 ms)
MAX_LEASE_SECONDS = 86_400.0
MAX_SCHEDULE_SECONDS = 3650 * 86_400.0  # how far ahead a job may be scheduled (push_later)
MAX_RATE_JOBS = 10**9  # a rate limit's jobs per period (its period: at most a day)
DURATION_BUCKETS = 26  # processing-time histogram: under 1 ms, doubling to 2^24 ms, beyond
MAX_DELIVERIES_LIMIT = 1_000_000
MAX_ERROR_BYTES = 4096  # the last error kept in a job's item stats or a buried job's letter
MAX_GROUPS = 100  # consumer groups per topic
MAX_GROUP_BYTES = 64  # of a group name
MAX_RETENTION_COUNT = 10**12  # messages a topic's retention may name
MAX_PUBLISH = 1000  # messages per atomic publish call

# Pauses before a worker claims again after a server condition that passes (a restart, a long
# AOF load, OOM, someone else's slow script): the first pause, doubling up to the cap.
CLAIM_RETRY_FIRST = 0.1
CLAIM_RETRY_CAP = 5.0

# Retry backoff for failed handlers: base * 2**(deliveries - 1), capped.
RETRY_BACKOFF_BASE = 1.0
RETRY_BACKOFF_CAP = 300.0
# Ids of retried jobs a worker remembers, so that a job failing again counts once in its
# summary's `retried` (beyond this many the memory is cleared: a count, not a ledger).
RETRIED_MEMORY = 100_000
# Deliveries before `rotator work` dead-letters a job (0 there: no limit): a command that
# always fails is tried 5 times over about 15 s (backoff 1, 2, 4, 8 s), not forever.
DEFAULT_WORK_MAX_DELIVERIES = 5

# Spark (rotator.spark and `rotator spark`).
# Ids per atomic push from a Spark partition: the unit a retried task skips once it is in.
DEFAULT_SPARK_PUSH_BATCH = 5000
# Jobs a drain task leases per call; a task that dies holds at most this many until its lease.
DEFAULT_DRAIN_BATCH = 100
# Deliveries before a drain dead-letters a job, so a handler that always fails cannot keep a
# drain from ending (failed jobs come back after 1 s, 2 s, ...).
DEFAULT_DRAIN_MAX_DELIVERIES = 3
# Seconds an idle drain task waits for work before it checks whether the queue is drained.
DEFAULT_DRAIN_POLL = 0.5
# Elements per LRANGE when a snapshot or a drain's results are read back.
SPARK_READ_PAGE = 1000
# Seconds the Spark bookkeeping keys (push markers, drain results) outlive an abandoned run.
SPARK_KEY_TTL = 86_400
# Where the CLI runs Spark without --master: every core of this machine.
DEFAULT_SPARK_MASTER = "local[*]"

# The longest a topic may keep messages: retention is data, not a lease.
MAX_RETENTION_SECONDS = 10 * 365 * 86_400.0
