"""The real corpus: the running interpreter's standard-library Python source.

Files are read in sorted order and split into train / held-out *by module* (the
top-level package or file under the stdlib folder) with a stable sha256 hash of the
module name, so a module is never in both splits and the split never depends on the
machine, the process or the file system's listing order.
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

SKIP_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})


class Document(NamedTuple):
    module: str  # top-level module or package name, e.g. "json"
    relpath: str  # posix path under the stdlib folder, e.g. "json/decoder.py"
    text: str


@dataclass(frozen=True)
class Corpus:
    train: list[Document]
    heldout: list[Document]
    sha256: str  # over the split labels, paths and contents, in order
    python_version: str

    @property
    def heldout_modules(self) -> frozenset[str]:
        return frozenset(d.module for d in self.heldout)

    @property
    def train_modules(self) -> frozenset[str]:
        return frozenset(d.module for d in self.train)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_of(relpath: str) -> str:
    """Top-level module of a stdlib-relative posix path: "json/decoder.py" -> "json"."""
    first = relpath.split("/", 1)[0]
    return first[: -len(".py")] if first.endswith(".py") else first


def stdlib_files(root: Path | None = None) -> list[str]:
    """Sorted posix paths (relative to `root`, default the stdlib) of the corpus' `*.py` files.

    Skips SKIP_DIRS at any depth and top-level folders that are not importable names
    (e.g. "config-3.11-x86_64-linux-gnu"). Decoding is checked when reading.
    """
    root = stdlib_dir() if root is None else Path(root)
    out = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if SKIP_DIRS.intersection(parts[:-1]) or not path.is_file():
            continue
        if len(parts) > 1 and not parts[0].isidentifier():
            continue
        out.append("/".join(parts))
    return sorted(out)


def is_heldout(module: str, heldout_fraction: float = 0.1) -> bool:
    """Stable assignment: the first 8 bytes of sha256(module) as a fraction of 2**64."""
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction!r}")
    digest = hashlib.sha256(module.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < heldout_fraction


def split_modules(files: list[str], heldout_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """Split relative paths into (train, heldout) by module, keeping the given order."""
    train, heldout = [], []
    for rel in files:
        (heldout if is_heldout(module_of(rel), heldout_fraction) else train).append(rel)
    return train, heldout


def _read(root: Path, relpath: str) -> str | None:
    try:
        return (root / relpath).read_bytes().decode("utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def _documents(root: Path, relpaths: list[str], max_bytes: int | None) -> list[Document]:
    docs, total = [], 0
    for rel in relpaths:
        text = _read(root, rel)
        if text is None:
            continue
        if max_bytes is not None:
            size = len(text.encode("utf-8"))
            if total + size > max_bytes:
                continue
            total += size
        docs.append(Document(module_of(rel), rel, text))
    return docs


def corpus_hash(train: list[Document], heldout: list[Document]) -> str:
    h = hashlib.sha256()
    for label, docs in (("train", train), ("heldout", heldout)):
        for doc in docs:
            data = doc.text.encode("utf-8")
            h.update(f"{label}\0{doc.relpath}\0{len(data)}\0".encode("utf-8"))
            h.update(data)
    return h.hexdigest()


def load_corpus(
    heldout_fraction: float = 0.1, max_bytes: int | None = None, root: Path | None = None
) -> Corpus:
    """Read and split the corpus.

    max_bytes caps each split separately: documents are taken in sorted order, skipping
    any that would bring the split's total UTF-8 size above max_bytes.
    """
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0 or None, got {max_bytes!r}")
    root = stdlib_dir() if root is None else Path(root)
    train_files, heldout_files = split_modules(stdlib_files(root), heldout_fraction)
    train = _documents(root, train_files, max_bytes)
    heldout = _documents(root, heldout_files, max_bytes)
    return Corpus(train, heldout, corpus_hash(train, heldout), platform.python_version())
