"""Memory entries (validation, JSON round trip) and the requirement graph (resolve, errors, views)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specpilot.services.memory_api.entries import (
    Contract,
    Entry,
    EntryError,
    Evidence,
    Lineage,
    Requirement,
    parse_constraint,
)
from specpilot.services.memory_api.graph import GraphError, graph_json, graph_svg, resolve


def E(ident: str, version: int = 1, *requires: tuple[str, str] | str, **kw) -> Entry:
    reqs = tuple(Requirement(r) if isinstance(r, str) else Requirement(*r) for r in requires)
    return Entry(ident, version, f"{ident} mechanism", requires=reqs, **kw)


def catalog_of(*entries: Entry) -> dict[str, list[Entry]]:
    cat: dict[str, list[Entry]] = {}
    for e in entries:
        cat.setdefault(e.id, []).append(e)
    return cat


# ---------------------------------------------------------------- constraints


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("*", ()),
        ("==3", (("==", 3),)),
        (">=2", ((">=", 2),)),
        ("<=10", (("<=", 10),)),
        (">=2,<=4", ((">=", 2), ("<=", 4))),
    ],
)
def test_constraint_parsing(text, parsed):
    assert parse_constraint(text) == parsed


@pytest.mark.parametrize("text", ["", ">=0", "=3", ">2", ">= 2", ">=2,", ",<=4", "*,>=1", ">=02", "==-1", "latest"])
def test_bad_constraints_are_refused(text):
    with pytest.raises(EntryError, match="requirement 'b'.*constraint"):
        Requirement("b", text)


def test_allows():
    r = Requirement("b", ">=2,<=4")
    assert [v for v in range(1, 7) if r.allows(v)] == [2, 3, 4]
    assert all(Requirement("b").allows(v) for v in range(1, 5))
    assert [v for v in range(1, 5) if Requirement("b", "==3").allows(v)] == [3]


# ---------------------------------------------------------------- entries


def test_entry_validation_names_entry_and_field():
    with pytest.raises(EntryError, match=r"entry 'Bad': field 'id'"):
        E("Bad")
    with pytest.raises(EntryError, match=r"entry 'a': field 'version'"):
        E("a", 0)
    with pytest.raises(EntryError, match=r"entry a@1: field 'requires': duplicate requirement 'b'"):
        E("a", 1, "b", ("b", ">=2"))
    with pytest.raises(EntryError, match=r"entry a@1: field 'requires': an entry cannot require itself"):
        E("a", 1, "a")
    with pytest.raises(EntryError, match=r"entry a@2: field 'limits.gpus'"):
        E("a", 2, limits={"gpus": 1})
    with pytest.raises(EntryError, match=r"entry a@1: field 'evidence.lower_bound'"):
        E("a", evidence=Evidence({"family": "qwen3"}, 0.1, 0.2, "v1"))
    with pytest.raises(EntryError, match=r"entry a@1: field 'variants.fast'"):
        E("a", variants={"fast": {"k": object()}})
    with pytest.raises(EntryError, match=r"entry a@1: field 'reuse_of'"):
        E("a", reuse_of="b")


def test_twelve_requirements_at_most():
    twelve = [f"r{i}" for i in range(12)]
    assert len(E("a", 1, *twelve).requires) == 12
    with pytest.raises(EntryError, match=r"entry a@1: field 'requires': 13 requirements, at most 12"):
        E("a", 1, *twelve, "r12")


def test_key_and_hash():
    a = E("a", 3, ("b", ">=2"))
    assert a.key == "a@3"
    assert a.content_hash() == E("a", 3, ("b", ">=2")).content_hash()
    assert a.content_hash() != E("a", 3, ("b", ">=3")).content_hash()
    assert len(a.content_hash()) == 64


def test_from_dict_errors_name_the_entry():
    good = E("a", 2).to_dict()
    with pytest.raises(EntryError, match=r"entry a@2: field 'colour': unknown field"):
        Entry.from_dict({**good, "colour": "red"})
    bad = {k: v for k, v in good.items() if k != "title"}
    with pytest.raises(EntryError, match=r"entry a@2: field 'title': missing"):
        Entry.from_dict(bad)
    with pytest.raises(EntryError, match=r"entry a@2"):
        Entry.from_dict({**good, "requires": [{"constraint": "*"}]})


slugs = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,8}", fullmatch=True)
constraints = st.sampled_from(["*", "==1", ">=2", "<=3", ">=1,<=4", "==2,>=2"])
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.text(max_size=5))
json_dicts = st.dictionaries(st.text(min_size=1, max_size=6), json_leaf, max_size=3)
floats = st.floats(-10, 10, allow_nan=False)


@st.composite
def entries(draw) -> Entry:
    ident = draw(slugs)
    req_ids = draw(st.lists(slugs.filter(lambda s: s != ident), unique=True, max_size=12))
    gain, low = sorted([draw(floats), draw(floats)], reverse=True)
    return Entry(
        id=ident,
        version=draw(st.integers(1, 50)),
        title=draw(st.text(min_size=1, max_size=20)),
        requires=tuple(Requirement(i, draw(constraints)) for i in req_ids),
        delta=draw(st.text(max_size=40)),
        variants=draw(st.dictionaries(st.text(min_size=1, max_size=6), json_dicts, max_size=3)),
        contract=Contract(
            draw(st.sampled_from(["token_forcing", "exact"])), draw(st.booleans()), draw(json_dicts)
        ),
        evidence=draw(st.none() | st.builds(Evidence, json_dicts, st.just(gain), st.just(low), slugs)),
        limits=draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "families": st.lists(st.sampled_from(["qwen3", "qwen3_next"]), min_size=1, unique=True),
                    "devices": st.lists(st.sampled_from(["h100", "h200", "cpu"]), min_size=1, unique=True),
                    "batch_max": st.integers(1, 256),
                },
            )
        ),
        unverified=tuple(draw(st.lists(st.text(min_size=1, max_size=10), max_size=3))),
        lineage=draw(st.none() | st.builds(Lineage, slugs, slugs)),
        reuse_of=draw(st.none() | st.builds(lambda s, v: f"{s}@{v}", slugs, st.integers(1, 9))),
    )


@settings(max_examples=60, deadline=None)
@given(entries())
def test_entry_json_round_trip(entry):
    data = json.loads(json.dumps(entry.to_dict()))
    back = Entry.from_dict(data)
    assert back == entry
    assert back.content_hash() == entry.content_hash()
    assert back.canonical_json() == entry.canonical_json()


# ---------------------------------------------------------------- resolve: explicit cases


def test_resolve_picks_highest_allowed_and_orders_requirements_first():
    cat = catalog_of(
        E("a", 1), E("a", 2, ("b", "<=2")), E("b", 1), E("b", 2, "c"), E("b", 3), E("c", 1), E("c", 4)
    )
    order = resolve([Requirement("a")], cat)
    assert [e.key for e in order] == ["c@4", "b@2", "a@2"]


def test_constraints_are_gathered_until_a_fixed_point():
    # a@2 limits b to <=1; b@2 would have limited a to <=1. Settles at a@2, b@1.
    cat = catalog_of(E("a", 1), E("a", 2, ("b", "<=1")), E("b", 1), E("b", 2, ("a", "<=1")))
    order = resolve([Requirement("a"), Requirement("b")], cat)
    assert {e.key for e in order} == {"a@2", "b@1"}


def test_requirement_of_a_dropped_version_no_longer_counts():
    # Root c forces a down to a@1, so a@2's limit on b (<=1) must not hold any more.
    cat = catalog_of(E("a", 1), E("a", 2, ("b", "<=1")), E("b", 1), E("b", 2), E("c", 1, ("a", "<=1")))
    keys = [e.key for e in resolve([Requirement("a"), Requirement("b"), Requirement("c")], cat)]
    assert sorted(keys) == ["a@1", "b@2", "c@1"]


def test_tie_break_by_id():
    cat = catalog_of(E("z"), E("m"), E("a"), E("top", 1, "z", "m", "a"))
    assert [e.key for e in resolve([Requirement("top")], cat)] == ["a@1", "m@1", "z@1", "top@1"]


def test_missing_entry_message():
    cat = catalog_of(E("a", 2, "b"))
    with pytest.raises(GraphError, match=r"^a@2 → b: no entry 'b'$") as err:
        resolve([Requirement("a")], cat)
    assert err.value.kind == "missing"
    with pytest.raises(GraphError, match=r"^x: no entry 'x'$"):
        resolve([Requirement("x")], cat)
    deep = catalog_of(E("a", 1, "b"), E("b", 3, "c"))
    with pytest.raises(GraphError, match=r"^a@1 → b@3 → c: no entry 'c'$"):
        resolve([Requirement("a")], deep)


def test_unsatisfiable_message_lists_constraints_and_who():
    cat = catalog_of(E("a", 2, ("c", ">=3")), E("b", 1, ("c", "<=2")), E("c", 1), E("c", 2), E("c", 3))
    with pytest.raises(GraphError) as err:
        resolve([Requirement("a"), Requirement("b")], cat)
    msg = str(err.value)
    assert msg.startswith("a@2 → c: no version of 'c' satisfies the constraints")
    assert "'>=3' (from a@2)" in msg and "'<=2' (from b@1)" in msg
    assert msg.endswith("available versions: 1, 2, 3")
    with pytest.raises(GraphError, match=r"'==5' \(from root\)"):
        resolve([Requirement("c", "==5")], cat)


def test_cycle_message():
    cat = catalog_of(E("a", 1, "b"), E("b", 2, "a"))
    with pytest.raises(GraphError, match=r"^requirement cycle: a@1 → b@2 → a@1$") as err:
        resolve([Requirement("a")], cat)
    assert err.value.kind == "cycle"
    cat3 = catalog_of(E("a", 1, "b"), E("b", 1, "c"), E("c", 1, "b"))
    with pytest.raises(GraphError, match=r"requirement cycle: b@1 → c@1 → b@1$"):
        resolve([Requirement("a")], cat3)


def test_self_requirement():
    with pytest.raises(EntryError, match="cannot require itself"):
        E("a", 1, "a")
    sneaky = E("a", 1)
    object.__setattr__(sneaky, "requires", (Requirement("a"),))  # bypasses validation
    with pytest.raises(GraphError, match=r"^a@1 → a: an entry cannot require itself$"):
        resolve([Requirement("a")], {"a": [sneaky]})


def test_malformed_catalog():
    with pytest.raises(GraphError, match="listed under 'b'"):
        resolve([Requirement("b")], {"b": [E("a")]})
    with pytest.raises(GraphError, match="a@1 listed twice"):
        resolve([Requirement("a")], {"a": [E("a"), E("a")]})


def test_oscillation_is_reported():
    # a@2 needs b@1 and b@1 needs a@1; a@1 needs b@2 and b@2 needs a@2: no assignment is stable.
    cat = catalog_of(
        E("a", 1, ("b", "==2")), E("a", 2, ("b", "==1")), E("b", 1, ("a", "==1")), E("b", 2, ("a", "==2"))
    )
    with pytest.raises(GraphError) as err:
        resolve([Requirement("a")], cat)
    assert err.value.kind in {"unsettled", "unsatisfiable"}


# ---------------------------------------------------------------- resolve: properties on random DAGs


@st.composite
def dags(draw):
    """Nodes n0..nk with versions 1..3; an entry may only require nodes of lower index (acyclic)."""
    n = draw(st.integers(1, 7))
    cat: dict[str, list[Entry]] = {}
    for i in range(n):
        versions = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3, unique=True))
        for v in versions:
            below = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=min(i, 4))) if i else []
            reqs = tuple(Requirement(f"n{j}", draw(constraints)) for j in sorted(below))
            cat.setdefault(f"n{i}", []).append(Entry(f"n{i}", v, f"node {i}", requires=reqs))
    root_ids = draw(st.lists(st.integers(0, n - 1), unique=True, min_size=1))
    roots = [Requirement(f"n{i}", draw(constraints)) for i in root_ids]
    return roots, cat


def _imposed_by(roots, chosen):
    imposed: dict[str, list[Requirement]] = {r.id: [] for r in roots}
    for r in roots:
        imposed[r.id].append(r)
    for e in chosen:
        for r in e.requires:
            imposed.setdefault(r.id, []).append(r)
    return imposed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_resolve_properties_on_random_dags(dag):
    roots, cat = dag
    try:
        order = resolve(roots, cat)
    except GraphError as exc:
        assert exc.kind == "unsatisfiable", exc
        return
    position = {e.id: k for k, e in enumerate(order)}
    assert len(position) == len(order)
    # every requirement is present and comes before its dependent
    for e in order:
        for r in e.requires:
            assert position[r.id] < position[e.id]
            assert r.allows(order[position[r.id]].version)
    # exactly the ids reached from the roots, each at the highest version all constraints allow
    imposed = _imposed_by(roots, order)
    assert set(imposed) == set(position)
    for e in order:
        allowed = [x.version for x in cat[e.id] if all(r.allows(x.version) for r in imposed[e.id])]
        assert e.version == max(allowed)
    # deterministic, whatever the order of the catalog's lists and keys
    shuffled = {k: list(reversed(v)) for k, v in reversed(list(cat.items()))}
    assert [e.key for e in resolve(roots, shuffled)] == [e.key for e in order]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.data())
def test_closing_a_cycle_raises_naming_it(dag, data):
    roots, cat = dag
    try:
        order = resolve(roots, cat)
    except GraphError:
        return
    edges = [(e, r.id) for e in order for r in e.requires]
    if not edges:
        return
    dependent, req_id = data.draw(st.sampled_from(edges))
    required = next(e for e in order if e.id == req_id)
    closed = Entry(
        required.id, required.version, required.title, requires=required.requires + (Requirement(dependent.id),)
    )
    cat2 = {k: [closed if x.key == required.key else x for x in v] for k, v in cat.items()}
    with pytest.raises(GraphError) as err:
        resolve(roots, cat2)
    assert err.value.kind == "cycle"
    assert f"{required.key} → {dependent.key}" in str(err.value)


# ---------------------------------------------------------------- views


def test_graph_json():
    order = resolve([Requirement("a")], catalog_of(E("a", 2, ("b", ">=1,<=3")), E("b", 3)))
    g = graph_json(order)
    assert [n["key"] for n in g["nodes"]] == ["b@3", "a@2"]
    assert g["edges"] == [{"from": "a@2", "to": "b", "to_key": "b@3", "constraint": ">=1,<=3"}]
    json.dumps(g)


def test_graph_svg_is_xml_with_every_label():
    cat = catalog_of(E("a", 2, "b", "c"), E("b", 1, "d"), E("c", 5, "d"), E("d", 1), E("e", 1))
    order = resolve([Requirement("a"), Requirement("e")], cat)
    svg = graph_svg(order)
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert sorted(texts) == sorted(e.key for e in order)
    assert len(list(root.iter("{http://www.w3.org/2000/svg}line"))) == 4
    ET.fromstring(graph_svg([]))
