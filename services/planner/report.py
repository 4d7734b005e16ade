"""Run reports: a round's records turned into self-contained HTML pages and a terminal summary.

Pure functions (stdlib only, no engine import); `write_report` is the only one that writes files.
The pages need nothing from the network: inline CSS, inline SVG charts, no scripts.

A round record (optional fields may be missing or None and render as "—"; every string is
escaped, rationales and patches being untrusted text)::

    {"round": int, "status": "done" | "running", "date": str,
     "deployment": {"target", "drafter", "gpu", "batch"},
     "incumbent": {"label": str, "config": {option: value}, "patch": str, "entries": [str]},
     "costmodel": {"batch": int (requests decoded at once; 1 when absent), "t_ar_s": float,
                   "budgets": [{"policy", "rows" (over the batch), "tau", "t_step_s", "c", "speedup"}],
                   "best": str (a budget's policy), "tau_current": float, "tau_oracle": float,
                   "replay": {policy: tau},
                   "ceiling": {"factors": {"tree", "kernels", "off_profile", "rows"}, "product", "largest",
                               "per_class": [{"class", "seconds", "floor_s", "ratio"}],
                               "notes": {factor: why} (optional: an AR system's tree factor)},
                   "direction": str, "svg": str | None (costmodel.render_svg; drawn here if absent)},
     "direction": str,
     "agents": {agent name: {"notes": [str], "skipped": [{"name", "reason"}], ...}} (optional),
     "candidates": [{"name", "agent", "options": dict, "patch": str, "entry", "variant", "rationale",
                     "predicted": {"tau", "speedup"} | None, "pruned": str | None (why),
                     "verdict": {"path", "accepted": bool, "gain", "lower_bound", "threshold",
                                 "stock_noise", "reasons": [str], "forcing_passed": bool} | None,
                     "error": str | None}],
     "accepted": [{"candidate", "entry", "gain", "lower_bound", "verdict_id"}],
     "result": {"tau", "speedup_over_ar", "speedup_over_stock"} | None}

gain and lower_bound are ratios (×1.03 = 3 % faster); the verdict's threshold is what
lower_bound − 1 had to clear. A run summary::

    {"deployment": {...}, "rounds": [round records],
     "final": {"label", "config", "entries", "speedup_over_stock": {"gain", "lower_bound"},
               "speedup_over_ar": {"gain", "lower_bound", "note" (optional: stock is AR)}} | None,
     "report": str | None (free text or a path, shown as is)}

A round's "incumbent after" is the next round's incumbent label, or the final label after the last.

One rounding everywhere: every ratio (gain, lower bound, speed-up, ceiling factor) is ×N.NNN, every
threshold and noise N.NNN, τ N.NN. Figures of the cost model are labelled as estimates; the
measured ones are the controller's paired runs. Written by `write_report`, paths (verdict files,
checkpoints) are shown relative to the run folder and linked relative to the page.
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from html import escape
from pathlib import Path

DASH = "—"
_OK, _NO = "✓", "✗"


class _Raw(str):
    """HTML that is already safe: table cells take it as is."""


def _d(x) -> dict:
    return x if isinstance(x, dict) else {}


def _dicts(x) -> list[dict]:
    return [d for d in x if isinstance(d, dict)] if isinstance(x, (list, tuple)) else []


def _strs(x) -> str | None:
    return ", ".join(map(str, x)) or None if isinstance(x, (list, tuple)) else None


def _f(x) -> float | None:
    """x as a float (a {"gain": g} dict gives g), or None when it is not a number (NaN included)."""
    x = x.get("gain") if isinstance(x, dict) else x
    return None if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x else float(x)


def _n(x, spec: str = ".3f", unit: str = "", scale: float = 1.0) -> str:
    """Plain text: a number formatted (∞ for infinity), a non-empty string as is, else "—"."""
    v = _f(x)
    if v is None:
        return x if isinstance(x, str) and x else DASH
    return ("−∞" if v < 0 else "∞") if math.isinf(v) else f"{v * scale:{spec}}{unit}"


def _x(x) -> str:
    """Any ratio — gain, lower bound, speed-up, factor — one way everywhere (×1.031)."""
    return DASH if _f(x) is None else "×" + _n(x, ".3f")


class _Paths:
    """Paths as a page shows them: relative to the run folder, linked relative to the page's folder
    (the report folder). Without a folder (a page rendered on its own) paths are shown as given."""

    def __init__(self, folder=None):
        self.folder = Path(folder).resolve() if folder is not None else None
        self.run = self.folder.parent if self.folder is not None else None

    def show(self, p) -> str | None:
        if not isinstance(p, str) or not p:
            return None
        if self.run is None or not os.path.isabs(p):
            return p
        return os.path.relpath(p, self.run)

    def link(self, p, text=None) -> str:
        """An <a> to path p (absolute, or relative to the run folder), or "—"."""
        shown = self.show(p)
        if shown is None:
            return DASH
        if self.folder is None:
            href = p
        else:
            target = p if os.path.isabs(p) else os.path.join(self.run, p)
            href = os.path.relpath(target, self.folder)
        return f'<a href="{escape(Path(href).as_posix())}">{escape(text or shown)}</a>'


def _e(x) -> str:
    return DASH if x is None or x == "" else escape(str(x))


def _kv(d) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) if isinstance(d, dict) and d else DASH


def _status(c: dict) -> tuple[str, str, str]:
    """(css class, mark, word) of a candidate's outcome."""
    if c.get("error"):
        return "no", _NO, "error"
    if isinstance(c.get("verdict"), dict):
        return ("ok", _OK, "accepted") if c["verdict"].get("accepted") is True else ("no", _NO, "rejected")
    return "muted", "·", "pruned" if c.get("pruned") else "not evaluated"


def _round_no(rec: dict, i: int) -> int:
    k = rec.get("round")
    return k if isinstance(k, int) and not isinstance(k, bool) else i + 1


# --------------------------------------------------------------------------- HTML pieces

_CSS = """body{font:14px/1.45 system-ui,sans-serif;max-width:1040px;margin:1.5em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f2f2f2}tr.hi td{background:#fff3cd;font-weight:bold}.ok{color:#1a7f37}.no{color:#c62828}
.muted{color:#777}pre{background:#f6f8fa;padding:.6em;overflow:auto;max-height:32em}
section.cand{border:1px solid #ddd;border-radius:4px;padding:0 1em .5em;margin:1em 0}"""


def _page(title: str, body: list[str]) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _table(head: list[str] | None, rows: list[list], hi=()) -> str:
    """Cells are escaped unless _Raw; rows whose index is in hi are highlighted; no head: a key/value table."""
    cell = lambda c: c if isinstance(c, _Raw) else _e(c)  # noqa: E731
    trs = "".join(('<tr class="hi">' if i in hi else "<tr>") + "".join(f"<td>{cell(c)}</td>" for c in r) + "</tr>"
                  for i, r in enumerate(rows))
    ths = "".join(f"<th>{escape(h)}</th>" for h in head or ())
    return f"<table>{f'<thead><tr>{ths}</tr></thead>' if ths else ''}<tbody>{trs}</tbody></table>"


def _details(summary: str, text) -> str | None:
    return f"<details><summary>{escape(summary)}</summary><pre>{escape(text)}</pre></details>" \
        if isinstance(text, str) and text.strip() else None


def _deployment(d, paths: _Paths) -> str:
    d = _d(d)
    shown = {k: paths.show(d.get(k)) if k in ("target", "drafter") and isinstance(d.get(k), str) else d.get(k)
             for k in ("target", "drafter", "gpu", "batch")}
    if "drafter" in d and d["drafter"] is None:  # a deployment without a drafter decodes AR
        shown["drafter"] = "none (AR)"
    return " · ".join(f"{k} <b>{_e(v)}</b>" for k, v in shown.items())


# --------------------------------------------------------------------------- SVG charts


def _svg(w: float, h: float, parts: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-size="12" '
            f'font-family="sans-serif" role="img" aria-label="{escape(label)}">' + "".join(parts) + "</svg>")


def _title(text: str) -> str:
    return f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(text)}</text>'


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]: steps of 1, 2 or 5 × a power of ten, about n of them."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    step *= next((m for m in (1, 2, 5, 10) if (hi - lo) / (step * m) <= n), 10)
    first = math.ceil(lo / step - 1e-9)
    return [round(k * step, 12) for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def _tick_label(v: float, ticks: list[float], prefix: str = "") -> str:
    step = min((b - a for a, b in zip(ticks, ticks[1:])), default=1.0)
    digits = max(0, -math.floor(math.log10(step)) if step > 0 else 0)
    return f"{prefix}{v:.{digits}f}"


def _x_axis(X, lo: float, hi: float, left: float, right: float, y: float, label: str, prefix: str = "") -> str:
    """A horizontal axis at y: the line, ticks with their values, and the axis label under them."""
    ticks = _ticks(lo, hi)
    out = [f'<line x1="{left:.1f}" y1="{y:.1f}" x2="{right:.1f}" y2="{y:.1f}" stroke="#333"/>']
    for t in ticks:
        out.append(f'<line x1="{X(t):.1f}" y1="{y:.1f}" x2="{X(t):.1f}" y2="{y + 4:.1f}" stroke="#333"/>'
                   f'<text x="{X(t):.1f}" y="{y + 16:.1f}" text-anchor="middle" font-size="11">'
                   f"{escape(_tick_label(t, ticks, prefix))}</text>")
    out.append(f'<text x="{(left + right) / 2:.1f}" y="{y + 32:.1f}" text-anchor="middle">{escape(label)}</text>')
    return "".join(out)


def _y_axis(Y, lo: float, hi: float, x: float, top: float, bottom: float, label: str) -> str:
    """A vertical axis at x: the line, ticks with their values, and the label turned along it."""
    ticks = _ticks(lo, hi, 4)
    out = [f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="#333"/>']
    for t in ticks:
        out.append(f'<line x1="{x - 4:.1f}" y1="{Y(t):.1f}" x2="{x:.1f}" y2="{Y(t):.1f}" stroke="#333"/>'
                   f'<text x="{x - 6:.1f}" y="{Y(t) + 4:.1f}" text-anchor="end" font-size="11">'
                   f"{escape(_tick_label(t, ticks))}</text>")
    mid = (top + bottom) / 2
    out.append(f'<text x="12" y="{mid:.1f}" text-anchor="middle" transform="rotate(-90 12 {mid:.1f})">'
               f"{escape(label)}</text>")
    return "".join(out)


def _hbars(title: str, rows: list[tuple[str, float | None, bool]], axis: str = "factor (×)") -> str:
    """A horizontal bar per (label, value, highlighted), in the colours of costmodel.render_svg, over
    an axis from 0 with its scale and label."""
    left, bar_w, row_h = 180, 380, 22
    vmax = max([v for _, v, _ in rows if v is not None and math.isfinite(v)] + [1e-30])
    ticks = _ticks(0.0, vmax)
    vmax = max(vmax, ticks[-1] if ticks else vmax)
    parts = [_title(title)]
    for i, (label, v, hi) in enumerate(rows):
        y = 32 + i * row_h
        w = 0.0 if v is None else bar_w if math.isinf(v) else max(1.0, bar_w * max(v, 0.0) / vmax)
        parts.append(f'<text x="10" y="{y + 14}">{escape(label[:26])}</text><rect x="{left}" y="{y}" width="{w:.1f}" '
                     f'height="16" fill="{"#d9534f" if hi else "#5b8def"}"/>'
                     f'<text x="{left + w + 5:.1f}" y="{y + 14}">{escape(_x(v))}</text>')
    bottom = 36 + len(rows) * row_h
    parts.append(_x_axis(lambda v: left + bar_w * v / vmax, 0.0, vmax, left, left + bar_w, bottom, axis, "×"))
    return _svg(left + bar_w + 110, bottom + 42, parts, title)


def _gain_chart(cands: list[dict]) -> str:
    """Each evaluated candidate: a bar from ×1 to its gain (green if accepted), a whisker down to
    its lower bound, and a dashed red tick at 1 + its threshold, which the lower bound had to pass."""
    rows = [(str(c.get("name") or DASH), c["verdict"]) for c in cands
            if isinstance(c.get("verdict"), dict) and _f(c["verdict"].get("gain")) is not None]
    if not rows:
        return '<p class="muted">no candidate was evaluated</p>'
    vals = [1.0] + [x for _, v in rows for x in (_f(v.get("gain")), _f(v.get("lower_bound")),
                                                  1 + (_f(v.get("threshold")) or 0)) if x is not None]
    lo, hi = min(x for x in vals if math.isfinite(x)), max(x for x in vals if math.isfinite(x))
    pad = max(hi - lo, 0.01) * 0.08
    lo, hi, left, width, row_h, top = lo - pad, hi + pad, 190, 400, 26, 34
    X = lambda v: left + width * (min(max(v, lo), hi) - lo) / (hi - lo)  # noqa: E731
    bottom = top + len(rows) * row_h
    parts = [_title("gain over the incumbent, with its 95 % lower bound"),
             f'<line x1="{X(1):.1f}" y1="{top - 6}" x2="{X(1):.1f}" y2="{bottom + 20}" stroke="#333" '
             'stroke-dasharray="2,2"/>']
    for i, (name, v) in enumerate(rows):
        y, g, lb, thr = top + i * row_h, _f(v["gain"]), _f(v.get("lower_bound")), _f(v.get("threshold"))
        (x0, x1), fill = sorted((X(1), X(g))), "#5cb85c" if v.get("accepted") is True else "#aaa"
        parts.append(f'<text x="10" y="{y + 15}">{escape(name[:28])}</text><rect x="{x0:.1f}" y="{y + 3}" '
                     f'width="{max(x1 - x0, 1):.1f}" height="14" fill="{fill}">'
                     f"<title>{escape(name)}</title></rect>"
                     f'<text x="{left + width + 8}" y="{y + 15}">{escape(f"{_x(g)} (≥ {_x(lb)})")}</text>')
        if lb is not None:
            parts.append(f'<line x1="{X(lb):.1f}" y1="{y + 10}" x2="{X(g):.1f}" y2="{y + 10}" stroke="#222"/>'
                         f'<circle cx="{X(lb):.1f}" cy="{y + 10}" r="3" fill="#222"/>')
        if thr is not None:
            parts.append(f'<line x1="{X(1 + thr):.1f}" y1="{y}" x2="{X(1 + thr):.1f}" y2="{y + 20}" '
                         'stroke="#d9534f" stroke-width="2" stroke-dasharray="3,2"/>')
    parts.append(_x_axis(X, lo, hi, left, left + width, bottom + 20, "gain over the incumbent (measured)", "×"))
    y = bottom + 72
    parts.append(f'<circle cx="16" cy="{y}" r="3" fill="#222"/><text x="24" y="{y + 4}">lower bound</text>'
                 f'<line x1="120" y1="{y - 6}" x2="120" y2="{y + 6}" stroke="#d9534f" stroke-width="2" '
                 f'stroke-dasharray="3,2"/><text x="128" y="{y + 4}">1 + threshold</text>')
    return _svg(left + width + 150, y + 14, parts, "candidate gains")


def _by_round_chart(points: list[tuple[int, float | None, float | None]]) -> str:
    """Two stacked line panels over (round, speedup over stock, τ)."""
    left, width, ph, gap = 90, 500, 130, 60
    ks = [p[0] for p in points] or [1]
    X = lambda k: left + (width * (k - min(ks)) / (max(ks) - min(ks)) if max(ks) > min(ks) else width / 2)  # noqa
    parts = []
    for panel, title, unit in ((1, "speed-up over stock (measured gains, multiplied)", "× stock"),
                               (2, "τ (tokens per step, estimate)", "τ")):
        y0 = 10 + (panel - 1) * (ph + gap)
        parts.append(f'<text x="10" y="{y0 + 14}" font-size="14" font-weight="bold">{escape(title)}</text>'
                     f'<line x1="{left}" y1="{y0 + ph}" x2="{left + width}" y2="{y0 + ph}" stroke="#333"/>'
                     + "".join(f'<text x="{X(k):.1f}" y="{y0 + ph + 16}" text-anchor="middle">{k}</text>'
                               for k in ks)
                     + f'<text x="{left + width / 2:.1f}" y="{y0 + ph + 32}" text-anchor="middle">round</text>')
        pts = [(p[0], p[panel]) for p in points if p[panel] is not None and math.isfinite(p[panel])]
        if not pts:
            continue
        lo, hi = min(v for _, v in pts), max(v for _, v in pts)
        lo, hi = (lo - 0.5, hi + 0.5) if hi - lo < 1e-9 else (lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo))
        Y = lambda v: y0 + ph - (ph - 30) * (v - lo) / (hi - lo)  # noqa: E731
        parts.append(_y_axis(Y, lo, hi, left - 10, y0 + 20, y0 + ph, unit))
        parts.append(f'<polyline points="{" ".join(f"{X(k):.1f},{Y(v):.1f}" for k, v in pts)}" fill="none" '
                     'stroke="#5b8def" stroke-width="2"/>')
        parts += [f'<circle cx="{X(k):.1f}" cy="{Y(v):.1f}" r="4" fill="#5b8def"><title>round {k}: {_x(v) if panel == 1 else _n(v, ".2f")}</title>'
                  f'</circle><text x="{X(k) + 6:.1f}" y="{Y(v) - 6:.1f}">'
                  f'{_x(v) if panel == 1 else _n(v, ".2f")}</text>' for k, v in pts]
    return _svg(left + width + 60, 2 * (ph + gap) + 10, parts, "speed-up over stock and τ by round")


def _safe_svg(svg) -> str | None:
    """The cost model's SVG if it is well-formed, inert and offline (no script, style, handlers,
    foreign content or links out)."""
    try:
        root = ET.fromstring(svg.strip()) if isinstance(svg, str) else None
    except ET.ParseError:
        return None
    local = lambda name: str(name).rsplit("}", 1)[-1].lower()  # noqa: E731
    if root is None or local(root.tag) != "svg":
        return None
    for el in root.iter():
        if local(el.tag) in ("script", "style", "foreignobject", "iframe", "a") or any(
                local(a).startswith("on") or (local(a) == "href" and not str(v).startswith("#"))
                for a, v in el.attrib.items()):
            return None
    return svg.strip()


# --------------------------------------------------------------------------- round page


def _candidate(i: int, c: dict, paths: _Paths) -> str:
    cls, mark, word = _status(c)
    label = word if mark == "·" else f"{mark} {word}"
    v, pred = _d(c.get("verdict")), _d(c.get("predicted"))
    entry = " / ".join(str(x) for x in (c.get("entry"), c.get("variant")) if x) or None
    rows = [["agent", c.get("agent")], ["entry / variant", entry],
            ["options", _kv(c.get("options"))], ["rationale", c.get("rationale")],
            ["predicted τ (cost-model estimate)", _n(pred.get("tau"), ".2f")],
            ["predicted speed-up over AR (cost-model estimate)", _x(pred.get("speedup"))]]
    rows += [[k, c[k]] for k in ("pruned", "error") if c.get(k)]
    out = [f'<section class="cand" id="cand-{i}"><h3>{_e(c.get("name"))} <span class="{cls}">{label}</span></h3>',
           _table(None, rows),
           _details("patch", c.get("patch")) or '<p class="muted">no patch (configuration only)</p>']
    if v:
        fp = v.get("forcing_passed")
        out.append(_table(["verdict", "gain", "95 % lower bound", "threshold (bound − 1 >)", "stock noise", "forcing",
                           "verdict file"],
                          [[_Raw(f'<span class="{cls}">{label}</span>'), _x(v.get("gain")), _x(v.get("lower_bound")),
                            _n(v.get("threshold"), ".3f"), _n(v.get("stock_noise"), ".3f"),
                            DASH if fp is None else f"{_OK} passed" if fp else f"{_NO} failed",
                            _Raw(paths.link(v.get("path")))]]))
        reasons = v.get("reasons") if isinstance(v.get("reasons"), (list, tuple)) else []
        out.append("<ul>" + "".join(f"<li>{_e(r)}</li>" for r in reasons) + "</ul>")
    return "\n".join(out) + "</section>"


def render_round_html(record: dict, folder=None) -> str:
    """One self-contained HTML page for one round record (schema: module docstring); `folder` is
    where the page is written (paths are shown relative to its parent, the run folder)."""
    r, paths = _d(record), _Paths(folder)
    k, cm, inc = _round_no(r, 0), _d(r.get("costmodel")), _d(r.get("incumbent"))
    ceil, cands, res = _d(cm.get("ceiling")), _dicts(r.get("candidates")), _d(r.get("result"))
    body = ['<p><a href="index.html">← run overview</a></p>',
            f'<h1>Round {k} <small class="muted">{_e(r.get("status"))}</small></h1>',
            f"<p>{_deployment(r.get('deployment'), paths)} · date <b>{_e(r.get('date'))}</b></p>", "<h2>Incumbent</h2>",
            _table(["label", "config", "entries"],
                   [[inc.get("label"), _kv(inc.get("config")), _strs(inc.get("entries"))]]),
            _details("incumbent patch", inc.get("patch")) or ""]
    budgets, best = _dicts(cm.get("budgets")), cm.get("best")
    body += ["<h2>Cost model</h2>",
             f"<p>batch <b>{_e(cm.get('batch', 1))}</b> · T_AR at that batch "
             f"<b>{_n(cm.get('t_ar_s'), '.3f', ' ms', 1e3)}</b> · τ current "
             f"<b>{_n(cm.get('tau_current'), '.2f')}</b> · τ oracle <b>{_n(cm.get('tau_oracle'), '.2f')}</b> · "
             f"best budget <b>{_e(best)}</b></p>",
             '<p class="muted">Profiled estimates: τ, T_step, c and speed-up over AR = τ / c come from '
             "profiled runs and the cost model; the measured gains are the verdicts below.</p>",
             _table(["policy", "rows", "τ (profiled)", "T_step ms", "c (estimate)", "speed-up over AR (estimate)"],
                    [[b.get("policy"), _n(b.get("rows"), ".0f"), _n(b.get("tau"), ".2f"),
                      _n(b.get("t_step_s"), ".3f", "", 1e3), _n(b.get("c")), _x(b.get("speedup"))]
                     for b in budgets],
                    hi={i for i, b in enumerate(budgets) if best is not None and b.get("policy") == best})]
    if _d(cm.get("replay")):
        body.append(_table(["replay policy", "τ"], [[p, _n(t, ".2f")] for p, t in cm["replay"].items()]))
    factors, per_class = _d(ceil.get("factors")), _dicts(ceil.get("per_class"))
    names, notes = list(factors) or ["tree", "kernels", "off_profile"], _d(ceil.get("notes"))
    noted = lambda f: f" ({notes[f]})" if isinstance(notes.get(f), str) else ""  # noqa: E731 (no drafter: no tree)
    body += ["<h2>Ceiling</h2>",
             f"<p>product <b>{_x(ceil.get('product'))}</b> · largest <b>{_e(ceil.get('largest'))}</b></p>",
             _table(["factor", "value"], [[f, _x(factors.get(f)) + noted(f)] for f in names],
                    hi={i for i, f in enumerate(names) if f == ceil.get("largest")}),
             _table(["class", "seconds", "floor s", "time / floor", "bound"],
                    [[p.get("class"), _n(p.get("seconds"), ".3e"), _n(p.get("floor_s"), ".3e"),
                      _x(p.get("ratio")), p.get("bound")] for p in per_class])]
    svg = _safe_svg(cm.get("svg"))
    body.append(svg or _hbars("ceiling factors (largest in red)",
                              [(str(f), _f(factors.get(f)), f == ceil.get("largest")) for f in names]))
    if not svg and per_class:
        body.append(_hbars("time / byte floor per class", [(str(p.get("class")), _f(p.get("ratio")), False)
                                                            for p in per_class], "profiled time / byte floor (×)"))
    acc = _dicts(r.get("accepted"))
    notes = [n for log in _d(r.get("agents")).values() for n in (_d(log).get("notes") or [])]
    skipped = [s for log in _d(r.get("agents")).values() for s in _dicts(_d(log).get("skipped"))]
    body += ["<h2>Direction</h2>", f"<p><b>{_e(r.get('direction') or cm.get('direction'))}</b></p>",
             "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>" if notes else "",
             _details(f"variants not proposed ({len(skipped)})",
                      "\n".join(f"{s.get('name')}: {s.get('reason')}" for s in skipped)) if skipped else "",
             f"<h2>Candidates ({len(cands)})</h2>", *(_candidate(i, c, paths) for i, c in enumerate(cands)),
             "<h2>Gains</h2>", _gain_chart(cands), "<h2>Accepted entries</h2>",
             _table(["candidate", "memory entry", "gain", "95 % lower bound", "verdict"],
                    [[a.get("candidate"), _entry_link(a.get("entry")), _x(a.get("gain")), _x(a.get("lower_bound")),
                      a.get("verdict_id")] for a in acc]) if acc else '<p class="muted">none</p>',
             "<h2>Result</h2>", _table(["τ (estimate)", "speed-up over AR (cost-model estimate)",
                                        "speed-up over stock (measured gains, multiplied)"],
                                       [[_n(res.get("tau"), ".2f"), _x(res.get("speedup_over_ar")),
                                         _x(res.get("speedup_over_stock"))]])]
    return _page(f"specpilot — round {k}", body)


# --------------------------------------------------------------------------- run page, terminal


def _round_row(rounds: list[dict], i: int, final: dict) -> dict:
    """A round's overview figures, as plain text."""
    r = rounds[i]
    ver = [c["verdict"] for c in _dicts(r.get("candidates")) if isinstance(c.get("verdict"), dict)]
    gains = [g for g in (_f(v.get("gain")) for v in ver) if g is not None]
    after = _d(rounds[i + 1].get("incumbent")).get("label") if i + 1 < len(rounds) else final.get("label")
    res = _d(r.get("result"))
    return {"k": _round_no(r, i), "status": r.get("status") or DASH, "direction": r.get("direction") or DASH,
            "evaluated": len(ver), "accepted": sum(v.get("accepted") is True for v in ver),
            "best": _x(max(gains)) if gains else DASH, "tau": _n(res.get("tau"), ".2f"),
            "stock": _x(res.get("speedup_over_stock")), "after": str(after) if after else DASH}


def _anchor(key: str) -> str:
    return "entry-" + "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in key)


def _entry_link(key, page: str = "index.html") -> str:
    """A memory entry's key, linked to its row in the run page's memory table."""
    return _Raw(f'<a href="{page}#{_anchor(key)}">{escape(key)}</a>') if isinstance(key, str) and key else DASH


def _memory_rows(rounds: list[dict], paths: _Paths) -> list[list]:
    """The run's accepted memory entries: key (anchored), how to show it, round, gain, bound, verdict file."""
    rows = []
    for i, r in enumerate(rounds):
        verdicts = {c.get("name"): _d(c.get("verdict")) for c in _dicts(r.get("candidates"))}
        for a in _dicts(r.get("accepted")):
            key = a.get("entry")
            if not isinstance(key, str) or not key:
                continue
            ident, _, version = key.partition("@")
            show = f"specpilot memory show {ident}" + (f" --version {version}" if version else "")
            rows.append([_Raw(f'<span id="{_anchor(key)}">{escape(key)}</span>'), _Raw(f"<code>{escape(show)}</code>"),
                         _round_no(r, i), _x(a.get("gain")), _x(a.get("lower_bound")),
                         _Raw(paths.link(verdicts.get(a.get("candidate"), {}).get("path")))])
    return rows


def _final_lines(final: dict) -> list[tuple[str, str]]:
    def line(k):
        x = _d(final.get(k))
        note = f"; {x['note']}" if isinstance(x.get("note"), str) else ""  # e.g. stock is AR: one comparison
        return f"{_x(x.get('gain'))} (95 % lower bound {_x(x.get('lower_bound'))}{note})"
    return [(f"speedup over {w} (measured)", line(k)) for w, k in (("stock", "speedup_over_stock"),
                                                                   ("AR", "speedup_over_ar"))]


def render_index_html(summary: dict, folder=None) -> str:
    """The run's page: deployment, rounds table, chart by round, final system, memory entries, links
    to round pages; `folder` as in `render_round_html`."""
    s, paths = _d(summary), _Paths(folder)
    rounds, final = _dicts(s.get("rounds")), _d(s.get("final"))
    rows = [_round_row(rounds, i, final) for i in range(len(rounds))]
    link = lambda k: _Raw(f'<a href="round-{k}.html">round {k}</a>')  # noqa: E731
    body = ["<h1>specpilot run</h1>", f"<p>{_deployment(s.get('deployment'), paths)}</p>", "<h2>Rounds</h2>",
            _table(["round", "status", "direction", "evaluated / accepted", "best gain", "τ (estimate)",
                    "speed-up over stock (measured gains, multiplied)", "incumbent after"],
                   [[link(x["k"]), x["status"], x["direction"], f'{x["evaluated"]} / {x["accepted"]}', x["best"],
                     x["tau"], x["stock"], x["after"]] for x in rows]),
            _by_round_chart([(_round_no(r, i), _f(_d(r.get("result")).get("speedup_over_stock")),
                              _f(_d(r.get("result")).get("tau"))) for i, r in enumerate(rounds)]),
            "<h2>Final system</h2>",
            _table(None, [["label", final.get("label")], ["config", _kv(final.get("config"))],
                              ["entries", _Raw(", ".join(_entry_link(e) for e in final.get("entries") or []) or DASH)],
                          *map(list, _final_lines(final))])
            if final else '<p class="muted">no final system yet (run in progress)</p>']
    memory = _memory_rows(rounds, paths)
    body += ["<h2>Memory entries</h2>",
             _table(["entry", "show it", "round", "gain", "95 % lower bound", "verdict file"], memory) if memory
             else '<p class="muted">no entry was stored by this run</p>']
    if s.get("report"):
        body += ["<h2>Report</h2>", f"<pre>{escape(str(paths.show(str(s['report']))))}</pre>"]
    body += ["<h2>Round pages</h2>", "<ul>" + "".join(f"<li>{link(x['k'])}</li>" for x in rows) + "</ul>"]
    return _page("specpilot run", body)


def _plain(x, width: int | None = None) -> str:
    """Text safe for a terminal (control characters, escape sequences included, dropped), cut to width."""
    t = "".join(ch for ch in (DASH if x is None or x == "" else str(x)) if ch.isprintable())
    return t if width is None or len(t) <= width else t[: width - 1] + "…"


def render_terminal(summary: dict) -> str:
    """A compact fixed-width plain-text summary of the run for the CLI."""
    s = _d(summary)
    rounds, final, dep = _dicts(s.get("rounds")), _d(s.get("final")), _d(s.get("deployment"))
    head = f"{'round':<6}{'direction':<22}{'eval/acc':>9}  {'best gain':<10}{'τ':>6}  {'×stock':>7}  incumbent after"
    lines = ["specpilot run: " + ", ".join(f"{k} {_plain(dep.get(k))}" for k in ("target", "drafter", "gpu", "batch")),
             "", head, "-" * len(head)]
    for i, r in enumerate(rounds):
        x = _round_row(rounds, i, final)
        lines.append(f"{x['k']:<6}{_plain(x['direction'], 21):<22}{x['evaluated']:>4}/{x['accepted']:<4}  "
                     f"{x['best']:<10}{x['tau']:>6}  {x['stock']:>7}  {_plain(x['after'], 30)}")
        for c in _dicts(r.get("candidates")):
            _, mark, word = _status(c)
            v, why = _d(c.get("verdict")), c.get("error") or c.get("pruned")
            tail = (f"gain {_x(v.get('gain'))}  lower bound {_x(v.get('lower_bound'))}  threshold "
                    f"{_n(v.get('threshold'), '.3f')}" if v else _plain(why, 70) if why else "")
            lines.append(f"    {mark} {_plain(c.get('name'), 30):<31}{_plain(c.get('agent'), 8):<9}{word:<14}{tail}")
    lines.append("")
    if final:
        lines += [f"final: {_plain(final.get('label'))}  entries: {_plain(_strs(final.get('entries')))}"]
        lines += [f"  {a}: {b}" for a, b in _final_lines(final)]
    else:
        lines.append("final: — (run in progress)")
    if s.get("report"):
        lines.append(f"report: {_plain(s['report'], 200)}")
    return "\n".join(lines) + "\n"


def render_dispatch(table: dict) -> str:
    """A dispatch table (system per batch-size range) as fixed-width text."""
    head = f"{'batch sizes':<14}{'measured at':>11}  {'×stock':>7}  system"
    lines = ["dispatch table:", head, "-" * len(head)]
    for x in _dicts(_d(table).get("entries")):
        top = x.get("max_batch")
        span = f"{x.get('min_batch')}–{top if top is not None else '∞'}"
        lines.append(f"{span:<14}{_plain(x.get('measured_at')):>11}  "
                     f"{_x(_d(x.get('speedup_over_stock')).get('gain')):>7}  {_plain(x.get('label'), 40)}")
    if _d(table).get("note"):
        lines.append(_plain(table["note"], 300))
    return "\n".join(lines) + "\n"


def write_report(summary: dict, folder) -> Path:
    """Write round-<k>.html for each round and index.html into folder (created); return index.html's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(_dicts(_d(summary).get("rounds"))):
        (folder / f"round-{_round_no(r, i)}.html").write_text(render_round_html(r, folder), encoding="utf-8")
    index = folder / "index.html"
    index.write_text(render_index_html(summary, folder), encoding="utf-8")
    return index
