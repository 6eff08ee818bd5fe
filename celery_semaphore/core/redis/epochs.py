"""How a client notices that Redis lost its data: the epoch it remembers.

Each Redis (each slot of a Cluster) keeps an epoch hash that goes only with its
data (common_epoch.lua, "Data loss"). Every script call presents the epoch this
process last saw there; a script that finds another answers with the current
one, which this module remembers, and the call is made again. When the epoch a
process remembered is gone, the data went with it: listeners hear of it (a
`DataLoss`) once per process and epoch, whichever call noticed.

The memory is per process (forked children start with their parent's, so a
worker's pool children notice a loss their parent had seen the data before) and
per Redis (the semaphore's ``url``) and epoch key. A process that never saw
the data before cannot tell a loss from a first use: see the guarantees page.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from celery_semaphore.core import losses
from celery_semaphore.core.redis import parked_index
from celery_semaphore.core.redis.replies import text
from celery_semaphore.core.results import DataLoss

logger = logging.getLogger(__name__)

#: The first element of a script's answer to a client that presented another epoch.
EPOCH_REPLY = "celery_semaphore:epoch"


_known: dict[tuple[str, str], str] = {}
_lock = threading.Lock()


def argument(url: str, epoch_key: str, pause: float) -> str:
    """The last argument of every script call (common_keys.lua): the epoch this process
    knows at ``url`` and the pause (seconds) to ask for if that epoch is gone; 0:
    a reader, which neither learns an epoch nor starts a pause."""
    return f"{_known.get((url, epoch_key), '')}|{max(1, int(pause * 1000)) if pause else 0}"


def is_epoch_reply(reply: Any) -> bool:
    return (
        isinstance(reply, list)
        and len(reply) == 5
        and isinstance(reply[0], bytes | str)
        and text(reply[0]) == EPOCH_REPLY
    )


def learn(url: str, epoch_key: str, reply: Sequence[Any]) -> DataLoss | None:
    """Remember the epoch a script answered with; the `DataLoss` (told to the
    listeners) if this process knew another epoch there before."""
    _, epoch, lost_ms, resumes_ms, now_ms = reply
    epoch = text(epoch)
    with _lock:
        before = _known.get((url, epoch_key))
        _known[(url, epoch_key)] = epoch
    if before is None or before == epoch:
        return None
    loss = DataLoss(url, epoch_key, int(lost_ms) / 1000, int(resumes_ms) / 1000, int(now_ms) / 1000)
    parked_index.forget_listings()  # the index went with the data: list again at next park
    losses.tell(loss)
    return loss


def forget() -> None:
    """Forget every epoch (tests)."""
    with _lock:
        _known.clear()
