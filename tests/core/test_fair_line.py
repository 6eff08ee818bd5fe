"""The fair line's edges: on a Redis Cluster (the accounts' records live in the
semaphore's meta hash, in its one slot), after its turns ran days ahead of the server
clock, and what "urgent" means when the usual priority is below the default."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from outcomes import granted, refused

from devkit.redis_servers import RedisClusterServers

MakeSemaphore = Any


def test_accounts_take_turns_and_priority_goes_first_on_redis_cluster(
    make_semaphore: MakeSemaphore, redis_cluster: RedisClusterServers
) -> None:
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    for name in (f"fair-{uuid.uuid4().hex[:6]}" for _ in range(3)):  # slots on several masters
        sem = make_semaphore(1, name=name, url=url)
        head = granted(sem.attempt("head"))
        for i in range(4):
            refused(sem.attempt(f"a{i}", fair_key="A"))
        for i in range(2):
            refused(sem.attempt(f"b{i}", fair_key="B"))
        refused(sem.attempt("urgent", priority=5))  # no account: ahead of every ticket
        order = []
        permit = head
        for _ in range(7):
            permit.release()
            status = sem.status()
            nxt = status.waiters[0].holder
            key = "A" if nxt.startswith("a") else "B" if nxt.startswith("b") else None
            permit = granted(sem.attempt(nxt, fair_key=key))
            order.append(nxt)
        permit.release()
        assert order[0] == "urgent"
        # turns between A and B (A joined the rotation first), in order within each
        assert order[1:] == ["a0", "b0", "a1", "b1", "a2", "a3"], order
        assert sem.status().waiter_count == 0


def test_a_fair_line_whose_turns_ran_days_ahead_of_the_clock_still_takes_turns(
    make_semaphore: MakeSemaphore,
) -> None:
    """Under a steady backlog the fair tickets (about 1 s of turn each) run ahead of the
    server clock; a new key must still start at the line's head, not at "now" (which
    would put it ahead of every waiting ticket). Simulated: the line moved 8 days on."""
    import redis

    sem = make_semaphore(1)
    head = granted(sem.attempt("head"))
    for i in range(3):
        refused(sem.attempt(f"a{i}", fair_key="A"))
    client = redis.Redis.from_url(sem.url)
    ahead = 8 * 86400 * 1_000_000  # past half a priority step (2^39 us, 6.4 days)
    keys = sem.keys
    for member, score in client.zrange(keys.waiters, 0, -1, withscores=True):
        client.zadd(keys.waiters, {member: int(score) + ahead})
    fields = dict.fromkeys(("f|A",), None)
    record = client.hget(keys.meta, "f|A").decode().split("|")
    record[0] = str(int(record[0]) + ahead)
    fields["f|A"] = "|".join(record)
    clock = int(client.hget(keys.meta, "fair_clock")) + ahead
    client.hset(keys.meta, mapping={**fields, "fair_clock": clock})
    refused(sem.attempt("b0", fair_key="B"))
    order = [m.decode() for m in client.zrange(keys.waiters, 0, -1)]
    assert order == ["a0", "b0", "a1", "a2"], "B joins at the head's turn, not before all"
    head.release()


def test_on_a_fair_line_urgent_means_more_than_the_least_urgent_seen(
    make_semaphore: MakeSemaphore,
) -> None:
    """Redis brokers: the usual tasks at priority 5 (-5 here), an urgent one at 0 takes
    its key's next turn, though 0 is no more than the default."""
    sem = make_semaphore(1)
    head = granted(sem.attempt("head"))
    for i in range(4):
        refused(sem.attempt(f"a{i}", fair_key="A", priority=-5))
    refused(sem.attempt("b0", fair_key="B", priority=-5))
    refused(sem.attempt("a-urgent", fair_key="A", priority=0))
    order = [w.holder for w in sem.status().waiters]
    assert order.index("a-urgent") <= 2, f"A's next turn, not behind A's backlog: {order}"
    assert order.index("a-urgent") > order.index("a0")
    head.release()


def test_a_set_with_one_fair_line_takes_turns_with_one_ticket_in_every_line(
    make_semaphore: MakeSemaphore,
) -> None:
    from async_as_sync import BlockingSemaphore, BlockingSemaphoreSet

    from celery_semaphore import Places, SemaphoreSet

    fair, plain = make_semaphore(1), make_semaphore(1)
    if isinstance(fair, BlockingSemaphore):
        both = BlockingSemaphoreSet(fair._loop, (fair, plain))
    else:
        both = SemaphoreSet([fair, plain])
    head = granted(fair.attempt("head"))
    tickets = {}
    for name, key in [("a0", "A"), ("a1", "A"), ("a2", "A"), ("b0", "B"), ("b1", "B")]:
        places = both.attempt(name, fair_keys=[key, None])
        assert isinstance(places, Places) and places.refused_by == (0,)
        tickets[name] = places.ticket
    in_fair = {w.holder: w.ticket for w in fair.status().waiters}
    assert in_fair == tickets, "its one ticket stands in the fair line"
    order = sorted(tickets, key=tickets.__getitem__)
    assert order == ["a0", "b0", "a1", "b1", "a2"], "turns between A and B"
    head.release()
    for name in order:
        permits = granted(both.attempt(name, tickets[name], fair_keys=["A", None]))
        permits.release()
    with pytest.raises(ValueError, match="at most one of them a key"):
        both.attempt("c", fair_keys=["A", "B"])
