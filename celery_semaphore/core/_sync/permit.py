# Generated from celery_semaphore/core/_async/permit.py by scripts/unasync.py:
# do not edit; edit the asyncio source and run the script.
"""A granted permit (`Permit`): what a holder releases, renews or gives back unused."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from celery_semaphore.core.constants import KEPT, RELEASED

if TYPE_CHECKING:
    from celery_semaphore.core._sync.semaphore import Semaphore


class Permit:
    """A granted permit. Use as a context manager to release on exit.

    ``fencing_token`` is strictly increasing per semaphore: pass it to the
    protected resource so it can reject writes from a holder whose lease ran out.
    ``shadow_refused``: the semaphore's shadow limits ("limit", "rate") that would
    have refused this grant, had they been enforced; ``shadow_wait``: how long the
    shadow rate would have made it wait (seconds).
    """

    def __init__(
        self,
        semaphore: Semaphore,
        holder: str,
        fencing_token: int,
        expires_at: float,
        waited: float = 0.0,
        *,
        shadow_refused: frozenset[str] = frozenset(),
        shadow_wait: float = 0.0,
        weight: int = 1,
        rate_weight: int = 1,
    ) -> None:
        self.semaphore = semaphore
        self.holder = holder
        self.fencing_token = fencing_token
        self.expires_at = expires_at
        self.waited = waited
        self.shadow_refused = shadow_refused
        self.shadow_wait = shadow_wait
        #: The permits it holds, and the rate's grants its grant spent.
        self.weight = weight
        self.rate_weight = rate_weight

    def release(self) -> bool:
        """Give the permit back; False if it was already released or lost."""
        return self.semaphore._release(self.holder, self.fencing_token)

    def give_back_unused(self) -> bool:
        """Give the permit back before using it (another limit refused what it was
        for): under a rate, its grants are given back too, as if never made."""
        return self.semaphore._release(self.holder, self.fencing_token, unused=self.rate_weight)

    def keep(self, kept_as: str, info: str = "") -> Permit | bool:
        """Its task ended: keep the permit for this process's next task, as holder
        ``kept_as`` (same token and lease: the kept permit is returned), if nobody waits
        for the semaphore and it has no rate and no shadow limit; else give it back
        (whether it was released, as `release`). The keeper renews the kept permit, and
        gives it back when a line forms, when idle, and when it stops
        (`celery_semaphore.kept_permits`)."""
        code = self.semaphore._keep(self, kept_as, info)
        if code != KEPT:
            return code == RELEASED
        return Permit(
            self.semaphore, kept_as, self.fencing_token, self.expires_at,
            weight=self.weight, rate_weight=self.rate_weight,
        )  # fmt: skip

    def renew(self, lease_timeout: float | None = None) -> bool:
        """Extend the lease from now; False once the permit is lost (never resurrects it)."""
        held = [(self.holder, self.fencing_token, self.weight)]
        lost = self.semaphore._renew(held, lease_timeout, [self])
        return self.holder not in lost

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"Permit(semaphore={self.semaphore.name!r}, holder={self.holder!r}, "
            f"fencing_token={self.fencing_token})"
        )
