"""The app of the chaos test (``test_chaos.py``): one limited task (fair between two
accounts, and published with priorities) whose bodies say,
in Redis, when they start and end and in which process, so an observer outside the
package can count the bodies running at once.

``CS_BROKER_URL`` (broker), ``CS_REDIS_URL`` (results and the records, and the
semaphores unless ``CS_SEMAPHORE_URL`` says where), ``CS_LIMIT``, ``CS_RATE`` (the
semaphore's start rate too, if set), ``CS_LEASE``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import task_prerun

from celery_semaphore import LimitedTask, parking_lists

BROKER = os.environ.get("CS_BROKER_URL", "redis://127.0.0.1:6399/0")
STATE = os.environ.get("CS_REDIS_URL", BROKER)
LIMIT = int(os.environ.get("CS_LIMIT", "3"))
RATE = os.environ.get("CS_RATE") or None
LEASE = float(os.environ.get("CS_LEASE", "8"))
RECORDS = "chaos:records"

app = Celery("chaos_app", broker=BROKER, backend=STATE)
app.conf.update(
    semaphore_redis_url=os.environ.get("CS_SEMAPHORE_URL") or STATE,
    semaphore_lease_timeout=LEASE,
    semaphore_heartbeat_interval=1.0,
    semaphore_backoff_max=2.0,
    semaphore_handover_deadline=5.0,
    # A killed worker's unacknowledged messages come back after this long (not 1 h),
    # looked for every 2 s (kombu 5.7's Redis transport looks every 10 s x 10 by default:
    # up to 100 s, longer than the chaos tests settle).
    broker_transport_options={
        "visibility_timeout": 12,
        "unacked_restore_interval": 2,
        "unacked_restore_throttle": 1,
    },
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue="chaos",
    result_expires=3600,
)
_records = redis.Redis.from_url(STATE, socket_timeout=30)
# A message a SIGKILLed worker was moving out of a Redis broker's parking list is put
# back after this long (30 s by default: longer than the chaos tests settle).
if os.environ.get("CS_STUCK_AFTER"):
    parking_lists.STUCK_AFTER = float(os.environ["CS_STUCK_AFTER"])


def record(event: str, task_id: str) -> None:
    entry = {"event": event, "id": task_id, "pid": os.getpid(), "worker": os.getppid(),
             "at": time.time()}  # fmt: skip
    _records.rpush(RECORDS, json.dumps(entry))


@task_prerun.connect
def _prerun(task_id: str = "", **_: Any) -> None:
    """The execution began in this process: an early-ack task is acknowledged now."""
    record("prerun", task_id)


def _account(seconds: float, account: str = "A", **_: Any) -> str:
    return account


@app.task(bind=True, base=LimitedTask, semaphore="chaos", limit=LIMIT, rate=RATE, shared=False,
          fair_by=_account)  # fmt: skip
def body(self: Any, seconds: float, account: str = "A") -> float:
    record("start", self.request.id)
    time.sleep(seconds)
    record("end", self.request.id)
    return seconds
