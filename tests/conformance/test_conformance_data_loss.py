"""Data loss: the store loses a namespace's data between calls (`lose_data`: its keys and
its epoch hash, as a restart without persistence would) and the model forgets the same
(`SemaphoreModel.lose_data`). Compared: the pause (``Place.resumes_in``, status's
``resumes_at``), the permits renewals write back (``restored``, token 0 by id), that
nothing is granted or woken during the pause, and the line resuming in order. Each
test has a namespace of its own: the epoch hash is one per namespace. (The memory store
cannot lose its data between calls: skipped.)"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conformance_driver import Pair, Store, lose_data, near

from celery_semaphore import Permit, Place
from celery_semaphore.core import losses
from celery_semaphore.core.model import SemaphoreModel
from celery_semaphore.core.results import DataLoss

PAUSE = 0.8  # s: the pause after a loss these clients ask for


@pytest.fixture
def lossy(store: Store) -> Iterator[Pair]:
    """A pair in a namespace of its own, listening to its wake channel where it can; at
    the end, the losses this process was told of (`DataLoss`) against those the model
    noticed."""
    listen = hasattr(store, "client")
    p = Pair(store, 2, namespace=f"conformance-loss-{uuid.uuid4().hex}",
             pause_after_loss=PAUSE, listen=listen)  # fmt: skip
    told: list[DataLoss] = []
    losses.listen(told.append)
    yield p
    losses.unlisten(told.append)
    p.close()
    noticed = p.model.epochs.noticed
    assert len(told) == len(noticed), (told, noticed)
    for loss, said in zip(told, noticed, strict=True):
        assert near(loss.lost_at, said.lost_ms / 1000), (loss, said)
        assert near(loss.resumes_at, said.resumes_ms / 1000), (loss, said)


def first_use_elsewhere(p: Pair) -> None:
    """Another process, which never saw the data, learns the epoch: it finds none and
    makes one as a first use (no pause); the model's process still knows the old one."""
    code = (
        "import sys; from celery_semaphore import Semaphore; "
        "Semaphore(sys.argv[1], sys.argv[2], 1, namespace=sys.argv[3]).learn_epoch()"
    )
    now = p.now()
    subprocess.run([sys.executable, "-c", code, p.sem.url, p.sem.name, p.sem.namespace], check=True)
    epochs = p.model.epochs
    known, epochs.known = epochs.known, None
    p.model.learn_epoch(p.caller.pause_ms, now)
    epochs.known = known


def sibling_in(p: Pair, limit: int, **options: Any) -> Pair:
    """Another semaphore of the same namespace (one epoch hash: one model `Epochs`)."""
    return Pair(
        p.store, limit, namespace=p.sem.namespace, pause_after_loss=PAUSE,
        model_of=SemaphoreModel(p.model.epochs), **options,
    )  # fmt: skip


def test_a_loss_pauses_the_line_while_renewals_write_permits_back(lossy: Pair) -> None:
    p = lossy
    p.learn_epoch()  # a worker at start: it knows the data from now on
    p.attempt("a")
    p.attempt("b", weight=1)
    p.attempt("c")
    p.check()
    lose_data(p)
    p.check()  # a reader neither makes nor learns an epoch: nothing is paused yet
    place = p.attempt("d")
    assert isinstance(place, Place) and place.holders == 0
    assert place.resumes_in is not None and place.resumes_in > PAUSE / 2, place
    assert p.renew_permit(0), "a's permit is written back with its token"
    assert p.renew_many(["b", "ghost"]) == set(), "by id: token 0 (ghost may have waited)"
    p.check()
    assert sorted((h.holder, h.fencing_token == 0) for h in p.sem.status().holders) == [
        ("a", False), ("b", True), ("ghost", True),
    ]  # fmt: skip
    assert isinstance(p.attempt("e"), Place), "paused: nobody is granted"
    assert p.release("ghost"), "a holder written back by id is released by id"
    assert p.last_heard == [], "nothing is granted in place or woken while paused"
    p.check()
    time.sleep(PAUSE + 0.1)
    assert isinstance(p.attempt("e"), Place), "a and b hold the limit: the line waits"
    assert p.release_permit(1), "b holds token 0: its old token releases it"
    assert isinstance(p.attempt("e"), Place), "d is first in line: e waits behind it"
    assert isinstance(p.attempt("d"), Permit)
    p.check()


def test_a_holder_written_back_by_id_that_asks_held_nothing(lossy: Pair) -> None:
    p = lossy
    p.learn_epoch()
    lose_data(p)
    p.renew_many(["w"], weight=2)  # a worker renews a request that was only waiting
    p.check()
    assert [(h.holder, h.permits) for h in p.sem.status().holders] == [("w", 2)]
    time.sleep(PAUSE + 0.1)
    assert isinstance(p.attempt("w"), Permit), "its entry is dropped; it asks anew"
    p.check()
    assert [(h.holder, h.permits) for h in p.sem.status().holders] == [("w", 1)]


def test_every_semaphore_of_the_namespace_pauses(lossy: Pair) -> None:
    p = lossy
    other = sibling_in(p, 1)
    p.attempt("a")
    other.attempt("x")
    lose_data(p, other)
    assert isinstance(p.attempt("a"), Place), "the loss: a held nothing any more"
    place = other.attempt("y")
    assert isinstance(place, Place) and place.resumes_in is not None, "one epoch, one pause"
    p.check()
    other.check()


def test_a_loss_noticed_after_another_process_made_the_epoch_pauses_from_then(
    lossy: Pair,
) -> None:
    p = lossy
    p.attempt("a")
    lose_data(p)
    first_use_elsewhere(p)
    p.check()  # that first use started no pause
    time.sleep(0.2)
    place = p.attempt("b")
    assert isinstance(place, Place) and place.resumes_in is not None, "the loss, noticed now"
    assert place.resumes_in > PAUSE - 0.1, "the pause runs from when it was noticed"
    p.check()
