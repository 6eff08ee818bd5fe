"""A waiter blocked in ``wait_for_turn`` is handed the permit by the release itself.

The release script grants the first waiters in line that wait in place (marked
when they subscribe to the wake channel) and tells each on the channel; the
waiter starts without another round trip. Run against the sync and the asyncio
semaphore (``make_semaphore``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from outcomes import granted, refused, wait_for

from celery_semaphore import Place, Semaphore, SemaphoreConnectionError
from devkit.redis_servers import RedisServer

MakeSemaphore = Callable[..., Any]


class InThread(threading.Thread):
    """Runs ``call()`` in a thread; keeps what it returned or raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as error:
            self.error = error

    def outcome(self, timeout: float = 10.0) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "still blocked"
        assert self.error is None, repr(self.error)
        return self.result


def waiting(sem: Any, holder: str, timeout: float) -> InThread:
    """``sem.wait_for_turn(timeout, holder)`` in a thread."""
    return InThread(lambda: sem.wait_for_turn(timeout, holder))


def acquiring(sem: Any, holder: str, timeout: float) -> InThread:
    """``sem.acquire(timeout, holder)`` in a thread."""
    return InThread(lambda: sem.acquire(timeout, holder))


def states(sem: Any) -> dict[str, str]:
    return {w.holder: w.state for w in sem.status().waiters}


class Grants:
    """What is published on a semaphore's wake channel (a spy subscriber)."""

    def __init__(self, url: str, name: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(Semaphore(self.client, name, 1).keys.channel)
        self.messages: list[str] = []

    def read(self, seconds: float = 0.3) -> list[str]:
        """The grants published so far (reading for ``seconds``)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.05)
            if message is not None:
                self.messages.append(message["data"].decode())
        return [m for m in self.messages if m.startswith("g|")]

    def close(self) -> None:
        self.pubsub.close()
        self.client.close()


@pytest.fixture
def grants(redis_session_server: RedisServer) -> Any:
    made: list[Grants] = []

    def spy(name: str) -> Grants:
        made.append(Grants(redis_session_server.url, name))
        return made[-1]

    yield spy
    for spy_ in made:
        spy_.close()


def test_the_release_hands_the_permit_to_the_waiter_in_place(
    make_semaphore: MakeSemaphore, grants: Any
) -> None:
    sem = make_semaphore(1, name=f"inplace-{time.time_ns()}")
    spy = grants(sem.name)
    holder = granted(sem.attempt("holder"))
    waiter = waiting(sem, "waiter", 10)
    waiter.start()
    wait_for(lambda: states(sem) == {"waiter": "waiting in place"}, what="the mark")
    assert holder.release() is True
    permit = granted(waiter.outcome())
    (message,) = spy.read()
    _, who, token, _expires, _waited = message.split("|")
    assert (who, int(token)) == ("waiter", permit.fencing_token)  # the release's grant
    assert [h.holder for h in sem.status().holders] == ["waiter"]
    assert sem.status().waiters == []
    assert permit.release() is True


def test_a_waiter_that_gave_up_is_not_granted_by_a_release(make_semaphore: MakeSemaphore) -> None:
    """After wait_for_turn timed out the waiter is still in line, but no longer
    listening: a release must leave the permit free for it to ask."""
    sem = make_semaphore(1)
    holder = granted(sem.attempt("holder"))
    place = waiting(sem, "waiter", 0.3)
    place.start()
    assert isinstance(place.outcome(), Place)
    assert states(sem) == {"waiter": "asking"}
    assert holder.release() is True
    status = sem.status()
    assert (status.holder_count, [w.holder for w in status.waiters]) == (0, ["waiter"])
    granted(sem.attempt("waiter"))


def test_a_release_grants_in_line_order_and_never_past_a_waiter_that_is_not_in_place(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    holder = granted(sem.attempt("holder"))
    refused(sem.attempt("first", wait_lease=30))  # asks, then goes away for a while
    waiter = waiting(sem, "second", 1.0)
    waiter.start()
    wait_for(lambda: states(sem).get("second") == "waiting in place", what="the mark")
    assert holder.release() is True
    assert isinstance(waiter.outcome(), Place), "the second overtook the first"
    assert sem.status().holder_count == 0
    granted(sem.attempt("first"))


def test_several_permits_freed_at_once_go_to_the_waiters_in_place_in_order(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(3)
    held = [granted(sem.attempt(f"h{i}")) for i in range(3)]
    waiters = []
    for i in range(2):
        waiters.append(waiting(sem, f"w{i}", 10))
        waiters[-1].start()
        wait_for(lambda i=i: states(sem).get(f"w{i}") == "waiting in place", what="the mark")
    sem.set_limit(5)  # two more permits at once: both waiters granted, in order
    permits = [granted(w.outcome()) for w in waiters]
    assert permits[0].fencing_token < permits[1].fencing_token
    assert sem.status().holder_count == 5
    for permit in [*held, *permits]:
        permit.release()


def test_permits_freed_for_more_waiters_in_place_than_one_read_go_in_order_up_to_the_limit(
    make_semaphore: MakeSemaphore,
) -> None:
    # The release reads the line's head a few waiters at a time (common_after_free.lua's
    # grant_in_place, GRANT_CHUNK = 16): 20 waiters in place and 19 permits freed at
    # once cross a read's end; the first 19 are granted in line order, the 20th waits.
    sem = make_semaphore(1)
    held = granted(sem.attempt("h"))
    waiters = []
    for i in range(20):
        waiters.append(waiting(sem, f"w{i}", 10))
        waiters[-1].start()
        wait_for(lambda i=i: states(sem).get(f"w{i}") == "waiting in place", what="the mark")
    sem.set_limit(20)
    permits = [granted(w.outcome()) for w in waiters[:19]]
    tokens = [p.fencing_token for p in permits]
    assert tokens == sorted(tokens)
    assert states(sem) == {"w19": "waiting in place"}
    held.release()  # the 20th gets the last permit
    permits.append(granted(waiters[19].outcome()))
    assert sem.status().holder_count == 20
    for permit in permits:
        permit.release()


def test_an_interrupted_wait_in_place_leaves_no_permit_and_no_place(
    make_semaphore: MakeSemaphore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anything raised while waiting in place (a soft time limit) drops the place,
    and gives back a permit the release granted meanwhile."""
    sem = make_semaphore(1)
    target = getattr(sem, "async_semaphore", sem)  # the asyncio one behind the wrapper
    holder = granted(sem.attempt("holder"))

    class Interrupt(Exception):
        pass

    real_sleep = target.store.wait_for_wakeup

    if target is sem:

        def interrupted(*args: Any, **kwargs: Any) -> Any:
            real_sleep(*args, **kwargs)  # returns with the grant
            raise Interrupt

    else:

        async def interrupted(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            await real_sleep(*args, **kwargs)
            raise Interrupt

    monkeypatch.setattr(target.store, "wait_for_wakeup", interrupted)
    waiter = waiting(sem, "waiter", 10)
    waiter.start()
    wait_for(lambda: states(sem) == {"waiter": "waiting in place"}, what="the mark")
    assert holder.release() is True  # grants the waiter, which is then interrupted
    waiter.join(10)
    assert isinstance(waiter.error, Interrupt)
    status = sem.status()
    assert (status.holder_count, status.waiter_count) == (0, 0)


def test_waits_in_place_one_after_another_reuse_one_connection_that_idles_unsubscribed(
    make_semaphore: MakeSemaphore, redis_session_server: RedisServer
) -> None:
    """A wait that ends leaves its pub/sub connection, unsubscribed, to the next wait of
    the process (core/listeners.py) instead of closing it: later waits open no
    connection, and between waits Redis sends the kept one nothing."""
    sem = make_semaphore(1)
    observer = redis.Redis.from_url(redis_session_server.url)
    channel = Semaphore(observer, sem.name, 1).keys.channel

    def one_wait(i: int) -> None:
        holder = granted(sem.attempt(f"h{i}"))
        waiter = waiting(sem, f"w{i}", 10)
        waiter.start()
        wait_for(lambda: states(sem) == {f"w{i}": "waiting in place"}, what="the mark")
        assert holder.release() is True
        assert granted(waiter.outcome()).release() is True

    one_wait(0)  # the client's pool and the first pub/sub connection are made
    before = observer.info("stats")["total_connections_received"]
    for i in range(1, 6):
        one_wait(i)
    # One spare for the pool's own growth; a new connection per wait would be five.
    assert observer.info("stats")["total_connections_received"] - before <= 1
    idle = [(channel.encode(), 0)]
    wait_for(lambda: observer.pubsub_numsub(channel) == idle, what="unsubscribed")
    observer.close()


def test_a_wait_given_the_callers_refusal_listens_without_asking_first(
    make_semaphore: MakeSemaphore, redis_session_server: RedisServer
) -> None:
    """``refused=``: the caller has just been refused (the worker's admission), so the
    wait subscribes and asks in place at once: one script call fewer."""
    sem = make_semaphore(1)
    observer = redis.Redis.from_url(redis_session_server.url)

    def script_calls() -> int:
        stats = observer.info("commandstats")
        return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("fcall", "evalsha"))

    holder = granted(sem.attempt("holder"))
    counts = []
    for refusal in (None, refused(sem.attempt("waiter"))):
        before = script_calls()
        assert isinstance(sem.wait_for_turn(0.2, "waiter", refused=refusal), Place)
        counts.append(script_calls() - before)
    assert counts == [3, 2]  # (ask,) ask in place, the last ask after 0.2 s
    with pytest.raises(TypeError, match="refused must be the Place that attempt"):
        sem.wait_for_turn(0.2, "waiter", refused=3)
    holder.release()
    observer.close()


def test_an_interrupted_wait_in_place_closes_its_connection(
    make_semaphore: MakeSemaphore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something raised in the middle of a read may leave a reply half read: that
    connection is closed, never kept for the next wait."""
    from celery_semaphore.core.redis.listeners import LISTENERS

    sem = make_semaphore(1)
    target = getattr(sem, "async_semaphore", sem)
    holder = granted(sem.attempt("holder"))

    class Interrupt(Exception):
        pass

    if target is sem:

        def interrupted(*args: Any, **kwargs: Any) -> Any:
            raise Interrupt

    else:

        async def interrupted(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            raise Interrupt

    monkeypatch.setattr(target.store, "wait_for_wakeup", interrupted)
    waiter = waiting(sem, "waiter", 10)
    waiter.start()
    waiter.join(10)
    assert isinstance(waiter.error, Interrupt)
    assert LISTENERS.take(target.client) is None
    monkeypatch.undo()
    again = waiting(sem, "again", 0.2)  # an ordinary wait that ends keeps its connection
    again.start()
    assert isinstance(again.outcome(), Place)
    assert LISTENERS.take(target.client) is not None
    holder.release()


def test_a_release_grants_within_the_limit_its_caller_declares(
    make_semaphore: MakeSemaphore,
) -> None:
    """The recorded limit is the last contender's declaration; the direct grant of a
    release, like an acquire, obeys the limit of the client that calls it."""
    name = f"declared-{time.time_ns()}"
    sem = make_semaphore(1, name=name)
    wider = make_semaphore(3, name=name)
    holder = granted(sem.attempt("holder"))
    waiter = waiting(sem, "waiter", 1.0)
    waiter.start()
    wait_for(lambda: states(sem) == {"waiter": "waiting in place"}, what="the mark")
    other = granted(wider.attempt("other"))  # records limit 3, holds the second permit
    assert sem.status().declared_limit == 3
    assert holder.release() is True  # limit 1, one holder left: nothing to grant
    assert isinstance(waiter.outcome(), Place)
    assert [h.holder for h in sem.status().holders] == ["other"]
    other.release()


def test_a_place_taken_at_publish_does_not_change_the_recorded_limit(
    make_semaphore: MakeSemaphore,
) -> None:
    """The place reports the publisher's own declaration (the one rule of
    effective_limit() in common_meta.lua); the recorded one stays the contenders'."""
    name = f"recorded-{time.time_ns()}"
    worker_side = make_semaphore(2, name=name)
    publisher = make_semaphore(5, name=name)
    granted(worker_side.attempt("a")).release()
    place = publisher.take_place("p", wait_lease=30)
    assert (place.limit, publisher.status().declared_limit) == (5, 2)


def test_a_blocked_acquire_rides_out_a_redis_restart(make_semaphore: MakeSemaphore) -> None:
    """Redis restarts (its data lost) under a waiting acquire(): the waiter
    reconnects, asks again with its ticket and gets the permit the restart freed."""
    with RedisServer() as server:
        sem = make_semaphore(1, url=server.url)
        granted(sem.attempt("holder"))
        acquirer = acquiring(sem, "waiter", 20)
        acquirer.start()
        wait_for(lambda: states(sem) == {"waiter": "waiting in place"}, what="the mark")
        server.restart()
        acquirer.join(20)
        assert acquirer.error is None, repr(acquirer.error)
        permit = granted(acquirer.result)
        assert [h.holder for h in sem.status().holders] == ["waiter"]
        permit.release()


def test_a_blocked_acquire_gives_up_at_its_timeout_when_redis_stays_away(
    make_semaphore: MakeSemaphore,
) -> None:
    with RedisServer() as server:
        sem = make_semaphore(1, url=server.url)
        granted(sem.attempt("holder"))
        acquirer = acquiring(sem, "waiter", 1.5)
        acquirer.start()
        wait_for(lambda: states(sem) == {"waiter": "waiting in place"}, what="the mark")
        server.stop()
        began = time.monotonic()
        acquirer.join(10)
        assert not acquirer.is_alive(), "still waiting long after its timeout"
        assert isinstance(acquirer.error, SemaphoreConnectionError), repr(acquirer.error)
        assert time.monotonic() - began < 5
