"""Single-client throughput and acquire latency of celery-semaphore, side by side with
py-redis-semaphore 0.2.0 and Dramatiq's ``ConcurrentRateLimiter``.

The script starts its own throwaway ``redis-server`` on a free loopback port (never the
shared one on 6379), prints figures and stops the server again, also on Ctrl-C. It
asserts nothing about timings: the targets of the issue are printed next to the figures.

    .venv/bin/python benchmarks/bench_semaphore.py           # full run, about a minute
    .venv/bin/python benchmarks/bench_semaphore.py --quick   # smoke run, a few seconds
    .venv/bin/python benchmarks/bench_semaphore.py --json    # machine-readable results
    .venv/bin/python benchmarks/bench_semaphore.py --compare-parsers  # hiredis vs pure Python

See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import redis

from celery_semaphore import Semaphore
from celery_semaphore.core.redis import arguments, epochs, functions
from celery_semaphore.core.redis.held_connection import HeldConnection
from celery_semaphore.core.redis.scripts import library_of, registered
from celery_semaphore.core.results import Place

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # devkit/, beside the package
from devkit.measures import percentile
from devkit.redis_servers import HOST, RedisServer
from devkit.reporting import package_version, verdict

LIMIT = 5  # limit of the uncontended semaphores (one client: never more than 1 holder)
LONG_LEASE = 3600.0  # leases of the pre-populated holders and waiters: no expiry mid-run
POPULATE_CHUNK = 1000

TARGET_RATIO_TO_FLOOR = 0.9
TARGET_LATENCY_RATIO = 2.0
OTHERS_MEASURED = {"py_redis_semaphore": 0.35, "dramatiq": 0.30}


@dataclass(frozen=True)
class Settings:
    rounds: int  # interleaved rounds of the throughput benchmarks (median reported)
    ping_ops: int  # PINGs per round
    cycles: int  # acquire+release cycles per round (celery-semaphore)
    other_cycles: int  # cycles per round for the slower competitors
    warmup: int  # untimed operations before the first round of each benchmark
    holders: int  # live holders of the "large" semaphore
    waiters: int  # live waiters of the "large" semaphore
    samples: int  # timed attempt() calls per latency scenario


FULL = Settings(
    rounds=21,
    ping_ops=1000,
    cycles=500,
    other_cycles=200,
    warmup=300,
    holders=10_000,
    waiters=100_000,
    samples=2000,
)
QUICK = Settings(
    rounds=2,
    ping_ops=200,
    cycles=100,
    other_cycles=50,
    warmup=20,
    holders=200,
    waiters=2000,
    samples=100,
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: the server stops


# --------------------------------------------------------------------------- timing


def server_cpu_seconds(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


@contextmanager
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class Throughput:
    """One uncontended benchmark: ``operation`` repeated, timed in interleaved rounds."""

    key: str
    operation: Callable[[], None]
    ops_per_round: int
    rates: list[float]
    server_us: list[float]
    client_us: list[float]

    def run_round(self, monitor: redis.Redis) -> None:
        operation = self.operation
        cpu_before = server_cpu_seconds(monitor)
        with no_gc():
            started, client_started = time.perf_counter(), time.process_time()
            for _ in range(self.ops_per_round):
                operation()
            elapsed = time.perf_counter() - started
            client = time.process_time() - client_started
        cpu = server_cpu_seconds(monitor) - cpu_before
        self.rates.append(self.ops_per_round / elapsed)
        self.server_us.append(cpu / self.ops_per_round * 1e6)
        self.client_us.append(client / self.ops_per_round * 1e6)


def pure_python_parser() -> dict[str, Any]:
    """Client options that make redis-py pack commands and parse replies in Python even
    though hiredis is installed (it then uses hiredis for both by default)."""
    from redis._parsers import _RESP2Parser  # redis-py swaps in its RESP3 parser for RESP3
    from redis.connection import Encoder, PythonRespSerializer

    encode = Encoder("utf-8", "strict", decode_responses=False).encode
    return {
        "parser_class": _RESP2Parser,
        "command_packer": PythonRespSerializer(6000, encode),  # redis-py's buffer cutoff
    }


# --------------------------------------------------------------------------- benchmarks


def ping_operation(client: redis.Redis) -> Callable[[], None]:
    """PING on a connection held as the package holds its own (`HeldConnection`)."""
    call = HeldConnection(client).call

    def operation() -> None:
        call("PING")

    return operation


def ours_operation(client: redis.Redis, way: str | None = None) -> Callable[[], None]:
    """An uncontended try_acquire + release; ``way``: functions.SCRIPTS to call the
    scripts (EVALSHA) on this client, where it would call the library (FCALL)."""
    semaphore = Semaphore(client, "bench-uncontended", LIMIT)
    if way is not None:
        library_of(client).way = way
    try_acquire = semaphore.try_acquire
    holder = "bench-holder"

    def operation() -> None:
        permit = try_acquire(holder)
        if permit is None:
            raise RuntimeError("celery-semaphore refused an uncontended acquire")
        permit.release()

    return operation


def epoch_argument(semaphore: Semaphore) -> str:
    """The data epoch argument every script call of ``semaphore`` carries (learnt now)."""
    semaphore.learn_epoch()
    return epochs.argument(semaphore.url, semaphore.keys.epoch, semaphore._spec.pause_after_loss)


def our_call_arguments(
    client: redis.Redis, name: str = "bench-uncontended"
) -> tuple[list[str], list[Any], list[Any]]:
    """The keys, and the arguments of our acquire and of our release (epoch learnt), of
    the semaphore ``name``."""
    semaphore = Semaphore(client, name, LIMIT)
    spec = semaphore._spec
    epoch = epoch_argument(semaphore)
    acquire = spec.acquire(
        "bench-holder", None, queue=True, wait_lease=None, lease_timeout=None, info=""
    )
    release = spec.release("bench-holder", 12345)
    return (
        semaphore.keys.call_keys,
        [*arguments.acquire_args(spec, acquire), epoch],
        [*arguments.release_args(spec, release), epoch],
    )


def trivial_scripts_operation(client: redis.Redis) -> Callable[[], None]:
    """Two calls of a script that does nothing (``return 1``), with the keys and the
    arguments of our acquire and of our release, sent as the package sends its own
    (`HeldConnection`): the floor for any two-script design with this client
    (packing, the round trips, EVALSHA itself)."""
    sha = client.script_load("return 1")
    keys, acquire_args, release_args = our_call_arguments(client)
    call = HeldConnection(client).call

    def operation() -> None:
        call("EVALSHA", sha, len(keys), *keys, *acquire_args)
        call("EVALSHA", sha, len(keys), *keys, *release_args)

    return operation


def trivial_functions_operation(client: redis.Redis) -> Callable[[], None]:
    """The same two calls of a do-nothing Redis function (FCALL), for comparison."""
    client.function_load(
        "#!lua name=bench_nothing\n"
        "redis.register_function('bench_nothing', function() return 1 end)",
        replace=True,
    )
    keys, acquire_args, release_args = our_call_arguments(client)
    call = HeldConnection(client).call

    def operation() -> None:
        call("FCALL", "bench_nothing", len(keys), *keys, *acquire_args)
        call("FCALL", "bench_nothing", len(keys), *keys, *release_args)

    return operation


#: The least a leased semaphore can do in two calls: drop the expired leases, count the
#: rest, add one (acquire); remove it (release). No fairness, fencing, metrics, epochs or
#: idle expiry. Its rate over the do-nothing functions is the ceiling of any semaphore
#: that takes two calls per permit with this client.
MINIMAL_SEMAPHORE = """#!lua name=bench_minimal
redis.register_function('bench_minimal_acquire', function(keys, args)
  local clock = redis.call('TIME')
  local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
  redis.call('ZREMRANGEBYSCORE', keys[1], '-inf', now)
  if redis.call('ZCARD', keys[1]) >= 5 then return {0} end
  redis.call('ZADD', keys[1], now + 60000, args[1])
  return {1, now}
end)
redis.register_function('bench_minimal_release', function(keys, args)
  return redis.call('ZREM', keys[1], args[1])
end)
"""


def minimal_semaphore_operation(client: redis.Redis) -> Callable[[], None]:
    """`MINIMAL_SEMAPHORE`'s acquire and release as FCALL, with our keys and arguments."""
    client.function_load(MINIMAL_SEMAPHORE, replace=True)
    # keys of their own, of the same length as ours: the same bytes on the wire
    keys, acquire_args, release_args = our_call_arguments(client, "bench-minimal-sem")
    call = HeldConnection(client).call

    def operation() -> None:
        if call("FCALL", "bench_minimal_acquire", len(keys), *keys, *acquire_args)[0] != 1:
            raise RuntimeError("the minimal semaphore refused an uncontended acquire")
        call("FCALL", "bench_minimal_release", len(keys), *keys, *release_args)

    return operation


def py_redis_semaphore_operation(client: redis.Redis) -> Callable[[], None]:
    from redis_semaphore import Semaphore as PrsSemaphore
    from redis_semaphore import SemaphoreConfig

    # Defaults, as a user would write it: server time, a heartbeat thread while held,
    # and a wake-up LPUSH pipeline after each release. (Its warning that the default
    # blpop_timeout equals redis-py's socket_timeout concerns blocking waits only.)
    logging.getLogger("redis_semaphore").setLevel(logging.ERROR)
    semaphore = PrsSemaphore(client, SemaphoreConfig(name="bench-uncontended", limit=LIMIT))

    def operation() -> None:
        if not semaphore.acquire(blocking=False).success:
            raise RuntimeError("py-redis-semaphore refused an uncontended acquire")
        semaphore.release()

    return operation


def dramatiq_operation(client: redis.Redis) -> Callable[[], None]:
    from dramatiq.rate_limits import ConcurrentRateLimiter
    from dramatiq.rate_limits.backends import RedisBackend

    limiter = ConcurrentRateLimiter(RedisBackend(client=client), "bench-uncontended", limit=LIMIT)

    def operation() -> None:
        with limiter.acquire(raise_on_failure=False) as acquired:
            if not acquired:
                raise RuntimeError("Dramatiq refused an uncontended acquire")

    return operation


def run_throughput(
    server: RedisServer, settings: Settings, *, compare_parsers: bool = False
) -> dict[str, Any]:
    clients = [server.client() for _ in range(9)]
    monitor, ping_client, ours_client, prs_client, dramatiq_client, scripts_client = clients[:6]
    evalsha_client, functions_client, minimal_client = clients[6:]
    try:
        benches = [
            Throughput("ping", ping_operation(ping_client), settings.ping_ops, [], [], []),
            Throughput(
                "trivial_scripts",
                trivial_scripts_operation(scripts_client),
                settings.cycles,
                [],
                [],
                [],
            ),
            Throughput(
                "trivial_functions",
                trivial_functions_operation(functions_client),
                settings.cycles,
                [],
                [],
                [],
            ),
            Throughput(
                "minimal_semaphore",
                minimal_semaphore_operation(minimal_client),
                settings.cycles,
                [],
                [],
                [],
            ),
            Throughput(
                "celery_semaphore", ours_operation(ours_client), settings.cycles, [], [], []
            ),
            Throughput(
                "celery_semaphore_evalsha",
                ours_operation(evalsha_client, functions.SCRIPTS),
                settings.cycles,
                [],
                [],
                [],
            ),
            Throughput(
                "py_redis_semaphore",
                py_redis_semaphore_operation(prs_client),
                settings.other_cycles,
                [],
                [],
                [],
            ),
            Throughput(
                "dramatiq", dramatiq_operation(dramatiq_client), settings.other_cycles, [], [], []
            ),
        ]
        if compare_parsers:  # the same two benchmarks on clients that pack and parse in Python
            python_clients = [server.client(**pure_python_parser()) for _ in range(2)]
            clients += python_clients
            benches += [
                Throughput(
                    "trivial_scripts_python",
                    trivial_scripts_operation(python_clients[0]),
                    settings.cycles,
                    [],
                    [],
                    [],
                ),
                Throughput(
                    "celery_semaphore_python",
                    ours_operation(python_clients[1]),
                    settings.cycles,
                    [],
                    [],
                    [],
                ),
            ]
        for bench in benches:
            for _ in range(settings.warmup):
                bench.operation()
        for number in range(settings.rounds):
            log(f"  throughput round {number + 1}/{settings.rounds}")
            for bench in benches:
                bench.run_round(monitor)
        ping = benches[0]
        floors = [rate / 2 for rate in ping.rates]
        results: dict[str, Any] = {
            "ping_ops_per_s": statistics.median(ping.rates),
            "ping_ops_per_s_best": max(ping.rates),
            "ping_server_cpu_us": statistics.median(ping.server_us),
            "ping_client_cpu_us": statistics.median(ping.client_us),
            "floor_cycles_per_s": statistics.median(floors),
            "celery_semaphore_way": library_of(ours_client).way,
        }
        by_key = {bench.key: bench for bench in benches}
        for bench in benches[1:]:
            scripts = by_key[
                "trivial_scripts_python" if bench.key.endswith("_python") else "trivial_scripts"
            ]
            ratios = [rate / floor for rate, floor in zip(bench.rates, floors, strict=True)]
            results[bench.key] = {
                "cycles_per_s": statistics.median(bench.rates),
                "cycles_per_s_best": max(bench.rates),
                # median of the per-round ratios (each round's PING rate is its own floor)
                "ratio_to_floor": statistics.median(ratios),
                # fastest round over fastest PING round: the least disturbed by other load
                "ratio_to_floor_best": max(bench.rates) / (max(ping.rates) / 2),
                "server_cpu_us_per_cycle": statistics.median(bench.server_us),
                # time.process_time() of this process (with py-redis-semaphore: its threads too)
                "client_cpu_us_per_cycle": statistics.median(bench.client_us),
                # against two do-nothing scripts with the same keys and arguments, same round
                "ratio_to_scripts": statistics.median(
                    rate / other for rate, other in zip(bench.rates, scripts.rates, strict=True)
                ),
                # and against the do-nothing functions (FCALL)
                "ratio_to_functions": statistics.median(
                    rate / other
                    for rate, other in zip(
                        bench.rates, by_key["trivial_functions"].rates, strict=True
                    )
                ),
            }
        if compare_parsers:
            results["hiredis_speedup"] = {
                key: statistics.median(
                    fast / slow
                    for fast, slow in zip(
                        by_key[key].rates, by_key[f"{key}_python"].rates, strict=True
                    )
                )
                for key in ("trivial_scripts", "celery_semaphore")
            }
        return results
    finally:
        for client in clients:
            client.close()


def populate(semaphore: Semaphore, client: redis.Redis, holders: int, waiters: int) -> None:
    """Fill ``semaphore`` (limit == holders) with live holders, then live waiters.

    Pipelined calls of the acquire script with the exact arguments ``attempt()`` sends,
    so the state is what that many real contenders would leave behind.
    """
    script = registered(semaphore.client)["acquire"]
    keys = semaphore.keys.call_keys
    spec = semaphore._spec
    epoch = epoch_argument(semaphore)
    names = [f"holder-{i}" for i in range(holders)] + [f"waiter-{i}" for i in range(waiters)]
    for start in range(0, len(names), POPULATE_CHUNK):
        with client.pipeline(transaction=False) as pipe:
            for name in names[start : start + POPULATE_CHUNK]:
                request = spec.acquire(
                    name,
                    None,
                    queue=True,
                    wait_lease=LONG_LEASE,
                    lease_timeout=LONG_LEASE,
                    info="",
                )
                script(keys=keys, args=[*arguments.acquire_args(spec, request), epoch], client=pipe)
            pipe.execute()
    status = semaphore.status()
    if status.holder_count != holders or status.waiter_count != waiters:
        raise RuntimeError(
            f"populating gave {status.holder_count} holders and {status.waiter_count} "
            f"waiters, wanted {holders} and {waiters}"
        )


def time_attempts(semaphore: Semaphore, prefix: str, count: int, *, granted: bool) -> list[float]:
    """Microseconds of ``attempt()`` by a fresh holder each; granted permits are released
    (untimed) right after."""
    attempt = semaphore.attempt
    names = [f"{prefix}-{i}" for i in range(count)]
    samples: list[float] = []
    perf_counter = time.perf_counter
    with no_gc():
        for name in names:
            started = perf_counter()
            result = attempt(name)
            samples.append((perf_counter() - started) * 1e6)
            if isinstance(result, Place) == granted:
                raise RuntimeError(f"{prefix}: expected granted={granted}, got {result!r}")
            if not isinstance(result, Place):
                result.release()
    samples.sort()
    return samples


def summarize(samples: list[float]) -> dict[str, float]:
    return {"p50_us": percentile(samples, 50), "p99_us": percentile(samples, 99)}


def run_latency(server: RedisServer, settings: Settings) -> dict[str, Any]:
    client = server.client()
    try:
        options = {"lease_timeout": LONG_LEASE, "waiter_lease": LONG_LEASE}
        empty = Semaphore(client, "bench-latency-empty", settings.holders, **options)
        small = Semaphore(client, "bench-latency-small", 1, **options)
        large = Semaphore(client, "bench-latency-large", settings.holders, **options)
        log(f"  populating {settings.holders:,} holders and {settings.waiters:,} waiters")
        started = time.perf_counter()
        populate(large, client, settings.holders, settings.waiters)
        populate_s = time.perf_counter() - started
        if isinstance(small.attempt("small-holder"), Place):  # takes its only permit
            raise RuntimeError("the small semaphore refused its first holder")
        warmup = max(10, settings.warmup // 2)
        time_attempts(empty, "warmup", warmup, granted=True)
        time_attempts(small, "warmup", warmup, granted=False)
        time_attempts(large, "warmup", warmup, granted=False)
        log(f"  timing {settings.samples:,} attempts per scenario")
        rows = {
            "empty": time_attempts(empty, "probe", settings.samples, granted=True),
            "small_refused": time_attempts(small, "probe", settings.samples, granted=False),
            "large": time_attempts(large, "probe", settings.samples, granted=False),
        }
        results: dict[str, Any] = {name: summarize(rows[name]) for name in rows}
        results["large"].update(holders=settings.holders, waiters=settings.waiters)
        results["populate_s"] = populate_s
        results["large_over_empty"] = {
            "p50": results["large"]["p50_us"] / results["empty"]["p50_us"],
            "p99": results["large"]["p99_us"] / results["empty"]["p99_us"],
        }
        return results
    finally:
        client.close()


# --------------------------------------------------------------------------- report


def print_report(results: dict[str, Any]) -> None:
    env = results["environment"]
    thr = results["throughput"]
    lat = results["latency"]
    print(
        f"redis-server {env['redis_server']} (private, {env['server']}), "
        f"redis-py {env['redis_py']} ({env['parser']} parser), Python {env['python']}, "
        f"{env['cpus']} CPUs, load average {env['load_average']}"
    )
    print(
        f"one client, loopback; {results['settings']['rounds']} interleaved rounds"
        + ("  [--quick: smoke run, figures not meaningful]" if results["quick"] else "")
    )
    print()
    print(
        f"{'uncontended, one client (median round)':<46}{'ops/s':>8}{'µs/op':>9}{'srv µs':>8}"
        f"{'cli µs':>8}{'x floor':>9}{'best':>7}  target"
    )
    Row = tuple[str, float, float | None, float | None, float | None, float | None, str]
    rows: list[Row] = [
        (
            "PING round trip",
            thr["ping_ops_per_s"],
            thr["ping_server_cpu_us"],
            thr["ping_client_cpu_us"],
            None,
            None,
            "",
        ),
        (
            "two-round-trip floor (PING rate / 2)",
            thr["floor_cycles_per_s"],
            None,
            None,
            1.0,
            1.0,
            "",
        ),
    ]
    labels = {
        "trivial_scripts": "two do-nothing scripts, our keys and args",
        "trivial_functions": "two do-nothing functions (FCALL), same",
        "minimal_semaphore": "a minimal semaphore (4 commands), FCALL",
        "celery_semaphore": f"celery-semaphore try_acquire+release, {thr['celery_semaphore_way']}",
        "celery_semaphore_evalsha": "celery-semaphore, scripts (EVALSHA)",
        "trivial_scripts_python": "two do-nothing scripts, pure-Python parser",
        "celery_semaphore_python": "celery-semaphore, pure-Python parser",
        "py_redis_semaphore": f"py-redis-semaphore {env['py_redis_semaphore']} acquire+release",
        "dramatiq": f"Dramatiq {env['dramatiq']} ConcurrentRateLimiter",
    }
    for key, label in labels.items():
        if key not in thr:
            continue
        bench = thr[key]
        ratio, best = bench["ratio_to_floor"], bench["ratio_to_floor_best"]
        if key.startswith("celery_semaphore"):
            to_scripts = bench["ratio_to_scripts"]
            to_functions = (
                f", {bench['ratio_to_functions']:.2f} of the functions"
                if key == "celery_semaphore" and thr["celery_semaphore_way"] == functions.FUNCTIONS
                else ""
            )
            note = (
                f"{to_scripts:.2f} of the do-nothing scripts{to_functions}; target >= "
                f"{TARGET_RATIO_TO_FLOOR:.2f}: {verdict(to_scripts >= TARGET_RATIO_TO_FLOOR)}"
            )
        elif key == "minimal_semaphore":
            note = (
                f"{bench['ratio_to_scripts']:.2f} of the scripts, "
                f"{bench['ratio_to_functions']:.2f} of the functions: the ceiling of two calls"
            )
        elif key == "trivial_scripts":
            note = "the floor of any two-script design with this client"
        elif key == "trivial_functions":
            note = f"{bench['ratio_to_scripts']:.2f} of the do-nothing scripts"
        elif key == "trivial_scripts_python":
            note = "same rounds, packed and parsed in Python"
        else:
            note = f"(others measured ~{OTHERS_MEASURED[key]:.2f})"
        rows.append(
            (
                label,
                bench["cycles_per_s"],
                bench["server_cpu_us_per_cycle"],
                bench["client_cpu_us_per_cycle"],
                ratio,
                best,
                note,
            )
        )
    for label, rate, server_us, client_us, ratio, best, note in rows:
        server = f"{server_us:8.1f}" if server_us is not None else " " * 8
        client = f"{client_us:8.1f}" if client_us is not None else " " * 8
        x_floor = f"{ratio:9.2f}" if ratio is not None else " " * 9
        x_best = f"{best:7.2f}" if best is not None else " " * 7
        line = (
            f"  {label:<44}{rate:>8,.0f}{1e6 / rate:9.1f}{server}{client}{x_floor}{x_best}  {note}"
        )
        print(line.rstrip())
    if "hiredis_speedup" in thr:
        speedup = thr["hiredis_speedup"]
        print(
            f"  hiredis over pure Python (ops/s, median of rounds): celery-semaphore "
            f"{speedup['celery_semaphore']:.2f}x, do-nothing scripts "
            f"{speedup['trivial_scripts']:.2f}x"
        )
    print()
    print(f"{'attempt() latency, µs':<46}{'p50':>8}{'p99':>9}")
    large = lat["large"]
    latency_rows = [
        ("empty semaphore (granted)", lat["empty"]),
        ("1 holder at limit 1 (refused, queued)", lat["small_refused"]),
        (f"{large['holders']:,} holders + {large['waiters']:,} waiters (refused)", large),
    ]
    for label, row in latency_rows:
        print(f"  {label:<44}{row['p50_us']:8.1f}{row['p99_us']:9.1f}")
    ratio = lat["large_over_empty"]
    met = max(ratio["p50"], ratio["p99"]) <= TARGET_LATENCY_RATIO
    print(
        f"  {'large / empty':<44}{ratio['p50']:7.2f}x{ratio['p99']:8.2f}x"
        f"  target <= {TARGET_LATENCY_RATIO:.1f}x: {verdict(met)}"
    )
    print(f"  (populating the large semaphore took {lat['populate_s']:.1f} s, pipelined)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (few iterations)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument(
        "--compare-parsers",
        action="store_true",
        help="also time the do-nothing scripts and celery-semaphore on clients that pack and "
        "parse in pure Python, in the same rounds (needs hiredis installed)",
    )
    args = parser.parse_args(argv)
    if args.compare_parsers and not redis.utils.HIREDIS_AVAILABLE:
        parser.error(
            "--compare-parsers compares hiredis with pure Python, and redis-py does not use "
            "hiredis here: pip install -e '.[hiredis]'"
        )
    settings = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.perf_counter()
    with RedisServer(die_with_parent=True) as server:
        log(f"private redis-server on {HOST}:{server.port} ({server.binary})")
        with server.client() as client:
            redis_version = str(client.info("server")["redis_version"])
        log("uncontended throughput")
        throughput = run_throughput(server, settings, compare_parsers=args.compare_parsers)
        log("acquire latency")
        latency = run_latency(server, settings)
    results = {
        "quick": args.quick,
        "compare_parsers": args.compare_parsers,
        "elapsed_s": time.perf_counter() - started,
        "settings": settings.__dict__,
        "environment": {
            "redis_server": redis_version,
            "server": f"{HOST}:{server.port}",
            "redis_py": package_version("redis"),
            "py_redis_semaphore": package_version("py-redis-semaphore"),
            "dramatiq": package_version("dramatiq"),
            "python": platform.python_version(),
            "parser": "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure-Python",
            "hiredis": package_version("hiredis"),
            "cpus": os.cpu_count(),
            "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        },
        "throughput": throughput,
        "latency": latency,
        "targets": {
            "ratio_to_floor_min": TARGET_RATIO_TO_FLOOR,
            "large_over_empty_max": TARGET_LATENCY_RATIO,
        },
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
