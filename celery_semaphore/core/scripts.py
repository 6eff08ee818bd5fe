"""The Lua scripts, read once from the package's ``lua/`` folder.

Each script is ``common.lua`` followed by the script's own file, so the helpers
(clock, reclaim, wake-up) are written once. redis-py's ``Script`` objects send
EVALSHA and fall back to loading the script on NOSCRIPT (after a Redis restart).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

NAMES = ("acquire", "enqueue", "park", "dispatch", "release", "renew", "status", "configure")


@cache
def source(name: str) -> str:
    folder = files("celery_semaphore.core").joinpath("lua")
    common = folder.joinpath("common.lua").read_text(encoding="utf-8")
    return common + "\n" + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
