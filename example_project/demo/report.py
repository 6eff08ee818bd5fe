"""The report: what the partner saw, throughput, waiting, the line, fairness, the other caps."""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from devkit.measures import kendall_tau, levels, peak_overlap, percentile, steps
from example_project.demo.terminal import paint, say

PARTNER_SEMAPHORE = "partner-api"
REPORTS_QUEUE = "reports"


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

LINE_EVERY = 0.1  # seconds between two readings of the partner-api line
IN_PLACE = "waiting in place"  # WaiterInfo.state of a task blocked in a worker for its turn
# Where a task sent but not started waits, front of the line first: (key, short, label).
LINE_PARTS = (
    ("in_place", "in place", "waiting in place at a worker"),
    ("handed_over", "handed over", "handed over, on its way to a worker"),
    ("asking", "asking", "a place taken at publish, or asking again"),
    ("parked", "parked", "parked in Redis"),
    ("no_place", "no place", "in the broker without a place in line"),
)


@dataclass(frozen=True)
class LineSample:
    """One reading of a semaphore's line (``Semaphore.status()``), split by waiter state."""

    at: float
    parked: int
    handed_over: int
    in_place: int
    asking: int

    @property
    def in_line(self) -> int:
        return self.parked + self.handed_over + self.in_place + self.asking


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
    line: list[LineSample] = field(default_factory=list)  # the partner-api line, sampled
    # what the worker processes did: one record per execution (tasks.EXECUTIONS), and how many
    # processes there were (0: not known)
    executions: list[dict[str, Any]] = field(default_factory=list)
    processes: int = 0

    def bodies(self, task: str) -> dict[str, dict[str, Any]]:
        """task id -> {start, end, ok, waits, retries, key} of the last execution of each."""
        out: dict[str, dict[str, Any]] = {}
        for event in self.events:
            if event["task"] != task:
                continue
            body = out.setdefault(event["id"], {"key": event["key"]})
            if event["event"] == "start":
                body.update(start=event["at"], waits=event["waits"], retries=event["retries"])
            elif event["event"] == "end":
                body.update(end=event["at"], ok=event.get("ok"), error=event.get("error"))
        return out

    def intervals(self, task: str, key: Any = None) -> list[tuple[float, float]]:
        return [
            (b["start"], b["end"])
            for b in self.bodies(task).values()
            if "start" in b and "end" in b and (key is None or b["key"] == key)
        ]

    def first_starts(self, task: str) -> dict[str, float]:
        """task id -> when its body first started (a task's own retries start it again)."""
        out: dict[str, float] = {}
        for event in self.events:
            if event["task"] == task and event["event"] == "start":
                out[event["id"]] = min(out.get(event["id"], math.inf), event["at"])
        return out

    def not_started(self, task: str) -> list[tuple[float, int]]:
        """(time, how many were sent and had not started) after each change, from the records:
        the whole line, wherever each task waited."""
        sent = [(at, 1) for at, _, name, _ in self.submitted.values() if name == task]
        started = [(at, -1) for at in self.first_starts(task).values()]
        return levels(sent + started)

    def line_parts(self, task: str) -> list[tuple[float, dict[str, int]]]:
        """Each sample of the line split as LINE_PARTS: the sampled states, and the tasks sent
        and not started at that moment that held no place (their place lapsed, or not taken)."""
        outside = self.not_started(task)
        times = [at for at, _ in outside]
        parts = []
        for sample in self.line:
            i = bisect_right(times, sample.at)
            waiting = outside[i - 1][1] if i else 0
            parts.append(
                (
                    sample.at,
                    {
                        "in_place": sample.in_place,
                        "handed_over": sample.handed_over,
                        "asking": sample.asking,
                        "parked": sample.parked,
                        "no_place": max(0, waiting - sample.in_line),
                    },
                )
            )
        return parts


@dataclass
class Idle:
    """When a capped task's semaphore ran below its cap while some of its tasks waited (sent,
    not started), split by why, from the tasks' records:

    - ``gaps``: the tasks waited for a permit that was free (a hand-over on its way, a
      waiter that is not there yet): the semaphore's own dips;
    - ``busy``: every worker process was busy with other work (a body, or a wait for another
      cap) and none with one of these tasks waiting: they waited for a process, not a permit.
      ``busy_mix``: what the processes did then, on average (task -> (running, waiting)).
    """

    gaps: list[tuple[float, float]] = field(default_factory=list)
    busy: list[tuple[float, float]] = field(default_factory=list)
    busy_mix: dict[str, tuple[float, float]] = field(default_factory=dict)

    @staticmethod
    def longest(spans: Sequence[tuple[float, float]]) -> float:
        return max((end - start for start, end in spans), default=0.0)

    @staticmethod
    def total(spans: Sequence[tuple[float, float]]) -> float:
        return sum(end - start for start, end in spans)


def idle_permits(run: Run, task: str, limit: int) -> Idle:
    """`Idle` of ``task`` (capped at ``limit``): a sweep over every change of the tasks
    waiting, ``task``'s bodies running, and every task's executions and bodies."""
    idle = Idle()
    changes: list[tuple[float, str, str, int]] = []  # (at, what, task, +1 | -1)
    changes += [
        (at, "waiting", task, 1) for at, _, name, _ in run.submitted.values() if name == task
    ]
    changes += [(at, "waiting", task, -1) for at in run.first_starts(task).values()]
    for event in run.events:
        if event["event"] in ("start", "end"):
            delta = 1 if event["event"] == "start" else -1
            changes.append((event["at"], "running", event["task"], delta))
    for execution in run.executions:
        changes.append((execution["taken"], "taken", execution["task"], 1))
        changes.append((execution["at"], "taken", execution["task"], -1))
    if not changes:
        return idle
    changes.sort(key=lambda change: (change[0], change[3]))  # an end before a start
    level: Counter[tuple[str, str]] = Counter()
    mix: Counter[tuple[str, str]] = Counter()  # process-seconds spent in `busy`
    for (at, what, name, delta), (after, *_) in itertools.pairwise([*changes, changes[-1]]):
        level[what, name] += delta
        if after <= at or level["waiting", task] <= 0 or level["running", task] >= limit:
            continue
        taken = sum(n for (kind, _), n in level.items() if kind == "taken")
        in_place = level["taken", task] - level["running", task]
        spans = idle.gaps
        if run.processes and taken >= run.processes and in_place <= 0:
            spans = idle.busy
            for (kind, other), n in level.items():
                if kind == "taken" and n:
                    mix[other, "running"] += level["running", other] * (after - at)
                    mix[other, "waiting"] += (n - level["running", other]) * (after - at)
        if spans and spans[-1][1] == at:
            spans[-1] = (spans[-1][0], after)
        else:
            spans.append((at, after))
    seconds = Idle.total(idle.busy)
    if seconds:
        names = sorted({other for other, _ in mix})
        idle.busy_mix = {
            other: (mix[other, "running"] / seconds, mix[other, "waiting"] / seconds)
            for other in names
        }
    return idle


def head_of_line(run: Run, task: str, at: float, t0: float) -> str:
    """What a dip waited for at ``at`` (its middle), from the records: where the first of
    ``task`` in line (sent first among those sent and not started) was, and how many behind
    it waited in place at a worker process (``t0``: the time the report counts from)."""
    starts = run.first_starts(task)
    waiting = [
        (order, i)
        for i, (sent, order, name, _) in run.submitted.items()
        if name == task and sent <= at and starts.get(i, math.inf) > at
    ]
    if not waiting or not run.executions:
        return ""
    _, head = min(waiting)
    taken = sorted(
        (e["taken"], e["at"]) for e in run.executions if e["id"] == head and e["at"] > at
    )
    in_place = {e["id"] for e in run.executions if e["taken"] <= at < e["at"]}
    behind = sum(1 for _, i in waiting if i != head and i in in_place)
    if taken and taken[0][0] <= at:
        where = "the first call in line was at a worker process"
    elif taken:
        where = f"the first call in line reached a worker process only at {taken[0][0] - t0:.2f}s"
    else:
        where = "the first call in line never reached a worker process"
    return f"{where}, {behind} behind it waited in place"


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
    say("  retries per task (times it was sent back to wait for a permit: parked, or re-queued")
    say("  with a countdown in countdown mode):")
    for task in TASKS:
        counts = Counter(int(b.get("waits", 0)) for b in run.bodies(task).values() if "start" in b)
        if not counts:
            continue
        n = sum(counts.values())
        mean = sum(k * v for k, v in counts.items()) / n
        spread = ", ".join(f"{counts[k]}x{k}" for k in sorted(counts))
        say(f"  {task:<24}mean {mean:.2f}, max {max(counts)}  (tasks x retries: {spread})")


def report_line(run: Run) -> None:
    say(paint(f"== The line ({PARTNER_SEMAPHORE}) ==", "1"))
    outside = run.not_started("call_partner")
    starts = run.first_starts("call_partner")
    if not outside or not starts:
        say("  no partner call started")
        return
    t0 = min(at for at, *_ in run.submitted.values())
    peak_at, peak = max(outside, key=lambda change: change[1])
    say(
        f"  longest line: {peak} call_partner tasks sent and not started, at "
        f"{peak_at - t0:.2f}s (from the tasks' records)"
    )
    parts = run.line_parts("call_partner")
    if parts:
        at, split = max(parts, key=lambda part: sum(part[1].values()))
        every = (parts[-1][0] - parts[0][0]) / max(len(parts) - 1, 1)
        say(
            f"  where they waited, status() every {every * 1000:.0f} ms ({len(parts)} readings); "
            f"at {at - t0:.2f}s, the longest: "
            + ", ".join(f"{split[key]} {short}" for key, short, _ in LINE_PARTS)
        )
        say(
            "  most at once: "
            + ", ".join(f"{short} {max(p[key] for _, p in parts)}" for key, short, _ in LINE_PARTS)
        )
        say("  (" + "; ".join(f"{short}: {label}" for _, short, label in LINE_PARTS) + ")")
    else:
        say("  the line was not sampled")
    last_id = max(
        (i for i in starts if i in run.submitted), key=lambda i: run.submitted[i][1], default=None
    )
    if last_id is not None:
        sent = run.submitted[last_id][0]
        say(
            f"  the last call sent waited {starts[last_id] - sent:.2f}s from submit to start; "
            f"the line was empty {max(starts.values()) - t0:.2f}s after the first submit"
        )


GAP_TARGET = 0.2  # seconds: a dip of the cap while tasks wait for it should not last longer


def report_idle(run: Run, verdict: Verdict) -> None:
    say(paint(f"== Idle permits ({PARTNER_SEMAPHORE}) ==", "1"))
    limit = run.partner_limit
    idle = idle_permits(run, "call_partner", limit)
    if not run.first_starts("call_partner"):
        say("  no partner call started")
        return
    t0 = min(at for at, *_ in run.submitted.values())
    longest = Idle.longest(idle.gaps)
    over = [span for span in idle.gaps if span[1] - span[0] > GAP_TARGET]
    say(
        f"  below the cap ({limit}) while calls waited for a permit: longest {longest:.2f}s, "
        f"{Idle.total(idle.gaps):.2f}s in all ({len(over) or 'none'} longer than {GAP_TARGET:g}s)"
    )
    for start, end in sorted(over, key=lambda span: span[0] - span[1])[:5]:
        why = head_of_line(run, "call_partner", (start + end) / 2, t0)
        say(f"     {end - start:.2f}s from {start - t0:.2f}s" + (f": {why}" if why else ""))
    if over:
        verdict.warnings.append(
            f"{PARTNER_SEMAPHORE} stayed below its cap for up to {longest:.2f}s while calls "
            f"waited for a permit (target: at most {GAP_TARGET:g}s)"
        )
    if not run.processes or not run.executions:
        say("  (the worker processes' executions were not recorded: every dip counts above)")
        return
    if not idle.busy:
        say(f"  below the cap while all {run.processes} worker processes were busy: never")
        return
    first, last = idle.busy[0][0] - t0, idle.busy[-1][1] - t0
    say(
        f"  below the cap while all {run.processes} worker processes were busy with other work: "
        f"{Idle.total(idle.busy):.2f}s in all, between {first:.2f}s and {last:.2f}s"
    )
    running = sorted(((r, name) for name, (r, _) in idle.busy_mix.items() if r), reverse=True)
    say(
        "     those calls waited for a worker process, not for a permit; on average the "
        "processes ran " + ", ".join(f"{r:.1f} {name}" for r, name in running)
    )
    waiting = {name: w for name, (_, w) in idle.busy_mix.items() if w >= 0.05}
    if waiting:
        say(
            f"     and {sum(waiting.values()):.1f} waited for their own caps (in place, or being "
            "parked): " + ", ".join(f"{name} {w:.1f}" for name, w in waiting.items())
        )


def report_fairness(run: Run, verdict: Verdict) -> None:
    say(paint("== Fairness (FIFO) ==", "1"))
    calls = run.bodies("call_partner")
    ordered = [(run.submitted[i][1], b["start"]) for i, b in calls.items() if "start" in b]
    if len(ordered) < 2:
        say("  too few calls to tell")
        return
    tau = kendall_tau([o for o, _ in sorted(ordered, key=lambda p: p[1])])  # submit order, by start
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
    per_customer = {c: peak_overlap(run.intervals("sync_customer", c)) for c in customers}
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
    together = peak_overlap(run.intervals("sync_customer"))
    say(f"     different customers synced in parallel: up to {together} at once")
    reports_peak = peak_overlap(run.intervals("build_report"))
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
        partial(report_line, run),
        partial(report_idle, run, verdict),
        partial(report_fairness, run, verdict),
        partial(report_other_caps, run, verdict),
        partial(report_tasks, run, plan, verdict),
    ]
    for section in sections:
        say()
        section()
    return verdict
