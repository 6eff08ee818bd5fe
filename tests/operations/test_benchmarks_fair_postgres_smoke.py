"""benchmarks/bench_fair.py --semaphore-store postgres: fair share and priority run on
RabbitMQ with the semaphores in a PostgreSQL cluster of the script's own and no result
backend, the report says so, and that cluster is stopped at the end.

Timings and the targets are not asserted; the cap is: never more task bodies at once
than the limit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_benchmarks_celery_postgres_smoke import quick_run_on_postgres

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "bench_fair.py"


def test_quick_run_on_postgres(
    rabbitmq_vhost: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = quick_run_on_postgres(SCRIPT, rabbitmq_vhost, "--timeout", "150", timeout=200)

    limit, scenario = results["settings"]["limit"], results["scenario"]
    tasks = scenario["a_tasks"] + scenario["b_tasks"]
    assert set(results["noisy"]) == {"fair", "unfair"}
    for mode, figures in results["noisy"].items():
        assert figures["tasks_run"] == figures["distinct_tasks"] == tasks, mode
        assert 1 <= figures["peak_overlap"] <= limit, mode
    for side, figures in results["priority"].items():
        assert figures["tasks_run"] == figures["distinct_tasks"] == scenario["line_tasks"] + 1
        assert figures["line_waiting_at_publish"] > 0, side

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bench_fair", raising=False)
    monkeypatch.delitem(sys.modules, "bench_celery", raising=False)
    import bench_fair

    bench_fair.print_report(results)
    assert "semaphore store PostgreSQL" in capsys.readouterr().out


def test_the_store_options_are_bench_celerys() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--semaphore-store", "postgres"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--broker amqp only" in done.stderr
