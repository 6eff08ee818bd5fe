"""A Hypothesis state machine: random sequences of the public operations on a store's
semaphore and on the reference model, every reply compared (`Pair`), and ``status()``
compared after every step.

Each example draws one semaphore: a limit, maybe a rate (slow: time plays no part),
maybe shadow limits, and either a fair line (every contender has a fair key, as the
docs ask) or priorities. Leases are long; expiry is the scenarios' business. On a store
that publishes wake messages, contenders may wait in place, and every call's messages
are compared too.
"""

from __future__ import annotations

from collections.abc import Callable

from conformance_driver import Pair, Store, wake_channel
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_semaphore import RateLimit
from celery_semaphore.core.model import State

HOLDERS = ("h0", "h1", "h2", "h3", "h4")
holders_st = st.sampled_from(HOLDERS)


class ConformanceMachine(RuleBasedStateMachine):
    make_store: Callable[[], Store]

    def __init__(self) -> None:
        super().__init__()
        self.pair: Pair | None = None
        self.other: Pair
        self.keys: dict[str, str | None] = dict.fromkeys(HOLDERS)
        self.priorities: dict[str, int] = dict.fromkeys(HOLDERS, 0)
        self.heaviest = 1
        self.has_rate = False
        self.publishing = False

    @initialize(
        limit=st.integers(1, 3),
        burst=st.none() | st.integers(1, 3),
        shadow=st.sampled_from([(), ("limit",), ("rate",), ("limit", "rate")]),
        fair=st.booleans(),
        publishing=st.booleans(),
        data=st.data(),
    )
    def create(
        self,
        *,
        limit: int,
        burst: int | None,
        shadow: tuple[str, ...],
        fair: bool,
        publishing: bool,
        data: st.DataObject,
    ) -> None:
        rate = None if burst is None else RateLimit(2, 60.0, burst=burst)
        self.has_rate = rate is not None
        if fair:
            self.keys = {h: data.draw(st.sampled_from(["k1", "k2"])) for h in HOLDERS}
        self.priorities = {h: data.draw(st.sampled_from([0, 0, 1, -1])) for h in HOLDERS}
        self.heaviest = min(2, limit, burst or 2)
        self.pair = Pair(
            self.make_store(), limit, rate=rate, shadow=shadow, fair_weights={"k2": 2},
            handover_window=1.0 if publishing else None,
        )  # fmt: skip
        self.publishing = publishing
        self.pair.wakes = wake_channel(self.pair.sem)
        # Another client of the same semaphore that declares a larger limit.
        self.other = self.pair.sibling(limit + 1, rate=rate, fair_weights={"k2": 2})

    @property
    def p(self) -> Pair:
        assert self.pair is not None
        return self.pair

    def _attempt(
        self,
        holder: str,
        ticket: int | None,
        queue: bool,
        weight: int,
        *,
        other: bool = False,
        in_place: bool = False,
    ) -> None:
        (self.other if other else self.p).attempt(
            holder, ticket, queue=queue, weight=min(weight, self.heaviest),
            priority=self.priorities[holder], fair_key=self.keys[holder], in_place=in_place,
        )  # fmt: skip

    @rule(holder=holders_st, queue=st.booleans(), weight=st.integers(1, 2))
    def attempt(self, holder: str, queue: bool, weight: int) -> None:
        self._attempt(holder, None, queue, weight)

    @precondition(lambda self: self.pair is not None and self.pair.wakes is not None)
    @rule(holder=holders_st, weight=st.integers(1, 2))
    def attempt_in_place(self, holder: str, weight: int) -> None:
        """A waiter blocked in wait_for_turn: a release may grant it in place."""
        self._attempt(holder, None, True, weight, in_place=True)

    @rule(holder=holders_st)
    def attempt_as_another_client(self, holder: str) -> None:
        """A client that declares another limit is held to its own (effective_limit())."""
        self._attempt(holder, None, True, 1, other=True)

    @precondition(lambda self: self.pair is not None and self.pair.tickets.to_model)
    @rule(holder=holders_st, data=st.data())
    def attempt_with_a_ticket(self, holder: str, data: st.DataObject) -> None:
        """A ticket is a place in line: its own, or another's (older or newer)."""
        ticket = data.draw(st.sampled_from(sorted(self.p.tickets.to_model)))
        self._attempt(holder, ticket, True, 1)

    @rule(holder=holders_st, weight=st.integers(1, 2))
    def take_place(self, holder: str, weight: int) -> None:
        self.p.take_place(
            holder, weight=min(weight, self.heaviest), priority=self.priorities[holder],
            fair_key=self.keys[holder],
        )  # fmt: skip

    @rule(holder=holders_st)
    def release_by_id(self, holder: str) -> None:
        self.p.release(holder)

    @precondition(lambda self: self.pair is not None and self.pair.permits)
    @rule(data=st.data(), unused=st.booleans())
    def release_permit(self, data: st.DataObject, unused: bool) -> None:
        self.p.release_permit(data.draw(st.integers(0, len(self.p.permits) - 1)), unused=unused)

    @precondition(lambda self: self.pair is not None and self.pair.permits)
    @rule(data=st.data())
    def renew_permit(self, data: st.DataObject) -> None:
        self.p.renew_permit(data.draw(st.integers(0, len(self.p.permits) - 1)))

    @rule(chosen=st.sets(holders_st))
    def renew_many(self, chosen: set[str]) -> None:
        self.p.renew_many(sorted(chosen))

    @rule(limit=st.none() | st.integers(1, 4))
    def set_limit(self, limit: int | None) -> None:
        self.p.set_limit(limit)

    @rule(draining=st.booleans())
    def set_draining(self, draining: bool) -> None:
        self.p.set_draining(draining)

    @precondition(lambda self: self.publishing)
    @rule(holder=holders_st, data=st.data())
    def park(self, holder: str, data: st.DataObject) -> None:
        """Park with its own place, another's ticket, or none yet."""
        tickets = sorted(self.p.tickets.to_model)
        ticket = data.draw(st.none() | st.sampled_from(tickets)) if tickets else None
        self.p.park(
            holder, f"message of {holder}", ticket, priority=self.priorities[holder],
            fair_key=self.keys[holder],
        )  # fmt: skip

    @precondition(lambda self: self.publishing)
    @rule(holder=holders_st, window=st.sampled_from([0.0, 1.0, 100.0]))
    def take_place_or_park(self, holder: str, window: float) -> None:
        self.p.take_place_or_park(
            holder, f"message of {holder}", window=window, priority=self.priorities[holder],
            fair_key=self.keys[holder],
        )  # fmt: skip

    @precondition(lambda self: self.pair is not None and self.pair.copies)
    @rule(data=st.data())
    def a_copy_arrives(self, data: st.DataObject) -> None:
        """A handed-over copy arrives: the latest, or an older one (stale)."""
        holder = data.draw(st.sampled_from(sorted(self.p.copies)))
        token = data.draw(st.sampled_from(self.p.copies[holder]))
        self.p.attempt(
            holder, handover=token, priority=self.priorities[holder], fair_key=self.keys[holder]
        )

    @precondition(lambda self: self.pair is not None and self.pair.copies)
    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        """The process given a handover (mostly the latest) took a message from a
        parking queue: the handover's own, another parked waiter's (a swap), or one of
        a task not parked."""
        handed = data.draw(st.sampled_from(sorted(self.p.copies)))
        copies = self.p.copies[handed]
        token = data.draw(st.sampled_from(copies[-1:]) | st.sampled_from(copies))
        parking = self.p.model.parking  # whose messages a parking queue may hold
        queued = (State.PARKED, State.HANDED)
        others = [h for h in HOLDERS if h != handed and parking.state_of(h) in queued]
        taken = data.draw(st.sampled_from(others or [handed]) | st.just(handed) | holders_st)
        self.p.claim(taken, handed, token)

    @precondition(lambda self: self.publishing)
    @rule(drop=st.sets(holders_st, max_size=2))
    def dispatch(self, drop: set[str]) -> None:
        self.p.dispatch(tuple(sorted(drop)))

    @precondition(lambda self: self.has_rate)
    @rule(rate=st.sampled_from([None, "1/m", "3/m"]))
    def set_rate(self, rate: str | None) -> None:
        self.p.set_rate(rate)

    @precondition(lambda self: self.has_rate)
    @rule()
    def pause_rate(self) -> None:
        self.p.pause_rate(120.0)

    @invariant()
    def store_matches_model(self) -> None:
        if self.pair is not None:
            self.pair.check()

    def teardown(self) -> None:
        """Each example closes its store: the PostgreSQL store's connections would
        otherwise outnumber what the server allows over 60 examples."""
        if self.pair is not None:
            self.pair.close()
            self.pair.store.close()


def test_the_store_follows_the_model(store_factory: Callable[[], Store]) -> None:
    class Machine(ConformanceMachine):
        make_store = staticmethod(store_factory)

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=60,
            stateful_step_count=40,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
            # No "explain" phase: it re-runs a failure many times against a live store.
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        ),
    )
