"""The example project: docker-compose.yml agrees with the code, and the demo runs end to end.

No Docker engine runs here, so the compose file is checked statically against the example
project: every app module a command names imports, every queue a worker consumes is one the
app routes to (and the other way round), every DEMO_* variable is one the code reads, every
command's flags are accepted by the module it runs, build and depends_on references resolve,
and Flower shows the Retries column. The slow test runs ``python -m example_project.demo
--quick`` for real: its private redis-server, the partner API and two prefork workers.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from example_project.demo import terminal
from example_project.demo.records import LINE_PARTS, Idle, LineSample, Run, idle_permits
from example_project.demo.report import Verdict, report_idle, report_line
from example_project.demo.timeline import write_svg

ROOT = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"
COMPOSE = ROOT / "docker-compose.yml"
EXAMPLE = ROOT / "example_project"
# Columns Flower's tasks page knows (flower docs, "tasks_columns").
FLOWER_COLUMNS = {
    "name", "uuid", "state", "args", "kwargs", "result", "received", "started", "runtime",
    "worker", "exchange", "routing_key", "retries", "revoked", "exception", "expires", "eta",
}  # fmt: skip
# Prints what a Celery app module declares, importing it in a fresh interpreter (as a worker
# would) so this test process keeps no app, signal handler or client of it.
DESCRIBE_APP = """
import importlib, json, sys
module, _, attribute = sys.argv[1].partition(":")
app = getattr(importlib.import_module(module), attribute or "app")
routes = app.conf.task_routes or {}
print(json.dumps({
    "main": app.main,
    "default_queue": app.conf.task_default_queue,
    "routed_queues": sorted({r["queue"] for r in routes.values() if "queue" in r}),
    "queue_limits": app.conf.semaphore_queue_limits or {},
    "tasks": sorted(n for n in app.tasks if not n.startswith("celery.")),
}))
"""


# -- docker-compose.yml ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load(COMPOSE.read_text())
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def option(command: list[str], *names: str) -> str | None:
    """The value of ``-X value``, ``--long value`` or ``--long=value`` in a command."""
    for i, word in enumerate(command):
        for name in names:
            if word == name and i + 1 < len(command):
                return command[i + 1]
            if name.startswith("--") and word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def celery_services(services: dict[str, dict[str, Any]], subcommand: str) -> dict[str, list[str]]:
    out = {}
    for name, service in services.items():
        command = command_of(service)
        if command[:1] == ["celery"] and subcommand in command:
            out[name] = command
    return out


@functools.cache
def describe_app(spec: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "DEMO_REDIS_URL": "redis://127.0.0.1:1/0",  # never contacted: importing connects nothing
    }
    result = subprocess.run(
        [sys.executable, "-c", DESCRIBE_APP, spec],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"-A {spec} does not import:\n{result.stderr}"
    described: dict[str, Any] = json.loads(result.stdout)
    return described


def env_vars_read_by_the_code() -> set[str]:
    pattern = re.compile(r"""os\.environ(?:\.get\(|\[)\s*["']([A-Z0-9_]+)["']""")
    return {m for path in EXAMPLE.glob("*.py") for m in pattern.findall(path.read_text())}


def test_compose_has_the_services(services: dict[str, dict[str, Any]]) -> None:
    assert {"redis", "downstream", "worker1", "worker2", "flower", "demo"} <= set(services)
    assert len(celery_services(services, "worker")) >= 2


def test_builds_and_depends_on_resolve(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        assert "build" in service or "image" in service, f"{name}: neither build nor image"
        build = service.get("build")
        if build is not None:
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = context / (
                "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            )
            assert context.is_dir(), f"{name}: build context {context} does not exist"
            assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
        depends = service.get("depends_on") or []
        for target in depends if isinstance(depends, list) else depends.keys():
            assert target in services, f"{name} depends on {target}, which is not a service"
            assert target != name


def test_dockerfile_copies_what_exists() -> None:
    dockerfile = (EXAMPLE / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", dockerfile, re.M)
    sources = []
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            sources += [w for w in line.split()[1:-1] if not w.startswith("--")]
    assert "celery_semaphore" in sources
    assert "example_project" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which does not exist"


def test_celery_commands_name_an_importable_app(services: dict[str, dict[str, Any]]) -> None:
    specs = set()
    for name, command in {
        **celery_services(services, "worker"),
        **celery_services(services, "flower"),
    }.items():
        spec = option(command, "-A", "--app")
        assert spec, f"{name}: celery command without -A: {command}"
        specs.add(spec)
    for spec in specs:
        described = describe_app(spec)
        assert "example_project.tasks.call_partner" in described["tasks"]


def test_worker_queues_match_the_routes(services: dict[str, dict[str, Any]]) -> None:
    workers = celery_services(services, "worker")
    consumed: set[str] = set()
    for name, command in workers.items():
        described = describe_app(option(command, "-A", "--app") or "")
        known = {described["default_queue"], *described["routed_queues"]}
        known |= set(described["queue_limits"])
        queues = (option(command, "-Q", "--queues") or described["default_queue"]).split(",")
        assert set(queues) <= known, f"{name} consumes {set(queues) - known}, which no task uses"
        consumed |= set(queues)
        assert option(command, "-n", "--hostname"), f"{name}: give each worker its own -n"
    routed = {described["default_queue"], *described["routed_queues"]}
    assert routed <= consumed, f"no worker consumes {routed - consumed}: those tasks would sit"
    assert set(described["queue_limits"]) <= consumed
    names = [option(c, "-n", "--hostname") for c in workers.values()]
    assert len(set(names)) == len(names), "two workers share a node name"


def test_environment_matches_the_code(services: dict[str, dict[str, Any]]) -> None:
    read = env_vars_read_by_the_code()
    assert {"DEMO_REDIS_URL", "DEMO_DOWNSTREAM_URL"} <= read
    uses_the_app = {
        *celery_services(services, "worker"),
        *celery_services(services, "flower"),
        "demo",
    }
    for name, service in services.items():
        env = environment(service)
        unknown = {k for k in env if k.startswith("DEMO_")} - read
        assert not unknown, f"{name} sets {unknown}, which the example code never reads"
        if name not in uses_the_app:
            continue
        for variable in ("DEMO_REDIS_URL", "DEMO_DOWNSTREAM_URL"):
            assert variable in env, f"{name} imports the app but does not set {variable}"
        redis_host = urlsplit(env["DEMO_REDIS_URL"]).hostname
        assert redis_host in services, f"{name}: DEMO_REDIS_URL names no service"
        partner = urlsplit(env["DEMO_DOWNSTREAM_URL"])
        assert partner.hostname == "downstream"
        downstream = command_of(services["downstream"])
        assert str(partner.port) == option(downstream, "--port")


def test_commands_are_accepted_by_their_modules(services: dict[str, dict[str, Any]]) -> None:
    if str(ROOT) not in sys.path:  # run from elsewhere than the repository root
        sys.path.insert(0, str(ROOT))
    from example_project import demo, downstream

    downstream_command = command_of(services["downstream"])
    assert downstream_command[:3] == ["python", "-m", "example_project.downstream"]
    partner = downstream.parse_args(downstream_command[3:])
    assert partner.host == "0.0.0.0", "the partner must listen beyond the container's loopback"

    demo_command = command_of(services["demo"])
    assert demo_command[:3] == ["python", "-m", "example_project.demo"]
    args = demo.parse_args(demo_command[3:])
    env = environment(services["demo"])
    assert args.redis_url == env["DEMO_REDIS_URL"]
    assert args.downstream_url == env["DEMO_DOWNSTREAM_URL"]
    assert args.external_workers == len(celery_services(services, "worker"))


def test_flower_shows_retries(services: dict[str, dict[str, Any]]) -> None:
    flowers = celery_services(services, "flower")
    assert flowers, "no flower service"
    for name, command in flowers.items():
        columns = (option(command, "--tasks_columns", "--tasks-columns") or "").split(",")
        assert "retries" in columns, f"{name}: the Retries column is not shown"
        assert set(columns) <= FLOWER_COLUMNS, f"{name}: unknown columns"
        env = environment(services[name])
        assert env.get("FLOWER_UNAUTHENTICATED_API", "").lower() in ("true", "1", "yes")
    for name, command in celery_services(services, "worker").items():
        assert "-E" in command or "--task-events" in command, f"{name}: Flower needs -E"


# -- the line in the report and the timeline ------------------------------------------------------


def recorded_run(**recorded: Any) -> Run:
    """A `Run` of what the tasks recorded alone: no partner timeline, no customer balances."""
    return Run(
        partner={"timeline": []}, balances={}, expected_balances={}, reports_limit=2, **recorded
    )


def line_run() -> Run:
    """10 calls sent at t=0 (1 ms apart), started one every 0.2 s from t=0.5; the line read at
    0.2 s (2 in place, 6 parked: 2 more sent hold no place) and at 1.0 s."""
    t0 = 1000.0
    ids = [f"task-{i}" for i in range(10)]
    events = [
        {"task": "call_partner", "id": i, "key": n, "event": event, "at": t0 + 0.5 + 0.2 * n + d,
         "waits": 0, "retries": 0}
        for n, i in enumerate(ids)
        for event, d in (("start", 0.0), ("end", 0.15))
    ]  # fmt: skip
    return recorded_run(
        submitted={i: (t0 + 0.001 * n, n, "call_partner", n) for n, i in enumerate(ids)},
        events=events,
        partner_limit=5,
        line=[
            LineSample(at=t0 + 0.2, parked=6, handed_over=0, in_place=2, asking=0),
            LineSample(at=t0 + 1.0, parked=2, handed_over=1, in_place=2, asking=0),
        ],
    )


def test_the_line_is_split_by_where_tasks_wait() -> None:
    parts = dict(line_run().line_parts("call_partner"))
    assert parts[1000.2] == {
        "in_place": 2, "handed_over": 0, "asking": 0, "parked": 6, "no_place": 2
    }  # fmt: skip
    # at 1.0 s three have started (0.5, 0.7, 0.9): 7 wait, 5 of them in the line
    assert parts[1001.0]["no_place"] == 2


def test_the_report_names_the_longest_line_and_the_last_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(terminal, "OUT", out)
    report_line(line_run())
    text = out.getvalue()
    assert "longest line: 10 call_partner tasks sent and not started, at 0.01s" in text
    assert (
        "at 0.20s, the longest: 2 in place, 0 handed over, 0 asking, 6 parked, 2 no place" in text
    )
    assert "most at once: in place 2, handed over 1, asking 0, parked 6, no place 2" in text
    # the last one sent (at 0.009 s) started at 2.3 s
    assert "the last call sent waited 2.29s from submit to start" in text


def test_the_timeline_draws_the_line(tmp_path: Path) -> None:
    svg = tmp_path / "timeline.svg"
    write_svg(line_run(), svg)
    root = ET.parse(svg).getroot()
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    assert any("the line, tasks waiting for a permit" in t for t in texts), texts
    for _, _, label in LINE_PARTS:
        assert label in texts, f"no legend entry {label!r}"
    layers = {"".join(p.itertext()): p.get("points", "") for p in root.iter(SVG + "polygon")}
    # a layer for each state some reading saw, none for the one nobody was in
    assert set(layers) == {label for key, _, label in LINE_PARTS if key != "asking"}
    outline = [p for p in root.iter(SVG + "path") if "".join(p.itertext()).startswith("sent, not")]
    assert len(outline) == 1


# -- idle permits: below the cap while calls wait, and why -------------------------------------


def idle_run(executions: bool = True) -> Run:
    """A cap of 2, 3 worker processes, 4 calls sent at t=0: A and B start at 0.1, B ends at
    0.5 and C starts only at 0.8 (a process was free: a gap); A ends at 1.0, a report and a
    sync take every process until C ends at 1.5, and D starts then (busy, no gap)."""
    t0 = 1000.0
    runs = [  # task, id, taken, body start, end
        ("call_partner", "A", 0.05, 0.1, 1.0),
        ("call_partner", "B", 0.1, 0.1, 0.5),
        ("call_partner", "C", 0.8, 0.8, 1.5),
        ("call_partner", "D", 1.5, 1.5, 2.0),
        ("build_report", "R", 0.0, 0.2, 2.0),
        ("sync_customer", "S", 1.0, 1.0, 1.6),
    ]
    events = [
        {"task": task, "id": i, "key": 0, "event": event, "at": t0 + at, "waits": 0, "retries": 0}
        for task, i, _, start, end in runs
        for event, at in (("start", start), ("end", end))
    ]
    return recorded_run(
        submitted={i: (t0 + 0.0, n, "call_partner", 0) for n, i in enumerate("ABCD")},
        events=events,
        partner_limit=2,
        executions=[
            {"task": task, "id": i, "taken": t0 + taken, "at": t0 + end}
            for task, i, taken, _, end in runs
        ]
        if executions
        else [],
        processes=3 if executions else 0,
    )


def spans(found: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(round(a - 1000.0, 3), round(b - 1000.0, 3)) for a, b in found]


def test_idle_permits_are_split_by_what_the_calls_waited_for() -> None:
    idle = idle_permits(idle_run(), "call_partner", 2)
    # 0-0.1: the first calls on their way (A waits in place from 0.05); 0.5-0.8: C is late
    assert spans(idle.gaps) == [(0.0, 0.1), (0.5, 0.8)]
    assert spans(idle.busy) == [(1.0, 1.5)]
    assert idle.busy_mix == {
        "build_report": (1.0, 0.0),
        "call_partner": (1.0, 0.0),
        "sync_customer": (1.0, 0.0),
    }
    assert round(Idle.longest(idle.gaps), 3) == 0.3


def test_without_executions_every_dip_counts() -> None:
    idle = idle_permits(idle_run(executions=False), "call_partner", 2)
    assert spans(idle.gaps) == [(0.0, 0.1), (0.5, 0.8), (1.0, 1.5)]
    assert idle.busy == []


def test_the_report_measures_idle_permits(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(terminal, "OUT", out)
    verdict = Verdict()
    report_idle(idle_run(), verdict)
    text = out.getvalue()
    assert "below the cap (2) while calls waited for a permit: longest 0.30s, 0.40s in all" in text
    assert (
        "0.30s from 0.50s: the first call in line reached a worker process only at 0.80s, "
        "0 behind it waited in place" in text
    )
    assert "while all 3 worker processes were busy with other work: 0.50s in all" in text
    assert "waited for a worker process, not for a permit" in text
    assert verdict.warnings and "below its cap for up to 0.30s" in verdict.warnings[0]
    assert not verdict.failures


# -- the demo, for real --------------------------------------------------------------------------


def processes_with(needle: str) -> list[int]:
    """PIDs of live processes whose environment or command line contains ``needle``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            blob = (proc / "environ").read_bytes() + (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle.encode() in blob and state != "Z":
            found.append(int(proc.name))
    return found


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def start_demo(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "example_project.demo", "--quick", "--out", str(tmp_path), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TERM": "dumb"},
    )


def started_addresses(output: str) -> tuple[tuple[str, int], tuple[str, int]]:
    redis_at = re.search(r"private redis-server .* on ([\d.]+):(\d+)", output)
    partner_at = re.search(r"Partner API: started on http://([\d.]+):(\d+)", output)
    assert redis_at and partner_at, output
    return (
        (redis_at.group(1), int(redis_at.group(2))),
        (partner_at.group(1), int(partner_at.group(2))),
    )


def assert_all_stopped(output: str) -> None:
    redis_at, partner_at = started_addresses(output)
    deadline = time.monotonic() + 10
    url = f"redis://{redis_at[0]}:{redis_at[1]}/0"
    while processes_with(url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with(url), "a worker (or one of its children) outlived the demo"
    assert not answers(*redis_at), "the private redis-server outlived the demo"
    assert not answers(*partner_at), "the partner API outlived the demo"


@pytest.mark.slow
def test_quick_demo_runs_end_to_end(tmp_path: Path) -> None:
    demo = start_demo(tmp_path)
    try:
        output, _ = demo.communicate(timeout=240)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    assert demo.returncode == 0, output
    peak = re.search(r"\[ok\] peak concurrency seen by the partner: (\d+) \(cap (\d+)", output)
    assert peak, output
    assert int(peak.group(1)) == int(peak.group(2)) == 5, output
    assert re.search(r"\[ok\] 429 responses: 0 \(200 responses: 40\)", output), output
    assert re.search(r"per-customer peak .*customer 1: 1", output), output
    assert re.search(r"reports queue peak \(.*limit 2\): [12]\b", output), output
    assert "54 of 54 tasks succeeded" in output
    assert "RESULT: OK" in output
    # the line: 40 calls sent at once under a cap of 5 queue up, and the report says where
    longest = re.search(r"longest line: (\d+) call_partner tasks sent and not started", output)
    assert longest and int(longest.group(1)) > 5, output
    readings = re.search(r"where they waited, status\(\) every \d+ ms \((\d+) readings\)", output)
    assert readings and int(readings.group(1)) >= 10, output
    assert re.search(r"most at once: in place \d+, handed over \d+, .*parked \d+", output)
    assert re.search(r"the last call sent waited \d+\.\d+s from submit to start", output)
    svg = tmp_path / "demo-timeline.svg"
    assert f"Timeline picture: {svg}" in output
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(root.findall(".//{http://www.w3.org/2000/svg}path")) >= 4
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    assert any("the line, tasks waiting for a permit" in t for t in texts), texts
    for _, _, label in LINE_PARTS:
        assert label in texts, f"no legend entry {label!r}"
    layers = {"".join(p.itertext()) for p in root.iter(SVG + "polygon")}
    assert layers, "the line's panel draws no sampled waiter"
    assert layers <= {label for _, _, label in LINE_PARTS}
    assert_all_stopped(output)


@pytest.mark.slow
def test_interrupted_demo_stops_everything_it_started(tmp_path: Path) -> None:
    demo = start_demo(tmp_path, "--service-time", "2.0")  # still running when interrupted
    lines: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("Sending "):
                break
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    output = "".join(lines) + rest
    assert demo.returncode == 128 + signal.SIGINT, output
    assert "interrupted (SIGINT)" in output
    assert_all_stopped(output)
