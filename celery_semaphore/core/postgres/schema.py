"""The semaphores' tables and functions in PostgreSQL: the SQL, its version, and
installing it.

The tables live in schema `TABLES` and are shared by every release. The functions
of one release live in a schema of their own, named after a hash of the SQL
(`FUNCTIONS`), so two releases run side by side during a rolling upgrade, as two
versions of the Redis library do. A process installs what is missing the first time
it calls (`install`), under a transaction-level advisory lock, so many processes
starting at once install it once; ``celery -A proj semaphore migrate`` does the same
for teams whose application user may not create functions (``--sql`` prints it).
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

from celery_semaphore.core.constants import HISTOGRAM_BOUNDS_MS
from celery_semaphore.core.errors import SemaphoreBackendError
from celery_semaphore.core.postgres.connection import needs_psycopg

TABLES = "celery_semaphore"
#: The advisory lock held while installing (any bigint; this one spells "csem").
INSTALL_LOCK = 0x6373656D


def _read(name: str) -> str:
    return (resources.files(__package__) / "sql" / name).read_text(encoding="utf-8")


_TABLES_SQL = _read("tables.sql")
#: The histograms' bounds (constants.py) written in, as the Lua prelude has them.
_FUNCTIONS_SQL = _read("functions.sql").replace(
    "@BUCKETS@", "ARRAY[" + ", ".join(str(bound) for bound in HISTOGRAM_BOUNDS_MS) + "]"
)
#: The version of the SQL (tables and functions): a hash of its text.
VERSION = hashlib.sha1((_TABLES_SQL + _FUNCTIONS_SQL).encode()).hexdigest()[:12]
#: The schema of this release's functions.
FUNCTIONS = f"{TABLES}_fn_{VERSION}"


def sql_text() -> str:
    """Everything `install` runs, as one script (``semaphore migrate --sql``): the
    tables if missing, this release's functions, its row in the versions table."""
    tables = _TABLES_SQL.replace("@T@", TABLES)
    functions = _FUNCTIONS_SQL.replace("@T@", TABLES).replace("@F@", FUNCTIONS)
    return (
        f"-- celery-semaphore {VERSION}: tables (shared) and functions ({FUNCTIONS})\n"
        f"SELECT pg_advisory_xact_lock({INSTALL_LOCK});\n"
        f"{tables}\n{functions}\n"
        f"INSERT INTO {TABLES}.versions (functions) VALUES ('{FUNCTIONS}')\n"
        "  ON CONFLICT DO NOTHING;\n"
    )


IS_INSTALLED = "SELECT 1 FROM pg_namespace WHERE nspname = %s"


def not_allowed(url: str, error: Any) -> SemaphoreBackendError:
    """The error for a user that may not create the schema or the functions."""
    return SemaphoreBackendError(
        f"PostgreSQL at {url} refused to create the semaphores' functions ({FUNCTIONS}): "
        f"{str(error).strip()} (run `celery -A proj semaphore migrate` as a user that may "
        "create schemas in this database, or give its output of `--sql` to your DBA; "
        f"then grant this user USAGE on schemas {TABLES} and {FUNCTIONS}, and "
        f"SELECT, INSERT, UPDATE, DELETE on the tables of {TABLES})"
    )


def install(connection: Any, url: str) -> bool:
    """Install this release's tables and functions through ``connection`` (psycopg,
    autocommit) if they are missing; whether it installed them."""
    psycopg = needs_psycopg()
    if connection.execute(IS_INSTALLED, (FUNCTIONS,)).fetchone():
        return False
    try:
        with connection.transaction():
            connection.execute(f"SELECT pg_advisory_xact_lock({INSTALL_LOCK})")
            if connection.execute(IS_INSTALLED, (FUNCTIONS,)).fetchone():
                return False
            connection.execute(sql_text())
    except psycopg.errors.InsufficientPrivilege as error:
        raise not_allowed(url, error) from error
    return True


async def install_async(connection: Any, url: str) -> bool:
    """`install` on an asyncio connection."""
    psycopg = needs_psycopg()
    if await (await connection.execute(IS_INSTALLED, (FUNCTIONS,))).fetchone():
        return False
    try:
        async with connection.transaction():
            await connection.execute(f"SELECT pg_advisory_xact_lock({INSTALL_LOCK})")
            if await (await connection.execute(IS_INSTALLED, (FUNCTIONS,))).fetchone():
                return False
            await connection.execute(sql_text())
    except psycopg.errors.InsufficientPrivilege as error:
        raise not_allowed(url, error) from error
    return True
