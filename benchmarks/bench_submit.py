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

Kinds: ``plain`` (a plain task with a result, as the limited one has: the floor),
``limited`` (the ``LimitedTask``: each task takes its place and parks in one script
call), and ``two_calls`` (the same task through the path a publisher takes until it
has seen the line park: take the place, then park, two script calls; the publish
path of every parked task before the one call). Per kind: the submit time, the
script runs per task and the Redis server's CPU per task (``INFO``), and how many
tasks were parked. The target (12,000 limited tasks in under 10 s) is printed for
N = 12,000.
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
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # devkit/, beside the package
sys.path.insert(0, str(HERE))  # bench_app
from celery_semaphore import publish  # noqa: E402
from devkit.redis_servers import RedisServer  # noqa: E402
from devkit.reporting import package_version, verdict  # noqa: E402

KINDS = ("plain", "limited", "two_calls")
LIMIT = 4
TARGET_S = 10.0  # 12,000 limited tasks submitted (issue "A cap that costs almost nothing")
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


def server_cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def script_runs(client: redis.Redis) -> int:
    """Script runs since the last CONFIG RESETSTAT (not the NOSCRIPT misses): as
    functions (FCALL) or scripts (EVALSHA)."""
    stats = client.info("commandstats")
    found = [stats[f"cmdstat_{c}"] for c in ("evalsha", "fcall") if f"cmdstat_{c}" in stats]
    return sum(int(s["calls"]) - int(s["failed_calls"]) for s in found)


def timed_round(
    bench: ModuleType, server: RedisServer, kind: str, n: int, profile: bool
) -> dict[str, float]:
    """One round of ``kind`` on a freshly filled semaphore: its figures."""
    fill(bench, server)
    client = server.client(db=0)
    client.config_resetstat()
    cpu_before = server_cpu(client)
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    seconds = submit(bench, kind, n)
    if profiler:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(45)
        log(f"=== {kind} (profiled: slower than unprofiled)\n{out.getvalue()}")
    figures = {
        "submit_s": seconds,
        "script_runs_per_task": script_runs(client) / n,
        "redis_cpu_us_per_task": (server_cpu(client) - cpu_before) / n * 1e6,
        "parked": 0 if kind == "plain" else parked(server, bench),
    }
    client.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=12_000, help="tasks per round (12,000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="N=300, one round")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the first round of each kind (stderr)"
    )
    parser.add_argument("--kinds", default=",".join(KINDS), help="of " + ",".join(KINDS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    n, rounds = (300, 1) if args.quick else (args.n, args.rounds)
    kinds = args.kinds.split(",")
    load_before = os.getloadavg()[0]
    measured: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    with RedisServer(die_with_parent=True) as server:
        log(f"private redis-server on 127.0.0.1:{server.port}")
        redis_version = server.version()
        bench = bench_app(server)
        fill(bench, server)
        for kind in kinds:  # warm-up: connections, scripts, caches
            submit(bench, kind, 20)
        for r in range(rounds):  # interleaved: a burst of load hits every kind alike
            for kind in kinds:
                figures = timed_round(bench, server, kind, n, args.profile and r == 0)
                measured[kind].append(figures)
                log(f"round {r + 1} {kind}: {figures['submit_s']:.2f} s")
        bench.app.close()
    results = {
        "quick": args.quick,
        "n": n,
        "rounds": rounds,
        "target_s": TARGET_S if n == 12_000 else None,  # set for N = 12,000 only
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "cpus": os.cpu_count(),
        "celery": package_version("celery"),
        "redis_server": redis_version,
        # medians over the rounds; the submit times of every round as well
        "kinds": {
            kind: {key: statistics.median(f[key] for f in rounds_of) for key in rounds_of[0]}
            | {"submit_rounds_s": [f["submit_s"] for f in rounds_of]}
            for kind, rounds_of in measured.items()
        },
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print_report(results)
    return 0


def print_report(results: dict[str, Any]) -> None:
    n, load = results["n"], results["load_average_1min"]
    print(
        f"submit: {n} tasks by delay() in a loop into a full line (limit {LIMIT}, every "
        f"permit held), medians of {results['rounds']} interleaved rounds; celery "
        f"{results['celery']}, redis-server {results['redis_server']} (private), "
        f"{results['cpus']} CPUs, load average {load[0]:.1f} before / {load[1]:.1f} after"
    )
    print(f"{'kind':<10} {'submit (s)':>10} {'µs/task':>8} {'scripts/task':>13} "
          f"{'Redis CPU µs/task':>18} {'parked':>7}")  # fmt: skip
    for kind, f in results["kinds"].items():
        print(
            f"{kind:<10} {f['submit_s']:10.2f} {f['submit_s'] / n * 1e6:8.0f} "
            f"{f['script_runs_per_task']:13.2f} {f['redis_cpu_us_per_task']:18.0f} "
            f"{f['parked']:7.0f}"
        )
    target = results["target_s"]
    if "limited" in results["kinds"] and target is not None:
        limited = results["kinds"]["limited"]["submit_s"]
        print(f"target: limited under {target:.0f} s  {verdict(limited < target)}")


if __name__ == "__main__":
    sys.exit(main())
