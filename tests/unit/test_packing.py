"""The packer of the clients made from a URL sends what redis-py's own would (no Redis)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.connection import PythonRespSerializer
from redis.exceptions import DataError

from celery_semaphore.core.redis import packing
from celery_semaphore.core.redis.packing import RespPacker, packs_faster

COMMANDS: list[tuple[Any, ...]] = [
    ("PING",),
    ("FCALL", "celery_semaphore_v1_acquire", 2, "k:{a}:holders", b"k:{a}:meta", "h\u00e9", "", 0),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT SETNAME", "x"),
    ("SET", "k", -17, 2.5, 10**20, bytearray(b"\x00\xff"), memoryview(b"view")),
    ("SET", "big", "x" * 70_000),  # past redis-py's buffer cutoff: it sends chunks
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0]))
def test_the_bytes_are_redis_pys(command: tuple[Any, ...]) -> None:
    theirs = PythonRespSerializer(6000, redis.Redis().get_encoder().encode).pack(*command)
    assert RespPacker().pack(*command) == [b"".join(bytes(chunk) for chunk in theirs)]


def test_the_bytes_stay_redis_pys_past_the_kept_arguments() -> None:
    ours, theirs = RespPacker(), PythonRespSerializer(6000, redis.Redis().get_encoder().encode)
    for i in range(packing.CACHED + 10):
        command = ("FCALL", "f", 1, "key", f"task-{i}", i, f"{i}")
        assert ours.pack(*command) == theirs.pack(*command)
    assert len(ours._packed) <= packing.CACHED


def test_the_encoding_is_the_clients() -> None:
    assert RespPacker("latin-1").pack("SET", "\u00e9") == [b"*2\r\n$3\r\nSET\r\n$1\r\n\xe9\r\n"]
    with pytest.raises(UnicodeEncodeError):
        RespPacker("ascii").pack("SET", "\u00e9")


@pytest.mark.parametrize("value", [True, None, object()])
def test_a_value_redis_py_refuses_is_refused(value: Any) -> None:
    with pytest.raises(DataError):
        RespPacker().pack("SET", "k", value)


def test_only_a_pool_that_would_pack_in_python_and_has_no_packer_gets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = redis.ConnectionPool.from_url("redis://127.0.0.1:1/0?encoding=latin-1")
    monkeypatch.setattr(packing, "HIREDIS_AVAILABLE", True)
    packs_faster(pool)
    assert "command_packer" not in pool.connection_kwargs
    monkeypatch.setattr(packing, "HIREDIS_AVAILABLE", False)
    packs_faster(pool)
    packer = pool.connection_kwargs["command_packer"]
    assert isinstance(packer, RespPacker)
    assert packer.pack("SET", "\u00e9") == [b"*2\r\n$3\r\nSET\r\n$1\r\n\xe9\r\n"]
    assert pool.make_connection()._command_packer is packer  # type: ignore[attr-defined]
    given = object()
    pool = redis.ConnectionPool(command_packer=given)
    packs_faster(pool)
    assert pool.connection_kwargs["command_packer"] is given
