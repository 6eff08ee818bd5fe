"""Each script's arguments are named once (`arguments.SIGNATURES`): Python packs them
by name, the Lua reads them by name through the generated ``ARG`` table, and no
``.lua`` file counts ARGV positions by hand (no Redis)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from celery_semaphore import Ask
from celery_semaphore.core.model.parking import Dispatch
from celery_semaphore.core.protocol import FAIR_TOP, SENT_HORIZON, STATUS_MOST, SemaphoreSpec
from celery_semaphore.core.redis import arguments, scripts
from celery_semaphore.core.redis.arguments import SIGNATURES, Signature, channel_of
from celery_semaphore.core.requests import (
    PLAIN_ASKED,
    Acquire,
    AcquireAll,
    Claim,
    Configure,
    Enqueue,
    Park,
    ParkWhenFar,
    Release,
    Renew,
)

LUA = Path(arguments.__file__).parent / "lua"
OPTIONS = dict(
    lease_timeout=10.0, namespace="ns", waiter_lease=20.0, recheck_interval=2.0, idle_ttl=60.0
)


def spec(name: str = "s", limit: int = 3, **kw: Any) -> SemaphoreSpec:
    made = SemaphoreSpec(name, limit, **{**OPTIONS, **kw})
    made.dispatch = Dispatch(500, 30000, 200)
    return made


def fields(declared: type[tuple[Any, ...]] | None) -> tuple[str, ...]:
    return () if declared is None else declared._fields  # type: ignore[attr-defined]


def read(script: str, args: list[Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``args`` as ``script`` reads them: by name, and its variadic group's items (each
    by name); an argument left over, or one missing, fails."""
    signature = SIGNATURES[script]
    fixed = fields(signature.fixed)
    optional = fields(signature.optional)
    each = fields(signature.each)
    names = [*fixed, *optional] if len(args) > len(fixed) and optional else list(fixed)
    assert len(args) >= len(names)
    rest = args[len(names) :]
    assert not rest or each, f"{script}: {len(rest)} arguments left over"
    assert len(rest) % max(1, len(each)) == 0
    items = [
        dict(zip(each, rest[i : i + len(each)], strict=True))
        for i in range(0, len(rest), len(each) or 1)
    ]
    return dict(zip(names, args[: len(names)], strict=True)), items


def test_every_script_has_its_signature() -> None:
    assert set(SIGNATURES) == {*scripts.SOURCES, *scripts.ON_DEMAND_SOURCES}


def test_acquire_and_release_are_packed_by_name() -> None:
    s = spec(family="fam", rate="20/s", shadow=["rate"])
    asked = s.resolve(Ask(weight=2, rate_weight=1))
    request = Acquire(
        "h", 5, wait_ms=7000, lease_ms=9000, info="i", handover=11, in_place=True, ask=asked
    )
    args, items = read("acquire", arguments.acquire_args(s, request))
    assert items == []
    assert args == dict(
        holder="h", declared=3, lease_ms=9000, waiter_ms=7000, ticket=5, info="i",
        idle_ms=s.idle_ms, channel=channel_of(s), handover=11, dispatch="500|30000|200",
        in_place="1", family="fam", rate=s.rate_text, shadow="r", weight=asked.text,
    )  # fmt: skip
    plain = read("acquire", arguments.acquire_args(s, Acquire("h", None, 0, 1, "")))[0]
    assert (plain["ticket"], plain["handover"], plain["in_place"], plain["weight"]) == (
        "",
        "",
        "",
        "",
    )

    args, _ = read("release", arguments.release_args(s, Release("h", 42, unused=2)))
    assert args == dict(
        holder="h", token=42, idle_ms=s.idle_ms, channel=channel_of(s),
        dispatch="500|30000|200", declared=3, unused=2, shadow="r", keep_as="", keep_info="",
    )  # fmt: skip
    kept = read("release", arguments.release_args(s, s.keep("h", 42, "kept|w|1|1|x", "k")))[0]
    assert (kept["token"], kept["keep_as"], kept["keep_info"]) == (42, "kept|w|1|1|x", "k")
    assert read("release", arguments.release_args(s, Release("h")))[0]["token"] == ""
    assert read("release", arguments.release_args(s, Release("h")))[0]["unused"] == ""


def test_park_and_enqueue_are_packed_by_name() -> None:
    s = spec(rate="20/s")
    asked = s.resolve(Ask(weight=2, rate_weight=1))
    park = Park("h", None, "payload", park_ms=4000, info="i", due_ms=1, ask=asked)
    args, _ = read("park", arguments.park_args(s, park))
    assert args == dict(
        holder="h", ticket="", payload="payload", park_ms=4000, info="i", idle_ms=s.idle_ms,
        dispatch="500|30000|200", due_ms=1, channel=channel_of(s), weight=asked.text,
    )  # fmt: skip

    near = Enqueue("h", wait_ms=7000, info="i", ask=asked)
    args, items = read("enqueue", arguments.enqueue_args(s, near))
    assert items == []
    assert args == dict(
        holder="h", waiter_ms=7000, info="i", idle_ms=s.idle_ms, declared=3, family="",
        horizon_ms=s.sent_horizon_ms, channel=channel_of(s), rate=s.rate_text,
        weight=asked.text, shadow="",
    )  # fmt: skip
    far = ParkWhenFar(window_us=100, head="<", tail=">", park_ms=4000, due_ms=2)
    args, _ = read("enqueue", arguments.enqueue_args(s, Enqueue("h", 7000, "i", asked, far)))
    assert {name: args[name] for name in fields(arguments.Far)} == dict(
        window_us=100, head="<", tail=">", park_ms=4000, dispatch="500|30000|200", due_ms=2
    )


def test_claim_is_packed_by_name() -> None:
    args, items = read("claim", arguments.claim_args(spec(), Claim("x", "h", 42)))
    assert (args, items) == (dict(taken="x", handed="h", token=42), [])


def test_the_variadic_scripts_are_packed_by_name() -> None:
    s = spec()
    args, items = read("dispatch", arguments.dispatch_args(s, ["a", "b"]))
    assert args == dict(idle_ms=s.idle_ms, channel=channel_of(s), dispatch="500|30000|200")
    assert items == [{"holder": "a"}, {"holder": "b"}]

    renewal = Renew((("h", None, 3), ("g", 7, None)), lease_ms=9000)
    args, items = read("renew", arguments.renew_args(s, renewal))
    assert args == dict(
        lease_ms=9000, idle_ms=s.idle_ms, channel=channel_of(s), dispatch="500|30000|200"
    )
    assert items == [
        {"holder": "h", "token": "", "permits": 3},
        {"holder": "g", "token": 7, "permits": ""},
    ]

    args, items = read("counts", arguments.counts_args(["family", "m_grants"]))
    assert args == {"horizon_ms": int(1000 * SENT_HORIZON)}
    assert items == [{"name": "family"}, {"name": "m_grants"}]

    first, second = spec("a", 2, family="f"), spec("b", 5, rate="20/s")
    asks = (PLAIN_ASKED, second.resolve(Ask(weight=2, rate_weight=1)))
    joint = AcquireAll("h", 4, 300, "i", (10, 20), (30, 40), asks, came_by=(1, 9))
    args, items = read("acquire_all", arguments.joint_acquire_args([first, second], joint))
    assert args == dict(holder="h", hold_ms=300, info="i", ticket=4, handover="2|9")
    assert items == [
        dict(declared=2, lease_ms=30, waiter_ms=10, idle_ms=first.idle_ms,
             channel=channel_of(first), dispatch="500|30000|200", family="f", rate="",
             shadow="", weight=""),
        dict(declared=5, lease_ms=40, waiter_ms=20, idle_ms=second.idle_ms,
             channel=channel_of(second), dispatch="500|30000|200", family="",
             rate=second.rate_text, shadow="", weight=asks[1].text),
    ]  # fmt: skip


def test_configure_and_status_are_packed_by_name() -> None:
    s = spec(rate="20/s")
    args, _ = read("configure", arguments.configure_args(s, Configure("override", "7")))
    assert args == dict(
        field="override", value="7", idle_ms=s.idle_ms, channel=channel_of(s),
        dispatch="500|30000|200", rate=s.rate_text,
    )  # fmt: skip
    args, _ = read("status", arguments.status_args(s))
    assert args == dict(
        most=STATUS_MOST, horizon_ms=s.sent_horizon_ms, declared=3, rate=s.rate_text,
        fair_top=FAIR_TOP,
    )  # fmt: skip


def table(text: str) -> dict[str, Any]:
    """A generated ``local ARG = {...}`` as a dict (numbers, and one nested table)."""
    match = re.fullmatch(r"local ARG = \{(.*)\}", text)
    assert match, text
    found: dict[str, Any] = {}
    for name, nested, number in re.findall(r"(\w+) = (?:\{([^}]*)\}|(\d+))", match.group(1)):
        found[name] = table(f"local ARG = {{{nested}}}") if nested else int(number)
    return found


@pytest.mark.parametrize("script", sorted(SIGNATURES))
def test_the_generated_table_gives_each_name_its_index(script: str) -> None:
    signature = SIGNATURES[script]
    names = [*fields(signature.fixed), *fields(signature.optional)]
    expected: dict[str, Any] = {name: index for index, name in enumerate(names, 1)}
    if signature.each is not None:
        group = {name: offset for offset, name in enumerate(fields(signature.each))}
        size = len(group)
        expected[signature.each_name] = {"first": len(names) + 1, "size": size, **group}
    generated = signature.lua()
    assert table(generated) == expected
    # The table stands right before the script's own part, once, as a script and in
    # the library (where it is made once, when the library is loaded).
    own = (LUA / f"{script}.lua").read_text(encoding="utf-8")
    source = scripts.source(script)
    assert source.count("local ARG =") == 1
    assert f"{generated}\n{own}" in source
    function = f"run_{script.replace('/', '_')}"
    assert f"local {function}\ndo\n{generated}\n{function} = function()\n{own}\nend\nend" in (
        scripts.LIBRARY
    )


def test_no_lua_counts_argv_positions() -> None:
    """ARGV is read as ARGV[ARG.<name>] (or at offsets of ARG's variadic group), and the
    epoch as ARGV[EPOCH_ARG]: never by a number, in a file or in what is generated."""
    numbered = re.compile(r"ARGV\[\s*\d")
    files = sorted(LUA.rglob("*.lua"))
    assert len(files) > 20
    assert [path.name for path in files if numbered.search(path.read_text(encoding="utf-8"))] == []
    assert not numbered.search(scripts.LIBRARY)
    assert not any(numbered.search(source) for source in scripts.SOURCES.values())


def code_of(text: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def declared_names(signature: Signature) -> list[str]:
    names = [*fields(signature.fixed), *fields(signature.optional)]
    return names + [f"{signature.each_name}.{name}" for name in fields(signature.each)]


@pytest.mark.parametrize("script", sorted(SIGNATURES))
def test_each_script_reads_every_argument_it_declares_and_no_other(script: str) -> None:
    """A name the declaration lacks would read ARGV[nil] (nil, silently)."""
    signature = SIGNATURES[script]
    code = code_of((LUA / f"{script}.lua").read_text(encoding="utf-8"))
    aliases = re.findall(r"local (\w+) = ARG\.(\w+)\n", code)  # acquire_all's ``each``
    read = set(re.findall(r"\bARG\.(\w+(?:\.\w+)?)", code))
    for alias, group in aliases:
        read |= {f"{group}.{name}" for name in re.findall(rf"\b{alias}\.(\w+)", code)}
    read -= {name for _, name in aliases}
    group = signature.each_name
    read -= {f"{group}.first", f"{group}.size"}
    assert read == set(declared_names(signature))


@pytest.mark.parametrize("script", sorted(SIGNATURES))
def test_each_header_lists_the_arguments_in_their_order(script: str) -> None:
    """The header keeps what each argument means, under its name, without a number."""
    header = []
    for line in (LUA / f"{script}.lua").read_text(encoding="utf-8").splitlines():
        if not line.startswith("--"):
            break
        header.append(line)
    listed = [m.group(1) for line in header if (m := re.match(r"-- ARG\.([\w.]+)", line))]
    assert listed == declared_names(SIGNATURES[script])


def test_a_name_given_twice_is_refused_when_declared() -> None:
    class Twice(tuple[Any, ...]):
        _fields = ("holder", "dispatch")

    class Group(tuple[Any, ...]):
        _fields = ("first",)

    with pytest.raises(ValueError, match="a name is used twice"):
        Signature(arguments.EnqueueArgs, optional=Twice)
    with pytest.raises(ValueError, match=r"\('first',\) takes a name of \('first', 'size'\)"):
        Signature(arguments.RenewArgs, each=Group, each_name="held")
    with pytest.raises(ValueError, match="go together"):
        Signature(arguments.RenewArgs, each=arguments.Held)
