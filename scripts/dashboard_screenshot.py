"""Picture of the Grafana dashboard's panels over a real demo run: docs/img/dashboard.png.

Starts Prometheus (its own temp dir, a free loopback port, the alert rules of
deploy/prometheus loaded) scraping the demo's two workers, which serve metrics
with ``--semaphore-metrics-port``; runs the demo; then draws every panel of
deploy/grafana/celery-semaphore-dashboard.json where Grafana would put it, each
from its own PromQL queries (Grafana's variables substituted as Grafana does:
every job and semaphore, ``$__rate_interval`` = max(4 x scrape interval, step +
scrape interval)) through Prometheus' ``query_range`` API. Grafana itself has
no Debian or PyPI package, so matplotlib draws the panels. Stops everything it
started, by pid. A tool, not a test: ``bash scripts/dashboard_screenshot.sh``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devkit.processes import Processes, wait_until  # noqa: E402
from devkit.redis_servers import free_port  # noqa: E402

DASHBOARD = ROOT / "deploy/grafana/celery-semaphore-dashboard.json"
RULES = ROOT / "deploy/prometheus/celery-semaphore-alerts.yml"
SCRAPE_INTERVAL = 1.0
WORKERS = 2  # the demo's default; each serves the same cluster-wide series
DEMO_ARGS = ["--service-time", "1", "--jitter", "0.5"]
GRID_WIDTH = 24  # Grafana's columns
WIDTH_IN, UNIT_IN, HEAD_IN = 18.0, 0.42, 0.8  # the picture's width, a grid row, the caption
STYLES = ["-", "--", ":", "-."]
GRAFANA_COLOURS = {"green": "#73bf69", "orange": "#ff9830", "red": "#f2495c"}  # its palette


Series = list[tuple[int, dict[str, str], str, list[float], list[float]]]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise RuntimeError(f"{url}: {body}")
    return body["data"]


def free_port_pair() -> int:
    """A port P with P+1 free too: the demo's worker i serves on P+i-1."""
    for _ in range(50):
        port = free_port()
        if port + 1 <= 65535 and free_port_is(port + 1):
            return port
    raise RuntimeError("no two consecutive free loopback ports")


def free_port_is(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def start_prometheus(processes: Processes, workdir: Path, metrics_port: int) -> str:
    port = free_port()
    targets = ", ".join(f'"127.0.0.1:{metrics_port + i}"' for i in range(WORKERS))
    config = workdir / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL:g}s\n"
        f"  evaluation_interval: {SCRAPE_INTERVAL:g}s\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n  - job_name: celery-semaphore\n"
        f"    static_configs: [{{targets: [{targets}]}}]\n"
    )
    processes.start(
        "prometheus",
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    wait_until(ready, 60, "Prometheus to be ready")
    return url


def data_span(prometheus: str, start: float, end: float) -> tuple[float, float]:
    """From just before the first scrape that saw a semaphore to just after the last."""
    params = {"query": "count(celery_semaphore_limit)", "start": start, "end": end, "step": 1}
    result = get_json(f"{prometheus}/api/v1/query_range?" + urllib.parse.urlencode(params))
    if not result["result"]:
        raise RuntimeError("Prometheus scraped no celery_semaphore_limit during the demo")
    times = [float(t) for t, _ in result["result"][0]["values"]]
    return times[0] - 3 * SCRAPE_INTERVAL, times[-1] + 3 * SCRAPE_INTERVAL


def substitute(expr: str, step: float) -> str:
    """Grafana's variables as Grafana fills them with every job and semaphore selected."""
    rate_interval = max(4 * SCRAPE_INTERVAL, step + SCRAPE_INTERVAL)
    expr = expr.replace("$__rate_interval", f"{rate_interval:g}s")
    return re.sub(r"\$(job|semaphore)\b", ".+", expr)


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def query_panel(
    prometheus: str, panel: dict[str, Any], start: float, end: float, step: float
) -> Series:
    series = []
    for index, target in enumerate(panel["targets"]):
        params = urllib.parse.urlencode(
            {"query": substitute(target["expr"], step), "start": start, "end": end, "step": step}
        )
        for result in get_json(f"{prometheus}/api/v1/query_range?{params}")["result"]:
            labels = result["metric"]
            times = [float(t) for t, _ in result["values"]]
            values = [float(v) for _, v in result["values"]]
            label = legend(target.get("legendFormat", ""), labels)
            series.append((index, labels, label, times, values))
    return series


def draw(prometheus: str, start: float, end: float, out: Path, caption: str) -> list[str]:
    """Every panel at its gridPos; returns the titles of panels that drew no data."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    fig = plt.figure(figsize=(WIDTH_IN, height * UNIT_IN + HEAD_IN), dpi=80)
    fig.patch.set_facecolor("#f4f5f5")
    fig.text(0.008, 1 - 0.1 / fig.get_figheight(), caption, ha="left", va="top", fontsize=11)

    def inches(grid: dict[str, int]) -> tuple[float, float, float, float]:
        """Left, bottom, width, height of a grid box, in inches from the figure's bottom left."""
        w, h = grid["w"] / GRID_WIDTH * WIDTH_IN, grid["h"] * UNIT_IN
        return grid["x"] / GRID_WIDTH * WIDTH_IN, (height - grid["y"]) * UNIT_IN - h, w, h

    for row in dashboard["panels"]:
        if row["type"] == "row":
            x, y, _, h = inches(row["gridPos"])
            fig.text((x + 0.1) / WIDTH_IN, (y + h / 2) / fig.get_figheight(), row["title"],
                     fontsize=13, weight="bold", va="center")  # fmt: skip
    results = {p["id"]: query_panel(prometheus, p, start, end, SCRAPE_INTERVAL) for p in panels}
    names = sorted({labels.get("semaphore", "") for r in results.values() for _, labels, *_ in r})
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
    for panel in panels:
        x, y, w, h = inches(panel["gridPos"])
        draw_panel(
            fig, panel, results[panel["id"]], box=(x, y, w, h), span=(start, end), colours=colours
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, facecolor=fig.get_facecolor())
    plt.close(fig)
    return [p["title"] for p in panels if not results[p["id"]]]


def draw_panel(
    fig: Any,
    panel: dict[str, Any],
    series: Series,
    *,
    box: tuple[float, float, float, float],
    span: tuple[float, float],
    colours: dict[str, Any],
) -> None:
    """One panel in its box (inches): lines or bars per series, legend below like Grafana's."""
    import matplotlib.dates as mdates  # noqa: PLC0415
    from matplotlib.ticker import FuncFormatter, PercentFormatter  # noqa: PLC0415

    x, y, w, h = box
    timeline = panel["type"] == "state-timeline"
    longest = max((len(label) for _, _, label, *_ in series), default=0)
    columns = max(1, int(w / (0.4 + 0.075 * longest)))  # legend entries side by side
    legend_rows = -(-len(series) // columns)
    if timeline:  # the legend of its states, if it shows one
        legend_rows = 1 if panel["options"].get("legend", {}).get("showLegend") else 0
    bottom, top = 0.35 + 0.17 * legend_rows, 0.35
    left = 0.3 + 0.075 * longest if timeline else 0.6
    fw, fh = fig.get_figwidth(), fig.get_figheight()
    ax = fig.add_axes(((x + left) / fw, (y + bottom) / fh, (w - left - 0.15) / fw,
                       (h - bottom - top) / fh))  # fmt: skip
    ax.set_title(panel["title"], fontsize=11, loc="left")
    ax.set_facecolor("white")
    ax.grid(alpha=0.3)
    ax.set_xlim(*(datetime.fromtimestamp(t, timezone.utc) for t in span))
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=2, maxticks=max(3, int(w / 1.2))))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    ax.tick_params(labelsize=8)
    if not series:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes)
        return
    if timeline:
        draw_states(ax, panel, series)
        return
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    styles: dict[tuple[int, str], str] = {}
    for index, labels, label, times, values in series:
        when = [datetime.fromtimestamp(t, timezone.utc) for t in times]
        style = styles.setdefault((index, labels.get("outcome", "")), STYLES[len(styles) % 4])
        colour = colours[labels.get("semaphore", "")]
        if defaults.get("custom", {}).get("drawStyle") == "bars":
            ax.bar(when, values, width=SCRAPE_INTERVAL / 86400, color=colour, label=label)
        else:
            ax.plot(when, values, style, color=colour, label=label, linewidth=1.6)
    if all(v == 0 for *_, values in series for v in values):
        ax.text(0.5, 0.5, "0 throughout", color="grey", ha="center", transform=ax.transAxes)
    ax.set_ylim(bottom=defaults.get("min", 0))
    if "max" in defaults:
        ax.set_ylim(top=defaults["max"] * 1.05)
    formats = {
        "percentunit": PercentFormatter(1.0),
        "s": FuncFormatter(lambda v, _: f"{v:g} s"),
        "ops": FuncFormatter(lambda v, _: f"{v:g}/s"),
    }
    if defaults.get("unit") in formats:
        ax.yaxis.set_major_formatter(formats[defaults["unit"]])
    ax.legend(fontsize=7.5, ncol=columns, loc="upper left", frameon=False,
              bbox_to_anchor=(0, -0.3 / (h - bottom - top)))  # fmt: skip


def draw_states(ax: Any, panel: dict[str, Any], series: Series) -> None:
    """A state timeline as Grafana draws it: one band per series, coloured and labelled by
    the panel's value mappings (a run of one value is one labelled stretch, as with
    ``mergeValues``), and the mappings' legend below when the panel shows one."""
    import matplotlib.dates as mdates  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    states = {}
    for mapping in panel["fieldConfig"]["defaults"].get("mappings", []):
        for value, shown in mapping.get("options", {}).items():
            states[float(value)] = (shown["text"], GRAFANA_COLOURS.get(shown["color"], "grey"))
    start, end = (mdates.num2date(x) for x in ax.get_xlim())
    for row, (_, _, _, times, values) in enumerate(series):
        runs: list[tuple[float, float, float]] = []  # value, first sample, last sample
        for t, v in zip(times, values, strict=True):
            if runs and runs[-1][0] == v:
                runs[-1] = (v, runs[-1][1], t)
            else:
                runs.append((v, t, t))
        for value, first, last in runs:
            text, colour = states.get(value, (f"{value:g}", "grey"))
            left = datetime.fromtimestamp(first, timezone.utc)
            width = timedelta(seconds=last - first + SCRAPE_INTERVAL)
            ax.barh(row, width, height=0.7, left=left, color=colour)
            middle = max(start, left) + (min(end, left + width) - max(start, left)) / 2
            ax.text(middle, row, text, ha="center", va="center", fontsize=8, color="black")
    ax.set_yticks(range(len(series)), [labels.get("semaphore", "") for _, labels, *_ in series])
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(False)
    if panel["options"].get("legend", {}).get("showLegend"):
        patches = [Patch(color=colour, label=text) for text, colour in states.values()]
        ax.legend(handles=patches, fontsize=7.5, ncol=len(patches), loc="upper left",
                  frameon=False, bbox_to_anchor=(0, -0.12))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/img/dashboard.png")
    parser.add_argument(
        "demo_args",
        nargs="*",
        default=DEMO_ARGS,
        help=f"passed to the demo, after -- (default: {' '.join(DEMO_ARGS)}: a partner that "
        "answers in 1 s, so the run lasts about a minute)",
    )
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="dashboard-screenshot-"))
    processes = Processes(workdir, cwd=ROOT)
    done = False
    try:
        metrics_port = free_port_pair()
        prometheus = start_prometheus(processes, workdir, metrics_port)
        print(f"Prometheus: {prometheus} (data and logs in {workdir})")
        start = time.time()
        demo = [sys.executable, "-m", "example_project.demo", "--metrics-port", str(metrics_port)]
        code = subprocess.run([*demo, *args.demo_args], cwd=ROOT, check=False).returncode
        time.sleep(3 * SCRAPE_INTERVAL)
        end = time.time()
        if code != 0:
            print(f"the demo exited {code}; no picture", file=sys.stderr)
            return 1
        start, end = data_span(prometheus, start, end)
        alerts = get_json(
            f"{prometheus}/api/v1/query_range?"
            + urllib.parse.urlencode({"query": "ALERTS", "start": start, "end": end, "step": 1})
        )["result"]
        for alert in alerts:
            print(f"alert during the run: {alert['metric']}")
        caption = (
            f"deploy/grafana/celery-semaphore-dashboard.json over a demo run "
            f"(python -m example_project.demo {' '.join(args.demo_args)}; "
            f"{datetime.fromtimestamp(start, timezone.utc):%Y-%m-%d %H:%M:%S} UTC, "
            f"{WORKERS} workers each serving the metrics).\nEvery panel's own PromQL through "
            "Prometheus' query_range API, drawn with matplotlib where Grafana puts the panel "
            "(Grafana has no Debian or PyPI package to run it here)."
        )
        empty = draw(prometheus, start, end, args.out, caption)
        print(f"Picture: {args.out} ({args.out.stat().st_size // 1024} KB)")
        if empty:
            print(f"panels with no data: {', '.join(empty)}", file=sys.stderr)
            return 1
        done = True
        return 0
    finally:
        processes.stop_all()
        if done:  # else kept, with Prometheus' log
            shutil.rmtree(workdir)


if __name__ == "__main__":
    sys.exit(main())
