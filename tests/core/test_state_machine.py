"""A Hypothesis state machine drives the real Lua scripts and checks them against a model.

Rules: attempt (queueing or not, with or without presenting an old ticket), release by
id, release and renew through a (possibly stale) Permit object, renew_many, set_limit,
clear_limit, set_draining. The model (holders with their current fencing token, the
line as holder -> ticket) predicts the outcome of every call exactly; after every step
``status()`` must match the model, and the server-side holder count must respect the
limit. Leases are long (10 min) so that time plays no part.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_semaphore import Permit, Place, Semaphore
from devkit.redis_servers import RedisServer

HOLDERS = ("h0", "h1", "h2", "h3", "h4")
holders_st = st.sampled_from(HOLDERS)
LONG = 600.0


class SemaphoreMachine(RuleBasedStateMachine):
    url = ""

    def __init__(self) -> None:
        super().__init__()
        self.sem: Semaphore | None = None

    # ----------------------------------------------------------------- model

    @initialize(limit=st.integers(1, 3))
    def create(self, limit: int) -> None:
        self.sem = Semaphore(
            self.url, f"sm-{uuid.uuid4().hex}", limit, lease_timeout=LONG, waiter_lease=LONG
        )
        self.declared = limit
        self.override: int | None = None
        self.draining = False
        self.holders: dict[str, int] = {}  # holder -> fencing token of its live permit
        self.line: dict[str, int] = {}  # holder -> ticket
        self.permits: list[Permit] = []  # every permit granted so far, many now stale
        self.tickets: dict[str, int] = {}  # the last ticket each holder was given
        self.issued: list[int] = []  # every ticket handed out so far
        self.last_token = 0
        self.last_ticket = 0
        # Holders admitted before the limit was lowered below their number (none evicted).
        self.excess = 0

    @property
    def effective(self) -> int:
        return self.override if self.override is not None else self.declared

    def predict(self, holder: str, presented: int | None) -> tuple[bool, int]:
        """(granted?, contenders ahead) as the scripts must decide it."""
        ticket = self.line.get(holder)
        if presented is not None and (ticket is None or presented < ticket):
            ticket = presented
        if ticket is None:
            ahead = len(self.line)
        else:
            ahead = sum(1 for other in self.line.values() if other < ticket)
        free = 0 if self.draining else self.effective - len(self.holders)
        return holder in self.holders or (free > 0 and ahead < free), ahead

    # ----------------------------------------------------------------- rules

    def _attempt(self, holder: str, queue: bool, presented: int | None) -> None:
        assert self.sem is not None
        expect_grant, ahead = self.predict(holder, presented)
        result = self.sem.attempt(holder, presented, queue=queue)
        if expect_grant:
            assert isinstance(result, Permit), (holder, result)
            assert result.fencing_token > self.last_token
            self.last_token = result.fencing_token
            admitted = holder not in self.holders
            self.holders[holder] = result.fencing_token
            self.line.pop(holder, None)
            self.permits.append(result)
            if admitted:
                assert len(self.holders) <= self.effective, "admitted above the limit"
            return
        assert isinstance(result, Place), (holder, result)
        assert result.position == ahead + 1
        assert (result.holders, result.limit) == (len(self.holders), self.effective)
        assert result.draining == self.draining
        if not queue:
            assert result.ticket == 0
            return
        if holder in self.line or presented is not None:
            known = [t for t in (self.line.get(holder), presented) if t is not None]
            assert result.ticket == min(known)
        else:
            assert result.ticket > self.last_ticket, "tickets must increase"
            self.last_ticket = result.ticket
            self.issued.append(result.ticket)
        self.line[holder] = result.ticket
        self.tickets[holder] = result.ticket

    @rule(holder=holders_st, queue=st.booleans())
    def attempt(self, holder: str, queue: bool) -> None:
        self._attempt(holder, queue, None)

    @precondition(lambda self: self.tickets)
    @rule(data=st.data())
    def attempt_with_old_ticket(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(sorted(self.tickets)))
        self._attempt(holder, True, self.tickets[holder])

    @precondition(lambda self: self.issued)
    @rule(holder=holders_st, data=st.data())
    def attempt_with_any_ticket(self, holder: str, data: st.DataObject) -> None:
        """A ticket is just a place in line: presenting another's (older or newer) works."""
        self._attempt(holder, True, data.draw(st.sampled_from(self.issued)))

    @rule(holder=holders_st)
    def release_by_id(self, holder: str) -> None:
        assert self.sem is not None
        expected = holder in self.holders
        assert self.sem.release(holder) is expected
        self.holders.pop(holder, None)
        self.line.pop(holder, None)

    def _current(self, permit: Permit) -> bool:
        return self.holders.get(permit.holder) == permit.fencing_token

    @precondition(lambda self: self.permits)
    @rule(data=st.data())
    def release_permit(self, data: st.DataObject) -> None:
        permit = data.draw(st.sampled_from(self.permits))
        expected = self._current(permit)
        assert permit.release() is expected
        if expected:
            del self.holders[permit.holder]

    @precondition(lambda self: self.permits)
    @rule(data=st.data())
    def renew_permit(self, data: st.DataObject) -> None:
        permit = data.draw(st.sampled_from(self.permits))
        assert permit.renew() is self._current(permit)

    @rule(chosen=st.sets(holders_st))
    def renew_many(self, chosen: set[str]) -> None:
        assert self.sem is not None
        assert self.sem.renew_many(sorted(chosen)) == chosen - set(self.holders)

    def _limit_changed(self) -> None:
        self.excess = len(self.holders) if len(self.holders) > self.effective else 0

    @rule(limit=st.integers(1, 4))
    def set_limit(self, limit: int) -> None:
        assert self.sem is not None
        assert self.sem.set_limit(limit) == self.override
        self.override = limit
        self._limit_changed()

    @rule()
    def clear_limit(self) -> None:
        assert self.sem is not None
        assert self.sem.clear_limit() == self.override
        self.override = None
        self._limit_changed()

    @rule(draining=st.booleans())
    def set_draining(self, draining: bool) -> None:
        assert self.sem is not None
        assert self.sem.set_draining(draining) is self.draining
        self.draining = draining

    # ------------------------------------------------------------ invariants

    @invariant()
    def server_matches_model(self) -> None:
        if self.sem is None:
            return
        status = self.sem.status()
        # The semaphore invariant, read from the server alone.
        assert status.holder_count <= max(status.effective_limit, self.excess)
        assert {h.holder: h.fencing_token for h in status.holders} == self.holders
        in_line = sorted(self.line, key=lambda h: (self.line[h], h))  # ZSET order
        assert [w.holder for w in status.waiters] == in_line, "the line is not in FIFO order"
        assert [w.ticket for w in status.waiters] == [self.line[h] for h in in_line]
        assert (status.holder_count, status.waiter_count) == (len(self.holders), len(self.line))
        assert (status.override, status.effective_limit) == (self.override, self.effective)
        assert status.draining is self.draining

    def teardown(self) -> None:
        if self.sem is not None:
            self.sem.client.delete(*self.sem.keys.script_keys)
            self.sem.close()


@pytest.mark.slow
def test_semaphore_scripts_follow_the_model(redis_session_server: RedisServer) -> None:
    class Machine(SemaphoreMachine):
        url = redis_session_server.url

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=50,
            stateful_step_count=30,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
