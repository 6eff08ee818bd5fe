"""room_at_publish: when new tasks skip their place at publish, and the ticket they carry."""

from __future__ import annotations

import os
import time

import pytest

from celery_semaphore.core import Place
from celery_semaphore.core.rates import parse_rate
from celery_semaphore.core.results import SemaphoreCounts
from celery_semaphore.formats import Gate
from celery_semaphore.room_at_publish import MIN_FREE, WINDOW, RoomAtPublish

GATE = Gate("api", 100)


def place(
    position: int = 1, holders: int = 0, limit: int = 100, ticket: int = 0, **more: object
) -> Place:
    fields: dict[str, object] = {"draining": False, "next_expiry_in": None, **more}
    ticket = ticket or time.time_ns() // 1000 + 5_000  # the server's clock 5 ms ahead
    return Place(ticket, position, holders, limit, **fields)  # type: ignore[arg-type]


def skipped(room: RoomAtPublish, gate: Gate = GATE) -> int:
    count = 0
    while room.skip(gate) is not None:
        count += 1
    return count


def test_a_quarter_of_the_free_permits_beyond_the_places_ahead() -> None:
    room = RoomAtPublish()
    assert room.skip(GATE) is None, "nothing seen yet: take a place"
    room.saw(GATE, place(position=11, holders=10))  # 100 - 10 held - 10 ahead - its own
    assert skipped(room) == 79 // 4
    room.saw(GATE, place(position=1, holders=0))
    assert skipped(room) == 99 // 4, "a new look replaces the old"


def test_the_ticket_is_the_publish_time_on_the_servers_clock() -> None:
    room = RoomAtPublish()
    room.saw(GATE, place())
    before = time.time_ns() // 1000
    ticket = room.skip(GATE)
    after = time.time_ns() // 1000
    assert ticket is not None
    assert before + 5_000 - 50_000 <= ticket <= after + 5_000, "our clock plus the offset"
    later = room.skip(GATE)
    assert later is not None and later >= ticket, "later tasks, later tickets"


@pytest.mark.parametrize(
    "seen",
    [
        place(holders=100 - MIN_FREE + 1),  # too few free
        place(position=100 - MIN_FREE + 2),  # the places ahead take them
        place(draining=True),
        place(resumes_in=3.0),  # paused after a data loss
    ],
)
def test_no_room_takes_a_place(seen: Place) -> None:
    room = RoomAtPublish()
    room.saw(GATE, place())
    room.saw(GATE, seen)
    assert room.skip(GATE) is None, "and a look without room forgets the one before"


@pytest.mark.parametrize(
    "gate",
    [
        Gate("api", 100, rate=parse_rate("10/s")),
        Gate("api", 100, weight=2),
        Gate("api", 100, priority=3),
        Gate("api", 100, fair_key="acme"),
        Gate("api", 100, shadow=frozenset({"limit"})),
    ],
)
def test_lines_ordered_by_more_than_time_always_take_places(gate: Gate) -> None:
    room = RoomAtPublish()
    room.saw(gate, place())
    assert room.skip(gate) is None
    assert room.needs_look(GATE), "nothing seen of the line as one ordered by time"


def test_a_place_ordered_by_more_than_time_leaves_the_tickets_alone() -> None:
    """On Redis a priority of 5 puts a ticket 5 x 2^40 µs (64 days) ahead of the
    clock: the tickets given without a place must not follow it."""
    room = RoomAtPublish()
    room.saw(GATE, place())
    urgent = place(ticket=time.time_ns() // 1000 + 5 * 2**40)
    room.saw(Gate("api", 100, priority=-5), urgent)
    ticket = room.skip(GATE)
    assert ticket is not None and ticket - time.time_ns() // 1000 < 1_000_000


def test_a_look_lasts_a_window() -> None:
    room = RoomAtPublish()
    room.saw(GATE, place())
    room._rooms[GATE.name].until = time.monotonic() - 0.001
    assert room.skip(GATE) is None
    assert WINDOW <= 1.0, "a short look: the line may change"


def test_other_semaphores_have_their_own_room() -> None:
    room = RoomAtPublish()
    room.saw(GATE, place())
    assert room.skip(Gate("other", 100)) is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_without_room() -> None:
    room = RoomAtPublish()
    room.saw(GATE, place())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, b"1" if room.skip(GATE) is None else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1", "the parent's room is the parent's"
    assert room.skip(GATE) is not None


def counts(limit: int = 100, held: int = 0, waiting: int = 0, **more: object) -> SemaphoreCounts:
    fields: dict[str, object] = {
        "name": "api", "declared_limit": limit, "effective_limit": limit, "draining": False,
        "holder_count": held, "waiter_count": waiting, "server_time": time.time() + 0.005,
        "parked_count": 0, "handed_over_count": 0, "sent_count": 0, "rate": None,
        "rate_paused_until": None, "fair_keys_waiting": 0, "kept_count": 0, "fields": {},
        **more,
    }  # fmt: skip
    return SemaphoreCounts(**fields)  # type: ignore[arg-type]


def test_a_look_at_the_counts_finds_the_room_without_a_place() -> None:
    room = RoomAtPublish()
    assert room.needs_look(GATE)
    room.looked(GATE, counts(held=10, waiting=10))  # 80 free beyond the line
    assert not room.needs_look(GATE), "one look a window"
    assert skipped(room) == 20
    room._rooms[GATE.name].until = time.monotonic() - 0.001
    assert room.needs_look(GATE), "the window over: look again"


@pytest.mark.parametrize(
    "seen", [None, counts(held=95), counts(draining=True), counts(rate=parse_rate("5/s"))]
)
def test_a_look_without_room_takes_places_for_a_window(seen: SemaphoreCounts | None) -> None:
    room = RoomAtPublish()
    room.looked(GATE, seen)  # None: no semaphore of that name yet
    assert room.skip(GATE) is None
    assert not room.needs_look(GATE), "no look on every publish of a full line"


def test_a_line_ordered_by_more_than_time_needs_no_look() -> None:
    assert not RoomAtPublish().needs_look(Gate("api", 100, priority=1))


def test_tickets_given_never_go_below_one_seen() -> None:
    """A server clock read a millisecond late (counts carry ms) must not put a task
    published after a place ahead of it."""
    room = RoomAtPublish()
    ahead = place()
    room.saw(GATE, ahead)
    room.looked(GATE, counts(server_time=time.time() - 1.0))  # a second behind
    ticket = room.skip(GATE)
    assert ticket is not None and ticket > ahead.ticket


def test_a_small_cap_never_looks() -> None:
    assert not RoomAtPublish().needs_look(Gate("api", MIN_FREE - 1))
