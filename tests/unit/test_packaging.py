"""The `specpilot` distribution: the folders engine/ kernels/ zoo/ services/ import as
specpilot.engine, ... from a built wheel and from the editable install; no top-level
`engine`, `kernels`, `zoo` or `services` is shipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = {  # import name -> folder, as in setup.py
    "specpilot": "specpilot",
    "specpilot.engine": "engine",
    "specpilot.kernels": "kernels",
    "specpilot.zoo": "zoo",
    "specpilot.services": "services",
}
MODULES = ["specpilot", "specpilot.engine", "specpilot.kernels", "specpilot.zoo", "specpilot.services",
           "specpilot.services.controller"]
FOLDER_NAMES = ["engine", "kernels", "zoo", "services"]
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", ".hypothesis", "out", ".whl")

# Imports the modules and prints where each came from, and whether the given folder holds a
# top-level module named like one of our folders.
PROBE = """
import importlib, importlib.machinery, json, sys
where = sys.argv[1]
files = {m: importlib.import_module(m).__file__ for m in sys.argv[2].split(",")}
top = {n: importlib.machinery.PathFinder.find_spec(n, [where]) is not None for n in sys.argv[3].split(",")}
print(json.dumps({"files": files, "top_level": top}))
"""


def probe(cwd: Path, where: str, env: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, where, ",".join(MODULES), ",".join(FOLDER_NAMES)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"import failed:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shipped_sources() -> dict[str, Path]:
    """Files the wheel must hold (path inside the wheel -> source): the .py files of every
    package under the mapped folders, and everything under zoo/checkpoints and zoo/data."""
    expected = {}
    for name, folder in ROOTS.items():
        base = REPO / folder
        for path in base.rglob("*.py") if base.is_dir() else []:
            rel = path.relative_to(base)
            dirs = [base.joinpath(*rel.parts[:i]) for i in range(len(rel.parts))]
            if "__pycache__" in rel.parts or not all((d / "__init__.py").is_file() for d in dirs):
                continue
            expected["/".join([*name.split("."), *rel.parts])] = path
    for data in ("checkpoints", "data"):
        for path in (REPO / "zoo" / data).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                expected["specpilot/zoo/" + path.relative_to(REPO / "zoo").as_posix()] = path
    return expected


@pytest.mark.slow
def test_wheel_imports_the_mapped_packages(tmp_path):
    src, dist, site, elsewhere = (tmp_path / d for d in ("src", "dist", "site", "elsewhere"))
    shutil.copytree(REPO, src, ignore=NOT_COPIED)  # build a copy: no build/ or egg-info in the repo
    elsewhere.mkdir()

    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)],
                           capture_output=True, text=True, timeout=180)
    assert build.returncode == 0, f"wheel build failed:\n{build.stdout[-4000:]}\n{build.stderr[-4000:]}"
    [wheel] = dist.glob("specpilot-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        requires = [line for line in zf.read(f"{dist_info}/METADATA").decode().splitlines()
                    if line.startswith("Requires-Dist: torch")]
    assert {n.split("/")[0] for n in names} == {"specpilot", dist_info}, "wheel ships something besides specpilot/"
    missing = sorted(set(shipped_sources()) - names)
    assert not missing, f"files missing from the wheel: {missing[:20]}"
    assert "specpilot = specpilot.entrypoints.cli:main" in entry_points
    assert requires and all("+" not in r for r in requires), f"torch requirement: {requires}"

    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                              "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=180)
    assert install.returncode == 0, install.stderr

    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONSAFEPATH", None)
    result = probe(elsewhere, str(site), env)
    for module, file in result["files"].items():
        assert Path(file).resolve().is_relative_to(site.resolve()), f"{module} imported from {file}, not the wheel"
    assert not any(result["top_level"].values()), f"top-level modules in the wheel: {result['top_level']}"
    for name in FOLDER_NAMES:
        assert not (site / name).exists()


def test_editable_install_imports_the_source_folders(tmp_path):
    # A specpilot.egg-info left in the repo by the build also counts as a distribution: look for
    # the installed one, which records how it was installed in direct_url.json.
    urls = [json.loads(d.read_text("direct_url.json") or "{}") for d in metadata.distributions(name="specpilot")]
    editable = [u["url"] for u in urls if u.get("dir_info", {}).get("editable")]
    if not any(Path(url.removeprefix("file://")).resolve() == REPO for url in editable):
        pytest.skip(f"specpilot is not installed editable from {REPO} (run `make test`)")

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    result = probe(tmp_path, str(tmp_path), env)
    for module, file in result["files"].items():
        folder = ROOTS.get(module) or ROOTS[module.rsplit(".", 1)[0]] + "/" + module.rsplit(".", 1)[1]
        assert Path(file).resolve() == REPO / folder / "__init__.py", f"{module} imported from {file}"
    assert (Path(sys.executable).parent / "specpilot").exists(), "console script `specpilot` not installed"
