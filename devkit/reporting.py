"""Small helpers the benchmarks' reports share."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version(name: str) -> str:
    """The installed version of ``name``, or "not installed"."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def verdict(met: bool) -> str:
    """How a report marks a target: "ok", or "MISSED" (said plainly)."""
    return "ok" if met else "MISSED"
