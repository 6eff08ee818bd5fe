"""The PostgreSQL store: the semaphores in tables of a PostgreSQL database, each
operation one call of a function in the database (one round trip), waiters woken by
LISTEN/NOTIFY. Needs psycopg 3 (``pip install celery-semaphore[postgres]``).

- ``sql/``: the tables and the functions; `schema`: their version, installing them;
- `connection`: URLs, connecting, errors;
- `replies`: the functions' replies read as the model's; ``_async/store.py`` (the
  source of ``_sync/store.py``): the `Store` itself; `operations`: its operators' side
  (the CLI, the metrics).
"""
