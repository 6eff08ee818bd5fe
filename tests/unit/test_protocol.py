"""Requests as script arguments, and the one place where script replies become results
(no Redis)."""

from __future__ import annotations

import pytest

from celery_semaphore import Ask, FairKeyInfo, Handover, Place, Places, RateLimit, StaleHandover
from celery_semaphore.core import wakeups
from celery_semaphore.core.model.parking import Dispatch
from celery_semaphore.core.protocol import SemaphoreSpec
from celery_semaphore.core.rates import parse_rate
from celery_semaphore.core.redis import arguments, epochs, wake_messages
from celery_semaphore.core.redis.arguments import (
    parse_acquire,
    parse_claim,
    parse_configure,
    parse_dispatch,
    parse_enqueue,
    parse_joint_acquire,
    parse_park,
    parse_release,
    parse_renew,
    parse_status,
)
from celery_semaphore.core.redis.replies import (
    HandoverRow,
    Refused,
    read,
    read_all,
)
from celery_semaphore.core.results import WAITER_STATES, Claimed, Grant

OPTIONS = dict(
    lease_timeout=10.0, namespace="ns", waiter_lease=20.0, recheck_interval=2.0, idle_ttl=60.0
)


def spec(**kw: object) -> SemaphoreSpec:
    options = dict(OPTIONS)
    options.update(kw)
    return SemaphoreSpec("s", 3, **options)  # type: ignore[arg-type]


def test_a_granted_reply() -> None:
    reply = [1, 42, 5000, 4000, 250, b"", 0, [b"h", b"7", b"p", b"0"]]
    grant, handovers = parse_acquire("s", reply)
    assert grant == Grant(42, 5.0, 0.25)
    assert handovers == [Handover("h", 7, "p")]
    grant, _ = parse_acquire("s", [1, 42, 5000, 4000, 250, b"lr", 300, []])
    assert grant == Grant(42, 5.0, 0.25, frozenset({"limit", "rate"}), 0.3)  # shadow limits
    reply = [1, 42, 5000, 4000, 250, b"", 0, [b"h", b"7", b"p", b"1500"]]
    _, handovers = parse_acquire("s", reply)
    assert handovers == [Handover("h", 7, "p", delay=1.5)]  # timed for its slot under a rate


def test_a_refused_reply() -> None:
    reply = [0, 9, 2, 3, 3, 0, 1500, 1000, 300, 80, 0, b"", 0, []]
    place, handovers = parse_acquire("s", reply)
    assert place == Place(9, 2, 3, 3, False, 0.5, 0.3, 0.08)
    assert handovers == []
    place, _ = parse_acquire("s", [0, 9, 2, 3, 3, 0, 0, 1000, 0, 0, 0, b"250000", 1400, []])
    assert isinstance(place, Place)
    assert place.rate_due == 0.25  # its slot under a rate
    assert place.rate_paused_for == 0.4  # a RateLimited pause
    place, _ = parse_acquire("s", [0, 9, 2, 3, 3, 1, 0, 1000, 0, 0, 0, b"", 0, []])
    assert isinstance(place, Place)
    assert (place.draining, place.next_expiry_in, place.hold_estimate) == (True, None, None)
    assert (place.grant_interval, place.resumes_in) == (None, None)
    place, _ = parse_acquire("s", [0, 9, 2, 3, 3, 0, 0, 1000, 0, 0, 3500, b"", 0, []])
    assert isinstance(place, Place)
    assert place.resumes_in == 2.5  # paused after a data loss


def test_an_epoch_reply_is_told_apart_from_every_other_reply() -> None:
    assert epochs.is_epoch_reply([b"celery_semaphore:epoch", b"17", 0, 0, 1000])
    assert not epochs.is_epoch_reply([0, 9, 2, 3, 3, 0, 1500, 1000, 300, 80, 0, b"", 0, []])
    assert not epochs.is_epoch_reply([b"3", []])
    assert not epochs.is_epoch_reply(5)


def test_a_stale_copy_and_an_unknown_code() -> None:
    with pytest.raises(StaleHandover) as info:
        parse_acquire("s", [2, b"77"])
    assert (info.value.name, info.value.token) == ("s", 77)
    with pytest.raises(ValueError, match="unknown code 5"):
        parse_acquire("s", [5])


def test_the_codes_of_claim_and_an_unknown_one() -> None:
    assert [parse_claim([code]) for code in (1, 2, 3, 0)] == [
        Claimed.PUBLISH, Claimed.STALE, Claimed.ABSENT, Claimed.VOID,
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"claim\.lua answered with unknown code 4"):
        parse_claim([4])
    with pytest.raises(ValueError, match="a ClaimReply reply has 1 values, got 2"):
        parse_claim([1, 0])


def test_a_claim_request_is_checked_and_names_the_handover() -> None:
    request = spec().claim("x", Handover("h", 42, "queue q"))
    assert (request.taken, request.handed, request.token) == ("x", "h", 42)
    with pytest.raises(ValueError, match="taken must not contain NUL"):
        spec().claim("x\0", Handover("h", 42, ""))


def test_handovers_come_in_fours() -> None:
    assert parse_dispatch([0, []]) == []
    flat = [b"a", b"1", b"x|y", b"0", "b", "2", "", "20"]
    assert parse_dispatch([0, flat]) == [
        Handover("a", 1, "x|y"),
        Handover("b", 2, "", delay=0.02),
    ]


def test_a_reply_of_another_length_is_refused_naming_its_shape() -> None:
    with pytest.raises(ValueError, match="a Refused reply has 13 values, got 9"):
        read(Refused, [9, 2, 3, 3, 0, 1500, 1000, 300, 80])
    with pytest.raises(ValueError, match="a Granted reply has 7 values, got 4"):
        parse_acquire("s", [1, 42, 5000, 4000, 250])
    with pytest.raises(ValueError, match="a HandoverRow reply has 4 values, got 2"):
        read_all(HandoverRow, [b"a", b"1", b"p", b"0", b"b", b"2"])


def test_the_replies_of_release_renew_configure_dispatch_and_park() -> None:
    handover = [b"h", b"7", b"p", b"0"]
    assert parse_release([1, 250, handover]) == (True, [Handover("h", 7, "p")])
    assert parse_release([0, 0, []]) == (False, [])
    assert parse_renew([5000, [b"a", b"b"], [], 2]) == (5.0, {"a", "b"}, [], 2)
    assert parse_configure([b"3", handover]) == ("3", [Handover("h", 7, "p")])
    assert parse_configure([b"", []]) == (None, [])
    assert parse_dispatch([2, handover]) == [Handover("h", 7, "p")]
    parked, handovers = parse_park([9, 4, []])
    assert (parked.ticket, parked.position, handovers) == (9, 4, [])
    assert parse_enqueue([9, 4, 2, 5, 1, b""], far=False) == (
        Place(9, 4, 2, 5, True, None),
        False,
        [],
    )
    assert parse_enqueue([9, 4, 2, 5, 1, b"1200000"], far=False)[0].rate_due == 1.2
    far = parse_enqueue([9, 4, 2, 5, 1, b"", 1, handover], far=True)
    assert far == (Place(9, 4, 2, 5, True, None), True, [Handover("h", 7, "p")])  # parked


def test_a_place_shows_only_the_limits_that_bind_it() -> None:
    """A shadow limit refuses nothing: the place a refused or enqueued contender gets
    says its limit does not bind (the limit itself is still shown), and, for a shadow
    rate, has no slot and no pause; so nothing waits for them (common_rates.lua's
    line_limit(), line_room())."""
    refused = [0, 9, 4, 2, 5, 0, 0, 1000, 0, 0, 0, b"1200000", 3000, []]

    def seen(sem: SemaphoreSpec, place: object) -> tuple[object, ...]:
        assert isinstance(place, Place)
        place = sem.binding(place)
        return place.limit, place.limit_binds, place.rate_due, place.rate_paused_for

    refused_place = parse_acquire("s", refused)[0]
    assert seen(spec(), refused_place) == (5, True, 1.2, 2.0)
    assert seen(spec(shadow=["limit"]), refused_place) == (5, False, 1.2, 2.0)
    assert seen(spec(shadow=["rate"]), refused_place) == (5, True, None, None)
    enqueued = parse_enqueue([9, 4, 2, 5, 0, b"1200000"], far=False)[0]
    assert seen(spec(shadow=["limit", "rate"]), enqueued) == (5, False, None, None)
    assert seen(spec(), enqueued) == (5, True, 1.2, None)
    joint = [0, 9, b"11", refused[1:], refused[1:]]
    specs = [spec(), spec(shadow=["limit"])]
    places, _ = parse_joint_acquire(specs, joint)
    assert isinstance(places, Places)
    assert [seen(sem, p) for sem, p in zip(specs, places.places, strict=True)] == [
        (5, True, 1.2, 2.0),
        (5, False, 1.2, 2.0),
    ]


def test_waiter_states_in_status() -> None:
    reply = [1000, b"3", b"", 5, 0, 0, 2, [], [b"w1", b"5", b"9000", b"900|i", b"p", b"",
                                              b"w2", b"6", b"9000", b"", b"", b""], 1, 0,
             3, [b"t9", b"800"], 1, 0, b"", b"", 0, 0, 0, 0, 0, 0, [], 0, 0, 0, 0, b""]  # fmt: skip
    status = parse_status("s", reply)
    assert (status.declared_limit, status.override, status.effective_limit) == (3, None, 5)
    assert [(w.holder, w.state, w.position) for w in status.waiters] == [
        ("w1", "parked", 1),
        ("w2", "asking", 2),
    ]
    assert (status.parked_count, status.handed_over_count, status.sent_count) == (1, 0, 3)
    assert [(w.holder, w.state, w.since) for w in status.sent_without_place] == [
        ("t9", "in broker", 0.8)
    ]
    assert status.resumes_at is None
    assert set(WAITER_STATES.values()) == {"parked", "handed over", "waiting in place", "asking"}


def test_fair_keys_in_status() -> None:
    """Each waiter's fair key comes from its weight text (a key may hold bars); a key's
    share is its grants over all fair keys' in the same minutes."""
    waiters = [b"a", b"5", b"9000", b"", b"", b"1|1|0|1|acme|eu",
               b"b", b"6", b"9000", b"", b"", b"2|1",
               b"c", b"7", b"9000", b"", b"", b""]  # fmt: skip
    fair = [b"acme|eu", b"3", b"6", b"zed", b"1", b"0"]
    reply = [1000, b"3", b"", 5, 0, 0, 3, [], waiters, 0, 0, 0, [], 0, 0,
             b"", b"", 0, 0, 0, 2, 8, 2, fair, 0, 0, 0, 0, b""]  # fmt: skip
    status = parse_status("s", reply)
    assert [w.fair_key for w in status.waiters] == ["acme|eu", None, None]
    assert (status.fair_keys_waiting, status.fair_grants, status.fair_keys_read) == (2, 8, 2)
    assert status.fair_keys == [
        FairKeyInfo("acme|eu", 3, 6, 0.75),
        FairKeyInfo("zed", 1, 0, 0.0),
    ]
    no_grants = [*reply[:-8], 0, 1, [b"zed", b"1", b"0"], 0, 0, 0, 0, b""]
    assert parse_status("s", no_grants).fair_keys == [FairKeyInfo("zed", 1, 0, 0.0)]


def test_a_grant_message_admits_its_waiter_only() -> None:
    message = {"data": b"g|task-1|77|5000|120"}
    grant = wake_messages.grant_in(message, "task-1")
    assert grant is not None
    assert (grant.fencing_token, grant.expires_at, grant.waited) == (77, 5.0, 0.12)
    assert wake_messages.grant_in(message, "task-2") is None
    assert not wake_messages.admits(message, 5), "a grant to another wakes nobody else"
    assert wake_messages.grant_in({"data": b"12"}, "task-1") is None
    assert wake_messages.admits({"data": b"12"}, 5) and not wake_messages.admits(
        {"data": b"12"}, 13
    )
    holder_with_bars = wake_messages.grant_in({"data": "g|a|b|3|1000|0"}, "a|b")
    assert holder_with_bars is not None and holder_with_bars.fencing_token == 3


def test_the_dispatch_setting_names_what_a_publisher_needs() -> None:
    assert spec().dispatch is None
    assert arguments.dispatch_text(spec().dispatch) == ""
    publisher = spec(handover_window=0.5, handover_deadline=30.0)
    assert publisher.dispatch == Dispatch(500, 30000, 200)
    assert arguments.dispatch_text(publisher.dispatch) == "500|30000|200"
    with pytest.raises(ValueError, match="on_handover"):
        spec().park("h", None, "payload", park_lease=10, info="", due=None)
    parking = spec(handover_window=1.0)
    request = parking.park("h", 4, "p", park_lease=10, info="i", due=0.0)
    args = arguments.ParkArgs(*arguments.park_args(parking, request))
    assert args.due_ms == 1  # a budget already spent still hands over (in 1 ms)


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(ValueError, match="handover must be None or the positive int"):
        spec().acquire(
            "h", None, queue=True, wait_lease=None, lease_timeout=None, info="", handover=0
        )
    with pytest.raises(TypeError, match="payload must be a str"):
        spec(handover_window=1.0).park("h", None, b"x", park_lease=1, info="", due=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="handover_window"):
        spec(handover_window=-1.0)


def test_pause_never_sleeps_past_the_earliest_lease_end() -> None:
    place = Place(1, 1, 3, 3, False, 0.05)
    assert wakeups.pause(spec(), place, None) == pytest.approx(0.052)
    assert wakeups.pause(spec(), Place(1, 1, 3, 3, False, None), 0.5) == 0.5
    assert wakeups.pause(spec(), Place(1, 1, 3, 3, False, None), None) == 2.0


def test_a_wake_up_admits_tickets_up_to_its_bound() -> None:
    assert wake_messages.admits({"data": b"10"}, 10)
    assert not wake_messages.admits({"data": b"10"}, 11)
    assert wake_messages.admits({"data": b"inf"}, 10**9)
    assert wake_messages.admits({"data": b"garbage"}, 5)  # unreadable: try anyway


def test_a_rate_in_status() -> None:
    reply = [1000, b"3", b"", 5, 0, 0, 0, [], [], 0, 0, 0, [], 0, 0,
             b"50000|1", b"600000|2", 0, 1040, 3000, 0, 0, 0, [], 3, 2, 1500, 4, b"r"]  # fmt: skip
    status = parse_status("s", reply)
    assert status.shadow == {"rate"}
    assert parse_status("s", [*reply[:-1], b"lx"]).shadow == {"limit"}  # x: a later version's
    assert status.rate == RateLimit(20, 1.0)
    assert (status.shadow_limit_refusals, status.shadow_rate_refusals) == (3, 2)
    assert (status.shadow_delay, status.shadow_peak) == (1.5, 4)
    assert status.rate_override == RateLimit(100, 60.0, burst=2)
    assert (status.rate_room, status.next_start_at, status.rate_paused_until) == (0, 1.04, 3.0)


def test_the_scripts_form_of_a_rate() -> None:
    assert spec(rate="20/s").rate_text == "50000|1"
    assert spec().rate_text == ""
    assert SemaphoreSpec("r", None, rate="100/m", **OPTIONS).limit == 1_000_000  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"limit .* or rate .* must be given"):
        SemaphoreSpec("r", None, **OPTIONS)  # type: ignore[arg-type]
    for text in ("20/s", "100/m", "1000/h", "7/s"):
        assert str(RateLimit.decode(parse_rate(text).encode())) == text
    assert str(RateLimit.decode("600000|3")) == "100/m (burst 3)"


def test_shadow_limits_in_the_scripts_form() -> None:
    shadowed = spec(shadow=["rate"])
    request = shadowed.acquire("h", None, queue=True, wait_lease=None, lease_timeout=None, info="")
    assert arguments.AcquireArgs(*arguments.acquire_args(shadowed, request)).shadow == "r"
    assert spec(shadow=("rate", "limit")).shadow_codes == "lr"
    with pytest.raises(ValueError, match="shadow must list only 'limit' and 'rate', got 'cap'"):
        spec(shadow=["cap"])
    with pytest.raises(TypeError, match="shadow must be a list"):
        spec(shadow="rate")


def test_weights_in_the_scripts_form_and_the_ones_that_could_never_be_granted() -> None:
    def weight_of(sem: SemaphoreSpec, **kw: object) -> str:
        request = sem.acquire("h", None, queue=True, wait_lease=None, lease_timeout=None,
                              info="", ask=Ask(**kw))  # type: ignore[arg-type]  # fmt: skip
        assert sem.resolve(Ask(**kw)).text == request.ask.text  # type: ignore[arg-type]
        return arguments.AcquireArgs(*arguments.acquire_args(sem, request)).weight

    limited = SemaphoreSpec(
        "w",
        5,
        rate=RateLimit(10, 1.0, burst=3),
        handover_window=1.0,
        **OPTIONS,  # type: ignore[arg-type]
    )
    assert weight_of(limited) == ""
    assert weight_of(limited, weight=3) == "3|3"
    assert weight_of(limited, weight=5, rate_weight=1) == "5|1"
    with pytest.raises(ValueError, match=r"weight 6 is more than the limit 5 of semaphore 'w'"):
        weight_of(limited, weight=6, rate_weight=1)
    with pytest.raises(ValueError, match=r"rate weight 4 is more than the burst 3 .* burst=4"):
        weight_of(limited, weight=4)
    with pytest.raises(TypeError, match=r"weight must be an int from 1"):
        weight_of(limited, weight=1.5)
    with pytest.raises(ValueError, match=r"rate_weight must be an int from 1"):
        weight_of(limited, rate_weight=0)
    kept = limited.park("h", None, "p", park_lease=1, info="", due=None)
    assert arguments.ParkArgs(*arguments.park_args(limited, kept)).weight == ""
    plain = limited.park("h", None, "p", park_lease=1, info="", due=None, ask=Ask())
    assert arguments.ParkArgs(*arguments.park_args(limited, plain)).weight == "1|1"
    renewal = limited.renew([("h", None, 3), ("g", 7, None)], 1000)
    held = arguments.renew_args(limited, renewal)[len(arguments.RenewArgs._fields) :]
    assert held == [*arguments.Held("h", "", 3), *arguments.Held("g", 7, "")]
    with pytest.raises(ValueError, match="holder must not contain NUL"):
        limited.release("h\0", None)


def test_an_ask_is_given_once_as_a_value_or_as_keywords_with_errors_naming_the_call() -> None:
    from celery_semaphore.core.ask import AskFields, ask_of

    assert ask_of(None, {}, "attempt") == Ask()
    assert ask_of(None, {"fair_key": "A", "fair_weight": 3}, "attempt") == Ask(
        fair_key="A", fair_weight=3
    )
    assert ask_of(Ask(weight=2), {}, "acquire") == Ask(weight=2)
    with pytest.raises(TypeError, match=r"acquire\(\) takes ask= or weight, not both"):
        ask_of(Ask(), {"weight": 2}, "acquire")
    with pytest.raises(TypeError, match=r"attempt\(\) got unexpected keyword arguments wieght"):
        ask_of(None, {"wieght": 2}, "attempt")
    with pytest.raises(TypeError, match=r"park\(ask=...\) must be an Ask, got dict"):
        ask_of({"weight": 2}, {}, "park")  # type: ignore[arg-type]
    assert set(AskFields.__annotations__) == {f for f in Ask.__dataclass_fields__}
    assert Ask(weight=3).starts == 3 and Ask(weight=3, rate_weight=1).starts == 1
