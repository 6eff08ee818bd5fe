"""One contender process of tests/test_contention.py (run as a script, not collected).

Usage: python contention_worker.py URL NAME LIMIT CYCLES SEED PROCESSES KEY MAX_THINK

Runs CYCLES of: blocking acquire(), hold for a random 0-3 ms, release(), pause for a
random time (its mean doubles after an acquire that had to wait, up to MAX_THINK s,
and shrinks by 5 % after one that did not, so the line stays short). Every
BURST_EVERY cycles (and before the first) all PROCESSES processes meet at a barrier
in Redis and then contend at the same instant, holding 20-30 ms that time: the first
LIMIT holds overlap and everybody else queues, on however fast or slow a machine.
Prints one JSON object on stdout: the hold intervals, the fencing tokens, how many
acquires had to wait, and any error.

Intervals are measured with ``time.monotonic_ns()``: on Linux (and macOS) that is
CLOCK_MONOTONIC, one clock shared by every process of the machine, so the parent can
compare the intervals of all processes. Each interval is taken *inside* the real
holding period (after acquire() returned, before release() is sent), so an overlap
of recorded intervals implies an overlap of real holds: the check has no false alarms.
"""

from __future__ import annotations

import json
import random
import sys
import time

import redis

from celery_semaphore import Semaphore

BURST_EVERY = 16


def barrier(control: redis.Redis, key: str, processes: int) -> None:
    """Wait until all processes arrived at ``key``; the last one lets everybody go."""
    if control.incr(f"{key}:arrived") == processes:
        control.rpush(f"{key}:go", *range(processes))
    deadline = time.monotonic() + 120
    # Short BLPOPs: redis-py's default socket timeout (5 s) would cut a longer one.
    while control.blpop([f"{key}:go"], timeout=1) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"barrier {key} not passed within 120 s")


def main() -> None:
    url, name, limit, cycles, seed, processes, key, max_think = sys.argv[1:9]
    rng = random.Random(int(seed))
    intervals: list[tuple[int, int]] = []
    tokens: list[int] = []
    waited = 0
    think = 0.01
    error = None
    control = redis.Redis.from_url(url)
    sem = Semaphore(url, name, int(limit), lease_timeout=30.0, recheck_interval=0.5)
    try:
        for cycle in range(int(cycles)):
            burst = cycle % BURST_EVERY == 0
            if burst:
                barrier(control, f"{key}:{cycle}", int(processes))
            permit = sem.acquire(timeout=45)
            start = time.monotonic_ns()
            time.sleep(rng.uniform(0.02, 0.03) if burst else rng.uniform(0, 0.003))
            end = time.monotonic_ns()
            if not permit.release():
                raise RuntimeError(f"release of {permit!r} returned False")
            intervals.append((start, end))
            tokens.append(permit.fencing_token)
            if permit.waited > 0:
                waited += 1
                if not burst:
                    think = min(2 * think, float(max_think))
            else:
                think *= 0.95
            time.sleep(rng.uniform(0, 2 * think))
    except Exception as exc:  # reported to the parent, which fails the test
        error = f"{type(exc).__name__}: {exc}"
    finally:
        sem.close()
        control.close()
    json.dump(
        {"intervals": intervals, "tokens": tokens, "waited": waited, "error": error}, sys.stdout
    )


if __name__ == "__main__":
    main()
