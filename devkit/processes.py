"""Processes started for a test, a benchmark or the demo, and stopped for sure.

Each runs in a session of its own (Ctrl-C in a terminal reaches only the script,
which then stops them in order) with its output in a log file; stopping sends the
stop signal (a warm shutdown for ``celery worker``), waits, then SIGKILLs the whole
process group (a worker's pool children too).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it is true; TimeoutError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def worker_command(
    app: str,
    name: str,
    *,
    pool: str = "prefork",
    concurrency: int = 2,
    loglevel: str = "info",
    queues: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """``python -m celery -A app worker ...`` as the tests, benchmarks and demo run it
    (no gossip, mingle or heartbeat: workers that start fast and talk only to Redis)."""
    command = [
        sys.executable, "-m", "celery", "-A", app, "worker", "-P", pool,
        "-c", str(concurrency), "-n", f"{name}@%h", "-l", loglevel,
        "--without-gossip", "--without-mingle", "--without-heartbeat", *extra,
    ]  # fmt: skip
    if queues:
        command += ["-Q", queues]
    return command


@dataclass
class Child:
    """One process in a session of its own, its stdout and stderr in ``log``."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    log_file: IO[bytes]
    stop_signal: int = signal.SIGTERM

    @classmethod
    def start(
        cls,
        name: str,
        command: Sequence[str],
        log: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
    ) -> Child:
        log_file = log.open("wb")
        try:
            process = subprocess.Popen(
                list(command),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            log_file.close()
            raise
        return cls(name, process, log, log_file)

    @property
    def pid(self) -> int:
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill_group(self) -> None:
        """SIGKILL the process and everything in its session (a machine dying)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def stop(self, grace: float = 10.0) -> None:
        """The stop signal, up to ``grace`` seconds to exit, then SIGKILL to the group."""
        self.signal(self.stop_signal)
        self.finish(time.monotonic() + grace)

    def finish(self, deadline: float) -> None:
        """Wait until ``deadline``, then SIGKILL what is left of the group; close the log."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(max(0.1, deadline - time.monotonic()))
        self.kill_group()  # a worker's pool children, even when its main process is gone
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        self.log_file.close()


@dataclass
class Processes:
    """Children started together and stopped together by :meth:`stop_all` (last first)."""

    log_dir: Path
    cwd: Path | str | None = None
    children: list[Child] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)  # run after stop_all

    def start(self, name: str, command: Sequence[str], env: dict[str, str] | None = None) -> Child:
        child = Child.start(name, command, self.log_dir / f"{name}.log", env=env, cwd=self.cwd)
        self.children.append(child)
        return child

    def stop_all(self, grace: float = 10.0) -> None:
        """The stop signal to all at once, then each gets what is left of ``grace``."""
        for child in reversed(self.children):
            child.signal(child.stop_signal)
        deadline = time.monotonic() + grace
        for child in reversed(self.children):
            child.finish(deadline)
        self.children.clear()
        while self.closers:
            self.closers.pop()()

    def tails(self, size: int = 3000) -> str:
        return "\n".join(f"--- {c.name}\n{c.text()[-size:]}" for c in self.children)

    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def __getitem__(self, index: int) -> Child:
        return self.children[index]

    def __len__(self) -> int:
        return len(self.children)

    def __iter__(self) -> Any:
        return iter(self.children)
