"""The core invariant under real contention: never more holders than the limit.

32 separate processes (``subprocess``, so nothing is shared but the Redis server)
hammer one semaphore of limit 5 with 2,048 blocking acquire/release cycles in total,
with random 0-3 ms holds. Two independent observers check the invariant:

- the client side: every process records its hold intervals on the machine-wide
  monotonic clock (see ``contention_worker.py``); the maximum overlap of all
  intervals must be exactly 5 (at most the limit, and the limit was reached, so the
  run really was contended; and at least the 27 losers of the first burst queued);
- the server side: a thread samples ``status()`` and the raw ``ZCARD`` of the holders
  key throughout the run; neither may ever exceed 5.

How the load is shaped: every release wakes *every* blocked waiter (one pub/sub
message on the wake channel) and each of them runs the acquire script again, so a
cycle costs about one script call per waiting process. With no pause between cycles
all 27 losers wait all the time: ~28 script calls per cycle, ~25 s of CPU for the
run, and on a busy machine it feeds on itself (the herd slows the holders down, which
makes the line longer). So each process pauses after a release, for a random time
whose mean doubles after each acquire that had to wait and shrinks by 5 % after each
that did not (at most MAX_THINK): the line stays a few processes long on any machine.
And every 16 cycles all processes meet at a barrier and contend at the same instant
(see contention_worker.py): 4 bursts in which 27 processes queue behind 5
overlapping holders. Starting 32 Python processes that each import Celery costs
another ~16 s of CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from celery_semaphore import Semaphore
from devkit.redis_servers import RedisServer

PROCESSES = 32
LIMIT = 5
CYCLES = 64  # per process: 2,048 acquire/release cycles in total
MAX_THINK = 0.25  # seconds: the longest mean pause between a release and the next acquire
WORKER = Path(__file__).with_name("contention_worker.py")


def max_overlap(intervals: list[tuple[int, int]]) -> int:
    """How many intervals are open at once, at most (an end sorts before a start at a tie)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = open_now = 0
    for _, delta in events:
        open_now += delta
        most = max(most, open_now)
    return most


def test_max_overlap_helper() -> None:
    assert max_overlap([(0, 10), (5, 15), (10, 20)]) == 2
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == 1
    assert max_overlap([(0, 9), (1, 8), (2, 7), (3, 6)]) == 4
    assert max_overlap([]) == 0


class Sampler(threading.Thread):
    """Reads the semaphore from the server's side as often as it can until stopped."""

    def __init__(self, server: RedisServer, name: str) -> None:
        super().__init__(daemon=True)
        self.sem = Semaphore(server.url, name, LIMIT)
        self.stopping = threading.Event()
        self.samples = 0
        self.most_live = 0
        self.most_zcard = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                status = self.sem.status()
                zcard = self.sem.client.zcard(self.sem.keys.holders)
                self.samples += 1
                self.most_live = max(self.most_live, status.holder_count, len(status.holders))
                self.most_zcard = max(self.most_zcard, zcard)
                time.sleep(0.005)
        except BaseException as exc:
            self.error = exc
        finally:
            self.sem.close()


@pytest.mark.slow
def test_never_more_holders_than_the_limit_across_32_processes(
    redis_server: RedisServer,
) -> None:
    name = f"contention-{uuid.uuid4().hex}"
    sampler = Sampler(redis_server, name)
    sampler.start()
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                redis_server.url,
                name,
                str(LIMIT),
                str(CYCLES),
                str(seed),
                str(PROCESSES),
                f"test:{name}:barrier",
                str(MAX_THINK),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for seed in range(PROCESSES)
    ]
    outputs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=240)
            assert proc.returncode == 0, stderr.decode()
            outputs.append(json.loads(stdout))
        elapsed = time.monotonic() - started
    finally:
        sampler.stopping.set()
        sampler.join(10)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

    errors = [out["error"] for out in outputs if out["error"]]
    assert not errors, errors
    intervals = [tuple(pair) for out in outputs for pair in out["intervals"]]
    assert len(intervals) == PROCESSES * CYCLES
    # The invariant, from the clients' side: at most LIMIT holds at once, and LIMIT was
    # reached (otherwise the test proved nothing).
    assert max_overlap(intervals) == LIMIT, f"{len(intervals)} cycles in {elapsed:.1f}s"
    # Real queueing happened: at least the losers of the first burst had to wait.
    assert sum(out["waited"] for out in outputs) >= PROCESSES - LIMIT
    # Fencing tokens: unique across all processes, increasing within each process.
    tokens = [token for out in outputs for token in out["tokens"]]
    assert len(set(tokens)) == len(tokens)
    for out in outputs:
        assert out["tokens"] == sorted(out["tokens"])
    # The invariant, from the server's side, sampled throughout the run.
    assert sampler.error is None, repr(sampler.error)
    assert sampler.samples > 10
    assert sampler.most_live <= LIMIT
    assert sampler.most_zcard <= LIMIT
    assert sampler.most_zcard > 0
