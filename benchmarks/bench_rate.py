"""Cluster-wide rate limits end to end: celery-semaphore's ``rate=`` (handover and
countdown modes) beside what a Celery user has today (Celery's per-worker
``rate_limit``, a Redis token bucket checked in the body with ``self.retry``), on
K real prefork ``celery worker`` processes of C pool processes each.

Three scenarios, one after the other on the same workers:

- ``accuracy``: N tasks of H seconds (submitted in a loop of ``.delay()``) under a
  rate R: the most starts in any 1 s window, the long-run rate, waits per task, the
  messages the workers hold, the start order, the makespan;
- ``both``: a cap L and a rate together (``limit=`` and ``rate=``): most running at
  once, most starts in 1 s, the makespan against what the binding limit allows;
- ``pause``: one task raises ``RateLimited(retry_after=P)`` once: the gap from the
  raise to the next start, whether that task starts first after the pause, the
  order after it.

The script starts its own ``redis-server`` (broker, semaphores and records; never the
shared one on 6379) and the workers (benchmarks/bench_rate_app.py), prints figures,
and stops every process again, also on an error, Ctrl-C or SIGTERM. It asserts
nothing: the targets and the load average are printed next to the figures.
``--broker``, ``--amqp-url``, ``--semaphore-redis``, ``--semaphore-store`` and
``--postgres-url`` are bench_celery.py's: ``--broker amqp`` takes the broker from
RabbitMQ (queues and exchanges named for the run, deleted at the end) and the
semaphores from a redis-server of their own, ``--broker redis-separate`` runs two
redis-servers; ``--semaphore-store postgres`` (with ``--broker amqp``) keeps ours'
semaphores in a PostgreSQL cluster of the script's own (or ``--postgres-url``): the
app has no result backend on any store, so the redis-server keeps only the records
and the baselines' token buckets and py-redis-semaphore. The report says which ran.

    .venv/bin/python benchmarks/bench_rate.py            # full run, about 4 minutes
    .venv/bin/python benchmarks/bench_rate.py --quick    # smoke run
    .venv/bin/python benchmarks/bench_rate.py --json     # machine-readable results
    .venv/bin/python benchmarks/bench_rate.py --scenario pause
    .venv/bin/python benchmarks/bench_rate.py --broker amqp --semaphore-redis plain
    .venv/bin/python benchmarks/bench_rate.py --broker amqp --semaphore-store postgres

Every figure comes from outside the semaphores: each task body records its own start
and end (``time.time()``, same machine), ``request.retries`` and the plugin's waits; a
thread samples the messages the workers hold (the Redis transport's ``unacked`` hash;
on RabbitMQ, which has none, ``inspect`` reserved + scheduled every second).
Without rate limits in the package (before the feature), only the baselines run.
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
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import redis
from bench_celery import (
    Topology,
    add_topology_arguments,
    check_topology_arguments,
    rabbitmq_version_of,
    started_topology,
    topology_line,
)

import celery_semaphore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # devkit/, beside the package
from devkit.measures import kendall_tau, peak_overlap
from devkit.processes import Processes, worker_command
from devkit.reporting import package_version, verdict

HERE = Path(__file__).resolve().parent
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
SAMPLE_EVERY = 0.05
INSPECT_EVERY = 1.0  # RabbitMQ: seconds between two inspect samples of the messages held
PAUSE_TOLERANCE = 0.1

TARGETS = {
    "window_starts_max_over_rate": 1,  # at most R + 1 starts in any 1 s window
    "rate_ratio_min": 0.98,
    "waits_mean_max": 1.1,
    "held_max_per_process": 2,
    "kendall_tau_min": 0.99,
    "makespan_over_binding_max": 1.05,
    "pause_tolerance_s": PAUSE_TOLERANCE,
}


@dataclass(frozen=True)
class Settings:
    workers: int  # K
    concurrency: int  # C
    rate: float  # accuracy: R, starts per second, cluster-wide
    rate_tasks: int
    rate_hold: float
    both_limit: int
    both_rate: float
    both_tasks: int
    both_hold: float
    pause_rate: float
    pause_tasks: int
    pause_hold: float
    pause_index: int  # the task (0-based, in submission order) that asks for the pause
    pause_s: float
    bucket_jitter: float  # the token-bucket recipe's jitter, uniform(0, this) seconds

    @property
    def processes(self) -> int:
        return self.workers * self.concurrency


FULL = Settings(
    workers=2,
    concurrency=4,
    rate=20,
    rate_tasks=400,
    rate_hold=0.01,
    both_limit=3,
    both_rate=10,
    both_tasks=200,
    both_hold=0.2,
    pause_rate=10,
    pause_tasks=60,
    pause_hold=0.01,
    pause_index=9,
    pause_s=2.0,
    bucket_jitter=1.0,
)
QUICK = replace(
    FULL, concurrency=2, rate_tasks=60, both_tasks=30, pause_tasks=20, pause_index=4
)  # fmt: skip

# Per scenario: (task, column label). Labels of Celery's rate_limit columns are filled
# in from the settings (they show the rate a worker gets).
SCENARIOS = ("accuracy", "both", "pause")
VARIANTS = {
    "accuracy": ["rate_ours", "rate_ours_countdown", "rate_celery", "rate_celery_split",
                 "rate_bucket"],
    "both": ["both_ours", "both_baseline"],
    "pause": ["pause_ours", "pause_celery", "pause_bucket"],
}  # fmt: skip
OURS = {"rate_ours", "rate_ours_countdown", "both_ours", "pause_ours"}


def labels(s: Settings) -> dict[str, str]:
    return {
        "rate_ours": "handover",
        "rate_ours_countdown": "countdown",
        "rate_celery": f"celery {s.rate:g}/s",
        "rate_celery_split": f"celery {s.rate / s.workers:g}/s",
        "rate_bucket": "token bucket",
        "both_ours": "ours",
        "both_baseline": f"celery {s.both_rate / s.workers:g}/s + prs",
        "pause_ours": "ours",
        "pause_celery": f"celery {s.pause_rate / s.workers:g}/s",
        "pause_bucket": "token bucket",
    }


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: everything stops


# --------------------------------------------------------------------------- running


def held_source(*, rabbitmq: bool) -> str:
    """Where HeldSampler reads the messages the workers hold."""
    if rabbitmq:
        return f"inspect reserved + scheduled, every {INSPECT_EVERY:g} s"
    return f"the unacked hash, every {SAMPLE_EVERY:g} s"


class HeldSampler:
    """The messages the workers hold, and how many of them carry an ETA (countdowns,
    hand-overs for a later slot). On a Redis broker every 50 ms the transport's
    ``unacked`` hash (delivered and not acked: prefetched, held by a rate limit,
    countdown retries); on RabbitMQ (``broker`` None), which has no such hash, every
    second what ``inspect().reserved()`` and ``.scheduled()`` list (scheduled: the
    ETA ones), asked of ``destination`` only. Inspect does not list the requests
    Celery's own ``rate_limit`` holds in its buckets: on RabbitMQ the ``rate_limit``
    baselines' peaks read low."""

    def __init__(
        self, broker: redis.Redis | None, *, app: Any = None, destination: list[str] | None = None
    ) -> None:
        self.broker = broker
        self.app, self.destination = app, destination or []
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        target = self._inspect if broker is None else self._run
        self._thread = threading.Thread(target=target, name="bench-held", daemon=True)

    @property
    def source(self) -> str:
        return held_source(rabbitmq=self.broker is None)

    def _run(self) -> None:
        assert self.broker is not None
        while not self._stop.wait(SAMPLE_EVERY):
            held = self.broker.hvals("unacked")
            with_eta = sum(1 for m in held if json.loads(m)[0]["headers"].get("eta"))
            self.samples.append((len(held), with_eta))

    def _inspect(self) -> None:
        while True:  # the first sample at once, then every INSPECT_EVERY s
            inspect = self.app.control.inspect(destination=self.destination, timeout=1.0)
            try:
                reserved = sum(len(v) for v in (inspect.reserved() or {}).values())
                scheduled = sum(len(v) for v in (inspect.scheduled() or {}).values())
            except Exception as exc:  # noqa: BLE001: a sample lost is no reason to stop
                log(f"inspect sample failed: {exc!r}")
            else:
                self.samples.append((reserved + scheduled, scheduled))
            if self._stop.wait(INSPECT_EVERY):
                return

    @contextmanager
    def running(self) -> Iterator[HeldSampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


def run_phase(
    bench: ModuleType,
    task_name: str,
    count: int,
    arguments: Callable[[int], tuple[Any, ...]],
    *,
    records: redis.Redis,
    sampler: HeldSampler,
    timeout: float,
) -> dict[str, Any]:
    """Submit ``count`` tasks in a loop of ``.delay()`` and wait (at most ``timeout``
    seconds) until every body has run; what the bodies and the sampler saw."""
    task = getattr(bench, task_name)
    key, raises = bench.records_key(task_name), bench.raises_key(task_name)
    records.delete(key, raises, *(bench.in_place_key(s) for s in bench.SEMAPHORES.values()))
    load_before = os.getloadavg()[0]
    with sampler.running():
        first_submit = time.time()
        for i in range(count):
            task.delay(*arguments(i))
        submitted = time.time()
        deadline = time.monotonic() + timeout
        while records.llen(key) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the last body's record is written after its task ended
    runs = [json.loads(r) for r in records.lrange(key, 0, -1)]
    semaphore = bench.SEMAPHORES.get(task_name)
    in_place = records.lrange(bench.in_place_key(semaphore), 0, -1) if semaphore else []
    if len(runs) < count:
        log(f"  {task_name}: only {len(runs)} of {count} ran within {timeout:.0f} s")
    return {
        "first_submit": first_submit,
        "submitted": submitted,
        "runs": runs,
        "raises": [json.loads(r) for r in records.lrange(raises, 0, -1)],
        "held": sampler.samples,
        "held_source": sampler.source,
        "in_place": [json.loads(w) for w in in_place],
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "timed_out": len(runs) < count,
    }


class Workers:
    """K ``celery worker`` processes of the bench app (devkit.processes: each in a session
    of its own, stopped warm, then SIGKILL to the whole process group)."""

    def __init__(self, env: dict[str, str], settings: Settings, log_dir: Path, level: str):
        self.env = env
        self.settings = settings
        self.level = level
        self.processes = Processes(log_dir, cwd=HERE)

    def start(self, queue: str, ready: Callable[[], int]) -> None:
        for i in range(self.settings.workers):
            command = worker_command(
                "bench_rate_app", f"rate{i + 1}", concurrency=self.settings.concurrency,
                loglevel=self.level, queues=queue,
            )  # fmt: skip
            self.processes.start(f"{queue}-worker{i + 1}", command, env=self.env)
        deadline = time.monotonic() + READY_TIMEOUT
        while ready() < self.settings.workers:
            if not all(child.alive() for child in self.processes):
                raise RuntimeError(f"a worker exited at start:\n{self.processes.tails()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"workers not ready after {READY_TIMEOUT:.0f} s:\n{self.processes.tails()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        self.processes.stop_all(STOP_TIMEOUT)


# --------------------------------------------------------------------------- figures


def window_max(starts: list[float], width: float = 1.0) -> int:
    """Most starts in any window [t, t + width) (the windows that begin at a start are
    enough: sliding a window to its first start only drops starts before it)."""
    ordered = sorted(starts)
    return max((bisect_left(ordered, s + width) - i for i, s in enumerate(ordered)), default=0)


def common(phase: dict[str, Any], rate: float) -> dict[str, Any]:
    """The figures every scenario shows."""
    runs = sorted(phase["runs"], key=lambda r: (r["start"], r["index"]))
    if not runs:
        return {"tasks_run": 0, "timed_out": True}
    starts = [r["start"] for r in runs]
    first, last = starts[0], starts[-1]
    last_end = max(r["end"] for r in runs)
    long_run = (len(runs) - 1) / (last - first) if last > first else float("nan")
    waits = [float(r["waits"]) for r in runs]
    return {
        "tasks_run": len(runs),
        "distinct_tasks": len({r["index"] for r in runs}),
        "timed_out": phase["timed_out"],
        "window_starts_max": window_max(starts),
        "long_run_rate": long_run,
        "rate_ratio": long_run / rate,
        "waits_mean": statistics.fmean(waits),
        "waits_max": max(waits),
        "body_retries_mean": statistics.fmean(float(r["retries"]) for r in runs),
        "held_peak": max((held for held, _ in phase["held"]), default=0),
        "held_source": phase["held_source"],
        "held_with_eta_peak": max((eta for _, eta in phase["held"]), default=0),
        "in_place": in_place(phase["in_place"]),
        "kendall_tau": kendall_tau([r["index"] for r in runs]),
        "peak_running": peak_overlap([(r["start"], r["end"]) for r in runs]),
        "makespan_s": last_end - first,
        "makespan_from_submit_s": last_end - phase["first_submit"],
        "submit_s": phase["submitted"] - phase["first_submit"],
        "first_start_after_submit_s": first - phase["first_submit"],
        "worker_share": _worker_share(runs),
        "load_average_1min": phase["load_average_1min"],
    }


def in_place(waits: list[dict[str, Any]]) -> dict[str, Any]:
    """Waits in place: worker processes blocked in ``Semaphore.wait_for_turn``."""
    durations = [w["end"] - w["start"] for w in waits]
    return {
        "count": len(waits),
        "granted": sum(1 for w in waits if w["granted"]),
        "process_seconds": sum(durations),
        "mean_s": statistics.fmean(durations) if durations else 0.0,
        "peak_processes": peak_overlap([(w["start"], w["end"]) for w in waits]),
    }


def _worker_share(runs: list[dict[str, Any]]) -> dict[str, int]:
    share: dict[str, int] = {}
    for r in runs:
        share[r["worker"]] = share.get(r["worker"], 0) + 1
    return dict(sorted(share.items()))


def pause_figures(phase: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """From the raise (the body's own time): the gap to the next start of any task of the
    semaphore, who started first after it, starts inside the pause, the order after it."""
    if not phase["raises"] or not phase["runs"]:
        return {"raised": False}
    raised = phase["raises"][0]
    at = raised["at"]
    after = sorted((r for r in phase["runs"] if r["start"] > at), key=lambda r: r["start"])
    if not after:
        return {"raised": True, "raise_index": raised["index"], "starts_after": 0}
    rerun = [r for r in after if r["index"] == raised["index"]]
    inside = [r for r in after if r["start"] < at + settings.pause_s - PAUSE_TOLERANCE]
    return {
        "raised": True,
        "raise_index": raised["index"],
        "gap_s": after[0]["start"] - at,
        "raiser_first": after[0]["index"] == raised["index"],
        "first_after_index": after[0]["index"],
        "raiser_rerun_after_s": rerun[0]["start"] - at if rerun else None,
        "raiser_rerun_retries": rerun[0]["retries"] if rerun else None,
        "raiser_rerun_waits": rerun[0]["waits"] if rerun else None,
        "starts_in_pause": len(inside),
        "starts_after": len(after),
        "kendall_tau_after": kendall_tau([r["index"] for r in after]),
        "window_starts_max_after": window_max([r["start"] for r in after]),
    }


# --------------------------------------------------------------------------- scenarios


def scenario_phases(
    scenario: str, settings: Settings
) -> tuple[int, float, float, Callable[[str], Callable[[int], tuple[Any, ...]]]]:
    """(tasks, hold, rate, the task arguments by task name and index) of a scenario."""
    s = settings
    if scenario == "accuracy":
        return s.rate_tasks, s.rate_hold, s.rate, lambda _: lambda i: (i, s.rate_hold)
    if scenario == "both":
        return s.both_tasks, s.both_hold, s.both_rate, lambda _: lambda i: (i, s.both_hold)
    tag = f"{time.time():.6f}"
    return (
        s.pause_tasks, s.pause_hold, s.pause_rate,
        lambda name: lambda i: (i, s.pause_hold, s.pause_index, f"{name}-{tag}"),
    )  # fmt: skip


@dataclass
class Bench:
    """What every variant runs with: the app, the workers' environment, the clients."""

    app: ModuleType
    worker_env: dict[str, str]
    settings: Settings
    records: redis.Redis
    broker: redis.Redis | None  # None: RabbitMQ
    log_dir: Path
    loglevel: str

    def held_sampler(self) -> HeldSampler:
        """A sampler of the messages the running workers hold."""
        if self.broker is not None:
            return HeldSampler(self.broker)
        names = sorted(m.decode() for m in self.records.smembers(self.app.READY_KEY))
        return HeldSampler(None, app=self.app.app, destination=names)

    @contextmanager
    def workers(self, name: str) -> Iterator[Workers]:
        """Fresh workers consuming only the queue of task ``name``, warmed up; stopped at
        the end, and on a Redis broker the variant's leftovers (its queue, the
        transport's unacked bookkeeping) deleted, so a variant that timed out leaves
        nothing behind (on RabbitMQ its queues are the run's, deleted at the end)."""
        queue = self.app.queue_of(name)
        self.records.delete(self.app.READY_KEY)
        workers = Workers(self.worker_env, self.settings, self.log_dir, self.loglevel)
        try:
            workers.start(queue, lambda: int(self.records.scard(self.app.READY_KEY)))
            warm_up(self.app, self.settings, self.records, name)
            yield workers
        except Exception:
            log(f"worker logs ({self.log_dir}):\n{workers.processes.tails()}")
            raise
        finally:
            workers.stop()
            if self.broker is not None:
                leftovers = list(self.broker.scan_iter(match=f"{queue}*"))  # and its handover
                self.broker.delete("unacked", "unacked_index", "unacked_mutex", *leftovers)


def run_scenario(scenario: str, bench: Bench, raw: dict[str, Any]) -> dict[str, Any]:
    settings = bench.settings
    count, hold, rate, arguments = scenario_phases(scenario, settings)
    ideal = (count - 1) / rate + hold
    if scenario == "pause":
        ideal += settings.pause_s
    # Celery's rate_limit on the Redis transport can drop to about a task per second per
    # worker (celery/celery#5927): a bounded run reports how far such a variant got.
    timeout = 1.5 * ideal + 5
    figures: dict[str, Any] = {"ideal_s": ideal, "variants": {}}
    raw[scenario] = {}
    for name in VARIANTS[scenario]:
        if name in OURS and not bench.app.HAVE_RATES:
            log(f"{scenario}, {name}: skipped (this celery_semaphore has no rate limits)")
            continue
        log(f"{scenario}, {labels(settings)[name]}: {count} tasks of {hold:g} s")
        with bench.workers(name):
            phase = run_phase(
                bench.app, name, count, arguments(name),
                records=bench.records, sampler=bench.held_sampler(), timeout=timeout,
            )  # fmt: skip
        raw[scenario][name] = phase
        result = common(phase, rate)
        if scenario == "pause":
            result["pause"] = pause_figures(phase, settings)
        figures["variants"][name] = result
    return figures


# --------------------------------------------------------------------------- report


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    last = len(rows[0]) - 1
    for n, cells in enumerate(rows):
        print("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) if i < last else c
                        for i, c in enumerate(cells)).rstrip())  # fmt: skip
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _ours_verdict(figures: dict[str, Any], check: Callable[[dict[str, Any]], bool]) -> str:
    verdicts = [
        verdict(check(f)) for name, f in figures.items() if name in OURS and f.get("tasks_run")
    ]
    return ", ".join(verdicts) if verdicts else "(ours not run)"


def _load(f: dict[str, Any]) -> str:
    before, after = f["load_average_1min"]
    return f"{before:.1f} / {after:.1f}"


def print_scenario(scenario: str, results: dict[str, Any]) -> None:
    s = Settings(**results["settings"])
    figures = results["scenarios"][scenario]
    runs = {n: f for n, f in figures["variants"].items() if f.get("tasks_run")}
    names = [n for n in VARIANTS[scenario] if n in runs]
    if not names:
        print(f"\n{scenario}: nothing ran")
        return
    label = labels(s)
    held_max = TARGETS["held_max_per_process"] * s.processes

    def row(title: str, cell: Callable[[dict[str, Any]], str], target: str = "") -> list[str]:
        return [title, *(cell(runs[n]) for n in names), target]

    def ours(check: Callable[[dict[str, Any]], bool]) -> str:
        return _ours_verdict(runs, check)

    header = ["figure", *(label[n] for n in names), "target (ours)"]
    ideal = figures["ideal_s"]
    if scenario == "accuracy":
        window = s.rate + TARGETS["window_starts_max_over_rate"]
        print(
            f"\naccuracy: N={s.rate_tasks} tasks x {s.rate_hold:g} s at R={s.rate:g}/s "
            f"cluster-wide, submitted in a loop of .delay() (ideal (N-1)/R + H = {ideal:.2f} s)"
        )
        rows = [
            header,
            row("most starts in any 1 s window", lambda f: str(f["window_starts_max"]),
                f"<= {window:g}  {ours(lambda f: f['window_starts_max'] <= window)}"),
            row("long-run rate, (n-1) / (last - first start)",
                lambda f: f"{f['long_run_rate']:.2f}/s"),
            row("long-run rate / R", lambda f: f"{f['rate_ratio']:.3f}",
                f">= {TARGETS['rate_ratio_min']}  "
                f"{ours(lambda f: f['rate_ratio'] >= TARGETS['rate_ratio_min'])}"),
            *_waits_rows(row, ours),
            row("messages held by workers, peak", lambda f: str(f["held_peak"]),
                f"<= {held_max} (2 x {s.processes} processes)  "
                f"{ours(lambda f: f['held_peak'] <= held_max)}"),
            row("  of which with an ETA, peak", lambda f: str(f["held_with_eta_peak"])),
            *_in_place_rows(row),
            row("Kendall tau, start vs submit order", lambda f: f"{f['kendall_tau']:.3f}",
                f">= {TARGETS['kendall_tau_min']}  "
                f"{ours(lambda f: f['kendall_tau'] >= TARGETS['kendall_tau_min'])}"),
            *_makespan_rows(row, ideal),
            *_tail_rows(row, s.rate_tasks),
        ]  # fmt: skip
    elif scenario == "both":
        window = s.both_rate + TARGETS["window_starts_max_over_rate"]
        binding = s.both_tasks / min(s.both_rate, s.both_limit / s.both_hold)
        over = TARGETS["makespan_over_binding_max"]
        print(
            f"\nboth: N={s.both_tasks} tasks x {s.both_hold:g} s under limit={s.both_limit} "
            f"and rate={s.both_rate:g}/s (the binding limit allows N / "
            f"{min(s.both_rate, s.both_limit / s.both_hold):g} per s = {binding:.1f} s)"
        )
        rows = [
            header,
            row("most running at once", lambda f: str(f["peak_running"]),
                f"<= {s.both_limit}  {ours(lambda f: f['peak_running'] <= s.both_limit)}"),
            row("most starts in any 1 s window", lambda f: str(f["window_starts_max"]),
                f"<= {window:g}  {ours(lambda f: f['window_starts_max'] <= window)}"),
            row("long-run rate / rate", lambda f: f"{f['rate_ratio']:.3f}"),
            row("makespan, first start..last end (s)", lambda f: f"{f['makespan_s']:.2f}",
                f"binding {binding:.1f}"),
            row("makespan / binding", lambda f: f"{f['makespan_s'] / binding:.3f}",
                f"<= {over}  {ours(lambda f: f['makespan_s'] / binding <= over)}"),
            row("makespan from first submit (s)", lambda f: f"{f['makespan_from_submit_s']:.2f}"),
            *_waits_rows(row, ours),
            row("messages held by workers, peak", lambda f: str(f["held_peak"])),
            *_in_place_rows(row),
            row("Kendall tau, start vs submit order", lambda f: f"{f['kendall_tau']:.3f}"),
            *_tail_rows(row, s.both_tasks),
        ]  # fmt: skip
    else:
        tol = TARGETS["pause_tolerance_s"]
        print(
            f"\npause: N={s.pause_tasks} tasks x {s.pause_hold:g} s at {s.pause_rate:g}/s; task "
            f"#{s.pause_index} (0-based, submission order) asks for a {s.pause_s:g} s pause once"
        )

        def pause(key: str, fmt: str = "{}") -> Callable[[dict[str, Any]], str]:
            def cell(f: dict[str, Any]) -> str:
                value = f["pause"].get(key)
                return "-" if value is None else fmt.format(value)

            return cell

        def gap_ok(f: dict[str, Any]) -> bool:
            gap = f["pause"].get("gap_s")
            return gap is not None and abs(gap - s.pause_s) <= tol

        rows = [
            header,
            row("raise -> next start of any task (s)", pause("gap_s", "{:.3f}"),
                f"{s.pause_s:g} +- {tol:g}  {ours(gap_ok)}"),
            row("starts inside the pause", pause("starts_in_pause"),
                f"0  {ours(lambda f: f['pause'].get('starts_in_pause') == 0)}"),
            row("first to start after the raise: the raiser?",
                pause("raiser_first", "{}"),
                f"True  {ours(lambda f: bool(f['pause'].get('raiser_first')))}"),
            row("first to start after the raise (index)", pause("first_after_index")),
            row("raise -> the raiser's rerun (s)", pause("raiser_rerun_after_s", "{:.3f}")),
            row("the raiser's rerun: request.retries / waits",
                lambda f: f"{f['pause'].get('raiser_rerun_retries')} / "
                          f"{f['pause'].get('raiser_rerun_waits')}"),
            row("Kendall tau of the starts after the raise", pause("kendall_tau_after", "{:.3f}"),
                f">= {TARGETS['kendall_tau_min']}  "
                f"{ours(lambda f: f['pause'].get('kendall_tau_after', 0) >= TARGETS['kendall_tau_min'])}"),  # noqa: E501
            row("most starts in 1 s, after the raise", pause("window_starts_max_after"),
                f"<= {s.pause_rate + 1:g}"),
            *_waits_rows(row, ours),
            *_in_place_rows(row),
            row("makespan, first start..last end (s)", lambda f: f"{f['makespan_s']:.2f}",
                f"ideal {ideal:.2f}"),
            *_tail_rows(row, s.pause_tasks),
        ]  # fmt: skip
    _table(rows)
    if any(f["timed_out"] for f in runs.values()):
        print(
            "(timed out: the phase stopped at 1.5 x ideal + 5 s. Celery's rate_limit on the "
            "Redis transport runs about one task per second per worker once the first burst "
            "is over, celery/celery#5927)"
        )


def _waits_rows(row: Callable[..., list[str]], ours: Callable[..., str]) -> list[list[str]]:
    limit = TARGETS["waits_mean_max"]
    return [
        row("waits (retries to start) / task, mean (max)",
            lambda f: f"{f['waits_mean']:.2f} ({f['waits_max']:.0f})",
            f"<= {limit}  {ours(lambda f: f['waits_mean'] <= limit)}"),
        row("request.retries seen by the body, mean", lambda f: f"{f['body_retries_mean']:.2f}"),
    ]  # fmt: skip


def _in_place_rows(row: Callable[..., list[str]]) -> list[list[str]]:
    return [
        row("waits in place (granted)",
            lambda f: f"{f['in_place']['count']} ({f['in_place']['granted']})"),
        row("processes blocked in place: peak, proc-s",
            lambda f: f"{f['in_place']['peak_processes']}, "
                      f"{f['in_place']['process_seconds']:.1f}"),
    ]  # fmt: skip


def _makespan_rows(row: Callable[..., list[str]], ideal: float) -> list[list[str]]:
    return [
        row("makespan, first start..last end (s)", lambda f: f"{f['makespan_s']:.2f}",
            f"ideal {ideal:.2f}"),
        row("makespan from first submit (s)", lambda f: f"{f['makespan_from_submit_s']:.2f}"),
    ]  # fmt: skip


def _tail_rows(row: Callable[..., list[str]], count: int) -> list[list[str]]:
    return [
        row("tasks run / distinct",
            lambda f: f"{f['tasks_run']} / {f['distinct_tasks']}"
                      + (" (timed out)" if f["timed_out"] else ""),
            f"{count} / {count}"),
        row("bodies per worker", lambda f: "/".join(str(v) for v in f["worker_share"].values())),
        row("load average 1 min, before / after", _load),
    ]  # fmt: skip


def print_report(results: dict[str, Any]) -> None:
    s, env, where = Settings(**results["settings"]), results["environment"], results["topology"]
    print(
        f"rates end to end: K={s.workers} workers x C={s.concurrency} prefork processes, "
        f"prefetch multiplier 4 (Celery's default)"
    )
    print(
        f"{topology_line(where, env['rabbitmq'], env['postgres_server'])}; messages held by "
        f"workers sampled from {results['held_source']}"
    )
    print(
        f"celery {env['celery']}, celery-semaphore {env['celery_semaphore']} "
        f"({'with' if env['have_rates'] else 'WITHOUT'} rate limits, from "
        f"{env['celery_semaphore_from']}), redis-server {env['redis_server']} (private), "
        f"redis-py {env['redis_py']}, Python {env['python']}, {env['cpus']} CPUs, "
        f"load average {env['load_average_1min'][0]:.1f} before / "
        f"{env['load_average_1min'][1]:.1f} after"
    )
    print(
        "baselines: celery N/s = Celery's rate_limit (per worker); token bucket = a Lua "
        f"bucket (capacity 1) in the body, refused -> self.retry(countdown=next token + "
        f"uniform(0, {s.bucket_jitter:g})); prs = py-redis-semaphore acquire(blocking=False), "
        "refused -> self.retry(countdown=uniform(0, min(2, 0.1 * 2**retries)))"
    )
    for scenario in SCENARIOS:
        if scenario in results["scenarios"]:
            print_scenario(scenario, results)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    parser.add_argument(
        "--scenario", choices=[*SCENARIOS, "all"], default="all", help="one scenario, or all"
    )
    add_topology_arguments(parser)
    parser.add_argument("--worker-loglevel", default="warning")
    parser.add_argument("--log-dir", type=Path, help="keep the worker logs in this directory")
    parser.add_argument(
        "--dump", type=Path, help="write every record (bodies, raises, samples) to this JSON file"
    )
    args = parser.parse_args(argv)
    check_topology_arguments(parser, args)
    return args, QUICK if args.quick else FULL


def bench_environment(where: Topology, settings: Settings) -> tuple[ModuleType, dict[str, str]]:
    """The bench app, configured for ``where`` and ``settings``, and the workers' environment."""
    env = {
        **where.env(),  # bench_app's variables; bench_rate_app reads those it shares
        "BENCH_QUEUE_PREFIX": f"{where.queue}-" if where.tag else "",
        "BENCH_WORKERS": str(settings.workers),
        "BENCH_RATE": repr(settings.rate),
        "BENCH_BOTH_LIMIT": str(settings.both_limit),
        "BENCH_BOTH_RATE": repr(settings.both_rate),
        "BENCH_PAUSE_RATE": repr(settings.pause_rate),
        "BENCH_PAUSE_S": repr(settings.pause_s),
        "BENCH_BUCKET_JITTER": repr(settings.bucket_jitter),
    }
    os.environ.update(env)
    worker_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
    }
    sys.path.insert(0, str(HERE))
    import bench_rate_app

    return bench_rate_app, worker_env


def warm_up(bench: ModuleType, settings: Settings, records: redis.Redis, name: str) -> None:
    """Every pool process imports, connects and runs a task or so (on the queue of
    task ``name``)."""
    count = 4 * settings.processes
    records.delete(bench.records_key("warm"))
    for i in range(count):
        bench.warm.apply_async((i,), queue=bench.queue_of(name))
    deadline = time.monotonic() + 30
    while records.llen(bench.records_key("warm")) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def run(
    args: argparse.Namespace, settings: Settings, where: Topology, raw: dict[str, Any]
) -> dict[str, Any]:
    app, worker_env = bench_environment(where, settings)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-rate-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    bench = Bench(
        app, worker_env, settings, records=where.bench.client(db=2),
        broker=where.broker_client(), log_dir=log_dir, loglevel=args.worker_loglevel,
    )  # fmt: skip
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    log(f"each variant on fresh workers: {settings.workers} x {settings.concurrency} processes")
    try:
        return {scenario: run_scenario(scenario, bench, raw) for scenario in scenarios}
    finally:
        bench.records.close()
        if bench.broker is not None:
            bench.broker.close()
        app.app.close()
        if args.log_dir is None:
            shutil.rmtree(log_dir, ignore_errors=True)


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
        figures = run(args, settings, where, raw)
        have_rates = bool(sys.modules["bench_rate_app"].HAVE_RATES)
    if args.dump:
        args.dump.write_text(json.dumps(raw))
    results = {
        "quick": args.quick,
        "elapsed_s": time.perf_counter() - started,
        "broker": args.broker,
        "semaphore_store": where.store,
        "semaphore_redis": args.semaphore_redis if where.store == "redis" else None,
        "topology": {**where.describe(), "amqp_cleanup": where.cleanup or None},
        "held_source": held_source(rabbitmq=where.amqp),
        "settings": asdict(settings),
        "environment": {
            "celery": package_version("celery"),
            "celery_semaphore": package_version("celery-semaphore"),
            "have_rates": have_rates,
            "redis_server": redis_version,
            "rabbitmq": rabbitmq_version,
            "postgres_server": postgres_version,
            "redis_py": package_version("redis"),
            "py_redis_semaphore": package_version("py-redis-semaphore"),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1min": [load_before, os.getloadavg()[0]],
            "celery_semaphore_from": str(Path(celery_semaphore.__file__).parent),
        },
        "scenarios": figures,
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
        log("interrupted; the workers and the private servers were stopped")
        sys.exit(130)
