"""Submitting a backlog: N tasks of a ``LimitedTask`` published with ``delay()`` in a
loop while its semaphore is full, in handover mode, so that every task but the first
few parks at publish; beside it, the same loop of a plain Celery task (the floor).

No worker runs: the figure is the publishing process's own time. The script starts
its own ``redis-server`` (broker and semaphore store, on a free loopback port; never
the shared one on 6379), fills the semaphore (L permits held with a long lease), and
times each kind in interleaved rounds, the semaphore's keys and the broker's queue
emptied before each round. It asserts nothing; the load average is printed with the
figures.

    .venv/bin/python benchmarks/bench_submit.py              # N=12,000, 3 rounds
    .venv/bin/python benchmarks/bench_submit.py --quick      # smoke run
    .venv/bin/python benchmarks/bench_submit.py --profile    # cProfile of one round each

Kinds: ``plain`` (a plain task's ``delay()``), ``limited`` (the ``LimitedTask``, one
script call per parked task: take a place and park), and ``two_calls`` (the same task
through the publish path before 0.x: take a place, then park, two script calls; kept
here to measure against).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # devkit/, beside the package
sys.path.insert(0, str(HERE))  # bench_app
from celery_semaphore import publish  # noqa: E402
from devkit.redis_servers import RedisServer  # noqa: E402
from devkit.reporting import package_version  # noqa: E402

KINDS = ("plain", "limited", "two_calls")
LIMIT = 4
HELD_LEASE = 3600.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bench_app(server: RedisServer) -> ModuleType:
    os.environ.update(
        BENCH_BROKER_URL=server.url_for(0),
        BENCH_RESULT_URL=server.url_for(1),
        BENCH_RECORD_URL=server.url_for(2),
        BENCH_LIMIT=str(LIMIT),
    )
    import bench_app

    return bench_app


def fill(bench: ModuleType, server: RedisServer) -> None:
    """Empty the broker and the semaphore, then hold every permit of ``bench.OURS``."""
    from celery_semaphore import Semaphore

    client = server.client(db=0)
    epoch = Semaphore(server.url_for(0), bench.OURS, LIMIT).keys.epoch
    stale = [key for key in client.keys("*") if key.decode() != epoch]  # not a data loss
    if stale:
        client.delete(*stale)
    client.close()
    semaphore = Semaphore(server.url_for(0), bench.OURS, LIMIT, lease_timeout=HELD_LEASE)
    for i in range(LIMIT):
        assert semaphore.try_acquire(f"held-{i}") is not None
    semaphore.close()


class NoLineParks:
    """For ``publish.parking_lines``: no line is known to park, so every publish takes
    its place, then parks in a second call (the publish path before the one call)."""

    def __contains__(self, semaphore: object) -> bool:
        return False

    def add(self, semaphore: object) -> None:
        pass

    def discard(self, semaphore: object) -> None:
        pass


def submit(bench: ModuleType, kind: str, n: int) -> float:
    """Seconds to ``delay()`` n tasks of ``kind``: ``plain`` a plain task with a result
    (as ``ours`` has), the others ``ours``."""
    task = bench.baseline if kind == "plain" else bench.ours
    lines = publish.parking_lines
    if kind == "two_calls":
        publish.parking_lines = NoLineParks()  # type: ignore[assignment]
    try:
        begin = time.perf_counter()
        for i in range(n):
            task.delay(i, 0.0)
        return time.perf_counter() - begin
    finally:
        publish.parking_lines = lines


def parked(server: RedisServer, bench: ModuleType) -> int:
    return int(server.client(db=0).hlen(f"celery_semaphore:{{{bench.OURS}}}:parked"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=12_000, help="tasks per round (12,000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="N=300, one round")
    parser.add_argument("--profile", action="store_true", help="cProfile one round of each kind")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    n, rounds = (300, 1) if args.quick else (args.n, args.rounds)
    kinds = args.kinds.split(",")
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    parked_counts: dict[str, int] = {}
    with RedisServer(die_with_parent=True) as server:
        log(f"private redis-server on 127.0.0.1:{server.port}")
        bench = bench_app(server)
        fill(bench, server)
        for kind in kinds:  # warm-up: connections, scripts, caches
            submit(bench, kind, 20)
        for r in range(rounds):
            for kind in kinds:
                fill(bench, server)
                if args.profile and r == 0:
                    profiler = cProfile.Profile()
                    profiler.enable()
                    seconds = submit(bench, kind, n)
                    profiler.disable()
                    out = io.StringIO()
                    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
                    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(45)
                    log(f"=== {kind}\n{out.getvalue()}")
                else:
                    seconds = submit(bench, kind, n)
                times[kind].append(seconds)
                if kind != "plain":
                    parked_counts[kind] = parked(server, bench)
                log(f"round {r + 1} {kind}: {seconds:.2f} s")
        bench.app.close()
    results = {
        "n": n,
        "rounds": rounds,
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "cpus": os.cpu_count(),
        "celery": package_version("celery"),
        "submit_s": {kind: statistics.median(t) for kind, t in times.items()},
        "submit_rounds_s": times,
        "parked": parked_counts,
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(
        f"submit: {n} tasks by delay() in a loop, median of {rounds} rounds; "
        f"celery {results['celery']}, {results['cpus']} CPUs, load average "
        f"{load_before:.1f} before / {results['load_average_1min'][1]:.1f} after"
    )
    for kind in kinds:
        per = results["submit_s"][kind] / n * 1e6
        note = f"  ({parked_counts[kind]} parked)" if kind in parked_counts else ""
        print(f"  {kind:<10} {results['submit_s'][kind]:7.2f} s  {per:6.0f} µs/task{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
