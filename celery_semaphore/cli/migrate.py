"""``migrate``: install the PostgreSQL store's tables and functions ahead of time.

Every process installs what is missing at its first call
(`celery_semaphore.core.postgres.schema`); this command does it once, as a user that
may create schemas, for deployments whose application user may not (``--sql``: the
script, for a DBA to run).
"""

from __future__ import annotations

import click

from celery_semaphore.config import get_config, url_setting
from celery_semaphore.core import SemaphoreError
from celery_semaphore.core.postgres import schema
from celery_semaphore.core.postgres.connection import (
    connect,
    is_postgres_url,
    needs_psycopg,
    shown,
    translate,
)
from celery_semaphore.core.stores import MEMORY

from .errors import SemaphoreCommand, one_line


@click.command(cls=SemaphoreCommand, example="migrate --sql")
@click.option("--sql", "as_sql", is_flag=True, help="Print the SQL instead, connecting to nothing.")
@click.pass_context
def migrate(ctx: click.Context, as_sql: bool) -> None:
    """Install the PostgreSQL store's tables and this release's functions in the
    database of the app's semaphore_url (a postgresql:// URL), if they are missing.

    Run it as a user that may create schemas there; then the app's user needs USAGE
    on the schemas and SELECT, INSERT, UPDATE, DELETE on the tables. With --sql it
    prints the script instead (for a DBA), and connects to nothing. A Redis store
    needs no migration: it loads its library itself.
    """
    if as_sql:
        click.echo(schema.sql_text(), nl=False)
        return
    app = ctx.obj.app
    url = get_config(app).redis_url
    if url.startswith(MEMORY):
        click.echo("nothing to migrate: the memory store keeps its semaphores in each process")
        return
    if not is_postgres_url(url):
        click.echo("nothing to migrate: the Redis store loads its library itself")
        return
    where = shown(url)
    try:
        installed = _install(url)
    except ImportError as error:
        raise click.ClickException(str(error)) from None
    except SemaphoreError as error:
        raise click.ClickException(
            f"{one_line(str(error))}; the URL comes from {url_setting(app)}"
        ) from None
    done = "installed" if installed else "already installed:"
    click.echo(f"{done} version {schema.VERSION} (functions schema {schema.FUNCTIONS}) at {where}")


def _install(url: str) -> bool:
    """Install the schema in ``url``'s database; whether it was missing. Errors are
    the package's (the password masked)."""
    psycopg = needs_psycopg()
    connection = connect(url)
    try:
        return schema.install(connection, shown(url))
    except psycopg.Error as error:
        raise translate(error, shown(url)) from error
    finally:
        connection.close()
