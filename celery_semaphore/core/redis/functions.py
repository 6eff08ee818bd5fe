"""Calling the scripts as Redis Functions (``FCALL``), or as scripts (``EVALSHA``)
where the server has no Functions or refuses them.

The way is chosen per client at its first call (`Library.choose()`):

- ``CELERY_SEMAPHORE_REDIS_FUNCTIONS=0`` in the environment: scripts, always;
- ``FUNCTION LIST`` refused (Redis < 7, an ACL, a managed Redis that forbids
  Functions): scripts;
- else the library of this package (`scripts.LIBRARY`, named by the package's
  version and a digest of its Lua) is loaded where it is missing (on every
  primary of a Cluster); a refused ``FUNCTION LOAD`` means scripts too. Libraries
  of older releases of the package are deleted, except those of the newest of
  them, which the workers not yet upgraded in a rolling upgrade still call;
- a call that finds the function gone (a restart without persistence, a
  ``FUNCTION FLUSH``, a newer release that deleted this one) chooses again and
  is made again, once.

Every release calls only the functions of its own library (their names carry its
name), so two releases on one Redis never run each other's Lua.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import weakref
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

import redis
import redis.asyncio.client
import redis.client

from .held_connection import BUSY, HeldConnection, Setup, holds

logger = logging.getLogger(__name__)

#: ``0`` in the environment: every client calls the scripts (EVALSHA), never Functions.
ENVIRONMENT = "CELERY_SEMAPHORE_REDIS_FUNCTIONS"
FUNCTIONS, SCRIPTS = "functions", "scripts"
_NAME = re.compile(r"^celery_semaphore_v(.+)_([0-9a-f]{12})$")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _release(library: str) -> tuple[int, ...] | None:
    """The release a library of this package was made for, as comparable numbers
    (its version's leading numbers: "0_1_0" -> (0, 1, 0)), or None for a library
    that is not one of this package's."""
    found = _NAME.match(library)
    if found is None:
        return None
    numbers = []
    for part in found.group(1).split("_"):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def _listed(listing: Any) -> list[set[str]]:
    """The library names of a ``FUNCTION LIST`` reply, one set per node (a Cluster
    client answers with a reply per primary)."""
    replies = listing.values() if isinstance(listing, Mapping) else [listing]
    nodes = []
    for reply in replies:
        names = set()
        for library in reply or []:
            fields = dict(zip(library[::2], library[1::2], strict=False))
            names.add(_text(fields.get(b"library_name", fields.get("library_name", ""))))
        nodes.append(names)
    return nodes


def plan(listing: Any, ours: str) -> tuple[bool, list[str]]:
    """Whether library ``ours`` must be loaded (it is missing on some node of a
    ``FUNCTION LIST`` reply), and the libraries of older releases to delete: all
    older than ours but those of the newest older release."""
    nodes = _listed(listing)
    load = not nodes or any(ours not in names for names in nodes)
    mine = _release(ours) or ()
    older = {
        name: r for name in set().union(*nodes) if (r := _release(name)) is not None and r < mine
    }
    kept = max(older.values(), default=None)
    return load, sorted(name for name, release in older.items() if release != kept)


def missing(error: redis.ResponseError) -> bool:
    return "function not found" in str(error).lower()


def _is_pipeline(client: Any) -> bool:
    return isinstance(client, (redis.client.Pipeline, redis.asyncio.client.Pipeline))


def _refused(client: Any, error: Exception) -> str:
    """Log why ``client`` calls the scripts: at INFO where the server has no Functions
    or refuses them (Redis < 7, an ACL, a read-only replica), at WARNING otherwise (the
    library did not load: a bug of this package, which then runs slower)."""
    text = str(error)
    expected = isinstance(error, redis.exceptions.NoPermissionError) or any(
        reason in text.lower()
        for reason in ("unknown command", "noperm", "readonly", "not allowed")
    )
    logger.log(
        logging.INFO if expected else logging.WARNING,
        "celery_semaphore: Redis %s does not take its Functions library (%s): calling its "
        "scripts (EVALSHA)",
        getattr(client, "connection_pool", client),
        text,
    )
    return SCRIPTS


class Library:
    """How one client calls the scripts: `FUNCTIONS`, `SCRIPTS`, or None until its
    first call chooses. ``name``, ``code``, ``functions``: the library (scripts.py's:
    this package's, unless a test plays another release) and each script's function
    name in it."""

    def __init__(self, client: Any, name: str, code: str, functions: Mapping[str, str]) -> None:
        self.client = client
        self.name, self.code, self.functions = name, code, functions
        self.way: str | None = None
        self._held: HeldConnection | None = None

    def held(self, client: Any) -> HeldConnection | None:
        """The connection kept for calls on ``client`` (this library's client), or
        None where its calls take the usual path (`held_connection.holds`)."""
        held = self._held
        if held is not None:
            return held if held.client_id == id(client) else None
        if not holds(client):
            return None
        with Setup.lock:  # one per client, whichever thread calls first
            if self._held is None:
                self._held = HeldConnection(client)
            return self._held

    def choose(self) -> str:
        if os.environ.get(ENVIRONMENT, "1").strip() == "0":
            self.way = SCRIPTS
            return self.way
        try:
            load, older = plan(self.client.function_list(library="celery_semaphore_v*"), self.name)
            if load:
                self.client.function_load(self.code, replace=True)
        except redis.ResponseError as error:
            self.way = _refused(self.client, error)
            return self.way
        for name in older:  # gone already (another process deleted it), or not on every node:
            with suppress(redis.ResponseError):
                self.client.function_delete(name)
        self.way = FUNCTIONS
        return self.way

    async def achoose(self) -> str:
        if os.environ.get(ENVIRONMENT, "1").strip() == "0":
            self.way = SCRIPTS
            return self.way
        try:
            listing = await self.client.function_list(library="celery_semaphore_v*")
            load, older = plan(listing, self.name)
            if load:
                await self.client.function_load(self.code, replace=True)
        except redis.ResponseError as error:
            self.way = _refused(self.client, error)
            return self.way
        for name in older:  # gone already (another process deleted it), or not on every node:
            with suppress(redis.ResponseError):
                await self.client.function_delete(name)
        self.way = FUNCTIONS
        return self.way


class Call:
    """One script on a sync client: ``call(keys=, args=, client=)``, as redis-py's
    ``Script``; ``client`` may be a pipeline of the library's client."""

    def __init__(self, library: Library, function: str, script: Any) -> None:
        self.library, self.function, self.script = library, function, script

    def __call__(self, keys: list[Any], args: list[Any], client: Any) -> Any:
        held = self.library.held(client)
        for attempt in (1, 2):
            way = self.library.way or self.library.choose()
            if way == SCRIPTS:
                return self._evalsha(held, keys, args, client)
            try:
                if held is not None:
                    reply = held.call("FCALL", self.function, len(keys), *keys, *args)
                    if reply is not BUSY:
                        return reply
                return client.fcall(self.function, len(keys), *keys, *args)
            except redis.ResponseError as error:
                if attempt == 2 or not missing(error):
                    raise
                self.library.way = None
        raise AssertionError("unreachable")  # pragma: no cover

    def _evalsha(
        self, held: HeldConnection | None, keys: list[Any], args: list[Any], client: Any
    ) -> Any:
        """EVALSHA on the held connection; the script object's call (which loads the
        script where the server lacks it) where it is busy or answers NOSCRIPT."""
        if held is not None:
            try:
                reply = held.call("EVALSHA", self.script.sha, len(keys), *keys, *args)
                if reply is not BUSY:
                    return reply
            except redis.exceptions.NoScriptError:
                pass
        return self.script(keys=keys, args=args, client=client)


class AsyncCall(Call):
    """`Call` on an asyncio client: ``await call(keys=, args=, client=)``."""

    async def __call__(self, keys: list[Any], args: list[Any], client: Any) -> Any:
        for attempt in (1, 2):
            way = self.library.way or await self.library.achoose()
            if way == SCRIPTS:
                return await self.script(keys=keys, args=args, client=client)
            try:
                if _is_pipeline(client):
                    return client.fcall(self.function, len(keys), *keys, *args)
                return await client.fcall(self.function, len(keys), *keys, *args)
            except redis.ResponseError as error:
                if attempt == 2 or not missing(error):
                    raise
                self.library.way = None
        raise AssertionError("unreachable")  # pragma: no cover


def calls(client: Any, sources: Mapping[str, str], library: Library) -> dict[str, Call]:
    """A `Call` (`AsyncCall` on an asyncio client) for each script of ``sources``
    on ``client``, sharing ``library`` (whose client is a weak proxy of it). They
    hold the client weakly."""
    proxy = weakref.proxy(client)
    register = type(client).register_script
    kind = AsyncCall if inspect.iscoroutinefunction(type(client).execute_command) else Call
    return {
        name: kind(library, library.functions[name], register(proxy, text))
        for name, text in sources.items()
    }
