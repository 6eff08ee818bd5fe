"""Script arguments and the one place where script replies become results (no Redis)."""

from __future__ import annotations

import pytest

from celery_semaphore import Handover, Place, StaleHandover
from celery_semaphore.core.protocol import (
    WAITER_STATES,
    Grant,
    SemaphoreSpec,
    parse_handovers,
)


def spec(**kw: object) -> SemaphoreSpec:
    options = dict(
        lease_timeout=10.0, namespace="ns", waiter_lease=20.0, recheck_interval=2.0, idle_ttl=60.0
    )
    options.update(kw)
    return SemaphoreSpec("s", 3, **options)  # type: ignore[arg-type]


def test_a_granted_reply() -> None:
    grant, handovers = spec().parse_acquire([1, 42, 5000, 4000, 250, [b"h", b"7", b"p"]])
    assert grant == Grant(42, 5.0, 0.25)
    assert handovers == [Handover("h", 7, "p")]


def test_a_refused_reply() -> None:
    reply = [0, 9, 2, 3, 3, 0, 1500, 1000, 300, 80, []]
    place, handovers = spec().parse_acquire(reply)
    assert place == Place(9, 2, 3, 3, False, 0.5, 0.3, 0.08)
    assert handovers == []
    place, _ = spec().parse_acquire([0, 9, 2, 3, 3, 1, 0, 1000, 0, 0, []])
    assert isinstance(place, Place)
    assert (place.draining, place.next_expiry_in, place.hold_estimate) == (True, None, None)
    assert place.grant_interval is None


def test_a_stale_copy_and_an_unknown_code() -> None:
    with pytest.raises(StaleHandover) as info:
        spec().parse_acquire([2, b"77"])
    assert (info.value.name, info.value.token) == ("s", 77)
    with pytest.raises(ValueError, match="unknown code 5"):
        spec().parse_acquire([5])


def test_handovers_come_in_triples() -> None:
    assert parse_handovers([]) == []
    flat = [b"a", b"1", b"x|y", "b", "2", ""]
    assert parse_handovers(flat) == [Handover("a", 1, "x|y"), Handover("b", 2, "")]


def test_waiter_states_in_status() -> None:
    reply = [1000, b"3", b"", 0, 0, 2, [], [b"w1", b"5", b"9000", b"900|i", b"p",
                                           b"w2", b"6", b"9000", b"", b""], 1, 0,
             3, [b"t9", b"800"], 1]  # fmt: skip
    status = spec().parse_status(reply)
    assert [(w.holder, w.state, w.position) for w in status.waiters] == [
        ("w1", "parked", 1),
        ("w2", "asking", 2),
    ]
    assert (status.parked_count, status.handed_over_count, status.sent_count) == (1, 0, 3)
    assert [(w.holder, w.state, w.since) for w in status.sent_without_place] == [
        ("t9", "in broker", 0.8)
    ]
    assert set(WAITER_STATES.values()) == {"parked", "handed over", "waiting in place", "asking"}


def test_a_grant_message_admits_its_waiter_only() -> None:
    message = {"data": b"g|task-1|77|5000|120"}
    grant = spec().grant_in(message, "task-1")
    assert grant is not None
    assert (grant.fencing_token, grant.expires_at, grant.waited) == (77, 5.0, 0.12)
    assert spec().grant_in(message, "task-2") is None
    assert not spec().admits(message, 5), "a grant to another wakes nobody else"
    assert spec().grant_in({"data": b"12"}, "task-1") is None
    assert spec().admits({"data": b"12"}, 5) and not spec().admits({"data": b"12"}, 13)
    holder_with_bars = spec().grant_in({"data": "g|a|b|3|1000|0"}, "a|b")
    assert holder_with_bars is not None and holder_with_bars.fencing_token == 3


def test_the_dispatch_setting_names_what_a_publisher_needs() -> None:
    assert spec().dispatch == ""
    assert spec(handover_window=0.5, handover_deadline=30.0).dispatch == "500|30000"
    with pytest.raises(ValueError, match="on_handover"):
        spec().park_args("h", None, "payload", park_lease=10, info="", due=None)
    args = spec(handover_window=1.0).park_args("h", 4, "p", park_lease=10, info="i", due=0.0)
    assert args[-1] == 1  # a budget already spent still hands over (in 1 ms)


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(ValueError, match="handover must be None or the positive int"):
        spec().acquire_args(
            "h", None, queue=True, wait_lease=None, lease_timeout=None, info="", handover=0
        )
    with pytest.raises(TypeError, match="payload must be a str"):
        spec(handover_window=1.0).park_args("h", None, b"x", park_lease=1, info="", due=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="handover_window"):
        spec(handover_window=-1.0)


def test_pause_never_sleeps_past_the_earliest_lease_end() -> None:
    place = Place(1, 1, 3, 3, False, 0.05)
    assert spec().pause(place, None) == pytest.approx(0.052)
    assert spec().pause(Place(1, 1, 3, 3, False, None), 0.5) == 0.5
    assert spec().pause(Place(1, 1, 3, 3, False, None), None) == 2.0


def test_a_wake_up_admits_tickets_up_to_its_bound() -> None:
    assert SemaphoreSpec.admits({"data": b"10"}, 10)
    assert not SemaphoreSpec.admits({"data": b"10"}, 11)
    assert SemaphoreSpec.admits({"data": b"inf"}, 10**9)
    assert SemaphoreSpec.admits({"data": b"garbage"}, 5)  # unreadable: try anyway
