"""The cost of fair share in the core: serving a long line whose waiters have many fair
keys, one key, or none, side by side in the same run.

Each line holds N waiting contenders of one semaphore of limit 1 (one-hour places, put
in by pipelined calls of the acquire script with the arguments ``attempt()`` sends):

- ``none``: no fair key (plain FIFO);
- ``one key``: all of them with the same fair key;
- ``many keys``: each with a key of its own (N keys in the rotation);
- ``round robin``: K keys of N / K waiters each, asked key after key (all of the first
  key's, then the second's, ...).

A grant is the release of the permit held and the ``attempt()`` of the head of the line,
which must be granted (the line's order is read once, before the timing; a waiter asked
out of turn would be refused and stop the run). The lines are served in interleaved
rounds of grants (a slice of each line in turn, the garbage collector off), so a burst
of load from other processes hits every line alike; the figure is the median over the
rounds of µs per grant. The ``round robin`` line's served order is checked: every key
once in each round of K grants, FIFO within a key.

The script starts its own ``redis-server`` on a free loopback port (never the shared
one on 6379) and stops it when it ends, also on Ctrl-C and SIGTERM. It asserts nothing
about timings: the target is printed beside the figures, with the load average.

    .venv/bin/python benchmarks/bench_fair_core.py           # N = 10,000, about half a minute
    .venv/bin/python benchmarks/bench_fair_core.py --quick   # smoke run, a few seconds
    .venv/bin/python benchmarks/bench_fair_core.py --json    # machine-readable results
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import redis

from celery_semaphore import Ask, Permit, Semaphore
from celery_semaphore.core.redis import arguments, epochs
from celery_semaphore.core.redis.scripts import registered

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # devkit/, beside the package
from devkit.redis_servers import HOST, RedisServer
from devkit.reporting import package_version, verdict

LONG_LEASE = 3600.0  # places and permits: no expiry mid-run
POPULATE_CHUNK = 1000
TARGET_MANY_OVER_ONE = 1.5


@dataclass(frozen=True)
class Settings:
    contenders: int  # waiters in each line
    rounds: int  # interleaved rounds: each serves contenders / rounds of every line
    keys: int  # keys of the round robin line


FULL = Settings(contenders=10_000, rounds=20, keys=100)
QUICK = Settings(contenders=400, rounds=4, keys=20)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: the server stops


@contextmanager
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class Line:
    """One semaphore of limit 1 with a line of waiters, served a slice at a time."""

    label: str
    semaphore: Semaphore
    keys: dict[str, str | None]  # waiter -> its fair key
    order: list[str] = field(default_factory=list)  # the line, read once
    served: int = 0
    held: Permit | None = None
    us_per_grant: list[float] = field(default_factory=list)

    def fill(self, client: redis.Redis) -> None:
        """Takes the permit, then puts every waiter in line (pipelined acquire calls)."""
        sem = self.semaphore
        permit = sem.attempt("gate", lease_timeout=LONG_LEASE)
        if not isinstance(permit, Permit):
            raise RuntimeError(f"{self.label}: the empty semaphore refused its first contender")
        self.held = permit
        script, keys, spec = registered(sem.client)["acquire"], sem.keys.call_keys, sem._spec
        sem.learn_epoch()
        epoch = epochs.argument(sem.url, sem.keys.epoch, spec.pause_after_loss)
        waiters = list(self.keys.items())
        for start in range(0, len(waiters), POPULATE_CHUNK):
            with client.pipeline(transaction=False) as pipe:
                for holder, key in waiters[start : start + POPULATE_CHUNK]:
                    request = spec.acquire(
                        holder, None, queue=True, wait_lease=LONG_LEASE,
                        lease_timeout=LONG_LEASE, info="", ask=Ask(fair_key=key),
                    )  # fmt: skip
                    args = arguments.acquire_args(spec, request)
                    script(keys=keys, args=[*args, epoch], client=pipe)
                pipe.execute()
        self.order = [w.decode() for w in client.zrange(sem.keys.waiters, 0, -1)]
        if len(self.order) != len(self.keys):
            raise RuntimeError(f"{self.label}: {len(self.order)} in line, wanted {len(self.keys)}")

    def serve(self, count: int) -> None:
        """Grants the next ``count`` of the line in order, timed."""
        attempt, keys = self.semaphore.attempt, self.keys
        batch = self.order[self.served : self.served + count]
        held = self.held
        with no_gc():
            started = time.perf_counter()
            for holder in batch:
                assert held is not None
                held.release()
                result = attempt(holder, lease_timeout=LONG_LEASE, fair_key=keys[holder])
                if not isinstance(result, Permit):
                    raise RuntimeError(f"{self.label}: the head {holder} was refused: {result!r}")
                held = result
            elapsed = time.perf_counter() - started
        self.held = held
        self.served += len(batch)
        if batch:
            self.us_per_grant.append(elapsed / len(batch) * 1e6)


def round_robin_errors(order: list[str], keys: dict[str, str | None], per_round: int) -> list[str]:
    """What breaks "every key once a round, FIFO within a key" in the served ``order``."""
    errors = []
    for start in range(0, len(order), per_round):
        turn = [keys[h] for h in order[start : start + per_round]]
        if len(set(turn)) != len(turn):
            errors.append(f"round {start // per_round}: a key twice")
    by_key: dict[str | None, list[int]] = {}
    for holder in order:
        by_key.setdefault(keys[holder], []).append(int(holder.rsplit("-", 1)[1]))
    errors += [f"key {k}: not FIFO" for k, seq in by_key.items() if seq != sorted(seq)]
    return errors


def run(server: RedisServer, settings: Settings) -> dict[str, Any]:
    n, k = settings.contenders, settings.keys
    client = server.client()
    sems: list[Semaphore] = []
    try:

        def line(label: str, keys: dict[str, str | None]) -> Line:
            sem = Semaphore(client, f"bench-fair-{label.replace(' ', '-')}", 1,
                            waiter_lease=LONG_LEASE, lease_timeout=LONG_LEASE)  # fmt: skip
            sems.append(sem)
            return Line(label, sem, keys)

        lines = [
            line("none", {f"w-{i}": None for i in range(n)}),
            line("one key", {f"w-{i}": "tenant" for i in range(n)}),
            line("many keys", {f"w-{i}": f"tenant-{i}" for i in range(n)}),
            line("round robin", {f"t{j}-{i}": f"t{j}" for j in range(k) for i in range(n // k)}),
        ]
        for each in lines:
            log(f"  filling '{each.label}': {len(each.keys)} waiters")
            each.fill(client)
        per_round = -(-n // settings.rounds)
        for number in range(settings.rounds):
            log(f"  round {number + 1}/{settings.rounds}")
            for each in lines:
                each.serve(per_round)
        for each in lines:
            assert each.held is not None
            each.held.release()
            left = each.semaphore.status().waiter_count
            if each.served != len(each.keys) or left:
                raise RuntimeError(f"{each.label}: served {each.served}, {left} left in line")
        meta = {k.decode() for k in client.hkeys(lines[2].semaphore.keys.meta)}
        records_left = sum(1 for f in meta if f.startswith(("f|", "w|")))
        by_label = {each.label: each for each in lines}
        robin = by_label["round robin"]
        results: dict[str, Any] = {
            each.label.replace(" ", "_"): {
                "us_per_grant": statistics.median(each.us_per_grant),
                "us_per_grant_best": min(each.us_per_grant),
                "grants": each.served,
            }
            for each in lines
        }
        one = by_label["one key"].us_per_grant
        many = by_label["many keys"].us_per_grant
        results["many_over_one"] = statistics.median(m / o for m, o in zip(many, one, strict=True))
        results["one_over_none"] = statistics.median(
            o / p for o, p in zip(one, by_label["none"].us_per_grant, strict=True)
        )
        results["round_robin_errors"] = round_robin_errors(robin.order, robin.keys, k)
        results["records_left_many_keys"] = records_left
        return results
    finally:
        for sem in sems:
            sem.close()
        client.close()


def print_report(results: dict[str, Any]) -> None:
    env, s = results["environment"], results["settings"]
    print(
        f"fair share, {s['contenders']:,} waiters a line, {s['rounds']} interleaved rounds; "
        f"redis {env['redis_server']} on {env['server']}, redis-py {env['redis_py']} "
        f"({env['parser']}), Python {env['python']}, {env['cpus']} CPUs, "
        f"load average {env['load_average']}"
    )
    fair = results["fair"]
    one = fair["one_key"]["us_per_grant"]
    print(f"\n{'line':<34}{'µs/grant':>10}{'best':>10}{'x one key':>11}")
    for label, text in (
        ("none", "no fair key"),
        ("one_key", "one key"),
        ("many_keys", f"many keys ({s['contenders']:,}, one waiter each)"),
        ("round_robin", f"round robin ({s['keys']} keys)"),
    ):
        row = fair[label]
        print(
            f"{text:<34}{row['us_per_grant']:>10.1f}{row['us_per_grant_best']:>10.1f}"
            f"{row['us_per_grant'] / one:>10.2f}x"
        )
    ratio = fair["many_over_one"]
    print(
        f"\nmany keys / one key (median of the per-round ratios): {ratio:.2f}x, "
        f"target <= {TARGET_MANY_OVER_ONE:.1f}x: {verdict(ratio <= TARGET_MANY_OVER_ONE)}"
    )
    print(f"one key / no fair key: {fair['one_over_none']:.2f}x")
    errors = fair["round_robin_errors"]
    print(
        f"round robin order ({s['keys']} keys, each once a round, FIFO within a key): "
        + ("ok" if not errors else f"BROKEN: {'; '.join(errors[:5])}")
    )
    print(f"key and waiter records left in meta after the many-keys line: "
          f"{fair['records_left_many_keys']}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.perf_counter()
    with RedisServer(die_with_parent=True) as server:
        log(f"private redis-server on {HOST}:{server.port} ({server.binary})")
        with server.client() as client:
            redis_version = str(client.info("server")["redis_version"])
        fair = run(server, settings)
    results = {
        "quick": args.quick,
        "elapsed_s": time.perf_counter() - started,
        "settings": settings.__dict__,
        "environment": {
            "redis_server": redis_version,
            "server": f"{HOST}:{server.port}",
            "redis_py": package_version("redis"),
            "python": platform.python_version(),
            "parser": "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure-Python",
            "cpus": os.cpu_count(),
            "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        },
        "fair": fair,
        "targets": {"many_over_one_max": TARGET_MANY_OVER_ONE},
    }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_report(results)
        print(f"\n(whole run: {results['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; the private redis-server was stopped")
        sys.exit(130)
