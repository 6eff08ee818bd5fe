"""The contract of the Lua scripts (the headers of celery_semaphore/core/redis/lua/common_*.lua,
the prelude of every script).

- One effective-limit rule: the override, else the caller's declared limit, else the
  recorded one. Every script that admits, reports or hands on a permit obeys it.
- What follows freed capacity is the same everywhere: the waiter in place at the head
  of the line is granted the permit (within the caller's effective limit).
- The meta hash's fields are read at most once per script call, on a line without
  weights or fair keys (the test below); a weighted or fair waiter's record and a fair
  key's record are read where they are needed (records_of()).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from outcomes import granted, refused

from celery_semaphore import Handover, Place, Semaphore
from celery_semaphore.core.operations import open_semaphore
from celery_semaphore.core.redis import scripts
from celery_semaphore.core.redis.discovery import read_counts
from devkit.redis_servers import RedisServer

LUA = Path(__file__).resolve().parents[2] / "celery_semaphore" / "core" / "redis" / "lua"
SHORT = 0.2  # the lease of the holder whose expiry frees a permit
READS = "(HGET|HMGET|HGETALL|HLEN|HEXISTS|HKEYS|HVALS|HSCAN) "


@pytest.fixture
def url(redis_session_server: RedisServer) -> str:
    return redis_session_server.url


@pytest.fixture
def name() -> str:
    return f"contract-{uuid.uuid4().hex}"


@pytest.fixture
def semaphores(url: str, name: str) -> Iterator[Callable[..., Semaphore]]:
    """Semaphores on one name, each declaring its own limit; closed at teardown."""
    made: list[Semaphore] = []

    def make(limit: int, **kwargs: Any) -> Semaphore:
        made.append(Semaphore(url, name, limit, **kwargs))
        return made[-1]

    yield make
    for sem in made:
        sem.close()


def full(semaphores: Callable[..., Semaphore], *, recorded: int, waiter: bool = True) -> None:
    """Four holders (h0 with a lease of SHORT s), the recorded limit ``recorded``
    (at most 4: the last declarer was refused), and, with ``waiter``, "w" waiting in
    place at the head of the line. Once one permit frees, three holders are left: a
    caller whose effective limit is above 3 hands the permit on, others do not."""
    anyone = semaphores(100)
    granted(anyone.attempt("h0", lease_timeout=SHORT))
    for i in (1, 2, 3):
        granted(anyone.attempt(f"h{i}"))
    declarer = semaphores(recorded)
    if waiter:
        refused(declarer.attempt("w", in_place=True))
    else:
        refused(declarer.attempt("probe", queue=False))
    assert declarer.status().declared_limit == recorded


def holds(sem: Semaphore, holder: str) -> bool:
    return holder in {h.holder for h in sem.status().holders}


def expire_h0() -> None:
    time.sleep(SHORT + 0.05)


# ------------------------------------------------------------- the effective limit


def test_acquire_admits_within_its_own_declaration_unless_overridden(
    semaphores: Callable[..., Semaphore],
) -> None:
    full(semaphores, recorded=3, waiter=False)
    five = semaphores(5)
    granted(five.attempt("d"))  # 4 holders, recorded 3, declared 5
    assert refused(five.attempt("e", queue=False)).limit == 5
    five.set_limit(2)
    assert refused(five.attempt("f", queue=False)).limit == 2


def test_enqueue_and_status_report_the_callers_effective_limit(
    url: str, name: str, semaphores: Callable[..., Semaphore]
) -> None:
    full(semaphores, recorded=3, waiter=False)
    five, three = semaphores(5), semaphores(3)
    assert five.take_place("p", wait_lease=30).limit == 5
    assert (five.status().effective_limit, three.status().effective_limit) == (5, 3)
    with redis.Redis.from_url(url) as client:  # the CLI and the metrics: the recorded one
        assert open_semaphore(client, "celery_semaphore", name).status().effective_limit == 3
        five.set_limit(2)
        assert open_semaphore(client, "celery_semaphore", name).status().effective_limit == 2
    assert five.take_place("q", wait_lease=30).limit == 2
    assert (five.status().effective_limit, three.status().effective_limit) == (2, 2)


@pytest.mark.parametrize(
    ("declared", "override", "grants"),
    [(5, None, True), (3, None, False), (3, 4, True), (5, 2, False)],
)
def test_a_release_hands_the_permit_on_within_its_callers_effective_limit(
    semaphores: Callable[..., Semaphore], declared: int, override: int | None, grants: bool
) -> None:
    full(semaphores, recorded=3)
    releaser = semaphores(declared)
    if override is not None:
        releaser.set_limit(override)
    assert releaser.release("h1") is True
    assert holds(releaser, "w") is grants


@pytest.mark.parametrize(("recorded", "grants"), [(4, True), (3, False)])
@pytest.mark.parametrize("script", ["renew", "dispatch", "configure"])
def test_callers_that_declare_no_limit_hand_on_within_the_recorded_one(
    semaphores: Callable[..., Semaphore], script: str, recorded: int, grants: bool
) -> None:
    """renew, dispatch and configure reclaim h0 and hand its permit on to the waiter
    in place within the recorded limit: the limit 1 of the caller (the heartbeat opens
    semaphores it knows only by name with limit 1) is no declaration."""
    full(semaphores, recorded=recorded)
    caller = semaphores(1, on_handover=lambda handovers: None)
    expire_h0()
    if script == "renew":
        assert caller.renew_many(["h1"]) == set()
    elif script == "dispatch":
        assert caller.dispatch() == 0
    else:
        assert caller.set_draining(False) is False
    assert not holds(caller, "h0")
    assert holds(caller, "w") is grants


@pytest.mark.parametrize(("recorded", "due"), [(4, True), (3, False)])
def test_park_hands_over_within_the_recorded_limit(
    semaphores: Callable[..., Semaphore], recorded: int, due: bool
) -> None:
    full(semaphores, recorded=recorded, waiter=False)
    handed: list[Handover] = []
    parker = semaphores(1, on_handover=handed.extend)
    expire_h0()
    parker.park("p", "payload")
    assert [h.holder for h in handed] == (["p"] if due else [])


# ------------------------------------------------------------ what follows a free


def test_a_resume_grants_the_first_waiter_in_place_before_any_grant(
    semaphores: Callable[..., Semaphore],
) -> None:
    """Bug: the first grant ever made in place (no average pace yet) failed the
    script after the grant (``fmt(nil)``): `resume` answered with an error."""
    sem = semaphores(1)
    sem.set_draining(True)
    refused(sem.attempt("w", in_place=True))
    assert sem.set_draining(False) is True
    assert holds(sem, "w")


def test_leaving_the_head_of_the_line_hands_the_permit_on(
    semaphores: Callable[..., Semaphore],
) -> None:
    """A waiter that gives up at the head of the line (timeout, revoke) lets the one
    behind it, waiting in place, have the free permit at once."""
    sem = semaphores(2)
    first = granted(sem.attempt("a"))
    granted(sem.attempt("b"))
    refused(sem.attempt("asking"))
    refused(sem.attempt("w", in_place=True))
    assert first.release() is True
    assert not holds(sem, "w"), "FIFO: 'asking' is first"
    assert sem.release("asking") is False  # it leaves the line; it held nothing
    assert holds(sem, "w")


def test_a_renew_that_reclaims_hands_over_the_parked_waiter_now_due(
    semaphores: Callable[..., Semaphore],
) -> None:
    handed: list[Handover] = []
    sem = semaphores(1, on_handover=handed.extend)
    granted(sem.attempt("h", lease_timeout=SHORT))
    sem.park("p", "payload", refused(sem.attempt("p")).ticket)
    assert handed == []
    expire_h0()
    assert sem.renew_many(["h"]) == {"h"}
    assert [(h.holder, h.payload) for h in handed] == [("p", "payload")]


# ----------------------------------------------------------------- static checks


def code_lines(path: Path) -> Iterator[tuple[str, str]]:
    """(function, line) for the lines of a Lua file without comments (no string in
    these files holds '--'); function: the top-level one the line is in, or ''."""
    function = ""
    for raw in path.read_text().splitlines():
        line = raw.split("--", 1)[0].rstrip()
        if match := re.match(r"local function (\w+)", line):
            function = match.group(1)
        elif line == "end":
            function = ""
        yield function, line.strip()


def test_the_prelude_defines_each_local_before_its_first_use() -> None:
    """The prelude is several files joined (scripts.COMMON); a top-level ``local`` named
    above its definition (a file joined too early, a helper moved) compiles to a global:
    nil, and an error only when that line runs. So no such name occurs earlier."""
    strings = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
    lines: list[str] = []
    defined: dict[str, int] = {}
    for name in scripts.COMMON:
        for function, line in code_lines(LUA / f"{name}.lua"):
            local = re.match(r"local (function )?([\w, ]+)", line)
            if local and (function == "" or (local.group(1) and local.group(2) == function)):
                for each in local.group(2).split(","):
                    defined.setdefault(each.strip(), len(lines))
            lines.append(strings.sub("''", line))
    assert len(defined) > 100  # the prelude was read
    early = {
        name: lines[i]
        for name, at in defined.items()
        for i in range(at)
        if re.search(rf"(?<![.\w]){re.escape(name)}\b", lines[i])
    }
    assert early == {}


def test_only_effective_limit_reads_the_override_for_a_limit() -> None:
    """Other scripts load the field for it (and configure sets it); status.lua also
    reports its raw value."""
    reads = [
        (path.name, function, line)
        for path in sorted(LUA.glob("*.lua"))
        for function, line in code_lines(path)
        if re.search(r"\.override\b|\[ *'override' *\]", line)
    ]
    assert reads == [
        ("common_meta.lua", "effective_limit",
         "return tonumber(m.override) or tonumber(declared) or tonumber(m.limit) or 0"),
        ("status.lua", "", "now_ms, m.limit or '', m.override or '', "
         "effective_limit(m, declared),"),
    ]  # fmt: skip


def test_meta_is_read_by_load_meta_only_and_its_fields_written_through_helpers() -> None:
    reads, writes = [], []
    for path in sorted(LUA.glob("*.lua")):
        for function, line in code_lines(path):
            if re.search(r"'(HGET|HMGET|HGETALL|HLEN|HEXISTS|HKEYS|HVALS|HSCAN)', meta\b", line):
                reads.append((path.name, function))
            if re.search(r"'(HSET|HSETNX|HMSET|HINCRBY|HINCRBYFLOAT)', meta\b", line):
                writes.append((path.name, function))
    # besides its fields, meta keeps records: the weights of weighted waiters ("Weights"
    # in common_weights.lua), read only while n_weighted says some are there, and the fair
    # keys' ("The order of the line" in common_order.lua), read only for a contender with a
    # fair key; status.lua also scans the fair keys' records (scan_records(), bounded),
    # only while n_fair_keys says some are there
    assert sorted(reads) == [
        ("common_meta.lua", "load_meta"),
        ("common_meta.lua", "records_of"),
        ("common_meta.lua", "scan_records"),
    ]
    assert set(writes) == {
        ("common_weights.lua", "count_weighted"),  # n_weighted
        ("common_line.lua", "weigh_waiter"),  # w|<waiter>
        ("common_order.lua", "put_fair"),  # f|<key>, n_fair_keys
        ("common_order.lua", "count_fair_grant"),  # fair_grants
        ("common_meta.lua", "set_meta"),
        ("common_meta.lua", "write_meta"),
        ("common_meta.lua", "bump"),  # the m_* counters: counts.lua and status.lua read them
        ("common_meta.lua", "count_released"),
        ("common_parked.lua", "recount"),  # n_parked and n_handed: status.lua reads them
        ("common_meta.lua", "observe"),
    }


# ------------------------------------------------------- meta read once per call


class Monitor(threading.Thread):
    """The commands Redis runs (MONITOR shows those a script calls, as client 'lua')."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.commands: list[tuple[str, str]] = []
        self.ready = threading.Event()

    def run(self) -> None:
        with self.client.monitor() as monitor:
            self.ready.set()
            while True:
                seen = monitor.next_command()
                self.commands.append((seen["client_type"], seen["command"]))
                if seen["command"] == "ECHO end-of-test":
                    return

    def meta_reads_per_call(self, meta: str) -> Counter[int]:
        """How many script calls read meta how many times."""
        calls: list[int] = []
        for client, command in self.commands:
            if client != "lua" and command.startswith(("EVALSHA", "FCALL")):
                calls.append(0)
            elif client == "lua" and re.match(READS + re.escape(meta) + "( |$)", command):
                calls[-1] += 1
        return Counter(calls)


def test_every_script_call_reads_meta_at_most_once(
    url: str, semaphores: Callable[..., Semaphore]
) -> None:
    handed: list[Handover] = []
    sem = semaphores(2, on_handover=handed.extend)
    monitor = Monitor(url)
    monitor.start()
    assert monitor.ready.wait(5)
    time.sleep(0.1)
    first = granted(sem.attempt("a", lease_timeout=SHORT))
    granted(sem.attempt("b"))
    refused(sem.attempt("w", in_place=True))
    place = refused(sem.attempt("p"))
    sem.park("p", "payload", place.ticket)
    sem.take_place("e", wait_lease=30)
    expire_h0()
    assert sem.renew_many(["b"]) == set()  # reclaims a: w granted in place
    assert first.release() is False
    assert isinstance(sem.take_place("f", wait_lease=30), Place)
    sem.set_limit(4)  # p handed over
    sem.dispatch(drop=["f"])
    sem.status()
    assert read_counts(sem.client, "celery_semaphore", [sem.name])
    sem.release("w")
    sem.client.echo("end-of-test")
    monitor.join(5)
    counts = monitor.meta_reads_per_call(sem.keys.meta)
    assert sum(counts.values()) >= 14
    assert set(counts) <= {0, 1}, counts
    assert [h.holder for h in handed] == ["p"]


def test_the_shared_numbers_are_written_once_in_constants_py() -> None:
    """The histograms' bounds and fields, the priority step and the fair turn come
    into the Lua from celery_semaphore/core/constants.py: no .lua file defines them."""
    from celery_semaphore.core import constants
    from celery_semaphore.core.redis import scripts

    lua = LUA.glob("*.lua")
    for path in lua:
        text = path.read_text(encoding="utf-8")
        for name in ("BUCKETS", "HISTOGRAMS", "PRIORITY_STEP", "FAIR_TURN"):
            assert f"local {name} =" not in text, f"{path.name} defines {name}"
    for source in scripts.SOURCES.values():
        if "observe(" in source:
            assert source.startswith(constants.lua_prelude())
