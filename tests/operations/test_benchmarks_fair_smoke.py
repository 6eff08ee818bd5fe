"""benchmarks/bench_fair.py --quick --json --countdown runs end to end and reports every
figure, each a number in its range.

Timings and the targets are not asserted (the benchmark prints them next to their
targets); the cap is: never more task bodies at once than the limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fair.py"
NOISY_POSITIVE = (
    "a_submit_s", "b_submit_s", "b_first_start_s", "b_last_start_s", "efficiency",
    "busy_permit_share", "makespan_s", "ideal_s", "a_started_before_b_last",
)  # fmt: skip


def test_quick_run_reports_every_figure() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--countdown", "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=360,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout)
    assert results["quick"] is True
    limit, scenario = results["settings"]["limit"], results["scenario"]
    load = results["environment"]["load_average"]
    assert len(load["before"]) == len(load["after"]) == 3

    noisy = results["noisy"]
    assert set(noisy) == {"fair", "fair_countdown", "unfair"}
    tasks = scenario["a_tasks"] + scenario["b_tasks"]
    for mode, figures in noisy.items():
        assert figures["tasks_run"] == figures["distinct_tasks"] == tasks, mode
        for key in NOISY_POSITIVE:
            assert figures[key] > 0, (mode, key)
        assert figures["b_last_start_s"] >= figures["b_first_start_s"], mode
        share = figures["b_share"]
        assert share["windows"] >= 1, mode
        assert 0 <= share["min"] <= share["median"] <= share["max"] <= 1, mode
        assert 0 < share["whole"] <= 1, mode
        for key in ("kendall_tau_a", "kendall_tau_b"):
            assert -1 <= figures[key] <= 1, (mode, key)
        assert 1 <= figures["peak_overlap"] <= limit, mode
        assert figures["waits_mean"] >= 0, mode
        assert 0 <= figures["handoff_gap_median_s"] <= figures["handoff_gap_p90_s"], mode

    priority = results["priority"]
    assert set(priority) == {"prioritized", "baseline"}
    for side, figures in priority.items():
        assert figures["tasks_run"] == figures["distinct_tasks"] == scenario["line_tasks"] + 1
        assert figures["line_waiting_at_publish"] > 0, side
        assert 0 <= figures["starts_before_urgent"] <= figures["line_waiting_at_publish"], side
        assert figures["urgent_wait_s"] > 0, side
        assert -1 <= figures["kendall_tau_line"] <= 1, side
    assert priority["prioritized"]["urgent_priority_seen"] == scenario["urgent_priority"]
    assert priority["baseline"]["starts_before_urgent"] > 0

    targets = results["targets"]
    assert targets["urgent_starts_before_max"] == limit
    assert all(isinstance(v, int | float) and v > 0 for v in targets.values()), targets
