"""specpilot.zoo.corpus, the code corpus: wheel sources, the split of package files, duplicate and
leak removal, the xz file and its hash check."""

import json
import lzma
import zipfile

import pytest

from specpilot.zoo import corpus as C

CODE = "\n".join(f"    value_{i} = compute_something({i}, factor={i * 3})" for i in range(20)) + "\n"


def _wheel(path, files):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def test_wheel_sources_keeps_own_py_files_sorted(tmp_path):
    w = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {
        "pkg/b.py": "b = 1\n", "pkg/a.py": "a = 1\n", "pkg/_vendor/six.py": "x = 1\n", "pkg/data.txt": "no",
        "pkg-1.0.dist-info/x.py": "y = 1\n", "pkg-1.0.data/scripts/s.py": "z = 1\n",
        "pkg/latin.py": b"# caf\xe9\n", "pkg/big.py": "#" * (C.MAX_FILE_BYTES + 1),
        "pkg/tests/test_a.py": "def test(): pass\n"})
    assert C.wheel_sources(w) == [("pkg/a.py", "a = 1\n"), ("pkg/b.py", "b = 1\n"),
                                  ("pkg/tests/test_a.py", "def test(): pass\n")]


def test_package_module():
    assert C.package_module("sympy/physics/units/x.py") == "sympy/physics"
    assert C.package_module("requests/api.py") == "requests/api"
    assert C.package_module("six.py") == "six"


def test_line_runs_ignore_short_lines_comments_and_spacing():
    a = "x = 1\n" + CODE
    b = "# a comment\n\n" + CODE.replace("    ", "\t")
    assert C.line_runs(a, 8) == C.line_runs(b, 8) and len(C.line_runs(a, 8)) == 13
    assert C.line_runs("short\n" * 50, 2) == set()


def _stdlib(train, heldout):
    return C.Corpus(train, heldout, C.corpus_hash(train, heldout), "3.11.7")


def test_assemble_splits_by_module_drops_duplicates_and_leaks():
    held_mod = next(m for m in (f"m{i}" for i in range(1000)) if C.is_heldout(f"pkg:pkg/{m}"))
    train_mod = next(m for m in (f"m{i}" for i in range(1000)) if not C.is_heldout(f"pkg:pkg/{m}"))
    files = [(f"pkg/{held_mod}.py", "def held():\n" + CODE),
             (f"pkg/{train_mod}/a.py", "def copy_of_held():\n" + CODE),  # shares a run with held-out: dropped
             (f"pkg/{train_mod}/b.py", "unique = 'text of its own'\n"),
             (f"pkg/{train_mod}/c.py", "unique = 'text of its own'\n"),  # duplicate of b: dropped
             (f"pkg/{train_mod}/d.py", "def he(numbers):\n" + CODE.replace("compute", "other") + "\n")]
    stdlib = _stdlib([C.Document("os", "os.py", "import sys\n")], [C.Document("json", "json/__init__.py", "x = 2\n")])
    bench = ["\n".join(CODE.replace("compute", "other").splitlines()[3:7])]
    c, report = C.assemble(stdlib, {"pkg==1.0": files}, benchmark_texts=bench)
    assert [d.relpath for d in c.train] == ["stdlib/os.py", f"pkg==1.0/pkg/{train_mod}/b.py"]
    assert [d.relpath for d in c.heldout] == ["stdlib/json/__init__.py", f"pkg==1.0/pkg/{held_mod}.py"]
    assert report["duplicates_dropped"] == 1 and report["heldout_leaks_dropped"] == 1
    assert report["benchmark_leaks_dropped"] == 1
    assert {d.module for d in c.heldout} == {"stdlib:json", f"pkg:pkg/{held_mod}"}
    assert c.sha256 == C.corpus_hash(c.train, c.heldout)


def test_write_read_round_trip_and_hash_checks(tmp_path):
    c = _stdlib([C.Document("a", "stdlib/a.py", "a = 1\n")], [C.Document("b", "stdlib/b.py", "b = 'é'\n")])
    path = tmp_path / "c.jsonl.xz"
    C.write_corpus(c, path, {"format": 1})
    back, header = C.read_corpus(path, expect=c.sha256)
    assert back == c and header["sha256"] == c.sha256
    with pytest.raises(C.CorpusError, match="differs from corpus.lock.json"):
        C.read_corpus(path, expect="0" * 64)
    lines = lzma.open(path, "rt", encoding="utf-8").read().splitlines()
    row = json.loads(lines[1])
    lines[1] = json.dumps({**row, "text": "a = 2\n"})  # one changed file
    with lzma.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(C.CorpusError, match="differs from its header"):
        C.read_corpus(path, expect=c.sha256)
    with pytest.raises(C.CorpusError, match="zoo corpus"):
        C.read_corpus(tmp_path / "missing.xz")
    (tmp_path / "bad.xz").write_bytes(b"not xz")
    with pytest.raises(C.CorpusError, match="not a prepared code corpus"):
        C.read_corpus(tmp_path / "bad.xz")


def test_subsample_is_stable_and_about_the_share():
    docs = [C.Document("m", f"p/{i}.py", "") for i in range(2000)]
    half = C.subsample(docs, 0.5)
    assert half == C.subsample(list(reversed(docs)), 0.5)[::-1]
    assert 900 < len(half) < 1100 and C.subsample(docs, 1.0) == docs
    assert set(d.relpath for d in C.subsample(docs, 0.2)) <= set(d.relpath for d in half)
