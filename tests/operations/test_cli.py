"""The real ``celery -A app semaphore ...`` command, as an operator runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from celery_harness import max_overlap

from celery_semaphore import Permit, Place, Semaphore
from celery_semaphore.core.protocol import DEFAULT_IDLE_TTL, DEFAULT_LEASE_TIMEOUT
from celery_semaphore.core.rates import RateLimit

APPS = Path(__file__).parents[1] / "celery_apps"
# The names cli_app declares (listed by `status` even before their first use).
DECLARED = {"launch-api", "mail-api", "queue:reports"}
# What a command that may admit tasks says of one parked task when no worker runs.
NOBODY_WOKEN = (
    "; no worker listens (none running?): its 1 parked task waits for a worker's heartbeat"
)


def run(
    redis_url: str,
    *args: str,
    stdin: str | None = None,
    app: str = "cli_app",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "CS_REDIS_URL": redis_url, "PYTHONPATH": path, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", app, "semaphore", *args],
        env=env,
        cwd=APPS,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
    )


@pytest.fixture
def busy(redis_url: str):
    """A semaphore 'partner-api' (limit 2) with two holders and one waiter."""
    sem = Semaphore(redis_url, "partner-api", 2)
    info = json.dumps({"task": "proj.call_partner", "worker": "w1@host", "pid": 1})
    assert isinstance(sem.attempt("task-a", info=info), Permit)
    assert isinstance(sem.attempt("task-b", info=info), Permit)
    assert isinstance(sem.attempt("task-c", wait_lease=60, info=info), Place)
    yield sem
    sem.close()


def test_status_shows_a_backlog_published_before_any_task_started(redis_url, busy):
    publisher = Semaphore(redis_url, "queued-only", 3)
    for i in range(4):
        publisher.take_place(f"t{i}", wait_lease=60)
    publisher.close()
    drained_early = Semaphore(redis_url, "drained-before-use", 1)  # meta, no limit recorded
    drained_early.client.hset(drained_early.keys.meta, "draining", "1")
    drained_early.close()
    out = run(redis_url, "status", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert set(rows) == {"partner-api", "queued-only", *DECLARED}
    assert (rows["queued-only"]["waiters"], rows["queued-only"]["effective_limit"]) == (4, 3)


def test_status_and_waiters_show_tasks_whose_place_lapsed_in_the_broker(redis_url):
    """Issue: `status` showed WAIT 0 while tasks were still queued in the broker
    (places taken at publish lapse after 5 s by design)."""
    publisher = Semaphore(redis_url, "backlog", 1)
    assert isinstance(publisher.attempt("running"), Permit)
    for i in range(3):
        publisher.take_place(f"queued-{i}", wait_lease=0.2)
    publisher.take_place("still-placed", wait_lease=60)
    time.sleep(0.3)  # three places lapse; their messages would still be in the broker
    out = run(redis_url, "status", "backlog", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert (row["waiters"], row["in_broker"], row["sent"], row["parked"]) == (1, 3, 4, 0)
    assert (row["in_place"], row["countdown"]) == (0, 0)  # all four are in the broker
    table = run(redis_url, "status", "backlog").stdout.splitlines()
    assert table[0].split()[:9] == [
        "SEMAPHORE", "LIMIT", "HOLD", "WAIT", "PARKED", "IN", "PLACE", "SENT", "COUNTDOWN"
    ]  # fmt: skip
    assert table[1].split()[:8] == ["backlog", "1", "1", "4", "0", "0", "4", "0"]
    out = run(redis_url, "waiters", "backlog", "--json")
    rows = json.loads(out.stdout)
    assert [(r["holder"], r["state"], r["position"]) for r in rows] == [
        ("still-placed", "in line", 1),
        ("queued-0", "in broker", 0),
        ("queued-1", "in broker", 0),
        ("queued-2", "in broker", 0),
    ]
    assert "in broker" in run(redis_url, "waiters", "backlog").stdout
    publisher.close()


def test_status_says_where_the_waiting_tasks_wait(redis_url, busy):
    """Issue 32: `status` showed HOLD 0 and nothing else while 154 tasks waited as
    countdown retries. WAIT now splits into PARKED (parked or handed over), IN PLACE,
    SENT (in the broker) and COUNTDOWN (refused at a worker, retried later: task-c
    here); `waiters` calls those "in line", not "asking"."""
    assert isinstance(busy.attempt("in-place", wait_lease=60, in_place=True), Place)
    parking = Semaphore(redis_url, "partner-api", 2, on_handover=lambda handovers: None)
    parking.park("parked", "payload")
    parking.take_place("published", wait_lease=60)
    parking.close()
    (row,) = json.loads(run(redis_url, "status", "partner-api", "--json").stdout)
    assert (row["waiters"], row["parked"], row["handed_over"], row["in_place"]) == (4, 1, 0, 1)
    assert (row["sent"], row["in_broker"], row["countdown"]) == (1, 0, 1)
    assert row["parked_in"] == "in the semaphores' Redis"  # a Redis broker
    header, line, where = run(redis_url, "status", "partner-api").stdout.splitlines()
    assert header.split()[3:9] == ["WAIT", "PARKED", "IN", "PLACE", "SENT", "COUNTDOWN"]
    assert line.split()[3:8] == ["4", "1", "1", "1", "1"]
    assert where == "PARKED: their messages wait in the semaphores' Redis."
    rows = json.loads(run(redis_url, "waiters", "partner-api", "--json").stdout)
    assert {r["holder"]: r["state"] for r in rows} == {
        "task-c": "in line",
        "in-place": "waiting in place",
        "parked": "parked",
        "published": "in line",
    }


def test_status_lists_every_semaphore_with_limits_and_counts(redis_url, busy):
    Semaphore(redis_url, "other", 7).try_acquire("x")
    out = run(redis_url, "status", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert set(rows) == {"partner-api", "other", *DECLARED}
    assert rows["partner-api"]["holders"] == 2
    assert rows["partner-api"]["waiters"] == 1
    assert rows["partner-api"]["effective_limit"] == 2
    assert rows["partner-api"]["utilization"] == 1.0
    assert 0 < rows["partner-api"]["shortest_lease_left"] <= DEFAULT_LEASE_TIMEOUT
    text = run(redis_url, "status", "partner-api")
    assert text.returncode == 0
    assert "partner-api" in text.stdout and "other" not in text.stdout


def test_holders_and_waiters_show_task_worker_and_order(redis_url, busy):
    out = run(redis_url, "holders", "partner-api", "--json")
    rows = json.loads(out.stdout)
    assert [r["holder"] for r in rows] == ["task-a", "task-b"]
    assert [r["permits"] for r in rows] == [1, 1]
    assert {r["task"] for r in rows} == {"proj.call_partner"}
    assert {r["worker"] for r in rows} == {"w1@host"}
    out = run(redis_url, "waiters", "partner-api")
    assert out.returncode == 0
    assert "task-c" in out.stdout and "proj.call_partner" in out.stdout


def test_set_limit_resizes_live_and_reset_restores(redis_url, busy):
    assert run(redis_url, "set-limit", "partner-api", "3").returncode == 0
    assert busy.status().effective_limit == 3
    assert busy.try_acquire("task-c") is not None  # the waiter is admitted under the new limit
    assert run(redis_url, "reset-limit", "partner-api").returncode == 0
    assert busy.status().effective_limit == 2


def test_drain_admits_nobody_and_resume_admits_again(redis_url, busy):
    busy.release("task-a")
    busy.release("task-b")
    assert run(redis_url, "drain", "partner-api").returncode == 0
    assert busy.status().draining
    assert busy.try_acquire("task-c") is None
    assert run(redis_url, "drain", "partner-api").stdout == (
        "partner-api: already draining (admits nobody until `resume`)\n"
    )
    out = run(redis_url, "resume", "partner-api")
    assert out.stdout == "partner-api: admitting again\n"  # nothing parked: nobody asked
    assert busy.try_acquire("task-c") is not None
    out = run(redis_url, "resume", "partner-api")
    assert out.stdout == "partner-api: not draining; nothing changed\n"


def test_release_asks_for_confirmation_and_frees_the_permit(redis_url, busy):
    refused = run(redis_url, "release", "partner-api", "task-a", stdin="n\n")
    assert refused.returncode != 0
    assert busy.status().holder_count == 2
    done = run(redis_url, "release", "partner-api", "task-a", stdin="y\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "Release task-a's permit of partner-api? Its task may still be running [y/N]: "
        "partner-api: released task-a\n"
    )
    assert [h.holder for h in busy.status().holders] == ["task-b"]


def assert_one_line_error(out: subprocess.CompletedProcess[str], message: str) -> None:
    """What the docs promise: one line ``Error: ...`` on stderr, exit status 1."""
    assert out.returncode == 1, (out.returncode, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("Error: "), out.stderr
    assert message in lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        *(
            (
                ("set-limit", "partner-api", limit),
                f"Error: LIMIT: {limit!r} is not a whole number from 1 to 1000000; "
                "e.g. `celery -A cli_app semaphore set-limit partner-api 10`",
            )
            for limit in ("abc", "0", "2.5", "-3", "10000000", "-3.5")
        ),
        (("set-limit", "-3", "partner-api"), "LIMIT: '-3' is not a whole number from 1 to"),
        (("set-limit", "partner-api", "3", "--nwe"), "no such option --nwe (did you mean --new?)"),
        (("set-limit", "partner-api"), "missing argument LIMIT; e.g. `celery -A cli_app"),
        (("set-limit", "partner-api", "3", "4"), "unexpected extra argument (4); e.g. `"),
        (("set-limit",), "missing argument NAME"),
        *(
            (
                ("status", "--interval", interval),
                f"Error: --interval: {interval!r} is not a number of seconds from 0.1 to 604800; "
                "e.g. `celery -A cli_app semaphore status partner-api --watch --interval 5`",
            )
            for interval in ("0", "inf", "nan", "-1", "soon")
        ),
        (("status", "--interval"), "Option '--interval' requires an argument; e.g. `celery -A"),
        (("status", "--jsn"), "no such option --jsn (did you mean --json?); see `celery -A"),
        (("--verbose",), "no such option --verbose; see `celery -A cli_app semaphore --help`"),
        (("status", "-A", "cli_app"), "-A goes before `semaphore`"),
        (("stauts",), "no command 'stauts' in `celery -A cli_app semaphore`; did you mean status?"),
        (("status", "nope"), "no semaphore named 'nope' in Redis"),
        (("holders", "partner-apj"), "did you mean 'partner-api'?"),
        (("drain", "launch-apj"), "did you mean 'launch-api'?"),
        (("waiters", "queue:report"), "did you mean 'queue:reports'?"),
        (("release", "partner-api", "ghost", "--yes"), "'ghost' holds no permit"),
        # checked before the question: no confirmation asked for nothing
        (
            ("release", "partner-api", "task-c"),
            "Error: 'task-c' holds no permit of 'partner-api' (`celery -A cli_app semaphore "
            "holders partner-api`)",
        ),
        *(
            (
                ("set-rate", "partner-api", rate),
                f"Error: RATE: {rate!r} is not a count from 1 to 1000000 per second, minute or "
                "hour (20/s, 100/m, 1000/h); e.g. `celery -A cli_app semaphore set-rate "
                "partner-api 100/m`",
            )
            for rate in ("0/s", "fast", "5/d", "-3/s", "2.5/s", "10000000/h", "")
        ),
        (("set-rate", "partner-api", "5/s", "--burst", "0"), "--burst: '0' is not a whole"),
        (("set-rate", "partner-api"), "missing argument RATE; e.g. `celery -A cli_app semaphore"),
        (("set-rate", "partner-apj", "5/s"), "did you mean 'partner-api'?"),
        (("reset-rate", "launch-apj"), "did you mean 'launch-api'?"),
        (("release", "partner-api", "task-a"), "not released: not confirmed"),  # stdin: EOF
    ],
)
def test_every_error_is_one_line_and_exit_status_1(redis_url, busy, args, message):
    assert_one_line_error(run(redis_url, *args, stdin=""), message)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"semaphore_namespace": ""}, "semaphore_namespace must be"),
        ({"semaphore_lease_timout": 3}, "did you mean semaphore_lease_timeout?"),
        ({"semaphore_redis_url": "http://host"}, "'http://host' is not understood"),
    ],
)
def test_wrong_settings_are_one_line(redis_url, settings, message):
    out = run(redis_url, "status", env={"CS_CLI_CONF": json.dumps(settings)})
    assert_one_line_error(out, message)


def test_no_command_shows_the_help(redis_url):
    out = run(redis_url)
    assert out.returncode == 0
    assert "set-limit" in out.stdout and "reset-limit" in out.stdout


def test_set_limit_and_reset_limit_show_the_declared_limit(redis_url, busy):
    out = run(redis_url, "set-limit", "partner-api", "3")  # nothing parked: nobody to wake
    assert out.stdout == "partner-api: limit 3 (was 2, declared 2)\n"
    out = run(redis_url, "set-limit", "partner-api", "1")  # lowered: nobody to wake
    assert out.stdout == "partner-api: limit 1 (was 3 by override; declared 2)\n"
    parking = Semaphore(redis_url, "partner-api", 2, on_handover=lambda handovers: None)
    parking.park("parked", "payload")
    parking.close()
    out = run(redis_url, "set-limit", "partner-api", "4")
    assert out.stdout == f"partner-api: limit 4 (was 1 by override; declared 2){NOBODY_WOKEN}\n"
    table = run(redis_url, "status", "partner-api").stdout
    assert table.splitlines()[1].split()[:2] == ["partner-api", "4(2)"]
    out = run(redis_url, "reset-limit", "partner-api")
    assert out.stdout == "partner-api: back to the declared limit 2 (was 4 by override)\n"
    out = run(redis_url, "reset-limit", "partner-api")
    assert out.stdout == "partner-api: no override; limit 2 as declared\n"


def test_set_limit_before_first_use_is_obeyed_and_does_not_expire(redis_url):
    """The app declares launch-api with limit 5; an operator caps it at 2 before
    any task ran: the first contenders get 2 permits, and idle expiry starts
    only once they have used it."""
    out = run(redis_url, "set-limit", "launch-api", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "launch-api: limit 2 (not used yet, declared 5 in the app): its first tasks obey it\n"
    )
    sem = Semaphore(redis_url, "launch-api", 5)
    assert sem.client.ttl(sem.keys.meta) == -1  # no expiry: nothing refreshes it before use
    (row,) = json.loads(run(redis_url, "status", "launch-api", "--json").stdout)
    assert (row["declared_limit"], row["override"], row["effective_limit"]) == (None, 2, 2)
    assert run(redis_url, "status").stdout.splitlines()[1].split()[:2] == ["launch-api", "2(-)"]
    granted = [sem.try_acquire(f"task-{i}") for i in range(3)]
    assert [p is not None for p in granted] == [True, True, False]
    assert 0 < sem.client.ttl(sem.keys.meta) <= DEFAULT_IDLE_TTL  # idle expiry from first use
    out = run(redis_url, "set-limit", "launch-api", "3")
    assert out.stdout == "launch-api: limit 3 (was 2 by override; declared 5)\n"
    sem.close()


def test_set_limit_of_a_name_nobody_declared_needs_new(redis_url, busy):
    typo = run(redis_url, "set-limit", "partner-apj", "3")
    assert_one_line_error(typo, "did you mean 'partner-api'?")
    assert "`celery -A cli_app semaphore set-limit partner-apj 3 --new`" in typo.stderr
    probe = Semaphore(redis_url, "partner-apj", 1)
    assert not probe.client.exists(probe.keys.meta)
    out = run(redis_url, "set-limit", "customer-42", "3", "--new")
    assert out.stdout == "customer-42: limit 3 (not used yet): its first tasks obey it\n"
    sem = Semaphore(redis_url, "customer-42", 10)
    assert [sem.try_acquire(f"t{i}") is not None for i in range(4)] == [True] * 3 + [False]
    probe.close()
    sem.close()


def test_reset_limit_before_first_use_leaves_nothing(redis_url):
    assert run(redis_url, "set-limit", "launch-api", "2").returncode == 0
    out = run(redis_url, "reset-limit", "launch-api")
    assert out.stdout == (
        "launch-api: override 2 dropped; not used yet, so its tasks will use the limit "
        "they declare (5 in the app)\n"
    )
    sem = Semaphore(redis_url, "launch-api", 5)
    assert sem.client.keys("*") == [b"celery_semaphore:epoch"]  # kept for good, by design
    (row,) = json.loads(run(redis_url, "status", "launch-api", "--json").stdout)
    assert (row["override"], row["effective_limit"]) == (None, 5)
    # a name the app does not declare, drained meanwhile: with no override left,
    # status could not show the drain
    assert run(redis_url, "set-limit", "customer-42", "2", "--new").returncode == 0
    assert run(redis_url, "drain", "customer-42").returncode == 0
    out = run(redis_url, "reset-limit", "customer-42")
    assert "override 2 dropped; its drain ended too; not used yet" in out.stdout
    assert sem.client.keys("*") == [b"celery_semaphore:epoch"]
    sem.close()


@pytest.mark.slow
def test_a_limit_set_before_first_use_caps_real_workers(celery_cluster):
    """``set-limit hold 2`` before any task of ``hold`` (declared limit 5) ran:
    real workers with room for 4 at once never run more than 2."""
    cluster = celery_cluster(limit=5)
    env = {k: v for k, v in cluster.env.items() if k.startswith("CS_")}
    out = run(cluster.state_url, "set-limit", "hold", "2", app="limited_app", env=env)
    assert out.returncode == 0, out.stderr
    assert "declared 5 in the app" in out.stdout
    cluster.worker("w1", concurrency=4)
    results = [cluster.app_module.hold.delay(0.4, i) for i in range(8)]
    assert [r.get(timeout=60) for r in results] == list(range(8))
    assert max_overlap(cluster.events()) == 2
    state = cluster.semaphore("hold", 5).status()
    assert (state.declared_limit, state.override, state.effective_limit) == (5, 2, 2)


def test_unreachable_redis_is_one_clear_line(unused_url):
    out = run(unused_url, "status")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert unused_url.split("@")[-1].split("/")[0] in out.stderr
    assert "***" in out.stderr and "hunter2" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.fixture
def unused_url() -> str:
    from devkit.redis_servers import free_port

    return f"redis://:hunter2@127.0.0.1:{free_port()}/0"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["resume", "set-limit", "reset-limit", "release"])
def test_a_change_that_admits_hands_the_parked_tasks_over_at_once(celery_cluster, command):
    """Issue 17: after ``resume`` the first of the parked tasks started 12.4 s later,
    at the next heartbeat of a worker (every 15 s here, the default). The command
    wakes the workers' heartbeats through Redis: the first task made due starts
    within a second of the command's end (the bodies' own records tell when)."""
    cluster = celery_cluster(limit=2, extra_conf={"semaphore_max_block": 0.0})  # all park
    env = {k: v for k, v in cluster.env.items() if k.startswith("CS_")}

    def cli(*args: str) -> str:
        out = run(cluster.state_url, *args, app="limited_app", env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout

    cluster.worker("w1", concurrency=2)
    sem = cluster.semaphore("hold", 2)
    blockers = [sem.attempt(holder=f"blocker-{n}") for n in range(2)]
    assert all(isinstance(b, Permit) for b in blockers)
    if command == "resume":
        cli("drain", "hold")
        sem.release("blocker-0")  # this client hands nothing over, and it is draining
    elif command == "reset-limit":
        cli("set-limit", "hold", "1")
        sem.release("blocker-0")  # one holder left, at the override of 1
    results = [cluster.app_module.hold.delay(0.1, i) for i in range(3)]
    ids = [r.id for r in results]
    cluster.wait_for(
        lambda: {w.holder: w.state for w in sem.status().waiters} == dict.fromkeys(ids, "parked"),
        20,
        "three tasks parked",
    )
    time.sleep(1.0)
    assert cluster.events() == []

    args = {
        "resume": ("resume", "hold"),
        "set-limit": ("set-limit", "hold", "3"),
        "reset-limit": ("reset-limit", "hold"),
        "release": ("release", "hold", "blocker-1", "--yes"),
    }[command]
    printed = cli(*args)
    done = time.time()
    assert "1 worker was asked to hand over its parked tasks now due (3 parked)" in printed, printed
    cluster.wait_for(lambda: cluster.events() != [], 30, "a parked task started")
    first = min(e["at"] for e in cluster.events() if e["event"] == "start")
    assert first - done < 1.0, f"the first parked task started {first - done:.1f} s after"
    assert results[0].get(timeout=30) == 0


def test_a_declared_semaphore_not_used_yet_is_known_to_every_command(redis_url):
    """Issue 17: ``status launch-api`` (declared by the app, limit 5, no task ran yet)
    exited 1 ("has no state in Redis"), plain ``status`` left it out, ``drain``
    refused it."""
    out = run(redis_url, "status")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:4] for line in out.stdout.splitlines()[1:]}
    assert rows == {
        "launch-api": ["5", "0", "0"],
        "mail-api": ["-", "0", "0"],
        "queue:reports": ["2", "0", "0"],
    }
    (row,) = json.loads(run(redis_url, "status", "launch-api", "--json").stdout)
    assert (row["effective_limit"], row["holders"], row["waiters"]) == (5, 0, 0)
    for command in ("holders", "waiters"):
        out = run(redis_url, command, "launch-api", "--json")
        assert (out.returncode, out.stdout) == (0, "[]\n"), out.stderr
    assert run(redis_url, "drain", "launch-api").stdout == (
        "launch-api: draining (admits nobody until `resume`)\n"
    )
    (row,) = json.loads(run(redis_url, "status", "launch-api", "--json").stdout)
    assert (row["effective_limit"], row["draining"]) == (5, True)
    sem = Semaphore(redis_url, "launch-api", 5)
    assert sem.try_acquire("first") is None  # its first task obeys the drain
    out = run(redis_url, "resume", "launch-api")
    assert out.stdout == "launch-api: admitting again\n"
    assert sem.try_acquire("first") is not None
    out = run(redis_url, "reset-limit", "queue:reports")
    assert out.stdout == (
        "queue:reports: no override; not used yet, so its tasks will use the limit they "
        "declare (2 in the app)\n"
    )
    assert_one_line_error(
        run(redis_url, "release", "queue:reports", "ghost", "--yes"), "'ghost' holds no permit"
    )
    sem.close()


def test_every_table_is_as_wide_as_its_content(redis_url, busy):
    """Issue 17: the STATE column of ``waiters`` was 13 wide, "waiting in place" 16,
    so those rows' numbers sat 4 columns right of the others; each column of
    every table is as wide as its widest cell now (so each line of a table whose
    last column is right-aligned ends at the same column)."""
    info = json.dumps({"task": "proj.a_task_name_longer_than_32_chars", "worker": "w1@host"})
    assert isinstance(busy.attempt("in-place", wait_lease=60, info=info, in_place=True), Place)
    parking = Semaphore(redis_url, "partner-api", 2, on_handover=lambda handovers: None)
    parking.park("parked", "payload", info=info)
    parking.close()
    Semaphore(redis_url, "a-semaphore-name-longer-than-28-chars", 1).attempt("x", info=info)
    tables = {
        command: run(redis_url, command, *names).stdout.splitlines()
        for command, names in [
            ("status", ()),
            ("holders", ("partner-api",)),
            ("waiters", ("partner-api",)),
        ]
    }
    assert {line.split()[4] for line in tables["waiters"][1:]} == {"in", "waiting", "parked"}
    for command, lines in tables.items():
        table = [line for line in lines if not line.startswith("PARKED:")]  # a note below it
        assert len({len(line) for line in table}) == 1, (command, lines)


@pytest.fixture
def customers(redis_url: str):
    """Family ``customer`` (as cli_app's per-key task records it): customer-1 with
    one holder, customer-2 with one holder and two waiters, customer-3 idle."""
    members = [Semaphore(redis_url, f"customer-{n}", 1, family="customer") for n in (1, 2, 3)]
    info = json.dumps({"task": "cli_app.sync_customer", "worker": "w1@host"})
    assert isinstance(members[0].attempt("c1-a", info=info), Permit)
    assert isinstance(members[1].attempt("c2-a", info=info), Permit)
    for holder in ("c2-b", "c2-c"):
        assert isinstance(members[1].attempt(holder, wait_lease=60, info=info), Place)
    assert isinstance(members[2].attempt("c3-a"), Permit)
    members[2].release("c3-a")
    yield members
    for member in members:
        member.close()


def test_a_family_name_shows_its_sums_and_busiest_members(redis_url, customers):
    """Issue 17: the metrics name the family ``customer``; the CLI refused that name
    ("did you mean 'customer-2'")."""
    out = run(redis_url, "status", "customer", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert (row["name"], row["members"], row["effective_limit"]) == ("customer", 3, 3)
    assert (row["holders"], row["waiters"], row["utilization"]) == (2, 2, 0.667)
    assert [m["name"] for m in row["busiest"]] == ["customer-2", "customer-1", "customer-3"]
    lines = run(redis_url, "status", "customer").stdout.splitlines()
    assert [line.split()[:5] for line in lines[1:]] == [
        ["customer", "(family", "of", "3)", "3"],
        ["customer-2", "1", "1", "2", "0"],
        ["customer-1", "1", "1", "0", "0"],
        ["customer-3", "1", "0", "0", "0"],
    ]
    assert (row["in_place"], row["countdown"]) == (0, 2)  # summed over the members
    rows = json.loads(run(redis_url, "holders", "customer", "--json").stdout)
    assert [(r["semaphore"], r["holder"]) for r in rows] == [
        ("customer-1", "c1-a"),
        ("customer-2", "c2-a"),
    ]
    lines = run(redis_url, "waiters", "customer").stdout.splitlines()
    assert lines[0].split()[:4] == ["SEMAPHORE", "#", "TASK", "ID"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["customer-2", "1", "c2-b"],
        ["customer-2", "2", "c2-c"],
    ]


@pytest.mark.parametrize(
    "args",
    [
        ("drain", "customer"),
        ("resume", "customer"),
        ("set-limit", "customer", "3"),
        ("set-limit", "customer", "3", "--new"),
        ("reset-limit", "customer"),
        ("release", "customer", "c1-a", "--yes"),
        ("set-rate", "customer", "5/s"),
        ("reset-rate", "customer"),
    ],
)
def test_a_command_that_changes_a_semaphore_refuses_a_family_naming_its_members(
    redis_url, customers, args
):
    out = run(redis_url, *args)
    assert_one_line_error(
        out,
        f"'customer' is a family of 3 semaphores made by a key function (customer-1, "
        f"customer-2, customer-3); `{args[0]}` changes one semaphore, and the family gains "
        "members as new keys come: name a member (`celery -A cli_app semaphore status "
        "customer` shows the busiest)",
    )
    assert [m.status().draining for m in customers] == [False] * 3
    assert [m.status().override for m in customers] == [None] * 3
    assert [m.status().rate_override for m in customers] == [None] * 3
    assert customers[0].status().holder_count == 1


def test_set_rate_is_obeyed_and_reset_rate_restores_the_declared_rate(redis_url):
    """``set-rate`` overrides the rate the tasks declare (100/s here) for every
    client: after it, 1/m with a burst of 2 grants 2 of 3 free permits, and the
    third is refused by the rate alone (throttled)."""
    sem = Semaphore(redis_url, "paced", 10, rate="100/s")
    assert isinstance(sem.attempt("first"), Permit)
    time.sleep(0.05)  # the 100/s schedule is idle again
    out = run(redis_url, "set-rate", "paced", "1/m", "--burst", "2")
    assert out.stdout == "paced: rate 1/m (burst 2) (was 100/s, declared 100/s)\n", out.stderr
    assert [sem.try_acquire(f"t{i}") is not None for i in range(3)] == [True, True, False]
    state = sem.status()
    assert (state.rate, state.rate_override, state.rate_room) == (
        RateLimit(1, 60.0, 2),
        RateLimit(1, 60.0, 2),
        0,
    )
    assert sem.client.hget(sem.keys.meta, "m_throttled") == b"1"
    (row,) = json.loads(run(redis_url, "status", "paced", "--json").stdout)
    assert (row["rate"], row["rate_override"], row["declared_rate"], row["rate_room"]) == (
        "1/m (burst 2)",
        "1/m (burst 2)",
        "100/s",
        0,
    )
    assert 0 < row["next_start_in"] <= 60
    assert row["rate_paused_until"] is None
    header, line = run(redis_url, "status", "paced").stdout.splitlines()
    assert header.split()[-3:] == ["RATE", "NEXT", "START"]
    assert line.split()[-5:-1] == ["1/m", "(burst", "2)(100/s)", "in"]
    assert re.fullmatch(r"\d+\.\ds", line.split()[-1]), line
    parking = Semaphore(redis_url, "paced", 10, on_handover=lambda handovers: None)
    parking.park("parked", "payload")
    parking.close()
    out = run(redis_url, "set-rate", "paced", "2/m")  # faster: wakes the workers
    assert (
        out.stdout
        == f"paced: rate 2/m (was 1/m (burst 2) by override; declared 100/s){NOBODY_WOKEN}\n"
    )
    out = run(redis_url, "reset-rate", "paced")
    assert (
        out.stdout
        == f"paced: back to the declared rate 100/s (was 2/m by override){NOBODY_WOKEN}\n"
    )
    assert (sem.status().rate, sem.status().rate_override) == (RateLimit(100), None)
    out = run(redis_url, "reset-rate", "paced")
    assert out.stdout == "paced: no rate override; rate 100/s as declared\n"
    sem.close()


def test_status_shows_a_rate_alone_and_a_pause_after_rate_limited(redis_url):
    """A semaphore with a rate and no concurrency limit shows LIMIT and UTIL "-"
    (not 1000000 and 0%); a RateLimited pause shows when it ends."""
    emails = Semaphore(redis_url, "emails", rate="100/m")
    assert isinstance(emails.attempt("m1"), Permit)
    paused_at = time.time()
    emails.pause_rate(300)
    plain = Semaphore(redis_url, "plain", 3)
    assert isinstance(plain.attempt("p1"), Permit)
    rows = {row["name"]: row for row in json.loads(run(redis_url, "status", "--json").stdout)}
    row = rows["emails"]
    assert (row["effective_limit"], row["rate"], row["rate_room"]) == (1000000, "100/m", 0)
    assert 240 < row["rate_paused_for"] <= 300  # less the time to start the command
    assert row["rate_paused_until"] == pytest.approx(paused_at + 300, abs=1)
    assert rows["plain"]["rate"] is None and rows["plain"]["rate_paused_until"] is None
    cells = {
        line.split()[0]: line.split() for line in run(redis_url, "status").stdout.splitlines()[1:]
    }
    until = time.strftime("%H:%M:%S", time.localtime(row["rate_paused_until"]))
    assert cells["emails"][1] == "-" and cells["emails"][8] == "-"  # LIMIT, UTIL
    assert cells["emails"][-4:] == ["100/m", "paused", "until", until]
    assert cells["plain"][1:3] == ["3", "1"] and cells["plain"][-2:] == ["-", "-"]
    assert isinstance(emails.attempt("m2"), Place)  # the pause: a waiter
    for command in ("holders", "waiters"):
        last = run(redis_url, command, "emails").stdout.splitlines()[-1]
        assert last == f"emails: rate 100/m, next start paused until {until}", command
    assert "rate" not in run(redis_url, "waiters", "plain").stdout
    out = run(redis_url, "set-limit", "emails", "4")
    assert out.stdout == "emails: limit 4 (was none, declared none)\n"
    emails.close()
    plain.close()


def test_status_shows_what_shadow_limits_would_have_done(redis_url):
    """Shadow limits count and never refuse: status says which limits are shadow
    limits now, how many grants the limit would have refused, the peak held over it,
    and the rate's delays; a semaphore without shadow limits shows no such line."""
    tried = Semaphore(redis_url, "tried", 1, rate="1/m", shadow=["limit", "rate"])
    permits = [tried.attempt(f"t{i}") for i in range(3)]
    assert all(isinstance(p, Permit) for p in permits)
    permits[2].release()  # type: ignore[union-attr]
    quiet = Semaphore(redis_url, "quiet", 5, shadow=["limit"])
    assert isinstance(quiet.attempt("q"), Permit)
    rows = {row["name"]: row for row in json.loads(run(redis_url, "status", "--json").stdout)}
    row = rows["tried"]
    assert (row["holders"], row["shadow_limit_refusals"], row["shadow_peak"]) == (2, 2, 3)
    assert row["shadow_rate_refusals"] == 2
    assert row["shadow_delay"] == pytest.approx(60 + 120, abs=1)
    assert (rows["quiet"]["shadow_limit_refusals"], rows["quiet"]["shadow_peak"]) == (0, 0)
    assert (row["shadow"], rows["quiet"]["shadow"]) == (["limit", "rate"], ["limit"])
    plain = Semaphore(redis_url, "plain", 5)
    assert isinstance(plain.attempt("p"), Permit)
    lines = run(redis_url, "status").stdout.splitlines()
    shadows = {line.split(":")[0]: line for line in lines if ": shadow (" in line}
    assert set(shadows) == {"tried", "quiet"}, lines
    assert re.fullmatch(
        r"tried: shadow \(limit, rate\): the limit would have refused 2 grants \(peak 3 held "
        r"at once\); the rate would have delayed 2 grants by 1(79|80)\.\ds in all",
        shadows["tried"],
    ), lines
    assert shadows["quiet"] == "quiet: shadow (limit): nothing counted yet", lines
    tried.close()
    quiet.close()
    plain.close()


def test_set_rate_before_first_use_of_a_declared_semaphore(redis_url):
    out = run(redis_url, "set-rate", "launch-api", "3/s")
    assert out.stdout == "launch-api: rate 3/s (not used yet): its first tasks obey it\n"
    lines = run(redis_url, "status", "launch-api").stdout.splitlines()
    assert lines[1].split()[1] == "5" and lines[1].split()[-2:] == ["3/s(-)", "now"]
    sem = Semaphore(redis_url, "launch-api", 5)  # its first task declares no rate
    assert [sem.try_acquire(f"t{i}") is not None for i in range(3)] == [True, False, False]
    assert sem.status().rate == RateLimit(3)
    out = run(redis_url, "reset-rate", "launch-api")
    assert out.stdout == "launch-api: no rate declared, so no rate now (was 3/s by override)\n"
    sem.close()


def test_the_rates_the_app_declares_show_and_can_be_overridden_before_first_use(redis_url):
    """cli_app declares mail-api with a rate of 30/m and no limit, and a rate of 10/m
    on the queue reports (capped at 2): status shows them before any task ran."""
    rows = {row["name"]: row for row in json.loads(run(redis_url, "status", "--json").stdout)}
    assert (rows["mail-api"]["rate"], rows["mail-api"]["effective_limit"]) == ("30/m", 1000000)
    assert (rows["queue:reports"]["rate"], rows["queue:reports"]["effective_limit"]) == ("10/m", 2)
    assert rows["launch-api"]["rate"] is None
    out = run(redis_url, "set-rate", "mail-api", "90/m")
    assert out.stdout == (
        "mail-api: rate 90/m (not used yet, declared 30/m in the app): its first tasks obey it\n"
    )
    line = run(redis_url, "status", "mail-api").stdout.splitlines()[1].split()
    assert (line[1], line[-2], line[-1]) == ("-", "90/m(-)", "now")
    out = run(redis_url, "reset-rate", "mail-api")
    assert out.stdout == (
        "mail-api: rate override 90/m dropped; not used yet, so its tasks will use the rate "
        "they declare (30/m in the app)\n"
    )
    sem = Semaphore(redis_url, "mail-api", 5)
    assert sem.client.keys("*") == [b"celery_semaphore:epoch"]  # nothing left behind
    sem.close()


def test_holders_show_a_weighted_holders_permits(redis_url):
    sem = Semaphore(redis_url, "batches", 4)
    try:
        assert isinstance(sem.attempt("batch-1", weight=3), Permit)
        out = run(redis_url, "holders", "batches")
        assert out.returncode == 0, out.stderr
        header, row = out.stdout.splitlines()[:2]
        assert header.split()[:2] == ["HOLDER", "PERMITS"]
        assert row.split()[:2] == ["batch-1", "3"]
        (status,) = json.loads(run(redis_url, "status", "batches", "--json").stdout)
        assert (status["holders"], status["utilization"]) == (3, 0.75), "permits in use"
    finally:
        sem.close()


@pytest.fixture
def fair_line(redis_url: str):
    """'fair-api' (limit 1): one holder; waiting in line, by fair key: bigco 4 (weight
    3), acme 3, and five more keys 2 each, and one without a key; then the first 3 in
    line granted in turn (one of them still holds): each key's first turn comes before
    any key's second, so 7 keys still wait."""
    sem = Semaphore(redis_url, "fair-api", 1, fair_weights={"bigco": 3})
    assert isinstance(sem.attempt("t-0"), Permit)
    waiting = {
        "bigco": 4,
        "acme": 3,
        **dict.fromkeys(["globex", "hooli", "initech", "umbrella", "wayne"], 2),
    }
    for key, count in waiting.items():
        for i in range(count):
            assert isinstance(sem.attempt(f"{key}-{i}", fair_key=key, wait_lease=60), Place)
    assert isinstance(sem.attempt("plain", wait_lease=60), Place)
    holding, served = "t-0", []
    for _ in range(3):
        head = sem.status().waiters[0]
        sem.release(holding)
        assert isinstance(sem.attempt(head.holder, fair_key=head.fair_key), Permit)
        holding = head.holder
        served.append(head.fair_key)
    yield sem, served
    sem.close()


def test_status_shows_a_fair_lines_keys_waiting_and_their_share(redis_url, fair_line, busy):
    sem, served = fair_line
    status = sem.status()
    out = run(redis_url, "status", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    fair = rows["fair-api"]
    assert (fair["fair_keys_waiting"], fair["fair_grants"]) == (status.fair_keys_waiting, 3)
    assert fair["fair_keys"] == [
        {"key": k.key, "waiting": k.waiting, "grants": k.grants, "share": k.share}
        for k in status.fair_keys
    ]
    assert fair["fair_keys_waiting"] == 7
    waiting = {k["key"]: k["waiting"] for k in fair["fair_keys"]}
    for key in ("bigco", "acme", "globex"):
        assert waiting[key] == {"bigco": 4, "acme": 3, "globex": 2}[key] - served.count(key)
    assert [k["waiting"] for k in fair["fair_keys"]] == sorted(waiting.values(), reverse=True)
    assert sum(k["grants"] for k in fair["fair_keys"]) <= 3
    assert (rows["partner-api"]["fair_keys_waiting"], rows["partner-api"]["fair_keys"]) == (0, [])
    text = run(redis_url, "status").stdout
    table, _, below = text.partition("\n\n")
    assert "fair-api" in table and "partner-api" in table and "KEY" not in table
    lines = below.splitlines()
    count = status.fair_keys_waiting
    assert (
        lines[0]
        == f"fair-api: {count} fair keys waiting; 3 fair grants this minute and the one before"
    )
    assert lines[1].split() == ["KEY", "WAITING", "GRANTS", "SHARE"]
    shown = [line.split() for line in lines[2:7]]
    assert shown == [
        [k["key"], str(k["waiting"]), str(k["grants"]), f"{k['share']:.0%}"]
        for k in fair["fair_keys"][:5]
    ]
    assert lines[7:] == ["  ... and 2 more keys (--json lists up to 20)"]
    only_busy = run(redis_url, "status", "partner-api").stdout
    assert "\n\n" not in only_busy.strip() and "fair" not in only_busy


def test_waiters_show_each_fair_key_and_by_key_group_them(redis_url, fair_line, busy):
    sem, _ = fair_line
    line = sem.status().waiters
    rows = json.loads(run(redis_url, "waiters", "fair-api", "--json").stdout)
    assert [(r["holder"], r["fair_key"]) for r in rows] == [(w.holder, w.fair_key) for w in line]
    assert {r["holder"]: r["fair_key"] for r in rows}["plain"] is None
    lines = run(redis_url, "waiters", "fair-api").stdout.splitlines()
    assert lines[0].split() == ["#", "TASK", "ID", "TASK", "WORKER", "STATE", "KEY", "WAITING"]
    assert [row.split()[-2] for row in lines[1:]] == [w.fair_key or "-" for w in line]
    plain = run(redis_url, "waiters", "partner-api").stdout.splitlines()
    assert "KEY" not in plain[0].split(), "a line without fair keys shows no KEY column"

    groups = json.loads(run(redis_url, "waiters", "fair-api", "--by-key", "--json").stdout)
    expected: dict[str | None, dict] = {}
    for w in line:
        group = expected.setdefault(w.fair_key, {"waiting": 0, "first_position": w.position})
        group["waiting"] += 1
    assert [(g["fair_key"], g["waiting"], g["first_position"]) for g in groups] == [
        (key, g["waiting"], g["first_position"]) for key, g in expected.items()
    ]
    assert all(g["semaphore"] == "fair-api" and g["longest_waiting"] >= 0 for g in groups)
    table = run(redis_url, "waiters", "fair-api", "--by-key").stdout.splitlines()
    assert table[0].split() == ["KEY", "WAITING", "FIRST", "LONGEST"]
    assert [row.split()[:3] for row in table[1:]] == [
        [key or "-", str(g["waiting"]), str(g["first_position"])] for key, g in expected.items()
    ]
    assert len({len(row) for row in table}) == 1, table


def test_status_and_holders_show_kept_permits_apart(redis_url):
    sem = Semaphore(redis_url, "kept-apart", 4)
    try:
        permit = sem.attempt("task-1")
        assert isinstance(permit, Permit)
        assert isinstance(sem.attempt("task-2"), Permit)
        info = json.dumps({"kept_by": "w1@host", "pid": 4242})
        kept = permit.keep("kept|w1@host|4242|1|kept-apart", info)
        assert isinstance(kept, Permit)
        (status,) = json.loads(run(redis_url, "status", "kept-apart", "--json").stdout)
        assert (status["holders"], status["kept"], status["utilization"]) == (2, 1, 0.5)
        out = run(redis_url, "status", "kept-apart")
        assert "2 (1 kept)" in out.stdout, out.stdout
        out = run(redis_url, "holders", "kept-apart")
        row = next(line for line in out.stdout.splitlines() if line.startswith("kept|"))
        assert row.split()[2:4] == ["kept", "w1@host"], row
    finally:
        sem.close()
