"""The Lua scripts, read once from the package's ``lua/`` folder and registered
once per client.

Each script is ``common.lua`` followed by the script's own file, so the helpers
(clock, reclaim, wake-up) are written once. redis-py's ``Script`` objects send
EVALSHA and fall back to loading the script on NOSCRIPT (after a Redis restart).
"""

from __future__ import annotations

import threading
import weakref
from functools import cache
from importlib.resources import files
from typing import Any

NAMES = ("acquire", "enqueue", "park", "dispatch", "release", "renew", "status", "configure")

_registered: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@cache
def source(name: str) -> str:
    folder = files("celery_semaphore.core").joinpath("lua")
    common = folder.joinpath("common.lua").read_text(encoding="utf-8")
    return common + "\n" + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")


def registered(client: Any) -> dict[str, Any]:
    """Each script's name: its redis-py ``Script`` (``AsyncScript``) on ``client``,
    made on first use and shared by every semaphore of that client.

    The scripts hold the client weakly (they are called with ``client=``), so
    this registry does not keep a client alive that nobody else uses.
    """
    with _lock:
        scripts = _registered.get(client)
        if scripts is None:
            proxy = weakref.proxy(client)
            register = type(client).register_script
            scripts = _registered[client] = {n: register(proxy, source(n)) for n in NAMES}
        return scripts
