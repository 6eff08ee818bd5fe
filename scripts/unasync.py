"""Write the synchronous semaphore from the asyncio one, or check that it is up to date.

Each ``_async/`` folder of ``celery_semaphore/core/`` (the semaphores, the permit, the
store protocol; the Redis and the memory stores in ``core/redis/`` and ``core/memory/``)
is the one source of both APIs. This script turns each file into its twin in the
``_sync/`` folder beside it by renaming tokens (``async def`` -> ``def``,
``await x`` -> ``x``, ``AsyncSemaphore`` -> ``Semaphore``, ...) and formatting the
result with ruff, so the two cannot drift apart:

    python scripts/unasync.py           # rewrite the sync files
    python scripts/unasync.py --check   # exit 1 if a sync file differs (the test command)
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "celery_semaphore" / "core"
SOURCE = CORE / "_async" / "semaphore.py"
TARGET = CORE / "_sync" / "semaphore.py"
FORMAT_AS = TARGET  # ruff picks the project's settings by this path
#: The other modules generated the same way (each formatted as its twin), as paths
#: under ``core/`` of their ``_async/`` sources.
OTHERS = (
    "_async/semaphore_set.py",
    "_async/permit.py",
    "_async/store.py",
    "redis/_async/listening.py",
    "redis/_async/store.py",
    "memory/_async/store.py",
    "postgres/_async/store.py",
)
HEADER = (
    "# Generated from celery_semaphore/core/{name} by scripts/unasync.py:\n"
    "# do not edit; edit the asyncio source and run the script.\n"
)

# Whole words only, applied in this order.
RENAMES = [
    (r"async def ", "def "),
    (r"async with ", "with "),
    (r"async for ", "for "),
    (r"await ", ""),
    (r"\bAsyncSemaphore\b", "Semaphore"),
    (r"\bAsyncPermit\b", "Permit"),
    (r"\bAsyncSemaphoreSet\b", "SemaphoreSet"),
    (r"\bAsyncPermitSet\b", "PermitSet"),
    (r"\bcore\._async\.", "core._sync."),
    (r"\bcore\.redis\._async\.", "core.redis._sync."),
    (r"\bcore\.memory\._async\.", "core.memory._sync."),
    (r"\bcore\.postgres\._async\.", "core.postgres._sync."),
    (r"\bAsyncPostgresStore\b", "PostgresStore"),
    (r"\binstall_async\b", "install"),
    (r"\bAsyncStore\b", "Store"),
    (r"\bAsyncRedisStore\b", "RedisStore"),
    (r"\bAsyncMemoryStore\b", "MemoryStore"),
    (r"\bAsyncRedisOperations\b", "RedisOperations"),
    (r"\bAsyncMemoryOperations\b", "MemoryOperations"),
    (r"\basync_store\b", "sync_store"),
    (r"\bAsyncClient\b", "SyncClient"),
    (r"\bconnect_async\b", "connect"),
    (r"\bcall_on_handover_async\b", "call_on_handover"),
    (r"\bcheck_on_handover_async\b", "check_on_handover"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"(?m)^import asyncio\n", ""),
    (r"(?m)^(    +)import redis\.asyncio\n", r"\1import redis\n"),  # under TYPE_CHECKING
    (r"(?m)^import redis\.asyncio\n", ""),
    (r"\bredis\.asyncio\.", "redis."),
]


def unasync(text: str, name: str = "_async/semaphore.py") -> str:
    for pattern, replacement in RENAMES:
        text = re.sub(pattern, replacement, text)
    return HEADER.format(name=name) + text


def ruff_format(text: str, target: Path = FORMAT_AS) -> str:
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff) if ruff.exists() else "ruff", "format", "--stdin-filename", str(target), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    args = parser.parse_args(argv)
    failed = generate(SOURCE, TARGET, FORMAT_AS, check=args.check)
    for name in OTHERS:
        source = CORE / name
        target = source.parent.with_name("_sync") / source.name
        failed |= generate(source, target, target, check=args.check)
    return failed


def generate(source: Path, target: Path, format_as: Path, *, check: bool) -> int:
    name = source.relative_to(CORE).as_posix()
    wanted = ruff_format(unasync(source.read_text(encoding="utf-8"), name), format_as)
    current = target.read_text(encoding="utf-8") if target.exists() else ""
    if not check:
        if current != wanted:
            target.write_text(wanted, encoding="utf-8")
            print(f"unasync: wrote {os.path.relpath(target)}")
        return 0
    if current == wanted:
        return 0
    diff = difflib.unified_diff(
        wanted.splitlines(keepends=True),
        current.splitlines(keepends=True),
        "generated from " + os.path.relpath(source),
        os.path.relpath(target),
    )
    sys.stderr.write("".join(diff))
    sys.stderr.write(
        f"unasync: {os.path.relpath(target)} differs from what the asyncio source generates; "
        f"edit {os.path.relpath(source)} and run python scripts/unasync.py\n"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
