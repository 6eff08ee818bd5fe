"""Fair share and priority end to end: a noisy neighbour and an urgent task, under a
cluster-wide cap L on K real prefork ``celery worker`` processes of C pool processes
each (bench_app.py), each beside its baseline in the same run.

Noisy neighbour: account A submits N_A tasks of H seconds, account B submits N_B one
second after A's last, to ``fair`` (``fair_by`` the account) and then, on the same
workers, to ``unfair`` (the same task without ``fair_by``: one line, first come first
served). ``--countdown`` adds ``fair_countdown`` (countdown wait mode).

Priority: N_P tasks at priority 5 (on a Redis broker 0 is the default and the most
urgent), then one task at priority 0; the baseline publishes the same tasks with no
priority at all. On RabbitMQ, where a higher number goes first and 0 is the default,
the same five steps: the line at 0, the task at 5.

The script starts its own ``redis-server`` (broker, result backend and semaphore
store; never the shared one on 6379) and the workers, prints figures, and stops every
process again, also on an error, Ctrl-C, SIGTERM or ``--timeout``. It asserts nothing:
the targets are printed next to the figures. ``--broker``, ``--amqp-url``,
``--semaphore-redis``, ``--semaphore-store`` and ``--postgres-url`` are
bench_celery.py's: ``--broker amqp`` takes the broker from RabbitMQ (queues and
exchanges named for the run, deleted at the end) and the semaphores from a
redis-server of their own, ``--broker redis-separate`` runs two redis-servers;
``--semaphore-store postgres`` (with ``--broker amqp``) keeps the semaphores in a
PostgreSQL cluster of the script's own (or ``--postgres-url``) with no result backend:
the script sees a task end by its body's record, and its redis-server keeps only those
records. The report says which ran. ``--keep-idle SECONDS`` sets the workers'
``semaphore_keep_idle`` (kept permits, off by default; ``fair`` and ``fair_countdown``
have a fair key, so they never keep one: ``unfair`` and ``prioritized`` do).

    .venv/bin/python benchmarks/bench_fair.py            # full run, about two minutes
    .venv/bin/python benchmarks/bench_fair.py --quick    # smoke run
    .venv/bin/python benchmarks/bench_fair.py --json     # machine-readable results
    .venv/bin/python benchmarks/bench_fair.py --broker amqp --semaphore-redis plain
    .venv/bin/python benchmarks/bench_fair.py --broker amqp --semaphore-store postgres

Every figure comes from the task bodies' own records (start and end, ``time.time()``,
same machine) and the times this script published at.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import redis
from bench_celery import (
    BACKLOG,
    Settings,
    Topology,
    Workers,
    _exit_on_sigterm,
    add_keep_idle_argument,
    add_topology_arguments,
    analyze,
    await_tasks,
    bench_environment,
    check_keep_idle_argument,
    check_topology_arguments,
    keep_idle_phrase,
    log,
    rabbitmq_version_of,
    started_topology,
    topology_line,
    warm_up,
)

import celery_semaphore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # devkit/, beside the package
from devkit.measures import kendall_tau
from devkit.reporting import package_version, verdict

TARGETS = {
    "b_share_min": 0.45,
    "b_share_max": 0.55,
    "b_last_start_max_s": 4.0,
    "kendall_tau_min": 0.99,
    "efficiency_min": 0.95,
    "urgent_starts_before_max": "limit",  # at most L starts between its publish and its own
}
NOISY_MODES = ("fair", "fair_countdown", "unfair")
LABELS = {"fair": "fair_by", "fair_countdown": "fair_by, countdown", "unfair": "no fair_by"}


@dataclass(frozen=True)
class Scenario:
    a_tasks: int  # N_A, the noisy account's tasks
    b_tasks: int  # N_B, the late account's tasks
    b_delay: float  # seconds from A's last publish to B's first
    line_tasks: int  # N_P, the line the urgent task is published behind
    line_priority: int  # the line's message priority (Redis: higher numbers go later)
    urgent_priority: int
    window: float  # seconds of each window B's share is counted over
    window_step: float  # windows start this far apart (they overlap)


FULL = Scenario(
    a_tasks=2000,
    b_tasks=100,
    b_delay=1.0,
    line_tasks=1000,
    line_priority=5,
    urgent_priority=0,
    window=2.0,
    window_step=0.25,
)
QUICK = replace(FULL, a_tasks=200, b_tasks=20, line_tasks=100)
# RabbitMQ orders by priority the other way round (higher first, 0 the default): the
# line at the default, the urgent task five steps more urgent, as on Redis.
AMQP_PRIORITIES = {"line_priority": 0, "urgent_priority": 5}
# The backlog scenario's workers (bench_celery.py): L=4, H=50 ms, 2 x 4 prefork
# processes, Celery's default prefetch multiplier (4).
WORKERS = BACKLOG
WORKERS_QUICK = replace(BACKLOG, warmup=16)


def _exit_on_alarm(signum: int, frame: FrameType | None) -> None:
    log("--timeout reached: stopping")
    raise SystemExit(124)  # unwinds through the finally blocks: everything stops


# --------------------------------------------------------------------------- figures


def b_shares(
    starts: list[tuple[float, str]], begin: float, end: float, window: float, step: float
) -> list[float]:
    """B's share of the starts in each ``window``-second window ``[t, t + window)``, for
    t from ``begin`` every ``step`` seconds while the window ends by ``end``; one window
    ``[begin, end]`` when that is shorter than ``window``. Windows without a start are left out."""
    bounds: list[tuple[float, float]] = []
    t = begin
    while t + window <= end:
        bounds.append((t, t + window))
        t += step
    if not bounds:
        bounds.append((begin, end + 1e-9))
    shares = []
    for low, high in bounds:
        inside = [account for at, account in starts if low <= at < high]
        if inside:
            shares.append(inside.count("B") / len(inside))
    return shares


def noisy_figures(
    runs: list[dict[str, Any]], published: dict[str, float], settings: Settings, sc: Scenario
) -> dict[str, Any]:
    n = sc.a_tasks + sc.b_tasks
    overall = analyze(runs, published["a_begin"], replace(settings, tasks=n))
    begun = sorted(runs, key=lambda r: r["start"])
    a = [r for r in begun if r["account"] == "A"]
    b = [r for r in begun if r["account"] == "B"]
    b_first, b_last = b[0]["start"], b[-1]["start"]
    starts = [(r["start"], r["account"]) for r in begun]
    shares = b_shares(starts, published["b_begin"], b_last, sc.window, sc.window_step)
    during = [account for at, account in starts if published["b_begin"] <= at <= b_last]
    return {
        "tasks_run": overall["tasks_run"],
        "distinct_tasks": overall["distinct_tasks"],
        "a_submit_s": published["a_end"] - published["a_begin"],
        "b_submit_s": published["b_end"] - published["b_begin"],
        "b_first_start_s": b_first - published["b_begin"],
        "b_last_start_s": b_last - published["b_begin"],
        "b_share": {
            "windows": len(shares),
            "min": min(shares),
            "median": statistics.median(shares),
            "max": max(shares),
            "whole": during.count("B") / len(during),
        },
        "a_started_before_b_last": sum(1 for r in a if published["b_begin"] <= r["start"] < b_last),
        "kendall_tau_a": kendall_tau([r["index"] for r in a]),
        "kendall_tau_b": kendall_tau([r["index"] for r in b]),
        "efficiency": overall["efficiency"],
        "busy_permit_share": 1.0 - overall["idle_permit_share"],
        "makespan_s": overall["makespan_s"],
        "ideal_s": n * settings.hold / settings.limit,
        "peak_overlap": overall["peak_overlap"],
        "waits_mean": overall["waits_mean"],
        "handoff_gap_median_s": overall["handoff_gap_s"]["median"],
        "handoff_gap_p90_s": overall["handoff_gap_s"]["p90"],
    }


def priority_figures(
    runs: list[dict[str, Any]], urgent_index: int, published_at: float
) -> dict[str, Any]:
    urgent = next(r for r in runs if r["index"] == urgent_index)
    line = sorted((r for r in runs if r["index"] != urgent_index), key=lambda r: r["start"])
    return {
        "tasks_run": len(runs),
        "distinct_tasks": len({r["index"] for r in runs}),
        "line_waiting_at_publish": sum(1 for r in line if r["start"] >= published_at),
        "starts_before_urgent": sum(
            1 for r in line if published_at <= r["start"] < urgent["start"]
        ),
        "urgent_wait_s": urgent["start"] - published_at,
        "urgent_priority_seen": urgent.get("priority"),
        "kendall_tau_line": kendall_tau([r["index"] for r in line]),
    }


# --------------------------------------------------------------------------- phases


def phase_timeout(tasks: int, settings: Settings) -> float:
    """Seconds after which a phase gives up: ten times its ideal makespan (countdown
    mode on a loaded machine took about three times), and at least two minutes."""
    return max(120.0, 10 * tasks * settings.hold / settings.limit)


def collect(
    bench: ModuleType, kind: str, results: list[Any],
    *, records: redis.Redis, key: str, settings: Settings,
) -> list[dict[str, Any]]:  # fmt: skip
    """The bodies' records, once every task has run (`bench_celery.await_tasks`: by the
    results, or with no result backend by the records), at most `phase_timeout()`."""
    timeout = phase_timeout(len(results), settings)
    await_tasks(bench, kind, results, records=records, key=key, timeout=timeout)
    return [json.loads(r) for r in records.lrange(key, 0, -1)]


def run_noisy(
    bench: ModuleType, kind: str, sc: Scenario, settings: Settings, records: redis.Redis
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A's tasks, then B's ``b_delay`` seconds after A's last publish; figures and raw data."""
    task = getattr(bench, kind)
    key = bench.records_key(kind)
    records.delete(key)
    hold = settings.hold
    with bench.app.producer_or_acquire() as producer:
        a_begin = time.time()
        results = [task.apply_async(("A", i, hold), producer=producer) for i in range(sc.a_tasks)]
        a_end = time.time()
        time.sleep(sc.b_delay)
        b_begin = time.time()
        results += [
            task.apply_async(("B", sc.a_tasks + i, hold), producer=producer)
            for i in range(sc.b_tasks)
        ]
        b_end = time.time()
    runs = collect(bench, kind, results, records=records, key=key, settings=settings)
    published = {"a_begin": a_begin, "a_end": a_end, "b_begin": b_begin, "b_end": b_end}
    return noisy_figures(runs, published, settings, sc), {"published": published, "runs": runs}


def run_priority(
    bench: ModuleType, sc: Scenario, settings: Settings, records: redis.Redis, *, prioritized: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The line, then one task published behind it: at ``urgent_priority`` with the
    line at ``line_priority``, or (the baseline) all without a priority."""
    task = bench.prioritized
    key = bench.records_key("prioritized")
    records.delete(key)
    hold = settings.hold
    line_options = {"priority": sc.line_priority} if prioritized else {}
    urgent_options = {"priority": sc.urgent_priority} if prioritized else {}
    with bench.app.producer_or_acquire() as producer:
        results = [
            task.apply_async((i, hold), producer=producer, **line_options)
            for i in range(sc.line_tasks)
        ]
        time.sleep(0.5)  # the line's first tasks reach the workers and start
        published_at = time.time()
        results.append(task.apply_async((sc.line_tasks, hold), producer=producer, **urgent_options))
    runs = collect(bench, "prioritized", results, records=records, key=key, settings=settings)
    figures = priority_figures(runs, sc.line_tasks, published_at)
    return figures, {"published_at": published_at, "runs": runs}


def run(
    args: argparse.Namespace, settings: Settings, sc: Scenario, where: Topology
) -> tuple[dict[str, Any], dict[str, Any]]:
    bench, worker_env = bench_environment(where, settings)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-fair-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    records = where.bench.client(db=2)
    workers = Workers(worker_env, settings, log_dir, args.worker_loglevel)
    figures: dict[str, Any] = {"noisy": {}, "priority": {}}
    raw: dict[str, Any] = {"noisy": {}, "priority": {}}
    try:
        log(f"starting {settings.workers} workers x {settings.concurrency} processes")
        records.delete(bench.READY_KEY)
        workers.start(lambda: int(records.scard(bench.READY_KEY)))
        warm_up(bench, settings, records)
        modes = [m for m in NOISY_MODES if m != "fair_countdown" or args.countdown]
        for kind in modes:
            log(f"noisy neighbour, {LABELS[kind]}: A {sc.a_tasks}, B {sc.b_tasks} tasks")
            figures["noisy"][kind], raw["noisy"][kind] = run_noisy(
                bench, kind, sc, settings, records
            )
        for side, prioritized in (("prioritized", True), ("baseline", False)):
            log(f"priority, {side}: one task behind {sc.line_tasks}")
            figures["priority"][side], raw["priority"][side] = run_priority(
                bench, sc, settings, records, prioritized=prioritized
            )
    except BaseException:
        log(f"worker logs ({log_dir}):\n{workers.tails()}")
        raise
    finally:
        log("stopping the workers")
        workers.stop()
        records.close()
        bench.app.close()
        if args.log_dir is None:
            shutil.rmtree(log_dir, ignore_errors=True)
    return figures, raw


# --------------------------------------------------------------------------- report


def table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    last = len(rows[0]) - 1
    for n, cells in enumerate(rows):
        print("  ".join(c.ljust(widths[i]) if i == 0 else c if i == last else c.rjust(widths[i])
                        for i, c in enumerate(cells)).rstrip())  # fmt: skip
        if n == 0:
            print("  ".join("-" * w for w in widths))


def print_report(results: dict[str, Any]) -> None:
    s, sc, env, t = results["settings"], results["scenario"], results["environment"], TARGETS
    load, where = env["load_average"], results["topology"]
    print(
        f"fair share and priority end to end: L={s['limit']}, H={s['hold']} s, "
        f"K={s['workers']} workers x C={s['concurrency']} prefork processes, prefetch "
        f"multiplier {s['prefetch_multiplier']}{', acks_late' if s['acks_late'] else ''}, "
        f"{keep_idle_phrase(s)}, handover mode unless said"
    )
    print(
        f"celery {env['celery']}, redis-server {env['redis_server']} (private), "
        f"redis-py {env['redis_py']}, Python {env['python']}, {env['cpus']} CPUs, "
        f"load average (1, 5, 15 min) {' '.join(f'{x:.2f}' for x in load['before'])} before, "
        f"{' '.join(f'{x:.2f}' for x in load['after'])} after"
    )
    print(topology_line(where, env["rabbitmq"], env["postgres_server"]))
    noisy = results["noisy"]
    modes = [m for m in NOISY_MODES if m in noisy]
    fair = noisy["fair"]
    print(
        f"\nnoisy neighbour: A submits {sc['a_tasks']}, B {sc['b_tasks']} tasks "
        f"{sc['b_delay']:g} s after A's last (A's submit took {fair['a_submit_s']:.2f} s); "
        f"ideal {fair['ideal_s']:.1f} s"
    )
    share_ok = (
        t["b_share_min"] <= fair["b_share"]["min"] and fair["b_share"]["max"] <= t["b_share_max"]
    )
    tau_ok = min(fair["kendall_tau_a"], fair["kendall_tau_b"]) >= t["kendall_tau_min"]

    def row(label: str, cell: Any, target: str = "") -> list[str]:
        return [label, *(cell(noisy[m]) for m in modes), target]

    table([
        ["figure", *(LABELS[m] for m in modes), "target (fair_by, handover)"],
        row(f"B's share of starts, {sc['window']:g} s windows: min / median / max",
            lambda m: f"{m['b_share']['min']:.2f} / {m['b_share']['median']:.2f} / "
                      f"{m['b_share']['max']:.2f}",
            f"each in {t['b_share_min']}-{t['b_share_max']}  {verdict(share_ok)}"),
        row("  windows (B's submit .. B's last start); share over all of it",
            lambda m: f"{m['b_share']['windows']}; {m['b_share']['whole']:.2f}"),
        row("B's first start after B's submit (s)", lambda m: f"{m['b_first_start_s']:.2f}"),
        row("B's last start after B's submit (s)", lambda m: f"{m['b_last_start_s']:.2f}",
            f"<= {t['b_last_start_max_s']:g}  "
            f"{verdict(fair['b_last_start_s'] <= t['b_last_start_max_s'])}"),
        row("A's starts in that time", lambda m: str(m["a_started_before_b_last"])),
        row("Kendall tau within A / within B",
            lambda m: f"{m['kendall_tau_a']:.3f} / {m['kendall_tau_b']:.3f}",
            f">= {t['kendall_tau_min']}  {verdict(tau_ok)}"),
        row("efficiency (ideal / makespan)", lambda m: f"{m['efficiency']:.3f}",
            f">= {t['efficiency_min']}  {verdict(fair['efficiency'] >= t['efficiency_min'])}"),
        row("busy permit-seconds / (L x makespan)", lambda m: f"{m['busy_permit_share']:.3f}"),
        row("makespan, first start .. last end (s)", lambda m: f"{m['makespan_s']:.1f}"),
        row("peak overlap", lambda m: str(m["peak_overlap"]),
            f"= {s['limit']}  {verdict(fair['peak_overlap'] == s['limit'])}"),
        row("waits / task, mean", lambda m: f"{m['waits_mean']:.2f}"),
        row("release -> next start, median / p90 (ms)",
            lambda m: f"{m['handoff_gap_median_s'] * 1000:.0f} / "
                      f"{m['handoff_gap_p90_s'] * 1000:.0f}"),
        row("tasks run / distinct", lambda m: f"{m['tasks_run']} / {m['distinct_tasks']}",
            f"{sc['a_tasks'] + sc['b_tasks']} / {sc['a_tasks'] + sc['b_tasks']}"),
    ])  # fmt: skip
    prio = results["priority"]
    urgent, base = prio["prioritized"], prio["baseline"]
    print(
        f"\npriority: one task published behind {sc['line_tasks']} "
        f"(prioritized: the line at priority {sc['line_priority']}, the task at "
        f"{sc['urgent_priority']}; baseline: no priority anywhere)"
    )
    table([
        ["figure", "prioritized", "baseline", "target (prioritized)"],
        ["line tasks not yet started at its publish",
         str(urgent["line_waiting_at_publish"]), str(base["line_waiting_at_publish"]), ""],
        ["starts between its publish and its own start",
         str(urgent["starts_before_urgent"]), str(base["starts_before_urgent"]),
         f"<= {s['limit']} (L)  {verdict(urgent['starts_before_urgent'] <= s['limit'])}"],
        ["its wait, publish .. start (s)",
         f"{urgent['urgent_wait_s']:.2f}", f"{base['urgent_wait_s']:.2f}", ""],
        ["Kendall tau of the line", f"{urgent['kendall_tau_line']:.3f}",
         f"{base['kendall_tau_line']:.3f}", ""],
        ["tasks run / distinct", f"{urgent['tasks_run']} / {urgent['distinct_tasks']}",
         f"{base['tasks_run']} / {base['distinct_tasks']}", ""],
    ])  # fmt: skip


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Settings, Scenario]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 A, 20 B, 100 in line")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument(
        "--countdown", action="store_true", help="also the noisy neighbour in countdown mode"
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0,
        help="seconds after which the run stops itself (default 900)",
    )  # fmt: skip
    add_keep_idle_argument(parser)
    add_topology_arguments(parser)
    parser.add_argument("--worker-loglevel", default="warning")
    parser.add_argument("--log-dir", type=Path, help="keep the worker logs in this directory")
    parser.add_argument("--dump", type=Path, help="write every record to this JSON file")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    check_keep_idle_argument(parser, args)
    check_topology_arguments(parser, args)
    settings, scenario = (WORKERS_QUICK, QUICK) if args.quick else (WORKERS, FULL)
    settings = replace(settings, keep_idle=args.keep_idle)
    if args.broker == "amqp":
        scenario = replace(scenario, **AMQP_PRIORITIES)
    return args, settings, scenario


def main(argv: list[str] | None = None) -> int:
    args, settings, scenario = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.signal(signal.SIGALRM, _exit_on_alarm)
    signal.setitimer(signal.ITIMER_REAL, args.timeout)
    started = time.perf_counter()
    load_before = os.getloadavg()
    try:
        with started_topology(args) as where:
            log(where.started_line())
            redis_version = where.bench.version()
            postgres_version = where.postgres_version()
            rabbitmq_version = rabbitmq_version_of(where.amqp_url) if where.amqp else None
            figures, raw = run(args, settings, scenario, where)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if args.dump:
        args.dump.write_text(json.dumps(raw))
    results = {
        "quick": args.quick,
        "elapsed_s": time.perf_counter() - started,
        "broker": args.broker,
        "semaphore_store": where.store,
        "semaphore_redis": args.semaphore_redis if where.store == "redis" else None,
        "keep_idle_s": settings.keep_idle,
        "topology": {**where.describe(), "amqp_cleanup": where.cleanup or None},
        "settings": {  # the workers' (bench_celery.Settings): no tasks, no-op or baseline here
            k: v
            for k, v in asdict(settings).items()
            if k not in ("tasks",) and not k.startswith(("noop", "backoff"))
        },
        "scenario": asdict(scenario),
        "environment": {
            "celery": package_version("celery"),
            "redis_server": redis_version,
            "rabbitmq": rabbitmq_version,
            "postgres_server": postgres_version,
            "redis_py": package_version("redis"),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "celery_semaphore_from": str(Path(celery_semaphore.__file__).parent),
        },
        **figures,
        "targets": {**TARGETS, "urgent_starts_before_max": settings.limit},
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
        log("interrupted; the workers and the private servers were stopped")
        sys.exit(130)
