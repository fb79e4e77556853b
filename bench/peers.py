"""Other Redis queues, each through its own worker with a no-op task.

Each runs in subprocesses so its globals (dramatiq's broker, rq's workers) stay out of ours.
Enqueueing is not timed; the clock covers the workers draining the queue.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import redis

from bench.harness import Result

BULLMQ_DIR = Path(__file__).resolve().parent / "bullmq"

_DRAMATIQ = """
import sys, time, dramatiq
from dramatiq.brokers.redis import RedisBroker
url, total, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
broker = RedisBroker(url=url)
dramatiq.set_broker(broker)

@dramatiq.actor(queue_name="bench", max_retries=0)
def noop():
    pass

for _ in range(total):
    noop.send()
worker = dramatiq.Worker(broker, worker_threads=threads)
began = time.perf_counter()
worker.start()
broker.join("bench")
worker.join()
print(time.perf_counter() - began)
worker.stop()
"""

_RQ_ENQUEUE = """
import sys, redis
from rq import Queue
from bench.peer_tasks import noop
q = Queue("bench", connection=redis.Redis.from_url(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    q.enqueue(noop, result_ttl=0)
"""

_RQ_WORK = """
import sys, redis
from rq import Queue, SimpleWorker
connection = redis.Redis.from_url(sys.argv[1])
SimpleWorker([Queue("bench", connection=connection)], connection=connection).work(burst=True)
"""


def _python(code: str, *args: str) -> str:
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=root, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def dramatiq_peer(url: str, jobs: int) -> Result:
    seconds = float(_python(_DRAMATIQ, url, str(jobs), "4").splitlines()[-1])
    return Result("dramatiq", 1, 1, jobs, seconds, extra={"workers": "1 process x 4 threads"})


def rq_peer(url: str, jobs: int, workers: int = 4) -> Result:
    _python(_RQ_ENQUEUE, url, str(jobs))
    root = Path(__file__).resolve().parent.parent
    began = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RQ_WORK, url],
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    for proc in procs:
        proc.wait()
    seconds = time.perf_counter() - began
    left = redis.Redis.from_url(url).llen("rq:queue:bench")
    return Result("rq", 1, workers, jobs - int(left), seconds, extra={"worker": "SimpleWorker"})


def ensure_bullmq() -> bool:
    if not shutil.which("node") or not shutil.which("npm"):
        return False
    if not (BULLMQ_DIR / "node_modules" / "bullmq").is_dir():
        subprocess.run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund"],
            cwd=BULLMQ_DIR,
            check=True,
            capture_output=True,
        )
    return True


def bullmq_peer(port: int, jobs: int, concurrency: int) -> Result:
    done = subprocess.run(
        ["node", "bench.js", str(port), str(jobs), str(concurrency)],
        cwd=BULLMQ_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return Result(
        "bullmq", 1, 1, int(data["jobs"]), float(data["seconds"]),
        extra={"concurrency": concurrency},
    )  # fmt: skip
