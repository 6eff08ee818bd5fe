"""The partner's HTTP API: serves at most ``capacity`` requests at once, answers 429 above that.

Stdlib only (``ThreadingHTTPServer``). Every request to ``/orders/<id>`` (or any path other
than the two below) counts as one in flight while it is served; one that arrives while
``capacity`` are in flight gets ``429 Too Many Requests`` at once, the others sleep a jittered
service time and get ``200`` with a JSON body. The service keeps:

- ``GET /stats``: JSON ``{capacity, in_flight, peak, ok, rejected, requests,
  service_time_total, mean_service_time, started_at, timeline: [[epoch seconds, in flight],
  ...]}`` (``?timeline=0``: without the timeline); ``peak`` counts
  every request in flight, including one about to be refused, so ``peak > capacity`` means the
  service was overloaded;
- ``POST /reset`` (or GET): zero the counters and the timeline.

Run: ``python -m example_project.downstream --port 8000 --capacity 5``. With ``--port 0`` it
picks a free port. Either way its first line on stdout is ``listening on http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

DEFAULT_CAPACITY = 5
DEFAULT_SERVICE_TIME = 0.2
DEFAULT_JITTER = 0.1
TIMELINE_MAX = 200_000  # changes kept; a demo run makes a few thousand


@dataclass
class Stats:
    """Counters of one service, safe to update from the request threads."""

    capacity: int
    in_flight: int = 0
    peak: int = 0
    ok: int = 0
    rejected: int = 0
    service_time_total: float = 0.0
    started_at: float = field(default_factory=time.time)
    timeline: list[tuple[float, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _changed(self) -> None:
        if len(self.timeline) < TIMELINE_MAX:
            self.timeline.append((time.time(), self.in_flight))

    def enter(self) -> bool:
        """Count a request in; False if it is over capacity (and counted out again)."""
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self._changed()
            if self.in_flight <= self.capacity:
                return True
            self.in_flight -= 1
            self.rejected += 1
            self._changed()
            return False

    def leave(self, served_for: float) -> None:
        with self.lock:
            self.in_flight -= 1
            self.ok += 1
            self.service_time_total += served_for
            self._changed()

    def reset(self) -> None:
        with self.lock:
            self.peak = self.in_flight
            self.ok = self.rejected = 0
            self.service_time_total = 0.0
            self.started_at = time.time()
            self.timeline = [(self.started_at, self.in_flight)]

    def snapshot(self, timeline: bool = True) -> dict[str, Any]:
        with self.lock:
            return {
                "capacity": self.capacity,
                "in_flight": self.in_flight,
                "peak": self.peak,
                "ok": self.ok,
                "rejected": self.rejected,
                "requests": self.ok + self.rejected,
                "service_time_total": self.service_time_total,
                "mean_service_time": self.service_time_total / self.ok if self.ok else None,
                "started_at": self.started_at,
                "timeline": [[t, n] for t, n in self.timeline] if timeline else None,
            }


class PartnerServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default backlog of 5 would refuse connections in bursts

    def __init__(
        self, address: tuple[str, int], stats: Stats, service_time: float, jitter: float
    ) -> None:
        super().__init__(address, Handler)
        self.stats = stats
        self.service_time = service_time
        self.jitter = jitter

    def draw_service_time(self) -> float:
        return max(0.0, self.service_time + random.uniform(-self.jitter, self.jitter))


class Handler(BaseHTTPRequestHandler):
    server: PartnerServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: thousands of requests
        pass

    def _reply(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        path = path.rstrip("/")
        stats = self.server.stats
        if path == "/stats":
            self._reply(200, stats.snapshot(timeline="timeline=0" not in query))
        elif path == "/reset":
            stats.reset()
            self._reply(200, {"reset": True})
        elif path == "/health":
            self._reply(200, {"ok": True})
        else:
            self._serve(path)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path.rstrip("/") == "/reset":
            self.server.stats.reset()
            self._reply(200, {"reset": True})
        else:
            self._serve(self.path.split("?", 1)[0].rstrip("/"))

    def _serve(self, path: str) -> None:
        stats = self.server.stats
        if not stats.enter():
            self._reply(
                429,
                {"error": "too many concurrent requests", "capacity": stats.capacity},
                {"Retry-After": "1"},
            )
            return
        started = time.monotonic()
        try:
            time.sleep(self.server.draw_service_time())
        finally:
            served_for = time.monotonic() - started
            stats.leave(served_for)
        self._reply(200, {"path": path, "served_in": round(served_for, 4)})


def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    capacity: int = DEFAULT_CAPACITY,
    service_time: float = DEFAULT_SERVICE_TIME,
    jitter: float = DEFAULT_JITTER,
) -> PartnerServer:
    """A bound server (not yet serving: call ``serve_forever``, e.g. in a thread)."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if service_time < 0 or jitter < 0:
        raise ValueError("service_time and jitter must be >= 0")
    return PartnerServer((host, port), Stats(capacity), service_time, jitter)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m example_project.downstream", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free one)")
    parser.add_argument(
        "--capacity", type=int, default=DEFAULT_CAPACITY, help="requests served at once"
    )
    parser.add_argument(
        "--service-time", type=float, default=DEFAULT_SERVICE_TIME, help="mean seconds per request"
    )
    parser.add_argument(
        "--jitter", type=float, default=DEFAULT_JITTER, help="+/- uniform jitter, seconds"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server = serve(args.host, args.port, args.capacity, args.service_time, args.jitter)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    host, port = server.server_address[:2]
    print(
        f"listening on http://{host!s}:{port} (capacity {args.capacity}, "
        f"service time {args.service_time}s +/- {args.jitter}s)",
        flush=True,
    )
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
