"""What the end-to-end benchmarks' worker apps share about the broker they run on.

Imported by the worker processes as well as by the harness: nothing here starts a
server or imports ``devkit``.
"""

from __future__ import annotations

import functools
from typing import Any

import redis


def record_amqp_declares(records: redis.Redis, key: str) -> None:
    """Add every AMQP queue and exchange this process declares to the Redis set ``key``
    (``queue:<name>``, ``exchange:<name>``), before the declare: a process killed right
    after it still left its name. ``bench_celery.Topology.delete_amqp_entities`` deletes
    those named for the run at its end (parking queues among them)."""
    from amqp.channel import Channel

    def recording(method: Any, kind: str) -> Any:
        @functools.wraps(method)
        def declare(self: Any, *args: Any, **kwargs: Any) -> Any:
            name = args[0] if args else kwargs.get(kind, "")  # kombu passes keywords
            if name:
                records.sadd(key, f"{kind}:{name}")
            return method(self, *args, **kwargs)

        return declare

    for attribute, kind in (("queue_declare", "queue"), ("exchange_declare", "exchange")):
        method = getattr(Channel, attribute)
        if not getattr(method, "__wrapped__", None):
            setattr(Channel, attribute, recording(method, kind))
