"""Progress: a bar only on a terminal; plain lines, no carriage returns, everywhere else."""

from __future__ import annotations

import io

from specpilot.progress import LineProgress, progress_bar, progress_iter


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_off_a_terminal_progress_is_plain_lines():
    out = io.StringIO()
    with progress_bar(5, "paired runs", "step", file=out, every_s=0) as bar:
        assert isinstance(bar, LineProgress)
        for _ in range(5):
            bar.update(1)
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    assert text.splitlines()[0].startswith("paired runs: 1/5 step") and "paired runs: 5/5 step" in text


def test_lines_are_periodic_not_one_per_update():
    out = io.StringIO()
    with progress_bar(1000, "x", file=out, every_s=3600) as bar:
        for _ in range(1000):
            bar.update(1)
    assert len(out.getvalue().splitlines()) <= 2  # the first move, and the end


def test_disabled_progress_writes_nothing():
    out = io.StringIO()
    assert list(progress_iter(range(3), "x", disable=True)) == [0, 1, 2]
    with progress_bar(3, "x", file=out, disable=True) as bar:
        bar.update(3)
    assert out.getvalue() == ""


def test_on_a_terminal_it_is_a_bar():
    out = Tty()
    with progress_bar(3, "x", file=out) as bar:
        bar.update(3)
    assert "\r" in out.getvalue() and type(bar).__name__ == "tqdm"
