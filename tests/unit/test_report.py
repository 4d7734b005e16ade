"""The run report: round pages, the run page, the terminal summary, written files."""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET

import pytest

from specpilot.services.planner.costmodel import Profile, ceiling, render_svg
from specpilot.services.planner.report import render_index_html, render_round_html, render_terminal, write_report

DEPLOYMENT = {"target": "qwen3-8b", "drafter": "eagle3", "gpu": "h200", "batch": 8}
EVIL = '<script>alert("x")</script>'


def _costmodel(svg: str | None) -> dict:
    return {
        "t_ar_s": 0.0125,
        "budgets": [
            {"policy": "chain/n8", "rows": 8, "tau": 3.1, "t_step_s": 0.0151, "c": 1.208, "speedup": 2.566},
            {"policy": "tree/n32", "rows": 32, "tau": 4.25, "t_step_s": 0.0182, "c": 1.456, "speedup": 2.919},
        ],
        "best": "tree/n32",
        "tau_current": 4.25,
        "tau_oracle": 5.9,
        "replay": {"tree/n32": 4.21, "chain/n8": 3.08},
        "ceiling": {
            "factors": {"tree": 1.388, "kernels": 2.71, "off_profile": 1.12},
            "product": 4.213,
            "largest": "kernels",
            "per_class": [
                {"class": "target_linear", "seconds": 0.009, "floor_s": 0.004, "ratio": 2.25},
                {"class": "attention", "seconds": 0.003, "floor_s": 0.0, "ratio": float("inf")},
            ],
        },
        "direction": "kernel:target_linear",
        "svg": svg,
    }


def _round(k: int = 1, svg: str | None = None) -> dict:
    return {
        "round": k,
        "status": "done",
        "date": "2025-05-01",
        "deployment": DEPLOYMENT,
        "incumbent": {"label": "stock", "config": {"mode": "chain", "n": 8}, "patch": "", "entries": []},
        "costmodel": _costmodel(svg),
        "direction": "kernel:target_linear",
        "candidates": [
            {"name": "tree-best-first/n32", "agent": "search", "options": {"mode": "tree", "n": 32}, "patch": "",
             "entry": "tree-best-first", "variant": "n32", "rationale": "wider tree",
             "predicted": {"tau": 4.4, "speedup": 3.02}, "pruned": None,
             "verdict": {"path": "verdicts/r1-a.json", "accepted": True, "gain": 1.0523, "lower_bound": 1.0311,
                         "threshold": 0.015, "stock_noise": 0.0025, "forcing_passed": True,
                         "reasons": ["gain 1.0523, 95% lower bound 1.0311", "accepted"]},
             "error": None},
            {"name": "command-1", "agent": "command", "options": {}, "entry": None, "variant": None,
             "patch": "--- a/engine/trees.py\n+++ b/engine/trees.py\n@@ -1 +1 @@\n-x = 1\n+if a < b && c > d: pass\n",
             "rationale": EVIL, "predicted": None, "pruned": None,
             "verdict": {"path": "verdicts/r1-b.json", "accepted": False, "gain": 0.9874, "lower_bound": 0.9702,
                         "threshold": 0.03, "stock_noise": 0.0025, "forcing_passed": False,
                         "reasons": ["lower bound − 1 = -0.0298 is not > 0.0150", "rejected"]},
             "error": None},
            {"name": "chain/n4", "agent": "search", "options": {"n": 4}, "patch": "", "entry": "chain",
             "variant": "n4", "rationale": "", "predicted": {"tau": 2.1, "speedup": 1.9},
             "pruned": "predicted speedup 1.90× below the incumbent's 2.57×", "verdict": None, "error": None},
            {"name": "command-2", "agent": "command", "options": {}, "patch": "junk", "entry": None,
             "variant": None, "rationale": "", "predicted": None, "pruned": None, "verdict": None,
             "error": "patch does not apply: <hunk 1>"},
        ],
        "accepted": [{"candidate": "tree-best-first/n32", "entry": "tree-best-first", "gain": 1.0523,
                      "lower_bound": 1.0311, "verdict_id": "r1-a"}],
        "result": {"tau": 4.4, "speedup_over_ar": 3.02, "speedup_over_stock": 1.0523},
    }


def _summary() -> dict:
    r2 = _round(2)
    r2["incumbent"] = {"label": "round-1", "config": {"mode": "tree", "n": 32}, "patch": "",
                       "entries": ["tree-best-first"]}
    r2["candidates"] = r2["candidates"][1:2]
    r2["accepted"] = []
    r2["result"] = {"tau": 4.38, "speedup_over_ar": 3.0, "speedup_over_stock": 1.051}
    return {
        "deployment": DEPLOYMENT,
        "rounds": [_round(1), r2],
        "final": {"label": "round-2", "config": {"mode": "tree", "n": 32}, "entries": ["tree-best-first"],
                  "speedup_over_stock": {"gain": 1.051, "lower_bound": 1.03},
                  "speedup_over_ar": {"gain": 3.0, "lower_bound": 2.91}},
        "report": "two rounds, one accepted entry",
    }


def _svgs(html: str) -> list[ET.Element]:
    found = re.findall(r"<svg\b.*?</svg>", html, flags=re.S)
    return [ET.fromstring(s) for s in found]


def _real_svg() -> str:
    prof = Profile(0.0182, {"target_linear": (0.009, 4e9, 1e12), "attention": (0.003, 1e9, 0.0)})
    return render_svg(ceiling(prof, "h200", 4.25, 5.9))


# --------------------------------------------------------------------------- round page


def test_round_page_content_and_numbers():
    html = render_round_html(_round())
    assert html.startswith("<!DOCTYPE html>") and "Round 1" in html
    for text in ("qwen3-8b", "eagle3", "h200", "2025-05-01", "stock", "mode=chain, n=8",
                 "12.500", "15.100", "18.200", "×2.919", "4.25", "5.90", "tree/n32",  # cost model
                 "×4.213", "×2.710", "×1.388", "9.000e-03", "×2.250", "∞",  # ceiling
                 "kernel:target_linear", "×1.052", "×1.031", "0.015", "0.003", "verdicts/r1-a.json",
                 "predicted speedup 1.90× below", "r1-a", "×3.020", "×1.052"):
        assert text in html, text
    # the best budget and the largest factor are highlighted
    assert re.search(r'<tr class="hi"><td>tree/n32</td>', html)
    assert re.search(r'<tr class="hi"><td>kernels</td>', html)


def test_round_page_verdict_markers():
    html = render_round_html(_round())
    assert "✓ accepted" in html and "✗ rejected" in html and "✗ error" in html
    assert "✓ passed" in html and "✗ failed" in html
    assert "<li>accepted</li>" in html and "pruned" in html


def test_round_page_escapes_untrusted_text():
    html = render_round_html(_round())
    assert EVIL not in html and "<script" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "if a &lt; b &amp;&amp; c &gt; d" in html
    assert "patch does not apply: &lt;hunk 1&gt;" in html


def test_patch_is_inside_details():
    html = render_round_html(_round())
    details = re.findall(r"<details>(.*?)</details>", html, flags=re.S)
    assert len(details) == 2  # command-1's and command-2's patches; the others have none
    assert "<pre>--- a/engine/trees.py" in details[0] and "+if a &lt; b" in details[0]
    assert "no patch (configuration only)" in html


def test_round_page_svgs_are_well_formed():
    html = render_round_html(_round())
    svgs = _svgs(html)
    assert len(svgs) == 3  # ceiling factors, per-class ratios (drawn here), gains
    gains = svgs[-1]
    assert len([e for e in gains.iter() if e.tag.endswith("rect")]) == 2  # the two evaluated candidates


def test_round_page_embeds_the_costmodel_svg():
    svg = _real_svg()
    html = render_round_html(_round(svg=svg))
    assert svg.strip() in html
    assert len(_svgs(html)) == 2  # the embedded one, and the gains


@pytest.mark.parametrize("bad", ['<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
                                 '<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>',
                                 '<svg xmlns="http://www.w3.org/2000/svg"><image href="http://x/alert(1).png"/></svg>',
                                 "<svg><rect", "<div>not svg</div>"])
def test_unsafe_or_broken_costmodel_svg_is_replaced(bad):
    html = render_round_html(_round(svg=bad))
    assert bad not in html and "alert(1)" not in html
    assert len(_svgs(html)) == 3


def test_missing_optional_fields_do_not_crash():
    for record in ({}, {"round": 3}, {"round": None, "costmodel": None, "candidates": None, "result": None,
                                       "incumbent": None, "deployment": None, "accepted": None}):
        html = render_round_html(record)
        assert "—" in html
        _svgs(html)
    rec = _round()
    rec["status"] = "running"
    rec["result"] = None
    rec["costmodel"]["ceiling"] = {"factors": {"tree": None, "kernels": 2.0}, "per_class": [{"class": None}]}
    rec["costmodel"]["budgets"] = [{"policy": None, "rows": None, "tau": "n/a"}]
    rec["candidates"] = [{"name": None, "verdict": {"gain": None}}, {"verdict": {"gain": 1.1, "accepted": None}},
                         {"options": None, "patch": None, "predicted": None}, "junk"]
    html = render_round_html(rec)
    assert "running" in html and "n/a" in html
    _svgs(html)


# --------------------------------------------------------------------------- run page, terminal, files


def test_index_page_content_links_and_chart():
    html = render_index_html(_summary())
    assert 'href="round-1.html"' in html and 'href="round-2.html"' in html
    for text in ("qwen3-8b", "kernel:target_linear", "2 / 1", "1 / 0", "×1.052", "×0.987", "round-1",
                 "round-2", "×1.051 (95 % lower bound ×1.030)", "×3.000 (95 % lower bound ×2.910)", "tree-best-first",
                 "one accepted entry"):
        assert text in html, text
    svgs = _svgs(html)
    assert len(svgs) == 1
    assert len([e for e in svgs[0].iter() if e.tag.endswith("polyline")]) == 2


def test_index_page_of_a_run_in_progress():
    s = _summary()
    s["final"] = None
    s["rounds"][1]["result"] = None
    html = render_index_html(s)
    assert "run in progress" in html
    _svgs(html)
    for empty in ({}, {"rounds": None, "final": None, "deployment": None}, {"rounds": [{}]}):
        _svgs(render_index_html(empty))
        assert "run" in render_terminal(empty)


def test_terminal_summary():
    text = render_terminal(_summary())
    assert "<td" not in text and "&lt;" not in text  # plain text, not HTML
    lines = text.splitlines()
    assert "qwen3-8b" in lines[0]
    assert any(line.startswith("1 ") and "×1.052" in line and "round-1" in line for line in lines)
    assert any("✓ tree-best-first/n32" in line and "accepted" in line and "×1.031" in line for line in lines)
    assert any("✗ command-1" in line and "rejected" in line for line in lines)
    assert any("chain/n4" in line and "pruned" in line for line in lines)
    assert any("command-2" in line and "patch does not apply" in line for line in lines)
    assert "speedup over stock (measured): ×1.051 (95 % lower bound ×1.030)" in text
    assert "speedup over AR (measured): ×3.000 (95 % lower bound ×2.910)" in text


def test_terminal_drops_control_characters():
    s = _summary()
    s["rounds"][0]["candidates"][0]["name"] = "evil\x1b[2Jname"
    assert "\x1b" not in render_terminal(s) and "evil[2Jname" in render_terminal(s)


def test_write_report(tmp_path):
    s = copy.deepcopy(_summary())
    index = write_report(s, tmp_path / "out")
    assert index == tmp_path / "out" / "index.html"
    assert sorted(p.name for p in index.parent.iterdir()) == ["index.html", "round-1.html", "round-2.html"]
    assert 'href="index.html"' in (index.parent / "round-2.html").read_text(encoding="utf-8")
    assert s == _summary()  # the summary is not modified


def test_non_finite_numbers_render_and_keep_svgs_well_formed():
    rec = _round()
    v = rec["candidates"][0]["verdict"]
    v.update(gain=float("inf"), lower_bound=float("nan"), threshold=float("nan"))
    rec["candidates"][1]["verdict"]["gain"] = float("-inf")
    rec["costmodel"]["ceiling"]["factors"]["tree"] = float("inf")
    html = render_round_html(rec)
    assert "×∞" in html and "−∞" in html
    for svg in _svgs(html):
        assert "nan" not in ET.tostring(svg, encoding="unicode").lower()
    s = _summary()
    s["rounds"][0]["result"]["speedup_over_stock"] = float("nan")
    for svg in _svgs(render_index_html(s)):
        assert "nan" not in ET.tostring(svg, encoding="unicode").lower()


def test_round_page_says_why_the_agents_attacked_another_factor():
    rec = {**_round(), "agents": {"search": {"notes": ["no untried memory variant attacks the kernels factor (×19.0)",
                                                       "attacking the tree factor (×2.1) with 2 of 9 variants"],
                                             "skipped": [{"name": "tree-sequoia/n16", "reason": "needs <profile>"}]}}}
    html = render_round_html(rec)
    assert "attacks the kernels factor" in html and "attacking the tree factor" in html
    assert "variants not proposed (1)" in html and "needs &lt;profile&gt;" in html


def test_written_pages_link_verdicts_and_entries_relative_to_the_run_folder(tmp_path):
    """Verdict files are links relative to the page, paths are shown relative to the run folder (no
    absolute path of the machine), accepted entries link to the run page's memory table, and every
    chart has an axis with a scale and a label."""
    run = tmp_path / "run"
    s = _summary()
    s["deployment"] = {**DEPLOYMENT, "target": str(tmp_path / "ckpt" / "t"), "drafter": str(tmp_path / "ckpt" / "d")}
    s["rounds"][0]["candidates"][0]["verdict"]["path"] = str(run / "verdicts" / "r1-a.json")
    s["rounds"][0]["accepted"][0]["entry"] = "tree-best-first@2"
    index = write_report(s, run / "report")
    html = index.read_text(encoding="utf-8") + (index.parent / "round-1.html").read_text(encoding="utf-8")
    assert str(tmp_path) not in html
    assert '<a href="../verdicts/r1-a.json">verdicts/r1-a.json</a>' in html
    assert "../ckpt/t" in html
    assert 'href="index.html#entry-tree-best-first-2"' in html and 'id="entry-tree-best-first-2"' in html
    assert "specpilot memory show tree-best-first --version 2" in html
    for label in ("gain over the incumbent (measured)", "factor (×)", "round", "× stock"):
        assert f">{label}</text>" in html, label
    assert "(cost-model estimate)" in html and "(estimate)" in html


def test_ticks_are_round_and_cover_the_range():
    from specpilot.services.planner.report import _ticks

    assert _ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    t = _ticks(0.97, 1.06)
    assert t[0] >= 0.97 and t[-1] <= 1.06 and 3 <= len(t) <= 6
    assert all(abs(round(v / 0.02) * 0.02 - v) < 1e-9 for v in t)


def test_a_run_without_a_drafter_says_so_in_the_deployment_the_ceiling_and_the_final_figures():
    from specpilot.services.planner.costmodel import NO_TREE

    s = _summary()
    s["deployment"] = {**DEPLOYMENT, "drafter": None}
    note = "stock decodes AR: the same comparison as over stock, timed once"
    s["final"]["speedup_over_ar"] = {**s["final"]["speedup_over_stock"], "note": note}
    r = _round(1)
    r["deployment"] = s["deployment"]
    r["costmodel"]["ceiling"]["notes"] = {"tree": NO_TREE}
    page, index, text = render_round_html(r), render_index_html(s), render_terminal(s)
    tree_row = re.search(r"<tr[^>]*><td>tree</td><td>(.*?)</td>", page).group(1)
    assert NO_TREE in tree_row and "×1.388" in tree_row
    assert "none (AR)" in page and "none (AR)" in index
    assert note in index and note in text
    plain = render_round_html(_round(1))  # a deployment with a drafter: no such words
    assert NO_TREE not in plain and "none (AR)" not in plain


def test_the_round_page_says_the_batch_its_cost_model_was_measured_at():
    rec = _round()
    rec["costmodel"]["batch"] = 8
    rec["costmodel"]["ceiling"]["factors"]["rows"] = 3.4
    rec["costmodel"]["ceiling"]["per_class"][0]["bound"] = "rows"
    html = render_round_html(rec)
    assert "batch <b>8</b> · T_AR at that batch <b>12.500 ms</b>" in html
    assert "<td>rows</td><td>×3.400</td>" in html and "<th>bound</th>" in html
    assert "batch <b>1</b>" in render_round_html(_round())  # a cost model without a batch: one request at a time
