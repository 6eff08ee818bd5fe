"""Running the demo: the services, the workers, the batch, following it, the verdict."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import redis

from devkit.processes import Child, Processes, worker_command
from devkit.redis_servers import RedisServer
from example_project.demo.line import LineSampler
from example_project.demo.records import (
    FULL,
    PARTNER_SEMAPHORE,
    QUICK,
    REPORTS_QUEUE,
    Plan,
    Run,
    Submitted,
)
from example_project.demo.report import report
from example_project.demo.terminal import Progress, paint, say
from example_project.demo.timeline import write_svg

ROOT = Path(__file__).resolve().parent.parent.parent
HOST = "127.0.0.1"
STOP_GRACE = 10.0  # seconds a worker gets for a warm shutdown before SIGKILL


class DemoError(Exception):
    """The demo could not run (a process did not start, a timeout); exit status 2."""


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, child: Child | None = None
) -> None:
    """Poll ``predicate``; DemoError when ``child`` exits or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if child is not None and not child.alive():
            raise DemoError(f"{child.name} exited while {what}:\n{child.tail()}")
        if time.monotonic() > deadline:
            tail = f":\n{child.tail()}" if child is not None else ""
            raise DemoError(f"timed out after {timeout:g}s waiting for {what}{tail}")
        time.sleep(0.05)


def start_private_redis(processes: Processes) -> str:
    """A redis-server of the demo's own (devkit.redis_servers), stopped with the rest."""
    server = RedisServer(die_with_parent=True)
    processes.closers.append(server.close)
    try:
        server.start()
    except Exception as error:
        raise DemoError(f"redis-server did not start: {error}") from None
    say(f"Redis: started a private redis-server ({server.binary}) on {HOST}:{server.port}")
    return server.url


def http_json(url: str, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: dict[str, Any] = json.load(response)
        return body


def start_downstream(processes: Processes, capacity: int, service: float, jitter: float) -> str:
    child = processes.start(
        "downstream",
        [sys.executable, "-m", "example_project.downstream", "--port", "0",
         "--capacity", str(capacity), "--service-time", str(service), "--jitter", str(jitter)],
        env=child_env({}),
    )  # fmt: skip
    found: list[str] = []

    def listening() -> bool:
        match = re.search(r"listening on (http://\S+)", child.text())
        if match:
            found.append(match.group(1))
        return bool(match)

    wait_until(listening, 15, "the partner API to listen", child)
    return found[0]


def child_env(extra: dict[str, str]) -> dict[str, str]:
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def start_workers(processes: Processes, args: argparse.Namespace, env: dict[str, str]) -> None:
    workers = []
    for i in range(1, args.workers + 1):
        extra = []
        if args.prefetch_multiplier is not None:
            extra = ["--prefetch-multiplier", str(args.prefetch_multiplier)]
            env = {**env, "DEMO_DISABLE_PREFETCH": "0"}
        if args.metrics_port is not None:
            port = str(args.metrics_port + i - 1)
            extra += ["--semaphore-metrics-port", port, "--semaphore-metrics-address", "127.0.0.1"]
        command = worker_command(
            "example_project.tasks", f"demo{i}", concurrency=args.concurrency,
            queues=f"default,{REPORTS_QUEUE}", extra=extra,
        )  # fmt: skip
        workers.append(processes.start(f"worker{i}", command, env=env))
    for worker in workers:
        wait_until(partial(is_ready, worker), 60, f"{worker.name} to be ready", worker)


def is_ready(worker: Child) -> bool:
    return " ready." in worker.text()


def delete_demo_keys(client: redis.Redis, prefix: str) -> None:
    """Delete only the demo's own records (``demo:*``), never anything else."""
    batch = list(client.scan_iter(match=prefix + "*", count=500))
    for i in range(0, len(batch), 500):
        client.delete(*batch[i : i + 500])


def wait_for_external_workers(tasks: ModuleType, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    replies: list[Any] = []
    while time.monotonic() < deadline:
        replies = tasks.app.control.ping(timeout=1.0) or []
        if len(replies) >= count:
            names = ", ".join(sorted(name for reply in replies for name in reply))
            say(f"Workers: {len(replies)} already running ({names})")
            return
    raise DemoError(f"expected {count} workers answering ping, got {len(replies)} in {timeout}s")


def submit_all(tasks: ModuleType, plan: Plan) -> dict[str, Submitted]:
    submitted: dict[str, Submitted] = {}
    for order, (name, args) in enumerate(plan.batch()):
        task = getattr(tasks, name)
        at = time.time()
        result = task.apply_async(args)
        submitted[result.id] = (at, order, name, args[0])
    return submitted


def follow(
    tasks: ModuleType,
    store: redis.Redis,
    partner_url: str,
    plan: Plan,
    *,
    processes: Processes,
    timeout: float,
) -> None:
    from celery_semaphore import Semaphore  # noqa: PLC0415 - after DEMO_REDIS_URL is set

    progress = Progress(plan.total)
    sem = Semaphore(store, PARTNER_SEMAPHORE, tasks.PARTNER_LIMIT)
    deadline = time.monotonic() + timeout
    try:
        while True:
            done = int(store.get(tasks.ENDED) or 0)
            status = sem.status()
            try:
                stats = http_json(f"{partner_url}/stats?timeline=0", timeout=2)
                partner = (
                    f"partner: {stats['in_flight']} in flight, peak {stats['peak']}, "
                    f"429s {stats['rejected']}"
                )
            except OSError:
                partner = "partner: ?"
            progress.show(
                done,
                f"{PARTNER_SEMAPHORE} {status.holder_count}/{status.effective_limit} held, "
                f"{status.waiter_count} in line | {partner}",
            )
            if done >= plan.total:
                break
            for child in processes.children:
                if not child.alive():
                    raise DemoError(f"{child.name} exited during the run:\n{child.tail()}")
            if time.monotonic() > deadline:
                raise DemoError(
                    f"only {done} of {plan.total} tasks ended within {timeout:g}s; "
                    f"worker logs are in {processes.log_dir}"
                )
            time.sleep(0.2)
    finally:
        progress.end()
        sem.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m example_project.demo",
        description="Cap a partner API at 5 concurrent calls across a Celery cluster, and "
        "measure it from the partner's side.",
    )
    parser.add_argument("--quick", action="store_true", help="a small batch (about 15 s)")
    parser.add_argument(
        "--redis-url",
        help="use this Redis (broker, results, semaphores) instead of starting a private one; "
        "the demo deletes only its own demo:* keys there",
    )
    parser.add_argument(
        "--broker",
        metavar="URL",
        help="the broker (for example amqp://guest:guest@127.0.0.1:5672//), if not the Redis; "
        "the demo declares its queues there (default, reports and their .semaphore-* "
        "companions), and waiting tasks park in the broker's parking queues",
    )
    parser.add_argument(
        "--downstream-url", help="use this running partner API instead of starting one"
    )
    parser.add_argument(
        "--external-workers",
        type=int,
        default=0,
        metavar="N",
        help="do not start workers: N are already consuming from --redis-url",
    )
    parser.add_argument("--workers", type=int, default=2, help="workers to start (default 2)")
    parser.add_argument(
        "--concurrency", type=int, default=4, help="prefork processes per worker (default 4)"
    )
    parser.add_argument(
        "--prefetch-multiplier",
        type=int,
        default=None,
        help="let the workers prefetch, this many messages per process (Celery's default "
        "is 4); without it a worker takes a message only when a process is free",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="worker i serves Prometheus metrics on 127.0.0.1:PORT+i-1 (default: none)",
    )
    parser.add_argument(
        "--partner-limit",
        type=int,
        default=None,
        help="the partner-api cap given to the workers it starts (default 5, the partner's "
        "capacity; try 8 to see the 429s the cap prevents)",
    )
    parser.add_argument("--capacity", type=int, default=5, help="the partner's capacity")
    parser.add_argument("--service-time", type=float, default=0.2, help="partner mean, s")
    parser.add_argument("--jitter", type=float, default=0.1, help="partner jitter +/-, s")
    parser.add_argument(
        "--out", type=Path, default=ROOT / ".demo", help="logs and the SVG (default .demo/)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="give up after (s)")
    args = parser.parse_args(argv)
    if args.external_workers and not args.redis_url:
        parser.error("--external-workers needs --redis-url (the Redis they consume from)")
    if args.external_workers and args.partner_limit is not None:
        parser.error("--partner-limit only applies to workers the demo starts")
    if args.external_workers and args.metrics_port is not None:
        parser.error("--metrics-port only applies to workers the demo starts")
    return args


def start_services(args: argparse.Namespace, processes: Processes) -> dict[str, str]:
    """Redis and the partner API (started, or the ones named); the workers' environment."""
    if args.redis_url:
        redis_url = args.redis_url
        say(f"Redis: using {redis_url} (the demo deletes only its own demo:* keys there)")
    else:
        redis_url = start_private_redis(processes)
    if args.downstream_url:
        partner_url = args.downstream_url.rstrip("/")
        say(f"Partner API: using {partner_url}")
    else:
        partner_url = start_downstream(processes, args.capacity, args.service_time, args.jitter)
        say(
            f"Partner API: started on {partner_url} (capacity {args.capacity}, service "
            f"{args.service_time * 1000:.0f} +/- {args.jitter * 1000:.0f} ms, 429 above capacity)"
        )
    if args.broker:
        say(f"Broker: using {args.broker}")
    return {
        "DEMO_REDIS_URL": redis_url,
        "DEMO_BROKER_URL": args.broker or "",
        "DEMO_DOWNSTREAM_URL": partner_url,
        "DEMO_PARTNER_LIMIT": str(args.partner_limit or args.capacity),
    }


def pool_size(tasks: ModuleType, workers: int) -> int:
    """The worker processes of the cluster (every worker's pool); 0 if none answered."""
    stats = tasks.app.control.inspect(timeout=2.0, limit=workers).stats() or {}
    return sum(int(s.get("pool", {}).get("max-concurrency", 0)) for s in stats.values())


def executions(tasks: ModuleType, store: redis.Redis, bodies: int) -> list[dict[str, Any]]:
    """The executions' records; a process writes one just after its body's end record, so
    wait (briefly) until every body that ended has its own."""
    deadline = time.monotonic() + 5
    while True:
        records = [json.loads(r) for r in store.lrange(tasks.EXECUTIONS, 0, -1)]
        ran = sum(1 for r in records if r["state"] != "RETRY")
        if ran >= bodies or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def collect(
    tasks: ModuleType,
    store: redis.Redis,
    partner_url: str,
    submitted: dict[str, Submitted],
    workers: int,
) -> Run:
    expected: dict[int, int] = defaultdict(int)
    for _, _, name, key in submitted.values():
        if name == "sync_customer":
            expected[key] += 1
    events = [json.loads(e) for e in store.lrange(tasks.EVENTS, 0, -1)]
    ours = [e for e in events if e["id"] in submitted]
    if len(ours) < len(events):  # a broker that keeps messages (RabbitMQ) across runs
        left = len({e["id"] for e in events} - set(submitted))
        say(f"({left} task(s) of an earlier run, left in the broker, ran too: left out below)")
    events = ours
    return Run(
        submitted=submitted,
        events=events,
        partner=http_json(f"{partner_url}/stats", timeout=10),
        balances={c: int(store.hget(f"{tasks.CRM}{c}", "balance") or 0) for c in expected},
        expected_balances=dict(expected),
        partner_limit=tasks.PARTNER_LIMIT,
        reports_limit=tasks.REPORTS_LIMIT,
        executions=[
            e
            for e in executions(tasks, store, sum(1 for e in events if e["event"] == "end"))
            if e["id"] in submitted
        ],
        processes=pool_size(tasks, workers),
    )


def run_demo(args: argparse.Namespace, processes: Processes) -> int:
    plan = QUICK if args.quick else FULL
    say(paint("celery-semaphore demo", "1") + f" ({'quick' if args.quick else 'full'} run)")
    say(f"Logs: {processes.log_dir}")
    env = start_services(args, processes)
    os.environ.update(env)  # before the app is imported: it reads them at import
    from example_project import tasks  # noqa: PLC0415

    partner_url = env["DEMO_DOWNSTREAM_URL"]
    store = redis.Redis.from_url(env["DEMO_REDIS_URL"], decode_responses=True)
    try:
        store.ping()
        if args.external_workers:
            wait_for_external_workers(tasks, args.external_workers, 90)
        else:
            start_workers(processes, args, child_env(env))
            prefetch = (
                "no prefetch"
                if args.prefetch_multiplier is None
                else f"prefetch {args.prefetch_multiplier} per process"
            )
            say(
                f"Workers: started {args.workers} (prefork, {args.concurrency} processes each, "
                f"{prefetch}, queues default,{REPORTS_QUEUE}); partner-api cap "
                f"{tasks.PARTNER_LIMIT}"
            )
        delete_demo_keys(store, tasks.KEY_PREFIX)
        http_json(f"{partner_url}/reset")
        say(
            f"Sending {plan.partner_calls} call_partner, {plan.syncs} sync_customer "
            f"({plan.customers} customers) and {plan.reports} build_report tasks..."
        )
        timeout = args.timeout or (90.0 if args.quick else 180.0)
        with LineSampler(env["DEMO_REDIS_URL"], PARTNER_SEMAPHORE, tasks.PARTNER_LIMIT) as line:
            submitted = submit_all(tasks, plan)
            follow(tasks, store, partner_url, plan, processes=processes, timeout=timeout)
        if line.error:
            say(paint(f"note: {line.error}", "33"))
        workers = args.external_workers or args.workers
        run = collect(tasks, store, partner_url, submitted, workers)
        run.line = line.samples
    finally:
        store.close()
    out: Path = args.out.resolve()
    svg_path = out / "demo-timeline.svg"
    write_svg(run, svg_path)
    verdict = report(run, plan)
    say()
    say(f"Timeline picture: {svg_path}")
    for warning in verdict.warnings:
        say(paint(f"note: {warning}", "33"))
    if verdict.failures:
        say(paint("RESULT: FAIL", "31;1") + " - " + "; ".join(verdict.failures))
        return 1
    say(paint("RESULT: OK", "32;1") + " - every cap held, and the partner never said 429")
    return 0


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: unwind like Ctrl-C so every started process is stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out.resolve()
    log_dir = out / "logs"
    if log_dir.exists():
        shutil.rmtree(log_dir)
    log_dir.mkdir(parents=True)
    processes = Processes(log_dir, cwd=ROOT)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    # Ctrl-C stops the demo even when started as a background job (SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return run_demo(args, processes)
    except DemoError as error:
        say(paint(f"demo: {error}", "31"))
        return 2
    except (KeyboardInterrupt, Interrupted) as stop:
        signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
        say(f"\ndemo: interrupted ({signal.Signals(signum).name}); stopping what it started")
        return 128 + signum
    finally:
        if processes.children:
            say(f"Stopping {len(processes.children)} processes...")
        processes.stop_all(STOP_GRACE)
