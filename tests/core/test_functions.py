"""The scripts as a Redis Functions library (functions.py): chosen at a client's first
call, loaded where missing, again after a restart, refused cleanly (EVALSHA instead),
and two releases of the package on one Redis (a rolling upgrade) each calling only
their own functions. The behaviour of every script under both ways is the rest of the
core suite (``make_semaphore``'s ``sync-evalsha`` runs)."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
import redis
from outcomes import granted

from celery_semaphore import Place, Semaphore
from celery_semaphore.core.redis import functions, scripts
from celery_semaphore.core.redis.discovery import read_counts
from devkit.redis_servers import AclRedisServer, RedisServer

DIGEST = scripts.LIBRARY_NAME.rsplit("_", 1)[1]


def release_library(version: str) -> tuple[str, str, dict[str, str]]:
    """The library another release (``version`` as in a library name: "0_0_9") would
    load: our Lua under its own names."""
    name = f"celery_semaphore_v{version}_{DIGEST}"
    code = scripts.LIBRARY.replace(scripts.LIBRARY_NAME, name)
    named = {
        script: f.replace(scripts.LIBRARY_NAME, name) for script, f in scripts.FUNCTIONS.items()
    }
    return name, code, named


def as_release(client: redis.Redis, version: str) -> redis.Redis:
    """Make ``client`` call the library of release ``version``, as that release would."""
    library = functions.Library(weakref.proxy(client), *release_library(version))
    scripts._registered[client] = functions.calls(client, scripts.SOURCES, library)
    return client


def libraries(client: redis.Redis, pattern: str = "celery_semaphore_v*") -> set[str]:
    return functions._listed(client.function_list(library=pattern))[0]


def cycle(sem: Semaphore, holder: str) -> None:
    granted(sem.attempt(holder)).release()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as made:
        yield made


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    with server.client() as client:
        yield client


def test_the_first_call_loads_the_library_and_calls_go_by_fcall(
    server: RedisServer, admin: redis.Redis
) -> None:
    assert libraries(admin) == set()
    with closing(Semaphore(server.url, "f", 2)) as sem:
        sem.learn_epoch()
        admin.config_resetstat()
        for i in range(5):
            cycle(sem, f"h{i}")
        assert scripts.library_of(sem.client).way == functions.FUNCTIONS
    assert libraries(admin) == {scripts.LIBRARY_NAME}
    stats = admin.info("commandstats")
    assert stats["cmdstat_fcall"]["calls"] == 10, "try_acquire + release, five times"
    assert "cmdstat_evalsha" not in stats


def test_the_environment_turns_functions_off(
    server: RedisServer, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(functions.ENVIRONMENT, "0")
    with closing(Semaphore(server.url, "f", 2)) as sem:
        admin.config_resetstat()
        cycle(sem, "h")
        assert scripts.library_of(sem.client).way == functions.SCRIPTS
    assert libraries(admin) == set(), "nothing loaded"
    assert "cmdstat_fcall" not in admin.info("commandstats")


def test_a_restart_without_persistence_loads_the_library_again(server: RedisServer) -> None:
    with closing(Semaphore(server.url, "f", 2, pause_after_loss=0.01)) as sem:
        cycle(sem, "before")
        server.restart()  # the functions are gone with the data
        sem.learn_epoch()  # the loss: a pause of 10 ms
        time.sleep(0.05)
        cycle(sem, "after")
        assert scripts.library_of(sem.client).way == functions.FUNCTIONS
        with server.client() as admin:
            assert libraries(admin) == {scripts.LIBRARY_NAME}


def test_a_pipeline_of_counts_finds_the_library_gone_and_loads_it(
    server: RedisServer, admin: redis.Redis
) -> None:
    with closing(Semaphore(server.url, "f", 2)) as sem:
        cycle(sem, "h")
        admin.function_flush()
        with server.client() as reader:
            (counts,) = read_counts(reader, sem._spec.namespace, ["f"], url=server.url)
    assert counts.declared_limit == 2
    assert libraries(admin) == {scripts.LIBRARY_NAME}


def test_libraries_of_older_releases_go_but_the_newest_older_one_stays(
    server: RedisServer, admin: redis.Redis
) -> None:
    for version in ("0_0_7", "0_0_8", "0_0_9"):
        admin.function_load(release_library(version)[1])
    admin.function_load("#!lua name=someone_else\nredis.register_function('x', function() end)")
    with closing(Semaphore(server.url, "f", 2)) as sem:
        cycle(sem, "h")
    assert libraries(admin, "*") == {
        scripts.LIBRARY_NAME,
        release_library("0_0_9")[0],
        "someone_else",
    }


def test_two_releases_on_one_redis_call_only_their_own_functions(
    server: RedisServer, admin: redis.Redis
) -> None:
    """A rolling upgrade: the older release's workers and the newer one's share the
    semaphores (the same data), each running its own Lua, whoever loaded last."""
    admin.config_set("slowlog-log-slower-than", 0)
    admin.config_set("slowlog-max-len", 10000)
    older = as_release(server.client(client_name="older"), "0_0_9")
    newer = server.client(client_name="newer")
    old_name = release_library("0_0_9")[0]
    try:
        old_sem, new_sem = Semaphore(older, "shared", 1), Semaphore(newer, "shared", 1)
        if True:
            cycle(old_sem, "o0")  # the older one first: its library only
            assert libraries(admin) == {old_name}
            permit = granted(new_sem.attempt("n0"))  # the newer one loads its own beside it
            assert isinstance(old_sem.attempt("o1", queue=False), Place), "one semaphore, limit 1"
            permit.release()
            for i in range(5):
                cycle(old_sem, f"o{i + 2}")
                cycle(new_sem, f"n{i + 1}")
            admin.function_delete(old_name)  # as a release two ahead would delete it
            cycle(old_sem, "o-after")  # loads its own again, and goes on
            cycle(new_sem, "n-after")
        assert libraries(admin) == {old_name, scripts.LIBRARY_NAME}
        calls = [
            (_name(entry), entry["command"]) for entry in admin.slowlog_get(10000)
            if b"FCALL" in entry["command"][:6].upper()
        ]  # fmt: skip
    finally:
        older.close()
        newer.close()
    assert {who for who, _ in calls} == {"older", "newer"}
    for who, command in calls:
        function = command.split()[1].decode()
        library = old_name if who == "older" else scripts.LIBRARY_NAME
        assert function.startswith(library + "_"), (who, function)


def _name(entry: dict[str, Any]) -> str:
    name = entry.get("client_name", b"")
    return name.decode() if isinstance(name, bytes) else str(name)


def test_a_user_refused_functions_calls_the_scripts(
    acl_redis: AclRedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_semaphore.core.redis.functions")
    with acl_redis.client(password=acl_redis.default_password) as admin:
        admin.execute_command(
            "ACL", "SETUSER", "nofunctions", "on", ">pw", "~*", "&*", "+@all", "-function"
        )
        admin.execute_command(
            "ACL", "SETUSER", "noload", "on", ">pw", "~*", "&*", "+@all", "-function|load"
        )
        for user in ("nofunctions", "noload"):
            url = f"redis://{user}:pw@{acl_redis.host}:{acl_redis.port}/0"
            with closing(Semaphore(url, f"f-{user}", 2)) as sem:
                admin.config_resetstat()
                cycle(sem, "h")
                assert scripts.library_of(sem.client).way == functions.SCRIPTS, user
            stats = admin.info("commandstats")
            assert stats["cmdstat_evalsha"]["calls"] >= 2 and "cmdstat_fcall" not in stats, user
        assert libraries(admin) == set()
    assert {r.levelno for r in caplog.records} == {logging.INFO}, "a refusal is no warning"


def test_the_library_is_loaded_on_every_primary_of_a_cluster(redis_cluster: Any) -> None:
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    with closing(Semaphore(url, "f", 2)) as sem:
        cycle(sem, "h")
        assert scripts.library_of(sem.client).way == functions.FUNCTIONS
        for listing in sem.client.function_list(library="celery_semaphore_v*").values():
            assert functions._listed(listing)[0] == {scripts.LIBRARY_NAME}


@pytest.mark.parametrize(
    ("listed", "load", "deleted"),
    [
        ([], True, []),
        ([scripts.LIBRARY_NAME], False, []),
        ([scripts.LIBRARY_NAME, "celery_semaphore_v0_0_1_" + "a" * 12], False, []),
        (["celery_semaphore_v0_0_1_" + "a" * 12, "celery_semaphore_v0_0_2_" + "b" * 12], True,
         ["celery_semaphore_v0_0_1_" + "a" * 12]),
        (["celery_semaphore_v9_0_0_" + "a" * 12, "celery_semaphore_v0_1_0_" + "b" * 12], True, []),
        (["other", "celery_semaphore_vx_" + "a" * 12], True, []),
    ],
)  # fmt: skip
def test_the_plan(listed: list[str], load: bool, deleted: list[str]) -> None:
    listing = [
        [b"library_name", name.encode(), b"engine", b"LUA", b"functions", []] for name in listed
    ]
    assert functions.plan(listing, scripts.LIBRARY_NAME) == (load, deleted)


def test_a_library_that_does_not_load_is_a_warning_and_the_scripts_run(
    server: RedisServer, admin: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A refusal is expected (INFO, above); a library that fails to load is a bug of
    ours, which would otherwise only show as a slower semaphore."""
    client = server.client()
    name = f"celery_semaphore_v0_1_0_{'f' * 12}"
    broken = functions.Library(weakref.proxy(client), name, f"#!lua name={name}\nlocal x = (", {})
    scripts._registered[client] = functions.calls(client, {}, broken)
    with caplog.at_level(logging.INFO, logger="celery_semaphore.core.redis.functions"):
        assert broken.choose() == functions.SCRIPTS
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "Functions library" in record.getMessage()
    client.close()
