"""Defaults and limits, in one place. The CLI, worker and Spark code import these."""

from __future__ import annotations

# Seconds a consumer holds a job before others may take it back.
DEFAULT_LEASE_TIMEOUT = 30.0
# Elements one `next` call may visit; bounds the time a single script runs.
DEFAULT_BUDGET = 1000
# Ids sent per `push` call; each call is all-or-nothing.
DEFAULT_PUSH_CHUNK = 1000
# Seconds an idle worker waits for work per `next` call before checking for a stop.
DEFAULT_POLL = 1.0
# Key prefix before the {queue} hash tag.
DEFAULT_PREFIX = "rotator"

# Limits enforced by the Lua module; checked here first so bad calls never reach the server.
MAX_ID_BYTES = 1024
MAX_BATCH = 5000
MAX_COUNT = 1000
MAX_BUDGET = 10_000
MAX_LEASE_SECONDS = 86_400.0
MAX_DELIVERIES_LIMIT = 1_000_000

# Retry backoff for failed handlers: base * 2**(deliveries - 1), capped.
RETRY_BACKOFF_BASE = 1.0
RETRY_BACKOFF_CAP = 300.0
