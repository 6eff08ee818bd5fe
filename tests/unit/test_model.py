"""The reference model's rules, one by one, with no store: `celery_semaphore.core.model`.

(tests/conformance holds the model against the real scripts; these pin each rule down
on its own, with the clock set by hand.)
"""

from __future__ import annotations

import pytest

from celery_semaphore.core.constants import KEPT, RELEASED
from celery_semaphore.core.model import (
    FAIR_TURN,
    PLAIN_ASKED,
    PRIORITY_STEP,
    Asked,
    Caller,
    Claimed,
    Dispatch,
    Epochs,
    Granted,
    GrantedInPlace,
    Handover,
    ParkIfFar,
    Part,
    Rate,
    Recall,
    Record,
    Refused,
    RefusedAll,
    SemaphoreModel,
    Stale,
    State,
    WakeUp,
    acquire_all,
    seq_after,
)
from celery_semaphore.core.model.order import fair_head, roll_minute, stored
from celery_semaphore.core.model.parking import window
from celery_semaphore.core.model.rate import NO_ROOM_LIMIT, rate_room, rate_tat

T0 = 1_700_000_000_000_000  # µs
MS = 1000
LEASE = 600_000  # ms
TWO = Caller(limit=2)


def attempt(
    model: SemaphoreModel,
    holder: str,
    now: int = T0,
    caller: Caller = TWO,
    *,
    queue: bool = True,
    ticket: int | None = None,
    ask: Asked = PLAIN_ASKED,
    handover: int | None = None,
) -> Granted | Refused | Stale:
    return model.attempt(
        caller, holder, now, lease_ms=LEASE, waiter_lease_ms=LEASE if queue else 0,
        ticket=ticket, ask=ask, handover=handover,
    )  # fmt: skip


def granted(result: Granted | Refused | Stale) -> Granted:
    assert isinstance(result, Granted), result
    return result


def refused(result: Granted | Refused | Stale) -> Refused:
    assert isinstance(result, Refused), result
    return result


def line(model: SemaphoreModel) -> list[str]:
    return model.line()


# Tickets and tokens ----------------------------------------------------------------


def test_a_ticket_is_the_time_or_one_more_than_the_last() -> None:
    assert seq_after(None, T0) == T0
    assert seq_after(T0, T0) == T0 + 1
    assert seq_after(T0 + 50, T0) == T0 + 51, "a clock that stepped back changes nothing"


def test_numbers_are_stored_as_the_scripts_write_them() -> None:
    assert stored(10.0) == 10
    assert (stored(2.5), stored(3.5), stored(2.4)) == (2, 4, 2)  # half to even


def test_fencing_tokens_increase_even_in_one_microsecond() -> None:
    model = SemaphoreModel()
    first = granted(attempt(model, "a"))
    second = granted(attempt(model, "b"))
    assert (first.token, second.token) == (T0, T0 + 1)


# The line --------------------------------------------------------------------------


def test_fifo_under_the_limit() -> None:
    model = SemaphoreModel()
    granted(attempt(model, "a"))
    granted(attempt(model, "b"))
    c, d = refused(attempt(model, "c")), refused(attempt(model, "d", T0 + 5))
    assert (c.position, d.position, c.holders, c.limit) == (1, 2, 2, 2)
    assert c.ticket < d.ticket
    assert model.release(TWO, "a", T0 + 10)
    refused(attempt(model, "d", T0 + 20))
    granted(attempt(model, "c", T0 + 30))
    assert line(model) == ["d"]


def test_asking_again_keeps_the_place_and_renews_its_lease() -> None:
    model = SemaphoreModel()
    attempt(model, "a", caller=Caller(limit=1))
    first = refused(attempt(model, "b", caller=Caller(limit=1)))
    again = refused(attempt(model, "b", T0 + 9 * MS, Caller(limit=1)))
    assert again.ticket == first.ticket
    assert model.waiters["b"].expires_ms == (T0 + 9 * MS) // MS + LEASE
    assert model.waiters["b"].since_ms == T0 // MS, "when it first asked is kept"


def test_an_earlier_ticket_presented_wins_a_later_one_does_not() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "a", caller=one)
    early = refused(attempt(model, "b", T0 + 1, one)).ticket
    late = refused(attempt(model, "c", T0 + 2, one)).ticket
    assert refused(attempt(model, "c", T0 + 3, one, ticket=early)).position == 1
    assert model.waiters["c"].ticket == early
    assert refused(attempt(model, "b", T0 + 4, one, ticket=late)).ticket == early


def test_without_queueing_no_place_is_taken() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "a", caller=one)
    result = refused(attempt(model, "b", caller=one, queue=False))
    assert (result.ticket, result.position) == (0, 1)
    assert model.waiters == {} and model.ticket is None


def test_a_live_holder_asking_again_gets_a_new_token_and_nothing_else() -> None:
    model = SemaphoreModel()
    first = granted(attempt(model, "a", ask=Asked(permits=2)))
    model.set_draining(True, T0)
    again = granted(attempt(model, "a", T0 + 5 * MS, ask=Asked(permits=1)))
    assert again.token > first.token
    holding = model.holders["a"]
    assert (holding.permits, holding.acquired_ms) == (2, T0 // MS)


# Leases ----------------------------------------------------------------------------


def test_a_lease_that_ends_now_has_run_out() -> None:
    model = SemaphoreModel()
    model.attempt(TWO, "a", T0, lease_ms=100, waiter_lease_ms=0)
    model.attempt(TWO, "b", T0, lease_ms=100, waiter_lease_ms=0)
    assert refused(attempt(model, "c", T0 + 99 * MS + 999)).holders == 2
    assert model.reclaim(T0 // MS + 100) == 2
    assert model.holders == {}


def test_a_waiter_that_does_not_ask_again_loses_its_place() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "a", caller=one)
    one_place = model.attempt(one, "b", T0, lease_ms=LEASE, waiter_lease_ms=50)
    assert refused(one_place).ticket
    assert refused(attempt(model, "c", T0 + 50 * MS, one)).position == 1


def test_release_is_idempotent_by_token_or_by_id() -> None:
    model = SemaphoreModel()
    old = granted(attempt(model, "a"))
    new = granted(attempt(model, "a", T0 + 1))
    assert model.release(TWO, "a", T0 + 2, old.token) is False
    assert model.release(TWO, "a", T0 + 3, new.token) is True
    assert model.release(TWO, "a", T0 + 4, new.token) is False
    assert model.release(TWO, "a", T0 + 5) is False


def test_release_by_id_also_leaves_the_line_and_the_sent_count() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "a", caller=one)
    model.take_place(one, "t", T0, waiter_lease_ms=LEASE)
    assert model.release(one, "t", T0 + 1) is False
    assert (model.waiters, model.sent) == ({}, {})


def test_renew_extends_matching_leases_and_never_resurrects() -> None:
    model = SemaphoreModel()
    old = granted(model.attempt(TWO, "a", T0, lease_ms=100, waiter_lease_ms=0))
    new = granted(model.attempt(TWO, "a", T0 + 1, lease_ms=100, waiter_lease_ms=0))
    expires, lost = model.renew([("a", old.token), ("a", new.token), ("x", None)], 500, T0 + 2)
    assert (expires, lost) == (T0 // MS + 500, ["a", "x"])
    assert model.holders["a"].expires_ms == T0 // MS + 500
    _, lost = model.renew([("a", None)], 500, T0 + 500 * MS)
    assert lost == ["a"]


# Limits and drain -----------------------------------------------------------------


def test_the_effective_limit_is_the_override_then_the_declared_then_the_recorded() -> None:
    model = SemaphoreModel()
    assert model.effective_limit(None) == 0
    attempt(model, "a", caller=Caller(limit=3))
    assert (model.effective_limit(None), model.effective_limit(5)) == (3, 5)
    assert model.set_override(1, T0) is None
    assert model.effective_limit(5) == 1
    assert model.set_override(None, T0) == 1


def test_a_lowered_limit_evicts_nobody_and_admits_nobody_above_it() -> None:
    model = SemaphoreModel()
    granted(attempt(model, "a"))
    granted(attempt(model, "b"))
    model.set_override(1, T0)
    model.release(TWO, "a", T0)
    assert refused(attempt(model, "c")).limit == 1
    assert set(model.holders) == {"b"}


def test_draining_refuses_newcomers_even_under_shadow_limits() -> None:
    model, shadow = SemaphoreModel(), Caller(limit=2, shadow="l")
    assert model.set_draining(True, T0) is False
    assert refused(attempt(model, "a", caller=shadow)).draining
    assert model.set_draining(False, T0) is True
    granted(attempt(model, "a", caller=shadow))


def test_each_caller_is_held_to_its_own_declared_limit() -> None:
    model = SemaphoreModel()
    granted(attempt(model, "a", caller=Caller(limit=1)))
    refused(attempt(model, "b", caller=Caller(limit=1), queue=False))
    granted(attempt(model, "b", caller=Caller(limit=3)))
    assert model.recorded_limit == 3


# Weights ---------------------------------------------------------------------------


def test_a_heavy_waiter_at_the_head_holds_back_those_behind_it() -> None:
    model, three = SemaphoreModel(), Caller(limit=3)
    granted(attempt(model, "a", caller=three, ask=Asked(permits=2)))
    assert refused(attempt(model, "b", caller=three, ask=Asked(permits=2))).holders == 2
    refused(attempt(model, "c", caller=three))  # one free, but b needs two first
    model.release(three, "a", T0 + 1)
    granted(attempt(model, "c", T0 + 2, three))  # b's two and c's one fit in three
    granted(attempt(model, "b", T0 + 3, three, ask=Asked(permits=2)))
    assert model.permits_held() == 3


def test_a_changed_ask_replaces_the_recorded_one() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "a", caller=one)
    attempt(model, "b", caller=one, ask=Asked(permits=1, grants=2))
    assert model.asks["b"] == Asked(permits=1, grants=2)
    attempt(model, "b", caller=one)
    assert "b" not in model.asks


# Priority and fair share ----------------------------------------------------------


def test_priority_moves_the_ticket_by_whole_steps() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "a", caller=one)
    plain = refused(attempt(model, "plain", T0 + 1, one)).ticket
    high = refused(attempt(model, "high", T0 + 2, one, ask=Asked(priority=2))).ticket
    low = refused(attempt(model, "low", T0 + 3, one, ask=Asked(priority=-1))).ticket
    assert (plain, high, low) == (T0 + 1, T0 + 2 - 2 * PRIORITY_STEP, T0 + 3 + PRIORITY_STEP)
    assert line(model) == ["high", "plain", "low"]
    assert model.ticket == T0 + 3, "the sequence moves by time, not by the move"


def test_the_fair_head_ignores_tickets_a_priority_moved() -> None:
    moved = T0 - PRIORITY_STEP
    assert fair_head([moved, T0 + 5], T0 + 9, None) == T0 + 5
    assert fair_head([moved], T0 + 9, None) == T0 + 9
    assert fair_head([T0 + 3 * FAIR_TURN], T0, T0 + 2 * FAIR_TURN) == T0 + 3 * FAIR_TURN


def fair(key: str, weight: int = 1, priority: int = 0) -> Asked:
    return Asked(fair_key=key, fair_weight=weight, priority=priority)


def test_fair_keys_take_turns_by_weight() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "x", caller=one)
    for i in range(4):
        attempt(model, f"a{i}", T0 + 1 + i, one, ask=fair("a"))
    for i in range(4):
        attempt(model, f"b{i}", T0 + 10 + i, one, ask=fair("b", weight=2))
    assert line(model) == ["a0", "b0", "b1", "a1", "b2", "b3", "a2", "a3"]
    assert model.waiters["a0"].ticket == T0 + 1 + 1  # the head at its time, tie 1
    assert model.waiters["b0"].ticket == T0 + 2 + 2  # the head (a0's ticket), tie 2
    assert model.fair["b"].tail == stored(T0 + 2 + 2 * FAIR_TURN)


def test_an_urgent_fair_waiter_takes_its_keys_next_turn_and_pays_it_back() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "x", caller=one)
    for i in range(3):
        attempt(model, f"a{i}", T0 + 1 + i, one, ask=fair("a"))
    attempt(model, "b0", T0 + 10, one, ask=fair("b"))
    attempt(model, "a-urgent", T0 + 11, one, ask=fair("a", priority=1))
    assert line(model) == ["a0", "a-urgent", "b0", "a1", "a2"]  # the key's turn is now
    assert model.fair["a"].tail == stored(T0 + 1 + 4 * FAIR_TURN)


def test_a_key_that_leaves_the_rotation_comes_back_with_a_new_tie() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "x", caller=one)
    attempt(model, "a0", T0 + 1, one, ask=fair("a"))
    assert model.fair["a"].tie == 1
    model.release(one, "a0", T0 + 2)
    assert model.fair == {}
    attempt(model, "a1", T0 + 3, one, ask=fair("a"))
    assert (model.fair["a"].tie, model.fair["a"].waiting) == (2, 1)


def test_fair_grants_are_counted_per_minute_while_the_key_waits() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "x", caller=one)
    attempt(model, "a0", T0 + 1, one, ask=fair("a"))
    attempt(model, "a1", T0 + 2, one, ask=fair("a"))
    model.release(one, "x", T0 + 3)
    granted(attempt(model, "a0", T0 + 4, one, ask=fair("a")))
    status = model.status(one, T0 + 5)
    assert [(k.key, k.waiting, k.grants) for k in status.fair_keys] == [("a", 1, 1)]
    assert status.fair_grants == 1
    minute = T0 // MS // 60_000
    assert roll_minute(3, minute, 5, T0 // MS + 60_000) == (0, minute + 1, 3)
    assert roll_minute(3, minute, 5, T0 // MS + 120_000) == (0, minute + 2, 0)


# Rates -----------------------------------------------------------------------------

SLOW = Rate(interval_us=10_000_000, burst=2)


def test_a_rate_grants_its_burst_then_one_per_interval() -> None:
    model, rated = SemaphoreModel(), Caller(limit=10, rate=SLOW)
    granted(attempt(model, "a", caller=rated))
    granted(attempt(model, "b", caller=rated))
    c = refused(attempt(model, "c", caller=rated))
    assert c.slot_us == 10_000_000
    assert refused(attempt(model, "d", caller=rated)).slot_us == 20_000_000
    granted(attempt(model, "c", T0 + 10_000_000, rated))


def test_the_rate_forgives_half_an_interval_and_forgets_an_idle_spell() -> None:
    assert rate_tat(T0 - 4_000_000, SLOW, T0) == T0 - 4_000_000
    assert rate_tat(T0 - 6_000_000, SLOW, T0) == T0
    room = rate_room(SLOW, T0 + 10_000_000, None, T0)
    assert (room.grants, room.next_us) == (1, 10_000_000)


def test_a_permit_given_back_unused_gives_its_grants_back() -> None:
    model, rated = SemaphoreModel(), Caller(limit=10, rate=Rate(10_000_000, burst=3))
    granted(attempt(model, "a", caller=rated))
    b = granted(attempt(model, "b", caller=rated, ask=Asked(permits=1, grants=2)))
    assert model.tat == T0 + 30_000_000
    assert model.release(rated, "b", T0, b.token, unused=2)
    assert model.tat == T0 + 10_000_000


def test_a_pause_stops_the_rate_and_only_a_rate() -> None:
    model, rated = SemaphoreModel(), Caller(limit=10, rate=SLOW)
    model.pause_rate(Caller(limit=10), 5000, T0)
    assert model.rate_pause_ms is None, "no rate: nothing to pause"
    model.pause_rate(rated, 5000, T0)
    model.pause_rate(rated, 1000, T0)
    assert model.rate_pause_ms == T0 // MS + 5000, "a shorter pause changes nothing"
    result = refused(attempt(model, "a", caller=rated))
    assert (result.slot_us, result.rate_pause_ms) == (5_000_000, T0 // MS + 5000)


def test_the_rate_override_beats_every_declared_rate() -> None:
    model = SemaphoreModel()
    fast = Rate(interval_us=1000, burst=1)
    assert model.set_rate_override(SLOW, T0) is None
    assert model.effective_rate(fast) == SLOW
    assert model.set_rate_override(None, T0) == SLOW
    attempt(model, "a", caller=Caller(limit=1, rate=fast))
    assert model.effective_rate(None) is None, "acquire declares its rate, none too"


# Shadow limits ---------------------------------------------------------------------


def test_shadow_limits_count_what_they_would_have_refused() -> None:
    model = SemaphoreModel()
    shadow = Caller(limit=1, rate=Rate(interval_us=60_000_000), shadow="lr")
    granted(attempt(model, "a", caller=shadow))
    b = granted(attempt(model, "b", caller=shadow, ask=Asked(permits=1)))
    assert (b.shadow, b.shadow_wait_ms) == ("lr", 60_000)
    status = model.status(shadow, T0)
    assert (status.shadow_limit_refusals, status.shadow_rate_refusals) == (1, 1)
    assert (status.shadow_peak, status.shadow_wait_ms, status.recorded_shadow) == (2, 60_000, "lr")


# Places taken at publish -----------------------------------------------------------


def test_take_place_records_a_limit_only_where_none_is() -> None:
    model = SemaphoreModel()
    first = model.take_place(Caller(limit=4, shadow="l"), "t1", T0, waiter_lease_ms=100)
    assert (first.position, first.limit, model.recorded_limit) == (1, 4, 4)
    model.take_place(Caller(limit=9), "t2", T0 + 1, waiter_lease_ms=100)
    assert (model.recorded_limit, model.recorded_shadow) == (4, "l")
    again = model.take_place(Caller(limit=4), "t1", T0 + 50 * MS, waiter_lease_ms=100)
    assert again.ticket == first.ticket
    assert model.waiters["t1"].expires_ms == (T0 + 50 * MS) // MS + 100


def test_a_place_taken_at_publish_counts_as_sent_until_it_asks() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "a", caller=one)
    model.take_place(one, "t1", T0, waiter_lease_ms=100)
    model.take_place(one, "t2", T0, waiter_lease_ms=100_000)
    status = model.status(one, T0 + 200 * MS)
    assert (status.sent_count, [s.holder for s in status.sent_without_place]) == (2, ["t1"])
    attempt(model, "t2", T0 + 300 * MS, one)
    assert model.status(one, T0 + 300 * MS).sent_count == 1


def test_a_new_place_forgets_the_tasks_sent_past_the_horizon() -> None:
    """As enqueue.lua's ZREMRANGEBYSCORE: a task sent that long ago is not only left
    out of the counts, it is forgotten (else a purged queue's tasks stay for ever)."""
    model, short = SemaphoreModel(), Caller(limit=1, sent_horizon_ms=1000)
    model.take_place(short, "old", T0, waiter_lease_ms=100)
    model.take_place(short, "at the horizon", T0 + 500 * MS, waiter_lease_ms=100)
    model.take_place(short, "within", T0 + 501 * MS, waiter_lease_ms=100)
    model.take_place(short, "new", T0 + 1500 * MS, waiter_lease_ms=100)
    assert set(model.sent) == {"within", "new"}, "at the horizon or before: forgotten"


# Status ----------------------------------------------------------------------------


def test_status_leaves_out_what_ran_out_but_reclaims_nothing() -> None:
    model = SemaphoreModel()
    model.attempt(TWO, "a", T0, lease_ms=100, waiter_lease_ms=0, ask=Asked(permits=2))
    model.attempt(TWO, "b", T0, lease_ms=100, waiter_lease_ms=100)
    assert model.status(TWO, T0).holder_count == 2
    later = model.status(TWO, T0 + 100 * MS)
    assert (later.holder_count, later.waiter_count, later.holders, later.waiters) == (0, 0, [], [])
    assert set(model.holders) == {"a"} and set(model.waiters) == {"b"}


@pytest.mark.parametrize(
    ("ask", "text"),
    [
        (Asked(), ""),
        (Asked(permits=2, grants=2), "2|2"),
        (Asked(priority=3), "1|1|3"),
        (Asked(fair_key="k", fair_weight=2), "1|1|0|2|k"),
    ],
)
def test_an_ask_is_written_as_the_client_writes_it(ask: Asked, text: str) -> None:
    assert ask.text == text


# Parking and handover -----------------------------------------------------------------

PUBLISHING = Caller(limit=1, dispatch=Dispatch(max_block_ms=1000, deadline_ms=30_000))


def parked_behind_a_holder() -> SemaphoreModel:
    model = SemaphoreModel()
    granted(attempt(model, "a", caller=PUBLISHING))
    model.park(PUBLISHING, "b", "b's message", T0 + 1, park_lease_ms=LEASE)
    return model


def test_a_parked_waiter_is_handed_over_when_its_permit_frees() -> None:
    model = parked_behind_a_holder()
    assert model.handovers == []
    assert model.status(PUBLISHING, T0 + 1).waiters[0].state == "p"
    model.release(PUBLISHING, "a", T0 + 2)
    assert model.handovers == [Handover("b", T0 + 2, "b's message", 0)]
    assert model.parking.handed["b"] == (T0 + 2) // MS + 30_000, "due again at the deadline"
    granted(attempt(model, "b", T0 + 3, PUBLISHING, handover=T0 + 2))
    assert model.parking.records["b"].state is State.ARRIVED


def test_the_first_copy_to_arrive_takes_the_place_whichever_handovers_it_is() -> None:
    """Handed over again after its deadline, the first copy may only be late (or, moved
    out of a parking queue, be the only one): whichever copy arrives first takes the
    place; the other is stale after it; the first delivered again is not."""
    model = parked_behind_a_holder()
    model.release(PUBLISHING, "a", T0 + 2)
    later = T0 + 2 + 30_000 * MS
    model.dispatch(PUBLISHING, later)  # the deadline passed: again
    assert [h.token for h in model.handovers] == [later]
    granted(attempt(model, "b", T0 + 31_000 * MS, PUBLISHING, handover=T0 + 2))
    assert attempt(model, "b", T0 + 31_500 * MS, PUBLISHING, handover=later) == Stale(T0 + 2)
    again = attempt(model, "b", T0 + 32_000 * MS, PUBLISHING, handover=T0 + 2)
    assert isinstance(again, Granted), "the same copy delivered twice is not stale"


def test_served_in_person_its_copy_on_the_way_is_stale() -> None:
    model = parked_behind_a_holder()
    model.release(PUBLISHING, "a", T0 + 2)
    granted(attempt(model, "b", T0 + 3, PUBLISHING))
    assert model.parking.records["b"].state is State.SERVED
    assert attempt(model, "b", T0 + 4, PUBLISHING, handover=T0 + 2) == Stale(T0 + 2)


def test_a_claim_gives_the_turn_to_the_parked_message_taken() -> None:
    model = parked_behind_a_holder()
    for holder in "cd":
        model.park(PUBLISHING, holder, f"{holder}'s message", T0 + 1, park_lease_ms=LEASE)
    model.release(PUBLISHING, "a", T0 + 2)
    assert [(h.holder, h.token) for h in model.handovers] == [("b", T0 + 2), ("c", T0 + 3)]
    deadline = model.parking.handed["b"]
    assert model.claim(PUBLISHING, "d", "b", T0 + 2, T0 + 4) is Claimed.PUBLISH
    assert model.parking.records["d"] == Record(T0 + 2, State.HANDED, 0, "d's message")
    assert model.parking.records["b"] == Record(0, State.PARKED, 0, "b's message")
    assert model.parking.handed["d"] == model.parking.handed["b"] == deadline
    assert (model.parking.count(State.PARKED), model.parking.count(State.HANDED)) == (1, 2)
    assert model.claim(PUBLISHING, "d", "b", T0 + 2, T0 + 5) is Claimed.VOID
    assert model.handovers == []


def test_a_late_handover_keeps_the_token_before_for_a_claim_to_give_back() -> None:
    model = parked_behind_a_holder()
    model.park(PUBLISHING, "c", "c's message", T0 + 1, park_lease_ms=LEASE)
    model.release(PUBLISHING, "a", T0 + 2)
    late = T0 + 2 + 30_000 * MS
    model.dispatch(PUBLISHING, late)
    assert [(h.holder, h.token) for h in model.handovers] == [("b", late), ("c", late + 1)]
    assert model.parking.records["b"] == Record(late, State.HANDED, T0 + 2, "b's message")
    assert model.claim(PUBLISHING, "c", "b", late, late + 2) is Claimed.PUBLISH
    assert model.parking.records["b"] == Record(T0 + 2, State.HANDED, 0, "b's message")
    assert model.parking.records["c"] == Record(late, State.HANDED, 0, "c's message")
    # c took b's turn and its place in line (the later ticket): it is served first,
    # b's earlier copy waits behind it
    refused(attempt(model, "b", late + 3, PUBLISHING, handover=T0 + 2))
    granted(attempt(model, "c", late + 4, PUBLISHING, handover=late))


def test_asking_in_person_takes_a_parked_payload_back() -> None:
    model = parked_behind_a_holder()
    refused(attempt(model, "b", T0 + 2, PUBLISHING))
    assert model.parking.records == {}


def test_parked_before_a_release_is_near_even_without_a_free_permit() -> None:
    model = SemaphoreModel()
    two = Caller(limit=2, dispatch=PUBLISHING.dispatch)
    granted(attempt(model, "a", caller=two))
    granted(attempt(model, "b", caller=two))
    for holder in "cdef":
        model.park(two, holder, holder, T0 + 1, park_lease_ms=LEASE)
    model.release(two, "a", T0 + 2)
    assert [h.holder for h in model.handovers] == ["c", "d", "e"]  # 1 free + the limit's 2


def test_the_window_shrinks_when_holds_are_longer_than_max_block() -> None:
    assert window(2, 2, paused=False, hold_ms=0, room=NO_ROOM_LIMIT, rate=None,
                  cfg=Dispatch(1000, 30_000)).count == 2  # fmt: skip
    assert window(2, 1, paused=False, hold_ms=2000, room=NO_ROOM_LIMIT, rate=None,
                  cfg=Dispatch(1000, 30_000)).count == 2  # fmt: skip
    assert window(2, 2, paused=True, hold_ms=0, room=NO_ROOM_LIMIT, rate=None,
                  cfg=Dispatch(1000, 30_000)).count == 0  # fmt: skip


def test_a_parked_waiter_due_by_its_wait_budget_is_handed_over() -> None:
    model = SemaphoreModel()
    granted(attempt(model, "a", caller=PUBLISHING))
    model.park(PUBLISHING, "b", "b", T0, park_lease_ms=LEASE, due_ms=200)
    model.dispatch(PUBLISHING, T0 + 199 * MS)
    assert model.handovers == []
    model.dispatch(PUBLISHING, T0 + 200 * MS)
    assert [h.holder for h in model.handovers] == ["b"]


def test_dispatch_drops_the_named_parked_waiters_only() -> None:
    model = parked_behind_a_holder()
    refused(attempt(model, "c", T0 + 2, PUBLISHING))
    assert model.dispatch(PUBLISHING, T0 + 3, ("a", "b", "c")) == 1
    assert line(model) == ["c"] and set(model.holders) == {"a"}


def test_a_fresh_semaphore_is_not_made_by_dispatch() -> None:
    model = SemaphoreModel()
    assert model.dispatch(PUBLISHING, T0, ("x",)) == 0
    assert not model.meta_found()


def test_under_a_rate_the_first_waiter_past_the_window_comes_at_its_slot() -> None:
    model = SemaphoreModel()
    rated = Caller(limit=5, rate=Rate(10_000_000), dispatch=PUBLISHING.dispatch)
    granted(attempt(model, "a", caller=rated))
    model.park(rated, "b", "b", T0 + 1, park_lease_ms=LEASE)
    assert model.handovers == [Handover("b", T0 + 1, "b", 10_000)]
    model.park(rated, "c", "c", T0 + 2, park_lease_ms=LEASE)
    assert model.handovers == [], "one such waiter at a time"


def test_a_place_taken_at_publish_parks_at_once_when_its_turn_is_far() -> None:
    model = SemaphoreModel()
    assert PUBLISHING.dispatch is not None
    granted(attempt(model, "a", caller=PUBLISHING))
    far = ParkIfFar(1_000_000, "head-", "-tail", LEASE, PUBLISHING.dispatch)
    near = model.take_place(PUBLISHING, "t1", T0 + 1, waiter_lease_ms=100, park_if_far=far)
    assert (near.parked, near.position) == (False, 1)
    parked = model.take_place(PUBLISHING, "t2", T0 + 2, waiter_lease_ms=100, park_if_far=far)
    assert (parked.parked, parked.position) == (True, 2)  # 1 ahead >= 0 free + limit 1
    assert model.parking.records["t2"].payload == f"head-{parked.ticket}-tail"
    assert model.waiters["t2"].expires_ms == (T0 + 2) // MS + LEASE
    assert set(model.sent) == {"t1"}


# Waiting in place and wake messages ------------------------------------------------


def test_a_release_grants_the_waiters_in_place_at_the_head_and_wakes_the_rest() -> None:
    model, one = SemaphoreModel(), Caller(limit=2)
    attempt(model, "a", caller=one)
    attempt(model, "b", caller=one)
    model.attempt(one, "c", T0 + 1, lease_ms=5_000, waiter_lease_ms=LEASE, in_place=True)
    attempt(model, "d", T0 + 2, one)
    assert model.parking.state_of("c") is State.IN_PLACE
    model.release(one, "a", T0 + 9 * MS)
    assert model.published == [GrantedInPlace("c", T0 + 9 * MS, T0 // MS + 9 + 5_000, 9)]
    assert model.parking.state_of("c") is None, "served: its mark goes with its place"
    model.release(one, "b", T0 + 10 * MS)
    assert model.published == [WakeUp(model.waiters["d"].ticket)], "d asks itself: woken"
    model.set_override(5, T0 + 11 * MS, one)
    assert model.published == [Recall(), WakeUp(None)], "kept permits back; anyone may ask"


def test_asking_without_waiting_in_place_clears_the_mark() -> None:
    model, one = SemaphoreModel(), Caller(limit=1)
    attempt(model, "a", caller=one)
    model.attempt(one, "b", T0, lease_ms=LEASE, waiter_lease_ms=LEASE, in_place=True)
    attempt(model, "b", T0 + 1, one)
    assert model.parking.state_of("b") is None
    model.release(one, "a", T0 + 2)
    assert "b" not in model.holders


# Data loss -------------------------------------------------------------------------


def test_a_first_use_starts_no_pause_a_loss_does() -> None:
    model, one = SemaphoreModel(), Caller(limit=1, pause_ms=2_000)
    granted(attempt(model, "a", caller=one))
    assert model.epochs.hash is not None and model.epochs.hash.lost_ms == 0
    model.lose_data()
    assert model.status(one, T0 + MS).resumes_ms == 0, "a reader notices nothing"
    place = refused(attempt(model, "b", T0 + MS, one))
    assert place.resumes_ms == T0 // MS + 1 + 2_000 and place.holders == 0
    assert len(model.epochs.noticed) == 1
    granted(attempt(model, "b", T0 + 2_002 * MS, one))


def test_a_loss_noticed_late_pauses_from_when_it_is_noticed() -> None:
    model, one = SemaphoreModel(), Caller(limit=1, pause_ms=2_000)
    model.learn_epoch(one.pause_ms, T0)
    model.lose_data()
    known, model.epochs.known = model.epochs.known, None  # another process, first use
    granted(attempt(model, "a", T0 + MS, one))
    model.epochs.known = known
    place = refused(attempt(model, "b", T0 + 5 * MS, one))
    assert place.resumes_ms == T0 // MS + 5 + 2_000


def test_renewals_write_permits_back_while_paused() -> None:
    model, one = SemaphoreModel(), Caller(limit=1, pause_ms=2_000)
    first = granted(attempt(model, "a", caller=one))
    model.lose_data()
    model.learn_epoch(one.pause_ms, T0 + MS)
    _, lost = model.renew([("a", first.token), ("w", None)], LEASE, T0 + 2 * MS,
                          permits={"w": 2})  # fmt: skip
    assert lost == [] and model.restored == ["a", "w"]
    assert (model.holders["a"].token, model.holders["w"].token) == (first.token, 0)
    assert model.epochs.hash is not None and model.epochs.hash.restored == 2
    assert model.release(one, "w", T0 + 3 * MS, token=12345), "token 0: any token releases it"
    _, lost = model.renew([("gone", 7)], LEASE, T0 + 2_002 * MS)
    assert lost == ["gone"], "after the pause nothing is written back"


def test_a_holder_written_back_by_id_that_asks_held_nothing() -> None:
    model, one = SemaphoreModel(), Caller(limit=2, pause_ms=2_000)
    model.learn_epoch(one.pause_ms, T0)
    model.lose_data()
    model.renew([("w", None)], LEASE, T0 + MS, pause_ms=one.pause_ms, permits={"w": 2})
    granted(attempt(model, "w", T0 + 2_002 * MS, one))
    assert model.holders["w"].permits == 1 and model.holders["w"].token != 0


# Several semaphores at once --------------------------------------------------------


def test_a_set_grants_all_or_none_with_one_ticket() -> None:
    epochs = Epochs()
    a, b = SemaphoreModel(epochs), SemaphoreModel(epochs)
    one = Caller(limit=1)
    granted(attempt(a, "x", caller=one))
    parts = [Part(a, one, LEASE, LEASE), Part(b, one, LEASE, LEASE)]
    result = acquire_all(parts, "y", T0 + 1)
    assert isinstance(result, RefusedAll) and result.refused_by == (0,)
    assert [p.ticket for p in result.places] == [result.ticket, 0], "it leaves B's line"
    assert b.holders == {} and a.line() == ["y"] and b.line() == []
    held = acquire_all(parts, "y", T0 + 2, hold_back_ms=LEASE, ticket=result.ticket)
    assert isinstance(held, RefusedAll) and b.line() == ["y"], "held back in B"
    a.release(one, "x", T0 + 3)
    both = acquire_all(parts, "y", T0 + 4)
    assert isinstance(both, list) and len(both) == 2
    assert set(a.holders) == set(b.holders) == {"y"} and a.line() == b.line() == []


def test_a_permit_is_kept_only_while_nobody_waits_and_a_new_line_recalls_it() -> None:
    model, two = SemaphoreModel(), Caller(limit=2)
    granted = attempt(model, "a", caller=two)
    assert isinstance(granted, Granted)
    kept = model.keep(two, "a", T0 + MS, token=granted.token, kept_as="kept|w|1|1|s", info="k")
    assert kept == KEPT
    assert list(model.holders) == ["kept|w|1|1|s"], "the process's holder, not the task's"
    assert model.holders["kept|w|1|1|s"].token == granted.token
    second = attempt(model, "b", T0 + 2 * MS, two)
    assert isinstance(second, Granted)
    attempt(model, "c", T0 + 3 * MS, two)
    assert model.published == [Recall()], "the first waiter of an empty line recalls"
    attempt(model, "d", T0 + 4 * MS, two)
    assert model.published == [], "once a line"
    again = model.keep(two, "b", T0 + 5 * MS, token=second.token, kept_as="kept|w|2|1|s", info="")
    assert again == RELEASED, "c waits: released, and its turn follows"
    assert "b" not in model.holders


def test_no_permit_is_kept_over_a_lowered_limit_nor_twice_under_one_name() -> None:
    model, two = SemaphoreModel(), Caller(limit=2)
    a = attempt(model, "a", caller=two)
    b = attempt(model, "b", T0 + 1, two)
    assert isinstance(a, Granted) and isinstance(b, Granted)
    assert model.keep(two, "a", T0 + 2, token=a.token, kept_as="kept|x", info="") == KEPT
    assert model.keep(two, "b", T0 + 3, token=b.token, kept_as="kept|x", info="") == RELEASED
    model.set_override(0, T0 + 4, two)
    assert model.published[0] == Recall(), "an operator's change recalls kept permits"
    c = attempt(model, "c", T0 + 5, Caller(limit=5))
    assert isinstance(c, Refused), "the override holds"
