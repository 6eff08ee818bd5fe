"""Kept permits coming back when a line forms, in a real prefork ``celery worker``.

One worker of two pool processes (benchmarks/bench_kept_app.py) with
``semaphore_keep_idle`` (``--keep-idle``, 30 s by default); this script is the
waiter. Each scenario repeats ``--rounds`` times (30):

- ``idle``: both processes keep a permit of a semaphore of limit 2, idle (checked with
  ``status().holders``: two ``kept|`` holders, nobody else). The script's
  ``attempt()`` with a fresh holder id is refused, so it is the first waiter of an
  empty line and publishes the news on the wake channel; each keeper gives its idle
  kept permit back at once, and the first release grants the waiter
  (``wait_for_turn``). Figures: line formed -> each keeper heard (``Keeper.recall``);
  line formed -> kept permit released (``Permit.release`` of the ``kept|`` holder
  returned); line formed -> waiter granted. "Line formed" is when the script sent the
  ``attempt()`` (the store publishes during it: the figures are at most its round trip
  too long; that round trip is printed). A task that reaches a keeping process before
  its keeper heard starts on the kept permit, ahead of the waiter: line formed ->
  heard is that overtaking window (the keeper takes the permit out of reach of tasks
  when it hears, before it releases it).
- ``busy``: both keep a permit of a semaphore of limit 20 and each runs a task on it
  (published with room to spare, so without a place in line: with a limit under 8,
  or fewer than 8 permits free, a task takes a place at publish, which recalls the
  kept permits, and starts on an ordinary one); the script takes the 18 other
  permits, then forms the line. The first task's end gives its recalled permit back:
  first body's end -> waiter granted.
- ``line``: a task on an ordinary permit of a semaphore of limit 2 ends while the
  script, holding the other permit, waits: body's end -> waiter granted, the hand-off
  every task of a backlog makes (bench_celery.py's backlog). With kept permits on, the
  task's end asks to keep its permit (``Keeper.keep``: refused, a line exists) and the
  report shows how long that took and how much of it went waiting for the keeper
  thread to listen; run it with ``--keep-idle 0`` for the same hand-off without.

Targets (the issue's): the first waiter starts within 5 ms of the line forming (idle)
and of the first running task's end (busy); the line's hand-off as without kept permits.

Every time is ``time.time()`` on this machine: the script's, and the worker processes'
records (bench_kept_app.py; written by a thread of their own, off the paths measured).
A round during which a keeper's renewal interval came (it gives back its idle kept
permits then too: a quarter of the lease, 15 s) is left out and counted, as is one
whose setup did not come out as described (said why).

The script starts its own ``redis-server`` (broker, results, records; the semaphores
too unless ``--store postgres``: a PostgreSQL cluster of its own, devkit) on free
loopback ports, and the worker; it stops them all when it ends, also on an error,
Ctrl-C, SIGTERM or ``--timeout``. It asserts nothing about timings: the targets are
printed beside the figures, with the load average.

    .venv/bin/python benchmarks/bench_kept.py                   # 30 rounds each, about a minute
    .venv/bin/python benchmarks/bench_kept.py --quick           # smoke run, 5 rounds
    .venv/bin/python benchmarks/bench_kept.py --store postgres  # the semaphores in PostgreSQL
    .venv/bin/python benchmarks/bench_kept.py --keep-idle 0 --scenario line   # without
    .venv/bin/python benchmarks/bench_kept.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import redis

import celery_semaphore
from celery_semaphore import Permit, Semaphore
from celery_semaphore.core.constants import KEPT_PREFIX

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # devkit/, beside the package
from devkit.measures import percentile
from devkit.processes import Processes, worker_command
from devkit.redis_servers import RedisServer
from devkit.reporting import package_version, verdict

HERE = Path(__file__).resolve().parent
SCENARIOS = ("idle", "busy", "line")
STORES = ("redis", "postgres")
TARGETS = {"granted_ms_max": 5.0}
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
WAIT_TIMEOUT = 10.0  # the waiter's wait_for_turn; a round that needs more is an error
WARM_HOLD = 0.1  # two warm-up tasks at once: one per pool process
BUSY_HOLD = 0.25  # the busy tasks: long enough for the script to form its line meanwhile
LINE_HOLD = 0.1
WARM_ATTEMPTS = 5
EVENTS_SETTLE = 2.0  # seconds to wait for the worker processes' records of a round


def log(message: str) -> None:
    print(f"[bench_kept] {message}", file=sys.stderr, flush=True)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    log(f"signal {signum}: stopping")
    raise SystemExit(124 if signum == signal.SIGALRM else 143)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def stats(values: list[float | None]) -> dict[str, Any]:
    """Median, p90 and max of the values (ms) that are there; how many were not."""
    present = [v for v in values if v is not None]
    return {
        "count": len(present),
        "missing": len(values) - len(present),
        "median": percentile(present, 50) if present else None,
        "p90": percentile(present, 90) if present else None,
        "max": max(present) if present else None,
    }


class Events:
    """The worker processes' records (bench_kept_app.EVENTS_KEY), read as they come."""

    def __init__(self, records: redis.Redis, key: str) -> None:
        self.records, self.key = records, key
        self.seen: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        new = self.records.lrange(self.key, len(self.seen), -1)
        self.seen.extend(json.loads(item) for item in new)
        return self.seen

    def since(self, begin: float, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in self.read()
            if e.get("at", e.get("begin", 0.0)) >= begin
            and (event is None or e["event"] == event)
            and all(e.get(k) == v for k, v in match.items())
        ]

    def wait(
        self, begin: float, count: int, event: str, timeout: float = EVENTS_SETTLE, **match: Any
    ) -> list[dict[str, Any]]:
        """At least ``count`` records of ``event`` since ``begin`` (fewer after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.since(begin, event, **match)
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.005)


def first_per_pid(events: list[dict[str, Any]], key: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for e in events:
        out[e["pid"]] = min(out.get(e["pid"], e[key]), e[key])
    return out


class Bench:
    """The script's side: the waiter, the publisher of the tasks, the checks."""

    def __init__(self, app: ModuleType, semaphore_url: str, records: redis.Redis) -> None:
        self.app = app
        self.events = Events(records, app.EVENTS_KEY)
        self.semaphores = {
            "idle": Semaphore(semaphore_url, app.IDLE, app.LIMIT),
            "busy": Semaphore(semaphore_url, app.BUSY, app.BUSY_LIMIT),
            "line": Semaphore(semaphore_url, app.LINE, app.LIMIT),
        }
        self.excluded: dict[str, dict[str, int]] = {s: {} for s in SCENARIOS}

    def close(self) -> None:
        for semaphore in self.semaphores.values():
            semaphore.close()

    def exclude(self, scenario: str, why: str) -> None:
        self.excluded[scenario][why] = self.excluded[scenario].get(why, 0) + 1
        log(f"{scenario}: round left out ({why})")

    def kept_holders(self, scenario: str) -> tuple[list[str], int, int]:
        status = self.semaphores[scenario].status()
        kept = [h.holder for h in status.holders if h.holder.startswith(KEPT_PREFIX)]
        return kept, status.holder_count, status.waiter_count

    def warm(self, scenario: str) -> list[str]:
        """Run one task per pool process (two at once) until both processes keep a
        permit of the scenario's semaphore and nobody else holds or waits."""
        task = getattr(self.app, scenario)
        for _ in range(WARM_ATTEMPTS):
            results = [task.apply_async((WARM_HOLD,)) for _ in range(self.app.CONCURRENCY)]
            for result in results:
                result.get(timeout=30)
                result.forget()
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                kept, holders, waiters = self.kept_holders(scenario)
                if len(set(kept)) == self.app.CONCURRENCY == holders and waiters == 0:
                    return kept
                time.sleep(0.01)
        raise RuntimeError(
            f"{scenario}: the pool processes do not both keep a permit after "
            f"{WARM_ATTEMPTS} warm-ups (holders {kept}, {holders} held, {waiters} waiting)"
        )

    def renewed(self, begin: float, end: float) -> bool:
        """Whether a keeper's renewal interval gave kept permits back in [begin, end]."""
        recalls = self.events.since(begin, "recall", cause="renewal")
        return any(e["at"] <= end and e["gave"] for e in recalls)

    def heard(self, since: float, count: int) -> dict[int, float]:
        """When each keeper heard its wake channel (its first recall for a message)."""
        return first_per_pid(self.events.wait(since, count, "recall", cause="message"), "at")

    def wait_in_line(self, scenario: str, round_: int) -> tuple[float, float, float] | None:
        """Form the line (a fresh holder's attempt, refused) and wait for the permit;
        (sent, refused, granted) times, or None if the attempt was granted at once."""
        semaphore = self.semaphores[scenario]
        holder = f"bench-kept-{scenario}-{round_}-{uuid.uuid4().hex[:8]}"
        sent = time.time()
        place = semaphore.attempt(holder)
        refused = time.time()
        if isinstance(place, Permit):
            place.release()
            return None
        permit = semaphore.wait_for_turn(WAIT_TIMEOUT, holder, refused=place)
        granted = time.time()
        if not isinstance(permit, Permit):
            semaphore.release(holder)
            raise RuntimeError(f"{scenario}: the waiter was not granted in {WAIT_TIMEOUT:g} s")
        permit.release()
        return sent, refused, granted

    # -- the scenarios ---------------------------------------------------------------------

    def idle(self, round_: int) -> dict[str, Any] | None:
        self.warm("idle")
        checked = time.time()
        times = self.wait_in_line("idle", round_)
        if times is None:
            self.exclude("idle", "attempt granted at once: a kept permit went back before")
            return None
        sent, refused, granted = times
        name, count = self.app.IDLE, self.app.CONCURRENCY
        gave = self.events.wait(sent, count, "give_back", semaphore=name)
        heard = self.heard(sent, count)
        if self.renewed(checked, granted):
            self.exclude("idle", "a keeper's renewal interval came")
            return None
        released = sorted(e["end"] for e in gave)
        return {
            "attempt_ms": ms(refused - sent),
            "granted_ms": ms(granted - sent),
            "heard_first_ms": ms(min(heard.values()) - sent) if heard else None,
            "heard_last_ms": ms(max(heard.values()) - sent) if len(heard) == count else None,
            "released_first_ms": ms(released[0] - sent) if released else None,
            "released_last_ms": ms(released[-1] - sent) if len(released) == count else None,
            "release_call_ms": [ms(e["end"] - e["begin"]) for e in gave],
            "keepers_heard": len(heard),
            "kept_given_back": len(gave),
        }

    def busy(self, round_: int) -> dict[str, Any] | None:
        self.warm("busy")
        semaphore, count = self.semaphores["busy"], self.app.CONCURRENCY
        published = time.time()
        results = [self.app.busy.apply_async((BUSY_HOLD,)) for _ in range(count)]
        try:
            started = self.events.wait(published, count, "start", timeout=10.0, kind="busy")
            kept, holders, waiters = self.kept_holders("busy")
            spares = [
                f"bench-kept-spare-{round_}-{n}-{uuid.uuid4().hex[:8]}"
                for n in range(self.app.BUSY_LIMIT - count)
            ]
            taken = [semaphore.attempt(holder, queue=False) for holder in spares]
            try:
                problem = (
                    "the tasks did not run on both processes at once"
                    if len({e["pid"] for e in started}) < count
                    else f"a task did not start on its process's kept permit ({len(kept)} "
                    f"kept holders of {holders} permits held, {waiters} waiting)"
                    if not (len(kept) == count == holders and waiters == 0)
                    else "the other permits were not all free"
                    if not all(isinstance(permit, Permit) for permit in taken)
                    else None
                )
                if problem is not None:
                    self.exclude("busy", problem)
                    return None
                times = self.wait_in_line("busy", round_)
            finally:
                for holder in spares:
                    semaphore.release(holder)
        finally:
            for result in results:
                result.get(timeout=30)
                result.forget()
        if times is None:
            self.exclude("busy", "attempt granted at once")
            return None
        sent, refused, granted = times
        ends = sorted(e["at"] for e in self.events.wait(published, count, "end", kind="busy"))
        gave = sorted(
            e["end"] for e in self.events.wait(sent, count, "give_back", semaphore=self.app.BUSY)
        )
        heard = self.heard(sent, count)
        if self.renewed(published, granted):
            self.exclude("busy", "a keeper's renewal interval came")
            return None
        if not ends or ends[0] < refused:
            self.exclude("busy", "a task ended before the line formed")
            return None
        return {
            "attempt_ms": ms(refused - sent),
            "end_to_granted_ms": ms(granted - ends[0]),
            "end_to_released_ms": ms(gave[0] - ends[0]) if gave else None,
            "line_to_granted_ms": ms(granted - sent),
            "heard_last_ms": ms(max(heard.values()) - sent) if len(heard) == count else None,
            "kept_given_back": len(gave),
        }

    def line(self, round_: int) -> dict[str, Any] | None:
        semaphore = self.semaphores["line"]
        first = f"bench-kept-first-{round_}-{uuid.uuid4().hex[:8]}"
        held = semaphore.attempt(first)
        try:
            if not isinstance(held, Permit):
                self.exclude("line", "the script's first permit was not free")
                return None
            published = time.time()
            result = self.app.line.apply_async((LINE_HOLD,))
            self.events.wait(published, 1, "start", timeout=10.0, kind="line")
            times = self.wait_in_line("line", round_)
            result.get(timeout=30)
            result.forget()
        finally:
            semaphore.release(first)
        if times is None:
            self.exclude("line", "attempt granted at once: the task had not taken its permit")
            return None
        sent, refused, granted = times
        ends = self.events.wait(published, 1, "end", kind="line")
        keeps = self.events.since(published, "keep", semaphore=self.app.LINE)
        if not ends or ends[0]["at"] < refused:
            self.exclude("line", "the task ended before the line formed")
            return None
        keep = keeps[0] if keeps else None
        return {
            "attempt_ms": ms(refused - sent),
            "end_to_granted_ms": ms(granted - ends[0]["at"]),
            "keep_call_ms": ms(keep["end"] - keep["begin"]) if keep else None,
            "keep_listen_wait_ms": ms(keep["listen_s"]) if keep else None,
            "keep_store_call_ms": ms(keep["store_s"]) if keep else None,
            "keep_outcome": keep["outcome"] if keep else None,
            "keep_returned": keep["returned"] if keep else None,
        }


FIGURES = {
    "idle": (
        ("heard_first_ms", "line formed -> first keeper heard"),
        ("heard_last_ms", "line formed -> last keeper heard (overtaking window)"),
        ("released_first_ms", "line formed -> first kept permit released"),
        ("released_last_ms", "line formed -> last kept permit released"),
        ("granted_ms", "line formed -> waiter granted"),
        ("attempt_ms", "attempt() round trip (the line forms within it)"),
    ),
    "busy": (
        ("end_to_released_ms", "first task's end -> its kept permit released"),
        ("end_to_granted_ms", "first task's end -> waiter granted"),
        ("heard_last_ms", "line formed -> last keeper heard"),
        ("line_to_granted_ms", "line formed -> waiter granted (the tasks run meanwhile)"),
    ),
    "line": (
        ("end_to_granted_ms", "task's end -> waiter granted (the hand-off)"),
        ("keep_call_ms", "the task's keep call (refused: a line)"),
        ("keep_listen_wait_ms", "  of which waiting for the keeper to listen"),
        ("keep_store_call_ms", "  of which the store's call (Permit.keep)"),
    ),
}
TARGETED = {"idle": "granted_ms", "busy": "end_to_granted_ms"}


def count_of(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return counts


def summarize(
    scenario: str, rounds: list[dict[str, Any]], excluded: dict[str, int]
) -> dict[str, Any]:
    figures = {key: stats([r[key] for r in rounds]) for key, _ in FIGURES[scenario]}
    out: dict[str, Any] = {"rounds": len(rounds), "excluded": excluded, "figures": figures}
    if scenario in TARGETED:
        worst = figures[TARGETED[scenario]]["max"]
        out["target_met"] = None if worst is None else worst <= TARGETS["granted_ms_max"]
    if scenario == "line":  # what the store answered the task's keep, and what Keeper.keep said
        out["keep_outcomes"] = count_of(r["keep_outcome"] for r in rounds)
        out["keep_returned"] = count_of(r["keep_returned"] for r in rounds)
    if scenario == "idle":
        out["keepers_heard_short"] = sum(1 for r in rounds if r["keepers_heard"] < 2)
    out["per_round"] = rounds
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the servers and the worker, run the scenarios, stop everything."""
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    if args.keep_idle == 0:
        scenarios = tuple(s for s in scenarios if s == "line")  # nothing is kept otherwise
    with ExitStack() as stack:
        server = stack.enter_context(RedisServer(die_with_parent=True))
        postgres_version = None
        if args.store == "postgres":
            from devkit.postgres_servers import PostgresServer  # psycopg: this store only

            postgres = stack.enter_context(PostgresServer())
            semaphore_url = postgres.url
            with postgres.connect() as conn:
                row = conn.execute("SHOW server_version").fetchone()
                postgres_version = None if row is None else str(row[0])
        else:
            semaphore_url = server.url_for(0)
        log(f"redis-server on 127.0.0.1:{server.port}; semaphores in {args.store}")
        os.environ.update({
            "BENCH_KEPT_BROKER_URL": server.url_for(0),
            "BENCH_KEPT_RESULT_URL": server.url_for(1),
            "BENCH_KEPT_RECORD_URL": server.url_for(2),
            "BENCH_KEPT_SEMAPHORE_URL": semaphore_url,
            "BENCH_KEPT_KEEP_IDLE": repr(args.keep_idle),
        })  # fmt: skip
        worker_env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p
            ),
        }
        import bench_kept_app as app

        stack.callback(app.app.close)
        log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-kept-logs-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        if args.log_dir is None:
            stack.callback(shutil.rmtree, log_dir, True)
        records = stack.enter_context(server.client(db=2))
        processes = Processes(log_dir, cwd=HERE)
        stack.callback(processes.stop_all, STOP_TIMEOUT)
        command = worker_command(
            "bench_kept_app", "kept", concurrency=app.CONCURRENCY, loglevel=args.worker_loglevel
        )
        worker = processes.start("worker", command, env=worker_env)
        deadline = time.monotonic() + READY_TIMEOUT
        while not records.scard(app.READY_KEY):
            if not worker.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start:\n{processes.tails()}")
            time.sleep(0.05)
        bench = Bench(app, semaphore_url, records)
        stack.callback(bench.close)
        out: dict[str, Any] = {"postgres_server": postgres_version}
        try:
            for scenario in scenarios:
                log(f"{scenario}: {args.rounds} rounds")
                step: Callable[[int], dict[str, Any] | None] = getattr(bench, scenario)
                rounds = [r for r in (step(n) for n in range(args.rounds)) if r is not None]
                out[scenario] = summarize(scenario, rounds, bench.excluded[scenario])
        except BaseException:
            log(f"worker log:\n{processes.tails()}")
            raise
        renewals = bench.events.since(0.0, "recall", cause="renewal")
        out["renewals_giving_back"] = sum(1 for e in renewals if e["gave"])
        out["redis_server"] = server.version()
        return out


def cell(figure: dict[str, Any]) -> str:
    if figure["median"] is None:
        return "n/a"
    text = f"{figure['median']:.1f} / {figure['p90']:.1f} / {figure['max']:.1f}"
    return text + (f"  ({figure['missing']} rounds without)" if figure["missing"] else "")


def print_report(results: dict[str, Any]) -> None:
    s, env = results["settings"], results["environment"]
    store = (
        f"PostgreSQL {env['postgres_server']} (a cluster of our own)"
        if s["store"] == "postgres"
        else f"Redis {env['redis_server']} (the broker's, our own)"
    )
    print(
        f"kept permits coming back: one prefork worker of {s['concurrency']} processes, "
        f"semaphore_keep_idle {s['keep_idle']:g} s, semaphores in {store}; "
        f"{s['rounds']} rounds a scenario"
    )
    load = env["load_average"]
    print(
        f"celery {env['celery']}, redis-py {env['redis_py']}, Python {env['python']}, "
        f"{env['cpus']} CPUs, load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.2f}' for x in load['before'])} before, "
        f"{' '.join(f'{x:.2f}' for x in load['after'])} after"
    )
    for scenario in SCENARIOS:
        if scenario not in results:
            continue
        found = results[scenario]
        excluded = ", ".join(f"{n} {why}" for why, n in found["excluded"].items())
        print(
            f"\n{scenario}: {found['rounds']} rounds measured"
            + (f" (left out: {excluded})" if excluded else "")
        )
        rows = [("figure (ms)", "median / p90 / max", "target")]
        for key, label in FIGURES[scenario]:
            target = ""
            if TARGETED.get(scenario) == key and found.get("target_met") is not None:
                target = f"<= {TARGETS['granted_ms_max']:g} each  {verdict(found['target_met'])}"
            rows.append((label, cell(found["figures"][key]), target))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        for n, row in enumerate(rows):
            print(f"  {row[0].ljust(widths[0])}  {row[1].rjust(widths[1])}  {row[2]}".rstrip())
            if n == 0:
                print("  " + "  ".join("-" * w for w in widths))
        if scenario == "line" and s["keep_idle"] > 0:
            print(
                f"  (the store answered the task's keep: {found['keep_outcomes']}; "
                f"Keeper.keep returned: {found['keep_returned']})"
            )
    print(
        "\n(renewal intervals that gave kept permits back in the worker processes: "
        f"{results['renewals_giving_back']})"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 rounds a scenario")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument("-n", "--rounds", type=int, help="rounds a scenario (default 30)")
    parser.add_argument(
        "--scenario", choices=(*SCENARIOS, "all"), default="all",
        help="idle, busy, line, or all (default); with --keep-idle 0 only line runs",
    )  # fmt: skip
    parser.add_argument(
        "--keep-idle", type=float, default=30.0, metavar="SECONDS",
        help="the worker's semaphore_keep_idle (default 30; 0: off, the line scenario only)",
    )  # fmt: skip
    parser.add_argument(
        "--store", choices=STORES, default="redis",
        help="the semaphores in the script's redis-server (default), or in a PostgreSQL "
        "cluster of its own",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=600.0,
        help="seconds after which the run stops itself (default 600)",
    )  # fmt: skip
    parser.add_argument("--worker-loglevel", default="warning")
    parser.add_argument("--log-dir", type=Path, help="keep the worker's log in this directory")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 5 if args.quick else 30
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    if not args.keep_idle >= 0:
        parser.error("--keep-idle must be 0 (off) or more seconds")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGALRM, _exit_on_signal)
    signal.setitimer(signal.ITIMER_REAL, args.timeout)
    started = time.perf_counter()
    load_before = os.getloadavg()
    try:
        found = run(args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    results = {
        "quick": args.quick,
        "elapsed_s": time.perf_counter() - started,
        "settings": {
            "rounds": args.rounds,
            "keep_idle": args.keep_idle,
            "store": args.store,
            "concurrency": 2,
            "warm_hold_s": WARM_HOLD,
            "busy_hold_s": BUSY_HOLD,
            "line_hold_s": LINE_HOLD,
        },
        "environment": {
            "celery": package_version("celery"),
            "redis_server": found.pop("redis_server"),
            "postgres_server": found.pop("postgres_server"),
            "redis_py": package_version("redis"),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "celery_semaphore_from": str(Path(celery_semaphore.__file__).parent),
        },
        **found,
        "targets": TARGETS,
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print_report(results)
    print(f"\n(whole run: {results['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; the worker and the private servers were stopped")
        sys.exit(130)
