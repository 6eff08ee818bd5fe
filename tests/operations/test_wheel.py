"""The release as a user gets it: the built wheel, installed into a fresh virtualenv,
caps a LimitedTask across two real workers, and its ``celery semaphore`` command works.

``scripts/release.sh`` builds the sdist and the wheel from that sdist into a temp dir
and checks both (``twine check --strict``, the Lua scripts, ``py.typed``, the entry
point, nothing from tests/devkit/benchmarks). The wheel is then installed with pip
into a new virtualenv (its dependencies from the package index), and everything
after that runs from that virtualenv, in a temp dir outside the checkout, with an
environment that points nowhere near the checkout: the app module, two ``celery
worker`` processes, the client that sends the tasks, the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.processes import Child, wait_until
from devkit.redis_servers import RedisServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 2
TASKS = 12

# The README's quick start: a LimitedTask, no install(app). Each body counts the
# bodies running at that moment (INCR on entry, DECR on exit) and says which
# celery_semaphore it ran with, in which worker.
APP = """
import os
import time

import redis
from celery import Celery

import celery_semaphore
from celery_semaphore import LimitedTask

BASE = os.environ["WHEEL_REDIS"]
app = Celery("app", broker=f"{BASE}/0", backend=f"{BASE}/1")
app.conf.update(
    semaphore_redis_url=f"{BASE}/1",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
log = redis.Redis.from_url(f"{BASE}/2")


@app.task(base=LimitedTask, semaphore="wheel-check", limit=%(limit)d)
def limited(i):
    log.rpush("running", log.incr("now"))
    time.sleep(0.3)
    log.decr("now")
    return {
        "i": i,
        "file": celery_semaphore.__file__,
        "version": celery_semaphore.__version__,
        "worker": limited.request.hostname,
    }
"""

SEND = """
import json
import sys

from app import limited

results = [limited.delay(i) for i in range(int(sys.argv[1]))]
print(json.dumps([r.get(timeout=60) for r in results]))
"""


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``scripts/release.sh`` run into a temp dir: (that dir, its output)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "release.sh"), str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"release.sh failed:\n{done.stdout}\n{done.stderr}"
    return out, done.stdout


@pytest.fixture(scope="module")
def venv(release: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv with the built wheel installed (pip's cache makes reruns fast)."""
    (wheel,) = release[0].glob("celery_semaphore-*.whl")
    path = tmp_path_factory.mktemp("venv")
    assert ROOT not in path.parents
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "install", "--no-input", str(wheel)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"pip install failed:\n{done.stdout[-3000:]}\n{done.stderr}"
    return path


@pytest.fixture
def project(tmp_path: Path, redis_server: RedisServer) -> tuple[Path, dict[str, str]]:
    """A temp dir outside the checkout holding the app, and the bare environment to
    run it in: PATH, HOME and the test's Redis; no PYTHONPATH, no user site."""
    assert ROOT not in tmp_path.parents
    (tmp_path / "app.py").write_text(APP % {"limit": LIMIT})
    (tmp_path / "send.py").write_text(SEND)
    env = {
        "PATH": os.pathsep.join(["/usr/bin", "/bin"]),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
        "WHEEL_REDIS": redis_server.url.rsplit("/", 1)[0],
    }
    return tmp_path, env


def test_release_script_checks_the_sdist_and_the_wheel(release: tuple[Path, str]) -> None:
    out, stdout = release
    version = next(out.glob("celery_semaphore-*.whl")).name.split("-")[1]
    assert sorted(p.name for p in out.iterdir()) == [
        f"celery_semaphore-{version}-py3-none-any.whl",
        f"celery_semaphore-{version}.tar.gz",
    ]
    assert stdout.count("PASSED") == 2, stdout  # twine check --strict, both artifacts
    assert "hold what they must" in stdout
    assert "twine upload" in stdout  # printed, not run


def test_the_installed_wheel_caps_a_limited_task_in_real_workers(
    release: tuple[Path, str],
    venv: Path,
    project: tuple[Path, dict[str, str]],
    redis_server: RedisServer,
) -> None:
    app_dir, env = project
    bin_dir = venv / "bin"
    version = next(release[0].glob("celery_semaphore-*.whl")).name.split("-")[1]
    workers: list[Child] = []
    try:
        for name in ("w1", "w2"):
            command = [
                str(bin_dir / "celery"), "-A", "app", "worker", "-P", "prefork", "-c", "2",
                "-n", f"{name}@%h", "-l", "info",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
            ]  # fmt: skip
            workers.append(
                Child.start(name, command, app_dir / f"{name}.log", env=env, cwd=app_dir)
            )
        for worker in workers:

            def ready(worker: Child = worker) -> bool:
                assert worker.alive(), f"{worker.name} exited:\n{worker.tail()}"
                return " ready." in worker.text()

            wait_until(ready, 60, f"{worker.name} ready")

        sent = subprocess.run(
            [str(bin_dir / "python"), "send.py", str(TASKS)],
            env=env,
            cwd=app_dir,
            capture_output=True,
            text=True,
            timeout=90,
        )
        logs = "\n".join(f"--- {w.name}\n{w.tail(40)}" for w in workers)
        assert sent.returncode == 0, f"{sent.stderr}\n{logs}"
        results = json.loads(sent.stdout)

        status = subprocess.run(
            [str(bin_dir / "celery"), "-A", "app", "semaphore", "status", "--json"],
            env=env,
            cwd=app_dir,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        for worker in workers:
            worker.stop()

    assert sorted(r["i"] for r in results) == list(range(TASKS))
    files = {r["file"] for r in results}
    assert all(Path(f).is_relative_to(venv) for f in files), files
    assert {r["version"] for r in results} == {version}
    assert {r["worker"].split("@")[0] for r in results} == {"w1", "w2"}  # a cap across workers
    with redis_server.client(db=2) as client:
        running = [int(n) for n in client.lrange("running", 0, -1)]
    assert len(running) == TASKS
    assert max(running) == LIMIT, f"peak {max(running)} of limit {LIMIT}: {running}"

    assert status.returncode == 0, status.stderr
    rows = {row["name"]: row for row in json.loads(status.stdout)}
    assert set(rows) == {"wheel-check"}
    assert (rows["wheel-check"]["effective_limit"], rows["wheel-check"]["holders"]) == (LIMIT, 0)
