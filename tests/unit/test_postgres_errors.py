"""Which psycopg errors the PostgreSQL store reports as a connection in trouble (the
caller may retry, the store reconnects) and which as the database's answer."""

from __future__ import annotations

import psycopg
import pytest

from celery_semaphore.core.errors import SemaphoreBackendError, SemaphoreConnectionError
from celery_semaphore.core.postgres.connection import translate

URL = "postgresql://app:***@db.internal/app"


@pytest.mark.parametrize(
    "sqlstate",
    [
        "08006",  # connection_failure
        "57P01",  # admin_shutdown: pg_terminate_backend, a restart
        "53300",  # too_many_connections
    ],
)
def test_a_connection_in_trouble_is_a_connection_error(sqlstate: str) -> None:
    error = psycopg.errors.lookup(sqlstate)("the server said so")
    translated = translate(error, URL)
    assert type(translated) is SemaphoreConnectionError
    assert URL in str(translated)


def test_a_client_side_failure_is_a_connection_error() -> None:
    translated = translate(psycopg.OperationalError("server closed the connection"), URL)
    assert type(translated) is SemaphoreConnectionError


def test_a_functions_own_error_is_not_taken_for_a_lost_connection() -> None:
    """psycopg files SQLSTATE class 55 under OperationalError; a bug in a function is
    not a reason to tell the user to check that PostgreSQL runs."""
    error = psycopg.errors.lookup("55000")('record "room" is not assigned yet')
    translated = translate(error, URL)
    assert type(translated) is SemaphoreBackendError
    assert str(translated) == (
        f'PostgreSQL at {URL} answered with an error: record "room" is not assigned yet'
    )
    assert "check that PostgreSQL runs" not in str(translated)
