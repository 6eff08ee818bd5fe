"""The table of a prefork worker's busy processes, and how long a wait in place may be."""

from __future__ import annotations

import os

import pytest
from celery.concurrency import get_implementation

from celery_semaphore.config import NEAR_TURN
from celery_semaphore.worker import pool_occupancy
from celery_semaphore.worker.pool_occupancy import PoolOccupancy


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
    ("pool", "autoscale_max", "processes"),
    [("prefork", None, 4), ("prefork", 10, 10), ("threads", None, None), ("solo", None, None)],
)
def test_only_a_prefork_worker_keeps_a_table_of_every_process_it_may_have(
    monkeypatch: pytest.MonkeyPatch, pool: str, autoscale_max: int | None, processes: int | None
) -> None:
    monkeypatch.setattr(pool_occupancy, "current", PoolOccupancy(1))
    pool_occupancy.start_for(_Worker(pool, 4, autoscale_max))
    table = pool_occupancy.current
    assert (table.processes if table is not None else None) == processes
