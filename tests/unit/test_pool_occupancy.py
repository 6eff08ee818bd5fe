"""The table of a prefork worker's busy processes, and how long a wait in place may be."""

from __future__ import annotations

import os
import threading

import pytest
from celery.concurrency import get_implementation

from celery_semaphore.config import NEAR_TURN
from celery_semaphore.worker import pool_occupancy
from celery_semaphore.worker.pool_occupancy import InProcessOccupancy, PoolOccupancy


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """This process's pool index, as a test sets it (``index[0]``)."""
    own: list[int | None] = [0]
    monkeypatch.setattr(pool_occupancy, "_own_index", lambda: own[0])
    return own


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch, index: list[int | None]) -> PoolOccupancy:
    """A table of two processes, both started (the test runs as process 0)."""
    made = PoolOccupancy(2)
    monkeypatch.setattr(pool_occupancy, "current", made)
    for started in (1, 0):
        index[0] = started
        made.process_started()
    return made


def test_a_slot_no_process_has_started_in_is_not_idle(index: list[int | None]) -> None:
    autoscaled = PoolOccupancy(4)  # autoscale 4,1: one process up
    autoscaled.started()
    assert not autoscaled.another_idle()
    index[0] = 1
    autoscaled.process_started()
    index[0] = 0
    assert autoscaled.another_idle()
    index[0] = 1
    autoscaled.process_ended()  # shrunk away again
    index[0] = 0
    assert not autoscaled.another_idle()


def test_another_process_is_idle_until_every_other_one_runs_a_task(
    index: list[int | None], table: PoolOccupancy
) -> None:
    table.started()  # process 0: this one
    assert table.another_idle()
    index[0] = 1
    table.started()
    index[0] = 0
    assert not table.another_idle()
    index[0] = 1
    table.ended()
    index[0] = 0
    assert table.another_idle()


def test_a_process_that_runs_no_task_itself_does_not_count_as_the_other(
    index: list[int | None], table: PoolOccupancy
) -> None:
    index[0] = 1
    table.started()
    index[0] = 0
    assert not table.another_idle()  # 0 is idle, but it is the one asking


def test_a_task_run_inside_another_leaves_its_process_busy(
    index: list[int | None], table: PoolOccupancy
) -> None:
    index[0] = 1
    table.started()  # the task
    table.started()  # a task it runs with apply()
    table.ended()
    index[0] = 0
    table.started()
    assert not table.another_idle()
    index[0] = 1
    table.ended()
    index[0] = 0
    assert table.another_idle()


def test_a_new_process_clears_what_the_one_it_replaces_left(
    index: list[int | None], table: PoolOccupancy
) -> None:
    table.started()
    index[0] = 1
    table.started()  # killed in its task: no task_postrun
    table.process_started()  # its replacement, at the same index
    index[0] = 0
    assert table.another_idle()


def test_a_process_outside_the_table_changes_nothing(
    index: list[int | None], table: PoolOccupancy
) -> None:
    index[0] = None
    table.started()
    index[0] = 7
    table.started()
    index[0] = 0
    assert table.another_idle()


def test_the_longest_wait_in_place_is_short_only_while_the_others_are_busy(
    index: list[int | None], table: PoolOccupancy
) -> None:
    table.started()
    assert pool_occupancy.max_block(10.0) == 10.0
    index[0] = 1
    table.started()
    assert pool_occupancy.max_block(10.0) == NEAR_TURN
    assert pool_occupancy.max_block(0.05) == 0.05  # never longer than configured
    assert pool_occupancy.max_block(0.0) == 0.0


def test_outside_a_prefork_worker_the_setting_alone_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_occupancy, "current", None)
    assert pool_occupancy.max_block(10.0) == 10.0
    pool_occupancy.on_task_start()
    pool_occupancy.on_task_end()
    pool_occupancy.on_process_start()


def test_a_forked_process_marks_in_the_table_its_parent_reads(
    index: list[int | None], table: PoolOccupancy
) -> None:
    table.started()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            index[0] = 1
            table.started()
            os.write(write, b"1")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(read)
    assert not table.another_idle()


class _Worker:
    def __init__(self, pool: str, concurrency: int, autoscale_max: int | None = None) -> None:
        self.pool_cls = get_implementation(pool)
        self.concurrency = concurrency
        self.max_concurrency = autoscale_max


@pytest.mark.parametrize(
    ("pool", "autoscale_max", "kind", "size"),
    [
        ("prefork", None, PoolOccupancy, 4),
        ("prefork", 10, PoolOccupancy, 10),
        ("threads", None, InProcessOccupancy, 4),
        ("solo", None, InProcessOccupancy, 1),  # one task at a time, whatever -c says
    ],
)
def test_each_pool_keeps_the_count_that_fits_it(
    monkeypatch: pytest.MonkeyPatch,
    pool: str,
    autoscale_max: int | None,
    kind: type,
    size: int,
) -> None:
    monkeypatch.setattr(pool_occupancy, "current", None)
    pool_occupancy.start_for(_Worker(pool, 4, autoscale_max))
    made = pool_occupancy.current
    assert isinstance(made, kind)
    assert (made.processes if isinstance(made, PoolOccupancy) else made.size) == size


def test_threads_count_their_running_tasks_against_the_pool_size() -> None:
    threads = InProcessOccupancy(2)
    threads.started()  # the asking task
    assert threads.another_idle()
    other_started, other_may_end = threading.Event(), threading.Event()

    def other() -> None:
        threads.started()
        threads.started()  # a task it runs with apply()
        threads.ended()
        other_started.set()
        other_may_end.wait(5)
        threads.ended()

    thread = threading.Thread(target=other)
    thread.start()
    assert other_started.wait(5)
    assert not threads.another_idle()
    other_may_end.set()
    thread.join(5)
    assert threads.another_idle()
    threads.ended()
    threads.ended()  # one end too many changes nothing
    assert threads._running == 0
