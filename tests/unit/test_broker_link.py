"""The parking queues' link to the broker (`celery_semaphore.parking_queues.BrokerLink`)
across a fork: a pool child forked while another thread of the worker held the link
(moving a parked message) gets a lock of its own, not one nobody will release."""

from __future__ import annotations

import os
import threading

import pytest
from celery import Celery

from celery_semaphore.parking_queues import BrokerLink


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_another_thread_holds_the_link_can_take_it() -> None:
    link = BrokerLink(Celery(broker="memory://"))
    held, release = threading.Event(), threading.Event()

    def mover() -> None:
        with link.lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=mover)
    thread.start()
    held.wait(5)
    read, write = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # the child: the mover thread is not here to release the lock
            taken = link.lock.acquire(timeout=2)
            os.write(write, b"1" if taken else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 1) == b"1", "the child waited for the parent's lock"
        assert not link.lock.acquire(blocking=False), "the parent's lock is still held"
    finally:
        release.set()
        thread.join(5)
