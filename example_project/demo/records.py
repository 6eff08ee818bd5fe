"""What a run sends and records, and what the report measures from the records: the plan
of tasks, the tasks' own records (`Run`), the samples of the line, idle permits and what a
dip waited for."""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from devkit.measures import levels

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
