"""What the demo prints: colours when the terminal has them, and the progress bar."""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import TextIO

OUT: TextIO = sys.stdout


def tty() -> bool:
    return OUT.isatty() and os.environ.get("TERM") != "dumb"


def paint(text: str, code: str) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if tty() else text


def say(text: str = "") -> None:
    print(text, file=OUT, flush=True)


class Progress:
    """One line redrawn with ``\\r`` on a terminal; a plain line every few seconds otherwise."""

    def __init__(self, total: int, width: int = 30) -> None:
        self.total = total
        self.width = width
        self.last_plain = 0.0
        self.drawn = False

    def show(self, done: int, detail: str) -> None:
        filled = int(self.width * done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {done:>4}/{self.total}  {detail}"
        if tty():
            columns = shutil.get_terminal_size().columns
            OUT.write("\r" + line[: columns - 1] + "\x1b[K")  # a wrapped line can't be redrawn
            OUT.flush()
            self.drawn = True
        elif time.monotonic() - self.last_plain >= 2.0 or done == self.total:
            self.last_plain = time.monotonic()
            say(line)

    def end(self) -> None:
        if self.drawn:
            OUT.write("\n")
            OUT.flush()
            self.drawn = False
