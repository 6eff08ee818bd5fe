"""The timeline picture: holders over time per semaphore, with the caps, and the line of
tasks waiting for the partner-api permits (hand-written SVG)."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import escape

from devkit.measures import steps
from example_project.demo.records import (
    LINE_EVERY,
    LINE_PARTS,
    PARTNER_SEMAPHORE,
    REPORTS_QUEUE,
    Run,
)

Series = tuple[str, str, list[tuple[float, int]], bool]  # label, color, steps, filled
Legend = Sequence[tuple[str, str, bool]]  # label, color, filled (else a line)
LINE_COLORS = {
    "in_place": "#27ae60",
    "handed_over": "#f39c12",
    "asking": "#8e44ad",
    "parked": "#5d7ea8",
    "no_place": "#b0b0b0",
}
COLORS = ["#27ae60", "#d35400", "#16a085", "#c0392b", "#7f8c8d", "#2c3e50"]
SVG_STYLE = """
.title { font-size: 13px; font-weight: bold; fill: #222; }
.sub { font-size: 11px; fill: #444; }
.tick { font-size: 10px; fill: #555; }
.frame { fill: #fafafa; stroke: #ccc; }
.cap { stroke: #d62728; stroke-width: 1.5; stroke-dasharray: 6 4; }
.caplabel { font-size: 11px; fill: #d62728; }
.axis { stroke: #555; }
"""


class Svg:
    """Panels stacked top to bottom on one time axis."""

    width, left, right = 960, 90, 20

    def __init__(self, t0: float, t1: float) -> None:
        self.t0, self.t1 = t0, max(t1, t0 + 0.1)
        self.plot_w = self.width - self.left - self.right
        self.top = 50
        self.parts: list[str] = []

    def x(self, at: float) -> float:
        return self.left + self.plot_w * (at - self.t0) / (self.t1 - self.t0)

    def heading(self, title: str, legend: Legend) -> None:
        """The panel's title, and its legend below it (wrapped to the plot's width)."""
        self.parts.append(
            f'<text x="{self.left}" y="{self.top}" class="title">{escape(title)}</text>'
        )
        lx, row = self.left, self.top
        for label, color, filled in legend:
            width = 14 + int(6.2 * len(label)) + 24
            if lx > self.left and lx + width - 24 > self.left + self.plot_w:
                lx, row = self.left, row + 18
            swatch = (
                f'<rect x="{lx}" y="{row + 7}" width="10" height="10" fill="{color}" '
                'fill-opacity="0.6"/>'
                if filled
                else f'<rect x="{lx}" y="{row + 11}" width="10" height="2" fill="{color}"/>'
            )
            self.parts.append(
                f'{swatch}<text x="{lx + 14}" y="{row + 16}" class="sub">{escape(label)}</text>'
            )
            lx += width
        self.top = row + (26 if legend else 12)

    def steps_panel(self, title: str, cap: int, series: Sequence[Series], height: int) -> None:
        """Step lines (holders over time) with the cap as a dashed red line."""
        self.heading(title, [(label, color, filled) for label, color, _, filled in series])
        top, ymax = self.top, cap + 1

        def y(n: float) -> float:
            return top + height - height * n / ymax

        self.parts.append(
            f'<rect x="{self.left}" y="{top}" width="{self.plot_w}" height="{height}" '
            'class="frame"/>'
        )
        for n in range(ymax + 1):
            self.parts.append(
                f'<text x="{self.left - 6}" y="{y(n) + 4:.1f}" class="tick" '
                f'text-anchor="end">{n}</text>'
            )
        for label, color, points, filled in series:
            d = [f"M{self.x(self.t0):.1f},{y(0):.1f}"]
            d += [f"H{self.x(at):.1f}V{y(n):.1f}" for at, n in points]
            d.append(f"H{self.x(self.t1):.1f}")
            if filled:
                d.append(f"V{y(0):.1f}Z")
                style = f'fill="{color}" fill-opacity="0.35" stroke="{color}" stroke-width="0.8"'
            else:
                style = f'fill="none" stroke="{color}" stroke-width="1.2"'
            self.parts.append(
                f'<path d="{"".join(d)}" {style}><title>{escape(label)}</title></path>'
            )
        self.parts.append(
            f'<line x1="{self.left}" x2="{self.left + self.plot_w}" y1="{y(cap):.1f}" '
            f'y2="{y(cap):.1f}" class="cap"/><text x="{self.left + self.plot_w - 4}" '
            f'y="{y(cap) - 4:.1f}" class="caplabel" text-anchor="end">cap {cap}</text>'
        )
        self.top += height + 40

    def stacked_panel(
        self,
        title: str,
        layers: Legend,
        samples: Sequence[tuple[float, Sequence[int]]],
        outline: Series,
        height: int,
    ) -> None:
        """Sampled counts, one per layer, stacked bottom to top, with an exact step line over
        them."""
        label, color, points, _ = outline
        self.heading(title, [*layers, (label, color, False)])
        top = self.top
        highest = max([n for _, n in points] + [sum(counts) for _, counts in samples] + [1])
        step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if highest / s <= 5)
        ymax = step * math.ceil(highest / step)

        def y(n: float) -> float:
            return top + height - height * n / ymax

        self.parts.append(
            f'<rect x="{self.left}" y="{top}" width="{self.plot_w}" height="{height}" '
            'class="frame"/>'
        )
        for n in range(0, ymax + 1, step):
            self.parts.append(
                f'<text x="{self.left - 6}" y="{y(n) + 4:.1f}" class="tick" '
                f'text-anchor="end">{n}</text>'
            )
        # each reading stands for the time around it: from the midpoint with the previous
        # reading to the midpoint with the next (the first and last: half a median interval)
        times = [at for at, _ in samples]
        half = statistics.median([b - a for a, b in itertools.pairwise(times)] or [0.0]) / 2
        cuts = [(a + b) / 2 for a, b in itertools.pairwise(times)]
        starts = [max(self.t0, times[0] - half), *cuts] if times else []
        ends = [*cuts, min(self.t1, times[-1] + half)] if times else []
        spans = list(zip(starts, ends, strict=True))
        below = [0] * len(samples)
        for k, (name, fill, _) in enumerate(layers):
            above = [b + counts[k] for b, (_, counts) in zip(below, samples, strict=True)]
            upper = [f"{self.x(a):.1f},{y(n):.1f} {self.x(e):.1f},{y(n):.1f}"
                     for (a, e), n in zip(spans, above, strict=True)]  # fmt: skip
            lower = [f"{self.x(e):.1f},{y(n):.1f} {self.x(a):.1f},{y(n):.1f}"
                     for (a, e), n in zip(spans, below, strict=True)]  # fmt: skip
            if above != below:
                self.parts.append(
                    f'<polygon points="{" ".join(upper + lower[::-1])}" fill="{fill}" '
                    f'fill-opacity="0.6" stroke="none"><title>{escape(name)}</title></polygon>'
                )
            below = above
        d = [f"M{self.x(self.t0):.1f},{y(0):.1f}"]
        d += [f"H{self.x(at):.1f}V{y(n):.1f}" for at, n in points]
        d.append(f"H{self.x(self.t1):.1f}")
        self.parts.append(
            f'<path d="{"".join(d)}" fill="none" stroke="{color}" stroke-width="1.4">'
            f"<title>{escape(label)}</title></path>"
        )
        self.top += height + 40

    def lanes_panel(
        self, title: str, lanes: Sequence[tuple[str, list[tuple[float, float]]]], lane_h: int
    ) -> None:
        """One row per key, a bar per execution (bars of one row overlap only if the cap broke)."""
        self.heading(title, [])
        for i, (label, intervals) in enumerate(lanes):
            top = self.top + i * (lane_h + 4)
            color = COLORS[i % len(COLORS)]
            self.parts.append(
                f'<rect x="{self.left}" y="{top}" width="{self.plot_w}" height="{lane_h}" '
                f'class="frame"/><text x="{self.left - 6}" y="{top + lane_h / 2 + 4:.1f}" '
                f'class="tick" text-anchor="end">{escape(label)}</text>'
            )
            for start, end in intervals:
                self.parts.append(
                    f'<rect x="{self.x(start):.1f}" y="{top + 2}" '
                    f'width="{max(self.x(end) - self.x(start), 0.5):.1f}" height="{lane_h - 4}" '
                    f'fill="{color}" fill-opacity="0.5" stroke="{color}" stroke-width="0.6"/>'
                )
        self.top += len(lanes) * (lane_h + 4) + 36

    def render(self, title: str) -> str:
        axis_y = self.top - 26
        span = self.t1 - self.t0
        step = next(s for s in (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300) if span / s <= 20)
        ticks, at = [], 0.0
        while at <= span + 1e-9:
            x = self.x(self.t0 + at)
            ticks.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{axis_y - 4}" y2="{axis_y}" class="axis"/>'
                f'<text x="{x:.1f}" y="{axis_y + 14}" class="tick" text-anchor="middle">'
                f"{at:g}</text>"
            )
            at += step
        height = axis_y + 40
        body = "\n".join(self.parts)
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{height}" '
            f'viewBox="0 0 {self.width} {height}" font-family="Helvetica, Arial, sans-serif">\n'
            f"<style>{SVG_STYLE}</style>\n"
            '<rect width="100%" height="100%" fill="white"/>\n'
            f'<text x="{self.left}" y="22" class="title" font-size="15">{escape(title)}</text>\n'
            f"{body}\n"
            f'<line x1="{self.left}" x2="{self.left + self.plot_w}" y1="{axis_y}" '
            f'y2="{axis_y}" class="axis"/>\n{"".join(ticks)}\n'
            f'<text x="{self.left + self.plot_w / 2}" y="{axis_y + 30}" class="tick" '
            'text-anchor="middle">seconds since the first task was sent</text>\n</svg>\n'
        )


def write_svg(run: Run, path: Path) -> None:
    """Holders over time per semaphore, with the caps: hand-written SVG, no dependencies."""
    t0 = min(t for t, *_ in run.submitted.values())
    t1 = max([float(e["at"]) for e in run.events] or [t0 + 1])
    svg = Svg(t0, t1)
    downstream = [(float(t), int(n)) for t, n in run.partner.get("timeline") or []]
    svg.steps_panel(
        f"{PARTNER_SEMAPHORE} (limit {run.partner_limit}): partner calls at once",
        run.partner_limit,
        [
            ("call_partner bodies running", "#2b7bb9", steps(run.intervals("call_partner")), True),
            ("requests in flight at the partner", "#222222", downstream, False),
        ],
        170,
    )
    parts = [(at, split) for at, split in run.line_parts("call_partner") if t0 <= at < t1]
    svg.stacked_panel(
        f"{PARTNER_SEMAPHORE}: the line, tasks waiting for a permit (where: "
        f"Semaphore.status() every {LINE_EVERY * 1000:.0f} ms)",
        [(label, LINE_COLORS[key], True) for key, _, label in LINE_PARTS],
        [(at, [split[key] for key, _, _ in LINE_PARTS]) for at, split in parts],
        ("sent, not started (the tasks' own records)", "#222222",
         run.not_started("call_partner"), False),
        150,
    )  # fmt: skip
    svg.steps_panel(
        f"queue:{REPORTS_QUEUE} (limit {run.reports_limit}): reports at once",
        run.reports_limit,
        [("build_report bodies running", "#8e44ad", steps(run.intervals("build_report")), True)],
        60,
    )
    svg.lanes_panel(
        "customer-<id> (limit 1 each): sync_customer executions, one row per customer",
        [
            (f"customer {c}", run.intervals("sync_customer", c))
            for c in sorted(run.expected_balances)
        ],
        16,
    )
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0))
    path.write_text(svg.render(f"celery-semaphore demo: {len(run.submitted)} tasks, {stamp}"))
