"""``celery -A proj semaphore ...``: see and steer live semaphores.

Registered through the ``celery.commands`` entry point: Celery's ``celery``
group runs this group's commands. Every failure (a usage error, an unknown
semaphore, unreachable Redis, wrong settings) is one line ``Error: ...`` on
stderr and exit status 1, and a bad value is worded one way for every argument.

The modules, one concern each:

- `celery_semaphore.cli.show`: the commands that look (``status``, ``holders``,
  ``waiters``); `celery_semaphore.cli.steer`: those that change a semaphore;
  `celery_semaphore.cli.migrate`: installing the PostgreSQL store's SQL (``migrate``).
- `celery_semaphore.cli.operator`: `Operator`, the app's semaphores as the
  commands see them (in Redis and declared by the app, by name or family); it
  reads and steers them only through `celery_semaphore.core`.
- `celery_semaphore.cli.rows`: the rows printed (``--json`` as they are);
  `celery_semaphore.cli.render`: the tables and text made of them.
- `celery_semaphore.cli.params`: the click types of numbers and rates;
  `celery_semaphore.cli.errors`: the group's and commands' click classes, which
  put every error in one line.
"""

from __future__ import annotations

import click
from celery.bin.worker import worker as celery_worker_command

from celery_semaphore.worker.bootstep import add_worker_options

from .errors import SemaphoreGroup
from .migrate import migrate
from .operator import Operator
from .show import holders, status, waiters
from .steer import drain, release, reset_limit, reset_rate, resume, set_limit, set_rate

__all__ = ["Operator", "semaphore"]

# Celery's command line imports this module (the ``celery.commands`` entry point)
# before it parses anything: the place to give ``celery worker`` its options.
add_worker_options(celery_worker_command)


@click.group(
    cls=SemaphoreGroup,
    commands=[
        *(status, holders, waiters),
        *(set_limit, reset_limit, set_rate, reset_rate, drain, resume, release),
        migrate,
    ],
)
@click.pass_context
def semaphore(ctx: click.Context) -> None:
    """See and steer celery-semaphore's semaphores (and install the PostgreSQL
    store's SQL: migrate).

    NAME is a semaphore's name as its tasks declare it (semaphore=...), or
    queue:<queue> for a queue cap; status, holders and waiters also take a
    per-key family's name (per_key(family, ...)). Every error is one line on stderr and exit
    status 1.
    """
