"""benchmarks/bench_rate.py --semaphore-store postgres: the rate scenarios run on
RabbitMQ with ours' semaphores in a PostgreSQL cluster of the script's own, the report
says so, and that cluster is stopped at the end.

Timings are not asserted. What is asserted holds on any machine: ours ran each of its
tasks once, never started more in a second than its rate allows (burst 1, one more for
the bodies' own jitter) nor ran more than its limit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_benchmarks_celery_postgres_smoke import quick_run_on_postgres

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "bench_rate.py"


def test_quick_run_on_postgres(
    rabbitmq_vhost: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = quick_run_on_postgres(SCRIPT, rabbitmq_vhost, "--scenario", "both", timeout=200)

    settings = results["settings"]
    both = results["scenarios"]["both"]["variants"]["both_ours"]
    assert both["tasks_run"] == both["distinct_tasks"] == settings["both_tasks"]
    assert both["peak_running"] <= settings["both_limit"]
    assert both["window_starts_max"] <= settings["both_rate"] + 2

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bench_rate", raising=False)
    monkeypatch.delitem(sys.modules, "bench_celery", raising=False)
    import bench_rate

    bench_rate.print_report(results)
    assert "semaphore store PostgreSQL" in capsys.readouterr().out


def test_the_store_options_are_bench_celerys() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--postgres-url", "postgresql://localhost/x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--postgres-url is for" in done.stderr
