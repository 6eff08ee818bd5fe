"""The line, sampled during the run: how many tasks wait for a semaphore, and where.

A thread of the demo reads ``Semaphore.status()`` every ``every`` seconds from before the
first task is sent until the batch has ended. Each reading is one consistent snapshot of the
semaphore's line in Redis, split by the waiters' state (see ``WaiterInfo.state``). Tasks that
were sent but hold no place in line (a message in the broker whose place taken at publish
has lapsed) are not in it: the report and the timeline add them from the tasks' own records.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import TracebackType

import redis

from example_project.demo.records import IN_PLACE, LINE_EVERY, LineSample


class LineSampler:
    """``with LineSampler(url, name, limit) as sampler: ...``; then ``sampler.samples``."""

    def __init__(self, redis_url: str, name: str, limit: int, every: float = LINE_EVERY) -> None:
        from celery_semaphore import Semaphore  # noqa: PLC0415 - after DEMO_REDIS_URL is set

        self.semaphore = Semaphore(redis_url, name, limit)
        self.every = every
        self.samples: list[LineSample] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="line-sampler", daemon=True)

    def sample(self) -> LineSample:
        at = time.time()
        status = self.semaphore.status()
        listed = Counter(waiter.state for waiter in status.waiters)
        # parked_count and handed_over_count count every waiter; the list stops at 1,000
        in_place = listed[IN_PLACE]
        return LineSample(
            at=at,
            parked=status.parked_count,
            handed_over=status.handed_over_count,
            in_place=in_place,
            asking=max(
                0, status.waiter_count - status.parked_count - status.handed_over_count - in_place
            ),
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except redis.RedisError as error:
                self.error = f"sampling the line stopped: {error}"
                return
            self._stop.wait(self.every)

    def __enter__(self) -> LineSampler:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.semaphore.close()
