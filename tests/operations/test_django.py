"""The Django page (docs/django.md) works as written: its code blocks, written into a
throwaway Django project, run a real worker whose ``@shared_task(base=LimitedTask)``
and queue cap hold, with the settings read as ``CELERY_SEMAPHORE_*``; a misspelt
``CELERY_SEMAPHORE_*`` setting stops the worker with one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.measures import peak_of_records
from devkit.processes import Child, wait_until, worker_command
from devkit.redis_servers import RedisServer

pytest.importorskip("django")

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "django.md"
PAGE_URL = "redis://localhost:6379/0"
# What a real settings.py has besides the page's Celery part.
DJANGO_PART = """\
SECRET_KEY = "test-only"
INSTALLED_APPS = ["orders"]
USE_TZ = True
"""
PUBLISH = """\
import json

import django

import proj  # noqa: F401  (sets DJANGO_SETTINGS_MODULE, as manage.py would)

django.setup()

from orders.tasks import build_report, call_partner

calls = [call_partner.delay(i) for i in range(8)]
reports = [build_report.delay(i) for i in range(6)]
print(json.dumps({
    "calls": [r.get(timeout=90) for r in calls],
    "reports": [r.get(timeout=90) for r in reports],
}))
"""


def page_files() -> dict[str, str]:
    """The page's code blocks that open with ``# <path>.py``, by path."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    files = {}
    for block in blocks:
        first = block.splitlines()[0]
        match = re.fullmatch(r"# ([\w/]+\.py)\b.*", first)
        if match:
            files[match.group(1)] = block
    return files


def write_project(directory: Path, redis_url: str, extra_settings: str = "") -> None:
    files = page_files()
    assert set(files) == {
        "proj/celery.py",
        "proj/__init__.py",
        "proj/settings.py",
        "orders/tasks.py",
    }
    assert files["proj/settings.py"].count(PAGE_URL) == 3
    files["proj/settings.py"] = (
        DJANGO_PART + files["proj/settings.py"].replace(PAGE_URL, redis_url) + extra_settings
    )
    files["orders/__init__.py"] = ""
    for path, text in files.items():
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def project_env(directory: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = os.pathsep.join([str(directory), str(ROOT)])
    return env


def overlap(results: list[list[float]]) -> int:
    records = [
        {"at": at, "event": event}
        for _, started, ended in results
        for at, event in ((started, "start"), (ended, "end"))
    ]
    return peak_of_records(records)


@pytest.mark.slow
def test_the_django_page_runs_a_capped_shared_task_end_to_end(tmp_path: Path) -> None:
    with RedisServer() as redis_server:
        write_project(tmp_path, redis_server.url)
        env = project_env(tmp_path)
        command = worker_command("proj", "django", concurrency=4, queues="celery,reports")
        worker = Child.start("worker", command, tmp_path / "worker.log", env=env, cwd=tmp_path)
        try:
            wait_until(lambda: "ready." in worker.text() or not worker.alive(), 60, "the worker")
            assert worker.alive(), worker.tail()
            published = subprocess.run(
                [sys.executable, "-c", PUBLISH],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert published.returncode == 0, published.stderr + worker.tail()
            results = json.loads(published.stdout)
            status = subprocess.run(
                [sys.executable, "-m", "celery", "-A", "proj", "semaphore", "status", "--json"],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            worker.stop()
    assert sorted(r[0] for r in results["calls"]) == list(range(8))
    assert overlap(results["calls"]) == 2  # the cap held, and was used
    assert sorted(r[0] for r in results["reports"]) == list(range(6))
    assert overlap(results["reports"]) <= 2  # CELERY_SEMAPHORE_QUEUE_LIMITS = {"reports": 2}
    assert status.returncode == 0, status.stderr
    limits = {row["name"]: row["effective_limit"] for row in json.loads(status.stdout)}
    assert limits == {"partner-api": 2, "queue:reports": 2}
    assert "Traceback" not in worker.text(), worker.tail(60)


@pytest.mark.slow
def test_a_misspelt_celery_semaphore_setting_stops_the_worker_with_one_line(
    tmp_path: Path,
) -> None:
    with RedisServer() as redis_server:
        write_project(tmp_path, redis_server.url, "CELERY_SEMAPHORE_LEASE_TIMOUT = 30\n")
        done = subprocess.run(
            worker_command("proj", "django"),
            cwd=tmp_path,
            env=project_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: celery-semaphore: unknown Celery setting CELERY_SEMAPHORE_LEASE_TIMOUT; "
        "did you mean CELERY_SEMAPHORE_LEASE_TIMEOUT? known: " + errors[0].split("known: ")[1]
    ]
