"""The written report opens in a real browser: headless chromium loads index.html and a round page
from disk (no network) and the rendered DOM holds the tables, the links and the SVG charts.

Skipped when /usr/bin/chromium is missing (Debian: `apt-get install -y chromium`; CI installs it).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specpilot.services.planner.report import write_report

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists() and shutil.which("chromium") is None,
                                reason="chromium is not installed (apt-get install -y chromium); CI installs it")


def _fixtures():
    path = Path(__file__).resolve().parents[1] / "unit" / "test_report.py"
    spec = importlib.util.spec_from_file_location("_report_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


class _Tags(HTMLParser):
    """Counts of start tags in a DOM dump, the hrefs of links, and the text."""

    def __init__(self):
        super().__init__()
        self.count: dict[str, int] = {}
        self.hrefs: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.count[tag] = self.count.get(tag, 0) + 1
        if tag == "a":
            self.hrefs.append(dict(attrs).get("href"))

    def handle_data(self, data):
        self.text.append(data)


def _dom(path: Path, tmp: Path) -> _Tags:
    exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={tmp / 'profile'}",
           "--dump-dom", path.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(tmp)})
    assert done.returncode == 0, done.stderr[-2000:]
    tags = _Tags()
    tags.feed(done.stdout)
    return tags


def test_report_renders_in_chromium(tmp_path):
    fx = _fixtures()
    summary = fx._summary()
    summary["rounds"][0]["costmodel"]["svg"] = fx._real_svg()
    index = write_report(summary, tmp_path / "report")

    page = _dom(index, tmp_path)
    assert page.count.get("table", 0) >= 2 and page.count.get("svg") == 1
    assert page.count.get("polyline") == 2
    assert {"round-1.html", "round-2.html"} <= set(page.hrefs)
    assert "×1.051 (95 % lower bound ×1.030)" in "".join(page.text)

    page = _dom(index.parent / "round-1.html", tmp_path)
    text = "".join(page.text)
    assert page.count.get("svg") == 2  # the cost model's chart, embedded, and the gains
    assert page.count.get("table", 0) >= 8 and page.count.get("details") == 2
    assert page.count.get("script", 0) == 0  # the <script> rationale stayed text
    assert '<script>alert("x")</script>' in text
    assert "✓ accepted" in text and "✗ rejected" in text and "index.html" in page.hrefs
