"""The semaphore over every way of reaching Redis, against real redis-server processes.

Plain TCP, Unix socket, TLS, ACL users, Redis Cluster and Sentinel (including a
failover), each by URL and by a ready client, sync and asyncio. Every check looks at
what Redis answered or holds, so a connection form that silently went elsewhere (wrong
db, wrong node, no TLS verification, lost wake-ups) fails a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any
from urllib.parse import quote

import pytest
import redis
import redis.asyncio.cluster
from redis.sentinel import Sentinel

from celery_semaphore import Semaphore
from celery_semaphore.core import AsyncSemaphore
from celery_semaphore.core.errors import (
    SemaphoreBackendError,
    SemaphoreConnectionError,
    SemaphoreError,
)
from celery_semaphore.core.protocol import DEFAULT_NAMESPACE
from celery_semaphore.core.redis.keys import semaphore_keys
from celery_semaphore.core.results import Place
from devkit.redis_servers import (
    AclRedisServer,
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    TlsRedisServer,
    UnixSocketRedisServer,
    wait_until,
)

# Waiters sleep at most this long between re-checks when no message comes; wake-up
# tests release well inside it, so only a pub/sub message can explain a fast grant.
RECHECK = 5.0
WAKE_BOUND = 1.0  # seconds from release to grant that only a pub/sub wake-up meets
CERT_FAILED = r"(?i)certificate verify failed"


# --- shared workloads ---------------------------------------------------------------------


def exercise(sem: Semaphore) -> None:
    """Every basic operation once on a limit-1 semaphore, each checked by its answer."""
    first = sem.acquire(timeout=5, info="first")
    place = sem.attempt(holder="second")
    assert isinstance(place, Place) and place.position == 1
    status = sem.status()
    assert [h.holder for h in status.holders] == [first.holder]
    assert [w.holder for w in status.waiters] == ["second"]
    assert first.renew(lease_timeout=60)
    assert first.expires_at > status.server_time + 50
    assert sem.set_limit(2) is None
    second = sem.try_acquire(holder="second")
    assert second is not None and second.fencing_token > first.fencing_token
    assert sem.status().effective_limit == 2
    assert sem.renew_many([first, second]) == set()
    assert first.release() and not first.release()
    assert sem.renew_many([first, second]) == {first.holder}
    assert sem.clear_limit() == 2
    assert second.release()
    assert sem.status().holder_count == 0


def assert_release_wakes_waiter(waiting: Semaphore, releasing: Semaphore) -> None:
    """A blocked ``acquire`` on ``waiting`` gets the permit released through ``releasing``
    long before its re-check interval: the release's PUBLISH reached its subscription."""
    assert waiting.name == releasing.name and waiting.limit == 1
    holder = releasing.acquire(timeout=5)
    outcome: dict[str, Any] = {}

    def wait() -> None:
        try:
            outcome["permit"] = waiting.acquire(timeout=3 * RECHECK)
            outcome["at"] = time.monotonic()
        except BaseException as exc:  # reported by the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        wait_until(lambda: subscribers(releasing) == 1, 5, "the waiter to subscribe")
        time.sleep(0.2)  # past its re-check after SUBSCRIBE: asleep in get_message(RECHECK)
        assert releasing.status().waiter_count == 1
        released_at = time.monotonic()
        assert holder.release()
    finally:
        thread.join(3 * RECHECK + 5)
    assert "error" not in outcome, outcome.get("error")
    delay = outcome["at"] - released_at
    assert delay < WAKE_BOUND, f"waiter got the permit {delay:.2f}s after the release"
    assert outcome["permit"].release()


def subscribers(sem: Semaphore) -> int:
    """How many connections listen on the semaphore's wake channel (all cluster nodes)."""
    return sum(n for _, n in sem.client.pubsub_numsub(sem.keys.channel))


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coroutine)
    gc.collect()  # an unclosed connection left behind surfaces now, as a ResourceWarning


async def async_subscribers(sem: AsyncSemaphore) -> int:
    """:func:`subscribers`; the asyncio cluster client asks one node only unless told."""
    client, channel = sem.client, sem.keys.channel
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        replies = [await client.pubsub_numsub(channel, target_nodes=n) for n in client.get_nodes()]
    else:
        replies = [await client.pubsub_numsub(channel)]
    return sum(n for reply in replies for _, n in reply)


async def exercise_async(url: str, name: str) -> None:
    """:func:`exercise` and :func:`assert_release_wakes_waiter` with two AsyncSemaphores."""
    sem = AsyncSemaphore(url, name, 1, recheck_interval=RECHECK)
    other = AsyncSemaphore(url, name, 1, recheck_interval=RECHECK)
    try:
        first = await sem.acquire(timeout=5)
        assert isinstance(await sem.attempt(holder="second"), Place)
        status = await sem.status()
        assert [h.holder for h in status.holders] == [first.holder]
        assert [w.holder for w in status.waiters] == ["second"]
        assert await first.renew(lease_timeout=60)
        assert await sem.set_limit(2) is None
        second = await sem.try_acquire(holder="second")
        assert second is not None and second.fencing_token > first.fencing_token
        assert await sem.renew_many([first, second]) == set()
        assert await second.release() and not await second.release()
        assert await sem.clear_limit() == 2

        # ``first`` still holds the only permit: a waiter on the other client blocks.
        waiter = asyncio.create_task(other.acquire(timeout=3 * RECHECK))

        async def subscribed() -> None:
            while await async_subscribers(sem) != 1:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(subscribed(), 5)
        await asyncio.sleep(0.2)  # past its re-check after SUBSCRIBE: asleep in get_message
        assert (await sem.status()).waiter_count == 1
        released_at = time.monotonic()
        assert await first.release()
        permit = await asyncio.wait_for(waiter, 3 * RECHECK)
        delay = time.monotonic() - released_at
        assert delay < WAKE_BOUND, f"waiter got the permit {delay:.2f}s after the release"
        assert await permit.release()
        assert (await sem.status()).holder_count == 0
    finally:
        await sem.aclose()
        await other.aclose()


@contextlib.contextmanager
def semaphores(target: Any, name: str, limit: int = 1, **options: Any) -> Iterator[Semaphore]:
    sem = Semaphore(target, name, limit, **options)
    try:
        yield sem
    finally:
        sem.close()


def db_of(url: str, db: int) -> str:
    return re.sub(r"/\d+$", f"/{db}", url)


# --- plain TCP and Unix socket ------------------------------------------------------------


def test_plain_url_and_db_number(redis_server: RedisServer, redis_url: str) -> None:
    url = db_of(redis_url, 3)
    with semaphores(url, "plain", recheck_interval=RECHECK) as sem:
        assert sem.url == url
        exercise(sem)
        with semaphores(url, "plain", recheck_interval=RECHECK) as other:
            assert_release_wakes_waiter(sem, other)
        with sem.acquire():
            with redis.Redis(redis_server.host, redis_server.port, db=3) as db3:
                assert db3.exists(sem.keys.holders) == 1  # in the URL's db, not db 0
            with redis_server.client() as db0:
                assert db0.dbsize() == 0


def test_ready_redis_client(redis_server: RedisServer) -> None:
    with redis.Redis(redis_server.host, redis_server.port) as client:
        with semaphores(client, "ready", recheck_interval=RECHECK) as sem:
            assert sem.url == f"redis://127.0.0.1:{redis_server.port}/0"
            exercise(sem)
            with semaphores(redis_server.url, "ready", recheck_interval=RECHECK) as other:
                assert_release_wakes_waiter(sem, other)
        assert client.ping()  # a semaphore never closes a client it was given


def test_unix_socket_url_and_client(unix_redis: UnixSocketRedisServer) -> None:
    assert unix_redis.url.startswith("unix://")
    with semaphores(unix_redis.url, "unix", recheck_interval=RECHECK) as sem:
        exercise(sem)
        with (
            redis.Redis(unix_socket_path=str(unix_redis.socket_path)) as client,
            semaphores(client, "unix", recheck_interval=RECHECK) as other,
        ):
            assert other.url == f"unix://{unix_redis.socket_path}"
            assert_release_wakes_waiter(sem, other)
            assert client.client_info()["addr"].startswith("/")  # really the socket


# --- TLS ----------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", ["", "&ssl_cert_reqs=required"])
def test_tls_url_with_ca_in_query(tls_redis: TlsRedisServer, extra: str) -> None:
    url = f"{tls_redis.url}?ssl_ca_certs={quote(str(tls_redis.ca_path))}{extra}"
    with semaphores(url, "tls", recheck_interval=RECHECK) as sem:
        exercise(sem)
        with semaphores(url, "tls", recheck_interval=RECHECK) as other:
            assert_release_wakes_waiter(sem, other)


def test_tls_ready_client(tls_redis: TlsRedisServer) -> None:
    with (
        redis.Redis(
            tls_redis.host, tls_redis.port, ssl=True, ssl_ca_certs=str(tls_redis.ca_path)
        ) as client,
        semaphores(client, "tls-client") as sem,
    ):
        assert sem.url == f"rediss://127.0.0.1:{tls_redis.port}/0"
        exercise(sem)


def test_tls_without_the_ca_is_refused(tls_redis: TlsRedisServer) -> None:
    with (
        semaphores(tls_redis.url, "tls") as sem,
        pytest.raises(SemaphoreConnectionError, match=CERT_FAILED) as e,
    ):
        sem.try_acquire()
    assert tls_redis.url in str(e.value)
    # retry=None: redis.Redis() retries a failed connect 10 times with backoff (~5 s);
    # Redis.from_url does not retry.
    with (
        redis.Redis(tls_redis.host, tls_redis.port, ssl=True, retry=None) as client,
        semaphores(client, "tls") as sem,
        pytest.raises(SemaphoreConnectionError, match=CERT_FAILED) as e,
    ):
        sem.status()
    assert f"rediss://127.0.0.1:{tls_redis.port}/0" in str(e.value)


def test_plain_text_to_a_tls_port_fails_fast(tls_redis: TlsRedisServer) -> None:
    url = f"redis://{tls_redis.host}:{tls_redis.port}/0?socket_timeout=2"
    started = time.monotonic()
    with semaphores(url, "tls") as sem, pytest.raises(SemaphoreConnectionError) as e:
        sem.try_acquire()
    assert url in str(e.value) and time.monotonic() - started < 10


# --- ACL ----------------------------------------------------------------------------------


def test_acl_user_in_url(acl_redis: AclRedisServer) -> None:
    with semaphores(acl_redis.url, "acl", recheck_interval=RECHECK) as sem:
        assert acl_redis.password not in repr(sem)
        exercise(sem)
        with semaphores(acl_redis.default_user_url, "acl", recheck_interval=RECHECK) as other:
            assert_release_wakes_waiter(sem, other)  # the ACL user may SUBSCRIBE


@pytest.mark.parametrize("form", ["user", "default user", "query"])
def test_wrong_password_is_a_masked_connection_error(acl_redis: AclRedisServer, form: str) -> None:
    secret = "not-the-s3cret"
    host = f"{acl_redis.host}:{acl_redis.port}"
    url, masked = {
        "user": (f"redis://app:{secret}@{host}/0", f"redis://app:***@{host}/0"),
        "default user": (f"redis://:{secret}@{host}/0", f"redis://:***@{host}/0"),
        "query": (f"redis://{host}/0?password={secret}", f"redis://{host}/0?password=***"),
    }[form]
    with semaphores(url, "acl") as sem:
        assert secret not in repr(sem)
        with pytest.raises(SemaphoreConnectionError) as e:
            sem.acquire(timeout=1)
    message = str(e.value)
    assert masked in message and e.value.url == masked
    assert secret not in message and secret not in repr(e.value)
    assert "credentials" in message


def test_no_credentials_is_a_clear_error(acl_redis: AclRedisServer) -> None:
    with semaphores(acl_redis.no_auth_url, "acl") as sem, pytest.raises(SemaphoreError) as e:
        sem.try_acquire()
    assert isinstance(e.value, SemaphoreConnectionError)
    assert acl_redis.no_auth_url in str(e.value)
    assert re.search(r"(?i)auth", str(e.value)) and "credentials" in str(e.value)


def _hinted_rules(acl_redis: AclRedisServer) -> list[str]:
    """Make a user allowed only GET; return the ACL rules its error message asks for."""
    with acl_redis.client(password=acl_redis.default_password) as admin:
        admin.execute_command("ACL", "SETUSER", "limited", "on", ">pw", "~*", "+get")
    url = f"redis://limited:pw@{acl_redis.host}:{acl_redis.port}/0"
    with semaphores(url, "acl") as sem, pytest.raises(SemaphoreBackendError) as e:
        sem.try_acquire()
    message = str(e.value)
    assert "denied a command" in message and "'evalsha'" in message
    assert "redis://limited:***@" in message and ":pw@" not in message
    hint = re.search(r"grant the ACL user (.+?) on the semaphore keys", message)
    assert hint is not None, message
    return hint.group(1).split()


def _workload(url: str, name: str) -> None:
    """Every command the semaphore sends: scripts, a queued waiter, SUBSCRIBE, a wake-up."""
    with semaphores(url, name) as sem:
        permit = sem.acquire(timeout=1)
        assert isinstance(sem.attempt(holder="queued"), Place)
        with pytest.raises(TimeoutError):
            sem.acquire(timeout=0.2)  # SUBSCRIBE
        assert permit.renew()
        sem.status()
        sem.set_limit(1)
        assert permit.release()  # PUBLISH: "queued" waits
        sem.release("queued")


def test_acl_denial_names_exactly_the_rules_needed(acl_redis: AclRedisServer) -> None:
    rules = _hinted_rules(acl_redis)
    assert "+@scripting" in rules
    base = ["on", ">pw", "~celery_semaphore:*", "&celery_semaphore:*"]
    with acl_redis.client(password=acl_redis.default_password) as admin:
        admin.execute_command("ACL", "SETUSER", "hinted", *base, *rules)
        for index, rule in enumerate(rules):
            admin.execute_command("ACL", "SETUSER", f"without{index}", *base, *rules)
            admin.execute_command("ACL", "SETUSER", f"without{index}", rule.replace("+", "-", 1))
    url = f"redis://{{}}:pw@{acl_redis.host}:{acl_redis.port}/0"
    _workload(url.format("hinted"), "hinted")  # the hint suffices ...
    for index, rule in enumerate(rules):  # ... and every rule in it is needed
        with pytest.raises(SemaphoreBackendError, match="denied a command") as e:
            _workload(url.format(f"without{index}"), f"without{index}")
        assert "grant the ACL user" in str(e.value), (rule, str(e.value))


# --- Redis Cluster ------------------------------------------------------------------------


@pytest.fixture(params=["url", "client"])
def cluster_target(
    request: pytest.FixtureRequest, redis_cluster: RedisClusterServers
) -> Iterator[Any]:
    """What a user passes for a cluster: a ``redis+cluster://`` URL or a RedisCluster."""
    if request.param == "url":
        yield redis_cluster.url.replace("redis://", "redis+cluster://")
    else:
        with redis_cluster.client() as client:
            yield client


def test_cluster_basic_operations(cluster_target: Any) -> None:
    with semaphores(cluster_target, "cluster") as sem:
        assert sem.url.startswith("redis+cluster://127.0.0.1:")
        exercise(sem)


def test_cluster_fifo(cluster_target: Any) -> None:
    with semaphores(cluster_target, "fifo") as sem:
        holder = sem.acquire(timeout=5)
        tickets = {}
        for name in ("w1", "w2", "w3"):
            place = sem.attempt(holder=name)
            assert isinstance(place, Place)
            tickets[name] = place.ticket
        assert [w.holder for w in sem.status().waiters] == ["w1", "w2", "w3"]
        assert holder.release()
        assert isinstance(sem.attempt(holder="w2"), Place)  # w1 is earlier in line
        for name in ("w1", "w2", "w3"):
            permit = sem.attempt(holder=name, ticket=tickets[name])
            assert not isinstance(permit, Place), name
            assert permit.release()


def test_cluster_semaphores_spread_over_slots_each_on_one(
    redis_cluster: RedisClusterServers,
) -> None:
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    with redis_cluster.client() as admin:
        chosen: dict[str, tuple[str, int]] = {}  # owning node -> (name, slot)
        names = ["tenant{7}/export", *(f"sem-{i}" for i in range(100))]
        for name in names:
            slot = admin.cluster_keyslot(semaphore_keys(DEFAULT_NAMESPACE, name).holders)
            owner = admin.nodes_manager.get_node_from_slot(slot).name
            chosen.setdefault(owner, (name, slot))
            if len(chosen) == len(redis_cluster.nodes):
                break
        assert len(chosen) == 3 and "tenant{7}/export" in [n for n, _ in chosen.values()]
        for owner, (name, slot) in chosen.items():
            with semaphores(url, name) as sem:
                permit = sem.acquire(timeout=5)
                assert isinstance(sem.attempt(holder="waiting"), Place)  # all six keys exist
                keys = [*sem.keys.call_keys, sem.keys.channel]
                slots = {admin.cluster_keyslot(key) for key in keys}  # asks the server
                assert slots == {slot}, (name, slots)
                host, port = owner.rsplit(":", 1)
                with redis.Redis(host, int(port)) as node:
                    # the six, and the epoch hash of the slot
                    assert node.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 7
                    assert node.exists(*sem.keys.script_keys) == 6
                assert permit.release()
                sem.release("waiting")
                assert sem.status().waiter_count == 0
        assert len({slot for _, slot in chosen.values()}) == 3


def test_cluster_release_wakes_a_blocked_waiter(redis_cluster: RedisClusterServers) -> None:
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    with (
        redis_cluster.client() as client,
        semaphores(url, "wake", recheck_interval=RECHECK) as waiting,
        semaphores(client, "wake", recheck_interval=RECHECK) as releasing,
    ):
        assert_release_wakes_waiter(waiting, releasing)
        assert_release_wakes_waiter(releasing, waiting)


# --- Sentinel -----------------------------------------------------------------------------


def sentinel_url(servers: RedisSentinelServers, suffix: str = "") -> str:
    host, port = servers.sentinel_addresses[0]
    return f"redis+sentinel://{host}:{port}/{servers.service_name}{suffix}"


def test_sentinel_url(redis_sentinel: RedisSentinelServers) -> None:
    url = sentinel_url(redis_sentinel)
    with semaphores(url, "sentinel", recheck_interval=RECHECK) as sem:
        assert sem.url == url
        exercise(sem)
        with semaphores(url, "sentinel", recheck_interval=RECHECK) as other:
            assert_release_wakes_waiter(sem, other)
        with sem.acquire(), redis.Redis(*redis_sentinel.master_address()) as master:
            assert master.exists(sem.keys.holders) == 1  # written on Sentinel's master


def test_sentinel_url_with_db_and_query_options(redis_sentinel: RedisSentinelServers) -> None:
    # db from the path and typed query options (socket_timeout must become a float)
    with (
        semaphores(sentinel_url(redis_sentinel, "/2?socket_timeout=5"), "db") as sem,
        sem.acquire(),
        redis.Redis(*redis_sentinel.master_address(), db=2) as master,
    ):
        assert master.exists(sem.keys.holders) == 1
        assert sem.client.connection_pool.connection_kwargs["socket_timeout"] == 5.0


def test_sentinel_ready_client(redis_sentinel: RedisSentinelServers) -> None:
    sentinel = Sentinel(redis_sentinel.sentinel_addresses)
    try:
        with (
            sentinel.master_for(redis_sentinel.service_name) as client,
            semaphores(client, "sentinel-client") as sem,
        ):
            assert sem.url == sentinel_url(redis_sentinel)
            exercise(sem)
    finally:
        for client in sentinel.sentinels:
            client.close()


def _retry_in_switch(call: Callable[[], Any], errors: list[BaseException]) -> Any:
    """Only for calls that may run while the master is down: see the failover test."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return call()
        except SemaphoreConnectionError as exc:
            errors.append(exc)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.chaos
def test_sentinel_failover_keeps_the_semaphore_working(
    redis_sentinel: RedisSentinelServers,
) -> None:
    """What holds across a failover, Redis replication being asynchronous:

    - a permit whose write the replica acknowledged (``WAIT 1``) survives: its renew
      answers True and it still counts against the limit on the new master;
    - a permit whose write had not reached the replica when the master died is *lost*:
      its renew answers False (no exception), and the new master grants its slot again,
      so until the lost holder next renews, more holders believe they hold a permit than
      the limit allows. The new grant's fencing token is larger, so a resource that
      checks tokens rejects the lost holder. This is inherent to Redis replication.
      To observe it every run rather than by luck, the replica is kept from applying
      the replication stream (``CLIENT PAUSE WRITE`` on it) while ``late`` is written;
      a replica drops what it received but had not applied when its master link breaks.

    While the master is down and Sentinel has not promoted the replica yet, calls fail
    with SemaphoreConnectionError (nothing answers at the only master address Sentinel
    knows): the background loop retries those, and any other exception fails the test.
    Once ``failover()`` returned, the very same Semaphore must work without any retry.
    """
    url = sentinel_url(redis_sentinel)
    with semaphores(url, "failover", 3, recheck_interval=0.5) as sem:
        a, b = sem.acquire(holder="a"), sem.acquire(holder="b")
        assert sem.client.wait(1, 5000) == 1  # a and b are on the replica
        with redis_sentinel.replica.client() as replica:
            replica.execute_command("CLIENT", "PAUSE", 2000, "WRITE")
        late = sem.acquire(holder="late")  # acknowledged by the master only

        stop = threading.Event()
        switch_errors: list[BaseException] = []
        other_errors: list[BaseException] = []
        answers: list[set[str]] = []

        def keep_renewing() -> None:
            while not stop.is_set():
                try:
                    answers.append(_retry_in_switch(lambda: sem.renew_many([a]), switch_errors))
                except BaseException as exc:
                    other_errors.append(exc)
                    return
                time.sleep(0.05)

        thread = threading.Thread(target=keep_renewing)
        thread.start()
        old_master = redis_sentinel.master_address()
        try:
            new_master = redis_sentinel.failover()
        finally:
            stop.set()
            thread.join(60)
        assert not other_errors, other_errors
        assert new_master != old_master
        assert answers
        assert all(lost == set() for lost in answers)

        # The same Semaphore object, without any retry from here on.
        survived = {p.holder: p.renew() for p in (a, b, late)}
        assert survived == {"a": True, "b": True, "late": False}
        assert {h.holder for h in sem.status().holders} == {"a", "b"}
        with redis.Redis(*new_master) as master:
            assert master.zcard(sem.keys.holders) == 2  # the new master answers

        fresh = []
        while not isinstance(permit := sem.attempt(queue=False), Place):
            fresh.append(permit)
        assert len(fresh) == 1  # the limit holds for what the new master knows ...
        believing = len(fresh) + 3  # ... but a, b and late all believe they hold
        assert fresh[0].fencing_token > late.fencing_token
        print(
            f"failover {old_master} -> {new_master}: the unreplicated permit was lost "
            f"(its renew answered False); {believing} holders believed they held one of "
            f"3 permits until it renewed; {len(switch_errors)} SemaphoreConnectionErrors "
            "were retried while no master answered"
        )
        assert not late.release()
        for permit in (*fresh, a, b):
            assert permit.release()
        assert sem.acquire(timeout=5).release()
        assert sem.status().holder_count == 0


# --- asyncio ------------------------------------------------------------------------------


def test_async_plain_url(redis_url: str) -> None:
    run(exercise_async(redis_url, "async-plain"))


def test_async_cluster_url(redis_cluster: RedisClusterServers) -> None:
    run(exercise_async(redis_cluster.url.replace("redis://", "redis+cluster://"), "async-cl"))


def test_async_sentinel_url(redis_sentinel: RedisSentinelServers) -> None:
    run(exercise_async(sentinel_url(redis_sentinel), "async-sentinel"))


def test_async_ready_cluster_client(redis_cluster: RedisClusterServers) -> None:
    async def main() -> None:
        host, port = redis_cluster.nodes[0].address
        client = redis.asyncio.cluster.RedisCluster(host, port)
        try:
            sem = AsyncSemaphore(client, "async-ready", 1)
            assert sem.url == f"redis+cluster://{host}:{port}"
            async with sem as permit:
                assert await permit.renew()
                assert (await sem.status()).holder_count == 1
            assert (await sem.status()).holder_count == 0
        finally:
            await client.aclose()

    run(main())
