"""The requirement graph: version resolution, apply order, and JSON / SVG views.

`resolve` picks, for each needed id, the highest version allowed by every constraint that reaches
it from the roots and from the *chosen* versions of the other entries, iterating (one change at a
time, in id order) until nothing changes. No backtracking search: if the fixed point leaves an id
without a version, that is an error, reported with the constraints and who imposed each.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from xml.sax.saxutils import escape

from .entries import Entry, Requirement

ROOT = "root"


class GraphError(ValueError):
    """The requirement graph cannot be resolved; the message names the path."""

    def __init__(self, message: str, *, kind: str, ident: str | None = None):
        super().__init__(message)
        self.kind = kind  # "catalog" | "self" | "missing" | "unsatisfiable" | "cycle" | "unsettled"
        self.ident = ident


Imposed = dict[str, list[tuple[Requirement, str]]]  # id -> [(requirement, who imposed it)]


def _check_catalog(catalog: Mapping[str, list[Entry]]) -> None:
    for ident, entries in catalog.items():
        seen = set()
        for e in entries:
            if e.id != ident:
                raise GraphError(f"catalog: entry {e.key} listed under {ident!r}", kind="catalog", ident=ident)
            if e.version in seen:
                raise GraphError(f"catalog: {e.key} listed twice", kind="catalog", ident=ident)
            seen.add(e.version)
            if any(r.id == e.id for r in e.requires):
                raise GraphError(f"{e.key} → {e.id}: an entry cannot require itself", kind="self", ident=e.id)


def _imposed(roots: list[Requirement], chosen: Mapping[str, Entry | None]) -> tuple[Imposed, dict[str, str]]:
    """Constraints reaching each id from the roots through the chosen entries, and a BFS parent map."""
    imposed: Imposed = {}
    parent: dict[str, str] = {}
    queue: list[str] = []
    for r in roots:
        if r.id not in imposed:
            imposed[r.id] = []
            parent[r.id] = ROOT
            queue.append(r.id)
        imposed[r.id].append((r, ROOT))
    while queue:
        e = chosen.get(queue.pop(0))
        if e is None:
            continue
        for r in e.requires:
            if r.id not in imposed:
                imposed[r.id] = []
                parent[r.id] = e.id
                queue.append(r.id)
            imposed[r.id].append((r, e.key))
    return imposed, parent


def _best(versions: list[Entry], constraints: list[tuple[Requirement, str]]) -> Entry | None:
    allowed = [e for e in versions if all(r.allows(e.version) for r, _ in constraints)]
    return max(allowed, key=lambda e: e.version, default=None)


def _path(ident: str, parent: dict[str, str], chosen: Mapping[str, Entry | None]) -> str:
    """`a@2 → b` for the path from a root to `ident` (ident printed bare)."""
    chain = [ident]
    node = parent[ident]
    while node != ROOT:
        chain.append(chosen[node].key)
        node = parent[node]
    return " → ".join(reversed(chain))


def _version(e: Entry | None) -> int | None:
    return None if e is None else e.version


def resolve(roots: list[Requirement], catalog: Mapping[str, list[Entry]]) -> list[Entry]:
    """The entries needed by `roots`, highest allowed versions, in apply order (requirements first)."""
    _check_catalog(catalog)
    chosen: dict[str, Entry | None] = {}
    seen_states: set[frozenset] = set()
    while True:
        imposed, parent = _imposed(roots, chosen)
        chosen = {i: chosen[i] for i in imposed if i in chosen}  # drop what is no longer reached
        state = frozenset((i, _version(e)) for i, e in chosen.items())
        if state in seen_states:
            ids = ", ".join(sorted(chosen))
            raise GraphError(f"constraints do not settle (versions oscillate among: {ids})", kind="unsettled")
        seen_states.add(state)
        for ident in sorted(imposed):
            pick = _best(catalog.get(ident, []), imposed[ident])
            if ident not in chosen or _version(pick) != _version(chosen[ident]):
                chosen[ident] = pick
                break
        else:
            break  # fixed point

    for ident in sorted(imposed):
        if chosen[ident] is not None:
            continue
        where = _path(ident, parent, chosen)
        if not catalog.get(ident):
            raise GraphError(f"{where}: no entry {ident!r}", kind="missing", ident=ident)
        have = ", ".join(str(e.version) for e in sorted(catalog[ident], key=lambda e: e.version))
        said = "; ".join(f"{r.constraint!r} (from {who})" for r, who in imposed[ident])
        raise GraphError(
            f"{where}: no version of {ident!r} satisfies the constraints {said}; available versions: {have}",
            kind="unsatisfiable",
            ident=ident,
        )

    entries = {i: e for i, e in chosen.items() if e is not None}
    cycle = _find_cycle(entries)
    if cycle:
        raise GraphError(
            "requirement cycle: " + " → ".join(entries[i].key for i in cycle), kind="cycle", ident=cycle[0]
        )
    return _apply_order(entries)


def _find_cycle(entries: Mapping[str, Entry]) -> list[str]:
    """A cycle as ids [a, b, ..., a], found by DFS in id order; [] when there is none."""
    color: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(i: str) -> list[str]:
        color[i] = 1
        stack.append(i)
        for r in sorted(entries[i].requires, key=lambda r: r.id):
            if r.id not in entries:
                continue
            if color.get(r.id) == 1:
                return stack[stack.index(r.id) :] + [r.id]
            if r.id not in color:
                found = visit(r.id)
                if found:
                    return found
        stack.pop()
        color[i] = 2
        return []

    for i in sorted(entries):
        if i not in color:
            found = visit(i)
            if found:
                return found
    return []


def _apply_order(entries: Mapping[str, Entry]) -> list[Entry]:
    """Kahn's algorithm; among ready entries the smallest id goes first."""
    waiting = {i: {r.id for r in e.requires if r.id in entries} for i, e in entries.items()}
    users: dict[str, list[str]] = {i: [] for i in entries}
    for i, reqs in waiting.items():
        for r in reqs:
            users[r].append(i)
    ready = [i for i, reqs in waiting.items() if not reqs]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(entries[i])
        for u in users[i]:
            waiting[u].discard(i)
            if not waiting[u]:
                heapq.heappush(ready, u)
    if len(order) != len(entries):
        cycle = _find_cycle(entries)
        raise GraphError("requirement cycle: " + " → ".join(entries[i].key for i in cycle), kind="cycle")
    return order


def graph_json(entries: list[Entry]) -> dict:
    """Nodes and edges (dependent → requirement, with its constraint) of a set of entries."""
    by_id = {e.id: e for e in entries}
    nodes = [{"id": e.id, "version": e.version, "key": e.key, "title": e.title} for e in entries]
    edges = [
        {
            "from": e.key,
            "to": r.id,
            "to_key": by_id[r.id].key if r.id in by_id else None,
            "constraint": r.constraint,
        }
        for e in entries
        for r in e.requires
    ]
    return {"nodes": nodes, "edges": edges}


def _depths(entries: Mapping[str, Entry]) -> dict[str, int]:
    depth: dict[str, int] = {}
    for e in _apply_order(entries):  # requirements come first, so their depth is known
        reqs = [depth[r.id] for r in e.requires if r.id in entries]
        depth[e.id] = 1 + max(reqs) if reqs else 0
    return depth


def graph_svg(entries: list[Entry]) -> str:
    """A small SVG: one row per depth (requirements on top), a box per `id@version`, arrows to requirements."""
    by_id = {e.id: e for e in entries}
    depth = _depths(by_id)
    rows: dict[int, list[str]] = {}
    for i in sorted(by_id):
        rows.setdefault(depth[i], []).append(i)
    char_w, box_h, gap_x, gap_y, pad = 7, 28, 24, 48, 16
    width_of = {i: 16 + char_w * len(by_id[i].key) for i in by_id}
    pos: dict[str, tuple[float, float]] = {}  # box top-left
    total_w = 0.0
    for d, ids in sorted(rows.items()):
        x = pad
        for i in ids:
            pos[i] = (x, pad + d * (box_h + gap_y))
            x += width_of[i] + gap_x
        total_w = max(total_w, x - gap_x + pad)
    total_h = pad * 2 + (max(rows, default=0) + 1) * (box_h + gap_y) - gap_y if by_id else pad * 2
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(total_w, 2 * pad):.0f}" height="{total_h:.0f}" '
        f'font-family="monospace" font-size="12">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"/></marker></defs>',
    ]
    for e in sorted(entries, key=lambda e: e.id):
        x, y = pos[e.id]
        for r in e.requires:
            if r.id not in pos:
                continue
            rx, ry = pos[r.id]
            x1, y1 = x + width_of[e.id] / 2, y
            x2, y2 = rx + width_of[r.id] / 2, ry + box_h
            parts.append(
                f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" stroke="#555" '
                f'marker-end="url(#arrow)"><title>{escape(f"{e.key} requires {r.id} {r.constraint}")}</title></line>'
            )
    for i in sorted(by_id):
        x, y = pos[i]
        parts.append(
            f'<g><rect x="{x:.0f}" y="{y:.0f}" width="{width_of[i]}" height="{box_h}" rx="4" fill="#eef" '
            f'stroke="#336"/><text x="{x + 8:.0f}" y="{y + 18:.0f}">{escape(by_id[i].key)}</text>'
            f"<title>{escape(by_id[i].title)}</title></g>"
        )
    parts.append("</svg>")
    return "\n".join(parts)
