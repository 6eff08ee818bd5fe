"""A home queue that is a RabbitMQ quorum queue: waiting tasks still park in the broker.

Celery 5.5+ on RabbitMQ: ``task_queues`` declares the home queue with
``queue_arguments={"x-queue-type": "quorum"}`` on a topic exchange (what native
delayed delivery needs), publishes with confirms (``confirm_publish``), and its
workers detect the quorum queue (``worker_detect_quorum_queues``: a static prefetch,
and the ``celery_delayed_*`` exchanges and queues declared and bound at start). Real
workers on the machine's RabbitMQ (a private vhost), the semaphores in a Redis of the
test's own. What an observer sees: the workers start and run without an error or a
warning of native delayed delivery, a backlog parks in the broker and every task runs
once, roughly in line order, never more than the limit at once. The parking queues
stay classic (a quorum queue would drop a message returned past its delivery limit);
the handover queue is what Celery makes of a queue it does not know
(``task_create_missing_queue_type``: classic by default, quorum where the app says so).

Countdown waits (``semaphore_wait_mode = "countdown"``, or a parking queue refused)
on such a queue go through RabbitMQ's delay queues, in whole seconds: they are rounded
up to a second at least (Celery refuses less and the task failed), and a retry drops
the x-death headers of its last delay (else RabbitMQ took its next delay for a
dead-letter cycle and kept it in a delay queue for good).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import VERSION
from celery.utils.imports import symbol_by_name
from celery_harness import max_overlap
from cluster_tools import Clusters
from kombu import Exchange, Queue
from test_parking_in_broker import AMQP, a_backlog_parks_and_runs_in_order, starts

from celery_semaphore.formats import Gate, handover_queue, parking_queue
from celery_semaphore.worker.handover_queues import HandoverQueues

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VERSION < (5, 5), reason="quorum queues need Celery 5.5+"),
]

# The app the workers run: limited_app's tasks, its home queue a quorum queue.
QUORUM_APP = """
from kombu import Exchange, Queue
from limited_app import *  # noqa: F403 (the tasks)
from limited_app import app

app.conf.task_queues = [
    Queue({queue!r}, Exchange({queue!r}, type="topic"), routing_key={queue!r},
          queue_arguments={{"x-queue-type": "quorum"}}),
]
app.conf.broker_transport_options = {{"confirm_publish": True}}
app.conf.task_create_missing_queue_type = {missing!r}
{more}
"""
# What Celery says of a queue it cannot delay natively (at start, and at each countdown).
NATIVE_DELAY_WARNING = "native delayed delivery"


def quorum_queue(name: str) -> Any:
    return Queue(
        name, Exchange(name, type="topic"), routing_key=name,
        queue_arguments={"x-queue-type": "quorum"},
    )  # fmt: skip


def queue_types(vhost: str) -> dict[str, str]:
    """Every queue of ``vhost`` and its type, as the broker lists them."""
    command = shutil.which("rabbitmqctl")
    if command is None or not vhost:
        pytest.skip("rabbitmqctl is needed to read the queues' types")
    done = subprocess.run(
        [command, "list_queues", "-p", vhost, "--quiet", "--no-table-headers", "name", "type"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return dict(line.split("\t")[:2] for line in done.stdout.splitlines() if "\t" in line)


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


@pytest.mark.parametrize("missing", ["classic", "quorum"])
def test_a_backlog_on_a_quorum_home_queue_parks_in_the_broker_and_runs_in_order(
    clusters: Clusters, rabbitmq_vhost: str, tmp_path: Path, missing: str
) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue, broker = f"qq-{suffix}", f"{AMQP}/{rabbitmq_vhost}"
    (tmp_path / "quorum_app.py").write_text(
        QUORUM_APP.format(queue=queue, missing=missing, more="")
    )
    cluster = clusters(limit=2, broker_url=broker)
    cluster.env["PYTHONPATH"] = f"{tmp_path}:{cluster.env['PYTHONPATH']}"
    client = cluster.app_module.app  # publishes as the workers' app does
    client.conf.update(
        task_queues=[quorum_queue(queue)],
        broker_transport_options={"confirm_publish": True},
        task_create_missing_queue_type=missing,
    )
    client.__dict__.pop("amqp", None)  # its queues, made from the settings before
    workers = [
        cluster.worker(f"{name}-{suffix}", concurrency=2, queues=queue, app="quorum_app")
        for name in ("q1", "q2")
    ]
    a_backlog_parks_and_runs_in_order(cluster, broker, queue, timeout=60)

    types = queue_types(rabbitmq_vhost)
    assert types[queue] == "quorum"
    assert types[handover_queue(queue)] == missing
    for asked in (False, True):
        assert types[parking_queue(queue, Gate("hold", 2), asked=asked)] == "classic"
    assert types["celery_delayed_0"] == "quorum"  # native delayed delivery was set up
    for worker in workers:
        log = worker.text()
        assert "Global QoS is disabled" in log  # Celery saw the quorum queue
        said = [
            line for line in log.splitlines()
            if NATIVE_DELAY_WARNING in line or "ERROR" in line or "CRITICAL" in line
        ]  # fmt: skip
        assert said == [], said


def test_countdown_waits_on_a_quorum_home_queue_are_delayed_by_the_broker(
    clusters: Clusters, rabbitmq_vhost: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue, broker = f"qc-{suffix}", f"{AMQP}/{rabbitmq_vhost}"
    more = f"app.conf.task_default_queue = {queue!r}  # a retry is routed there, delayed there"
    (tmp_path / "quorum_app.py").write_text(
        QUORUM_APP.format(queue=queue, missing="classic", more=more)
    )
    conf = {"semaphore_wait_mode": "countdown", "semaphore_max_block": 0.0}
    cluster = clusters(limit=1, broker_url=broker, extra_conf=conf)
    cluster.env["PYTHONPATH"] = f"{tmp_path}:{cluster.env['PYTHONPATH']}"
    client = cluster.app_module.app
    client.conf.update(
        task_queues=[quorum_queue(queue)], broker_transport_options={"confirm_publish": True}
    )
    client.__dict__.pop("amqp", None)
    worker = cluster.worker(f"qc-{suffix}", concurrency=3, queues=queue, app="quorum_app")
    # turns seconds apart: countdowns of 2 s and more, through more than one delay queue
    results = [cluster.app_module.hold.apply_async((0.5, i), queue=queue) for i in range(8)]
    deadline = time.monotonic() + 30
    ran = sorted(r.get(timeout=max(0.1, deadline - time.monotonic())) for r in results)
    assert ran == list(range(8))
    events = cluster.events()
    assert len(starts(events)) == 8  # each ran once
    assert max_overlap(events) == 1
    log = worker.text()
    assert "retry: waiting for a permit" in log  # they did count down
    said = [line for line in log.splitlines() if NATIVE_DELAY_WARNING in line or "ERROR" in line]
    assert said == [], said


def test_handover_queues_are_added_once_native_delayed_delivery_has_bound_the_queues() -> None:
    """The order of the consumer's steps (which otherwise falls as Python's sets
    iterate, in each worker): Celery's native delayed delivery binds the queues the
    app knows, and warns about a handover queue known by then."""
    required, seen = list(HandoverQueues.requires), set()
    while required:
        step = symbol_by_name(required.pop())
        if step not in seen:
            seen.add(step)
            required += step.requires
    names = {f"{step.__module__}:{step.__name__}" for step in seen}
    assert "celery.worker.consumer.delayed_delivery:DelayedDelivery" in names
