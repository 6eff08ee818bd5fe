"""What a countdown wait costs on a RabbitMQ quorum queue (native delayed delivery) and
on a classic one, beside parking in the broker (the default on RabbitMQ).

N tasks of H seconds under a cap L, on one real prefork ``celery worker`` of C
processes (C > L, so that the cap binds), its home queue declared in ``task_queues``
as one of:

- ``classic``: a classic queue on a direct exchange (Celery's default): a countdown
  is an ETA message the worker holds (in memory, its prefetch raised for it);
- ``quorum-native``: a quorum queue on a topic exchange, the app's default queue (so
  that a retry is routed there): Celery 5.5+ sends a countdown through RabbitMQ's
  ``celery_delayed_*`` queues (whole seconds) and the worker's prefetch is static;
- ``quorum-direct``: a quorum queue on a direct exchange: no native delay (Celery
  warns at each countdown), the ETA held by the worker, its prefetch static.

Each with ``semaphore_wait_mode = "countdown"`` and ``semaphore_max_block = 0``
(``--countdown-max-block``): parking off and no wait in place, every refused ask is a
countdown retry; and, for reference, with the defaults (``"handover"``: a waiting task
parks in the broker). ``countdown, rounded`` rounds every countdown up to whole
seconds, at least 1, where the app has a quorum queue (one half of the change
proposed for ``celery_semaphore/retry.py``, applied here by the workers' app): Celery
truncates a native countdown to whole seconds and refuses one under a second
("countdown must be a positive number"), which fails the task as it is.

The tasks are published by the same app as the workers run (places taken, and
tasks parked, at publish, as a user's app does). The script makes a vhost of its own
on the machine's RabbitMQ (``rabbitmqctl``, guest), a ``redis-server`` of its own on a
free port without persistence (the semaphores, the records), starts one worker per
scenario, prints the figures side by side and removes everything again (the vhost
with every queue in it), also on an error, Ctrl-C or SIGTERM; a scenario whose tasks
have not all run or failed after ``--max-seconds`` is reported so. It asserts
nothing. Every figure comes from outside the plugin: each body records its start and
end, each refused wait its countdown (``permit_waiting``), each failure its error; the
worker is asked what it holds (``inspect``), the broker what its queues hold.

    .venv/bin/python benchmarks/bench_quorum.py            # 2 to 8 minutes
    .venv/bin/python benchmarks/bench_quorum.py --quick    # smoke run
    .venv/bin/python benchmarks/bench_quorum.py --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import redis
from celery import Celery
from celery.signals import task_failure, worker_ready
from celery.worker import state as worker_state
from celery.worker.control import inspect_command
from celery.worker.request import Request
from kombu import Connection, Exchange, Queue

import celery_semaphore
from celery_semaphore import LimitedTask, signals
from celery_semaphore.formats import Gate, parking_queue
from celery_semaphore.state import installed_apps

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # devkit/, beside the package
from devkit.measures import kendall_tau, peak_overlap  # noqa: E402
from devkit.processes import Processes, wait_until, worker_command  # noqa: E402
from devkit.redis_servers import RedisServer  # noqa: E402
from devkit.reporting import package_version  # noqa: E402

RUNS_KEY, FAILED_KEY, WAITING_KEY, READY_KEY = "bq:runs", "bq:failed", "bq:waiting", "bq:ready"


def home_queue(shape: str, name: str) -> Any:
    """The home queue as ``task_queues`` declares it in each shape."""
    if shape == "classic":
        return Queue(name, Exchange(name, type="direct"), routing_key=name)
    kind = "topic" if shape == "quorum-native" else "direct"
    return Queue(
        name, Exchange(name, type=kind), routing_key=name,
        queue_arguments={"x-queue-type": "quorum"},
    )  # fmt: skip


def round_countdowns_up() -> None:
    """The change proposed for ``Waits.countdown`` (celery_semaphore/retry.py): where
    Celery delays a countdown natively (the app has a quorum queue), whole seconds."""
    from celery.utils.quorum_queues import detect_quorum_queues

    from celery_semaphore import retry

    plain = retry.Waits.countdown

    def countdown(self: Any, gate: Any, place: Any, delay: float) -> Any:
        app = self.task.app
        if detect_quorum_queues(app, app.connection_for_write().transport.driver_type)[0]:
            delay = float(max(1, math.ceil(delay)))
        return plain(self, gate, place, delay)

    retry.Waits.countdown = countdown


# -- the app: the workers' (``celery -A bench_quorum worker``) and the publisher's -----------


def make_app(env: Mapping[str, str]) -> Any:
    """The app of one scenario, from its settings (``BQ_*``): the worker's and, the same,
    the publisher's (so that tasks take their places, and park, at publish)."""
    queue, shape = env["BQ_QUEUE"], env["BQ_SHAPE"]
    made = Celery("bench_quorum", broker=env["BQ_BROKER_URL"])
    made.conf.update(
        task_queues=[home_queue(shape, queue)],
        task_default_queue=queue,
        broker_transport_options={"confirm_publish": True},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_ignore_result=True,
        semaphore_redis_url=env["BQ_REDIS_URL"],
        semaphore_wait_mode=env["BQ_WAIT_MODE"],
    )
    if env.get("BQ_MAX_BLOCK"):
        made.conf.semaphore_max_block = float(env["BQ_MAX_BLOCK"])
    celery_semaphore.install(made)
    records = redis.Redis.from_url(env["BQ_REDIS_URL"])

    @made.task(bind=True, base=LimitedTask, name="bench_quorum.work", shared=False,
               semaphore=env["BQ_SEMAPHORE"], limit=int(env["BQ_LIMIT"]))  # fmt: skip
    def work(self: Any, index: int, hold: float) -> int:
        start = time.time()
        time.sleep(hold)
        end = time.time()
        header = getattr(self.request, "celery_semaphore", None) or {}
        run = {"index": index, "start": start, "end": end, "waits": header.get("waits", 0)}
        records.rpush(RUNS_KEY, json.dumps(run))
        return index

    return made


app: Any = None
if os.environ.get("BQ_QUEUE"):  # a worker's
    app = make_app(os.environ)
    _records = redis.Redis.from_url(os.environ["BQ_REDIS_URL"])
    if os.environ.get("BQ_ROUND_UP") == "1":
        round_countdowns_up()

    @task_failure.connect
    def _failed(task_id: str | None = None, exception: Any = None, **_: Any) -> None:
        _records.rpush(FAILED_KEY, json.dumps({"id": task_id, "error": repr(exception)}))

    @signals.permit_waiting.connect
    def _waiting(countdown: float | None = None, **_: Any) -> None:
        _records.rpush(WAITING_KEY, json.dumps({"countdown": countdown}))

    @worker_ready.connect
    def _ready(sender: Any = None, **_: Any) -> None:
        _records.sadd(READY_KEY, getattr(sender, "hostname", None) or socket.gethostname())


@inspect_command()
def bq_held(state: Any, **_: Any) -> dict[str, int]:
    """Messages this worker holds waiting: reserved (not running) and scheduled (ETA),
    counted as ``inspect().reserved()`` and ``.scheduled()`` list them."""
    reserved = state.tset(worker_state.reserved_requests) - state.tset(worker_state.active_requests)
    scheduled = sum(
        1
        for waiting in list(state.consumer.timer.schedule.queue)
        if isinstance((getattr(waiting.entry, "args", None) or (None,))[0], Request)
    )
    return {"reserved": len(reserved), "scheduled": scheduled}


# -- the driver -----------------------------------------------------------------------------


AMQP = "amqp://guest:guest@127.0.0.1:5672"
SAMPLE_EVERY = 0.5
DELAY_LEVELS = 28  # celery_delayed_0 .. celery_delayed_27


@dataclass(frozen=True)
class Scenario:
    shape: str
    mode: str  # semaphore_wait_mode: countdown runs with --countdown-max-block
    round_up: bool = False

    @property
    def label(self) -> str:
        return f"{self.shape}, {self.mode}" + (", rounded" if self.round_up else "")


SCENARIOS = (
    Scenario("classic", "countdown"),
    Scenario("quorum-native", "countdown"),
    Scenario("quorum-native", "countdown", round_up=True),
    Scenario("quorum-direct", "countdown"),
    Scenario("classic", "handover"),
    Scenario("quorum-native", "handover"),
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def rabbitmqctl(*args: str) -> str:
    command = shutil.which("rabbitmqctl")
    if command is None:
        raise SystemExit("bench_quorum needs rabbitmqctl (a vhost of its own)")
    done = subprocess.run([command, *args], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


@contextlib.contextmanager
def private_vhost() -> Iterator[str]:
    vhost = f"bench-quorum-{os.getpid()}-{int(time.time())}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield vhost
    finally:
        rabbitmqctl("delete_vhost", vhost)
        log(f"deleted vhost {vhost}")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except (OSError, IndexError, ValueError):
        return 0.0
    return own + sum(process_cpu(int(kid)) for kid in kids)


def broker_cpu() -> float:
    """CPU seconds of the RabbitMQ node (beam.smp), the whole node: other users count."""
    out = subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True, text=True, check=False)
    return sum(process_cpu(int(pid)) for pid in out.stdout.split())


class Sampler:
    """Every SAMPLE_EVERY s: what the worker holds (inspect) and what the broker's
    delay queues and parking queues hold."""

    def __init__(
        self, client: Any, worker: str, broker: str, *, delayed: list[str], parking: list[str]
    ) -> None:
        self.client, self.worker, self.broker = client, worker, broker
        self.delay_queues, self.parking = delayed, parking  # only queues that exist
        self.held: list[int] = []
        self.delayed: list[int] = []
        self.parked: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _count(self, connection: Any, names: list[str]) -> int:
        total = 0
        for name in names:
            with connection.channel() as channel, contextlib.suppress(Exception):
                total += int(channel.queue_declare(name, passive=True).message_count)
        return total

    def _run(self) -> None:
        with Connection(self.broker) as connection:
            while not self._stop.is_set():
                replies = self.client.control.broadcast(
                    "bq_held", reply=True, destination=[self.worker], limit=1,
                    timeout=SAMPLE_EVERY,
                )  # fmt: skip
                for reply in replies:
                    for counts in reply.values():
                        self.held.append(int(counts["reserved"]) + int(counts["scheduled"]))
                self.delayed.append(self._count(connection, self.delay_queues))
                self.parked.append(self._count(connection, self.parking))
                self._stop.wait(SAMPLE_EVERY)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def run_scenario(
    scenario: Scenario, number: int, args: argparse.Namespace,
    *, vhost: str, semaphores: RedisServer, log_dir: Path,
) -> dict[str, Any]:  # fmt: skip
    broker = f"{AMQP}/{vhost}"
    queue = f"bq{number}-{scenario.shape}-{scenario.mode}"
    semaphore = f"bq{number}"
    records = semaphores.client()
    records.delete(RUNS_KEY, FAILED_KEY, WAITING_KEY, READY_KEY)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
        "BQ_QUEUE": queue, "BQ_SHAPE": scenario.shape, "BQ_BROKER_URL": broker,
        "BQ_REDIS_URL": semaphores.url, "BQ_WAIT_MODE": scenario.mode,
        "BQ_SEMAPHORE": semaphore, "BQ_LIMIT": str(args.limit),
        "BQ_ROUND_UP": "1" if scenario.round_up else "",
        "BQ_MAX_BLOCK": str(args.countdown_max_block) if scenario.mode == "countdown" else "",
    }  # fmt: skip
    short = f"bq{number}"
    name = f"{short}@{socket.gethostname()}"
    processes = Processes(log_dir, cwd=HERE)
    client = make_app(env)  # publishes as a user's app does: places, parks at publish
    task = client.tasks["bench_quorum.work"]
    try:
        command = worker_command(
            "bench_quorum", short, concurrency=args.concurrency, queues=queue, loglevel="warning"
        )
        processes.start(short, command, env=env)
        wait_until(lambda: records.scard(READY_KEY) >= 1, 60, "the worker ready")
        gate = Gate(semaphore, args.limit)
        parking = [parking_queue(queue, gate, asked=asked) for asked in (False, True)]
        delayed = [f"celery_delayed_{level}" for level in range(DELAY_LEVELS)]
        watched = {  # asking of a queue that does not exist is an error in the broker's log
            "delayed": delayed if scenario.shape == "quorum-native" else [],
            "parking": parking if scenario.mode == "handover" else [],
        }
        cpu_before, broker_before = process_cpu(processes[0].pid), broker_cpu()
        with Sampler(client, name, broker, **watched) as sampler:
            first_submit = time.time()
            with client.producer_or_acquire() as producer:
                for index in range(args.tasks):
                    task.apply_async((index, args.hold), queue=queue, producer=producer)
            submitted = time.time()

            def done() -> bool:
                return int(records.llen(RUNS_KEY)) + int(records.llen(FAILED_KEY)) >= args.tasks

            try:
                wait_until(done, args.max_seconds, f"{args.tasks} tasks run or failed")
                finished = True
            except TimeoutError:
                finished = False
        cpu = process_cpu(processes[0].pid) - cpu_before
        broker_cpu_s = broker_cpu() - broker_before
        warning_lines = [
            line for line in processes[0].text().splitlines()
            if "native delayed delivery" in line
        ]  # fmt: skip
    finally:
        processes.stop_all()
        installed_apps.discard(client)  # its publish hook: this scenario's only
        client.close()
    runs = [json.loads(r) for r in records.lrange(RUNS_KEY, 0, -1)]
    failed = [json.loads(r) for r in records.lrange(FAILED_KEY, 0, -1)]
    waiting = [json.loads(r) for r in records.lrange(WAITING_KEY, 0, -1)]
    records.close()
    countdowns = [w["countdown"] for w in waiting if w["countdown"] is not None]
    out: dict[str, Any] = {
        "scenario": scenario.label,
        "finished": finished,
        "ran": len(runs),
        "distinct": len({r["index"] for r in runs}),
        "failed": len(failed),
        "errors": sorted({f["error"] for f in failed}),
        "submit_s": submitted - first_submit,
        "countdowns": len(countdowns),
        "countdown_median_s": statistics.median(countdowns) if countdowns else None,
        "countdowns_under_1s": sum(1 for c in countdowns if c < 1),
        "parked": len(waiting) - len(countdowns),
        "held_by_worker_peak": max(sampler.held, default=None),
        "delay_queues_peak": max(sampler.delayed, default=0),
        "parking_queues_peak": max(sampler.parked, default=0),
        "worker_cpu_s": cpu,
        "broker_cpu_s": broker_cpu_s,
        "native_delay_warnings": len(warning_lines),
    }
    if runs:
        ordered = sorted(runs, key=lambda r: r["start"])
        span = max(r["end"] for r in runs) - ordered[0]["start"]
        out.update(
            makespan_s=span,
            efficiency=(len(runs) * args.hold / args.limit) / span,
            efficiency_from_submit=(
                (len(runs) * args.hold / args.limit) / (max(r["end"] for r in runs) - first_submit)
            ),
            peak_overlap=peak_overlap([(r["start"], r["end"]) for r in runs]),
            kendall_tau=kendall_tau([r["index"] for r in ordered]),
            waits_per_task=statistics.fmean(float(r["waits"]) for r in runs),
        )
    return out


def cell(value: Any, fmt: str = "{}") -> str:
    if value is None:
        return "-"
    return fmt.format(value)


ROWS = (
    ("tasks run (distinct) / failed", lambda r: f"{r['distinct']} / {r['failed']}"),
    ("efficiency (N*H/L / makespan)", lambda r: cell(r.get("efficiency"), "{:.3f}")),
    ("efficiency from first submit", lambda r: cell(r.get("efficiency_from_submit"), "{:.3f}")),
    ("makespan s", lambda r: cell(r.get("makespan_s"), "{:.2f}")),
    ("peak overlap (cap)", lambda r: cell(r.get("peak_overlap"))),
    ("Kendall tau (start order)", lambda r: cell(r.get("kendall_tau"), "{:.4f}")),
    ("waits per task run", lambda r: cell(r.get("waits_per_task"), "{:.2f}")),
    ("countdowns published", lambda r: str(r["countdowns"])),
    ("  of them under 1 s", lambda r: str(r["countdowns_under_1s"])),
    ("  median countdown s", lambda r: cell(r["countdown_median_s"], "{:.2f}")),
    ("parks at the worker", lambda r: str(r["parked"])),
    ("held by the worker, peak", lambda r: cell(r["held_by_worker_peak"])),
    ("in celery_delayed_* queues, peak", lambda r: str(r["delay_queues_peak"])),
    ("in parking queues, peak", lambda r: str(r["parking_queues_peak"])),
    ("worker CPU s", lambda r: f"{r['worker_cpu_s']:.1f}"),
    ("RabbitMQ node CPU s (shared)", lambda r: f"{r['broker_cpu_s']:.1f}"),
    ("'native delayed delivery' warnings", lambda r: str(r["native_delay_warnings"])),
)


def print_table(results: list[dict[str, Any]]) -> None:
    width = max(len(label) for label, _ in ROWS) + 2
    heads = [r["scenario"].split(", ", 1) for r in results]
    col = max(12, *(len(part) for head in heads for part in head)) + 2
    for line in range(2):
        print(" " * width + "".join(head[line].rjust(col) for head in heads))
    for label, fn in ROWS:
        print(label.ljust(width) + "".join(fn(r).rjust(col) for r in results))
    for r in results:
        for error in r["errors"]:
            print(f"{r['scenario']}: failed with {error}")
        if not r["finished"]:
            print(f"{r['scenario']}: did not finish within the time allowed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--tasks", type=int, default=300)
    parser.add_argument("--hold", type=float, default=0.05)
    parser.add_argument("-l", "--limit", type=int, default=4)
    parser.add_argument(
        "-c", "--concurrency", type=int, default=8,
        help="prefork processes of the one worker (more than the limit: the cap binds)",
    )  # fmt: skip
    parser.add_argument(
        "--countdown-max-block", type=float, default=0.0,
        help="semaphore_max_block of the countdown scenarios (0: every refused ask counts "
        "down; 1.0, the default setting: the next L in line wait in place)",
    )  # fmt: skip
    parser.add_argument("--only", nargs="*", default=None,
                        help="scenario numbers to run (1-based, as listed)")  # fmt: skip
    parser.add_argument("--max-seconds", type=float, default=120.0,
                        help="longest wait for one scenario's tasks")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="40 tasks: a smoke run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.tasks = 40

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    chosen = [
        (i, s) for i, s in enumerate(SCENARIOS, 1)
        if args.only is None or str(i) in args.only
    ]  # fmt: skip
    load_before = os.getloadavg()
    results = []
    log_dir = Path(tempfile.mkdtemp(prefix="bench-quorum-"))
    try:
        with private_vhost() as vhost, RedisServer() as semaphores:
            for number, scenario in chosen:
                log(f"{scenario.label}: {args.tasks} tasks x {args.hold} s, "
                    f"L={args.limit}, 1 worker x {args.concurrency}")  # fmt: skip
                results.append(run_scenario(
                    scenario, number, args, vhost=vhost, semaphores=semaphores, log_dir=log_dir
                ))  # fmt: skip
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    environment = {
        "load_before": load_before, "load_after": os.getloadavg(),
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "celery": package_version("celery"), "kombu": package_version("kombu"),
        "rabbitmq": rabbitmqctl("version").strip(),
        "celery_semaphore_from": str(Path(celery_semaphore.__file__).parent),
    }  # fmt: skip
    settings = {k: getattr(args, k) for k in ("tasks", "hold", "limit", "concurrency")}
    if args.json:
        print(json.dumps({"settings": settings, "environment": environment,
                          "results": results}, indent=2))  # fmt: skip
        return 0
    print(f"{args.tasks} tasks x {args.hold} s, limit {args.limit}, 1 worker x "
          f"{args.concurrency} prefork; ideal makespan "
          f"{args.tasks * args.hold / args.limit:.2f} s")  # fmt: skip
    print(f"celery {environment['celery']}, kombu {environment['kombu']}, RabbitMQ "
          f"{environment['rabbitmq']}, {environment['cpus']} CPUs, load "
          f"{' '.join(f'{x:.2f}' for x in load_before)} -> "
          f"{' '.join(f'{x:.2f}' for x in environment['load_after'])}")  # fmt: skip
    print(f"celery_semaphore from {environment['celery_semaphore_from']}\n")
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
