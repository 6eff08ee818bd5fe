"""Core benchmark of the PostgreSQL store: one client's acquire+release rate, 32
processes on one semaphore, and the tables' size after many cycles, each side by side
with a floor or with the seed's naive design, in one run.

The script starts a PostgreSQL cluster of its own on a free loopback port
(devkit/postgres_servers.py: never the machine's shared one on 5432), prints figures and
stops the cluster again, also on Ctrl-C and SIGTERM. It asserts nothing about timings.

    .venv/bin/python benchmarks/bench_postgres.py                     # about 3 minutes
    .venv/bin/python benchmarks/bench_postgres.py --table-cycles 0    # parts 1 and 2 only
    .venv/bin/python benchmarks/bench_postgres.py --table-cycles 1000000
    .venv/bin/python benchmarks/bench_postgres.py --json              # the figures as JSON

1. One client, uncontended (limit 4): ``sem.acquire()`` then ``permit.release()``
   against the floor (two ``SELECT 1`` round trips on one autocommit connection) and
   against the naive design (`NaiveSemaphore`: seven round trips), in alternating
   rounds; then a separate pass with ``track_functions = all`` says where the store's
   server time goes (pg_stat_user_functions).
2. ``--processes`` processes on one semaphore (limit 4), each looping acquire (blocking)
   -> hold 1 ms -> release for ``--seconds``; then the same with the naive design, which
   cannot wait and polls every 1 ms when refused. Every holder records when it got the
   permit and when it began to give it back (``time.monotonic()``: one clock for every
   process on Linux); the most intervals overlapping at any instant must not pass the
   limit. Each recorded interval lies inside the permit's real hold (from the grant's
   commit to the release's), so the check cannot raise a false alarm.
3. ``--table-cycles`` acquire+release cycles by 4 processes over 100 semaphores, then
   the size of the store's tables, their dead tuples and whether autovacuum ran.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg

from celery_semaphore import Semaphore, SemaphoreTimeout
from celery_semaphore.core.postgres._sync.store import PostgresStore
from celery_semaphore.core.postgres.schema import FUNCTIONS, TABLES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # devkit/, beside the package
from devkit.measures import percentile
from devkit.postgres_servers import PostgresServer
from devkit.reporting import package_version

LIMIT = 4
HOLD_S = 0.001  # how long a contender holds its permit
# The store's waiters sleep at most this long unless notified: the default, 2 s (a
# shorter re-check made every waiter ask again 20 times a second, under the row lock the
# grants need: 132 grants/s at 50 ms against 202 at 2 s in one run).
RECHECK_INTERVAL_S = 2.0
NAIVE_POLL_S = 0.001  # the naive contenders' sleep after a refusal
WARMUP_CYCLES = 200  # untimed cycles of each single-client benchmark before its rounds
ROUNDS = 3
PROFILE_CYCLES = 2000  # the track_functions pass (not timed with the rounds)
TABLE_NAMES = 100
TABLE_PROCESSES = 4
TABLE_CYCLES_LEAST = 100 * TABLE_PROCESSES  # each client's first and last tenth: 10+ cycles
MILLION = 1_000_000
SIZED_TABLES = ("semaphores", "holders", "waiters", "sent")
READY_TIMEOUT_S = 120.0  # for the worker processes to connect
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: the cluster stops


def named(url: str, application: str) -> str:
    """``url`` with an application_name, by which pg_stat_activity tells the clients apart."""
    return f"{url}?application_name={application}"


def backend_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a server process has used; None if /proc says nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # fields from the 3rd on (the name may hold spaces)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def backend_pid(monitor: psycopg.Connection[Any], application: str) -> int:
    row = monitor.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application,)
    ).fetchone()
    if row is None:
        raise RuntimeError(f"no server process for application_name {application}")
    return int(row[0])


@contextmanager
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# --------------------------------------------------------------------------- baseline
# The seed's naive design, written here as the BASELINE to compare against (it is not
# celery-semaphore): a permits table keyed by (resource, owner token) with an expiry and
# a config table (limit, status). Acquire is one client-side transaction of five
# statements on the config row's lock, release one DELETE: seven round trips a cycle.

NAIVE_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS naive_baseline;
CREATE TABLE IF NOT EXISTS naive_baseline.config (
  resource text PRIMARY KEY,
  permit_limit integer NOT NULL,
  status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'draining'))
);
CREATE TABLE IF NOT EXISTS naive_baseline.permits (
  resource text NOT NULL,
  token text NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (resource, token)
);
"""
NAIVE_CONFIGURE = (
    "INSERT INTO naive_baseline.config (resource, permit_limit) VALUES (%s, %s)"
    " ON CONFLICT (resource) DO UPDATE SET permit_limit = excluded.permit_limit"
)
NAIVE_LOCK_CONFIG = (
    "SELECT permit_limit, status FROM naive_baseline.config WHERE resource = %s FOR UPDATE"
)
NAIVE_DELETE_EXPIRED = (
    "DELETE FROM naive_baseline.permits WHERE resource = %s AND expires_at < now()"
)
NAIVE_COUNT = "SELECT count(*) FROM naive_baseline.permits WHERE resource = %s"
NAIVE_INSERT = (
    "INSERT INTO naive_baseline.permits (resource, token, expires_at)"
    " VALUES (%s, %s, now() + %s * interval '1 second')"
)
NAIVE_RELEASE = "DELETE FROM naive_baseline.permits WHERE resource = %s AND token = %s"


class NaiveSemaphore:
    """The baseline: BEGIN; lock the config row; delete the expired permits; count the
    rest; insert one if under the limit and active; COMMIT. Release: DELETE by token.
    It cannot wait: a refused caller asks again later."""

    def __init__(self, url: str, resource: str, lease_s: float = 60.0) -> None:
        self.connection = psycopg.connect(url, autocommit=True)
        self.resource = resource
        self.lease_s = lease_s

    @staticmethod
    def install(url: str, resource: str, limit: int) -> None:
        """The tables (if missing) and the resource's config row; once, before the
        clients start (concurrent CREATE SCHEMA IF NOT EXISTS can fail)."""
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(NAIVE_SCHEMA)
            connection.execute(NAIVE_CONFIGURE, (resource, limit))

    def try_acquire(self) -> str | None:
        """The new permit's token, or None if refused."""
        connection, resource = self.connection, self.resource
        token = uuid.uuid4().hex
        with connection.transaction():
            config = connection.execute(NAIVE_LOCK_CONFIG, (resource,)).fetchone()
            connection.execute(NAIVE_DELETE_EXPIRED, (resource,))
            counted = connection.execute(NAIVE_COUNT, (resource,)).fetchone()
            if config is None or counted is None:
                raise RuntimeError(f"naive baseline: no config row for {resource}")
            limit, status = config
            if status != "active" or counted[0] >= limit:
                return None
            connection.execute(NAIVE_INSERT, (resource, token, self.lease_s))
        return token

    def release(self, token: str) -> bool:
        return self.connection.execute(NAIVE_RELEASE, (self.resource, token)).rowcount == 1

    def close(self) -> None:
        self.connection.close()


# --------------------------------------------------------------------------- 1. one client


@dataclass
class Cycles:
    """One uncontended benchmark: ``cycle`` repeated, timed in alternating rounds."""

    key: str
    cycle: Callable[[], None]
    pid: int  # its server process, whose CPU time is read from /proc
    rates: list[float] = field(default_factory=list)
    client_us: list[float] = field(default_factory=list)
    server_us: list[float] = field(default_factory=list)

    def run_round(self, cycles: int) -> None:
        cycle = self.cycle
        server_before = backend_cpu_s(self.pid)
        with no_gc():
            started, client_started = time.perf_counter(), time.process_time()
            for _ in range(cycles):
                cycle()
            elapsed = time.perf_counter() - started
            client = time.process_time() - client_started
        server_after = backend_cpu_s(self.pid)
        self.rates.append(cycles / elapsed)
        self.client_us.append(client / cycles * 1e6)
        if server_before is not None and server_after is not None:
            self.server_us.append((server_after - server_before) / cycles * 1e6)


def floor_cycle(connection: psycopg.Connection[Any]) -> Callable[[], None]:
    def cycle() -> None:
        connection.execute("SELECT 1").fetchone()
        connection.execute("SELECT 1").fetchone()

    return cycle


def ours_cycle(semaphore: Semaphore) -> Callable[[], None]:
    acquire = semaphore.acquire

    def cycle() -> None:
        if not acquire().release():
            raise RuntimeError("celery-semaphore: an uncontended permit was gone at release")

    return cycle


def naive_cycle(naive: NaiveSemaphore) -> Callable[[], None]:
    try_acquire, release = naive.try_acquire, naive.release

    def cycle() -> None:
        token = try_acquire()
        if token is None or not release(token):
            raise RuntimeError("naive baseline: refused or lost an uncontended permit")

    return cycle


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


DEAD_ROWS = f"""
SELECT schemaname, relname, n_dead_tup, autovacuum_count FROM pg_stat_user_tables
WHERE (schemaname, relname) IN (('{TABLES}', 'holders'), ('naive_baseline', 'permits'))
ORDER BY schemaname
"""


def run_single(server: PostgresServer, cycles: int) -> dict[str, Any]:
    with server.connect() as monitor:
        floor_connection = server.connect()
        ours = Semaphore(named(server.url, "bench-ours"), "bench-uncontended", LIMIT)
        NaiveSemaphore.install(server.url, "bench-uncontended", LIMIT)
        naive = NaiveSemaphore(server.url, "bench-uncontended")
        try:
            ours.status()  # connects (and installs the functions) before the clock runs
            benches = [
                Cycles("floor", floor_cycle(floor_connection), floor_connection.info.backend_pid),
                Cycles("celery_semaphore", ours_cycle(ours), backend_pid(monitor, "bench-ours")),
                Cycles("naive", naive_cycle(naive), naive.connection.info.backend_pid),
            ]
            for bench in benches:
                for _ in range(WARMUP_CYCLES):
                    bench.cycle()
            for number in range(ROUNDS):
                log(f"  round {number + 1}/{ROUNDS}")
                for bench in benches:
                    bench.run_round(cycles)
        finally:
            floor_connection.close()
            ours.close()
            naive.close()
        time.sleep(1.0)  # the sessions' table counters reach the shared stats when they end
        dead = monitor.execute(DEAD_ROWS).fetchall()
    floor = benches[0]
    results: dict[str, Any] = {
        # Each round finds the dead rows of the rounds before it (until autovacuum runs).
        "dead_rows_after": {
            f"{schema}.{table}": {"dead": count, "autovacuum_count": runs}
            for schema, table, count, runs in dead
        }
    }
    for bench in benches:
        results[bench.key] = {
            "rounds": bench.rates,  # cycles/s, in the order they ran
            "cycles_per_s": spread(bench.rates),
            # each round's figure over the same round's floor
            "ratio_to_floor": spread(
                [rate / base for rate, base in zip(bench.rates, floor.rates, strict=True)]
            ),
            "client_cpu_us_per_cycle": statistics.median(bench.client_us),
            "server_cpu_us_per_cycle": (
                statistics.median(bench.server_us) if bench.server_us else None
            ),
        }
    return results


def run_profile(server: PostgresServer, cycles: int) -> dict[str, Any]:
    """Where the store's time goes in the database: ``cycles`` more cycles with
    ``track_functions = all`` (set for this pass only), read from pg_stat_user_functions.
    A function's total time includes the functions it calls; its self time does not.
    SQL functions the planner inlines are not counted as calls."""
    with server.connect() as monitor:
        monitor.execute("ALTER SYSTEM SET track_functions = 'all'")
        monitor.execute("SELECT pg_reload_conf()")
        time.sleep(0.2)  # the postmaster passes the reload on to new sessions
        semaphore = Semaphore(named(server.url, "bench-profile"), "bench-profile", LIMIT)
        try:
            cycle = ours_cycle(semaphore)
            with no_gc():
                started = time.perf_counter()
                for _ in range(cycles):
                    cycle()
                elapsed = time.perf_counter() - started
        finally:
            semaphore.close()
            # a session's function counters reach the shared stats when it ends
            deadline = time.monotonic() + 10
            while (
                time.monotonic() < deadline
                and monitor.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = 'bench-profile'"
                ).fetchone()
            ):
                time.sleep(0.05)
            time.sleep(1.0)
            monitor.execute("ALTER SYSTEM RESET track_functions")
            monitor.execute("SELECT pg_reload_conf()")
        rows = monitor.execute(
            "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions"
            " WHERE schemaname = %s ORDER BY self_time DESC",
            (FUNCTIONS,),
        ).fetchall()
    functions = {
        name: {
            "calls_per_cycle": calls / cycles,
            "total_us_per_cycle": total_ms * 1000 / cycles,
            "self_us_per_cycle": self_ms * 1000 / cycles,
        }
        for name, calls, total_ms, self_ms in rows
    }
    return {
        "cycles": cycles,
        "cycles_per_s": cycles / elapsed,
        "client_us_per_cycle": elapsed / cycles * 1e6,
        "functions": functions,
    }


# --------------------------------------------------------------------------- 2. contention


class OursContender:
    """A contender on the store: blocking acquire() until the deadline."""

    refused = None  # it waits in line: nothing to count

    def __init__(self, url: str) -> None:
        self.semaphore = Semaphore(
            url, "bench-contended", LIMIT, recheck_interval=RECHECK_INTERVAL_S
        )
        self.semaphore.status()  # connects before the start

    def take(self, deadline: float) -> Any:
        try:
            return self.semaphore.acquire(timeout=max(deadline - time.monotonic(), 0.0))
        except SemaphoreTimeout:
            return None

    def give(self, permit: Any) -> bool:
        return bool(permit.release())

    def close(self) -> None:
        self.semaphore.close()


class NaiveContender:
    """A contender on the baseline, which cannot wait: it asks again every 1 ms."""

    def __init__(self, url: str) -> None:
        self.naive = NaiveSemaphore(url, "bench-contended")
        self.refused = 0

    def take(self, deadline: float) -> str | None:
        while (token := self.naive.try_acquire()) is None:
            self.refused += 1
            if time.monotonic() >= deadline:
                return None
            time.sleep(NAIVE_POLL_S)
        return token

    def give(self, token: str) -> bool:
        return self.naive.release(token)

    def close(self) -> None:
        self.naive.close()


def contend(crew: Crew, kind: str, url: str, seconds: float) -> None:
    """One contender process: connect, wait for the common start, then loop
    acquire -> hold -> release until the deadline; hand back what it recorded."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the run (and us)
    client: OursContender | NaiveContender | None = None
    try:
        client = OursContender(url) if kind == "ours" else NaiveContender(url)
        deadline = crew.started() + seconds
        held: list[tuple[float, float, float]] = []
        lost = 0
        while (asked := time.monotonic()) < deadline:
            permit = client.take(deadline)
            if permit is None:
                break
            got = time.monotonic()
            time.sleep(HOLD_S)
            done = time.monotonic()
            if not client.give(permit):
                lost += 1
            held.append((asked, got, done))
        crew.results.put({"held": held, "lost": lost, "refused": client.refused})
    except BaseException as error:
        crew.failed(error)
        raise
    finally:
        if client is not None:
            client.close()


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (one that ends when another starts does
    not overlap it)."""
    events = sorted([(got, 1) for got, _ in intervals] + [(done, -1) for _, done in intervals])
    current = most = 0
    for _, step in events:
        current += step
        most = max(most, current)
    return most


@dataclass
class Crew:
    """What the parent and its worker processes share: a ready and a results queue, a
    go event, and the common start (a ``time.monotonic()`` value: one clock for every
    process on Linux)."""

    start: Any  # multiprocessing.Value("d")
    ready: Queue[Any]
    go: Event
    results: Queue[Any]

    def started(self) -> float:
        """In a worker, once connected: say so, wait for the start, return it."""
        self.ready.put(os.getpid())
        self.go.wait()
        start = float(self.start.value)
        time.sleep(max(start - time.monotonic(), 0.0))
        return start

    def failed(self, error: BaseException) -> None:
        """In a worker: tell the parent, whether it waits for the start or the results."""
        self.ready.put(f"{type(error).__name__}: {error}")
        self.results.put({"error": f"{type(error).__name__}: {error}"})

    def start_together(self, processes: int) -> float:
        """In the parent: wait until every worker is connected, then start them all at
        one instant; return it."""
        for _ in range(processes):
            answer = self.ready.get(timeout=READY_TIMEOUT_S)
            if isinstance(answer, str):
                raise RuntimeError(f"a worker failed before the start: {answer}")
        self.start.value = time.monotonic() + 0.1
        self.go.set()
        return float(self.start.value)

    def gather(self, processes: int, timeout: float) -> list[dict[str, Any]]:
        gathered = [self.results.get(timeout=timeout) for _ in range(processes)]
        errors = [item["error"] for item in gathered if "error" in item]
        if errors:
            raise RuntimeError(f"{len(errors)} worker(s) failed: {errors[0]}")
        return gathered


@contextmanager
def workers(target: Callable[..., None], argument_lists: list[tuple[Any, ...]]) -> Iterator[Crew]:
    """Forked processes running ``target(crew, *arguments)``; those still running are
    stopped (by pid) when the block ends, however it ends."""
    context = multiprocessing.get_context("fork")
    crew = Crew(context.Value("d", 0.0), context.Queue(), context.Event(), context.Queue())
    processes = [
        context.Process(target=target, args=(crew, *arguments), daemon=True)
        for arguments in argument_lists
    ]
    try:
        for process in processes:
            process.start()
        yield crew
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(5)


def run_contended(url: str, kind: str, processes: int, seconds: float) -> dict[str, Any]:
    if kind == "naive":
        NaiveSemaphore.install(url, "bench-contended", LIMIT)
    arguments = [(kind, url, seconds)] * processes
    with workers(contend, arguments) as crew:
        begin = crew.start_together(processes)
        gathered = crew.gather(processes, seconds + READY_TIMEOUT_S)
    deadline = begin + seconds
    held = [row for item in gathered for row in item["held"]]
    granted = sum(1 for _, got, _ in held if got < deadline)
    waits_ms = sorted((got - asked) * 1000 for asked, got, _ in held)
    holds_s = sum(done - got for _, got, done in held)
    per_process = [len(item["held"]) for item in gathered]
    refused = [item["refused"] for item in gathered if item["refused"] is not None]
    return {
        "grants": len(held),
        "grants_per_s": granted / seconds,
        "most_at_once": most_at_once([(got, done) for _, got, done in held]),
        "lost_at_release": sum(item["lost"] for item in gathered),
        "wait_ms": {
            "p50": percentile(waits_ms, 50),
            "p99": percentile(waits_ms, 99),
            "max": waits_ms[-1] if waits_ms else float("nan"),
        },
        # permit-seconds held over permit-seconds there were (limit x the run)
        "permits_in_use": holds_s / (LIMIT * seconds),
        "grants_per_process": {"min": min(per_process), "max": max(per_process)},
        "refusals": sum(refused) if refused else None,
    }


# --------------------------------------------------------------------------- 3. table sizes


def churn(crew: Crew, url: str, offset: int, cycles: int) -> None:
    """One of the table-size clients: ``cycles`` acquire+release cycles (a new holder id
    each) over `TABLE_NAMES` semaphores, all on one store (one connection)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    store = PostgresStore(url)
    try:
        semaphores = [
            Semaphore(store, f"bench-table-{(offset + i) % TABLE_NAMES}", LIMIT)
            for i in range(TABLE_NAMES)
        ]
        semaphores[0].status()  # connects (one connection for all 100)
        crew.started()
        tenth = cycles // 10  # main() asks for at least TABLE_CYCLES_LEAST cycles
        marks = [time.monotonic()]
        for number in range(1, cycles + 1):
            if not semaphores[number % TABLE_NAMES].acquire().release():
                raise RuntimeError("an uncontended permit was gone at release")
            if number in (tenth, cycles - tenth, cycles):
                marks.append(time.monotonic())
        crew.results.put({"marks": marks, "tenth": tenth})
    except BaseException as error:
        crew.failed(error)
        raise
    finally:
        store.close()


TABLE_STATS = """
SELECT s.relname, pg_total_relation_size(s.relid), pg_relation_size(s.relid),
       s.n_live_tup, s.n_dead_tup, s.last_autovacuum, s.autovacuum_count
FROM pg_stat_user_tables s WHERE s.schemaname = %s AND s.relname = ANY(%s)
"""


def table_stats(monitor: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    monitor.execute("SELECT pg_stat_clear_snapshot()")
    rows = monitor.execute(TABLE_STATS, (TABLES, list(SIZED_TABLES))).fetchall()
    stats = {
        name: {
            "total_bytes": total,
            "heap_bytes": heap,
            "live_tuples": live,
            "dead_tuples": dead,
            "last_autovacuum": None if last is None else last.isoformat(timespec="seconds"),
            "autovacuum_count": count,
        }
        for name, total, heap, live, dead, last, count in rows
    }
    return {name: stats[name] for name in SIZED_TABLES}


def run_tables(server: PostgresServer, cycles: int) -> dict[str, Any]:
    url = named(server.url, "bench-table")
    shares = [
        cycles // TABLE_PROCESSES + (i < cycles % TABLE_PROCESSES) for i in range(TABLE_PROCESSES)
    ]
    with server.connect() as monitor:
        naptime = monitor.execute("SHOW autovacuum_naptime").fetchone()
        before = table_stats(monitor)
        arguments = [
            (url, i * TABLE_NAMES // TABLE_PROCESSES, share) for i, share in enumerate(shares)
        ]
        with workers(churn, arguments) as crew:
            begin = crew.start_together(TABLE_PROCESSES)
            gathered = crew.gather(TABLE_PROCESSES, 24 * 3600)
        elapsed = max(item["marks"][-1] for item in gathered) - begin
        # the clients' counters reach the shared stats when their sessions end
        deadline = time.monotonic() + 10
        while (
            time.monotonic() < deadline
            and monitor.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'bench-table'"
            ).fetchone()
        ):
            time.sleep(0.05)
        time.sleep(1.0)
        after = table_stats(monitor)
    first = sum(item["tenth"] / (item["marks"][1] - item["marks"][0]) for item in gathered)
    last = sum(item["tenth"] / (item["marks"][3] - item["marks"][2]) for item in gathered)
    rate = cycles / elapsed
    return {
        "cycles": cycles,
        "processes": TABLE_PROCESSES,
        "semaphores": TABLE_NAMES,
        "elapsed_s": elapsed,
        "cycles_per_s": rate,
        "cycles_per_s_first_tenth": first,
        "cycles_per_s_last_tenth": last,
        "million_would_take_s": MILLION / rate,
        "autovacuum_naptime": None if naptime is None else naptime[0],
        "before": before,
        "after": after,
    }


# --------------------------------------------------------------------------- report


def size(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def print_report(results: dict[str, Any]) -> None:
    env, settings = results["environment"], results["settings"]
    print(
        f"PostgreSQL {env['postgres']} (own cluster {env['server']}, fsync=off), "
        f"psycopg {env['psycopg']} ({env['psycopg_impl']}), Python {env['python']}, "
        f"{env['cpus']} CPUs"
    )
    print(f"the store's functions: {env['functions']}")
    print(f"load average at start {env['load_start']}, at end {env['load_end']}")

    single = results["single"]
    print()
    print(
        f"1. one client, uncontended, limit {LIMIT}: {ROUNDS} alternating rounds of "
        f"{settings['cycles']:,} cycles each"
    )
    print(
        f"  {'':<44}{'cycles/s min':>13}{'median':>8}{'max':>8}{'µs/cyc':>8}"
        f"{'srv µs':>8}{'cli µs':>8}{'x floor':>9}{'(min-max)':>12}"
    )
    labels = {
        "floor": "floor: 2 x SELECT 1, one connection",
        "celery_semaphore": "celery-semaphore acquire()+release()",
        "naive": "naive baseline (7 round trips, see source)",
    }
    for key, label in labels.items():
        row = single[key]
        rate, ratio = row["cycles_per_s"], row["ratio_to_floor"]
        server = row["server_cpu_us_per_cycle"]
        print(
            f"  {label:<44}{rate['min']:>13,.0f}{rate['median']:>8,.0f}{rate['max']:>8,.0f}"
            f"{1e6 / rate['median']:>8.0f}"
            + (f"{server:>8.0f}" if server is not None else f"{'?':>8}")
            + f"{row['client_cpu_us_per_cycle']:>8.0f}{ratio['median']:>9.2f}"
            + f"{ratio['min']:>6.2f}-{ratio['max']:.2f}"
        )
    print("  (srv µs: CPU of the client's server process per cycle, from /proc; cli µs: ours)")
    in_order = "; ".join(
        f"{key} " + " / ".join(f"{rate:,.0f}" for rate in single[key]["rounds"])
        for key in ("celery_semaphore", "naive")
    )
    dead = ", ".join(
        f"{table} {row['dead']:,} dead rows ({row['autovacuum_count']} autovacuums)"
        for table, row in single["dead_rows_after"].items()
    )
    print(f"  rounds in order, cycles/s: {in_order}")
    print(f"  after the rounds: {dead}")

    profile = results["profile"]
    functions = profile["functions"]
    acquire, release = functions.get("acquire"), functions.get("release")
    print()
    print(
        f"  where the store's time goes: {profile['cycles']:,} more cycles with "
        f"track_functions = all ({profile['cycles_per_s']:,.0f} cycles/s, "
        f"{profile['client_us_per_cycle']:,.0f} µs a cycle at the client)"
    )
    if acquire is not None and release is not None:
        print(
            f"  in the database: acquire() {acquire['total_us_per_cycle']:,.0f} µs, "
            f"release() {release['total_us_per_cycle']:,.0f} µs a cycle"
        )
    print(f"    {'function':<20}{'calls/cycle':>12}{'self µs':>9}{'total µs':>10}")
    for name, row in functions.items():
        print(
            f"    {name:<20}{row['calls_per_cycle']:>12.1f}{row['self_us_per_cycle']:>9.0f}"
            f"{row['total_us_per_cycle']:>10.0f}"
        )

    contended = results["contended"]
    print()
    print(
        f"2. {settings['processes']} processes on one semaphore, limit {LIMIT}: acquire -> "
        f"hold {HOLD_S * 1000:.0f} ms -> release, {settings['seconds']:g} s each"
    )
    print(
        f"  {'':<44}{'grants/s':>9}{'most held':>10}{'wait ms p50':>12}{'p99':>7}{'max':>7}"
        f"{'in use':>8}{'per proc':>11}{'lost':>5}"
    )
    labels = {
        "celery_semaphore": f"celery-semaphore (recheck_interval {RECHECK_INTERVAL_S:g} s)",
        "naive": f"naive baseline (polls every {NAIVE_POLL_S * 1000:g} ms)",
    }
    for key, label in labels.items():
        row = contended[key]
        wait, per = row["wait_ms"], row["grants_per_process"]
        note = "" if row["most_at_once"] <= LIMIT else "  OVER THE LIMIT"
        print(
            f"  {label:<44}{row['grants_per_s']:>9,.0f}{row['most_at_once']:>10}"
            f"{wait['p50']:>12.1f}{wait['p99']:>7.1f}{wait['max']:>7.0f}"
            f"{row['permits_in_use']:>8.0%}{per['min']:>6}-{per['max']:<4}{row['lost_at_release']:>5}"
            f"{note}"
        )
    refusals = contended["naive"]["refusals"]
    print(
        f"  (most held: the most recorded holds at one instant, limit {LIMIT}; in use: "
        f"permit-time held over {LIMIT} x the run; naive: {refusals:,} refused polls)"
    )

    tables = results.get("tables")
    print()
    if tables is None:
        print("3. table sizes: skipped (--table-cycles 0)")
        return
    print(
        f"3. tables after {tables['cycles']:,} acquire+release cycles over "
        f"{tables['semaphores']} semaphores ({tables['processes']} processes): "
        f"{tables['elapsed_s']:.0f} s, {tables['cycles_per_s']:,.0f} cycles/s "
        f"(first tenth {tables['cycles_per_s_first_tenth']:,.0f}, last tenth "
        f"{tables['cycles_per_s_last_tenth']:,.0f})"
    )
    print(
        f"  a million cycles would take about {tables['million_would_take_s'] / 60:.1f} min "
        f"at this rate; autovacuum_naptime {tables['autovacuum_naptime']}"
    )
    print(
        f"  {'table':<12}{'total before':>13}{'after':>10}{'heap':>10}{'live':>7}{'dead':>7}"
        f"  autovacuum runs, last"
    )
    for name in SIZED_TABLES:
        before, after = tables["before"][name], tables["after"][name]
        print(
            f"  {name:<12}{size(before['total_bytes']):>13}{size(after['total_bytes']):>10}"
            f"{size(after['heap_bytes']):>10}{after['live_tuples']:>7,}"
            f"{after['dead_tuples']:>7,}  {after['autovacuum_count']}, "
            f"{after['last_autovacuum'] or 'never'}"
        )
    print("  (before: after parts 1 and 2; heap: the table without its indexes)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cycles", type=int, default=3000, help="cycles per round, one client (default 3000)"
    )
    parser.add_argument(
        "--processes", type=int, default=32, help="contending processes (default 32)"
    )
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="contended run, each design (default 10)"
    )
    parser.add_argument(
        "--table-cycles",
        type=int,
        default=200_000,
        help="cycles before the table sizes are read (default 200000; 0: skip that part)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.processes < 1 or args.seconds <= 0:
        parser.error("--cycles and --processes must be >= 1, --seconds > 0")
    if args.table_cycles and args.table_cycles < TABLE_CYCLES_LEAST:
        parser.error(f"--table-cycles: 0 (skip) or at least {TABLE_CYCLES_LEAST}")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    load_start = os.getloadavg()
    started = time.perf_counter()
    with PostgresServer() as server:
        log(f"own PostgreSQL cluster on {server.host}:{server.port} ({server.bin_dir})")
        with server.connect() as monitor:
            version = monitor.execute("SHOW server_version").fetchone()
        log("1. one client, uncontended")
        single = run_single(server, args.cycles)
        log("   track_functions pass")
        profile = run_profile(server, min(args.cycles, PROFILE_CYCLES))
        log(f"2. {args.processes} processes, celery-semaphore")
        contended = {
            "celery_semaphore": run_contended(server.url, "ours", args.processes, args.seconds)
        }
        log(f"2. {args.processes} processes, naive baseline")
        contended["naive"] = run_contended(server.url, "naive", args.processes, args.seconds)
        tables = None
        if args.table_cycles:
            log(f"3. {args.table_cycles:,} cycles over {TABLE_NAMES} semaphores")
            tables = run_tables(server, args.table_cycles)
    results = {
        "elapsed_s": time.perf_counter() - started,
        "settings": {
            "cycles": args.cycles,
            "rounds": ROUNDS,
            "processes": args.processes,
            "seconds": args.seconds,
            "table_cycles": args.table_cycles,
            "limit": LIMIT,
            "hold_s": HOLD_S,
            "recheck_interval_s": RECHECK_INTERVAL_S,
            "naive_poll_s": NAIVE_POLL_S,
        },
        "environment": {
            "postgres": None if version is None else version[0],
            "server": f"{server.host}:{server.port}",
            "functions": FUNCTIONS,  # the store's SQL version (a hash of its text)
            "psycopg": package_version("psycopg"),
            "psycopg_impl": psycopg.pq.__impl__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_start": " ".join(f"{x:.2f}" for x in load_start),
            "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        },
        "single": single,
        "profile": profile,
        "contended": contended,
        "tables": tables,
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
        log("interrupted; the own PostgreSQL cluster was stopped")
        sys.exit(130)
