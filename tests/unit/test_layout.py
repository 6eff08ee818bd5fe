"""The layout's rules, enforced: a Celery-free core, one source for sync and asyncio."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "celery_semaphore" / "core"
REDIS = CORE / "redis"
FORBIDDEN = ("celery", "click", "kombu", "billiard")


def test_importing_the_semaphore_loads_no_celery_and_connects_nothing() -> None:
    code = (
        "import sys, celery_semaphore\n"
        "celery_semaphore.Semaphore, celery_semaphore.AsyncSemaphore, celery_semaphore.Place\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('celery', 'click', 'kombu')]\n"
        "print(loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_the_celery_side_loads_on_first_use() -> None:
    code = (
        "import sys, celery_semaphore\n"
        "assert 'celery' not in sys.modules\n"
        "celery_semaphore.LimitedTask\n"
        "assert 'celery' in sys.modules\n"
        "from celery.signals import task_received\n"
        "assert not task_received.receivers, 'a handler is connected before install()'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def type_only(tree: ast.Module) -> set[ast.AST]:
    """The nodes under ``if TYPE_CHECKING:``: imports for annotations, never run."""
    inside: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                inside.update(ast.walk(statement))
    return inside


def imported_modules(path: Path) -> set[str]:
    """The top-level packages ``path`` imports when it runs (not those it imports only
    for annotations, under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    typing_only = type_only(tree)
    for node in ast.walk(tree):
        if node in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_of_the_core_imports_celery_click_kombu_or_billiard() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 10
    offending = {
        str(f.relative_to(ROOT)): sorted(imported_modules(f) & set(FORBIDDEN)) for f in files
    }
    assert {f: m for f, m in offending.items() if m} == {}


#: The one module outside ``core/redis/`` that speaks to a Redis: the *broker's* (kombu's
#: Redis transport), whose parking queues it takes from; never the semaphores' store.
BROKER_REDIS = "celery_semaphore/parking_lists.py"


def test_only_the_redis_folder_imports_redis() -> None:
    """Everything Redis-specific about the store lives in ``core/redis/`` (the Redis
    store): no other module of the package imports redis, not even the semaphores (they
    call a store), but `BROKER_REDIS`, which speaks to a Redis broker."""
    elsewhere = [p for p in (ROOT / "celery_semaphore").rglob("*.py") if REDIS not in p.parents]
    assert len(elsewhere) >= 60
    offending = sorted(
        str(p.relative_to(ROOT)) for p in elsewhere if "redis" in imported_modules(p)
    )
    assert offending == [BROKER_REDIS]


def reaches_into_redis(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = "." * node.level + node.module
            if module.startswith(("celery_semaphore.core.redis", ".core.redis", "..core.redis")):
                return True
    return False


def test_the_celery_side_reaches_the_store_only_through_its_methods() -> None:
    """The Celery side, the CLI, the metrics and the heartbeat import nothing of
    ``core/redis/``: they call a store's methods (`celery_semaphore.core.operations`),
    so another store plugs in where the Redis one does."""
    outside = [p for p in (ROOT / "celery_semaphore").rglob("*.py") if CORE not in p.parents]
    assert len(outside) >= 30
    reaching = sorted(str(p.relative_to(ROOT)) for p in outside if reaches_into_redis(p))
    assert reaching == []


def test_the_core_imports_nothing_from_the_celery_side() -> None:
    celery_side = {"admission", "config", "gates", "publish", "state", "task", "wiring", "worker"}
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "celery_semaphore."
            ):
                part = (node.module or "").split(".")[1]
                assert part not in celery_side, f"{path.name} imports {node.module}"


def load_unasync() -> object:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sync_semaphore_is_exactly_what_the_asyncio_one_generates() -> None:
    unasync = load_unasync()
    source = (CORE / "_async" / "semaphore.py").read_text(encoding="utf-8")
    wanted = unasync.ruff_format(unasync.unasync(source))  # type: ignore[attr-defined]
    assert (CORE / "_sync" / "semaphore.py").read_text(encoding="utf-8") == wanted


def test_a_hand_edit_of_the_sync_semaphore_is_caught(tmp_path: Path, monkeypatch: object) -> None:
    unasync = load_unasync()
    edited = tmp_path / "semaphore.py"
    text = (CORE / "_sync" / "semaphore.py").read_text(encoding="utf-8")
    edited.write_text(text.replace("def release(", "def release_(", 1), encoding="utf-8")
    monkeypatch.setattr(unasync, "TARGET", edited)  # type: ignore[attr-defined]
    assert unasync.main(["--check"]) == 1  # type: ignore[attr-defined]
    edited.write_text(text, encoding="utf-8")
    assert unasync.main(["--check"]) == 0  # type: ignore[attr-defined]


def test_the_generated_code_names_no_async_api() -> None:
    text = (CORE / "_sync" / "semaphore.py").read_text(encoding="utf-8")
    for word in ("async ", "await ", "AsyncSemaphore", "AsyncPermit", "aclose", "__aenter__"):
        assert word not in text, word


def package_imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports (function-level imports included,
    ``if TYPE_CHECKING:`` blocks left out), resolved to submodules where they are."""
    package = ROOT / "celery_semaphore"

    def name_of(path: Path) -> str:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name_of(p): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
        edges: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                if node.level:
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    if target in modules:
                        edges.add(target)
                    elif source in modules:
                        edges.add(source)
        graph[module] = edges - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle() -> None:
    graph = package_imports()
    assert len(graph) >= 30 and graph["celery_semaphore.state"]  # the graph was read
    assert cycles(graph) == []


def test_the_settings_do_not_depend_on_the_runtime_state() -> None:
    """config.py (settings read once, cached per app) imports nothing that holds
    clients, semaphores or other runtime state; state.py may use the settings."""
    graph = package_imports()
    runtime = {
        "celery_semaphore.state",
        "celery_semaphore.durability",
        "celery_semaphore.parked_tasks",
    }
    assert graph["celery_semaphore.config"] & runtime == set()
    source = (ROOT / "celery_semaphore" / "config.py").read_text(encoding="utf-8")
    assert "state" not in imported_modules_text(source), "not under TYPE_CHECKING either"


def imported_modules_text(source: str) -> str:
    """The text of every import statement of ``source``."""
    tree = ast.parse(source)
    return "\n".join(
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
    )


def test_the_wire_module_imports_only_the_value_types_its_docstring_names() -> None:
    graph = package_imports()
    assert graph["celery_semaphore.formats"] == {
        "celery_semaphore.core.ask",
        "celery_semaphore.core.rates",
    }
    core_values = graph["celery_semaphore.core.ask"] | graph["celery_semaphore.core.rates"]
    assert all(m.startswith("celery_semaphore.core") for m in core_values), core_values


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_only_the_wire_module_spells_the_wire_formats() -> None:
    """Header names and the hand-over queue suffix are written once, in formats.py."""
    spellings = ("celery_semaphore_gates", "celery_semaphore_queue", "celery_semaphore_may_park",
                 "semaphore-handover", "WAIT_HEADER =")  # fmt: skip
    package = ROOT / "celery_semaphore"
    offending = {
        str(path.relative_to(ROOT)): [s for s in spellings if s in path.read_text("utf-8")]
        for path in package.rglob("*.py")
        if path.name != "formats.py"
    }
    assert {f: s for f, s in offending.items() if s} == {}


def test_no_lua_file_of_the_package_is_over_700_lines() -> None:
    """A Lua file that long holds several concerns: split it by section, as the prelude
    is (scripts.COMMON)."""
    lua = sorted((ROOT / "celery_semaphore").rglob("*.lua"))
    assert len(lua) >= 20
    lengths = {str(p.relative_to(ROOT)): len(p.read_text("utf-8").splitlines()) for p in lua}
    assert {path: n for path, n in lengths.items() if n > 700} == {}


def test_every_part_of_the_prelude_is_joined_once() -> None:
    """Each lua/common_*.lua is in scripts.COMMON, once: a part left out would ship
    unused, and the helpers it defines would be missing from every script."""
    from celery_semaphore.core.redis import scripts

    on_disk = sorted(p.stem for p in (CORE / "redis" / "lua").glob("common_*.lua"))
    assert sorted(scripts.COMMON) == on_disk
    assert len(on_disk) > 1


def test_no_module_is_too_long_to_read() -> None:
    """A module holds one concern: none of the package over 800 lines, no example
    module over 500 (the Lua files have their own bound, below)."""
    bounds = [(ROOT / "celery_semaphore", 800), (ROOT / "example_project", 500)]
    too_long = [
        f"{path.relative_to(ROOT)}: {lines} lines (at most {most})"
        for folder, most in bounds
        for path in sorted(folder.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > most
    ]
    assert too_long == []
