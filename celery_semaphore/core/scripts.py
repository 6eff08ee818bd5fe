"""The Lua scripts, read from the package's ``lua/`` folder when this module is
imported, and registered once per client.

Each script of a semaphore is ``common.lua`` followed by the script's own file,
so the helpers (clock, reclaim, wake-up) are written once (``acquire`` and
``acquire_all`` have ``admit.lua`` in between: how one semaphore weighs a
contender); the scripts of ``lua/parked_index/`` touch the namespace's parked index
alone and stand by themselves. redis-py's ``Script`` objects send EVALSHA and
fall back to loading the script on NOSCRIPT (after a Redis restart).

Read at import, not on first use: a worker forks its pool while its heartbeat
thread runs, and a child forked while that thread held an import lock (which
``importlib.resources`` takes) would hang at its own first read.
"""

from __future__ import annotations

import weakref
from importlib.resources import files
from typing import Any

NAMES = (
    "acquire", "enqueue", "park", "dispatch", "release", "renew", "status", "counts", "configure",
    "epoch",
)  # fmt: skip
#: Registered on a client at their first use (`on_demand()`): only a client that takes
#: sets of semaphores (`AsyncSemaphoreSet`) needs them.
ON_DEMAND_NAMES = ("acquire_all",)
#: The files each script is made of, when more than common.lua and its own.
PARTS = {name: ("common", "admit", name) for name in ("acquire", "acquire_all")}
PARKED_INDEX_NAMES = ("register", "read", "forget")


def _read(folder: Any, name: str) -> str:
    return str(folder.joinpath(f"{name}.lua").read_text(encoding="utf-8"))


_LUA = files("celery_semaphore.core").joinpath("lua")


def _assemble(name: str) -> str:
    return "\n".join(_read(_LUA, part) for part in PARTS.get(name, ("common", name)))


#: Each script's name (``parked_index/<name>`` for those of the parked index): its source.
SOURCES = {
    **{name: _assemble(name) for name in NAMES},
    **{f"parked_index/{n}": _read(_LUA.joinpath("parked_index"), n) for n in PARKED_INDEX_NAMES},
}
ON_DEMAND_SOURCES = {name: _assemble(name) for name in ON_DEMAND_NAMES}

_registered: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def source(name: str) -> str:
    return SOURCES[name] if name in SOURCES else ON_DEMAND_SOURCES[name]


def registered(client: Any) -> dict[str, Any]:
    """Each script's name (as in `SOURCES`, and those of `ON_DEMAND_NAMES` used on
    it so far): its redis-py ``Script``
    (``AsyncScript``) on ``client``, made on first use and shared by every
    semaphore of that client.

    The scripts hold the client weakly (they are called with ``client=``), so
    this registry does not keep a client alive that nobody else uses. No lock,
    for the same reason as above (two threads registering at once only make
    one set too many, which is dropped).
    """
    scripts = _registered.get(client)
    if scripts is None:
        proxy = weakref.proxy(client)
        register = type(client).register_script
        made = {name: register(proxy, text) for name, text in SOURCES.items()}
        scripts = _registered.setdefault(client, made)
    return scripts


def on_demand(client: Any, name: str) -> Any:
    """Script ``name`` of `ON_DEMAND_NAMES` on ``client``, registered at its first
    use, in the client's `registered()` scripts (where the semaphores find it)."""
    scripts = registered(client)
    script = scripts.get(name)
    if script is None:
        made = type(client).register_script(weakref.proxy(client), ON_DEMAND_SOURCES[name])
        script = scripts.setdefault(name, made)
    return script
