"""benchmarks/bench_celery.py --quick --json runs end to end and reports sane figures.

Timings are not asserted (the benchmark prints them next to their targets); the cap is:
no two more task bodies than the limit ever overlapped, seen from the bodies' own times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_celery.py"


def test_quick_run_reports_every_figure_and_never_exceeds_the_limit():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout)
    settings = results["settings"]
    tasks, limit = settings["tasks"], settings["limit"]
    assert results["quick"] is True
    assert tasks > limit >= 1

    for name in ("ours", "baseline"):
        figures = results[name]
        assert figures["tasks_run"] == figures["distinct_tasks"] == tasks, name
        for key in ("makespan_s", "makespan_from_submit_s", "efficiency"):
            assert figures[key] > 0, (name, key)
        assert figures["makespan_from_submit_s"] >= figures["makespan_s"]
        assert figures["peak_overlap"] >= 1, name
        assert -1.0 <= figures["kendall_tau"] <= 1.0, name
        assert 0 <= figures["waits_mean"] <= figures["waits_max"], name
        assert figures["handoff_gap_s"]["count"] == tasks - limit, name

    ours = results["ours"]
    assert ours["peak_overlap"] <= limit
    assert ours["body_retries_max"] == 0  # waits are not the task's own retries
    assert ours["in_place"]["granted"] <= ours["in_place"]["count"]

    backlog = results["backlog"]
    n, backlog_limit = results["backlog_settings"]["tasks"], results["backlog_settings"]["limit"]
    for name in ("ours", "ours_countdown", "baseline", "plain"):
        figures = backlog[name]
        assert figures["tasks_run"] == figures["distinct_tasks"] == n, name
        assert figures["workers_rss_peak_mib"] > 10, name
        assert figures["held_by_workers_peak"] >= 0, name
    for name in ("ours", "ours_countdown", "plain"):  # plain: its workers have L processes
        assert backlog[name]["peak_overlap"] <= backlog_limit, name
    assert backlog["plain"]["worker_processes_used"] == backlog_limit

    noop = results["noop"]
    assert noop["plain_per_s"] > 0
    assert noop["limited_per_s"] > 0
    assert noop["ratio"] == pytest.approx(noop["limited_per_s"] / noop["plain_per_s"])
    assert noop["kept_per_s"] > 0
    assert noop["kept_ratio"] == pytest.approx(noop["kept_per_s"] / noop["plain_per_s"])
    calls = noop["store_calls_per_task"]  # the semaphores are in Redis: counted
    assert set(calls) == {"plain", "limited", "kept"}
    assert all(value is not None and value >= 0 for value in calls.values()), calls
    assert calls["limited"] >= 1  # at least an acquire per task
    assert noop["verdicts"]["noop_kept_calls"] is not None
