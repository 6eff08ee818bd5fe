"""Fair share between keys and priority in the line (sync and asyncio alike), on a real Redis.

Contenders that pass ``fair_key=`` share the line in turns between the keys that have
waiters (start-time fair queuing: a key of weight 3 takes three turns to one), FIFO
within a key; ``priority=`` puts a new place ahead of the less urgent ones (within its
key's turns when it has a key). Each test lets the line be served by releasing the one
permit and granting the head of the line, and asserts the order of those grants: within
one round of turns the keys come in no particular order, so a round is compared as a set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
from async_as_sync import BlockingSemaphore, BlockingSemaphoreSet
from outcomes import granted, refused

from celery_semaphore import Handover, Place, Places, RateLimit, SemaphoreSet

MakeSemaphore = Callable[..., Any]
LONG = 120.0  # a waiter lease that outlasts the test


def line(sem: Any) -> list[str]:
    return [w.holder for w in sem.status().waiters]


def serve(
    sem: Any,
    gate: Any,
    *,
    weights: dict[str, int] | None = None,
    count: int | None = None,
) -> list[str]:
    """Grants the line in order: releases the permit ``gate`` (the one held before), asks
    for the head of the line, which must be granted (no one else is), and so on; the
    holders granted. The line must not change meanwhile (the order is read once)."""
    order = line(sem)[:count]
    held = gate
    for holder in order:
        held.release()
        held = granted(sem.attempt(holder, weight=(weights or {}).get(holder, 1)))
    held.release()
    return order


def queue(sem: Any, holders: Iterable[str], **kwargs: Any) -> None:
    for holder in holders:
        refused(sem.attempt(holder, wait_lease=LONG, **kwargs))


def names(prefix: str, count: int, start: int = 0) -> list[str]:
    return [f"{prefix}{i}" for i in range(start, start + count)]


def rounds_of(order: Sequence[str], size: int) -> list[set[str]]:
    return [set(order[i : i + size]) for i in range(0, len(order), size)]


def meta_records(sem: Any) -> dict[str, str]:
    raw = sem.client.hgetall(sem.keys.meta)
    return {k.decode(): v.decode() for k, v in raw.items()}


def fair_records(sem: Any) -> dict[str, str]:
    return {k: v for k, v in meta_records(sem).items() if k.startswith(("f|", "w|"))}


# Keys in turns -----------------------------------------------------------------------


def test_keys_take_turns_while_both_wait_fifo_within_each_key(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    gate = granted(sem.attempt("gate"))
    a, b = names("a", 20), names("b", 5)
    queue(sem, a, fair_key="A")
    queue(sem, b, fair_key="B")
    order = serve(sem, gate)
    assert order != a + b, "not served in the order of asking"
    assert rounds_of(order[:10], 2) == [{a[i], b[i]} for i in range(5)], "A, B, A, B, ..."
    assert order[10:] == a[5:], "then A alone"
    assert [h for h in order if h in a] == a and [h for h in order if h in b] == b


def test_a_key_alone_takes_every_turn(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(3)
    permits = [granted(sem.attempt(h, fair_key="A")) for h in names("now", 3)]
    assert sem.status().holder_count == 3, "free permits go to the key at once"
    a = names("a", 8)
    queue(sem, a, fair_key="A")
    # Its tail is 8 turns ahead of the line's head; a permit freed still goes to it.
    for permit in permits[1:]:
        permit.release()
    assert sem.status().holder_count == 1
    granted(sem.attempt(a[0], fair_key="A"))
    granted(sem.attempt(a[1], fair_key="A"))
    refused(sem.attempt(a[3], fair_key="A"))  # FIFO within the key
    assert line(sem) == a[2:]


@pytest.mark.parametrize(
    "fair_weights",
    [{"A": 3}, lambda key: 3 if key == "A" else 1],
    ids=["mapping", "function"],
)
def test_a_key_of_weight_3_takes_3_turns_to_1(
    make_semaphore: MakeSemaphore, fair_weights: Any
) -> None:
    sem = make_semaphore(1, fair_weights=fair_weights)
    gate = granted(sem.attempt("gate"))
    a, b = names("a", 400), names("b", 200)
    queue(sem, a, fair_key="A")
    queue(sem, b, fair_key="B")
    order = serve(sem, gate, count=400)  # both keys still wait after these
    from_a = sum(h.startswith("a") for h in order)
    from_b = len(order) - from_a
    assert from_b > 0, "not plain FIFO (all of A first)"
    assert 3 * 0.95 <= from_a / from_b <= 3 * 1.05, (from_a, from_b)
    assert [h for h in order if h in a] == a[:from_a], "FIFO within A"
    assert [h for h in order if h in b] == b[:from_b], "FIFO within B"


# Leaving the rotation ----------------------------------------------------------------


def test_a_key_whose_waiters_were_released_by_id_leaves_the_rotation(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    gate = granted(sem.attempt("gate"))
    a, b = names("a", 10), names("b", 10)
    queue(sem, a, fair_key="A")
    queue(sem, b, fair_key="B")
    for holder in a:
        assert sem.release(holder) is False  # it held no permit: only its place went
    assert "f|A" not in fair_records(sem)
    queue(sem, ["a-new"], fair_key="A")
    order = serve(sem, gate)
    assert "a-new" in order[:2], f"served in the first round, not behind A's old tail: {order}"
    assert order[-1] != "a-new", "plain FIFO would have put it last"


def test_a_key_whose_waiter_leases_lapsed_leaves_the_rotation(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    gate = granted(sem.attempt("gate"))
    a, b = names("a", 10), names("b", 10)
    for holder in a:
        refused(sem.attempt(holder, wait_lease=0.2, fair_key="A"))
    queue(sem, b, fair_key="B")
    time.sleep(0.3)
    queue(sem, ["a-new"], fair_key="A")  # this call reclaims A's lapsed places first
    assert set(line(sem)) == {*b, "a-new"}
    assert "f|A" in fair_records(sem), "A has a waiter again"
    order = serve(sem, gate)
    assert "a-new" in order[:2], f"served in the first round, not behind A's old tail: {order}"


# Priority ----------------------------------------------------------------------------


def test_an_urgent_waiter_goes_ahead_in_order_among_equals_and_a_low_one_behind(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    gate = granted(sem.attempt("gate"))
    plain = names("n", 50)
    queue(sem, plain)
    queue(sem, ["low"], priority=-1)
    queue(sem, ["urgent-1"], priority=5)
    queue(sem, ["urgent-2"], priority=5)
    queue(sem, ["most-urgent"], priority=9)
    queue(sem, ["late"])
    place = refused(sem.attempt("urgent-1", wait_lease=LONG))
    assert place.position == 2, "only the more urgent one is ahead"
    order = serve(sem, gate)
    assert order == ["most-urgent", "urgent-1", "urgent-2", *plain, "late", "low"]


def test_a_ticket_presented_again_keeps_its_place_whatever_its_priority(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    gate = granted(sem.attempt("gate"))
    queue(sem, ["first", "second"])
    refused(sem.attempt("second", wait_lease=LONG, priority=9))
    refused(sem.attempt("first", wait_lease=LONG, priority=-9))
    assert serve(sem, gate) == ["first", "second"]


def test_an_urgent_waiter_of_a_key_takes_its_keys_next_turn_and_pays_it_back(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    gate = granted(sem.attempt("gate"))
    a, b = names("a", 10), names("b", 15)
    queue(sem, a, fair_key="A")
    queue(sem, b, fair_key="B")
    urgent = names("u", 3)
    queue(sem, urgent, fair_key="A", priority=7)
    queue(sem, ["a-late"], fair_key="A")  # A's tail moved on three turns for them
    order = serve(sem, gate)
    at = {holder: i for i, holder in enumerate(order)}
    assert order[0] in {"u0", "a0", "b0"}, "the first urgent one is in the first round"
    for k, holder in enumerate(urgent):
        assert k == 0 or at[holder] > at[b[k - 1]], f"{holder}: not ahead of B's turn {k - 1}"
        assert at[holder] < at[b[k + 1]], f"{holder}: A's turn {k} (before B's turn {k + 1})"
    assert [h for h in order if h in urgent] == urgent
    assert [h for h in order if h in a] == a, "A's others keep their places, FIFO"
    assert at["a-late"] > at[b[12]], "A's turn 13: the urgent ones' turns paid back"
    assert at["a-late"] < at[b[14]]


def test_a_key_that_joins_behind_an_urgent_waiter_without_a_key_still_takes_turns(
    make_semaphore: MakeSemaphore,
) -> None:
    """The urgent ticket is far ahead of the others' (a priority level is 2^40 µs): a key
    that joins behind it must start at the line's head among the others, not at it."""
    sem = make_semaphore(1)
    gate = granted(sem.attempt("gate"))
    a, b = names("a", 5), names("b", 5)
    queue(sem, a, fair_key="A")
    queue(sem, ["urgent"], priority=1)
    queue(sem, b, fair_key="B")
    queue(sem, ["b-late"], fair_key="B")
    order = serve(sem, gate)
    assert order[0] == "urgent"
    assert rounds_of(order[1:11], 2) == [{a[i], b[i]} for i in range(5)], "not all of B first"
    assert order[11] == "b-late"


def test_a_new_contender_is_weighed_where_its_new_ticket_goes(
    make_semaphore: MakeSemaphore,
) -> None:
    """Places taken at publish hold the line while a permit is free (their tasks are
    still in the broker): a plain newcomer waits behind them, an urgent one does not."""
    sem = make_semaphore(1)
    for holder in names("p", 3):
        sem.take_place(holder, wait_lease=LONG)
    assert refused(sem.attempt("plain", queue=False)).position == 4
    urgent = granted(sem.attempt("urgent", priority=1))
    for holder in names("a", 3):
        sem.take_place(holder, wait_lease=LONG, fair_key="A")
    place = refused(sem.attempt("b0", wait_lease=LONG, fair_key="B"))
    assert place.position <= 5, "B's first turn: in the first round, with A's"
    assert line(sem).index("b0") == place.position - 1
    assert refused(sem.attempt("urgent-2", wait_lease=LONG, priority=1)).position == 1
    urgent.release()


def test_a_set_orders_its_line_by_priority(make_semaphore: MakeSemaphore) -> None:
    first, second = make_semaphore(1), make_semaphore(1)
    if isinstance(first, BlockingSemaphore):
        sems: Any = BlockingSemaphoreSet(first._loop, [first, second])
    else:
        sems = SemaphoreSet([first, second])
    gate = granted(sems.attempt("gate"))
    for holder in ["p0", "p1", "p2"]:
        assert isinstance(sems.attempt(holder, wait_lease=LONG), Places)
    assert isinstance(sems.attempt("urgent", wait_lease=LONG, priority=3), Places)
    assert isinstance(sems.attempt("low", wait_lease=LONG, priority=-3), Places)
    assert line(first) == line(second) == ["urgent", "p0", "p1", "p2", "low"]
    held = gate
    for holder in line(first):
        held.release()
        held = sems.attempt(holder)
        assert held.holder == holder, f"{holder} granted on both"
    held.release()


# Placing a new ticket: at publish, parked, under a rate, with weights -----------------


def test_places_taken_at_publish_share_the_line_in_turns_and_by_priority(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    gate = granted(sem.attempt("gate"))
    a, b = names("a", 6), names("b", 3)
    for holder in a:
        sem.take_place(holder, wait_lease=LONG, fair_key="A")
    for holder in b:
        sem.take_place(holder, wait_lease=LONG, fair_key="B")
    place = sem.take_place("urgent", wait_lease=LONG, priority=2)
    assert place.position == 1, "the place it took, not the end of the line"
    order = serve(sem, gate)
    assert order[0] == "urgent"
    assert rounds_of(order[1:7], 2) == [{a[i], b[i]} for i in range(3)]
    assert order[7:] == a[3:]


def test_parked_waiters_share_the_line_in_turns_and_by_priority(
    make_semaphore: MakeSemaphore,
) -> None:
    handed: list[Handover] = []
    sem = make_semaphore(1, on_handover=handed.extend)
    gate = granted(sem.attempt("gate"))
    a, b = names("a", 6), names("b", 3)
    for holder in a:
        sem.park(holder, f"payload-{holder}", fair_key="A")
    for holder in b:
        sem.park(holder, f"payload-{holder}", fair_key="B")
    sem.park("urgent", "payload-urgent", priority=2)
    assert handed == [], "nothing is free: nobody handed over"
    order = serve(sem, gate)
    assert order[0] == "urgent"
    assert rounds_of(order[1:7], 2) == [{a[i], b[i]} for i in range(3)]
    assert order[7:] == a[3:]


def test_keys_take_turns_under_a_rate(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(None, rate=RateLimit(5, 1.0))
    granted(sem.attempt("first"))  # the rate's one grant for the next 200 ms
    a, b = names("a", 4), names("b", 2)
    queue(sem, a, fair_key="A")
    queue(sem, b, fair_key="B")
    order = line(sem)
    for holder in order:  # each granted when the rate allows the head of the line
        deadline = time.monotonic() + 10
        while isinstance(place := sem.attempt(holder, wait_lease=LONG), Place):
            assert place.position == 1, f"{holder} is not the head of the line"
            assert time.monotonic() < deadline, f"{holder} never granted"
            time.sleep(min(max(place.rate_due or 0.0, 0.005), 0.2))
    assert rounds_of(order[:4], 2) == [{a[0], b[0]}, {a[1], b[1]}]
    assert order[4:] == a[2:]
    assert sem.status().waiter_count == 0


def test_weighted_waiters_take_turns_by_key(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(2)
    gate = granted(sem.attempt("gate", weight=2))
    a, b = names("a", 5), names("b", 3)
    queue(sem, a, fair_key="A", weight=2)
    queue(sem, b, fair_key="B")
    assert fair_records(sem)["w|a0"].startswith("2|2|0|1|"), "its weight and its key"
    weights = {holder: 2 for holder in a}
    order = serve(sem, gate, weights=weights)
    assert rounds_of(order[:6], 2) == [{a[i], b[i]} for i in range(3)]
    assert order[6:] == a[3:]


# What it leaves in Redis -------------------------------------------------------------


def test_the_records_of_keys_and_waiters_go_when_the_line_empties(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1, fair_weights={"A": 3})
    gate = granted(sem.attempt("gate"))
    queue(sem, names("a", 4), fair_key="A")
    queue(sem, names("b", 2), fair_key="B", priority=1)
    queue(sem, ["plain"], priority=4)
    records = fair_records(sem)
    assert {k for k in records if k.startswith("f|")} == {"f|A", "f|B"}
    assert records["f|A"].split("|")[1] == "4" and records["f|B"].split("|")[1] == "2"
    assert len([k for k in records if k.startswith("w|")]) == 7
    assert meta_records(sem)["n_fair_keys"] == "2"
    assert serve(sem, gate)[0] == "plain"
    meta = meta_records(sem)
    assert {k for k in meta if k.startswith(("f|", "w|"))} == set()
    assert int(meta.get("n_fair_keys", 0)) == 0
    assert int(meta.get("n_weighted", 0)) == 0
    assert meta.get("m_fair_granted_c1") == "4", "A: weight 3, class 2-3"
    assert meta.get("m_fair_granted_c0") == "2", "B: weight 1"


# Bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fair_key": 7}, r"fair_key must be a str .* got 7"),
        ({"fair_key": "k" * 201}, r"fair_key must be a str of at most 200 characters"),
        ({"priority": 256}, r"priority must be an int from -255 to 255 .* got 256"),
        ({"priority": -256}, r"priority must be an int from -255 to 255 .* got -256"),
        ({"priority": True}, r"priority must be an int .* got True"),
        ({"priority": 1.5}, r"priority must be an int .* got 1.5"),
    ],
)
def test_bad_keys_and_priorities_are_refused_before_asking(
    make_semaphore: MakeSemaphore, kwargs: dict[str, Any], message: str
) -> None:
    sem = make_semaphore(1)
    gate = granted(sem.attempt("gate"))
    for ask in (
        lambda: sem.attempt("x", **kwargs),
        lambda: sem.acquire(timeout=0.1, holder="x", **kwargs),
        lambda: sem.take_place("x", **kwargs),
    ):
        with pytest.raises(ValueError, match=message):
            ask()
    assert sem.status().waiter_count == 0, "nothing was asked"
    assert fair_records(sem) == {}
    gate.release()


@pytest.mark.parametrize(
    ("fair_weights", "error", "message"),
    [
        ([("A", 3)], TypeError, r"fair_weights must be a mapping .* or a function .* got list"),
        ({"A": 0}, ValueError, r"fair_weights gives key 'A' the weight 0: .* from 1 to 1000"),
        ({"A": 1001}, ValueError, r"fair_weights gives key 'A' the weight 1001"),
        ({"A": 2.0}, ValueError, r"fair_weights gives key 'A' the weight 2.0"),
        ({7: 2}, ValueError, r"fair_key must be a str"),
    ],
)
def test_bad_fair_weights_are_refused_when_the_semaphore_is_made(
    make_semaphore: MakeSemaphore, fair_weights: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make_semaphore(1, fair_weights=fair_weights)


def broken_weights(key: str) -> int:
    if key == "bad":
        raise KeyError("no such tenant")
    return 0 if key == "zero" else 2


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("bad", r"fair_weights raised KeyError: 'no such tenant' for key 'bad'"),
        ("zero", r"fair_weights gives key 'zero' the weight 0"),
    ],
)
def test_a_weights_function_that_fails_for_a_key_is_an_error_naming_the_key(
    make_semaphore: MakeSemaphore, key: str, message: str
) -> None:
    sem = make_semaphore(1, fair_weights=broken_weights)
    gate = granted(sem.attempt("gate"))
    with pytest.raises(ValueError, match=message):
        sem.attempt("x", fair_key=key)
    refused(sem.attempt("ok", fair_key="good"))
    assert fair_records(sem)["w|ok"] == "1|1|0|2|good"
    assert line(sem) == ["ok"]
    gate.release()


@pytest.mark.parametrize("way", ["attempt", "try_acquire", "wait_for_turn"])
def test_a_per_call_fair_weight_gives_its_key_that_many_turns(
    make_semaphore: MakeSemaphore, way: str
) -> None:
    """``fair_weight=`` on the call weighs the key where the semaphore's ``fair_weights``
    say nothing: every way of asking passes it (it was dropped by all but one)."""
    sem = make_semaphore(1, waiter_lease=LONG)
    gate = granted(sem.attempt("gate"))
    a, b = names("a", 40), names("b", 40)
    for holder_a, holder_b in zip(a, b, strict=True):
        for holder, key, weight in ((holder_a, "A", 3), (holder_b, "B", 1)):
            if way == "attempt":
                result = sem.attempt(holder, wait_lease=LONG, fair_key=key, fair_weight=weight)
            elif way == "try_acquire":
                result = sem.try_acquire(holder, fair_key=key, fair_weight=weight)
            else:
                result = sem.wait_for_turn(
                    0, holder, wait_lease=LONG, fair_key=key, fair_weight=weight
                )
            assert result is None or isinstance(result, Place), result
    order = serve(sem, gate, count=24)
    from_a = sum(h.startswith("a") for h in order)
    assert from_a == 18, order
