"""Data loss: the epoch of the data and the pause after a loss (lua/common_epoch.lua:
settle_epoch(), begin(); renew.lua writes the running holders back while paused).

The epoch hash goes only with the data: a restart without persistence, a failover to a
replica that lagged or a flush takes it along with every semaphore's keys. A client
presents the epoch it last saw; one that finds its epoch gone has seen the data lost.
The model is driven by one process, as the conformance suite is: `Epochs` also keeps
the epoch that process knows (``celery_semaphore.core.redis.epochs`` keeps it per
process, per Redis and epoch key), which its calls present.

Timeline of a loss (pause P, the caller's ``pause_after_loss``)::

    t0  the data goes (`SemaphoreModel.lose_data`)
    t1  a call presents the epoch it knew: gone -> a new epoch, lost at t1,
        resumes at t1 + P; the caller learns it and runs: paused
    ..  nothing is granted or handed over; renewals write their holders back
        (token 0 for one renewed by id; `restored` counts them)
    t1 + P  the line resumes in order, under the limit, with the holders written back
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EpochHash:
    """The epoch hash (KEYS[10]): the ``epoch`` that names the data (the µs it was made),
    when the data was found lost and when admissions resume (ms; 0: none), and the
    holders written back since (``restored``; an HINCRBY, less those that asked
    again: a holder restored by id alone may have been a waiter)."""

    epoch: int
    lost_ms: int = 0
    resumes_ms: int = 0
    restored: int = 0


@dataclass(frozen=True)
class EpochReply:
    """A script's answer to a caller that presented another epoch:
    {'celery_semaphore:epoch', epoch, lost ms, resumes ms, now ms}."""

    epoch: int
    lost_ms: int
    resumes_ms: int


class Epochs:
    """The epoch hash of one Redis (a namespace's ``<namespace>:epoch``, shared by its
    semaphores) and the epoch the process driving the model knows there."""

    def __init__(self) -> None:
        self.hash: EpochHash | None = None
        self.known: int | None = None
        #: The losses this process noticed (the `DataLoss` its listeners hear): the
        #: replies that told it an epoch after it knew another.
        self.noticed: list[EpochReply] = []

    def lose(self) -> None:
        """The data went, the epoch hash with it (the process still knows the old one)."""
        self.hash = None

    def settle(self, pause_ms: int, now_us: int) -> tuple[EpochReply | None, int]:
        """settle_epoch(): (None, when admissions resume or 0) for a caller that presents
        the current epoch, or a reader (``pause_ms`` 0: it neither makes nor learns an
        epoch, it reads the pause that is there); else (the reply that tells the
        current epoch, 0).

        An absent epoch is made: a first use (the caller knew none) starts no pause; a
        caller that knew an epoch has seen the data lost: lost now, paused for its
        ``pause_ms``. An epoch made by a first use (lost_ms 0) that a caller knowing
        another finds is a loss noticed only now: the same pause, from now.

        Why: a client that saw the data before tells a loss from a first use; the pause
        gives the workers time to write back the permits of the tasks they run, so
        the line resumes under the limit instead of granting them twice."""
        now_ms = now_us // 1000
        found = self.hash
        if (found is not None and found.epoch == self.known) or pause_ms == 0:
            resumes = 0 if found is None or found.resumes_ms <= now_ms else found.resumes_ms
            return None, resumes
        if found is None or (self.known is not None and found.lost_ms == 0):
            found = found or EpochHash(now_us)
            if self.known is not None:
                found.lost_ms, found.resumes_ms = now_ms, now_ms + pause_ms
            self.hash = found
        return EpochReply(found.epoch, found.lost_ms, found.resumes_ms), 0

    def begin(self, pause_ms: int, now_us: int) -> int:
        """The start of every call (begin()), with the client's part: told another
        epoch, the client learns it and calls again (a loss if it knew another before).
        When admissions resume for this call (ms), or 0: not paused."""
        while True:
            reply, resumes_ms = self.settle(pause_ms, now_us)
            if reply is None:
                return resumes_ms
            if self.known is not None and self.known != reply.epoch:
                self.noticed.append(reply)
            self.known = reply.epoch
