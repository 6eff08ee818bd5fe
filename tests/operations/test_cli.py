"""The real ``celery -A app semaphore ...`` command, as an operator runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from celery_semaphore import Permit, Place, Semaphore
from celery_semaphore.core.protocol import DEFAULT_LEASE_TIMEOUT

APPS = Path(__file__).parents[1] / "celery_apps"


def run(redis_url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CS_REDIS_URL": redis_url, "PYTHONPATH": str(APPS)}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "cli_app", "semaphore", *args],
        env=env,
        cwd=APPS,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
    )


@pytest.fixture
def busy(redis_url: str):
    """A semaphore 'partner-api' (limit 2) with two holders and one waiter."""
    sem = Semaphore(redis_url, "partner-api", 2)
    info = json.dumps({"task": "proj.call_partner", "worker": "w1@host", "pid": 1})
    assert isinstance(sem.attempt("task-a", info=info), Permit)
    assert isinstance(sem.attempt("task-b", info=info), Permit)
    assert isinstance(sem.attempt("task-c", wait_lease=60, info=info), Place)
    yield sem
    sem.close()


def test_status_shows_a_backlog_published_before_any_task_started(redis_url, busy):
    publisher = Semaphore(redis_url, "queued-only", 3)
    for i in range(4):
        publisher.take_place(f"t{i}", wait_lease=60)
    publisher.close()
    drained_early = Semaphore(redis_url, "drained-before-use", 1)  # meta, no limit recorded
    drained_early.client.hset(drained_early.keys.meta, "draining", "1")
    drained_early.close()
    out = run(redis_url, "status", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert set(rows) == {"partner-api", "queued-only"}
    assert (rows["queued-only"]["waiters"], rows["queued-only"]["effective_limit"]) == (4, 3)


def test_status_lists_every_semaphore_with_limits_and_counts(redis_url, busy):
    Semaphore(redis_url, "other", 7).try_acquire("x")
    out = run(redis_url, "status", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert set(rows) == {"partner-api", "other"}
    assert rows["partner-api"]["holders"] == 2
    assert rows["partner-api"]["waiters"] == 1
    assert rows["partner-api"]["effective_limit"] == 2
    assert rows["partner-api"]["utilization"] == 1.0
    assert 0 < rows["partner-api"]["shortest_lease_left"] <= DEFAULT_LEASE_TIMEOUT
    text = run(redis_url, "status", "partner-api")
    assert text.returncode == 0
    assert "partner-api" in text.stdout and "other" not in text.stdout


def test_holders_and_waiters_show_task_worker_and_order(redis_url, busy):
    out = run(redis_url, "holders", "partner-api", "--json")
    rows = json.loads(out.stdout)
    assert [r["holder"] for r in rows] == ["task-a", "task-b"]
    assert {r["task"] for r in rows} == {"proj.call_partner"}
    assert {r["worker"] for r in rows} == {"w1@host"}
    out = run(redis_url, "waiters", "partner-api")
    assert out.returncode == 0
    assert "task-c" in out.stdout and "proj.call_partner" in out.stdout


def test_set_limit_resizes_live_and_reset_restores(redis_url, busy):
    assert run(redis_url, "set-limit", "partner-api", "3").returncode == 0
    assert busy.status().effective_limit == 3
    assert busy.try_acquire("task-c") is not None  # the waiter is admitted under the new limit
    assert run(redis_url, "reset-limit", "partner-api").returncode == 0
    assert busy.status().effective_limit == 2


def test_drain_admits_nobody_and_resume_admits_again(redis_url, busy):
    busy.release("task-a")
    busy.release("task-b")
    assert run(redis_url, "drain", "partner-api").returncode == 0
    assert busy.status().draining
    assert busy.try_acquire("task-c") is None
    assert run(redis_url, "resume", "partner-api").returncode == 0
    assert busy.try_acquire("task-c") is not None


def test_release_asks_for_confirmation_and_frees_the_permit(redis_url, busy):
    refused = run(redis_url, "release", "partner-api", "task-a", stdin="n\n")
    assert refused.returncode != 0
    assert busy.status().holder_count == 2
    done = run(redis_url, "release", "partner-api", "task-a", stdin="y\n")
    assert done.returncode == 0, done.stderr
    assert [h.holder for h in busy.status().holders] == ["task-b"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("status", "nope"), "no semaphore named 'nope'"),
        (("set-limit", "partner-api", "0"), "0 is not in the range"),
        (("set-limit", "partner-api", "x"), "is not a valid integer"),
        (("release", "partner-api", "ghost", "--yes"), "'ghost' holds no permit"),
    ],
)
def test_bad_input_is_one_clear_line_and_nonzero(redis_url, busy, args, message):
    out = run(redis_url, *args)
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_unreachable_redis_is_one_clear_line(unused_url):
    out = run(unused_url, "status")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert unused_url.split("@")[-1].split("/")[0] in out.stderr
    assert "***" in out.stderr and "hunter2" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.fixture
def unused_url() -> str:
    from devkit.redis_servers import free_port

    return f"redis://:hunter2@127.0.0.1:{free_port()}/0"
