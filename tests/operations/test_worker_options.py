"""``celery worker --semaphore-metrics-port`` for an app that only uses LimitedTask
(the README's quick start), and what happens when the port is taken."""

from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from devkit.processes import Child, wait_until, worker_command
from devkit.redis_servers import RedisServer, free_port

pytestmark = pytest.mark.slow
APPS = Path(__file__).parents[1] / "celery_apps"


@pytest.fixture
def quickstart(tmp_path: Path) -> Iterator[tuple[RedisServer, dict[str, str], Path]]:
    with RedisServer() as server:
        env = {**os.environ, "CS_BROKER_URL": server.url, "PYTHONPATH": str(APPS)}
        yield server, env, tmp_path


def start_worker(env: dict[str, str], log_dir: Path, *flags: str) -> Child:
    command = worker_command("quickstart_app", "q1", concurrency=1, extra=flags)
    return Child.start("q1", command, log_dir / "q1.log", env=env, cwd=APPS)


def test_the_quick_start_app_serves_metrics_on_the_worker_flag(quickstart) -> None:
    _server, env, log_dir = quickstart
    port = free_port()
    worker = start_worker(env, log_dir, "--semaphore-metrics-port", str(port),
                          "--semaphore-metrics-address", "127.0.0.1")  # fmt: skip
    try:

        def serving() -> bool:
            assert worker.alive(), worker.tail()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read()
            except OSError:
                return False
            return True

        wait_until(serving, 30, f"metrics on 127.0.0.1:{port}")
        assert "No such option" not in worker.text()
    finally:
        worker.stop()


def test_a_taken_metrics_port_is_named_and_the_worker_goes_on(quickstart) -> None:
    server, env, log_dir = quickstart
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    worker = start_worker(env, log_dir, "--semaphore-metrics-port", str(port),
                          "--semaphore-metrics-address", "127.0.0.1")  # fmt: skip
    try:
        line = f"--semaphore-metrics-port {port} cannot listen on 127.0.0.1:{port}"
        wait_until(lambda: line in worker.text() or not worker.alive(), 30, "the error")
        assert line in worker.text(), worker.tail()
        assert "ERROR" in worker.text()
        app = Celery("quickstart_app", broker=server.url, backend=server.url)
        assert app.send_task("quickstart_app.call_partner", (7,)).get(timeout=30) == 7
        assert worker.alive()
        app.close()
    finally:
        worker.stop()
        taken.close()


def refused_start(env: dict[str, str], log_dir: Path) -> str:
    """A worker that must refuse to start: its output, once it has exited 1."""
    worker = start_worker(env, log_dir)
    try:
        worker.process.wait(60)
        assert worker.process.returncode == 1, worker.tail()
        return worker.text()
    finally:
        worker.stop()


def test_a_broker_that_is_not_redis_without_a_semaphore_redis_url_stops_the_worker(
    quickstart,
) -> None:
    """Else each machine would count on its own localhost Redis: a per-machine cap."""
    _server, env, log_dir = quickstart
    env = {**env, "CS_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//"}
    text = refused_start(env, log_dir)
    assert "Error: celery-semaphore: Celery setting semaphore_redis_url is not set" in text
    assert "Traceback" not in text


def test_a_misspelt_setting_stops_the_worker_with_one_line(quickstart) -> None:
    _server, env, log_dir = quickstart
    env = {**env, "CS_CONF": '{"semaphore_lease_timout": 30}'}
    text = refused_start(env, log_dir)
    assert "did you mean semaphore_lease_timeout?" in text
    assert "Traceback" not in text


NO_CONFIG = ("--rename-command", "CONFIG", "")  # as a managed Redis refuses it


@pytest.mark.parametrize(
    ("policy", "refuses_config", "warned"),
    [
        ("allkeys-lru", False, True),
        ("noeviction", False, False),
        ("allkeys-lru", True, True),  # read through INFO memory
        ("noeviction", True, False),
    ],
)
def test_a_redis_that_may_evict_keys_is_named_at_worker_start(
    tmp_path: Path, policy: str, refuses_config: bool, warned: bool
) -> None:
    flags = NO_CONFIG if refuses_config else ()
    with RedisServer("--maxmemory", "100mb", "--maxmemory-policy", policy, *flags) as server:
        env = {**os.environ, "CS_BROKER_URL": server.url, "PYTHONPATH": str(APPS)}
        worker = start_worker(env, tmp_path)
        try:
            wait_until(lambda: "ready." in worker.text() or not worker.alive(), 60, "ready")
            assert worker.alive(), worker.tail()
            said = f"may evict keys when it reaches maxmemory (maxmemory-policy {policy})"
            assert (said in worker.text()) is warned, worker.tail()
        finally:
            worker.stop()


def test_a_bad_task_declaration_stops_the_worker_with_one_line(quickstart) -> None:
    _server, env, log_dir = quickstart
    text = refused_start({**env, "CS_LIMIT": "0"}, log_dir)
    assert "Error: task quickstart_app.call_partner: limit must be an int from 1" in text
    assert "Traceback" not in text
