"""The versions pyproject.toml allows have the APIs the package calls."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def requirements_of(project: str) -> list[Requirement]:
    """Every requirement on ``project`` in pyproject.toml (dependencies and extras)."""
    quoted = re.findall(r'"([^"]+)"', PYPROJECT.read_text(encoding="utf-8"))
    return [Requirement(t) for t in quoted if re.match(rf"{re.escape(project)}\b(?!-)", t)]


def test_prometheus_client_is_one_whose_start_http_server_returns_the_server() -> None:
    # metrics.serve() unpacks (server, thread), returned from prometheus-client 0.20 on;
    # older versions return None, a TypeError after the port is already taken.
    found = requirements_of("prometheus-client")
    assert len(found) == 2, found  # the prometheus extra and dev
    for requirement in found:
        assert not requirement.specifier.contains("0.19.0"), requirement
        assert requirement.specifier.contains("0.20.0"), requirement
