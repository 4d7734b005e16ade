"""specpilot.zoo.corpus: the stdlib corpus, its file filter, the by-module split and its hash."""

from __future__ import annotations

import platform

import pytest

from specpilot.zoo import corpus


@pytest.fixture(scope="module")
def real():
    return corpus.load_corpus()


def test_stdlib_files_sorted_and_filtered():
    files = corpus.stdlib_files()
    assert len(files) > 100
    assert files == sorted(files)
    assert all(f.endswith(".py") for f in files)
    for f in files:
        assert not corpus.SKIP_DIRS.intersection(f.split("/")[:-1]), f
    assert "json/decoder.py" in files and "os.py" in files


def test_filter_on_a_fake_tree(tmp_path):
    keep = ["a.py", "pkg/__init__.py", "pkg/sub/m.py", "z.py"]
    drop = [
        "test/t.py", "tests/t.py", "site-packages/x/y.py", "idlelib/i.py", "lib2to3/l.py",
        "pkg/test/t.py", "pkg/__pycache__/c.py", "config-3.11-x86_64/python-config.py", "notes.txt",
    ]
    for rel in keep + drop:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"# {rel}\n", encoding="utf-8")
    (tmp_path / "latin1.py").write_bytes(b"# caf\xe9\n")  # not UTF-8: listed, but not read
    assert corpus.stdlib_files(tmp_path) == sorted(keep + ["latin1.py"])
    c = corpus.load_corpus(heldout_fraction=0.0, root=tmp_path)
    assert c.heldout == []
    assert [d.relpath for d in c.train] == sorted(keep)
    assert [d.module for d in c.train] == ["a", "pkg", "pkg", "z"]
    assert c.train[0].text == "# a.py\n"


def test_module_of():
    assert corpus.module_of("json/decoder.py") == "json"
    assert corpus.module_of("os.py") == "os"
    assert corpus.module_of("xml/etree/ElementTree.py") == "xml"


def test_split_is_by_module_and_deterministic():
    files = corpus.stdlib_files()
    train, heldout = corpus.split_modules(files, 0.1)
    assert sorted(train + heldout) == files
    train_mods = {corpus.module_of(f) for f in train}
    heldout_mods = {corpus.module_of(f) for f in heldout}
    assert train_mods and heldout_mods and not train_mods & heldout_mods
    assert corpus.split_modules(list(files), 0.1) == (train, heldout)
    # pinned: the split is a function of the module name only (sha256), never of the machine
    assert {"json", "inspect", "logging"} <= heldout_mods
    assert {"os", "re", "typing"} <= train_mods
    # a larger fraction only moves modules into held-out
    _, more = corpus.split_modules(files, 0.3)
    assert set(heldout) <= set(more)


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 2])
def test_bad_fraction(fraction):
    with pytest.raises(ValueError, match="heldout_fraction"):
        corpus.split_modules(["os.py"], fraction)


def test_load_corpus(real):
    assert real.train and real.heldout
    assert not real.train_modules & real.heldout_modules
    assert real.python_version == platform.python_version()
    for docs in (real.train, real.heldout):
        assert [d.relpath for d in docs] == sorted(d.relpath for d in docs)
    doc = next(d for d in real.heldout if d.relpath == "json/decoder.py")
    assert doc.module == "json" and "class JSONDecoder" in doc.text
    assert len(real.sha256) == 64


def test_hash_stable_across_loads(real):
    again = corpus.load_corpus()
    assert again.sha256 == real.sha256
    assert again == real


def test_max_bytes_caps_each_split(real):
    small = corpus.load_corpus(max_bytes=200_000)
    for docs in (small.train, small.heldout):
        assert 0 < sum(len(d.text.encode("utf-8")) for d in docs) <= 200_000
    assert {d.relpath for d in small.train} <= {d.relpath for d in real.train}
    assert small.sha256 != real.sha256
    assert corpus.load_corpus(max_bytes=200_000).sha256 == small.sha256
