"""The Redis time of one metrics scrape: every semaphore read with ``status()`` (the
scrape before counts.lua) against counts.lua, pipelined (`SemaphoreCollector.read()`
now), side by side in the same run on the same data.

S semaphores of limit 5, each with 5 holders and W / S live places in line: most of
them contenders that asked (acquire), a quarter tasks published with a place (enqueue:
each also a ``sent`` entry), every fourth semaphore's line shared by 10 fair keys; and
besides those, per semaphore, 10 published tasks whose place lapsed (``sent`` entries
outside the line). Put in by pipelined calls of the scripts with the arguments
``attempt()`` and ``take_place()`` send; the places hold an hour.

A scrape, either way, lists the semaphores (SCAN) and reads the data-loss gauges (SCAN
of the epoch hashes) as `SemaphoreCollector` does; "status" then opens each semaphore
(HMGET), calls ``status()`` and reads its counters (HMGET), one round trip each;
"counts" calls `SemaphoreCollector.read()`. The two are run in interleaved rounds; the
figures are medians over the rounds of:

- server CPU: the redis-server's CPU time (user + sys of its main thread, ``INFO cpu``)
  from just before the scrape to just after, less the same for an empty interval (two
  INFO calls in a row): what the scrape cost the server, I/O included;
- script time: the ``usec`` of FCALL and EVALSHA in ``INFO commandstats`` over the scrape (the
  scripts alone, the commands they call included);
- wall: the scrape's time in this process.

**Target: a scrape of 100 semaphores and 10,000 waiting tasks under 50 ms of Redis
time.** The script starts its own ``redis-server`` on a free loopback port (never the
shared one on 6379), stops it when it ends (also on Ctrl-C and SIGTERM), and asserts
nothing about timings: the figures are printed with the machine's load (``uptime``).

    .venv/bin/python benchmarks/bench_scrape.py           # 100 semaphores, 10,000 waiting
    .venv/bin/python benchmarks/bench_scrape.py --quick   # smoke run, a few seconds
    .venv/bin/python benchmarks/bench_scrape.py --json    # machine-readable results
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import redis

from celery_semaphore import Ask, Permit, Semaphore
from celery_semaphore.core.operations import open_semaphore
from celery_semaphore.core.redis import arguments, epochs
from celery_semaphore.core.redis.discovery import semaphore_names
from celery_semaphore.core.redis.keys import semaphore_keys
from celery_semaphore.core.redis.scripts import registered
from celery_semaphore.metrics import COUNTERS, SemaphoreCollector

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # devkit/, beside the package
from devkit.redis_servers import HOST, RedisServer
from devkit.reporting import package_version, verdict

NAMESPACE = "celery_semaphore"
LONG = 3600.0  # places and permits: no expiry mid-run
LAPSING = 0.5  # the place of a published task that lapses before the scrapes
LIMIT = 5
LAPSED_PER_SEMAPHORE = 10
FAIR_KEYS = 10
CHUNK = 1000
TARGET_MS = 50.0


@dataclass(frozen=True)
class Settings:
    semaphores: int
    waiting: int  # live places in line, over all semaphores
    rounds: int


FULL = Settings(semaphores=100, waiting=10_000, rounds=15)
QUICK = Settings(semaphores=10, waiting=500, rounds=3)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: the server stops


def populate(client: redis.Redis, settings: Settings) -> list[Semaphore]:
    per = settings.waiting // settings.semaphores
    sems = []
    for s in range(settings.semaphores):
        sem = Semaphore(client, f"scrape-{s:03d}", LIMIT, waiter_lease=LONG, lease_timeout=LONG)
        sems.append(sem)
        for h in range(LIMIT):
            if not isinstance(sem.attempt(f"h{h}"), Permit):
                raise RuntimeError(f"{sem.name}: refused a holder under its limit")
        spec, keys = sem._spec, sem.keys.call_keys
        sem.learn_epoch()
        epoch = epochs.argument(sem.url, sem.keys.epoch, spec.pause_after_loss)
        calls = []
        for w in range(per):
            key = f"k{w % FAIR_KEYS}" if s % 4 == 0 else None
            if w % 4 == 3:
                enqueue = spec.enqueue(f"sent-{w}", LONG, "", Ask(fair_key=key))
                calls.append(("enqueue", [*arguments.enqueue_args(spec, enqueue), epoch]))
            else:
                acquire = spec.acquire(
                    f"w-{w}", None, queue=True, wait_lease=LONG, lease_timeout=LONG, info="",
                    ask=Ask(fair_key=key),
                )  # fmt: skip
                calls.append(("acquire", [*arguments.acquire_args(spec, acquire), epoch]))
        for i in range(LAPSED_PER_SEMAPHORE):
            lapsing = spec.enqueue(f"lapsing-{i}", LAPSING, "")
            calls.append(("enqueue", [*arguments.enqueue_args(spec, lapsing), epoch]))
        scripts = registered(client)
        for start in range(0, len(calls), CHUNK):
            with client.pipeline(transaction=False) as pipe:
                for script, args in calls[start : start + CHUNK]:
                    scripts[script](keys=keys, args=args, client=pipe)
                pipe.execute()
    time.sleep(LAPSING + 0.1)
    return sems


def status_scrape(client: redis.Redis) -> dict[str, float]:
    """The scrape before counts.lua: metrics.py's reads then, the same totals."""
    totals = {"holders": 0.0, "waiters": 0.0, "sent": 0.0, "fair_keys_waiting": 0.0}
    for name in semaphore_names(client, NAMESPACE):
        status = open_semaphore(client, NAMESPACE, name).status()
        client.hmget(semaphore_keys(NAMESPACE, name).meta, "family", *COUNTERS)
        totals["holders"] += status.holder_count
        totals["waiters"] += status.waiter_count
        totals["sent"] += status.sent_count
        totals["fair_keys_waiting"] += status.fair_keys_waiting
    SemaphoreCollector(client, NAMESPACE).read_data_loss()
    return totals


def counts_scrape(client: redis.Redis) -> dict[str, float]:
    collector = SemaphoreCollector(client, NAMESPACE)
    series = collector.read()
    collector.read_data_loss()
    return {
        key: sum(row[key] for row in series.values())
        for key in ("holders", "waiters", "sent", "fair_keys_waiting")
    }


def server_cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"])


def script_usec(client: redis.Redis) -> float:
    """µs Redis spent in script calls so far: as functions (FCALL) or scripts (EVALSHA)."""
    stats = client.info("commandstats")
    return sum(float(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "fcall"))


def measure(client: redis.Redis, scrape: Callable[[redis.Redis], Any]) -> dict[str, float]:
    gc.collect()
    gc.disable()
    try:
        idle_start = server_cpu(client)
        idle = server_cpu(client) - idle_start
        scripts = script_usec(client)
        started_cpu = server_cpu(client)
        started = time.perf_counter()
        scrape(client)
        wall = time.perf_counter() - started
        cpu = server_cpu(client) - started_cpu
        scripts = script_usec(client) - scripts
    finally:
        gc.enable()
    return {"server_ms": (cpu - idle) * 1000, "script_ms": scripts / 1000, "wall_ms": wall * 1000}


def uptime() -> str:
    try:
        done = subprocess.run(["uptime"], capture_output=True, text=True, check=True, timeout=5)
        return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run(server: RedisServer, settings: Settings) -> dict[str, Any]:
    client = server.client()
    sems: list[Semaphore] = []
    try:
        log(f"  filling {settings.semaphores} semaphores, {settings.waiting:,} waiting")
        sems = populate(client, settings)
        old, new = status_scrape(client), counts_scrape(client)
        if old != new:
            raise RuntimeError(f"the two scrapes disagree: status {old}, counts {new}")
        samples: dict[str, list[dict[str, float]]] = {"status": [], "counts": []}
        for number in range(settings.rounds):
            log(f"  round {number + 1}/{settings.rounds}")
            samples["status"].append(measure(client, status_scrape))
            samples["counts"].append(measure(client, counts_scrape))
        results: dict[str, Any] = {"totals": new}
        for path, rows in samples.items():
            results[path] = {
                key: statistics.median(row[key] for row in rows)
                for key in ("server_ms", "script_ms", "wall_ms")
            }
            results[path]["server_ms_best"] = min(row["server_ms"] for row in rows)
        results["status_over_counts"] = statistics.median(
            s["server_ms"] / max(c["server_ms"], 1e-3)
            for s, c in zip(samples["status"], samples["counts"], strict=True)
        )
        return results
    finally:
        for sem in sems:
            sem.close()
        client.close()


def print_report(results: dict[str, Any]) -> None:
    env, s, scrape = results["environment"], results["settings"], results["scrape"]
    totals = scrape["totals"]
    print(
        f"one metrics scrape: {s['semaphores']} semaphores, {int(totals['waiters']):,} waiting "
        f"({int(totals['sent']):,} sent entries, {int(totals['fair_keys_waiting'])} fair keys "
        f"waiting), {s['rounds']} interleaved rounds; redis {env['redis_server']} on "
        f"{env['server']}, redis-py {env['redis_py']} ({env['parser']}), Python "
        f"{env['python']}, {env['cpus']} CPUs"
    )
    print(f"uptime before: {env['uptime_before']}")
    print(f"uptime after:  {env['uptime_after']}")
    print(f"\n{'scrape':<28}{'server ms':>11}{'best':>9}{'scripts ms':>12}{'wall ms':>10}")
    for path, text in (("status", "status() per semaphore"), ("counts", "counts.lua, pipelined")):
        row = scrape[path]
        print(
            f"{text:<28}{row['server_ms']:>11.2f}{row['server_ms_best']:>9.2f}"
            f"{row['script_ms']:>12.2f}{row['wall_ms']:>10.2f}"
        )
    ms = scrape["counts"]["server_ms"]
    print(
        f"\ncounts: {ms:.2f} ms of Redis server CPU a scrape, target < {TARGET_MS:.0f} ms: "
        f"{verdict(ms < TARGET_MS)}; status / counts (median of the per-round ratios): "
        f"{scrape['status_over_counts']:.0f}x"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.perf_counter()
    before = uptime()
    with RedisServer(die_with_parent=True) as server:
        log(f"private redis-server on {HOST}:{server.port} ({server.binary})")
        with server.client() as client:
            redis_version = str(client.info("server")["redis_version"])
        scrape = run(server, settings)
    results = {
        "quick": args.quick,
        "elapsed_s": time.perf_counter() - started,
        "settings": settings.__dict__,
        "environment": {
            "redis_server": redis_version,
            "server": f"{HOST}:{server.port}",
            "redis_py": package_version("redis"),
            "python": platform.python_version(),
            "parser": "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure-Python",
            "cpus": os.cpu_count(),
            "uptime_before": before,
            "uptime_after": uptime(),
        },
        "scrape": scrape,
        "targets": {"counts_server_ms_max": TARGET_MS},
    }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_report(results)
        print(f"\n(whole run: {results['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; the private redis-server was stopped")
        sys.exit(130)
