"""The Lua scripts, read from the package's ``lua/`` folder when this module is
imported, and how they are called: as functions of one Redis Functions library
(``FCALL``) where the server has Functions, else as scripts (``EVALSHA``).

Each script of a semaphore is the prelude (the ``common_*.lua`` files, joined in
the order of `COMMON`) followed by its table of argument indexes (``local ARG``,
generated from `arguments.SIGNATURES`) and the script's own file, so the helpers
(clock, reclaim, wake-up) are written once (``acquire`` and ``acquire_all`` have
``admit.lua`` in between: how one semaphore weighs a contender); the scripts of
``lua/parked_index/`` touch the namespace's parked index alone and stand by
themselves.

As scripts, each call runs its whole text: the helpers are defined again on every
call. As a library (`LIBRARY`), the helpers are defined once, when the library is
loaded (and each script's ``ARG``), and each call runs only its own part: the same
Lua, cheaper. Which way a client calls is chosen at its first call (`functions.py`);
a client whose server has no Functions (Redis < 7), or refuses them (an ACL, a
managed Redis), calls the scripts, and so does every client while
``CELERY_SEMAPHORE_REDIS_FUNCTIONS=0``.
redis-py's ``Script`` objects send EVALSHA and fall back to loading the script on
NOSCRIPT (after a Redis restart).

Read at import, not on first use: a worker forks its pool while its heartbeat
thread runs, and a child forked while that thread held an import lock (which
``importlib.resources`` takes) would hang at its own first read.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from typing import Any

from celery_semaphore.core.constants import lua_prelude

from . import functions
from .arguments import SIGNATURES

NAMES = (
    "acquire", "enqueue", "park", "claim", "dispatch", "release", "renew", "status", "counts",
    "configure", "epoch",
)  # fmt: skip
#: Registered on a client at their first use (`on_demand()`): only a client that takes
#: sets of semaphores (`AsyncSemaphoreSet`) needs them.
ON_DEMAND_NAMES = ("acquire_all",)
#: The prelude of every script of a semaphore, in the order it is joined: each file
#: defines its ``local`` names before a later one uses them (``common_keys.lua``'s
#: header says what each key holds). `_OWN`'s "common" is the prelude, for the scripts
#: (`SOURCES`) and the library (`LIBRARY`) alike.
COMMON = (
    "common_keys", "common_meta", "common_weights", "common_order", "common_parked",
    "common_line", "common_rates", "common_after_free", "common_epoch",
)  # fmt: skip
#: The files each script is made of, when more than the prelude and its own.
PARTS = {name: ("common", "admit", name) for name in ("acquire", "acquire_all")}
PARKED_INDEX_NAMES = ("register", "read", "forget")

#: What runs between the prelude (and admit.lua) and a script's own part: begin()
#: (common_epoch.lua) sets the call up, and answers the epoch instead where it must.
_BEGIN = "local epoch_reply = begin()\nif epoch_reply then return epoch_reply end\n"


def _read(folder: Any, name: str) -> str:
    return str(folder.joinpath(f"{name}.lua").read_text(encoding="utf-8"))


_LUA = files("celery_semaphore.core.redis").joinpath("lua")
_OWN = {name: _read(_LUA, name) for name in (*NAMES, *ON_DEMAND_NAMES, "admit")}
_OWN["common"] = "\n".join([lua_prelude(), *(_read(_LUA, name) for name in COMMON)])
_PARKED_INDEX = {
    f"parked_index/{n}": _read(_LUA.joinpath("parked_index"), n) for n in PARKED_INDEX_NAMES
}


#: Each script's generated table of its arguments' indexes (``local ARG = {...}``, from
#: its `arguments.Signature`), put right before its own part: the Lua reads
#: ``ARGV[ARG.holder]``, never a number.
_ARG = {name: SIGNATURES[name].lua() for name in (*NAMES, *ON_DEMAND_NAMES, *_PARKED_INDEX)}


def _assemble(name: str) -> str:
    *shared, own = PARTS.get(name, ("common", name))
    return "\n".join([*(_OWN[part] for part in shared), _BEGIN, _ARG[name], _OWN[own]])


#: Each script's name (``parked_index/<name>`` for those of the parked index): its source.
SOURCES = {
    **{name: _assemble(name) for name in NAMES},
    **{name: f"{_ARG[name]}\n{own}" for name, own in _PARKED_INDEX.items()},
}
ON_DEMAND_SOURCES = {name: _assemble(name) for name in ON_DEMAND_NAMES}


def _library(version: str) -> tuple[str, str, dict[str, str]]:
    """The library's name, its code and each script's function name, for this
    package ``version`` and these sources (their digest names the library: two
    builds of one version with other Lua are two libraries)."""
    parts = [_OWN["common"], _OWN["admit"], *(_OWN[n] for n in (*NAMES, *ON_DEMAND_NAMES))]
    parts += [*_PARKED_INDEX.values(), *_ARG.values()]
    digest = hashlib.sha1("\0".join(parts).encode()).hexdigest()
    name = f"celery_semaphore_v{re.sub(r'[^0-9A-Za-z]', '_', version)}_{digest[:12]}"
    functions = {script: f"{name}_{script.replace('/', '_')}" for script in SOURCES}
    functions.update({script: f"{name}_{script}" for script in ON_DEMAND_NAMES})
    lines = [f"#!lua name={name}", "local KEYS, ARGV", _OWN["common"], _OWN["admit"]]
    registered = []
    for script, function in functions.items():
        own = _PARKED_INDEX.get(script) or _OWN[script]
        body = f"run_{script.replace('/', '_')}"
        lines += [f"local {body}", "do", _ARG[script], f"{body} = function()", own, "end", "end"]
        wrap = "plain_call" if script in _PARKED_INDEX else "semaphore_call"
        registered.append(f"redis.register_function('{function}', {wrap}({body}))")
    lines += [
        "local function semaphore_call(body)",
        "  return function(keys, args)",
        "    KEYS, ARGV = keys, args",
        "    local epoch_reply = begin()",
        "    if epoch_reply then return epoch_reply end",
        "    return body()",
        "  end",
        "end",
        "local function plain_call(body)",
        "  return function(keys, args)",
        "    KEYS, ARGV = keys, args",
        "    return body()",
        "  end",
        "end",
        *registered,
    ]
    return name, "\n".join(lines) + "\n", functions


def _package_version() -> str:
    try:
        return version("celery-semaphore")
    except PackageNotFoundError:  # pragma: no cover - a checkout on sys.path, not installed
        return "0+unknown"


#: This package's library: its name (``celery_semaphore_v<version>_<digest>``), its
#: code, and each script's function name in it.
LIBRARY_NAME, LIBRARY, FUNCTIONS = _library(_package_version())

_registered: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def source(name: str) -> str:
    return SOURCES[name] if name in SOURCES else ON_DEMAND_SOURCES[name]


def registered(client: Any) -> dict[str, Any]:
    """Each script's name (as in `SOURCES`, and those of `ON_DEMAND_NAMES` used on
    it so far): a callable ``(keys=, args=, client=)`` on ``client`` (a coroutine
    function for an asyncio client), made on first use and shared by every
    semaphore of that client; ``client=`` may be a pipeline of it.

    The calls hold the client weakly, so this registry does not keep a client
    alive that nobody else uses. No lock, for the same reason as above (two
    threads registering at once only make one set too many, which is dropped).
    """
    scripts = _registered.get(client)
    if scripts is None:
        library = functions.Library(weakref.proxy(client), LIBRARY_NAME, LIBRARY, FUNCTIONS)
        made = functions.calls(client, SOURCES, library)
        scripts = _registered.setdefault(client, made)
    return scripts


def on_demand(client: Any, name: str) -> Any:
    """Script ``name`` of `ON_DEMAND_NAMES` on ``client``, registered at its first
    use, in the client's `registered()` scripts (where the semaphores find it)."""
    scripts = registered(client)
    script = scripts.get(name)
    if script is None:
        made = functions.calls(client, {name: ON_DEMAND_SOURCES[name]}, library_of(client))[name]
        script = scripts.setdefault(name, made)
    return script


def library_of(client: Any) -> functions.Library:
    """How ``client``'s scripts are called (the `functions.Library` its calls share)."""
    call = next(iter(registered(client).values()))
    return call.library  # type: ignore[no-any-return]


def forget_way(client: Any) -> None:
    """Make ``client`` choose how to call again at its next call: for a pipeline that
    found a function gone (`functions.missing()`), whose calls are not made again
    one by one."""
    library_of(client).way = None
