"""Fixed scenarios: each drives a store's semaphore and the reference model with the same
calls; `Pair` compares every reply, ``check()`` compares ``status()``. Each scenario also
asserts the rule it is about outright, so a model and a store that went wrong together
still fail here."""

from __future__ import annotations

import time
from collections.abc import Callable

from conformance_driver import LONG, Pair

from celery_semaphore import Permit, Place, RateLimit

MakePair = Callable[..., Pair]


def test_fifo_under_the_limit(pair: MakePair) -> None:
    p = pair(2)
    assert isinstance(p.attempt("a"), Permit)
    assert isinstance(p.attempt("b"), Permit)
    first = p.attempt("c")
    second = p.attempt("d")
    assert isinstance(first, Place) and isinstance(second, Place)
    assert (first.position, second.position) == (1, 2)
    assert first.ticket < second.ticket
    p.check()
    assert p.release("a")
    assert isinstance(p.attempt("d"), Place), "d is behind c: not admitted first"
    assert isinstance(p.attempt("c"), Permit)
    assert isinstance(p.attempt("e"), Place)
    p.check()


def test_a_place_is_kept_by_asking_again_and_by_its_ticket(pair: MakePair) -> None:
    p = pair(1)
    p.attempt("a")
    place = p.attempt("b")
    assert isinstance(place, Place)
    again = p.attempt("b")
    assert isinstance(again, Place) and again.ticket == place.ticket
    unqueued = p.attempt("c", queue=False)
    assert isinstance(unqueued, Place) and unqueued.ticket == 0 and unqueued.position == 2
    assert p.release("b") is False  # a waiter holds nothing; its place goes
    p.attempt("c")
    regained = p.attempt("b", place.ticket)
    assert isinstance(regained, Place) and (regained.ticket, regained.position) == (place.ticket, 1)
    p.check()
    p.attempt("d", place.ticket)  # another's ticket is just a place: equal tickets share it
    p.check()


def test_release_is_idempotent_and_by_token(pair: MakePair) -> None:
    p = pair(1)
    p.attempt("a")
    p.attempt("a")  # asking again: a new token, the same permit
    p.check()
    assert p.release_permit(0) is False, "a stale token releases nothing"
    assert p.release_permit(1) is True
    assert p.release_permit(1) is False
    assert p.release("a") is False
    p.attempt("b")
    assert p.release("b") is True
    p.check()


def test_renew_compares_and_extends(pair: MakePair) -> None:
    p = pair(2)
    p.attempt("a")
    p.attempt("a")
    assert p.renew_permit(0) is False
    assert p.renew_permit(1) is True
    assert p.renew_many(["a", "nobody"]) == {"nobody"}
    p.release("a")
    assert p.renew_permit(1) is False, "a renew never resurrects"
    p.check()


def test_the_override_evicts_nobody_and_admits_nobody_above_it(pair: MakePair) -> None:
    p = pair(3)
    for holder in "abc":
        p.attempt(holder)
    p.set_limit(1)
    assert isinstance(p.attempt("d"), Place)
    p.release("a")
    p.release("b")
    assert isinstance(p.attempt("d"), Place), "two still hold: the override is 1"
    p.check()
    p.set_limit(None)
    assert isinstance(p.attempt("d"), Permit)
    p.set_limit(5)
    p.check()


def test_draining_admits_nobody_new(pair: MakePair) -> None:
    p = pair(2)
    p.attempt("a")
    p.set_draining(True)
    assert isinstance(p.attempt("b"), Place)
    assert isinstance(p.attempt("a"), Permit), "a live holder asking again is granted"
    p.check()
    p.set_draining(False)
    assert isinstance(p.attempt("b"), Permit)
    p.check()


def test_run_out_leases_are_reclaimed_at_the_next_call(pair: MakePair) -> None:
    p = pair(1, lease=0.3, waiter_lease=0.3)
    p.attempt("a")
    p.attempt("b")
    p.attempt("c")
    p.check()
    time.sleep(0.6)
    p.check()  # status leaves the run-out entries out before any reclaim
    assert isinstance(p.attempt("d"), Permit), "a's permit and both places ran out"
    assert p.renew_permit(0) is False
    p.check()


def test_a_heavy_waiter_holds_back_those_behind_it(pair: MakePair) -> None:
    p = pair(3)
    assert isinstance(p.attempt("a", weight=2), Permit)
    assert isinstance(p.attempt("b", weight=2), Place)
    blocked = p.attempt("c")
    assert isinstance(blocked, Place), "one permit is free, but b is first and needs two"
    p.check()
    p.release("a")
    assert isinstance(p.attempt("c"), Permit), "b's two and c's one fit in three"
    assert isinstance(p.attempt("b", weight=2), Permit)
    assert isinstance(p.attempt("d"), Place)
    p.check()


def test_priority_orders_the_line(pair: MakePair) -> None:
    p = pair(1)
    p.attempt("a")
    p.attempt("low", priority=-1)
    p.attempt("plain")
    p.attempt("high", priority=5)
    p.attempt("high2", priority=5)
    p.check()
    assert [w.holder for w in p.sem.status().waiters] == ["high", "high2", "plain", "low"]


def test_fair_keys_take_turns(pair: MakePair) -> None:
    p = pair(1, fair_weights={"big": 2})
    keys = {"x": "small", "s1": "small", "s2": "small", "s3": "small", "u1": "small",
            "b1": "big", "b2": "big", "b3": "big", "b4": "big"}  # fmt: skip
    for holder in ("x", "s1", "s2", "s3", "b1", "b2", "b3", "b4"):
        p.attempt(holder, fair_key=keys[holder])
    p.attempt("u1", fair_key="small", priority=3)
    p.check()
    order = [w.holder for w in p.sem.status().waiters]
    assert order.index("b1") < order.index("s2") and order.index("b2") < order.index("s2")
    p.release("x")
    assert isinstance(p.attempt(order[0], fair_key=keys[order[0]]), Permit)
    p.check()


def test_a_fair_key_whose_waiters_lapsed_leaves_the_rotation(pair: MakePair) -> None:
    """A reclaim counts lapsed waiters out of their keys: a key with none left is
    dropped, and starts afresh (a new tie, its tail from the head) when it comes back."""
    p = pair(1, lease=LONG, waiter_lease=0.3, fair_weights={"big": 2})
    p.attempt("a", fair_key="small")
    p.attempt("s1", fair_key="small")
    p.attempt("b1", fair_key="big")
    p.check()
    assert p.sem.status().fair_keys_waiting == 2
    time.sleep(0.6)
    p.attempt("s2", fair_key="small")  # reclaims s1 and b1
    p.check()
    assert p.sem.status().fair_keys_waiting == 1, "big's only waiter lapsed"
    p.attempt("b2", fair_key="big")
    p.check()
    p.release("a")
    assert isinstance(p.attempt("s2", fair_key="small"), Permit)
    p.check()


def test_a_rate_grants_its_burst_then_one_per_interval(pair: MakePair) -> None:
    p = pair(None, rate=RateLimit(6, 60.0, burst=2))
    assert isinstance(p.attempt("a"), Permit)
    assert isinstance(p.attempt("b"), Permit)
    place = p.attempt("c")
    assert isinstance(place, Place) and place.rate_due is not None and place.rate_due > 5
    p.check()
    assert p.release_permit(1, unused=True)  # b never started: its grant comes back
    assert isinstance(p.attempt("c"), Permit)
    p.check()
    p.set_rate("100/s")
    # The old schedule (tat) still stands, so the faster rate admits nobody before it:
    # the scripts and the model agree; docs/operations.md says "admits waiters at once".
    p.attempt("d")
    p.pause_rate(30)
    assert isinstance(p.attempt("e"), Place)
    p.check()
    p.set_rate(None)
    p.check()


def test_shadow_limits_count_and_refuse_nobody(pair: MakePair) -> None:
    p = pair(1, rate=RateLimit(1, 60.0), shadow=("limit", "rate"))
    a = p.attempt("a")
    b = p.attempt("b", weight=1)
    assert isinstance(a, Permit) and isinstance(b, Permit)
    assert b.shadow_refused == {"limit", "rate"}
    p.attempt("c")
    p.check()
    status = p.sem.status()
    assert (status.shadow_limit_refusals, status.shadow_peak) == (2, 3)


def test_a_place_taken_at_publish(pair: MakePair) -> None:
    p = pair(1)
    p.attempt("a")
    place = p.take_place("t1", info="task 1")
    p.take_place("t2", weight=1)
    p.check()
    assert p.sem.status().sent_count == 2
    again = p.attempt("t1", place.ticket)
    assert isinstance(again, Place) and again.position == 1
    p.check()
    assert p.sem.status().sent_count == 1


def test_each_client_is_held_to_its_own_declared_limit(pair: MakePair) -> None:
    small = pair(1)
    large = small.sibling(3)
    assert isinstance(small.attempt("a"), Permit)
    assert isinstance(small.attempt("b"), Place)
    small.release("b")
    assert isinstance(large.attempt("b"), Permit)
    small.check()
    large.check()


def test_a_grant_soon_after_its_slot_keeps_the_schedule(pair: MakePair) -> None:
    """GCRA's grace (rate_tat()): a grant up to half an interval late starts from its
    slot, not from now, so the next slot is one interval after the missed one."""
    p = pair(None, rate=RateLimit(40, 60.0))  # one every 1.5 s
    assert isinstance(p.attempt("a"), Permit)
    time.sleep(1.9)  # 0.4 s after the next slot: within the grace of 0.75 s
    assert isinstance(p.attempt("b"), Permit)
    place = p.attempt("c")
    assert isinstance(place, Place) and place.rate_due is not None
    assert place.rate_due < 1.3, "the next slot counts from b's slot, not from b's grant"
    p.check()


def test_a_key_of_weight_3_takes_exactly_3_turns_to_1_while_both_wait(pair: MakePair) -> None:
    """The share the worker test (test_fair_in_workers.py) can only bound loosely,
    where task starts also depend on the workers' timing: in the line itself it is
    exact, round after round, and FIFO within each key."""
    p = pair(1, fair_weights={"gold": 3})
    p.attempt("gate")
    gold, silver = [f"g{i:02}" for i in range(12)], [f"s{i:02}" for i in range(12)]
    for g, s in zip(gold, silver, strict=True):  # interleaved, as they were submitted
        p.attempt(s, fair_key="silver")
        p.attempt(g, fair_key="gold")
    p.check()
    served, held = [], "gate"
    for _ in range(16):  # both keys still wait after these
        head = p.sem.status().waiters[0].holder
        p.release(held)
        key = "gold" if head.startswith("g") else "silver"
        assert isinstance(p.attempt(head, fair_key=key), Permit)
        served.append(head)
        held = head
    p.check()
    for start in range(0, 16, 4):
        assert sum(h.startswith("g") for h in served[start : start + 4]) == 3, served
    assert [h for h in served if h.startswith("g")] == gold[:12]
    assert [h for h in served if h.startswith("s")] == silver[:4]


def test_the_line_is_served_in_ticket_order(pair: MakePair) -> None:
    """Strict FIFO among live places, as docs/guarantees.md promises: the order worker
    tests bound with Kendall's tau (tasks of a countdown retry come back late and a
    lapsed place stops holding back later tickets) is exact in the line."""
    p = pair(2)
    p.attempt("a")
    p.attempt("b")
    waiting = [f"w{i:02}" for i in range(20)]
    for holder in waiting:
        p.attempt(holder)
    served, holding = [], ["a", "b"]
    while len(served) < len(waiting):
        p.release(holding.pop(0))
        head = p.sem.status().waiters[0].holder
        assert isinstance(p.attempt(head), Permit)
        served.append(head)
        holding.append(head)
    p.check()
    assert served == waiting
