"""Start and stop real, throwaway PostgreSQL clusters (tests, benchmarks, the demo).

Each cluster is ``initdb``'d into a temp dir of its own and listens on a loopback port
picked at start time (its Unix socket is in that dir too), so nothing here touches the
machine's shared PostgreSQL on 5432. ``initdb`` refuses to run as root, so as root the
server binaries run as the ``postgres`` user, in a directory that user owns.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from devkit.processes import wait_until
from devkit.redis_servers import HOST, free_port

STARTUP_TIMEOUT = 10  # seconds; an int, as pg_ctl -t wants
_PORT_ATTEMPTS = 5  # another process may grab a probed port before the postmaster binds it
_LOG_TAIL_LINES = 25
_DEBIAN_ROOT = Path("/usr/lib/postgresql")  # Debian keeps initdb off PATH, one dir per version
_RUN_AS = "postgres"


class PostgresBinaryNotFoundError(RuntimeError):
    """No directory with ``initdb`` and ``pg_ctl`` was found."""


class PostgresStartError(RuntimeError):
    """``initdb`` or ``pg_ctl start`` failed, or the server did not answer in time."""


def _version_key(bin_dir: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in bin_dir.parent.name.split(".") if part.isdigit())


def postgres_bin_dir() -> Path:
    """Directory of the server binaries: ``pg_config --bindir``, else the newest
    ``/usr/lib/postgresql/*/bin``, else ``initdb`` on PATH. pg_config comes with libpq's
    dev package, whose version may differ from the server's, hence the fallbacks."""
    candidates = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        result = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=False
        )
        if result.returncode == 0 and result.stdout.strip():
            candidates.append(Path(result.stdout.strip()))
    candidates += sorted(_DEBIAN_ROOT.glob("*/bin"), key=_version_key, reverse=True)
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates.append(Path(initdb).parent)
    for bin_dir in candidates:
        if (bin_dir / "initdb").is_file() and (bin_dir / "pg_ctl").is_file():
            return bin_dir
    raise PostgresBinaryNotFoundError(
        "initdb and pg_ctl were not found (pg_config --bindir, /usr/lib/postgresql/*/bin, "
        "PATH): install the PostgreSQL server binaries, e.g. `apt-get install postgresql-15`"
    )


class PostgresServer:
    """One PostgreSQL cluster of its own: a postmaster started by ``pg_ctl``.

    ``crash()`` then ``start()`` (or ``restart()``) brings it back on the same port with
    its data; ``stop()`` shuts it down for good and deletes its directory.
    """

    host = HOST

    def __init__(
        self, *, bin_dir: Path | str | None = None, startup_timeout: int = STARTUP_TIMEOUT
    ) -> None:
        self.bin_dir = Path(bin_dir) if bin_dir is not None else postgres_bin_dir()
        self.startup_timeout = startup_timeout
        self._dir: Path | None = None
        self._port: int | None = None
        self._removed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.host}:{self._port} pid={self.pid}>"

    def __enter__(self) -> PostgresServer:
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
    def dir(self) -> Path:
        """Temp dir holding ``data/``, the log and the Unix socket."""
        if self._dir is None:
            raise RuntimeError(f"{type(self).__name__} has not been started")
        return self._dir

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def log_path(self) -> Path:
        return self.dir / "log"

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} has not been started")
        return self._port

    @property
    def url(self) -> str:
        """URL of the ``postgres`` database, as superuser ``postgres`` (trust auth)."""
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{dbname}"

    @property
    def pid(self) -> int | None:
        """PID of the postmaster, from its ``postmaster.pid``; None when it is not running."""
        if self._dir is None:
            return None
        try:
            pid = int(Path(self.data_dir, "postmaster.pid").read_text().split("\n", 1)[0])
            os.kill(pid, 0)
        except (OSError, ValueError):  # no file (a clean exit removes it), or a stale one
            return None
        return pid

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection[TupleRow]:
        """New autocommit connection; the caller closes it (``with server.connect() as c``)."""
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", 2)
        return psycopg.connect(self.url_for(dbname), **kwargs)

    def start(self) -> None:
        """First call: a new cluster on a free port. After ``crash()``: the same cluster,
        on the same port, after crash recovery."""
        if self._removed:
            raise RuntimeError(f"{self!r} was stopped and its directory deleted")
        if self.pid is not None:
            raise RuntimeError(f"{self!r} is already running")
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="celery-semaphore-postgres-"))
            if os.geteuid() == 0:
                os.chown(self._dir, pwd.getpwnam(_RUN_AS).pw_uid, -1)
            self._initdb()
        fixed_port = self._port is not None
        for _ in range(1 if fixed_port else _PORT_ATTEMPTS):
            if not fixed_port:
                self._port = free_port()
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._launch_and_wait()
            except PostgresStartError:
                if fixed_port or "already in use" not in self._log_since(log_offset):
                    raise
            else:
                return
        raise PostgresStartError(f"no free port found after {_PORT_ATTEMPTS} attempts: {self!r}")

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: no checkpoint, clients cut off; a start replays
        the WAL, so committed data survives."""
        self._pg_ctl_stop("immediate")

    def restart(self) -> None:
        """Shut down gracefully if running, start again on the same port, same data."""
        self._pg_ctl_stop("fast")
        self.start()

    def stop(self) -> None:
        """Shut down (``-m fast``) and delete the directory; safe to call more than once."""
        if self._dir is None or self._removed:
            return
        self._pg_ctl_stop("fast")
        shutil.rmtree(self._dir, ignore_errors=True)
        self._removed = True

    def create_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop_database(self, name: str) -> None:
        """Drop it even while clients are connected (they are cut off)."""
        with self.connect() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def terminate_backends(self, dbname: str | None = None) -> int:
        """Cut off every client connection but this call's own (only those to ``dbname``
        if given), as a failover or an admin would; returns how many were cut off.
        Waits up to 5 s for each to exit, so a client's next query fails for sure."""
        with self.connect() as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))"
                " FROM pg_stat_activity WHERE backend_type = 'client backend'"
                " AND pid <> pg_backend_pid() AND (%(db)s::text IS NULL OR datname = %(db)s)",
                {"db": dbname},
            ).fetchone()
        assert row is not None
        return int(row[0])

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """Last lines of the server's log, for error messages."""
        if self._dir is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _run(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a server binary, as the postgres user when we are root."""
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", _RUN_AS, "--", *command]
        return subprocess.run(
            command,
            cwd=self.dir,  # the postgres user may not be allowed into ours
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _initdb(self) -> None:
        result = self._run(
            "initdb", "-D", str(self.data_dir), "-A", "trust", "-U", "postgres",
            # whatever locale the caller's environment names may not exist on the machine
            "-E", "UTF8", "--no-locale",
            "--no-sync",  # a throwaway cluster need not survive a power cut; 3x faster
            timeout=60,
        )  # fmt: skip
        if result.returncode != 0:
            raise PostgresStartError(f"initdb failed:\n{result.stdout}{result.stderr}")

    def _launch_and_wait(self) -> None:
        options = [
            "-p", str(self.port),
            "-k", shlex.quote(str(self.dir)),  # pg_ctl hands -o to a shell
            "-c", f"listen_addresses={self.host}",
            # Only an OS crash or power cut loses unflushed writes, not crash() (the
            # postmaster dying); commits and CREATE DATABASE skip waiting for the disk.
            "-c", "fsync=off",
            "-c", "max_connections=300",  # the default 100 is short for many workers' pools
        ]  # fmt: skip
        result = self._run(
            "pg_ctl", "start", "-w", "-t", str(self.startup_timeout),
            "-D", str(self.data_dir), "-l", str(self.log_path), "-o", " ".join(options),
            timeout=self.startup_timeout + 5,
        )  # fmt: skip
        if result.returncode != 0:
            self._pg_ctl_stop("immediate")  # it may have come up after pg_ctl gave up
            raise self._start_error(f"{result.stdout}{result.stderr}")
        try:
            wait_until(self._is_serving, self.startup_timeout, f"{self!r} to answer")
        except TimeoutError as exc:
            self._pg_ctl_stop("immediate")
            raise self._start_error(str(exc)) from exc

    def _is_serving(self) -> bool:
        """Whether *our* cluster answers on the port, not one that took it meanwhile."""
        try:
            with self.connect() as conn:
                row = conn.execute("SHOW data_directory").fetchone()
        except psycopg.OperationalError:
            return False
        return row is not None and Path(row[0]) == self.data_dir

    def _pg_ctl_stop(self, mode: str) -> None:
        """``pg_ctl stop``; SIGKILL to our postmaster (and nothing else) if that fails."""
        pid = self.pid
        if pid is None:
            return
        result = self._run(
            "pg_ctl", "stop", "-w", "-t", "10", "-m", mode, "-D", str(self.data_dir),
            timeout=15,
        )  # fmt: skip
        if result.returncode != 0 and self.pid == pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda: self.pid != pid, 10, f"postmaster {pid} to die")

    def _start_error(self, detail: str) -> PostgresStartError:
        return PostgresStartError(
            f"{type(self).__name__} on port {self._port} did not start: {detail.strip()}\n"
            f"log tail ({self.log_path}):\n{self.log_tail()}"
        )

    def _log_since(self, offset: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")
