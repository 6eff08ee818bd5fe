"""benchmarks/bench_celery.py --semaphore-store postgres: the backlog scenario runs on
RabbitMQ with the semaphores in a PostgreSQL cluster of the script's own and no result
backend, says so in its report, and stops that cluster at the end.

Timings are not asserted; the cap is: never more task bodies at once than the limit.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_celery.py"
AMQP = "amqp://guest:guest@127.0.0.1:5672"
MODES = ("ours", "ours_countdown", "baseline", "plain")


def bench_celery(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The script as a module (registered while the test runs: its dataclasses look
    their module up)."""
    spec = importlib.util.spec_from_file_location("bench_celery", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def running(pid: int) -> bool:
    """Whether ``pid`` runs: not gone, nor a zombie (a postmaster that exited waits for
    init to reap it, a second or two here)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def quick_run_on_postgres(
    script: Path, vhost: str, *arguments: str, timeout: float = 240
) -> dict[str, Any]:
    """``script --quick --json`` on RabbitMQ (``vhost``) with the semaphores in a
    PostgreSQL cluster of the script's own: its results, once the report is seen to say
    so, with no result backend (no Redis in the plugin's path) and the cluster stopped."""
    done = subprocess.run(
        [
            sys.executable, str(script), "--quick", "--json", *arguments,
            "--broker", "amqp", "--amqp-url", f"{AMQP}/{vhost}",
            "--semaphore-store", "postgres",
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    results: dict[str, Any] = json.loads(done.stdout)
    where = results["topology"]
    assert results["semaphore_store"] == where["semaphore_store"] == "postgres"
    assert results["semaphore_redis"] is None
    assert where["result_backend"] is None
    assert where["semaphore_postgres"].startswith("postgresql://")
    assert "a cluster of our own" in where["semaphore_postgres"]
    assert results["environment"]["postgres_server"]
    assert not running(where["semaphore_postgres_pid"])  # stopped at the end
    return results


def test_quick_backlog_on_postgres(
    rabbitmq_vhost: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = quick_run_on_postgres(SCRIPT, rabbitmq_vhost, "--scenario", "backlog")
    n, limit = results["backlog_settings"]["tasks"], results["backlog_settings"]["limit"]
    backlog = results["backlog"]
    for name in MODES:
        assert backlog[name]["tasks_run"] == backlog[name]["distinct_tasks"] == n, name
    for name in ("ours", "ours_countdown", "plain"):
        assert 1 <= backlog[name]["peak_overlap"] <= limit, name

    bench_celery(monkeypatch).print_backlog(results)
    header = capsys.readouterr().out.strip().splitlines()[0]
    assert "semaphore store PostgreSQL" in header
    assert "no result backend" in header


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        (["--semaphore-store", "postgres"], "--broker amqp only"),
        (["--postgres-url", "postgresql://localhost/x"], "--postgres-url is for"),
        (
            ["--broker", "amqp", "--semaphore-store", "postgres", "--postgres-url", "redis://x"],
            "must be a postgresql:// URL",
        ),
    ],
)
def test_the_store_options_refuse_what_cannot_work(arguments: list[str], complaint: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert complaint in done.stderr
