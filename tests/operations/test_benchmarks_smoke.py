"""The benchmark script runs end to end (figures are printed, never asserted: timing
targets belong to benchmarks/README.md, not to tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_semaphore.py"


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


@pytest.mark.slow
def test_bench_semaphore_quick_json_reports_every_figure() -> None:
    with subprocess.Popen(
        [sys.executable, str(BENCH), "--quick", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as bench:
        try:
            stdout, stderr = bench.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            bench.terminate()  # SIGTERM: the script stops its redis-server before exiting
            stdout, stderr = bench.communicate(timeout=30)
            pytest.fail(f"bench_semaphore.py --quick ran over 300 s:\n{stderr[-3000:]}")
    assert bench.returncode == 0, stderr[-3000:]
    results = json.loads(stdout)

    assert results["quick"] is True
    throughput = results["throughput"]
    for key in ("ping_ops_per_s", "ping_ops_per_s_best", "floor_cycles_per_s"):
        assert _positive(throughput[key]), key
    assert throughput["floor_cycles_per_s"] == pytest.approx(throughput["ping_ops_per_s"] / 2)
    for library in ("celery_semaphore", "py_redis_semaphore", "dramatiq"):
        for key in (
            "cycles_per_s",
            "cycles_per_s_best",
            "ratio_to_floor",
            "ratio_to_floor_best",
            "server_cpu_us_per_cycle",
        ):
            assert _positive(throughput[library][key]), (library, key)

    latency = results["latency"]
    for scenario in ("empty", "small_refused", "large"):
        row = latency[scenario]
        assert _positive(row["p50_us"]), scenario
        assert row["p99_us"] >= row["p50_us"], scenario
    assert latency["large"]["holders"] > 0
    assert latency["large"]["waiters"] > latency["large"]["holders"]
    assert _positive(latency["large_over_empty"]["p50"])
    assert _positive(latency["large_over_empty"]["p99"])

    assert results["targets"] == {"ratio_to_floor_min": 0.9, "large_over_empty_max": 2.0}
    assert results["environment"]["server"].startswith("127.0.0.1:")
    assert not results["environment"]["server"].endswith(":6379")


@pytest.mark.slow
def test_bench_polling_quick_json_reports_every_system() -> None:
    script = BENCH.with_name("bench_polling.py")
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--json"], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    systems = json.loads(done.stdout)["systems"]
    assert set(systems) == {
        "ours-anonymous", "ours-holder-id", "ours-acquire", "py-redis-semaphore", "dramatiq",
    }  # fmt: skip
    for name, figures in systems.items():
        assert _positive(figures["grants"]), name
        assert 0 < figures["utilisation"] <= 1.5, name
        assert 0 < figures["fairness"] <= 1.0, name


@pytest.mark.slow
def test_bench_fair_quick_json_serves_every_line_in_turns() -> None:
    script = BENCH.with_name("bench_fair_core.py")
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--json"], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    fair = results["fair"]
    for line in ("none", "one_key", "many_keys", "round_robin"):
        assert fair[line]["grants"] == results["settings"]["contenders"], line
        assert _positive(fair[line]["us_per_grant"]), line
    assert _positive(fair["many_over_one"]) and _positive(fair["one_over_none"])
    assert fair["round_robin_errors"] == []
    assert fair["records_left_many_keys"] == 0
    assert results["targets"] == {"many_over_one_max": 1.5}
    assert not results["environment"]["server"].endswith(":6379")


@pytest.mark.slow
def test_bench_scrape_quick_json_times_both_scrapes_of_the_same_data() -> None:
    script = BENCH.with_name("bench_scrape.py")
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--json"], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    settings, scrape = results["settings"], results["scrape"]
    assert scrape["totals"]["waiters"] == settings["waiting"]
    assert scrape["totals"]["sent"] > 0 and scrape["totals"]["fair_keys_waiting"] > 0
    for path in ("status", "counts"):
        for key in ("server_ms", "script_ms", "wall_ms"):
            assert _positive(scrape[path][key]), (path, key)
    assert results["targets"] == {"counts_server_ms_max": 50.0}
    assert "load average" in results["environment"]["uptime_before"]
    assert not results["environment"]["server"].endswith(":6379")
