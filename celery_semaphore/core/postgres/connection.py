"""Connecting to PostgreSQL: which URLs name it, how they are shown (the password
masked), what its errors become, and whether a pooler (PgBouncer) stands in front of it
and how it pools."""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote

from celery_semaphore.core.errors import SemaphoreBackendError, SemaphoreConnectionError
from celery_semaphore.core.urls import mask_url

SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")
STORE = "PostgreSQL"
#: The password in a URL's user-info as libpq reads it: up to the first "@" before any
#: "/" ("?" and "#" are part of it, where `mask_url` stops).
LIBPQ_PASSWORD = re.compile(r"^([a-z+]+://[^:@/]*:)([^@/]*)@", re.IGNORECASE)
#: The same up to the last "@" before any "/", as a reader (and `mask_url`) sees it.
PASSWORD_TO_LAST_AT = re.compile(r"^[a-z+]+://[^:@/]*:([^/]*)@", re.IGNORECASE)
QUERY_PASSWORD = re.compile(r"[?&]password=([^&#]*)", re.IGNORECASE)

logger = logging.getLogger(__name__)


def is_postgres_url(where: Any) -> bool:
    return isinstance(where, str) and where.startswith(SCHEMES)


def check_url(url: str) -> None:
    """ValueError for a URL that libpq reads otherwise than it looks, and whose password
    its errors would then show in part: libpq ends the user-info at the first "@" (the
    rest of a password holding "@" becomes the host) and the host at the first "/" (a
    password holding "/" becomes the port, and the rest the database)."""
    rest = url.split("://", 1)[1]
    authority = rest.split("/", 1)[0]
    if "@" in authority:
        misread = "@" in authority.split("@", 1)[1].split("?", 1)[0]
    else:
        misread = "@" in rest.split("?", 1)[0]
    if misread:
        raise ValueError(
            'a PostgreSQL URL must percent-encode "@" and "/" in its user name, password '
            'and database name (urllib.parse.quote(password, safe="")): libpq would read '
            "part of this one's password as the host, the port or the database"
        )


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


#: The hint of a URL libpq cannot read: no retry can fix it.
UNREADABLE = "libpq cannot read this URL: fix it (percent-encode the password)"
#: The hint where PgBouncer in statement mode refuses the transaction that installs
#: the functions: no retry can fix it either.
STATEMENT_POOLING = (
    "PgBouncer in statement mode refuses the transaction that installs the functions: "
    "install them once through PostgreSQL directly: celery -A proj semaphore migrate --sql "
    "| psql URL"
)


def hint_for(error: BaseException) -> str | None:
    """What to do about a connection error (None: the default: is it running there?)."""
    if isinstance(error, needs_psycopg().ProgrammingError):
        return UNREADABLE
    text = str(error)
    if "password authentication failed" in text or "no password supplied" in text:
        return "the server refused the credentials: put the right user/password in the URL"
    if "does not exist" in text and "database" in text:
        return "create the database (createdb NAME) or put an existing one in the URL's path"
    if "no pg_hba.conf entry" in text:
        return "the server does not let this user in from here: see its pg_hba.conf"
    if "statement pooling mode" in text:
        return STATEMENT_POOLING
    return None


def connection_error(url: str, error: BaseException) -> SemaphoreConnectionError:
    """The error for psycopg's ``error`` on ``url`` (as given or as shown): the URL's
    password masked, and taken out of libpq's text, which echoes a URL it cannot parse
    and a bad %-escape (``invalid percent-encoded token: "<password>"``)."""
    cause = _hidden(_first_line(error), url)
    return SemaphoreConnectionError(shown(url), cause, hint_for(error), STORE)


def _passwords(url: str) -> set[str]:
    """The password as written in ``url`` and decoded, whole and (if it holds "@") in
    the parts libpq may take for a user, a password or a host."""
    written = QUERY_PASSWORD.findall(url)
    userinfo = PASSWORD_TO_LAST_AT.match(url)
    if userinfo is not None:
        written += [userinfo.group(1), *userinfo.group(1).split("@")]
    return {form for secret in written for form in (secret, unquote(secret)) if form}


def _hidden(text: str, url: str) -> str:
    for password in sorted(_passwords(url), key=len, reverse=True):
        text = text.replace(password, "***")
    return text


def _cause_to_show(error: BaseException, url: str) -> BaseException | None:
    """``error`` to chain to ours, or None if its text shows the password (a traceback
    prints the chained errors)."""
    return error if _hidden(str(error), url) == str(error) else None


#: SQLSTATE classes of a connection in trouble: a connection exception, a server out
#: of resources (too many clients), an operator's intervention (a shutdown, a
#: terminated backend, a statement timeout).
CONNECTION_TROUBLE = ("08", "53", "57")


def connection_trouble(error: BaseException) -> bool:
    """Whether ``error`` says the connection (or the server) failed, not the call: a
    client-side failure, or a server error of a `CONNECTION_TROUBLE` class. (psycopg
    files some server errors of other classes, a function's own bug among them, as
    OperationalError too.)"""
    psycopg = needs_psycopg()
    if not isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state = getattr(error, "sqlstate", None)
    return state is None or state[:2] in CONNECTION_TROUBLE


def translate(error: BaseException, url: str) -> Exception:
    """The package error for a psycopg error raised by a call."""
    if connection_trouble(error):
        return connection_error(url, error)
    return SemaphoreBackendError(
        f"PostgreSQL at {url} answered with an error: {_first_line(error)}"
    )


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def shown(url: str) -> str:
    """``url`` with its password masked, where libpq or a reader sees it."""
    return mask_url(LIBPQ_PASSWORD.sub(r"\1***@", url, count=1))


def connect(url: str) -> Any:
    """A new autocommit connection to ``url`` (each function call is its own
    transaction), or `SemaphoreConnectionError` saying what to do. Behind a pooler, its
    prepared statements are off (`unprepared_behind_pooler`)."""
    psycopg = needs_psycopg()
    connection = None
    try:
        connection = psycopg.Connection.connect(conninfo(url), autocommit=True)
        unprepared_behind_pooler(connection, server_pid(connection))
    except psycopg.Error as error:
        if connection is not None:
            connection.close()
        raise connection_error(url, error) from _cause_to_show(error, url)
    return connection


async def connect_async(url: str) -> Any:
    """`connect` for asyncio."""
    psycopg = needs_psycopg()
    connection = None
    try:
        connection = await psycopg.AsyncConnection.connect(conninfo(url), autocommit=True)
        unprepared_behind_pooler(connection, await server_pid_async(connection))
    except psycopg.Error as error:
        if connection is not None:
            await connection.close()
        raise connection_error(url, error) from _cause_to_show(error, url)
    return connection


# A pooler in front (PgBouncer) ----------------------------------------------------------

SERVER_PID = "SELECT pg_backend_pid()"


def server_pid(connection: Any) -> int:
    """The pid of the server process that runs this connection's next statement."""
    return int(connection.execute(SERVER_PID).fetchone()[0])


async def server_pid_async(connection: Any) -> int:
    """`server_pid` for asyncio."""
    return int((await (await connection.execute(SERVER_PID)).fetchone())[0])


def unprepared_behind_pooler(connection: Any, pid: int) -> None:
    """Turn psycopg's prepared statements off on ``connection`` if a pooler stands
    between it and PostgreSQL: the process its handshake named (BackendKeyData,
    ``info.backend_pid``, which PgBouncer makes up) is not ``pid``, the one that ran a
    statement (`server_pid`).

    Why: psycopg prepares a statement run five times (``prepare_threshold``), on the
    server connection that runs it; PgBouncer in transaction mode (before 1.21, or
    without ``max_prepared_statements``) hands the next call another server connection,
    or this one to another client that prepares its own ``_pg3_0``: "prepared statement
    does not exist" or "already exists". Off, each call (one ``SELECT fn(...)``) is
    parsed and planned again: about 0.15 ms a call (measured directly on PostgreSQL 15),
    while the statements inside the functions keep their cached plans. `behind_pooler`
    reads the mark."""
    if connection.info.backend_pid != pid:
        connection.prepare_threshold = None


def behind_pooler(connection: Any) -> bool:
    """Whether `connect` found a pooler in front of PostgreSQL (its mark: no prepared
    statements on the connection)."""
    return connection.prepare_threshold is None


#: The URLs (as shown) whose waiters poll in this process, said once each.
_POLLING_SAID: set[str] = set()


def say_polling(url: str) -> None:
    """One WARNING per URL and process: its waiters in place poll."""
    if url in _POLLING_SAID:
        return
    _POLLING_SAID.add(url)
    logger.warning(
        "celery-semaphore: PostgreSQL at %s is behind a pooler in transaction (or statement) "
        "mode, where LISTEN cannot work: waiters in place ask again every recheck_interval "
        "instead of being woken; point semaphore_url at PostgreSQL directly or at PgBouncer "
        "in session mode (a port, or a [databases] entry, with pool_mode=session)",
        url,
    )
