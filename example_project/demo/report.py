"""The report: what the partner saw, throughput, waiting, the line, fairness, the other caps,
printed from a run's records (`example_project.demo.records`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from devkit.measures import kendall_tau, peak_overlap, percentile, steps
from example_project.demo.records import (
    LINE_PARTS,
    PARTNER_SEMAPHORE,
    Idle,
    Plan,
    Run,
    head_of_line,
    idle_permits,
    mean_level,
)
from example_project.demo.terminal import paint, say


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
