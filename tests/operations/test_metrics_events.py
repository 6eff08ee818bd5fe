"""Prometheus metrics scraped from the real endpoint, and the Celery events of permits."""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from celery_semaphore import Semaphore
from celery_semaphore.metrics import serve
from devkit.redis_servers import free_port

pytestmark = pytest.mark.slow


def scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


@pytest.fixture(params=["redis", "postgres"])
def store_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis server's URL, or a new database's in the session's PostgreSQL cluster."""
    if request.param == "redis":
        yield request.getfixturevalue("redis_server").url
        return
    server = request.getfixturevalue("postgres_session_server")
    name = f"cs_{uuid.uuid4().hex[:12]}"
    server.create_database(name)
    yield server.url_for(name)
    server.drop_database(name)


def test_metrics_endpoint_shows_cluster_wide_state_and_counters(store_url: str) -> None:
    """The same counters and histograms on either store (each counts as the reference
    model does: the conformance suite compares them step by step)."""
    sem = Semaphore(store_url, "api", 2, lease_timeout=0.3)
    a = sem.try_acquire("a")
    sem.try_acquire("b")
    assert sem.try_acquire("c") is None  # refused, in line
    time.sleep(0.05)
    a.release()
    sem.renew_many(["b", "ghost", a])  # the released permit counts lost; a bare id, not
    port = free_port()
    server = serve(store_url, "celery_semaphore", port, addr="127.0.0.1")
    try:
        m = scrape(port)
        assert m['celery_semaphore_holders{semaphore="api"}'] == 1
        assert m['celery_semaphore_limit{semaphore="api"}'] == 2
        assert m['celery_semaphore_waiters{semaphore="api"}'] == 1
        assert m['celery_semaphore_acquire_attempts_total{outcome="granted",semaphore="api"}'] == 2
        assert m['celery_semaphore_acquire_attempts_total{outcome="refused",semaphore="api"}'] == 1
        assert m['celery_semaphore_lease_renewals_total{semaphore="api"}'] == 1
        assert m['celery_semaphore_permits_lost_total{semaphore="api"}'] == 1
        assert m['celery_semaphore_hold_seconds_count{semaphore="api"}'] == 1
        assert 0.04 <= m['celery_semaphore_hold_seconds_sum{semaphore="api"}'] < 5
        assert m['celery_semaphore_hold_seconds_bucket{le="0.025",semaphore="api"}'] == 0
        assert m['celery_semaphore_hold_seconds_bucket{le="+Inf",semaphore="api"}'] == 1
        time.sleep(0.4)  # b's lease runs out; c, still in line, is granted by its next ask
        assert sem.try_acquire("c") is not None
        m = scrape(port)
        assert m['celery_semaphore_leases_expired_total{semaphore="api"}'] == 1
        assert m['celery_semaphore_wait_seconds_count{semaphore="api"}'] == 3
        assert m['celery_semaphore_wait_seconds_sum{semaphore="api"}'] >= 0.4
        sem.set_limit(5)
        assert scrape(port)['celery_semaphore_limit{semaphore="api"}'] == 5
    finally:
        server.close()
        sem.close()


def test_worker_flag_serves_metrics_and_workers_send_permit_events(celery_cluster):
    port = free_port()
    cluster = celery_cluster(limit=1)
    cluster.worker("w1", concurrency=2, extra=["-E", f"--semaphore-metrics-port={port}"])
    app = cluster.app_module.app
    seen: list[dict] = []
    ready = threading.Event()
    receivers = []

    def listen() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": seen.append})
            receivers.append(receiver)
            ready.set()
            receiver.capture(limit=None, timeout=None, wakeup=True)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(10)
    try:
        check_events_and_metrics(cluster, seen, port)
    finally:
        receivers[0].should_stop = True
        listener.join(10)
    assert not listener.is_alive()


def check_events_and_metrics(cluster, seen: list[dict], port: int) -> None:
    time.sleep(0.5)
    results = [cluster.app_module.hold.delay(0.4, i) for i in range(3)]
    assert [r.get(timeout=60) for r in results] == [0, 1, 2]

    def events_of(kind: str) -> list[dict]:
        return [e for e in seen if e.get("type") == kind]

    cluster.wait_for(
        lambda: len(events_of("semaphore-granted")) == 3,
        10,
        f"3 grant events in {[e.get('type') for e in seen]}",
    )
    assert {e["uuid"] for e in events_of("semaphore-granted")} == {r.id for r in results}
    assert all(e["semaphore"] == "hold" for e in events_of("semaphore-granted"))
    assert events_of("semaphore-waiting") or any(
        e["waited"] > 0.3 for e in events_of("semaphore-granted")
    )
    task_states = [e for e in seen if e.get("type", "").startswith("task-")]
    assert {e["type"] for e in task_states} >= {"task-received", "task-started", "task-succeeded"}
    per_customer = cluster.app_module.per_customer
    done = [per_customer.delay(c, 0.05, c) for c in ("A", "B")]
    assert [r.get(timeout=60) for r in done] == ["A", "B"]
    m = scrape(port)
    assert m['celery_semaphore_acquire_attempts_total{outcome="granted",semaphore="hold"}'] == 3
    assert m['celery_semaphore_holders{semaphore="hold"}'] == 0
    # a key function's semaphores (customer-A, customer-B): one series, its task's name
    family = 'semaphore="limited_app.per_customer"'
    assert m[f"celery_semaphore_members{{{family}}}"] == 2
    assert m[f'celery_semaphore_acquire_attempts_total{{outcome="granted",{family}}}'] == 2
    assert not any("customer-" in sample for sample in m)


def test_a_backlog_published_before_any_task_started_is_visible(redis_server):
    """Issue: places taken at publish wrote the meta hash without a limit, and the
    metrics (HTTP 500) and ``status`` failed on the semaphore until a task started.
    Now the place records the declared limit; a semaphore with state but no limit
    (set up by an operator before first use, say) is left out, not an error."""
    client = redis_server.client()
    publisher = Semaphore(client, "backlog", 3)
    for i in range(5):
        publisher.take_place(f"t{i}", wait_lease=30)
    client.hset("celery_semaphore:{limitless}:meta", "draining", "1")
    port = free_port()
    server = serve(client, "celery_semaphore", port, addr="127.0.0.1")
    try:
        m = scrape(port)
        assert m['celery_semaphore_waiters{semaphore="backlog"}'] == 5
        assert m['celery_semaphore_sent{semaphore="backlog"}'] == 5
        assert m['celery_semaphore_limit{semaphore="backlog"}'] == 3
        assert not any("limitless" in sample for sample in m)
    finally:
        server.close()
        client.close()


def test_a_key_functions_semaphores_are_one_series_unless_per_key(redis_server):
    """A semaphore per customer must not make a series per customer: the members
    of a family are summed under its name; their counts stay when they expire."""
    client = redis_server.client()
    members = [Semaphore(client, f"customer-{i}", 1, family="customer") for i in range(3)]
    for i, sem in enumerate(members):
        sem.try_acquire(f"t{i}")
    assert members[0].try_acquire("late") is None  # refused, in line
    Semaphore(client, "api", 4).try_acquire("a")
    port, port_per_key = free_port(), free_port()
    server = serve(client, "celery_semaphore", port, addr="127.0.0.1")
    per_key = serve(client, "celery_semaphore", port_per_key, addr="127.0.0.1", per_key=True)
    try:
        m = scrape(port)
        assert not any("customer-" in sample for sample in m)
        assert m['celery_semaphore_holders{semaphore="customer"}'] == 3
        assert m['celery_semaphore_limit{semaphore="customer"}'] == 3
        assert m['celery_semaphore_waiters{semaphore="customer"}'] == 1
        assert m['celery_semaphore_members{semaphore="customer"}'] == 3
        assert m['celery_semaphore_members{semaphore="api"}'] == 1
        granted = 'celery_semaphore_acquire_attempts_total{outcome="granted",semaphore="customer"}'
        assert m[granted] == 3
        detail = scrape(port_per_key)
        assert detail['celery_semaphore_holders{semaphore="customer-1"}'] == 1
        assert 'celery_semaphore_holders{semaphore="customer"}' not in detail

        members[2].release("t2")
        scrape(port)  # keys expire only after idle time: scrapes have seen the last counts
        client.delete(*members[2].keys.script_keys)  # as its keys expire while idle
        m = scrape(port)
        assert m['celery_semaphore_members{semaphore="customer"}'] == 2
        assert m[granted] == 3  # still counted: a counter must not go back
        assert m['celery_semaphore_hold_seconds_count{semaphore="customer"}'] == 1

        members[1].release("t1")
        assert scrape(port)['celery_semaphore_hold_seconds_count{semaphore="customer"}'] == 2
        client.delete(*members[1].keys.script_keys)  # expires, and is used again
        members[1].try_acquire("again")  # before the next scrape: its counts restart
        m = scrape(port)
        assert m[granted] == 4
        assert m['celery_semaphore_hold_seconds_count{semaphore="customer"}'] == 2
        assert m['celery_semaphore_members{semaphore="customer"}'] == 2
        client.delete(*Semaphore(client, "api", 4).keys.script_keys)
        assert not any('"api"' in sample for sample in scrape(port)), "no family: it goes"
    finally:
        server.close()
        per_key.close()
        client.close()


def test_a_data_loss_shows_in_the_metrics_when_noticed_how_long_paused_and_restored(
    redis_server,
):
    client = redis_server.client()
    sem = Semaphore(client, "api", 2, pause_after_loss=0.8)
    permits = [sem.try_acquire(h) for h in ("a", "b")]
    port = free_port()
    server = serve(client, "celery_semaphore", port, addr="127.0.0.1")
    try:
        before = scrape(port)
        assert before["celery_semaphore_data_lost_timestamp_seconds"] == 0
        redis_server.restart()
        noticed = time.time()
        assert sem.try_acquire("c") is None  # noticed: paused
        assert sem.renew_many(permits) == set()  # both written back
        after = scrape(port)
    finally:
        server.close()
        sem.close()
    assert abs(after["celery_semaphore_data_lost_timestamp_seconds"] - noticed) < 1.0
    assert after["celery_semaphore_data_loss_pause_seconds"] == pytest.approx(0.8, abs=0.01)
    assert after["celery_semaphore_data_loss_permits_restored"] == 2
    assert after['celery_semaphore_holders{semaphore="api"}'] == 2


def test_rate_metrics_count_the_throttled_refusals_and_show_the_rate_and_its_pause(redis_server):
    """``throttled_total`` counts the refusals of the rate alone (a permit was free),
    not those of a full semaphore; the rate is a gauge only where there is one."""
    client = redis_server.client()
    paced = Semaphore(client, "paced", 10, rate="2/m")  # one start per 30 s
    assert paced.try_acquire("first") is not None
    for i in range(3):
        assert paced.try_acquire(f"throttled-{i}") is None  # 9 permits free: the rate says no
    full = Semaphore(client, "full", 1, rate="100/s")
    assert full.try_acquire("x") is not None
    time.sleep(0.05)  # the rate would allow one more: the limit refuses it
    assert full.try_acquire("y") is None
    plain = Semaphore(client, "plain", 2)
    assert plain.try_acquire("p") is not None
    members = [Semaphore(client, f"account-{i}", rate="10/m", family="account") for i in (1, 2)]
    for member in members:
        assert member.try_acquire("a") is not None
    members[1].pause_rate(60)
    paced.pause_rate(120)
    port = free_port()
    server = serve(client, "celery_semaphore", port, addr="127.0.0.1")
    try:
        m = scrape(port)
        assert m['celery_semaphore_throttled_total{semaphore="paced"}'] == 3
        assert m['celery_semaphore_throttled_total{semaphore="full"}'] == 0
        assert m['celery_semaphore_throttled_total{semaphore="plain"}'] == 0
        starts = 'celery_semaphore_acquire_attempts_total{outcome="granted",semaphore="paced"}'
        assert m[starts] == 1
        assert m['celery_semaphore_rate_per_second{semaphore="paced"}'] == pytest.approx(2 / 60)
        assert m['celery_semaphore_rate_per_second{semaphore="full"}'] == 100
        assert 'celery_semaphore_rate_per_second{semaphore="plain"}' not in m
        assert m['celery_semaphore_rate_per_second{semaphore="account"}'] == pytest.approx(20 / 60)
        assert 119 < m['celery_semaphore_rate_paused_seconds{semaphore="paced"}'] <= 120
        assert 59 < m['celery_semaphore_rate_paused_seconds{semaphore="account"}'] <= 60
        assert m['celery_semaphore_rate_paused_seconds{semaphore="full"}'] == 0
        assert m['celery_semaphore_rate_paused_seconds{semaphore="plain"}'] == 0
        paced.set_rate("6/s")  # an override is the effective rate
        assert scrape(port)['celery_semaphore_rate_per_second{semaphore="paced"}'] == 6
    finally:
        server.close()
        client.close()


def test_shadow_metrics_count_what_a_shadow_limit_would_have_refused(redis_server):
    client = redis_server.client()
    tried = Semaphore(client, "tried", 1, rate="1/m", shadow=["limit", "rate"])
    permits = [tried.attempt(f"t{i}") for i in range(4)]  # all granted: nothing is enforced
    assert all(p.shadow_refused == {"limit", "rate"} for p in permits[1:])  # type: ignore[union-attr]
    enforced = Semaphore(client, "enforced", 1)
    assert enforced.try_acquire("e") is not None
    assert enforced.try_acquire("f") is None
    for name, held in (("acct-a", 3), ("acct-b", 2)):
        member = Semaphore(client, name, 1, family="acct", shadow=["limit"])
        assert all(member.try_acquire(f"{name}-{i}") for i in range(held))
    port = free_port()
    server = serve(client, "celery_semaphore", port, addr="127.0.0.1")
    try:
        m = scrape(port)
        assert m['celery_semaphore_shadow_limit_refusals_total{semaphore="tried"}'] == 3
        assert m['celery_semaphore_shadow_rate_refusals_total{semaphore="tried"}'] == 3
        delay = m['celery_semaphore_shadow_rate_delay_seconds_total{semaphore="tried"}']
        assert delay == pytest.approx(60 + 120 + 180, abs=1), "1/m: 1, 2 and 3 minutes late"
        assert m['celery_semaphore_holders{semaphore="tried"}'] == 4
        assert m['celery_semaphore_shadow_limit_peak{semaphore="tried"}'] == 4
        for permit in permits[1:]:
            permit.release()  # type: ignore[union-attr]
        m = scrape(port)
        assert m['celery_semaphore_holders{semaphore="tried"}'] == 1
        assert m['celery_semaphore_shadow_limit_peak{semaphore="tried"}'] == 4, "a high-water mark"
        assert m['celery_semaphore_shadow_limit_refusals_total{semaphore="enforced"}'] == 0
        assert m['celery_semaphore_shadow_limit_peak{semaphore="enforced"}'] == 0
        assert m['celery_semaphore_shadow_limit_peak{semaphore="acct"}'] == 3, (
            "the highest member's"
        )
    finally:
        server.close()
        client.close()


def test_fair_lines_show_keys_waiting_and_grants_by_weight_class_not_per_key(redis_server):
    """A fair line: a gauge of its keys waiting and a counter of its grants by the
    keys' fair weight class, per semaphore (a family summed), no series per key."""
    client = redis_server.client()
    weights = {"small": 1, "pair": 2, "big": 5, "huge": 40}
    sem = Semaphore(client, "fair", 1, fair_weights=weights)
    members = [
        Semaphore(client, f"tenant-{i}", 1, family="tenant", fair_weights=weights) for i in range(2)
    ]
    Semaphore(client, "plain", 1).try_acquire("p")
    granted = {"small": 0, "pair": 0, "big": 0, "huge": 0}
    for line in (sem, *members):
        assert line.try_acquire("holder") is not None
        for key in weights:
            for i in range(2):
                assert line.attempt(f"{key}-{i}", fair_key=key, wait_lease=60).ticket
        holding = "holder"
        for _ in range(3):  # the first three in line, in turn
            head = line.status().waiters[0]
            line.release(holding)
            assert line.try_acquire(head.holder, fair_key=head.fair_key) is not None
            granted[head.fair_key] += line is sem
            holding = head.holder
    port = free_port()
    server = serve(client, "celery_semaphore", port, addr="127.0.0.1")
    try:
        m = scrape(port)
        assert m['celery_semaphore_fair_keys_waiting{semaphore="fair"}'] == 4
        assert m['celery_semaphore_fair_keys_waiting{semaphore="tenant"}'] == 8
        assert m['celery_semaphore_fair_keys_waiting{semaphore="plain"}'] == 0
        by_class = {
            weight_class: m[
                f'celery_semaphore_fair_grants_total{{semaphore="fair",weight_class="{weight_class}"}}'
            ]
            for weight_class in ("1", "2-3", "4-7", "8-15", "16+")
        }
        assert by_class == {
            "1": granted["small"],
            "2-3": granted["pair"],
            "4-7": granted["big"],
            "8-15": 0,
            "16+": granted["huge"],
        }
        family = [
            value
            for sample, value in m.items()
            if sample.startswith('celery_semaphore_fair_grants_total{semaphore="tenant"')
        ]
        assert (len(family), sum(family)) == (5, 6)
        assert not any("fair_grants" in sample and '"plain"' in sample for sample in m)
        assert not any(key in sample for sample in m for key in weights), "no series per key"
    finally:
        server.close()
        client.close()
