"""Start and stop a throwaway PgBouncer in front of a `PostgresServer` (tests).

Each one has a config file of its own in a temp dir and one pool mode (``session``,
``transaction`` or ``statement``); it listens on a loopback port picked at start time
and lets any database of its server through (``* = host=... port=...``), as the
server's ``postgres`` user (trust), who may also use its admin console
(`PgBouncer.clients`). PgBouncer refuses to run as root, so as root it runs as the
``postgres`` user; it is stopped by its pid (SIGINT: a safe shutdown, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from devkit.postgres_servers import PostgresServer
from devkit.processes import wait_until
from devkit.redis_servers import HOST, free_port

STARTUP_TIMEOUT = 10.0
_PORT_ATTEMPTS = 5  # another process may grab a probed port before PgBouncer binds it
_RUN_AS = "postgres"
POOL_MODES = ("session", "transaction", "statement")


class PgBouncerNotFoundError(RuntimeError):
    """No ``pgbouncer`` on PATH (nor in /usr/sbin, where Debian puts it)."""


class PgBouncerStartError(RuntimeError):
    """PgBouncer exited or did not answer in time."""


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if found is None:
        raise PgBouncerNotFoundError(
            "pgbouncer was not found on PATH or in /usr/sbin: apt-get install pgbouncer"
        )
    return found


def pgbouncer_version(binary: str | None = None) -> tuple[int, ...]:
    """``(1, 18, 0)`` from ``pgbouncer --version``'s first line."""
    text = subprocess.run(
        [binary or pgbouncer_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"PgBouncer (\d+(?:\.\d+)*)", text)
    if found is None:
        raise PgBouncerNotFoundError(f"no version in pgbouncer --version: {text!r}")
    return tuple(int(part) for part in found.group(1).split("."))


class PgBouncer:
    """One PgBouncer process in ``pool_mode`` before ``server``; ``url_for(dbname)``
    reaches that database of the server through it."""

    host = HOST

    def __init__(self, server: PostgresServer, pool_mode: str = "transaction") -> None:
        if pool_mode not in POOL_MODES:
            raise ValueError(f"pool_mode must be one of {', '.join(POOL_MODES)}, got {pool_mode!r}")
        self.server = server
        self.pool_mode = pool_mode
        self.binary = pgbouncer_binary()
        self._dir: Path | None = None
        self._port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        pid = None if self._process is None else self._process.pid
        return f"<{type(self).__name__} {self.pool_mode} {self.host}:{self._port} pid={pid}>"

    def __enter__(self) -> PgBouncer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} has not been started")
        return self._port

    @property
    def pid(self) -> int | None:
        """Its process's pid; None when it is not running."""
        process = self._process
        return None if process is None or process.poll() is not None else process.pid

    @property
    def log_path(self) -> Path:
        if self._dir is None:
            raise RuntimeError(f"{type(self).__name__} has not been started")
        return self._dir / "pgbouncer.log"

    def url_for(self, dbname: str) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection[TupleRow]:
        """New autocommit connection through the pooler; the caller closes it."""
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", 2)
        return psycopg.connect(self.url_for(dbname), **kwargs)

    def clients(self, dbname: str) -> int:
        """How many client connections to ``dbname`` it has now (its admin console's
        ``SHOW CLIENTS``)."""
        with self.connect("pgbouncer") as admin:
            rows = admin.execute("SHOW CLIENTS").fetchall()
        return sum(1 for row in rows if row[2] == dbname)

    def start(self) -> None:
        if self._process is not None:
            raise RuntimeError(f"{self!r} was started already")
        self._dir = Path(tempfile.mkdtemp(prefix="celery-semaphore-pgbouncer-"))
        (self._dir / "userlist.txt").write_text('"postgres" ""\n')
        as_root = os.geteuid() == 0
        if as_root:
            user = pwd.getpwnam(_RUN_AS)
            for path in (self._dir, self._dir / "userlist.txt"):
                os.chown(path, user.pw_uid, user.pw_gid)
        for _ in range(_PORT_ATTEMPTS):
            self._port = free_port()
            config = self._dir / "pgbouncer.ini"
            config.write_text(self._config(self._dir))
            process = self._process = subprocess.Popen(
                [self.binary, "--quiet", str(config)],
                cwd=self._dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                user=_RUN_AS if as_root else None,
                group=_RUN_AS if as_root else None,
                extra_groups=[] if as_root else None,
            )
            try:
                wait_until(self._exited_or_answers, STARTUP_TIMEOUT, f"{self!r} to answer")
            except TimeoutError as error:
                self._kill()
                raise PgBouncerStartError(f"{error}\n{self.log_tail()}") from error
            if process.poll() is None:
                return
            log = self.log_tail()
            self._kill()
            if "Address already in use" not in log:
                raise PgBouncerStartError(f"pgbouncer exited with {process.returncode}:\n{log}")
        raise PgBouncerStartError(f"no free port found after {_PORT_ATTEMPTS} attempts")

    def stop(self) -> None:
        """SIGINT (a safe shutdown: no waiting for clients), then SIGKILL; deletes the
        directory. Safe to call more than once."""
        self._kill()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def log_tail(self, lines: int = 25) -> str:
        if self._dir is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _config(self, directory: Path) -> str:
        return (
            "[databases]\n"
            f"* = host={self.server.host} port={self.server.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = {self.host}\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {directory / 'userlist.txt'}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"logfile = {directory / 'pgbouncer.log'}\n"
            "admin_users = postgres\n"
        )

    def _exited_or_answers(self) -> bool:
        if self._process is None or self._process.poll() is not None:
            return True
        try:
            with self.connect() as connection:
                connection.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(5)
