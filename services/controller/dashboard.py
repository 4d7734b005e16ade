"""The controller's dashboard: server-rendered HTML pages (standard library only, every string
escaped), with a little inline JavaScript for the form and the live view (server-sent events).
Nothing is loaded from anywhere else: no CDN, no build step."""

from __future__ import annotations

import html
import json
import time

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:baseline}
header a{color:#cfe0ff;text-decoration:none}header h1{font-size:18px;margin:0}
main{padding:16px 24px;max-width:1200px}section{background:#fff;border:1px solid #dde1e8;border-radius:6px;
padding:12px 16px;margin-bottom:16px}h2{font-size:15px;margin:0 0 8px}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #eceff3;padding:4px 8px;text-align:left;
vertical-align:top}th{font-weight:600;background:#fafbfc}
.ok{color:#137333}.bad{color:#b3261e}.muted{color:#6b7280}.state{font-weight:600}
form.queue{display:grid;grid-template-columns:repeat(4,minmax(150px,1fr));gap:8px 16px}
form.queue label{display:flex;flex-direction:column;font-size:12px;color:#4b5563}
form.queue input,form.queue select{font:inherit;padding:4px}
#log{font:12px/1.4 ui-monospace,monospace;max-height:320px;overflow:auto;background:#0f1320;color:#d7e1f5;
padding:8px;border-radius:4px;white-space:pre-wrap}
.msg{margin-top:8px}svg{max-width:100%}
"""

FORM_JS = """
const form = document.getElementById('queue');
const token = document.getElementById('token');
token.value = localStorage.getItem('specpilot-token') || '';
form.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const f = new FormData(form), msg = document.getElementById('queue-msg');
  localStorage.setItem('specpilot-token', token.value);
  const dep = {};
  for (const [k, v] of f.entries()) {
    if (k === 'token' || k === 'rounds' || v === '') continue;
    dep[k] = form.elements[k].type === 'number' ? Number(v) : v;
  }
  if (dep.drafters) { try { dep.drafters = JSON.parse(dep.drafters); } catch (e) {
    msg.textContent = 'drafters: not JSON (' + e.message + ')'; msg.className = 'msg bad'; return; } }
  const r = await fetch('/api/rounds', {method: 'POST', headers: {'Content-Type': 'application/json',
    'Authorization': 'Bearer ' + token.value}, body: JSON.stringify({deployment: dep, rounds: Number(f.get('rounds'))})});
  const body = await r.json().catch(() => ({}));
  if (r.status === 201) { location.href = '/rounds/' + body.id; return; }
  msg.textContent = r.status + ': ' + (body.detail || JSON.stringify(body)); msg.className = 'msg bad';
});
"""

LIVE_JS = """
const log = document.getElementById('log'), state = document.getElementById('state');
const es = new EventSource('/api/rounds/' + ROUND_ID + '/events?after=' + LAST_EVENT);
for (const kind of ['step', 'candidate', 'verdict', 'state']) {
  es.addEventListener(kind, (ev) => {
    const d = JSON.parse(ev.data);
    log.textContent += new Date(d.at * 1000).toLocaleTimeString() + '  ' + d.text + '\\n';
    log.scrollTop = log.scrollHeight;
    if (kind === 'state') { state.textContent = d.data.state;
      if (['done', 'failed', 'cancelled'].includes(d.data.state)) { es.close(); setTimeout(() => location.reload(), 500); } }
  });
}
es.addEventListener('end', () => es.close());
"""


def event_text(kind: str, d: dict) -> str:
    """One line of the live log for an event (the page and the event stream show the same)."""
    if kind == "step":
        where = f" {d['candidate']}" if d.get("candidate") else f" ({d['system']})" if d.get("system") else ""
        return (f"round {d['round']}: " if "round" in d else "") + f"{d.get('step')}{where}"
    if kind == "candidate":
        return f"round {d.get('round')}: candidate {d.get('name')}" + (f" pruned: {d['pruned']}" if d.get("pruned") else "")
    if kind == "verdict":
        v = d.get("verdict")
        if not v:
            return f"round {d.get('round')}: {d.get('name')}: could not be evaluated: {d.get('error')}"
        return (f"round {d.get('round')}: {d.get('name')}: {'ACCEPTED' if v['accepted'] else 'rejected'}, gain "
                f"×{v['gain']:.3f} (95 % lower bound ×{v['lower_bound']:.3f}, needs > ×{1 + v['threshold']:.3f})")
    if kind == "state":
        extra = d.get("error") or d.get("requeued") or ""
        return f"state {d.get('state')}" + (f": {extra}" if extra else "")
    return f"{kind} {json.dumps(d, ensure_ascii=False)}"


def e(x) -> str:
    return html.escape("" if x is None else str(x))


def num(x, spec: str = ".3f", prefix: str = "") -> str:
    return f"{prefix}{x:{spec}}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "–"


def when(t) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "–"


def page(title: str, body: str, script: str = "") -> str:
    js = f"<script>{script}</script>" if script else ""
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{e(title)} · SpecPilot</title>"
            f"<meta name=viewport content='width=device-width,initial-scale=1'><style>{CSS}</style></head><body>"
            f"<header><h1>SpecPilot</h1><a href='/'>rounds</a><a href='/memory'>memory</a>"
            f"<a href='/docs'>API</a><a href='/metrics'>metrics</a></header><main>{body}</main>{js}</body></html>")


def table(head: list[str], rows: list[list[str]], empty: str) -> str:
    if not rows:
        return f"<p class=muted>{e(empty)}</p>"
    th = "".join(f"<th>{h}</th>" for h in head)
    return "<table><tr>" + th + "</tr>" + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>"
                                                    for r in rows) + "</table>"


def workers_table(workers: list[dict]) -> str:
    rows = [[e(w["address"]), e(w.get("device")), e(w.get("kind")),
             "<span class=ok>healthy</span>" if w["healthy"] else f"<span class=bad>down</span> {e(w.get('detail'))}",
             e(w.get("systems"))] for w in workers]
    return table(["address", "device", "kind", "health", "systems running"], rows, "no GPU worker configured")


def state_cell(state: str) -> str:
    cls = {"done": "ok", "failed": "bad", "cancelled": "muted"}.get(state, "")
    return f"<span class='state {cls}'>{e(state)}</span>"


def index(records: list[dict], workers: list[dict], defaults: dict) -> str:
    rows = [[f"<a href='/rounds/{e(r['id'])}'>{e(r['id'][:12])}</a>", e(r["deployment"].get("name")),
             e(r["deployment"].get("gpu")), e(r["rounds"]), state_cell(r["state"]), when(r["created_at"]),
             e(r.get("error") or "")] for r in records]
    fields = [("name", "text", "name"), ("target", "text", "target checkpoint folder"),
              ("drafter", "text", "drafter folder or ngram (empty: AR)"),
              ("drafters", "text", 'drafters {"kind": "folder"}'),
              ("gpu", "text", "device kind"), ("devices", "text", "devices (1 or 2)"),
              ("workload", "text", "workload"), ("prompts", "number", "prompts"),
              ("max_new_tokens", "number", "new tokens"), ("repeats", "number", "repeats (≥ 2)"),
              ("max_candidates", "number", "candidates per round"), ("rounds", "number", "rounds")]
    inputs = []
    for name, kind, label in fields:
        v = defaults.get(name, "")
        v = json.dumps(v) if isinstance(v, dict) else v
        extra = " min=1 required" if kind == "number" else (" required" if name in ("name", "target") else "")
        extra += " min=2" if name == "repeats" else ""
        inputs.append(f"<label>{e(label)}<input name={name} type={kind} value='{e(v)}'{extra}></label>")
    inputs.append("<label>token (Authorization: Bearer)<input id=token name=token type=password required></label>")
    form = (f"<form id=queue class=queue>{''.join(inputs)}<label>&nbsp;<button type=submit>queue the round"
            f"</button></label></form><div id=queue-msg class=msg></div>")
    body = (f"<section><h2>Queue a round</h2>{form}</section>"
            f"<section><h2>Rounds</h2>{table(['id', 'deployment', 'kind', 'rounds', 'state', 'queued', 'error'], rows, 'no round yet')}</section>"
            f"<section><h2>GPU workers</h2>{workers_table(workers)}</section>")
    return page("rounds", body, FORM_JS)


def round_page(rec: dict, view: dict, events: list[dict]) -> str:
    dep = rec["deployment"]
    head = (f"<section><h2>Round {e(rec['id'])}</h2><p>state <span id=state class=state>{e(rec['state'])}</span>"
            f" · deployment <b>{e(dep.get('name'))}</b> ({e(dep.get('gpu'))}, devices {e(dep.get('devices'))}) · "
            f"{e(rec['rounds'])} round(s) · queued {when(rec['created_at'])}</p>"
            + (f"<p class=bad>{e(rec['error'])}</p>" if rec.get("error") else "") + "</section>")
    parts = [head] + ([dispatch_section(view["dispatch"])] if view.get("dispatch") else [])
    for lane in view.get("lanes") or [view]:
        parts += lane_sections(rec, lane)
    log = "".join(f"{when(ev['at'])}  {e(event_text(ev['kind'], ev['data']))}\n" for ev in events)
    parts.append(f"<section><h2>Live</h2><div id=log>{log}</div></section>")
    last = events[-1]["seq"] if events else 0
    script = (f"const ROUND_ID = {json.dumps(rec['id'])}, LAST_EVENT = {last};\n" + LIVE_JS
              if rec["state"] in ("queued", "running") else "")
    return page(f"round {rec['id'][:12]}", "".join(parts), script)


def dispatch_section(table_: dict) -> str:
    """The dispatch table: which system runs at which live batch sizes."""
    rows = [[e(f"{x['min_batch']}–{x['max_batch'] if x['max_batch'] is not None else '∞'}"), e(x["measured_at"]),
             e(x["label"]), num((x.get("speedup_over_stock") or {}).get("gain"), ".3f", "×")]
            for x in table_["entries"]]
    note = f"<p>{e(table_['note'])}</p>" if table_.get("note") else ""
    return ("<section><h2>Dispatch table (system per batch size)</h2>"
            + table(["batch sizes", "measured at", "system", "over stock"], rows, "no entry") + note + "</section>")


def lane_sections(rec: dict, view: dict) -> list[str]:
    """One batch size's rounds (the whole run when it judged one batch size)."""
    sub = f"/batch-{view['batch']}" if "batch" in view else ""
    title = f"<h2>Batch {e(view['batch'])}</h2>" if "batch" in view else ""
    parts = [f"<section>{title}<p>speed-up of the final system over stock: "
             f"<b>{num(view.get('speedup_over_stock'), '.3f', '×')}</b>"
             f", over AR: <b>{num(view.get('speedup_over_ar'), '.3f', '×')}</b>"
             + (f" · <a href='/rounds/{e(rec['id'])}{sub}/report/index.html'>report</a>" if view.get("report") else "")
             + "</p></section>"]
    for r in view["rounds"]:
        rows = []
        for c in r["candidates"]:
            if c["pruned"]:
                status = f"<span class=muted>pruned: {e(c['pruned'])}</span>"
            elif c["error"]:
                status = f"<span class=bad>{e(c['error'])}</span>"
            elif c["gain"] is None:
                status = "<span class=muted>waiting</span>"
            else:
                status = "<span class=ok>accepted</span>" if c["accepted"] else "rejected"
            rows.append([e(c["name"]), status, num(c["gain"], ".3f", "×"), num(c["lower_bound"], ".3f", "×")])
        acc = ", ".join(f"{e(a['entry'])} (×{a['gain']:.3f})" for a in r["accepted"]) or "none"
        link = (f" · <a href='/rounds/{e(rec['id'])}{sub}/report/round-{e(r['round'])}.html'>round report</a>"
                if view.get("report") else "")
        parts.append(f"<section><h2>Round {e(r['round'])}: {e(r['status'])}, direction {e(r['direction'])}</h2>"
                     + table(["candidate", "verdict", "gain", "95 % lower bound"], rows, "no candidate yet")
                     + f"<p>accepted into memory: {acc}{link}</p></section>")
    return parts


def memory_page(entries: list[dict], error: str | None) -> str:
    rows = [[f"<a href='/memory/{e(x['id'])}'>{e(x['id'])}@{e(x['version'])}</a>", e(x["title"]),
             e(", ".join(f"{r['id']} {r['constraint']}" for r in x.get("requires", []))),
             e(", ".join(x.get("variants", {}))),
             num((x.get("evidence") or {}).get("gain"), ".3f", "×")] for x in entries]
    body = ("<section><h2>Memory entries</h2>" + (f"<p class=bad>{e(error)}</p>" if error else "")
            + table(["entry", "title", "requires", "variants", "evidence gain"], rows, "the memory is empty")
            + "</section>")
    return page("memory", body)


def entry_page(entry: dict, svg: str | None, error: str | None) -> str:
    body = (f"<section><h2>{e(entry['id'])}@{e(entry['version'])}: {e(entry['title'])}</h2>"
            + (f"<p class=bad>{e(error)}</p>" if error else "")
            + f"<h2>Requirement graph</h2>{svg or '<p class=muted>no graph</p>'}"
            + f"<h2>Entry</h2><pre>{e(json.dumps(entry, indent=1))}</pre></section>")
    return page(entry["id"], body)


def api_docs(schema: dict) -> str:
    rows = []
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            auth = "Bearer token" if op.get("security") else ""
            rows.append([f"<code>{e(method.upper())}</code>", f"<code>{e(path)}</code>", e(op.get("summary")),
                         e(op.get("description", "")), auth])
    body = (f"<section><h2>{e(schema['info']['title'])} {e(schema['info']['version'])}</h2>"
            f"<p>{e(schema['info'].get('description'))}</p><p>The schema: <a href='/openapi.json'>/openapi.json</a>"
            f" (OpenAPI {e(schema.get('openapi'))}).</p>"
            + table(["method", "path", "summary", "description", "auth"], rows, "no route") + "</section>")
    return page("API", body)
