"""benchmarks/bench_rate.py --quick --json runs end to end and reports sane figures.

Timings are not asserted (the benchmark prints them next to their targets). What is
asserted holds on any machine: every variant ran each of its tasks once; ours never
started more tasks in a second than its rate allows (20/s and 10/s, burst 1, one
more for the bodies' own jitter) nor ran more than its limit; and after
RateLimited nothing of that rate started inside the pause and the raiser came first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_rate.py"


def test_quick_run_reports_every_variant_and_ours_keeps_its_limits():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout)
    assert results["quick"] is True
    settings, scenarios = results["settings"], results["scenarios"]
    assert set(scenarios) == {"accuracy", "both", "pause"}
    for scenario in scenarios.values():
        for name, figures in scenario["variants"].items():
            if not figures["timed_out"]:
                assert figures["tasks_run"] == figures["distinct_tasks"], name

    accuracy = scenarios["accuracy"]["variants"]
    for name in ("rate_ours", "rate_ours_countdown"):
        assert accuracy[name]["tasks_run"] == settings["rate_tasks"], name
        assert accuracy[name]["window_starts_max"] <= settings["rate"] + 2, name
        assert accuracy[name]["body_retries_mean"] == 0, "waits are not the task's own retries"

    both = scenarios["both"]["variants"]["both_ours"]
    assert both["tasks_run"] == settings["both_tasks"]
    assert both["peak_running"] <= settings["both_limit"]
    assert both["window_starts_max"] <= settings["both_rate"] + 2

    pause = scenarios["pause"]["variants"]["pause_ours"]
    assert pause["tasks_run"] == settings["pause_tasks"]
    assert pause["pause"]["raised"] and pause["pause"]["starts_in_pause"] == 0
    assert pause["pause"]["raiser_first"]
    assert pause["pause"]["gap_s"] >= settings["pause_s"] - 0.05
