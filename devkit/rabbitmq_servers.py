"""A throwaway RabbitMQ node of a test's own, on free loopback ports, for tests that
stop, restart or kill the broker (never the machine's shared node on 5672).

The node lives in a temp dir owned by the ``rabbitmq`` user (``rabbitmq-server`` drops
to that user when started as root) and every path it uses is set, or it would read
the shared node's files. A restart (``stop()`` then ``start()``) keeps the data
directory, so durable queues and persistent messages come back; ``stop()`` and
``kill()`` signal the node's own process (its pid file), by pid. Booting takes about
6 s on a 2-CPU machine, a restart about 10 s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from kombu import connection as kombu_connection

from devkit.redis_servers import free_port

# kombu is untyped
Connection: Any = kombu_connection.Connection

HOST = "127.0.0.1"
STARTUP_TIMEOUT = 40.0
STOP_TIMEOUT = 30.0


class RabbitMQStartError(RuntimeError):
    """rabbitmq-server is missing, exited, or did not answer AMQP in time."""


class RabbitMQNode:
    """One ``rabbitmq-server`` node (user guest/guest, vhost ``/``) in its own temp dir.

    The first ``start()`` picks the AMQP and distribution ports; later starts reuse
    them and the data directory, so clients see the same broker come back."""

    def __init__(self, startup_timeout: float = STARTUP_TIMEOUT) -> None:
        self.startup_timeout = startup_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="celery-semaphore-rabbitmq-"))
        self.port: int | None = None
        self.dist_port: int | None = None
        self._launcher: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def __repr__(self) -> str:
        return f"<RabbitMQNode {self.nodename} pid={self.pid}>"

    @property
    def nodename(self) -> str:
        return f"cs{self.port}@localhost"

    @property
    def url(self) -> str:
        """The AMQP URL of its default vhost."""
        if self.port is None:
            raise RuntimeError("RabbitMQNode has not been started")
        return f"amqp://guest:guest@{HOST}:{self.port}//"

    @property
    def pid(self) -> int | None:
        """The node's (Erlang VM's) pid, None when it is not running."""
        try:
            pid = int((self.dir / "pid").read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def _env(self) -> dict[str, str]:
        base = str(self.dir)
        return {
            **os.environ,
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": f"{base}/mnesia",
            "RABBITMQ_LOG_BASE": f"{base}/log",
            "RABBITMQ_PID_FILE": f"{base}/pid",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{base}/plugins",
            "RABBITMQ_FEATURE_FLAGS_FILE": f"{base}/feature_flags",
            "RABBITMQ_CONFIG_FILE": f"{base}/rabbitmq",
            "RABBITMQ_ADVANCED_CONFIG_FILE": f"{base}/advanced.config",
        }

    def start(self) -> None:
        """Boot the node and wait until it accepts an AMQP connection."""
        binary = shutil.which("rabbitmq-server")
        if binary is None:
            raise RabbitMQStartError("rabbitmq-server is not on PATH")
        if self.port is None:
            self.port, self.dist_port = free_port(), free_port()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "rabbitmq", "rabbitmq")
        (self.dir / "pid").unlink(missing_ok=True)
        self.starts += 1
        with (self.dir / f"start{self.starts}.log").open("wb") as out:
            self._launcher = subprocess.Popen(
                [binary], cwd=self.dir, env=self._env(), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + self.startup_timeout
        while not self._answers():
            if self._launcher.poll() is not None or time.monotonic() > deadline:
                why = "exited" if self._launcher.poll() is not None else "did not answer"
                tail = self.log_tail()
                self.stop()
                raise RabbitMQStartError(
                    f"RabbitMQ node {self.nodename} {why} within {self.startup_timeout:g} s:"
                    f"\n{tail}"
                )
            time.sleep(0.2)

    def _answers(self) -> bool:
        try:
            socket.create_connection((HOST, self.port or 0), timeout=1).close()
        except OSError:
            return False
        try:
            with Connection(self.url, connect_timeout=2) as connection:
                connection.connect()
        except Exception:  # booting: the listener is up before the vhost
            return False
        return True

    def stop(self) -> None:
        """A clean shutdown (SIGTERM to the node's pid), SIGKILL after ``STOP_TIMEOUT``."""
        self._signal_and_wait(signal.SIGTERM, STOP_TIMEOUT)

    def kill(self) -> None:
        """SIGKILL the node, as in a crash: what was not on disk is gone."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def restart(self) -> None:
        """Stop, then start again on the same ports with the same data."""
        self.stop()
        self.start()

    def _signal_and_wait(self, signum: int, timeout: float) -> None:
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        launcher = self._launcher
        if launcher is None:
            return
        try:
            launcher.wait(timeout)
        except subprocess.TimeoutExpired:
            for target in (pid, -launcher.pid):  # the node, then the launcher's session
                if target is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(target, signal.SIGKILL)
            launcher.wait(10)
        self._launcher = None
        (self.dir / "pid").unlink(missing_ok=True)

    def log_tail(self, lines: int = 25) -> str:
        logs = sorted((self.dir / "log").glob("*.log")) + sorted(self.dir.glob("start*.log"))
        text = "\n".join(p.read_text(errors="replace") for p in logs if p.is_file())
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        """Stop the node and delete its files."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RabbitMQNode:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
