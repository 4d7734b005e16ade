"""Progress for long steps: a bar on a terminal, plain periodic lines otherwise (logs, pipes, CI),
so a log never holds carriage returns.

    with progress_bar(total, "paired runs", "step") as bar:
        ...; bar.update(1)

Both forms write to stderr. Off a terminal a line is written when the count first moves, then at
most every `every_s` seconds, and once at the end: `<desc>: <n>/<total> <unit> (<s> s)`.
"""

from __future__ import annotations

import sys
import time


class LineProgress:
    """tqdm's small interface (update, set_postfix, close, context manager) as plain lines."""

    def __init__(self, total: int | None, desc: str, unit: str, file, every_s: float, disable: bool):
        self.total, self.desc, self.unit, self.file, self.every_s = total, desc, unit, file, every_s
        self.disable, self.n, self.t0, self.last, self.shown = disable, 0, time.monotonic(), None, 0
        self.postfix = ""

    def _line(self) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        print(f"{self.desc}: {self.n}{of} {self.unit} ({time.monotonic() - self.t0:.0f} s){self.postfix}",
              file=self.file, flush=True)
        self.last, self.shown = time.monotonic(), self.n

    def set_postfix(self, **values) -> None:
        self.postfix = "".join(f", {k}={v}" for k, v in values.items())
        self.last, self.shown = time.monotonic(), self.n

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.disable and (self.last is None or time.monotonic() - self.last >= self.every_s):
            self._line()

    def close(self) -> None:
        if not self.disable and self.n != self.shown:
            self._line()
        self.disable = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(total: int | None, desc: str, unit: str = "it", disable: bool = False, file=None,
                 every_s: float = 10.0, leave: bool = True):
    """A tqdm bar when `file` (default stderr) is a terminal, else a `LineProgress`."""
    file = file or sys.stderr
    if getattr(file, "isatty", lambda: False)():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=file, disable=disable, leave=leave)
    return LineProgress(total, desc, unit, file, every_s, disable)


def progress_iter(items, desc: str, unit: str = "it", disable: bool = False, leave: bool = True):
    """`items`, reporting each one taken as `progress_bar` does."""
    items = list(items)
    with progress_bar(len(items), desc, unit, disable=disable, leave=leave) as bar:
        for x in items:
            yield x
            bar.update(1)
