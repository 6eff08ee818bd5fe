"""Write docs/img/lifecycle.svg: the life of one LimitedTask, from publish to release.

A plain SVG written by hand-placed boxes, so the docs render it offline (no
Mermaid, no CDN). Edit the boxes here and run the script; the unit tests check
that the committed file is what the script writes:

    python scripts/lifecycle_diagram.py           # rewrite the SVG
    python scripts/lifecycle_diagram.py --check   # exit 1 if it differs
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

TARGET = Path(__file__).resolve().parent.parent / "docs" / "img" / "lifecycle.svg"
WIDTH, HEIGHT = 1060, 1175
LINE = 17  # px between text lines
LINE_STYLE = 'fill="none" stroke="#555" stroke-width="1.5"'
STYLES = {  # fill, stroke
    "main": ("#e7f2fa", "#2980b9"),
    "wait": ("#fff6dd", "#d4a017"),
    "end": ("#e8f6ec", "#27ae60"),
    "fail": ("#fdecea", "#c0392b"),
}


@dataclass
class Box:
    x: int
    y: int
    w: int
    title: str
    lines: list[str]
    style: str = "main"

    @property
    def h(self) -> int:
        return 34 + LINE * len(self.lines)

    @property
    def mid_x(self) -> int:
        return self.x + self.w // 2

    @property
    def bottom(self) -> int:
        return self.y + self.h

    @property
    def right(self) -> int:
        return self.x + self.w

    def svg(self) -> str:
        fill, stroke = STYLES[self.style]
        parts = [
            f'<rect x="{self.x}" y="{self.y}" width="{self.w}" height="{self.h}" rx="6" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>',
            f'<text x="{self.x + 10}" y="{self.y + 21}" class="title">{escape(self.title)}</text>',
        ]
        for i, line in enumerate(self.lines):
            y = self.y + 21 + LINE * (i + 1) + 2
            parts.append(f'<text x="{self.x + 10}" y="{y}">{escape(line)}</text>')
        return "\n".join(parts)


def arrow(points: list[tuple[int, int]], label: str = "", at: int = 0, dx: int = 6) -> str:
    """A polyline ending in an arrowhead; ``label`` beside segment ``at``'s start."""
    path = " ".join(f"{x},{y}" for x, y in points)
    out = f'<polyline points="{path}" {LINE_STYLE} marker-end="url(#head)"/>'
    if label:
        (x1, y1), (x2, y2) = points[at], points[at + 1]
        x, y = ((x1 + x2) // 2 + dx, (y1 + y2) // 2 + 4) if x1 == x2 else ((x1 + x2) // 2, y1 - 6)
        anchor = "start" if x1 == x2 else "middle"
        text = escape(label)
        out += f'\n<text x="{x}" y="{y}" class="label" text-anchor="{anchor}">{text}</text>'
    return out


LEFT, RIGHT, COL = 20, 565, 470

publish = Box(LEFT, 40, COL, "1. Published (apply_async, in the publishing process)", [
    "before_task_publish takes a place in line per gate (queue cap,",
    "task semaphore): a ticket, in the message header, with a 5 s",
    "waiter lease. The ticket orders the task FIFO from now on.",
])  # fmt: skip
parked_at_publish = Box(RIGHT, 40, COL, "1a. Parked at publish (handover mode)", [
    "Far back (waiters ahead >= free permits + limit): the message",
    "is kept in Redis beside its place instead of being sent.",
    "The task is PENDING; no worker sees it before its turn.",
], "wait")  # fmt: skip
broker = Box(LEFT, 175, COL, "2. In the broker queue", [
    "Its place lapses after 5 s if it sits there (it stays counted",
    "as sent); the ticket it carries puts it back ahead of later",
    "tickets when it arrives.",
])  # fmt: skip
handed_over = Box(RIGHT, 175, COL, "H. Handed over, when its turn comes", [
    "The process that frees a permit (release, reclaimed lease,",
    "raised limit, resume) publishes the parked tasks now due to",
    "<queue>.semaphore-handover; a worker's heartbeat does it when",
    "nobody called, or the first copy is late (handover_deadline).",
], "wait")  # fmt: skip
delivered = Box(LEFT, 305, COL, "3. Delivered to a worker", [
    "The main process (task_received) decides the request's gates",
    "and records them in the request.",
])  # fmt: skip
attempt = Box(LEFT, 415, COL, "4. Attempt (pool child, before the body)", [
    "attempt(task id, ticket) per gate: one Lua script, on the",
    "Redis server clock. Granted if a permit is free and no",
    "earlier live ticket waits for it.",
])  # fmt: skip
in_place = Box(RIGHT, 415, COL, "4a. Refused, turn near: wait in place", [
    "Among the next limit in line, its turn due within max_block:",
    "blocks at most semaphore_max_block (1 s) on the wake channel;",
    "a release grants it the permit directly -> 5. No permit in",
    "time -> 4b or 4c.",
], "wait")  # fmt: skip
parked = Box(RIGHT, 545, COL, "4b. Refused, turn far: parked (handover mode)", [
    "The retry message (retries + 1, tickets) is kept beside its",
    "place in Redis; the execution ends as a Celery retry that",
    "publishes nothing (RETRY in Flower). -> H when its turn comes.",
], "wait")  # fmt: skip
countdown = Box(RIGHT, 660, COL, "4c. Countdown retry (countdown mode, or can't park)", [
    "Retried with a countdown aimed half a hold before its turn",
    "(backoff when it can't be estimated); its place is kept for",
    "the countdown. -> back to 2.",
], "wait")  # fmt: skip
timeout = Box(RIGHT, 775, COL, "4d. Wait budget exceeded", [
    "semaphore_max_waits / semaphore_max_wait_time: the places",
    "are dropped and the task fails with SemaphoreTimeout.",
], "fail")  # fmt: skip
granted = Box(LEFT, 575, COL, "5. Granted: a permit, held as a lease", [
    "Holder id = task id; lease semaphore_lease_timeout (60 s);",
    "a new fencing token. The body starts.",
])  # fmt: skip
running = Box(LEFT, 685, COL, "6. The body runs; the heartbeat renews the lease", [
    "A thread in the worker's main process renews the leases of",
    "all its running tasks: one renew_many call per semaphore",
    "every semaphore_heartbeat_interval (lease / 4: 15 s).",
])  # fmt: skip
released = Box(LEFT, 815, COL, "7. Released, however the task ends", [
    "Pool child, in finally: success, failure, the task's own",
    "  retry, Ignore, Reject, soft time limit, warm shutdown.",
    "Main process, by task id: hard time limit, revoke (also",
    "  terminate), cold shutdown, a killed child (seen within",
    "  0.2 s by the dead-children watch, before the pool reaps it).",
    "Nobody (the whole worker killed): the lease runs out and the",
    "  next operation on the semaphore reclaims the permit.",
], "end")  # fmt: skip
next_in_line = Box(LEFT, 1030, COL, "8. Next in line", [
    "The same script that frees the permit grants it to the first",
    "waiters in place (-> 4a, in ticket order) and picks the parked",
    "tasks now due (-> H); other waiters are woken on the",
    "semaphore's wake channel.",
], "end")  # fmt: skip

BOXES = [
    publish, parked_at_publish, broker, handed_over, delivered, attempt, in_place,
    parked, countdown, timeout, granted, running, released, next_in_line,
]  # fmt: skip


def arrows() -> list[str]:
    trunk = attempt.right + 40
    down = [
        arrow(
            [(publish.mid_x, publish.bottom), (publish.mid_x, broker.y)],
            "sent (turn near, or not parkable)",
        ),
        arrow([(broker.mid_x, broker.bottom), (broker.mid_x, delivered.y)]),
        arrow([(delivered.mid_x, delivered.bottom), (delivered.mid_x, attempt.y)]),
        arrow([(attempt.mid_x, attempt.bottom), (attempt.mid_x, granted.y)], "granted"),
        arrow([(granted.mid_x, granted.bottom), (granted.mid_x, running.y)]),
        arrow([(running.mid_x, running.bottom), (running.mid_x, released.y)], "the body ends"),
        arrow([(released.mid_x, released.bottom), (released.mid_x, next_in_line.y)]),
    ]
    side = [
        arrow([(publish.right, publish.y + 30), (parked_at_publish.x, publish.y + 30)], "far back"),
        arrow(
            [
                (parked_at_publish.mid_x, parked_at_publish.bottom),
                (handed_over.mid_x, handed_over.y),
            ],
            "its turn comes",
        ),
        arrow(
            [
                (handed_over.x, handed_over.bottom - 20),
                (trunk, handed_over.bottom - 20),
                (trunk, delivered.y + 30),
                (delivered.right, delivered.y + 30),
            ]
        ),
        arrow(
            [
                (parked.right, parked.y + 30),
                (WIDTH - 10, parked.y + 30),
                (WIDTH - 10, handed_over.y + 30),
                (handed_over.right, handed_over.y + 30),
            ]
        ),
    ]
    y = attempt.y + 30
    refused = [
        f'<polyline points="{attempt.right},{y} {trunk},{y} {trunk},{timeout.y + 30}" '
        f"{LINE_STYLE}/>",
        f'<text x="{attempt.right + 4}" y="{y - 6}" class="label">refused</text>',
    ]
    for box in (in_place, parked, countdown, timeout):
        refused.append(arrow([(trunk, box.y + 30), (box.x, box.y + 30)]))
    return down + side + refused


HEAD = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}"',
    f' viewBox="0 0 {WIDTH} {HEIGHT}" xml:space="preserve" font-size="13" fill="#222"',
    ' font-family="Lato, Helvetica, Arial, sans-serif">\n',
    "<title>The life of one LimitedTask: publish, place in line, attempt, wait, permit,",
    " lease, release</title>\n",
    '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7"',
    ' markerHeight="7" orient="auto-start-reverse">',
    '<path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>\n',
    "<style>.title { font-weight: bold; font-size: 14px; }",
    " .label { font-size: 12px; fill: #444; font-style: italic; }</style>\n",
    '<rect width="100%" height="100%" fill="#ffffff"/>\n',
    f'<text x="{LEFT}" y="24" class="title" font-size="16">The life of one LimitedTask',
    " (handover mode, the default; countdown mode differs at 1a and 4b)</text>\n",
]


def svg() -> str:
    body = "\n".join([*(box.svg() for box in BOXES), *arrows()])
    return "".join(HEAD) + body + "\n</svg>\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the SVG differs")
    args = parser.parse_args(argv)
    wanted = svg()
    current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
    if args.check:
        if current != wanted:
            sys.stderr.write(f"{TARGET} is out of date: run python scripts/lifecycle_diagram.py\n")
            return 1
        return 0
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
