"""Many processes polling one semaphore, as most people write it: try, hold briefly
if granted, else sleep a moment and try again. celery-semaphore's ``try_acquire()``
(anonymous, and with a holder id that keeps the poller's place) and its blocking
``acquire()``, side by side with py-redis-semaphore 0.2.0 and Dramatiq's
``ConcurrentRateLimiter`` in the same run, on a throwaway ``redis-server``.

    .venv/bin/python benchmarks/bench_polling.py           # 24 processes x 4 s per system
    .venv/bin/python benchmarks/bench_polling.py --quick   # smoke run
    .venv/bin/python benchmarks/bench_polling.py --json

Figures: grants in the window; utilisation (time permits were held / limit x
window: 1.0 means never a permit idle); the fewest and most grants of one
process, and Jain's fairness index over the processes (1.0: all got as many).
Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from devkit.redis_servers import RedisServer

SYSTEMS = ("ours-anonymous", "ours-holder-id", "ours-acquire", "py-redis-semaphore", "dramatiq")


@dataclass(frozen=True)
class Settings:
    processes: int = 24
    seconds: float = 4.0
    limit: int = 5
    hold: float = 0.005
    poll: float = 0.002


def poller(system: str, url: str, name: str, index: int, settings: Settings) -> Callable[[], Any]:
    """A function that tries once: returns a release function if granted, else None
    (``ours-acquire`` waits up to the end of the window instead)."""
    client = redis.Redis.from_url(url)
    if system.startswith("ours"):
        from celery_semaphore import Semaphore

        sem = Semaphore(client, name, settings.limit)
        if system == "ours-acquire":
            return lambda: _acquired(sem, f"w{index}")
        holder = f"p{index}" if system == "ours-holder-id" else None
        return lambda: _release_of(sem.try_acquire(holder))
    if system == "py-redis-semaphore":
        from redis_semaphore import Semaphore as PrsSemaphore
        from redis_semaphore import SemaphoreConfig

        logging.getLogger("redis_semaphore").setLevel(logging.ERROR)
        prs = PrsSemaphore(client, SemaphoreConfig(name=name, limit=settings.limit))

        def prs_try() -> Any:
            return prs.release if prs.acquire(blocking=False).success else None

        return prs_try
    from dramatiq.rate_limits import ConcurrentRateLimiter
    from dramatiq.rate_limits.backends import RedisBackend

    limiter = ConcurrentRateLimiter(RedisBackend(client=client), name, limit=settings.limit)

    def dramatiq_try() -> Any:
        context = limiter.acquire(raise_on_failure=False)
        if context.__enter__():
            return lambda: context.__exit__(None, None, None)
        context.__exit__(None, None, None)
        return None

    return dramatiq_try


def _release_of(permit: Any) -> Any:
    return permit.release if permit is not None else None


def _acquired(sem: Any, holder: str) -> Any:
    """A blocking acquire (woken on release, no polling), given up after 1 s."""
    from celery_semaphore import SemaphoreTimeout

    try:
        return sem.acquire(timeout=1.0, holder=holder).release
    except SemaphoreTimeout:
        return None


@dataclass(frozen=True)
class Job:
    """What one polling process does: which system, where, and from when."""

    system: str
    url: str
    name: str
    index: int
    settings: Settings
    start: float


def run_one(job: Job, out: Any) -> None:
    settings, start = job.settings, job.start
    attempt = poller(job.system, job.url, job.name, job.index, settings)
    grants, held = 0, 0.0
    time.sleep(max(0.0, start - time.time()))
    end = start + settings.seconds
    while time.time() < end:
        release = attempt()
        if release is None:
            time.sleep(settings.poll)
            continue
        began = time.time()
        time.sleep(settings.hold)
        release()
        held += min(time.time(), end) - min(began, end)
        grants += 1
    out.put((job.index, grants, held))


def measure(system: str, url: str, settings: Settings) -> dict[str, Any]:
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    start = time.time() + 1.0
    name = f"poll-{system}-{time.time_ns()}"
    workers = [
        context.Process(target=run_one, args=(Job(system, url, name, i, settings, start), out))
        for i in range(settings.processes)
    ]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=settings.seconds + 60) for _ in workers]
    for worker in workers:
        worker.join(10)
    counts = [grants for _, grants, _ in results]
    total = sum(counts)
    jain = total**2 / (len(counts) * sum(c * c for c in counts)) if total else 0.0
    return {
        "grants": total,
        "utilisation": sum(held for _, _, held in results) / (settings.limit * settings.seconds),
        "fewest": min(counts),
        "most": max(counts),
        "fairness": jain,
    }


def print_report(results: dict[str, Any]) -> None:
    s = results["settings"]
    print(
        f"{s['processes']} processes polling for {s['seconds']} s, limit {s['limit']}, "
        f"hold {s['hold'] * 1000:g} ms, poll every {s['poll'] * 1000:g} ms; "
        f"load average {results['load'][0]:.1f} before, {results['load'][1]:.1f} after"
    )
    columns = ("grants", 7), ("utilisation", 12), ("fewest", 7), ("most", 6), ("fairness", 9)
    print(f"{'system':<22}" + "".join(f" {title:>{width}}" for title, width in columns))
    for system in SYSTEMS:
        r = results["systems"][system]
        print(
            f"{system:<22} {r['grants']:>7} {r['utilisation']:>12.2f} {r['fewest']:>7} "
            f"{r['most']:>6} {r['fairness']:>9.2f}"
        )


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(143)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (4 processes, 0.5 s)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument("--processes", type=int)
    parser.add_argument("--seconds", type=float)
    args = parser.parse_args(argv)
    settings = Settings(processes=4, seconds=0.5) if args.quick else Settings()
    if args.processes:
        settings = Settings(**{**settings.__dict__, "processes": args.processes})
    if args.seconds:
        settings = Settings(**{**settings.__dict__, "seconds": args.seconds})
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    load_before = os.getloadavg()[0]
    with RedisServer(die_with_parent=True) as server:
        systems = {system: measure(system, server.url, settings) for system in SYSTEMS}
    results = {
        "settings": settings.__dict__,
        "load": [load_before, os.getloadavg()[0]],
        "systems": systems,
    }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
