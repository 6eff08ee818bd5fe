"""benchmarks/bench_submit.py --quick --json runs end to end and reports every figure.

Timings are not asserted (the benchmark prints them next to the target); what is: the
limited tasks were parked at publish (all but the first few, whose turn is near), in
about one script run each, and the two-call path in about two.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_submit.py"


def test_quick_run_parks_the_backlog_in_one_script_run_per_task() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout)
    assert results["quick"] is True
    n, kinds = results["n"], results["kinds"]
    assert set(kinds) == {"plain", "limited", "two_calls"}
    assert len(results["load_average_1min"]) == 2
    for figures in kinds.values():
        assert figures["submit_s"] > 0
        assert figures["redis_cpu_us_per_task"] > 0
        assert len(figures["submit_rounds_s"]) == results["rounds"]
    assert kinds["plain"]["parked"] == 0
    assert kinds["plain"]["script_runs_per_task"] == 0
    for kind in ("limited", "two_calls"):
        assert n - 8 <= kinds[kind]["parked"] < n, kind  # the near ones are sent
    assert kinds["limited"]["script_runs_per_task"] == pytest.approx(1.0, abs=0.05)
    assert kinds["two_calls"]["script_runs_per_task"] == pytest.approx(2.0, abs=0.05)
