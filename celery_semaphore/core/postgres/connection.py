"""Connecting to PostgreSQL: which URLs name it, how they are shown (the password
masked), and what its errors become."""

from __future__ import annotations

from typing import Any

from celery_semaphore.core.errors import SemaphoreBackendError, SemaphoreConnectionError
from celery_semaphore.core.urls import mask_url

SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")
STORE = "PostgreSQL"


def is_postgres_url(where: Any) -> bool:
    return isinstance(where, str) and where.startswith(SCHEMES)


def conninfo(url: str) -> str:
    """The URL as libpq reads it (SQLAlchemy's ``postgresql+psycopg://`` accepted);
    libpq's own settings in the query (``sslmode=require``, ``connect_timeout=5``,
    ``application_name=...``) pass through."""
    if url.startswith("postgresql+psycopg://"):
        return "postgresql://" + url[len("postgresql+psycopg://") :]
    return url


def needs_psycopg() -> Any:
    """The psycopg module, or an error that says how to install it."""
    try:
        import psycopg  # noqa: PLC0415 (the optional extra)
    except ImportError as error:
        raise ImportError(
            "a postgresql:// store needs psycopg 3: pip install 'celery-semaphore[postgres]'"
        ) from error
    return psycopg


def hint_for(error: BaseException) -> str | None:
    """What to do about a connection error (None: the default: is it running there?)."""
    text = str(error)
    if "password authentication failed" in text or "no password supplied" in text:
        return "the server refused the credentials: put the right user/password in the URL"
    if "does not exist" in text and "database" in text:
        return "create the database (createdb NAME) or put an existing one in the URL's path"
    if "no pg_hba.conf entry" in text:
        return "the server does not let this user in from here: see its pg_hba.conf"
    return None


def connection_error(url: str, error: BaseException) -> SemaphoreConnectionError:
    return SemaphoreConnectionError(url, _first_line(error), hint_for(error), STORE)


def translate(error: BaseException, url: str) -> Exception:
    """The package error for a psycopg error raised by a call."""
    psycopg = needs_psycopg()
    if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
        return connection_error(url, error)
    return SemaphoreBackendError(
        f"PostgreSQL at {url} answered with an error: {_first_line(error)}"
    )


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def shown(url: str) -> str:
    return mask_url(url)


def connect(url: str) -> Any:
    """A new autocommit connection to ``url`` (each function call is its own
    transaction), or `SemaphoreConnectionError` saying what to do."""
    psycopg = needs_psycopg()
    try:
        return psycopg.Connection.connect(conninfo(url), autocommit=True)
    except psycopg.Error as error:
        raise connection_error(shown(url), error) from error


async def connect_async(url: str) -> Any:
    """`connect` for asyncio."""
    psycopg = needs_psycopg()
    try:
        return await psycopg.AsyncConnection.connect(conninfo(url), autocommit=True)
    except psycopg.Error as error:
        raise connection_error(shown(url), error) from error
