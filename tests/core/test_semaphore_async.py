"""AsyncSemaphore against a real redis-server: the core behaviours of the sync API,
plus what only coroutines can do (cancellation). Each test runs its own event loop
with ``asyncio.run`` (no pytest plugin needed).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from celery_semaphore import (
    AsyncPermit,
    AsyncSemaphore,
    Handover,
    Place,
    SemaphoreConnectionError,
    SemaphoreKeyTypeError,
    SemaphoreTimeout,
)
from devkit.redis_servers import RedisServer, free_port


@pytest.fixture
def url(redis_session_server: RedisServer) -> str:
    return redis_session_server.url


@asynccontextmanager
async def semaphore(url: str, limit: int = 1, **kwargs: Any) -> AsyncIterator[AsyncSemaphore]:
    kwargs.setdefault("name", f"async-{uuid.uuid4().hex}")
    sem = AsyncSemaphore(url, limit=limit, **kwargs)
    try:
        yield sem
    finally:
        await sem.aclose()


def granted(result: AsyncPermit | Place) -> AsyncPermit:
    assert isinstance(result, AsyncPermit), f"expected a permit, got {result!r}"
    return result


def refused(result: AsyncPermit | Place) -> Place:
    assert isinstance(result, Place), f"expected a refusal, got {result!r}"
    return result


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def waiter_ids(sem: AsyncSemaphore) -> list[str]:
    return [w.holder for w in (await sem.status()).waiters]


def test_acquire_release_and_context_managers(url: str) -> None:
    async def main() -> None:
        async with semaphore(url, 2) as sem:
            a = granted(await sem.attempt("a"))
            b = await sem.acquire(holder="b", timeout=1)
            refused(await sem.attempt("c", queue=False))
            assert await sem.try_acquire("c") is None
            assert (await sem.status()).holder_count == 2
            assert await a.release() is True
            assert await a.release() is False
            assert await sem.release("b") is True
            assert await b.release() is False
            assert await sem.release("nobody") is False
            assert await sem.release("c") is False  # drops c's place in line
            assert (await sem.status()).waiter_count == 0

            async with sem as outer:
                async with sem as inner:
                    holders = {h.holder for h in (await sem.status()).holders}
                    assert holders == {outer.holder, inner.holder}
                holders = {h.holder for h in (await sem.status()).holders}
                assert holders == {outer.holder}
            assert (await sem.status()).holder_count == 0

            with pytest.raises(KeyError):
                async with await sem.acquire(timeout=1):
                    raise KeyError("boom")
            assert (await sem.status()).holder_count == 0

    asyncio.run(main())


def test_reentrance_fencing_renew_and_stale_permits(url: str) -> None:
    async def main() -> None:
        async with semaphore(url, 1, lease_timeout=5) as sem:
            old = granted(await sem.attempt("a"))
            new = granted(await sem.attempt("a"))
            assert new.fencing_token > old.fencing_token
            assert (await sem.status()).holder_count == 1
            assert await old.renew() is False
            assert await old.release() is False
            before = new.expires_at
            assert await new.renew(lease_timeout=60) is True
            assert new.expires_at > before + 50
            assert await sem.renew_many([new, old, "ghost"]) == {"a", "ghost"}
            # "a" is reported lost for the stale permit even though the new one lives:
            assert (await sem.status()).holders[0].fencing_token == new.fencing_token
            assert await new.release() is True
            assert await new.renew() is False

            short = granted(await sem.attempt("short", lease_timeout=0.1))
            await asyncio.sleep(0.2)
            assert await short.renew() is False
            assert (await sem.status()).holder_count == 0

    asyncio.run(main())


def test_coroutines_are_granted_in_the_order_they_queued(url: str) -> None:
    async def main() -> None:
        async with semaphore(url, 1, recheck_interval=0.5) as sem:
            first = granted(await sem.attempt("first"))
            grants: list[tuple[int, str]] = []

            async def contend(holder: str) -> None:
                permit = await sem.acquire(timeout=20, holder=holder)
                grants.append((permit.fencing_token, holder))
                await asyncio.sleep(0.01)
                assert await permit.release()

            names = [f"c{i}" for i in range(8)]
            tasks = []
            for i, holder in enumerate(names):
                tasks.append(asyncio.create_task(contend(holder)))

                async def queued(n: int = i + 1) -> bool:
                    return len(await waiter_ids(sem)) == n

                await eventually(queued)
            assert await waiter_ids(sem) == names
            await first.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 20)
            assert [holder for _, holder in grants] == names
            assert [holder for _, holder in sorted(grants)] == names

    asyncio.run(main())


def test_timeout_raises_and_removes_the_waiter(url: str) -> None:
    async def main() -> None:
        async with semaphore(url, 1) as sem:
            granted(await sem.attempt("holder"))
            started = time.monotonic()
            with pytest.raises(SemaphoreTimeout) as info:
                await sem.acquire(timeout=0.3, holder="late")
            assert 0.3 <= time.monotonic() - started < 2.0
            assert (info.value.name, info.value.limit) == (sem.name, 1)
            assert (await sem.status()).waiter_count == 0
            with pytest.raises(SemaphoreTimeout):
                await sem.acquire(timeout=0)
            assert (await sem.status()).waiter_count == 0

    asyncio.run(main())


def test_cancelling_a_waiter_removes_it_from_the_line(url: str) -> None:
    async def main() -> None:
        async with semaphore(url, 1, recheck_interval=0.5) as sem:
            holder = granted(await sem.attempt("holder"))
            tasks = {}
            for name in ("w1", "w2", "w3"):
                tasks[name] = asyncio.create_task(sem.acquire(timeout=20, holder=name))

                async def queued(name: str = name) -> bool:
                    return (await waiter_ids(sem))[-1:] == [name]

                await eventually(queued)
            await asyncio.sleep(0.1)  # all three are asleep in the wait loop
            tasks["w2"].cancel()
            with pytest.raises(asyncio.CancelledError):
                await tasks["w2"]
            assert await waiter_ids(sem) == ["w1", "w3"]
            await holder.release()
            w1 = await asyncio.wait_for(tasks["w1"], 5)
            assert not tasks["w3"].done()
            await w1.release()
            w3 = await asyncio.wait_for(tasks["w3"], 5)
            assert w3.holder == "w3"
            assert (await sem.status()).waiter_count == 0
            await w3.release()

    asyncio.run(main())


def test_a_blocked_waiter_gets_the_permit_within_100ms_of_the_lease_expiry(url: str) -> None:
    async def main() -> None:
        async with semaphore(url, 1, lease_timeout=10) as sem:
            stuck = granted(await sem.attempt("stuck", lease_timeout=0.8))
            permit = await sem.acquire(timeout=10, holder="waiter")
            # Server clock on both sides (see the sync test for the reasoning).
            latency = permit.expires_at - sem.lease_timeout - stuck.expires_at
            assert 0 <= latency < 0.1, f"{latency * 1000:.0f} ms"

    asyncio.run(main())


def test_raising_the_limit_wakes_a_blocked_coroutine_promptly(url: str) -> None:
    async def main() -> None:
        async with semaphore(url, 1, lease_timeout=30, recheck_interval=5) as sem:
            granted(await sem.attempt("holder"))
            task = asyncio.create_task(sem.acquire(timeout=20, holder="waiter"))

            async def queued() -> bool:
                return await waiter_ids(sem) == ["waiter"]

            await eventually(queued)
            await asyncio.sleep(0.2)
            raised = time.monotonic()
            await sem.set_limit(2)
            permit = await asyncio.wait_for(task, 5)
            assert time.monotonic() - raised < 0.5
            assert permit.holder == "waiter"
            assert await sem.clear_limit() == 2
            assert await sem.set_draining(True) is False
            assert refused(await sem.attempt("x", queue=False)).draining
            assert await sem.set_draining(False) is True

    asyncio.run(main())


def test_status_and_renew_many(url: str) -> None:
    async def main() -> None:
        async with semaphore(url, 2, lease_timeout=30) as sem:
            a = granted(await sem.attempt("a", info="A"))
            granted(await sem.attempt("b"))
            place = refused(await sem.attempt("c", info="C"))
            status = await sem.status()
            assert (status.holder_count, status.waiter_count) == (2, 1)
            assert [h.holder for h in status.holders] == ["a", "b"]
            assert status.holders[0].info == "A"
            assert status.holders[0].fencing_token == a.fencing_token
            assert [(w.holder, w.ticket, w.info) for w in status.waiters] == [
                ("c", place.ticket, "C")
            ]
            assert await sem.renew_many(["a", "b", "c"], lease_timeout=100) == {"c"}
            status = await sem.status()
            assert all(h.expires_at > status.server_time + 99 for h in status.holders)

    asyncio.run(main())


def test_errors(url: str) -> None:
    async def main() -> None:
        async with semaphore(url, 1) as sem:
            await sem.client.set(sem.keys.holders, "oops")
            with pytest.raises(SemaphoreKeyTypeError) as info:
                await sem.attempt("a")
            assert info.value.key == sem.keys.holders
            with pytest.raises(ValueError, match=r"^ticket"):
                await sem.attempt("a", ticket=-1)
            with pytest.raises(TypeError, match=r"^holder"):
                await sem.attempt(5)  # type: ignore[arg-type]
        down = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
        async with semaphore(down, 1) as sem:
            with pytest.raises(SemaphoreConnectionError) as conn:
                await sem.acquire(timeout=1)
            assert "127.0.0.1" in str(conn.value)
            assert "***" in str(conn.value)
            assert "hunter2" not in str(conn.value)

    asyncio.run(main())


def test_a_plain_on_handover_runs_off_the_event_loop(url: str) -> None:
    """A blocking on_handover (a synchronous publish) must not stall the other
    coroutines: this one waits for what only another coroutine of the loop does
    after it started. Run inline on the loop, it would wait in vain."""
    seen: list[object] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started, loop_ran = asyncio.Event(), threading.Event()

        def blocking_publish(handovers: list[Handover]) -> None:
            loop.call_soon_threadsafe(started.set)
            seen.append(loop_ran.wait(5))
            seen.extend(h.holder for h in handovers)

        async def another_coroutine() -> None:
            await started.wait()
            loop_ran.set()

        async with semaphore(url, 1, on_handover=blocking_publish) as sem:
            holder = granted(await sem.attempt("holder"))
            await sem.park("parked", "payload", refused(await sem.attempt("parked")).ticket)
            other = asyncio.create_task(another_coroutine())
            assert await holder.release() is True
            assert seen == [True, "parked"]  # handed over before release() returned
            await asyncio.wait_for(other, 1)

    asyncio.run(main())


def test_a_coroutine_on_handover_is_awaited_with_the_handovers(url: str) -> None:
    published: list[tuple[str, str]] = []

    async def publish(handovers: list[Handover]) -> None:
        await asyncio.sleep(0.01)
        published.extend((h.holder, h.payload) for h in handovers)

    async def main() -> None:
        async with semaphore(url, 1, on_handover=publish) as sem:
            holder = granted(await sem.attempt("holder"))
            await sem.park("parked", "payload", refused(await sem.attempt("parked")).ticket)
            assert published == []
            assert await holder.release() is True
            assert published == [("parked", "payload")]

    asyncio.run(main())
