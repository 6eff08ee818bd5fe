"""The docstrings render as Markdown in the API reference (mkdocstrings), the
signatures it shows carry real default values, not constant names, and the
generated lifecycle picture of the docs is up to date."""

from __future__ import annotations

import ast
import dataclasses
import html
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from celery_semaphore import AsyncSemaphore, Semaphore
from celery_semaphore.config import DEFAULT_REDIS_URL, SemaphoreConfig
from celery_semaphore.core import protocol

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_semaphore"
REST_ROLE = re.compile(r":[a-z]+:`")


def docstrings(tree: ast.Module) -> list[tuple[int, str]]:
    """Module, class and function docstrings, and attribute docstrings (a string
    statement right after an assignment): everything mkdocstrings renders."""
    found = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for statement in body:
            if (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                found.append((statement.lineno, statement.value.value))
    return found


def test_no_rest_roles_in_docstrings() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {match.group(0)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in docstrings(ast.parse(path.read_text(encoding="utf-8")))
        for match in REST_ROLE.finditer(text)
    ]
    assert not offenders, "reST roles render raw in mkdocstrings; use backticks:\n" + "\n".join(
        offenders
    )


def test_the_role_check_sees_roles() -> None:
    tree = ast.parse('"""See :class:`Place`."""\nx = 1\n"""Or :meth:`park`."""\n')
    assert [REST_ROLE.search(text) is not None for _, text in docstrings(tree)] == [True, True]


@pytest.mark.parametrize("cls", [Semaphore, AsyncSemaphore])
def test_semaphore_signature_defaults_are_the_protocol_constants(cls: type) -> None:
    """The signatures spell the defaults out (so the API page shows values); they
    must stay equal to the constants the rest of the package uses."""
    wanted = {
        "lease_timeout": protocol.DEFAULT_LEASE_TIMEOUT,
        "namespace": protocol.DEFAULT_NAMESPACE,
        "waiter_lease": protocol.DEFAULT_WAITER_LEASE,
        "recheck_interval": protocol.DEFAULT_RECHECK_INTERVAL,
        "idle_ttl": protocol.DEFAULT_IDLE_TTL,
        "handover_window": protocol.DEFAULT_HANDOVER_WINDOW,
        "handover_deadline": protocol.DEFAULT_HANDOVER_DEADLINE,
    }
    parameters = inspect.signature(cls).parameters
    assert {name: parameters[name].default for name in wanted} == wanted
    assert inspect.signature(cls.park).parameters["park_lease"].default == protocol.DEFAULT_IDLE_TTL


def test_config_defaults_are_the_protocol_constants() -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(SemaphoreConfig)}
    assert defaults["redis_url"] == DEFAULT_REDIS_URL
    assert defaults["namespace"] == protocol.DEFAULT_NAMESPACE
    assert defaults["lease_timeout"] == protocol.DEFAULT_LEASE_TIMEOUT
    assert defaults["handover_deadline"] == protocol.DEFAULT_HANDOVER_DEADLINE


def test_the_lifecycle_picture_is_what_its_script_draws() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lifecycle_diagram.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_built_api_page_shows_values_and_no_raw_markup(tmp_path: Path) -> None:
    """Build the docs as CI does and read the API page as a browser shows it."""
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", tmp_path],
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    page = (tmp_path / "api" / "index.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert "DEFAULT_" not in text
    assert not re.search(r":(class|meth|mod|func|data|attr|exc|obj):", text)
    assert "lease_timeout: float = 60.0" in text
    assert "redis: str | redis.Redis | redis.RedisCluster" in text
    assert re.search(
        r"redis: str\s*\|\s*redis\.asyncio\.Redis\s*\|\s*redis\.asyncio\.RedisCluster", text
    )
