"""specpilot.zoo.workloads and the `zoo workload` CLI: sources, strict reading, round trip."""

from __future__ import annotations

import argparse
import ast
import json

import pytest

from specpilot.zoo import cli, corpus
from specpilot.zoo import workloads as W
from specpilot.zoo.workloads import Request, WorkloadError


@pytest.fixture(scope="module")
def stdlib_requests():
    return W.stdlib_completion()


# --- sources -------------------------------------------------------------------------------


def test_humaneval():
    reqs = W.humaneval()
    assert [r.id for r in reqs] == [f"HumanEval/{i}" for i in range(164)]
    assert all(r.tags == ("humaneval", "code") and r.prompt and r.prompt_ids is None for r in reqs)
    assert "def has_close_elements(" in reqs[0].prompt
    assert W.humaneval(limit=5) == reqs[:5]


def test_stdlib_prompts_come_only_from_heldout_modules(stdlib_requests):
    c = corpus.load_corpus()
    assert len(stdlib_requests) > 100
    assert len({r.id for r in stdlib_requests}) == len(stdlib_requests)
    for r in stdlib_requests:
        assert r.tags[0] == "stdlib" and r.tags[1] in c.heldout_modules
        assert r.tags[1] not in c.train_modules
        relpath = r.id.split(":")[1]
        assert corpus.module_of(relpath) == r.tags[1]


def test_stdlib_prompts_end_right_after_a_docstring(stdlib_requests):
    for r in stdlib_requests:
        assert r.prompt.endswith(('"', "'")) and r.prompt.lstrip().startswith(("def ", "async def ", "class "))
        tree = ast.parse(r.prompt)  # every prompt is valid Python on its own
        fn = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        assert len(fn) == 1, r.id
        (doc,) = fn[0].body  # the body is exactly the docstring
        assert isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)
        assert r.prompt.endswith(ast.get_source_segment(r.prompt, doc)), r.id


def test_stdlib_order_is_deterministic_and_spread(stdlib_requests):
    assert W.stdlib_completion(limit=40) == stdlib_requests[:40]
    assert len({r.tags[1] for r in stdlib_requests[:10]}) >= 5  # round-robin over modules


def test_function_prompts_edge_cases():
    source = (
        "import os\n"
        "\f\n"  # form feed: not a line break for ast
        "def top(a, b='é'):  # comment\n"
        "    '''Doc with ünïcode.'''; x = 1\n"
        "    return a\n"
        "def undocumented():\n"
        "    return 1\n"
        "class Simple(Base):\n"
        "    '''class doc'''\n"
        "    async def meth(self):\n"
        "        \"\"\"Multi\n"
        "        line.\"\"\"\n"
        "        def nested():\n"
        "            'nested doc'\n"
        "class Wide(A,\n"
        "           B):\n"
        "    def skipped(self):\n"
        "        'doc'\n"
        "if True:\n"
        "    def conditional():\n"
        "        'doc'\n"
    )
    got = W.function_prompts(source)
    assert got == [
        (3, "top", "def top(a, b='é'):  # comment\n    '''Doc with ünïcode.'''"),
        (10, "Simple.meth", 'class Simple(Base):\n    async def meth(self):\n        """Multi\n        line."""'),
    ]


# --- reading and writing -------------------------------------------------------------------


def _write(tmp_path, lines, name="w.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


OK = '{"id": "ok", "prompt": "x"}'


@pytest.mark.parametrize(
    "bad, field",
    [
        ('{"id": "a", "prompt": ', "JSON"),
        ("[1, 2]", "object"),
        ('"just a string"', "object"),
        ('{"prompt": "x"}', "'id'"),
        ('{"id": 7, "prompt": "x"}', "'id'"),
        ('{"id": "", "prompt": "x"}', "'id'"),
        ('{"id": "ok", "prompt": "y"}', "'id'"),  # duplicate of line 1
        ('{"id": "b", "prompt": "x", "prompt_ids": [1]}', "'prompt'"),
        ('{"id": "b"}', "'prompt'"),
        ('{"id": "b", "prompt": 5}', "'prompt'"),
        ('{"id": "b", "prompt": ""}', "'prompt'"),
        ('{"id": "b", "prompt_ids": [1, -2]}', "'prompt_ids'"),
        ('{"id": "b", "prompt_ids": [1, 2.5]}', "'prompt_ids'"),
        ('{"id": "b", "prompt_ids": [true]}', "'prompt_ids'"),
        ('{"id": "b", "prompt_ids": []}', "'prompt_ids'"),
        ('{"id": "b", "prompt_ids": "1 2"}', "'prompt_ids'"),
        ('{"id": "b", "prompt": "x", "tags": "code"}', "'tags'"),
        ('{"id": "b", "prompt": "x", "tags": [1]}', "'tags'"),
        ('{"id": "b", "prompt": "x", "max_new_tokens": 0}', "'max_new_tokens'"),
        ('{"id": "b", "prompt": "x", "max_new_tokens": "5"}', "'max_new_tokens'"),
        ('{"id": "b", "prompt": "x", "max_new_tokens": true}', "'max_new_tokens'"),
        ('{"id": "b", "prompt": "x", "max_tokens": 5}', "'max_tokens'"),
        ('{"id": "b", "prompt": "x", "prompt": "y"}', "'prompt' appears twice"),
    ],
)
def test_read_workload_rejects(tmp_path, bad, field):
    path = _write(tmp_path, [OK, "", bad])  # line 3 (the blank line 2 still counts)
    with pytest.raises(WorkloadError) as info:
        W.read_workload(path)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert f"{path}:3:" in msg and "line 3" in msg and field in msg
    assert "Fix line 3" in msg  # says what to do


def test_duplicate_id_names_the_first_line(tmp_path):
    path = _write(tmp_path, [OK, OK])
    with pytest.raises(WorkloadError, match=r":2: field 'id' 'ok' duplicates line 1"):
        W.read_workload(path)


def test_read_workload_rejects_non_utf8_and_empty(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "caf\xe9"}\n')
    with pytest.raises(WorkloadError, match=r"latin1.jsonl:2: line is not valid UTF-8"):
        W.read_workload(path)
    empty = _write(tmp_path, ["", "  "], name="empty.jsonl")
    with pytest.raises(WorkloadError, match="empty.jsonl: workload holds no requests"):
        W.read_workload(empty)


def test_write_read_round_trip(tmp_path):
    reqs = [
        Request(id="p", prompt="def f():\n    'ünï 🎉'\n", tags=("stdlib", "json")),
        Request(id="ids", prompt_ids=(0, 5, 4095), max_new_tokens=32),
        Request(id="plain", prompt=" "),
    ]
    path = tmp_path / "sub" / "w.jsonl"
    assert W.write_jsonl(path, reqs) == 3
    assert W.read_workload(path) == reqs
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert first == {"id": "p", "prompt": "def f():\n    'ünï 🎉'\n", "tags": ["stdlib", "json"]}
    he = W.humaneval()
    W.write_jsonl(tmp_path / "he.jsonl", he)
    assert W.read_workload(tmp_path / "he.jsonl") == he


def test_write_rejects_duplicate_ids(tmp_path):
    with pytest.raises(WorkloadError, match="duplicate request id 'a'"):
        W.write_jsonl(tmp_path / "w.jsonl", [Request(id="a", prompt="x"), Request(id="a", prompt="y")])


def test_request_validates_and_is_hashable():
    r = Request(id="a", prompt_ids=[1, 2], tags=["t"])
    assert r.prompt_ids == (1, 2) and r.tags == ("t",) and hash(r)
    with pytest.raises(WorkloadError, match="'prompt'"):
        Request(id="a")
    with pytest.raises(WorkloadError, match="'prompt_ids'"):
        Request(id="a", prompt_ids=[-1])
    with pytest.raises(WorkloadError, match="'tags'"):
        Request(id="a", prompt="x", tags="code")


# --- CLI -----------------------------------------------------------------------------------


def test_cli_writes_humaneval_json(tmp_path, capsys):
    out = tmp_path / "he.jsonl"
    assert cli.main(["zoo", "workload", "humaneval", "--out", str(out), "--limit", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"path": str(out), "count": 3}
    assert [r.id for r in W.read_workload(out)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]


def test_cli_writes_stdlib_text(tmp_path, capsys):
    out = tmp_path / "std.jsonl"
    assert cli.main(["zoo", "workload", "stdlib", "--out", str(out), "--limit", "4"]) == 0
    printed = capsys.readouterr().out
    assert "4" in printed and str(out) in printed
    assert len(W.read_workload(out)) == 4


def test_register_on_a_foreign_parser(tmp_path):
    parser = argparse.ArgumentParser(prog="specpilot")
    subparsers = parser.add_subparsers(dest="command")
    cli.register(subparsers)
    args = parser.parse_args(["zoo", "workload", "humaneval", "--out", str(tmp_path / "x.jsonl")])
    assert args.func is cli.run and args.source == "humaneval" and args.limit is None
    for bad in (["zoo", "workload", "nope", "--out", "x"], ["zoo", "workload", "stdlib"],
                ["zoo", "workload", "stdlib", "--out", "x", "--limit", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
