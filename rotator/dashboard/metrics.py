"""Prometheus metrics for every queue and topic on a server, read at scrape time.

:class:`QueueCollector` is a prometheus_client collector: each scrape finds the queues and
topics (SCAN, never KEYS: :func:`rotator.discovery.find`) and reads each one's ``stats`` (one
O(1) call per queue), so the numbers are the server's at that moment, with nothing cached and
no loop running between scrapes. The dashboard serves it at ``/metrics``; any process can
serve it too::

    from prometheus_client import REGISTRY, start_http_server
    REGISTRY.register(QueueCollector(redis.Redis.from_url("redis://localhost:6379/0")))
    start_http_server(9120)

On Redis Cluster, give it a ``redis.cluster.RedisCluster`` (or a function that makes one: a
cluster client connects when it is made, so the collector makes it at the first scrape): the
queues of every primary are found, each read on its own node.

Every queue metric has a ``queue`` label. The ``rotator_jobs_*_total`` counters are the
module's own (kept in the call that does each thing, so they never disagree with the queue);
a queue whose module does not report one is left out of that metric rather than shown as 0.
``rotator_job_duration_seconds`` appears once the module keeps processing times (see
:func:`rotator.dashboard.snapshot.durations_of`).

A sharded queue (:mod:`rotator.sharded`) is one ``queue`` in every metric above, under its
logical name, its shards' counts added up (``ShardedRotator.stats()``); its shard queues are
not listed on their own, so a sum over ``queue`` counts each job once. It also has
``rotator_queue_shards`` (its shard count) and the ``rotator_shard_*`` gauges, labelled
``queue`` and ``shard`` (the index): each shard's own counts, in metrics of their own so that
no sum mixes them with the totals.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, cast

import redis
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from redis.cluster import RedisCluster

from rotator.core import Rotator
from rotator.dashboard.snapshot import UNREACHABLE, backlog, durations_of
from rotator.defaults import DEFAULT_PREFIX
from rotator.discovery import find
from rotator.errors import RotatorError
from rotator.models import Stats, TopicStats
from rotator.sharded import ShardedRotator
from rotator.topic import Topic

# (metric, Stats field, help) of the gauges each queue has.
QUEUE_GAUGES = (
    ("rotator_queue_pending", "pending", "Jobs pushed and never leased."),
    ("rotator_queue_in_flight", "in_flight", "Jobs leased, their lease not run out."),
    ("rotator_queue_deferred", "deferred", "Jobs given back (nacked), waiting for their delay."),
    ("rotator_queue_overdue", "overdue", "Leases run out, not yet reclaimed (a lower bound)."),
    ("rotator_queue_scheduled", "scheduled", "Jobs pushed for later, not yet queued."),
    ("rotator_queue_dead", "dead", "Dead letters."),
)
# (metric without _total, Stats field, help) of the module's counters.
QUEUE_COUNTERS = (
    ("rotator_jobs_pushed", "pushed", "Job ids pushed since the queue was made."),
    ("rotator_jobs_delivered", "delivered", "Deliveries (leases), first ones and later ones."),
    ("rotator_jobs_completed", "completed", "Jobs acked."),
    ("rotator_jobs_retried", "retried", "Jobs given back (nacked)."),
    ("rotator_jobs_reclaimed", "reclaimed", "Expired leases leased again."),
    ("rotator_jobs_dead", "dead_lettered", "Dead letters written."),
    ("rotator_jobs_cancelled", "cancelled", "Jobs cancelled (a queue that tracks ids)."),
)
DURATION_METRIC = "rotator_job_duration_seconds"
# (metric, Stats field, help) of the gauges each shard of a sharded queue has.
SHARD_GAUGES = (
    ("rotator_shard_pending", "pending", "A shard's jobs pushed and never leased."),
    ("rotator_shard_in_flight", "in_flight", "A shard's jobs leased, their lease not run out."),
    ("rotator_shard_deferred", "deferred", "A shard's jobs given back, waiting for their delay."),
    ("rotator_shard_dead", "dead", "A shard's dead letters."),
)
# Sharded queues whose readers a collector keeps between scrapes (each checks the stored
# layout at its first read only); beyond this many it starts again.
SHARDED_CACHE_LIMIT = 1024


Client = redis.Redis | RedisCluster


class Scrape(NamedTuple):
    """What one scrape read: each queue's stats (a sharded queue's added up, under its
    logical name), each topic's, and each sharded queue's shards' stats, shard 0 first."""

    queues: dict[str, Stats]
    topics: dict[str, TopicStats]
    shards: dict[str, list[Stats]]


class QueueCollector(Collector):
    """Every queue's and topic's metrics on the server of ``client`` (a ``redis.Redis``) or
    on every primary of a cluster (a ``redis.cluster.RedisCluster``), read when collected.
    ``client`` may be a function that makes the client, called at the first scrape that
    needs it (and again after one that failed)."""

    def __init__(
        self, client: Client | Callable[[], Client], *, prefix: str = DEFAULT_PREFIX
    ) -> None:
        self._connect = client if callable(client) else None
        self._client: Client | None = None if callable(client) else client
        self._lock = threading.Lock()  # scrapes may run in threads at once
        self.prefix = prefix
        self._sharded: dict[tuple[str, int], ShardedRotator] = {}

    @property
    def client(self) -> Client:
        """The client, made now if it was given as a function."""
        with self._lock:
            if self._client is None:
                assert self._connect is not None
                self._client = self._connect()
            return self._client

    def describe(self) -> Iterable[Metric]:
        # Registering must not read the server: the names are known only at scrape time.
        return []

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("rotator_up", "1 when the last scrape read the server, else 0.")
        try:
            scrape = self.read()
        except UNREACHABLE:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from queue_metrics(scrape.queues)
        yield from shard_metrics(scrape.shards)
        yield from topic_metrics(scrape.topics)

    def sharded(self, client: Client, name: str, shards: int) -> ShardedRotator:
        """The reader of a sharded queue, kept between scrapes; no retries (the next scrape
        reads again)."""
        key = (name, shards)
        found = self._sharded.get(key)
        if found is None or found.client is not client:
            cluster = cast("RedisCluster", client)  # a ShardedRotator reads any client
            found = ShardedRotator(cluster, name, shards=shards, prefix=self.prefix, retry_for=0)
            if len(self._sharded) >= SHARDED_CACHE_LIMIT:
                self._sharded.clear()
            self._sharded[key] = found
        return found

    def read(self) -> Scrape:
        """Each queue's, sharded queue's and topic's stats now (one whose keys are broken,
        or whose stored shard count changed since discovery, is left out)."""
        client = self.client
        found = find(client, prefix=self.prefix)
        queues: dict[str, Stats] = {}
        for name in found.queues:
            try:
                queues[name] = Rotator(client, name, prefix=self.prefix).stats()
            except RotatorError:
                continue
        shards: dict[str, list[Stats]] = {}
        for sharded in found.sharded:
            q = self.sharded(client, sharded.name, sharded.shards)
            try:
                summed, parts = q.stats(), q.shard_stats()
            except RotatorError:
                continue
            queues[sharded.name] = summed  # the name of a sharded queue names it
            shards[sharded.name] = parts
        topics: dict[str, TopicStats] = {}
        for name in found.topics:
            try:
                topics[name] = Topic(client, name, prefix=self.prefix).stats()
            except RotatorError:
                continue
        return Scrape(queues, topics, shards)


def queue_metrics(queues: dict[str, Stats]) -> Iterator[Metric]:
    """The queue metrics of these stats (what QueueCollector yields for its queues)."""
    for metric, field, text in QUEUE_GAUGES:
        gauge = GaugeMetricFamily(metric, text, labels=["queue"])
        for name, stats in queues.items():
            gauge.add_metric([name], getattr(stats, field))
        yield gauge
    age = GaugeMetricFamily(
        "rotator_queue_oldest_pending_age_seconds",
        "Seconds since the oldest pending job was pushed; 0 when nothing is pending.",
        labels=["queue"],
    )
    paused = GaugeMetricFamily(
        "rotator_queue_paused", "1 while the queue hands out nothing.", labels=["queue"]
    )
    for name, stats in queues.items():
        age.add_metric([name], stats.oldest_pending_age or 0.0)
        paused.add_metric([name], int(stats.paused))
    yield age
    yield paused
    for metric, field, text in QUEUE_COUNTERS:
        counter = CounterMetricFamily(metric, text, labels=["queue"])
        for name, stats in queues.items():
            value = getattr(stats, field, None)
            if value is not None:
                counter.add_metric([name], value)
        if counter.samples:
            yield counter
    histogram = HistogramMetricFamily(
        DURATION_METRIC, "Processing time of the jobs acked, in seconds.", labels=["queue"]
    )
    for name, stats in queues.items():
        durations = durations_of(stats)
        if durations is not None:
            histogram.add_metric(
                [name],
                [(bucket_bound(bound), count) for bound, count in durations.buckets],
                sum_value=durations.total,
            )
    if histogram.samples:
        yield histogram


def shard_metrics(shards: dict[str, list[Stats]]) -> Iterator[Metric]:
    """The shard count and each shard's gauges of the sharded queues (in metrics of their
    own: a sum over the rotator_queue_* metrics never counts a shard twice)."""
    if not shards:
        return
    count = GaugeMetricFamily(
        "rotator_queue_shards", "Shards of a sharded queue (rotator.sharded).", labels=["queue"]
    )
    for name, parts in shards.items():
        count.add_metric([name], len(parts))
    yield count
    for metric, field, text in SHARD_GAUGES:
        gauge = GaugeMetricFamily(metric, text, labels=["queue", "shard"])
        for name, parts in shards.items():
            for k, stats in enumerate(parts):
                gauge.add_metric([name, str(k)], getattr(stats, field))
        yield gauge


def bucket_bound(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def topic_metrics(topics: dict[str, TopicStats]) -> Iterator[Metric]:
    retained = GaugeMetricFamily(
        "rotator_topic_retained_messages", "Messages the topic keeps.", labels=["topic"]
    )
    size = GaugeMetricFamily(
        "rotator_topic_retained_bytes", "Payload bytes the topic keeps.", labels=["topic"]
    )
    groups: dict[str, tuple[str, Any]] = {
        "rotator_topic_group_backlog": ("backlog", "Messages waiting for the group."),
        "rotator_topic_group_in_flight": ("in_flight", "Messages the group has leased."),
        "rotator_topic_group_dead": ("dead", "The group's dead letters."),
    }
    families = {
        metric: GaugeMetricFamily(metric, text, labels=["topic", "group"])
        for metric, (_, text) in groups.items()
    }
    for name, stats in topics.items():
        retained.add_metric([name], stats.retained)
        size.add_metric([name], stats.bytes)
        for group, group_stats in stats.groups.items():
            for metric, (field, _) in groups.items():
                value = backlog(group_stats) if field == "backlog" else getattr(group_stats, field)
                families[metric].add_metric([name, group], value)
    yield retained
    yield size
    yield from families.values()
