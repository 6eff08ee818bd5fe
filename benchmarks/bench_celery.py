"""End to end: N tasks of H seconds under a cluster-wide cap L, on K real prefork
``celery worker`` processes of C pool processes each, with celery-semaphore's
``LimitedTask`` side by side with py-redis-semaphore 0.2.0 used inside a plain task
(non-blocking acquire, ``self.retry`` with exponential backoff and full jitter when
refused); then the cost of a cap that never binds, on no-op tasks: plain, limited, and
limited with kept permits (``semaphore_keep_idle``), with the store calls per task.

The script starts its own ``redis-server`` (broker, result backend and semaphore
store; never the shared one on 6379) and the workers (benchmarks/bench_app.py), prints
figures, and stops every process again, also on an error or Ctrl-C. It asserts nothing:
the targets are printed next to the figures.

``--broker amqp`` takes the broker from RabbitMQ (``--amqp-url``, the machine's shared
one by default; every queue and exchange the run declares has a name unique to the
run, and is deleted at the end) and the semaphores from a redis-server of their own;
``--broker redis-separate`` runs the broker and the semaphores in two redis-servers of
their own. ``--semaphore-redis plain|aof|no-config`` is how the semaphores' Redis runs
(the broker's own with ``--broker redis``): no persistence, ``appendonly yes``, or
no persistence and ``CONFIG`` refused (renamed away, as on managed services).

``--semaphore-store postgres`` (with ``--broker amqp`` only) keeps the semaphores in
PostgreSQL (``semaphore_url``): a cluster of the script's own on a free loopback port
(devkit/postgres_servers.py; stopped at the end like the rest), or the database of
``--postgres-url``. Then nothing of the plugin touches Redis: there is no result
backend (``run_capped`` sees a task end by its record), and the script's own
redis-server keeps only the bench's records and the baseline's py-redis-semaphore.

    .venv/bin/python benchmarks/bench_celery.py            # full run, about a minute
    .venv/bin/python benchmarks/bench_celery.py --quick    # smoke run
    .venv/bin/python benchmarks/bench_celery.py --json     # machine-readable results

Options change N/H/L/K/C (``-n --hold -l -k -c``), the no-op phase, the baseline's
backoff, and the workers' prefetch multiplier and ``acks_late``; ``--keep-idle
SECONDS`` sets the workers' ``semaphore_keep_idle`` (kept permits; 0, off, by default:
the report's first line and the JSON's ``keep_idle_s`` say which); ``--skip`` leaves a
phase out; ``--prime`` gives ours a hold-time estimate before it is measured (a
long-lived semaphore has one; a fresh Redis does not); ``--log-dir`` keeps the worker
logs; ``--dump FILE`` writes every record (task bodies, waits in place, countdowns,
counts samples) for a closer look. On a busy machine the timings say more about
the machine than about the semaphores: the load average is printed with them.

Every figure comes from outside the semaphores: each task body records its own start
and end (``time.time()``, same machine) and how many times it was sent back to wait.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import redis

import celery_semaphore
from celery_semaphore.core.operations import OperatedStore, operated_store
from celery_semaphore.core.postgres.connection import is_postgres_url
from celery_semaphore.core.urls import mask_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # devkit/, beside the package
from devkit.measures import kendall_tau, peak_overlap, percentile
from devkit.processes import Processes, worker_command
from devkit.redis_servers import RedisServer
from devkit.reporting import package_version, verdict

HERE = Path(__file__).resolve().parent
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
SAMPLE_EVERY = 0.02
INSPECT_EVERY = 1.0  # default seconds between two inspect samples (--inspect-every)
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
BROKERS = ("redis", "amqp", "redis-separate")
STORES = ("redis", "postgres")
#: With no result backend: seconds without a new record before giving up. Longer than a
#: lease (60 s) plus a hand-over's deadline (30 s): the plugin's own recovery of a permit
#: whose holder died or of a hand-over that never arrived shows in the figures.
STALL_TIMEOUT = 150.0
#: redis-server arguments of the semaphores' Redis, after RedisServer's own
#: (``--save '' --appendonly no``; later arguments win).
SEMAPHORE_REDIS_ARGS: dict[str, tuple[str, ...]] = {
    "plain": (),
    "aof": ("--appendonly", "yes"),
    "no-config": ("--rename-command", "CONFIG", ""),
}
CPU_PARTS = ("workers", "worker_main", "redis", "client")
#: The no-op kinds (bench_app's ``noop_<kind>``), in the order of the first round; each
#: round starts one further along (plain, limited, kept; limited, kept, plain; ...).
NOOP_KINDS = ("plain", "limited", "kept")
#: The Redis commands that call the store (a Redis function or a Lua script); their
#: ``calls`` in ``INFO commandstats`` count the store calls.
SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval")

TARGETS = {
    "efficiency_min": 0.95,
    "kendall_tau_min": 0.99,
    "retries_mean_max": 2.0,
    "noop_ratio_min": 0.85,
    "noop_kept_ratio_min": 0.90,  # kept permits: noop_kept vs plain
    "noop_kept_calls_max": 0.1,  # store (script / function) calls per kept no-op task
}
BACKLOG_TARGETS = {
    "efficiency_min": 0.90,
    "waits_mean_max": 1.1,
    "kendall_tau_min": 0.99,
    "held_by_workers_max_per_limit": 4,
}
BACKLOG_MODES = ("ours", "ours_countdown", "baseline", "plain")
LABELS = {
    "ours": "handover",
    "ours_countdown": "countdown",
    "baseline": "baseline",
    "plain": "plain, L processes",
}
BASELINE_MEASURED = "efficiency 0.61-0.68, tau ~0.1, ~4.6 retries/task (docs field notes)"


@dataclass(frozen=True)
class Settings:
    tasks: int  # N
    hold: float  # H, seconds each body sleeps
    limit: int  # L
    workers: int  # K
    concurrency: int  # C
    noop_tasks: int
    noop_rounds: int  # interleaved rounds (plain, limited, kept; limited, kept, plain; ...)
    noop_limit: int
    backoff_base: float  # the baseline's retry backoff
    backoff_max: float
    warmup: int  # untimed no-op tasks of each kind before the first phase
    prefetch_multiplier: int = 4  # the workers' worker_prefetch_multiplier (Celery's default)
    acks_late: bool = False  # task_acks_late for every task of the bench app
    #: The workers' app's semaphore_keep_idle (0: off, the package's default): kept permits
    #: for every LimitedTask of the bench app but noop_limited and noop_kept (their own).
    keep_idle: float = 0.0

    @property
    def ideal(self) -> float:
        return self.tasks * self.hold / self.limit


FULL = Settings(
    tasks=120,
    hold=0.2,
    limit=4,
    workers=2,
    concurrency=8,
    noop_tasks=2000,
    noop_rounds=3,
    noop_limit=10_000,
    backoff_base=0.1,  # tuned to this workload: reproduces the ~550 retries of the field notes
    backoff_max=2.0,
    warmup=64,
)
QUICK = replace(FULL, tasks=12, concurrency=4, noop_tasks=100, noop_rounds=1, warmup=16)
# The common case the plugin exists for: a long backlog against a small cap, on
# Celery's default prefetch multiplier (4).
BACKLOG = replace(FULL, tasks=3000, hold=0.05, limit=4, workers=2, concurrency=4)
BACKLOG_QUICK = replace(BACKLOG, tasks=60, concurrency=2, warmup=8)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: everything stops


# --------------------------------------------------------------------------- where


@dataclass
class Topology:
    """Where the broker, the semaphores, the results and the records live.

    ``bench`` holds the records (db 2), the result backend (db 1) and the broker (db 0)
    unless it is RabbitMQ; ``semaphore`` holds the semaphores (db 0): ``bench`` itself
    with ``--broker redis`` (the package's default: the broker's URL). With the
    semaphores in PostgreSQL (``postgres_url``; ``postgres_pid``: our own cluster's
    postmaster, None with ``--postgres-url``) ``semaphore`` is None and there is no
    result backend."""

    broker: str  # one of BROKERS
    semaphore_redis: str  # a key of SEMAPHORE_REDIS_ARGS
    bench: RedisServer
    semaphore: RedisServer | None  # None: the semaphores are in PostgreSQL
    amqp_url: str = AMQP_URL
    tag: str = ""  # in every name the run declares on a shared broker ("" on our own)
    cleanup: dict[str, Any] = field(default_factory=dict)  # what delete_amqp_entities() did
    postgres_url: str | None = None
    postgres_pid: int | None = None

    @property
    def store(self) -> str:
        """One of STORES."""
        return "postgres" if self.postgres_url else "redis"

    @property
    def amqp(self) -> bool:
        return self.broker == "amqp"

    @property
    def queue(self) -> str:
        return f"bench-{self.tag}" if self.tag else "bench"

    @property
    def broker_url(self) -> str:
        return self.amqp_url if self.amqp else self.bench.url_for(0)

    @property
    def semaphore_url(self) -> str | None:
        """``semaphore_redis_url`` (bench_app's name for ``semaphore_url``, read the same
        way); None: the package's default (the broker's URL)."""
        if self.postgres_url:
            return self.postgres_url
        assert self.semaphore is not None
        return None if self.semaphore is self.bench else self.semaphore.url_for(0)

    @property
    def result_url(self) -> str:
        """The result backend; "" (disabled) with the semaphores in PostgreSQL: no Redis
        anywhere in the plugin's path."""
        return "" if self.postgres_url else self.bench.url_for(1)

    @property
    def declared_key(self) -> str:
        return f"bench:declared:{self.tag}"

    def broker_client(self) -> redis.Redis | None:
        """A client of the broker's Redis (its ``unacked`` hash); None on RabbitMQ."""
        return None if self.amqp else self.bench.client(db=0)

    def semaphore_store(self) -> OperatedStore:
        """The semaphores' store, for reading their counts; the caller closes it."""
        if self.postgres_url:
            return operated_store(self.postgres_url)
        assert self.semaphore is not None
        return operated_store(self.semaphore.url_for(0))

    def servers(self) -> list[RedisServer]:
        """Our redis-servers."""
        if self.semaphore is None or self.semaphore is self.bench:
            return [self.bench]
        return [self.bench, self.semaphore]

    def env(self) -> dict[str, str]:
        return {
            "BENCH_BROKER_URL": self.broker_url,
            "BENCH_SEMAPHORE_URL": self.semaphore_url or "",
            "BENCH_RESULT_URL": self.result_url,
            "BENCH_RECORD_URL": self.bench.url_for(2),
            "BENCH_QUEUE": self.queue,
            "BENCH_CONTROL_EXCHANGE": self.queue if self.amqp else "",
            "BENCH_DECLARED_KEY": self.declared_key if self.amqp else "",
        }

    def describe(self) -> dict[str, Any]:
        postgres = self.store == "postgres"
        redis_args = () if postgres else SEMAPHORE_REDIS_ARGS[self.semaphore_redis]
        return {
            "broker": self.broker,
            "semaphore_store": self.store,
            "semaphore_redis": None if postgres else self.semaphore_redis,
            "semaphore_redis_args": list(redis_args),
            "semaphore_in_broker_redis": self.semaphore is self.bench and not self.amqp,
            "semaphore_postgres": self.postgres_line() if postgres else None,
            "semaphore_postgres_pid": self.postgres_pid,
            "result_backend": "redis db 1" if self.result_url else None,
            "broker_url": self.broker_url.replace("guest:guest@", "guest:***@"),
            "queue": self.queue,
        }

    def postgres_line(self) -> str:
        """Where the semaphores' PostgreSQL is (the URL with its password masked)."""
        assert self.postgres_url is not None
        given = "a cluster of our own" if self.postgres_pid else "given by --postgres-url"
        return f"{mask_url(self.postgres_url)}, {given}"

    def started_line(self) -> str:
        """Where everything runs, for the log and the report."""
        if self.store == "postgres":
            return (
                f"private redis-server on 127.0.0.1:{self.bench.port} (the bench's records "
                f"and the baselines' own semaphores only); broker "
                f"{self.describe()['broker_url']}, semaphore store PostgreSQL at "
                f"{self.postgres_line()}"
                + (f" (postmaster pid {self.postgres_pid})" if self.postgres_pid else "")
                + ", no result backend"
            )
        assert self.semaphore is not None
        return (
            f"private redis-server on 127.0.0.1:{self.bench.port}"
            + (f", the semaphores' on 127.0.0.1:{self.semaphore.port}"
               if self.semaphore is not self.bench else "")
            + f"; broker {self.describe()['broker_url']}, semaphore Redis {self.semaphore_redis}"
        )  # fmt: skip

    def postgres_version(self) -> str | None:
        """The semaphores' PostgreSQL server version (None with the Redis store)."""
        if self.postgres_url is None:
            return None
        import psycopg

        with psycopg.connect(self.postgres_url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return None if row is None else str(row[0])

    @classmethod
    @contextmanager
    def started(
        cls, broker: str, semaphore_redis: str, amqp_url: str,
        *, store: str = "redis", postgres_url: str | None = None,
    ) -> Iterator[Topology]:  # fmt: skip
        """Start our redis-server(s), and our PostgreSQL cluster for ``store`` postgres
        without ``postgres_url``; on leaving, delete what the run declared on RabbitMQ,
        then stop them."""
        args = SEMAPHORE_REDIS_ARGS[semaphore_redis]
        with ExitStack() as stack:
            own = args if broker == "redis" and store == "redis" else ()
            bench = stack.enter_context(RedisServer(*own, die_with_parent=True))
            semaphore: RedisServer | None = bench
            postgres_pid = None
            if store == "postgres":
                from devkit.postgres_servers import PostgresServer  # psycopg: this store only

                semaphore = None
                if postgres_url is None:
                    postgres = stack.enter_context(PostgresServer())
                    postgres_url, postgres_pid = postgres.url, postgres.pid
            elif broker != "redis":
                semaphore = stack.enter_context(RedisServer(*args, die_with_parent=True))
            tag = f"{os.getpid()}-{int(time.time())}" if broker == "amqp" else ""
            topology = cls(
                broker, semaphore_redis, bench, semaphore, amqp_url, tag,
                postgres_url=postgres_url, postgres_pid=postgres_pid,
            )  # fmt: skip
            if topology.amqp:
                stack.callback(topology.delete_amqp_entities)
            yield topology

    def delete_amqp_entities(self) -> None:
        """Delete every queue and exchange of the run on RabbitMQ: the queues named
        after it (with their handover queues), and whatever its processes declared
        with the run's tag in the name (parking queues ``<queue>.semaphore-parked...``,
        pidbox queues and exchanges among them). Names without the tag are left alone
        (another user's, or shared) and listed in ``cleanup["shared_left"]``."""
        from kombu import Connection
        from kombu.exceptions import ChannelError, OperationalError

        with self.bench.client(db=2) as records:
            declared = {m.decode() for m in records.smembers(self.declared_key)}
        queues = {self.queue, f"{self.queue}-plain"}
        exchanges = set(queues)
        shared: list[str] = []
        for entry in declared:
            kind, _, name = entry.partition(":")
            if self.tag not in name:
                shared.append(entry)
            elif kind == "queue":
                queues.add(name)
            else:
                exchanges.add(name)
        queues |= {f"{q}.semaphore-handover" for q in list(queues) if ".semaphore-" not in q}
        left: dict[str, int] = {}
        deleted: list[str] = []
        try:
            with Connection(self.amqp_url, connect_timeout=10) as connection:
                channel = connection.channel()
                for name in sorted(queues):
                    try:
                        _, count, _ = channel.queue_declare(name, passive=True)
                    except ChannelError:  # not there (the channel is closed: a new one)
                        channel = connection.channel()
                        continue
                    if count:
                        left[name] = int(count)
                    channel.queue_delete(name)
                    deleted.append(name)
                for name in sorted(exchanges):
                    channel.exchange_delete(name)
        except (OSError, OperationalError, ChannelError) as exc:
            log(f"RabbitMQ: could not delete the run's queues: {exc!r}; names: {sorted(queues)}")
            self.cleanup["error"] = repr(exc)
        self.cleanup.update(
            queues_deleted=deleted,
            messages_left=left,
            exchanges_deleted=sorted(exchanges),
            shared_left=sorted(shared),
        )
        log(
            f"RabbitMQ: deleted {len(deleted)} queues of the run ({sum(left.values())} "
            f"messages left in them) and {len(exchanges)} exchanges"
            + (f"; declared but shared, left: {sorted(shared)}" if shared else "")
        )


# --------------------------------------------------------------------------- workers


class Workers:
    """K ``celery worker`` processes (devkit.processes: each in a session of its own,
    stopped warm, then SIGKILL to the whole process group)."""

    def __init__(
        self, env: dict[str, str], settings: Settings, log_dir: Path, level: str,
        *, queues: str | None = None, name: str = "bench",
    ) -> None:  # fmt: skip
        self.env = env
        self.settings = settings
        self.level = level
        self.queues = queues
        self.name = name
        self.processes = Processes(log_dir, cwd=HERE)

    @property
    def pids(self) -> list[int]:
        return self.processes.pids()

    def start(self, ready: Callable[[], int]) -> None:
        for i in range(self.settings.workers):
            command = worker_command(
                "bench_app", f"{self.name}{i + 1}", concurrency=self.settings.concurrency,
                loglevel=self.level, queues=self.queues,
            )  # fmt: skip
            self.processes.start(f"{self.name}-worker{i + 1}", command, env=self.env)
        deadline = time.monotonic() + READY_TIMEOUT
        while ready() < self.settings.workers:
            if not all(child.alive() for child in self.processes):
                raise RuntimeError(f"a worker exited at start:\n{self.tails()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"workers not ready after {READY_TIMEOUT:.0f} s:\n{self.tails()}"
                )
            time.sleep(0.05)

    def tails(self, size: int = 3000) -> str:
        return self.processes.tails(size)

    def stop(self) -> None:
        self.processes.stop_all(STOP_TIMEOUT)


# --------------------------------------------------------------------------- figures


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0, "mean": 0.0, "median": 0.0, "max": 0.0, "total": 0.0}
    return {
        "count": len(values),
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "max": max(values),
        "total": sum(values),
    }


def handoff_gaps(intervals: list[tuple[float, float]], limit: int) -> list[float]:
    """Seconds from the (k - L)-th end to the k-th start, for every start after the first L:
    how long the permit a start needed stood free (with L permits, the k-th body can start
    once k - L bodies have ended). 0 in a perfect hand-off."""
    starts = sorted(s for s, _ in intervals)
    ends = sorted(e for _, e in intervals)
    return [starts[k] - ends[k - limit] for k in range(limit, len(starts))]


def analyze(
    records: list[dict[str, Any]], first_submit: float, settings: Settings
) -> dict[str, Any]:
    runs = sorted(records, key=lambda r: (r["start"], r["index"]))
    first_start = runs[0]["start"]
    last_end = max(r["end"] for r in runs)
    span = last_end - first_start
    span_submit = last_end - first_submit
    waits = [float(r["waits"]) for r in runs]
    retries = [float(r["retries"]) for r in runs]
    held = sum(r["end"] - r["start"] for r in runs)
    gaps = handoff_gaps([(r["start"], r["end"]) for r in runs], settings.limit)
    return {
        "tasks_run": len(runs),
        "distinct_tasks": len({r["index"] for r in runs}),
        "makespan_s": span,
        "makespan_from_submit_s": span_submit,
        "efficiency": settings.ideal / span,
        "efficiency_from_submit": settings.ideal / span_submit,
        "peak_overlap": peak_overlap([(r["start"], r["end"]) for r in runs]),
        "kendall_tau": kendall_tau([r["index"] for r in runs]),
        "waits_mean": statistics.fmean(waits),
        "waits_max": max(waits),
        "waits_total": sum(waits),
        "body_retries_mean": statistics.fmean(retries),
        "body_retries_max": max(retries),
        "worker_processes_used": len({r["pid"] for r in runs}),
        "idle_permit_share": max(0.0, 1.0 - held / (settings.limit * span)),
        "first_start_after_submit_s": first_start - first_submit,
        "handoff_gap_s": {
            "median": percentile(gaps, 50) if gaps else 0.0,
            "p90": percentile(gaps, 90) if gaps else 0.0,
            "max": max(gaps, default=0.0),
            "total": sum(gaps),
            "over_50ms": sum(1 for g in gaps if g > 0.05),
            "count": len(gaps),
        },
    }


def in_place(waits: list[dict[str, Any]]) -> dict[str, Any]:
    """Waits in place (worker processes blocked in ``wait_for_turn``)."""
    durations = [w["end"] - w["start"] for w in waits]
    return {
        "count": len(waits),
        "granted": sum(1 for w in waits if w["granted"]),
        "process_seconds": sum(durations),
        "mean_s": statistics.fmean(durations) if durations else 0.0,
        "max_s": max(durations, default=0.0),
        "peak_processes": peak_overlap([(w["start"], w["end"]) for w in waits]),
    }


# --------------------------------------------------------------------------- phases


class Sampler:
    """Reads the semaphore's counts every 20 ms from a thread: holders vs waiters over
    time. The counts (as a metrics scrape reads them: counts.lua on Redis, one query on
    PostgreSQL), not ``status()``: with a line of 3,000 a ``status()`` call kept Redis
    busy for 4-8 ms (it reads up to 1,000 waiters' records), 50 times a second, and the
    hand-offs it delayed were counted against the semaphore it watched."""

    def __init__(self, store: OperatedStore, name: str) -> None:
        self.store, self.name = store, name
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        from celery_semaphore.core.protocol import DEFAULT_NAMESPACE

        while not self._stop.wait(SAMPLE_EVERY):
            found = self.store.counts(DEFAULT_NAMESPACE, [self.name])
            holders, waiters = (found[0].holder_count, found[0].waiter_count) if found else (0, 0)
            self.samples.append((time.time(), holders, waiters))

    @contextmanager
    def running(self) -> Iterator[Sampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()

    def summary(self, begin: float, end: float, limit: int) -> dict[str, Any]:
        inside = [s for s in self.samples if begin <= s[0] <= end]
        if not inside:
            return {"samples": 0}
        short = [s for s in inside if s[1] < limit and s[2] > 0]
        return {
            "samples": len(inside),
            "holders_mean": statistics.fmean(s[1] for s in inside),
            "holders_max": max(s[1] for s in inside),
            "waiters_max": max(s[2] for s in inside),
            "share_free_permit_while_waiting": len(short) / len(inside),
        }


def descendants(pids: list[int]) -> list[int]:
    """``pids`` and every process below them (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError, ValueError, IndexError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


class BacklogSampler:
    """Every 100 ms: waiting tasks the workers hold (on a Redis broker the transport's
    ``unacked`` hash: messages delivered and not acked, ETA retries among them) and the
    workers' total RSS (main processes and pool children). With ``app`` (always on
    RabbitMQ, which has no such hash to read), every ``every`` s as well: the
    messages each worker holds as ``inspect().reserved()`` + ``.scheduled()`` count
    them (bench_app's ``bench_held`` command: the counts without the lists), asked of
    ``destination`` only."""

    def __init__(
        self, broker: redis.Redis | None, workers: Workers,
        *, app: Any = None, destination: list[str] | None = None, every: float = INSPECT_EVERY,
    ) -> None:  # fmt: skip
        self.broker = broker
        self.workers = workers
        self.app, self.destination, self.every = app, destination or [], every
        self.unacked: list[int] = []
        self.rss: list[int] = []
        self.held: list[tuple[float, int, int, int]] = []  # (time, reserved, scheduled, replies)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name="bench-backlog", daemon=True)]
        if app is not None:
            self._threads.append(
                threading.Thread(target=self._inspect, name="bench-inspect", daemon=True)
            )

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            if self.broker is not None:
                self.unacked.append(int(self.broker.hlen("unacked")))
            self.rss.append(rss_bytes(descendants(self.workers.pids)))

    def _inspect(self) -> None:
        while True:  # the first sample at once, then every self.every s
            try:
                replies = self.app.control.broadcast(
                    "bench_held", reply=True, destination=self.destination,
                    limit=len(self.destination), timeout=min(self.every, 1.0),
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001: a sample lost is no reason to stop
                log(f"inspect sample failed: {exc!r}")
                replies = []
            counts = [c for reply in replies for c in reply.values() if isinstance(c, dict)]
            self.held.append((
                time.time(),
                sum(int(c.get("reserved", 0)) for c in counts),
                sum(int(c.get("scheduled", 0)) for c in counts),
                len(counts),
            ))  # fmt: skip
            if self._stop.wait(self.every):
                return

    @contextmanager
    def running(self) -> Iterator[BacklogSampler]:
        for thread in self._threads:
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"workers_rss_peak_mib": max(self.rss, default=0) / 2**20}
        complete = [h for h in self.held if h[3] == len(self.destination)]
        if self.app is not None:
            out["inspect_held"] = {
                "every_s": self.every,
                "samples": len(self.held),
                "complete_samples": len(complete),  # every worker answered
                "peak": max((h[1] + h[2] for h in self.held), default=0),
                "reserved_peak": max((h[1] for h in self.held), default=0),
                "scheduled_peak": max((h[2] for h in self.held), default=0),
            }
        if self.broker is not None:
            out["held_by_workers_peak"] = max(self.unacked, default=0)
            out["held_by_workers_source"] = "unacked hash, every 0.1 s"
        elif self.app is not None:
            out["held_by_workers_peak"] = out["inspect_held"]["peak"]
            source = f"inspect reserved + scheduled, every {self.every:g} s"
            out["held_by_workers_source"] = source
        else:  # RabbitMQ with --inspect-every 0: not measured
            out["held_by_workers_peak"] = None
            out["held_by_workers_source"] = None
        return out


def run_capped(
    bench: ModuleType,
    kind: str,
    settings: Settings,
    records: redis.Redis,
    store: OperatedStore,
    *,
    raw: dict[str, Any],
) -> dict[str, Any]:
    """N tasks of H seconds under the cap; figures from the bodies' own records. The
    tasks' results say when they are done; with no result backend, their records do
    (then a task that failed is missed: `STALL_TIMEOUT`, and the worker logs)."""
    task = getattr(bench, kind)
    key = bench.records_key(kind)
    records.delete(key, bench.INPLACE_KEY, bench.WAITING_KEY)
    sampler = Sampler(store, bench.OURS) if kind == "ours" else None
    timeout = max(60.0, 20 * settings.ideal)
    with sampler.running() if sampler else _nothing():
        first_submit = time.time()
        with bench.app.producer_or_acquire() as producer:
            results = [
                task.apply_async((i, settings.hold), producer=producer)
                for i in range(settings.tasks)
            ]
        submitted = time.time()
        await_tasks(bench, kind, results, records=records, key=key, timeout=timeout)
    runs = [json.loads(r) for r in records.lrange(key, 0, -1)]
    figures = analyze(runs, first_submit, settings)
    figures["submit_s"] = submitted - first_submit
    raw[kind] = {"first_submit": first_submit, "submitted": submitted, "runs": runs}
    if kind == "ours":
        waits = [json.loads(r) for r in records.lrange(bench.INPLACE_KEY, 0, -1)]
        sent_back = [json.loads(r) for r in records.lrange(bench.WAITING_KEY, 0, -1)]
        figures["in_place"] = in_place(waits)
        figures["countdowns"] = _stats(
            [float(w["countdown"]) for w in sent_back if w["countdown"] is not None]
        )
        figures["sent_back_positions"] = _stats([float(w["position"]) for w in sent_back])
        assert sampler is not None
        last_end = first_submit + figures["makespan_from_submit_s"]
        figures["sampled"] = sampler.summary(
            last_end - figures["makespan_s"], last_end, settings.limit
        )
        raw[kind].update(in_place=waits, sent_back=sent_back, samples=sampler.samples)
    else:
        figures["in_place"] = in_place([])
    return figures


def await_tasks(
    bench: ModuleType, kind: str, results: list[Any],
    *, records: redis.Redis, key: str, timeout: float,
) -> None:  # fmt: skip
    """Wait (at most ``timeout`` s) until the tasks of ``results`` have run and their
    bodies' records are in the list ``key``: by their results (a task that failed
    raises here), then their records; with no result backend (the PostgreSQL store), by
    their records alone: then a task that failed is missed, and RuntimeError after
    `STALL_TIMEOUT` s without a new record (the worker logs say why)."""
    if has_results(bench):
        deadline = time.monotonic() + timeout
        for result in results:
            result.get(timeout=max(0.1, deadline - time.monotonic()), propagate=True)
            result.forget()
        # A body's record is written after its task ends (task_postrun), which Celery
        # sends after it stored the result: the last records may still be on their way.
        wait_for_records(records, key, len(results), 5.0)
        return
    done = wait_for_records(records, key, len(results), timeout, stall=STALL_TIMEOUT)
    if done < len(results):
        raise RuntimeError(
            f"{kind}: {done} of {len(results)} tasks recorded (none new for "
            f"{STALL_TIMEOUT:.0f} s, or {timeout:.0f} s in all); with no result "
            "backend a task that failed shows in the worker logs only"
        )


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def has_results(bench: ModuleType) -> bool:
    """Whether the bench app has a result backend (none with the PostgreSQL store)."""
    from celery.backends.base import DisabledBackend

    return not isinstance(bench.app.backend, DisabledBackend)


def wait_for_records(
    records: redis.Redis, key: str, count: int, timeout: float, *, stall: float | None = None
) -> int:
    """Wait until the list ``key`` holds ``count`` records, at most ``timeout`` s (and at
    most ``stall`` s without a new one); how many it holds."""
    deadline = time.monotonic() + timeout
    done, last_change = int(records.llen(key)), time.monotonic()
    while done < count:
        now = time.monotonic()
        if now > deadline or (stall is not None and now - last_change > stall):
            break
        time.sleep(0.01)
        seen = int(records.llen(key))
        if seen > done:
            done, last_change = seen, time.monotonic()
    return done


def process_cpu(pid: int, *, children: bool = True) -> float:
    """CPU seconds (user + system) of a process and, by default, of its live children
    (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split() if children else []
    except (OSError, IndexError, ValueError):
        return 0.0
    return own + sum(process_cpu(int(kid)) for kid in kids)


class CpuMeter:
    """CPU seconds spent by the workers (all processes), our redis-server(s) (not a
    RabbitMQ broker's), our PostgreSQL cluster (``postmaster``: its pid, with its live
    backends) and this script."""

    def __init__(
        self, workers: Workers, servers: list[redis.Redis], postmaster: int | None = None
    ) -> None:
        self.workers = workers
        self.servers = servers
        self.postmaster = postmaster

    def read(self) -> dict[str, float]:
        cpus = [server.info("cpu") for server in self.servers]
        main = sum(process_cpu(pid, children=False) for pid in self.workers.pids)
        read = {
            "workers": sum(process_cpu(pid) for pid in self.workers.pids),
            "worker_main": main,
            "redis": sum(float(c["used_cpu_user"]) + float(c["used_cpu_sys"]) for c in cpus),
            "client": time.process_time(),
        }
        if self.postmaster is not None:
            read["postgres"] = process_cpu(self.postmaster)
        return read


class StoreCalls:
    """Counts the calls made to the semaphores' store, by every client of it (pool
    processes, keeper threads, the workers' main processes).

    Redis: the ``calls`` of `SCRIPT_COMMANDS` in ``INFO commandstats``. PostgreSQL: the
    calls of its functions in ``pg_stat_user_functions``, if the cluster tracks them
    (``track_functions`` not ``none``; the script's own cluster does not: then
    `read` answers None and `source` says why); a backend reports its counts when it
    goes idle, at most once a second, so a round's count there is approximate."""

    def __init__(self, where: Topology) -> None:
        self.redis = where.semaphore.client() if where.semaphore is not None else None
        self.postgres: Any = None
        if self.redis is not None:
            self.source = f"redis INFO commandstats: {', '.join(SCRIPT_COMMANDS)}"
            return
        assert where.postgres_url is not None
        import psycopg

        conn = psycopg.connect(where.postgres_url, autocommit=True, connect_timeout=10)
        row = conn.execute("SHOW track_functions").fetchone()
        tracked = None if row is None else str(row[0])
        if tracked in (None, "none"):
            conn.close()
            self.source = f"n/a: PostgreSQL track_functions = {tracked}"
        else:
            self.postgres = conn
            self.source = f"PostgreSQL pg_stat_user_functions (track_functions = {tracked})"

    def read(self) -> int | None:
        """The calls so far (None: not counted)."""
        if self.redis is not None:
            stats = self.redis.info("commandstats")
            return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in SCRIPT_COMMANDS)
        if self.postgres is not None:
            self.postgres.execute("SELECT pg_stat_clear_snapshot()")
            row = self.postgres.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
            ).fetchone()
            return None if row is None else int(row[0])
        return None

    def close(self) -> None:
        if self.redis is not None:
            self.redis.close()
        if self.postgres is not None:
            self.postgres.close()


def run_noop_round(
    bench: ModuleType,
    kind: str,
    count: int,
    records: redis.Redis,
    tag: str,
    *,
    meter: CpuMeter | None = None,
    calls: StoreCalls | None = None,
) -> dict[str, Any]:
    """Throughput (tasks/s) from the first submit to the last task's own end stamp, the
    CPU milliseconds per task spent by the workers, the Redis server and the client, and
    the store calls per task (`StoreCalls`: None when they are not counted)."""
    task = getattr(bench, f"noop_{kind}")
    counter = f"bench:noop:{tag}"
    records.delete(counter, f"{counter}:last")
    before = meter.read() if meter else {}
    calls_before = calls.read() if calls else None
    begin = time.time()
    with bench.app.producer_or_acquire() as producer:
        for i in range(count):
            task.apply_async((i, count, counter), producer=producer)
    submitted = time.time()
    deadline = time.monotonic() + max(60.0, count / 20)
    while True:
        last = records.get(f"{counter}:last")
        if last is not None:
            break
        if time.monotonic() > deadline:
            done = int(records.get(counter) or 0)
            raise RuntimeError(f"no-op {kind}: only {done} of {count} ran in time")
        time.sleep(0.01)
    after = meter.read() if meter else {}
    calls_after = calls.read() if calls else None
    store_calls = (
        None if calls_before is None or calls_after is None else calls_after - calls_before
    )
    return {
        "per_s": count / (float(last) - begin),
        "submit_s": submitted - begin,
        "cpu_ms_per_task": {k: 1000 * (after[k] - before[k]) / count for k in after},
        "store_calls": store_calls,
        "store_calls_per_task": None if store_calls is None else store_calls / count,
        "begin": begin,
        "end": float(last),
    }


def run_noop(
    bench: ModuleType,
    settings: Settings,
    records: redis.Redis,
    meter: CpuMeter,
    calls: StoreCalls | None = None,
) -> dict[str, Any]:
    """Interleaved rounds of the `NOOP_KINDS`, the order rotated each round (no kind
    always first); medians over the rounds. ``noop_kept`` is warmed up here, just
    before (its permits are kept `bench_app.NOOP_KEEP_IDLE` s only)."""
    warmed = warm_up(bench, settings, records, kinds=("kept",))
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in NOOP_KINDS}
    last_kept_end = warmed["kept"]
    for r in range(settings.noop_rounds):
        shift = r % len(NOOP_KINDS)
        order = NOOP_KINDS[shift:] + NOOP_KINDS[:shift]
        for position, kind in enumerate(order):
            figures = run_noop_round(
                bench, kind, settings.noop_tasks, records, f"{kind}{r}", meter=meter, calls=calls
            )  # fmt: skip
            figures["position"] = position
            if kind == "kept":  # how long the permits kept before stood idle
                figures["idle_before_s"] = figures["begin"] - last_kept_end
                last_kept_end = figures["end"]
            rounds[kind].append(figures)

    def median(kind: str, key: str, sub: str | None = None) -> float:
        return statistics.median(x[key][sub] if sub else x[key] for x in rounds[kind])

    def calls_median(kind: str) -> float | None:
        counted = [x["store_calls_per_task"] for x in rounds[kind]]
        return None if None in counted else statistics.median(counted)

    plain, limited, kept = (median(kind, "per_s") for kind in NOOP_KINDS)
    parts = CPU_PARTS + (("postgres",) if meter.postmaster is not None else ())
    calls_per_task = {kind: calls_median(kind) for kind in NOOP_KINDS}
    kept_calls = calls_per_task["kept"]
    return {
        "tasks": settings.noop_tasks,
        "rounds": settings.noop_rounds,
        "plain_per_s": plain,
        "limited_per_s": limited,
        "kept_per_s": kept,
        "ratio": limited / plain,
        "kept_ratio": kept / plain,
        "keep_idle_s": bench.NOOP_KEEP_IDLE,
        "store_calls_per_task": calls_per_task,
        "store_calls_source": calls.source if calls else "n/a: not counted",
        "verdicts": {
            "noop_ratio": limited / plain >= TARGETS["noop_ratio_min"],
            "noop_kept_ratio": kept / plain >= TARGETS["noop_kept_ratio_min"],
            "noop_kept_calls": (
                None if kept_calls is None else kept_calls <= TARGETS["noop_kept_calls_max"]
            ),
        },
        "cpu_ms_per_task": {
            kind: {part: median(kind, "cpu_ms_per_task", part) for part in parts} for kind in rounds
        },
        "submit_s": {kind: median(kind, "submit_s") for kind in rounds},
        "plain_rounds": rounds["plain"],
        "limited_rounds": rounds["limited"],
        "kept_rounds": rounds["kept"],
    }


def warm_up(
    bench: ModuleType,
    settings: Settings,
    records: redis.Redis,
    *,
    kinds: tuple[str, ...] = ("plain", "limited"),
) -> dict[str, float]:
    """Every pool process imports, connects and runs a task of each kind once or so;
    when each kind's last task ended."""
    return {
        kind: run_noop_round(bench, kind, settings.warmup, records, f"warmup-{kind}")["end"]
        for kind in kinds
    }


# --------------------------------------------------------------------------- report


def gap_cell(figures: dict[str, Any]) -> str:
    gaps = figures["handoff_gap_s"]
    return f"{gaps['median'] * 1000:.0f} / {gaps['p90'] * 1000:.0f}"


def store_phrase(results: dict[str, Any]) -> str:
    """Which store the semaphores were in, for the reports' first lines."""
    where = results["topology"]
    if results["semaphore_store"] == "postgres":
        version = results["environment"]["postgres_server"]
        return (
            f"semaphore store PostgreSQL {version} ({where['semaphore_postgres']}), no result "
            "backend; baseline on the bench's redis-server"
        )
    return f"semaphore store Redis ({results['semaphore_redis']})"


def print_report(results: dict[str, Any]) -> None:
    s = results["settings"]
    ours, base = results["ours"], results["baseline"]
    env = results["environment"]
    ideal = s["tasks"] * s["hold"] / s["limit"]
    print(
        f"celery end to end: N={s['tasks']} tasks x H={s['hold']} s under L={s['limit']}, "
        f"K={s['workers']} workers x C={s['concurrency']} prefork processes, prefetch "
        f"multiplier {s['prefetch_multiplier']}{', acks_late' if s['acks_late'] else ''}, "
        f"{keep_idle_phrase(s)} (ideal {ideal:.2f} s); broker {results['broker']}, "
        f"{store_phrase(results)}"
    )
    print(
        f"celery {env['celery']}, redis-server {env['redis_server']} (private), "
        f"redis-py {env['redis_py']}, py-redis-semaphore {env['py_redis_semaphore']}, "
        f"Python {env['python']}, {env['cpus']} CPUs, load average "
        f"{env['load_average_1min'][0]:.1f} before / {env['load_average_1min'][1]:.1f} after"
    )
    print(
        f"baseline: py-redis-semaphore acquire(blocking=False) in a plain task, refused -> "
        f"self.retry(countdown=uniform(0, min({s['backoff_max']:g}, "
        f"{s['backoff_base']:g} * 2**retries)))"
    )
    print()
    rows: list[tuple[str, str, str, str]] = [
        ("figure", "ours", "baseline", "target (ours)"),
        ("makespan, first start..last end (s)", f"{ours['makespan_s']:.2f}",
         f"{base['makespan_s']:.2f}", f"ideal {ideal:.2f}"),
        ("makespan, first submit..last end (s)", f"{ours['makespan_from_submit_s']:.2f}",
         f"{base['makespan_from_submit_s']:.2f}", ""),
        ("efficiency (ideal / makespan)", f"{ours['efficiency']:.3f}",
         f"{base['efficiency']:.3f}",
         f">= {TARGETS['efficiency_min']:.2f}  {verdict(ours['efficiency'] >= TARGETS['efficiency_min'])}"),  # noqa: E501
        ("efficiency from first submit", f"{ours['efficiency_from_submit']:.3f}",
         f"{base['efficiency_from_submit']:.3f}", ""),
        ("peak overlap (from the bodies' times)", str(ours["peak_overlap"]),
         str(base["peak_overlap"]),
         f"= {s['limit']}  {verdict(ours['peak_overlap'] == s['limit'])}"),
        ("Kendall tau, start vs submit order", f"{ours['kendall_tau']:.3f}",
         f"{base['kendall_tau']:.3f}",
         f">= {TARGETS['kendall_tau_min']:.2f}  {verdict(ours['kendall_tau'] >= TARGETS['kendall_tau_min'])}"),  # noqa: E501
        ("waits (retries for a permit) / task, mean",
         f"{ours['waits_mean']:.2f}", f"{base['waits_mean']:.2f}",
         f"<= {TARGETS['retries_mean_max']:.0f}  {verdict(ours['waits_mean'] <= TARGETS['retries_mean_max'])}"),  # noqa: E501
        ("waits / task, max (total)", f"{ours['waits_max']:.0f} ({ours['waits_total']:.0f})",
         f"{base['waits_max']:.0f} ({base['waits_total']:.0f})", ""),
        ("request.retries seen by the body, mean", f"{ours['body_retries_mean']:.2f}",
         f"{base['body_retries_mean']:.2f}", ""),
        ("waits in place (granted)",
         f"{ours['in_place']['count']} ({ours['in_place']['granted']})", "0", ""),
        ("processes blocked in place: peak, proc-s",
         f"{ours['in_place']['peak_processes']}, {ours['in_place']['process_seconds']:.2f}",
         "0, 0.00", ""),
        ("hand-off gap, release -> next start: median / p90 (ms)",
         gap_cell(ours), gap_cell(base), ""),
        ("hand-offs over 50 ms (of)",
         f"{ours['handoff_gap_s']['over_50ms']} ({ours['handoff_gap_s']['count']})",
         f"{base['handoff_gap_s']['over_50ms']} ({base['handoff_gap_s']['count']})", ""),
        ("idle permit share (1 - busy / (L x span))", f"{ours['idle_permit_share']:.3f}",
         f"{base['idle_permit_share']:.3f}", ""),
        ("tasks run / distinct", f"{ours['tasks_run']} / {ours['distinct_tasks']}",
         f"{base['tasks_run']} / {base['distinct_tasks']}", f"{s['tasks']} / {s['tasks']}"),
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) if i < 3
                        else cell for i, cell in enumerate(row)).rstrip())  # fmt: skip
        if n == 0:
            print("  ".join("-" * w for w in widths))
    cd, sampled = ours["countdowns"], ours.get("sampled", {})
    print(
        f"\nours, sent back to wait: {cd['count']} times, countdown mean {cd['mean']:.2f} s, "
        f"median {cd['median']:.2f} s, max {cd['max']:.2f} s; "
        f"in-place waits mean {ours['in_place']['mean_s'] * 1000:.0f} ms, "
        f"max {ours['in_place']['max_s'] * 1000:.0f} ms"
    )
    if sampled.get("samples"):
        print(
            f"ours, counts every {SAMPLE_EVERY * 1000:.0f} ms ({sampled['samples']} samples): "
            f"holders mean {sampled['holders_mean']:.2f}, max {sampled['holders_max']}; "
            f"a permit free while someone waits in {sampled['share_free_permit_while_waiting']:.1%}"
            " of samples"
        )
    print(f"(baseline measured elsewhere: {BASELINE_MEASURED})")
    print_noop(results)


def print_noop(results: dict[str, Any]) -> None:
    """The no-op phase's part of the report: plain, limited and kept side by side."""
    s, noop = results["settings"], results["noop"]
    print(
        f"\nno-op overhead: {noop['tasks']} tasks x {noop['rounds']} interleaved rounds "
        f"(medians; first submit .. last task done)"
    )
    cpu = noop["cpu_ms_per_task"]
    labels = (("plain", "plain task"), ("limited", "LimitedTask"), ("kept", "kept permits"))
    for kind, label in labels:
        print(
            f"  {label:<12} {noop[kind + '_per_s']:7.0f} tasks/s   CPU ms per task: workers "
            f"{cpu[kind]['workers']:.2f} (main processes {cpu[kind]['worker_main']:.2f}), "
            f"redis-server {cpu[kind]['redis']:.2f}, "
            + (f"postgres {cpu[kind]['postgres']:.2f}, " if "postgres" in cpu[kind] else "")
            + f"client {cpu[kind]['client']:.2f} (submit {noop['submit_s'][kind]:.2f} s)"
        )
    idle = ", ".join(f"{r['idle_before_s']:.1f}" for r in noop["kept_rounds"])
    print(
        f"  (LimitedTask limit {s['noop_limit']}: never binds; kept permits: a LimitedTask "
        f"of the same limit, semaphore_keep_idle={noop['keep_idle_s']:g} s; from its last "
        f"task's end to each of its rounds' first submit: {idle} s)"
    )

    def calls_cell(kind: str) -> str:
        median = noop["store_calls_per_task"][kind]
        if median is None:
            return f"{kind} n/a"
        each = ", ".join(f"{r['store_calls_per_task']:.3f}" for r in noop[kind + "_rounds"])
        return f"{kind} {median:.3f} (rounds: {each})"

    print(
        f"  script calls per task ({noop['store_calls_source']}; median): "
        + "; ".join(calls_cell(kind) for kind in NOOP_KINDS)
    )
    print(
        f"  ratio limited/plain  {noop['ratio']:.3f}   target >= {TARGETS['noop_ratio_min']:.2f}"
        f"  {verdict(noop['ratio'] >= TARGETS['noop_ratio_min'])}"
    )
    print(
        f"  ratio kept/plain     {noop['kept_ratio']:.3f}   target >= "
        f"{TARGETS['noop_kept_ratio_min']:.2f}  {verdict(noop['verdicts']['noop_kept_ratio'])}"
    )
    kept_calls = noop["store_calls_per_task"]["kept"]
    print(
        "  kept script calls per task  "
        + ("n/a" if kept_calls is None else f"{kept_calls:.3f}")
        + f"   target <= {TARGETS['noop_kept_calls_max']:.2f}  "
        + ("n/a" if kept_calls is None else verdict(noop["verdicts"]["noop_kept_calls"]))
    )


def print_backlog(results: dict[str, Any]) -> None:
    s, figures, t = results["backlog_settings"], results["backlog"], BACKLOG_TARGETS
    print(
        f"\nbacklog: N={s['tasks']} x H={s['hold']} s under L={s['limit']}, "
        f"K={s['workers']} x C={s['concurrency']} prefork, prefetch multiplier "
        f"{s['prefetch_multiplier']}{', acks_late' if s['acks_late'] else ''}, "
        f"{keep_idle_phrase(s)} (ideal {s['ideal_s']:.1f} s); broker {results['broker']}, "
        f"{store_phrase(results)}"
    )
    modes = [figures[k] for k in BACKLOG_MODES]
    ours, base = figures["ours"], figures["baseline"]
    held_max = t["held_by_workers_max_per_limit"] * s["limit"]

    def row(label: str, cell: Callable[[dict[str, Any]], str], target: str = "") -> list[str]:
        return [label, *(cell(m) for m in modes), target]

    rows = [
        ["figure", *(LABELS[k] for k in BACKLOG_MODES), "target (handover)"],
        row("efficiency", lambda m: f"{m['efficiency']:.3f}",
            f">= {t['efficiency_min']:.2f} and > baseline  "
            f"{verdict(ours['efficiency'] >= t['efficiency_min'] and ours['efficiency'] > base['efficiency'])}"),  # noqa: E501
        row("makespan (s)", lambda m: f"{m['makespan_s']:.1f}", f"ideal {s['ideal_s']:.1f}"),
        row("submit, the N apply_async (s)", lambda m: f"{m['submit_s']:.1f}",
            "(bench_submit.py: without workers)"),
        row("waits / task, mean (max)", lambda m: f"{m['waits_mean']:.2f} ({m['waits_max']:.0f})",
            f"<= {t['waits_mean_max']}  {verdict(ours['waits_mean'] <= t['waits_mean_max'])}"),
        row("Kendall tau", lambda m: f"{m['kendall_tau']:.3f}",
            f">= {t['kendall_tau_min']}  {verdict(ours['kendall_tau'] >= t['kendall_tau_min'])}"),
        row("peak overlap", lambda m: str(m["peak_overlap"]),
            f"= {s['limit']}  {verdict(ours['peak_overlap'] == s['limit'])}"),
        row("release -> next start, median / p90 (ms)", gap_cell),
        row("waiting tasks held by workers, peak", lambda m: str(m["held_by_workers_peak"]),
            f"<= {held_max}  {verdict((ours['held_by_workers_peak'] or 0) <= held_max)}"
            if ours["held_by_workers_peak"] is not None else f"<= {held_max}  (not sampled)"),
        row("workers' RSS, peak (MiB)", lambda m: f"{m['workers_rss_peak_mib']:.0f}",
            "within 10% at N=12,000 (--backlog-n)"),
        row("tasks run / distinct", lambda m: f"{m['tasks_run']} / {m['distinct_tasks']}",
            f"{s['tasks']} / {s['tasks']}"),
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, cells in enumerate(rows):
        last = len(cells) - 1  # the target column, left as it is
        print("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) if i < last else c
                        for i, c in enumerate(cells)).rstrip())  # fmt: skip
        if n == 0:
            print("  ".join("-" * w for w in widths))


# --------------------------------------------------------------------------- main


def topology_line(where: dict[str, Any], rabbitmq: str | None, postgres: str | None) -> str:
    """The report's line on where a run ran, from ``Topology.describe()``, the RabbitMQ
    version (None on a Redis broker) and the PostgreSQL one (None with the Redis store)."""
    broker = (
        f"broker {where['broker']} ({where['broker_url']}"
        + (f", RabbitMQ {rabbitmq}" if rabbitmq else "")
        + ")"
    )
    if where["semaphore_store"] == "postgres":
        return (
            f"{broker}, semaphore store PostgreSQL {postgres} ({where['semaphore_postgres']}), "
            "no result backend: no Redis in the plugin's path"
        )
    return (
        f"{broker}, semaphore store Redis: "
        + ("the broker's redis-server" if where["semaphore_in_broker_redis"]
           else "a redis-server of their own")
        + f", {where['semaphore_redis']}"
        + (f" ({shlex.join(where['semaphore_redis_args'])})" if where["semaphore_redis_args"]
           else "")
    )  # fmt: skip


def started_topology(args: argparse.Namespace) -> AbstractContextManager[Topology]:
    """`Topology.started()` as the arguments of `add_topology_arguments()` ask."""
    return Topology.started(
        args.broker, args.semaphore_redis, args.amqp_url,
        store=args.semaphore_store, postgres_url=args.postgres_url,
    )  # fmt: skip


def add_topology_arguments(parser: argparse.ArgumentParser) -> None:
    """``--broker``, ``--amqp-url``, ``--semaphore-redis``, ``--semaphore-store`` and
    ``--postgres-url``, as every end-to-end benchmark takes them (bench_fair.py and
    bench_rate.py import this); `check_topology_arguments()` checks them together."""
    parser.add_argument(
        "--broker", choices=BROKERS, default="redis",
        help="redis: a redis-server of our own, the semaphores in it too (the package's "
        f"default); amqp: RabbitMQ ({AMQP_URL.replace('guest:guest@', 'guest@')}), the "
        "semaphores in a redis-server of their own; redis-separate: the broker and the "
        "semaphores in two redis-servers of our own",
    )  # fmt: skip
    parser.add_argument(
        "--amqp-url",
        help=f"RabbitMQ for --broker amqp (default {AMQP_URL}); the run's queues and "
        "exchanges get names of their own and are deleted at the end",
    )
    parser.add_argument(
        "--semaphore-redis", choices=tuple(SEMAPHORE_REDIS_ARGS), default="plain",
        help="the semaphores' redis-server (the broker's with --broker redis): plain "
        "(appendonly no, save ''), aof (appendonly yes), no-config (no persistence, "
        "CONFIG renamed away as on managed services)",
    )  # fmt: skip
    parser.add_argument(
        "--semaphore-store", choices=STORES, default="redis",
        help="where the semaphores are: redis (see --broker, --semaphore-redis), or "
        "postgres (semaphore_url = postgresql://...; with --broker amqp only): a "
        "PostgreSQL cluster of our own on a free loopback port, or --postgres-url; no "
        "result backend then, so that no Redis is in the plugin's path",
    )  # fmt: skip
    parser.add_argument(
        "--postgres-url",
        help="with --semaphore-store postgres: this database instead of a cluster of our "
        "own (the semaphores bench-* of namespace celery_semaphore; state left there by "
        "a run that was killed counts until its leases run out)",
    )


def add_keep_idle_argument(parser: argparse.ArgumentParser) -> None:
    """``--keep-idle SECONDS``, as bench_celery.py and bench_fair.py take it."""
    parser.add_argument(
        "--keep-idle", type=float, default=0.0, metavar="SECONDS",
        help="the workers' semaphore_keep_idle (default 0: off, the package's default): a "
        "pool process keeps its permit between tasks while nobody waits (every "
        "LimitedTask of the bench app; the no-op phase's noop_limited stays without)",
    )  # fmt: skip


def check_keep_idle_argument(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.keep_idle >= 0:  # NaN too
        parser.error("--keep-idle must be 0 (off) or more seconds")


def keep_idle_phrase(settings: dict[str, Any]) -> str:
    """The workers' kept permits, for the reports' first lines."""
    seconds = settings.get("keep_idle", 0.0)
    return f"semaphore_keep_idle {seconds:g} s" if seconds else "no kept permits"


def check_topology_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (``parser.error``) what `add_topology_arguments()` accepts one by one but
    cannot run together; ``args.amqp_url`` gets its default."""
    if args.amqp_url is not None and args.broker != "amqp":
        parser.error(f"--amqp-url is for --broker amqp (this run's broker: {args.broker})")
    args.amqp_url = args.amqp_url or AMQP_URL
    if not args.amqp_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        parser.error(f"--amqp-url must be an amqp:// URL, not {args.amqp_url!r}")
    if args.semaphore_store == "postgres":
        if args.broker != "amqp":
            parser.error(
                "--semaphore-store postgres runs with --broker amqp only (with a Redis "
                "broker, Redis would be in the plugin's path)"
            )
        if args.semaphore_redis != "plain":
            parser.error("--semaphore-redis is for --semaphore-store redis")
    if args.postgres_url is not None:
        if args.semaphore_store != "postgres":
            parser.error("--postgres-url is for --semaphore-store postgres")
        if not is_postgres_url(args.postgres_url):
            given = mask_url(args.postgres_url)
            parser.error(f"--postgres-url must be a postgresql:// URL, not {given!r}")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument("-n", "--tasks", type=int, help="N, tasks per contended phase")
    parser.add_argument("--hold", type=float, help="H, seconds each task holds its permit")
    parser.add_argument("-l", "--limit", type=int, help="L, the cap")
    parser.add_argument("-k", "--workers", type=int, help="K, celery worker processes")
    parser.add_argument("-c", "--concurrency", type=int, help="C, pool processes per worker")
    parser.add_argument("--noop-tasks", type=int, help="no-op tasks per round")
    parser.add_argument("--noop-rounds", type=int, help="interleaved no-op rounds")
    parser.add_argument("--backoff-base", type=float, help="baseline backoff base (s)")
    parser.add_argument("--backoff-max", type=float, help="baseline backoff cap (s)")
    parser.add_argument(
        "--skip", action="append", default=[],
        choices=["ours", "baseline", "noop", "countdown", "plain"],
        help="skip a phase (ours = handover; countdown, plain: the backlog's countdown "
        "phase and its plain tasks on L processes); then the figures are printed as JSON "
        "(followed by the no-op phase's report when it ran)",
    )  # fmt: skip
    parser.add_argument(
        "--prime",
        action="store_true",
        help="run 2 L tasks through ours first, so it starts with a hold-time estimate",
    )
    parser.add_argument(
        "--scenario", choices=["today", "backlog", "both"], default="both",
        help="today's (N=120, H=0.2, 2x8) with the no-op phase, the backlog one "
        "(N=3000, H=0.05, 2x4; handover vs countdown vs baseline), or both",
    )  # fmt: skip
    parser.add_argument("--backlog-n", type=int, help="N of the backlog scenario (3000)")
    parser.add_argument(
        "--prefetch-multiplier", type=int,
        help="the workers' worker_prefetch_multiplier, both scenarios (Celery's default: 4)",
    )  # fmt: skip
    parser.add_argument(
        "--acks-late", action="store_true", help="task_acks_late for every task, both scenarios"
    )
    add_keep_idle_argument(parser)
    add_topology_arguments(parser)
    parser.add_argument(
        "--inspect-held", action="store_true",
        help="on a Redis broker, also sample the messages the workers hold with inspect "
        "(reserved + scheduled; always so with --broker amqp)",
    )  # fmt: skip
    parser.add_argument(
        "--inspect-every", type=float, default=INSPECT_EVERY, metavar="SECONDS",
        help=f"seconds between two inspect samples (default {INSPECT_EVERY:g}); 0: none, "
        "so on RabbitMQ the messages held are not measured (to see what sampling costs)",
    )  # fmt: skip
    parser.add_argument("--worker-loglevel", default="warning")
    parser.add_argument("--log-dir", type=Path, help="keep the worker logs in this directory")
    parser.add_argument(
        "--dump", type=Path, help="write every record (bodies, waits, samples) to this JSON file"
    )
    args = parser.parse_args(argv)
    if args.inspect_every < 0:
        parser.error("--inspect-every must be 0 (no sampling) or more")
    if args.inspect_held and args.inspect_every == 0:
        parser.error("--inspect-held samples with inspect: it needs --inspect-every > 0")
    check_topology_arguments(parser, args)
    check_keep_idle_argument(parser, args)
    workers_conf: dict[str, Any] = {"acks_late": args.acks_late, "keep_idle": args.keep_idle}
    if args.prefetch_multiplier is not None:
        if args.prefetch_multiplier < 1:
            parser.error("--prefetch-multiplier must be 1 or more")
        workers_conf["prefetch_multiplier"] = args.prefetch_multiplier
    args.backlog_settings = replace(BACKLOG_QUICK if args.quick else BACKLOG, **workers_conf)
    if args.backlog_n is not None:
        args.backlog_settings = replace(args.backlog_settings, tasks=args.backlog_n)
    settings = QUICK if args.quick else FULL
    overrides = {
        field: getattr(args, field)
        for field in ("tasks", "hold", "limit", "workers", "concurrency", "noop_tasks",
                      "noop_rounds", "backoff_base", "backoff_max")
        if getattr(args, field) is not None
    }  # fmt: skip
    return args, replace(settings, **overrides, **workers_conf)


def run_backlog(
    args: argparse.Namespace, settings: Settings, where: Topology, raw: dict[str, Any]
) -> dict[str, Any]:
    """The backlog scenario: handover mode, countdown mode and the baseline, one
    after the other on the same workers."""
    bench, worker_env = bench_environment(where, settings)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-backlog-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    records, store = where.bench.client(db=2), where.semaphore_store()
    broker = where.broker_client()
    inspect = (where.amqp or args.inspect_held) and args.inspect_every > 0
    workers = Workers(worker_env, settings, log_dir, args.worker_loglevel)
    figures: dict[str, Any] = {}
    try:
        log(f"backlog: {settings.workers} workers x {settings.concurrency} processes")
        records.delete(bench.READY_KEY)
        workers.start(lambda: int(records.scard(bench.READY_KEY)))
        warm_up(bench, settings, records)
        skipped = {
            "ours": "ours", "ours_countdown": "countdown", "baseline": "baseline", "plain": "plain"
        }  # fmt: skip
        for kind in BACKLOG_MODES:
            if skipped[kind] in args.skip:
                continue
            what = f"{settings.tasks} tasks x {settings.hold} s, L={settings.limit}"
            log(f"backlog, {LABELS[kind]}: {what}")
            if kind == "plain":
                workers.stop()  # the plain tasks' own workers run alone
                workers = plain_workers(
                    bench, records, settings,
                    env=worker_env, log_dir=log_dir, level=args.worker_loglevel,
                )  # fmt: skip
            names = sorted(m.decode() for m in records.smembers(bench.READY_KEY))
            sampler = BacklogSampler(
                broker, workers, app=bench.app if inspect else None, destination=names,
                every=args.inspect_every,
            )  # fmt: skip
            with sampler.running():
                figures[kind] = run_capped(bench, kind, settings, records, store, raw=raw)
            figures[kind].update(sampler.summary())
    except Exception:
        log(f"worker logs ({log_dir}):\n{workers.tails()}")
        raise
    finally:
        workers.stop()
        figures["workers_celery_semaphore_from"] = sorted(
            {v.decode() for v in records.hvals(bench.FROM_KEY)}
        )
        records.close()
        store.close()
        if broker is not None:
            broker.close()
        if args.log_dir is None:
            shutil.rmtree(log_dir, ignore_errors=True)
    return figures


def plain_workers(
    bench: ModuleType, records: redis.Redis, settings: Settings,
    *, env: dict[str, str], log_dir: Path, level: str,
) -> Workers:  # fmt: skip
    """The backlog's reference: workers with L prefork processes in all (K of them, L
    divided among them as evenly as it goes; one if L < K), consuming only the plain
    tasks' queue. A cap of L can at best keep its L permits as busy as these keep
    their processes."""
    count = max(1, min(settings.workers, settings.limit))
    if settings.limit % count:
        count = 1
    plain = replace(settings, workers=count, concurrency=settings.limit // count)
    workers = Workers(env, plain, log_dir, level, queues=bench.PLAIN_QUEUE, name="plain")
    records.delete(bench.READY_KEY)
    workers.start(lambda: int(records.scard(bench.READY_KEY)))
    warm = [bench.plain.delay(-1, 0.0) for _ in range(2 * settings.limit)]
    settle = READY_TIMEOUT  # with no result backend, the records say they ran
    if has_results(bench):
        for result in warm:
            result.get(timeout=READY_TIMEOUT)  # every process has started and connected
        settle = 5.0  # their records (run_capped clears them) come after
    wait_for_records(records, bench.records_key("plain"), len(warm), settle)
    return workers


def bench_environment(
    where: RedisServer | Topology, settings: Settings
) -> tuple[ModuleType, dict[str, str]]:
    """The bench app, configured for ``where`` (a Topology, or one redis-server for
    everything) and ``settings``, and the workers' environment."""
    if isinstance(where, RedisServer):
        where = Topology("redis", "plain", where, where)
    env = {
        **where.env(),
        "BENCH_LIMIT": str(settings.limit),
        "BENCH_NOOP_LIMIT": str(settings.noop_limit),
        "BENCH_BACKOFF_BASE": repr(settings.backoff_base),
        "BENCH_BACKOFF_MAX": repr(settings.backoff_max),
        "BENCH_PREFETCH_MULTIPLIER": str(settings.prefetch_multiplier),
        "BENCH_ACKS_LATE": "1" if settings.acks_late else "0",
        "BENCH_KEEP_IDLE": repr(settings.keep_idle),
    }
    os.environ.update(env)
    worker_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
    }
    import bench_app

    return bench_app, worker_env


def run(
    args: argparse.Namespace, settings: Settings, where: Topology, raw: dict[str, Any]
) -> dict[str, Any]:
    bench, worker_env = bench_environment(where, settings)

    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-celery-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    records, store = where.bench.client(db=2), where.semaphore_store()
    servers = [server.client() for server in where.servers()]
    workers = Workers(worker_env, settings, log_dir, args.worker_loglevel)
    calls: StoreCalls | None = None
    try:
        log(f"starting {settings.workers} workers x {settings.concurrency} processes")
        workers.start(lambda: int(records.scard(bench.READY_KEY)))
        log("warm-up")
        warm_up(bench, settings, records)
        log(f"ours: {settings.tasks} tasks x {settings.hold} s under a cap of {settings.limit}")
        if args.prime:
            log(f"priming the semaphore's hold estimate: {2 * settings.limit} tasks")
            primer = replace(settings, tasks=2 * settings.limit)
            run_capped(bench, "ours", primer, records, store, raw={})
        ours: dict[str, Any] = {}
        if "ours" not in args.skip:
            ours = run_capped(bench, "ours", settings, records, store, raw=raw)
        baseline: dict[str, Any] = {}
        if "baseline" not in args.skip:
            log("baseline: py-redis-semaphore + self.retry with backoff")
            baseline = run_capped(bench, "baseline", settings, records, store, raw=raw)
        noop: dict[str, Any] = {}
        if "noop" not in args.skip:
            log(f"no-op overhead: {settings.noop_tasks} tasks x {settings.noop_rounds} rounds")
            calls = StoreCalls(where)
            noop = run_noop(
                bench, settings, records, CpuMeter(workers, servers, where.postgres_pid), calls
            )
    except Exception:
        log(f"worker logs ({log_dir}):\n{workers.tails()}")
        raise
    finally:
        log("stopping the workers")
        workers.stop()
        if calls is not None:
            calls.close()
        records.close()
        store.close()
        for client in servers:
            client.close()
        bench.app.close()
        if args.log_dir is None:
            shutil.rmtree(log_dir, ignore_errors=True)
    return {"ours": ours, "baseline": baseline, "noop": noop}


def rabbitmq_version_of(url: str) -> str | None:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=10) as connection:
            connection.connect()
            return str(connection.connection.server_properties.get("version"))
    except Exception as exc:  # noqa: BLE001: the workers will say what is wrong
        log(f"RabbitMQ at {url}: {exc!r}")
        return None


def main(argv: list[str] | None = None) -> int:
    args, settings = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    raw: dict[str, Any] = {}
    with started_topology(args) as where:
        log(where.started_line())
        redis_version = where.bench.version()
        postgres_version = where.postgres_version()
        rabbitmq_version = rabbitmq_version_of(where.amqp_url) if where.amqp else None
        figures: dict[str, Any] = {}
        if args.scenario in ("today", "both"):
            figures.update(run(args, settings, where, raw))
        if args.scenario in ("backlog", "both"):
            backlog_raw: dict[str, Any] = {}
            figures["backlog"] = run_backlog(args, args.backlog_settings, where, backlog_raw)
            raw["backlog"] = backlog_raw
    if args.dump:
        args.dump.write_text(json.dumps(raw))
    backlog_from = figures.get("backlog", {}).pop("workers_celery_semaphore_from", None)
    results = {
        "quick": args.quick,
        "elapsed_s": time.perf_counter() - started,
        "broker": args.broker,
        "semaphore_store": args.semaphore_store,
        "semaphore_redis": args.semaphore_redis if args.semaphore_store == "redis" else None,
        "keep_idle_s": args.keep_idle,
        "topology": {**where.describe(), "amqp_cleanup": where.cleanup or None},
        "settings": {**asdict(settings), "ideal_s": settings.ideal},
        "backlog_settings": {
            **asdict(args.backlog_settings),
            "ideal_s": args.backlog_settings.ideal,
        },
        "environment": {
            "celery": package_version("celery"),
            "redis_server": redis_version,
            "rabbitmq": rabbitmq_version,
            "postgres_server": postgres_version,
            "redis_py": package_version("redis"),
            "py_redis_semaphore": package_version("py-redis-semaphore"),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1min": [load_before, os.getloadavg()[0]],
            "celery_semaphore_from": str(Path(celery_semaphore.__file__).parent),
            "workers_celery_semaphore_from": backlog_from,
        },
        **figures,
        "targets": {**TARGETS, "peak_overlap": settings.limit},
        "backlog_targets": BACKLOG_TARGETS,
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    today = {k: figures.get(k) for k in ("ours", "baseline", "noop")}
    if args.scenario in ("today", "both") and all(today.values()):
        print_report(results)
    elif args.scenario in ("today", "both"):
        print(json.dumps(today, indent=2))
        if today["noop"]:
            print_noop(results)
    if "backlog" in figures and len(figures["backlog"]) == len(BACKLOG_MODES):
        print_backlog(results)
    elif "backlog" in figures:
        print(json.dumps(figures["backlog"], indent=2))
    print(f"\n(whole run: {results['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; the workers and the private servers were stopped")
        sys.exit(130)
