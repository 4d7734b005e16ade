"""The import rules of docs/METHOD.md §2, checked on the source with `ast` (no project code is imported).

- engine/ imports no service; kernels/ imports neither the engine nor the services.
- The controller and the planner never import the engine, not even through another project
  module (checked transitively, parent packages' __init__ included).
- A service never imports another service's modules: they talk over gRPC, REST and the queue.
- The GPU worker (its gRPC server and the system processes it starts) loads, through any project
  module, no package that the GPU machine lacks (`GPU_MACHINE_LACKS`): it runs with torch, grpcio,
  protobuf and prometheus-client.
- Nothing outside `specpilot.entrypoints` imports it: the entrypoints (the CLI, the workers' mains,
  the composition root) sit on top of everything else.
- Nothing imports the top-level folders by their folder names (`engine`, `kernels`, `zoo`,
  `services`): those names do not exist in an installed wheel.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# import name -> folder, as in setup.py
ROOTS = {
    "specpilot": "specpilot",
    "specpilot.engine": "engine",
    "specpilot.kernels": "kernels",
    "specpilot.zoo": "zoo",
    "specpilot.services": "services",
}
FOLDER_NAMES = ("engine", "kernels", "zoo", "services")
SERVICES = ("controller", "planner", "gpu_worker", "memory_api", "engine_server")
GPU_MACHINE_LACKS = ("fastapi", "pydantic", "starlette", "sqlalchemy", "alembic", "celery", "kombu", "redis",
                     "httpx", "uvicorn", "psycopg")


@dataclass(frozen=True)
class Import:
    file: str  # path relative to the repo
    line: int
    text: str  # the import statement as written
    target: str  # absolute module name (or module.attribute for `from m import attr`)


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def project_modules(repo: Path) -> dict[str, Path]:
    """Every project module name -> its file (packages map to their __init__.py)."""
    modules = {}
    for name, folder in ROOTS.items():
        base = repo / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([name, *parts])] = path
    return modules


def imports_of(repo: Path, module: str, path: Path) -> list[Import]:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    lines = source.splitlines()
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    rel = str(path.relative_to(repo))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        else:
            continue
        text = lines[node.lineno - 1].strip()
        found += [Import(rel, node.lineno, text, t) for t in targets]
    return found


def resolve(target: str, modules: dict[str, Path]) -> list[str]:
    """Project modules that importing `target` loads: the module (or, for `from m import attr`,
    m) and all its parent packages."""
    name = target
    while name and name not in modules:
        name = name.rpartition(".")[0]
    loaded = []
    while name:
        if name in modules:
            loaded.append(name)
        name = name.rpartition(".")[0]
    return loaded


def check(repo: Path) -> list[str]:
    """All violations in the tree at `repo`, one readable line each."""
    modules = project_modules(repo)
    graph = {m: imports_of(repo, m, p) for m, p in modules.items()}
    problems = []

    def report(imp: Import, why: str) -> None:
        problems.append(f"{imp.file}:{imp.line}: `{imp.text}` — {why}")

    for module, imps in graph.items():
        for imp in imps:
            t = imp.target
            top = t.split(".")[0]
            if top in FOLDER_NAMES:
                report(imp, f"import `specpilot.{top}`, not the folder name `{top}` (it is not importable from a wheel)")
            if under(t, "specpilot.entrypoints") and not under(module, "specpilot.entrypoints"):
                report(imp, "only the entrypoints import specpilot.entrypoints (they sit on top; pass what is needed in)")
            if under(module, "specpilot.engine") and under(t, "specpilot.services"):
                report(imp, "engine/ must not import the services")
            if under(module, "specpilot.kernels") and (under(t, "specpilot.engine") or under(t, "specpilot.services")):
                report(imp, "kernels/ must import neither the engine nor the services")
            for svc in SERVICES:
                if not under(module, f"specpilot.services.{svc}"):
                    continue
                for other in SERVICES:
                    if other != svc and under(t, f"specpilot.services.{other}"):
                        report(imp, f"services/{svc} must not import services/{other}: use gRPC, REST or the queue")

    def reached(module: str) -> dict[str, tuple[str, Import] | None]:
        """Breadth-first over the import graph from `module`: every project module it loads, and
        how it was reached."""
        via: dict[str, tuple[str, Import] | None] = {module: None}
        for parent in resolve(module, modules)[1:]:
            via.setdefault(parent, None)
        queue = list(via)
        while queue:
            current = queue.pop(0)
            for imp in graph.get(current, []):
                for loaded in resolve(imp.target, modules):
                    if loaded not in via:
                        via[loaded] = (current, imp)
                        queue.append(loaded)
        return via

    def chain_to(via, hit: str, last: Import | None = None) -> str:
        chain, step = ([f"{last.file}:{last.line} `{last.text}`"] if last else []), via[hit]
        while step is not None:
            chain.append(f"{step[1].file}:{step[1].line} `{step[1].text}`")
            step = via[step[0]]
        return " -> ".join(reversed(chain))

    for module in graph:
        # Controller and planner never load the engine, directly or through other project modules.
        if under(module, "specpilot.services.controller") or under(module, "specpilot.services.planner"):
            via = reached(module)
            hit = next((m for m in via if under(m, "specpilot.engine")), None)
            if hit is not None:
                why = ("the controller and the planner must not import the engine (reach it through the GPU worker "
                       "interface)")
                problems.append(f"{modules[module].relative_to(repo)} loads {hit}: {chain_to(via, hit)} — {why}")
        # The GPU worker loads nothing the GPU machine lacks.
        if under(module, "specpilot.services.gpu_worker"):
            via = reached(module)
            for m in via:
                bad = next((imp for imp in graph.get(m, []) if imp.target.split(".")[0] in GPU_MACHINE_LACKS), None)
                if bad is not None:
                    why = f"the GPU worker must run without {bad.target.split('.')[0]} (the GPU machine lacks it)"
                    problems.append(f"{modules[module].relative_to(repo)} loads {bad.target.split('.')[0]}: "
                                    f"{chain_to(via, m, bad)} — {why}")
                    break
    return list(dict.fromkeys(problems))  # `from m import a, b` reports a line once


def test_repository_follows_the_import_rules():
    problems = check(REPO)
    assert not problems, "import rule violations:\n" + "\n".join(problems)


def _write(root: Path, rel: str, text: str = "") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_checker_reports_each_kind_of_violation(tmp_path):
    for pkg in ["specpilot", "engine", "kernels", "zoo", "services"] + [f"services/{s}" for s in SERVICES]:
        _write(tmp_path, f"{pkg}/__init__.py")
    _write(tmp_path, "engine/bad.py", "from specpilot.services.controller import verdict\n")
    _write(tmp_path, "engine/ok.py", "from . import bad\nimport torch\n")
    _write(tmp_path, "kernels/bad.py", "import os\nfrom ..engine import ok\n")
    _write(tmp_path, "services/planner/bad.py", "from specpilot.services.memory_api.store import Entry\n")
    _write(tmp_path, "services/memory_api/store.py", "from kernels import gemm\n")
    _write(tmp_path, "specpilot/shared.py", "def f():\n    import specpilot.engine.ok\n")
    _write(tmp_path, "services/controller/verdict.py", "from specpilot import shared\nfrom .stats import x\n")
    _write(tmp_path, "services/controller/runner.py", "from specpilot.entrypoints import bootstrap\n")

    problems = check(tmp_path)
    text = "\n".join(problems)
    assert ("services/controller/runner.py:1: `from specpilot.entrypoints import bootstrap` — only the entrypoints "
            "import specpilot.entrypoints") in text
    assert "engine/bad.py:1: `from specpilot.services.controller import verdict` — engine/ must not import the services" in text
    assert "kernels/bad.py:2: `from ..engine import ok` — kernels/ must import neither" in text
    assert "services/planner/bad.py:1:" in text and "must not import services/memory_api" in text
    assert "services/memory_api/store.py:1: `from kernels import gemm` — import `specpilot.kernels`" in text
    # transitive: controller -> specpilot.shared -> specpilot.engine.ok
    assert (
        "services/controller/verdict.py loads specpilot.engine.ok: services/controller/verdict.py:1 "
        "`from specpilot import shared` -> specpilot/shared.py:2 `import specpilot.engine.ok`" in text
    )
    assert not any(p.startswith("engine/ok.py") for p in problems)
    assert len(problems) == 6, text


def test_checker_sees_a_package_the_gpu_machine_lacks_in_the_worker(tmp_path):
    for pkg in ["specpilot", "services", "services/gpu_worker"]:
        _write(tmp_path, f"{pkg}/__init__.py")
    _write(tmp_path, "specpilot/settings.py", "import pydantic\n")
    _write(tmp_path, "services/gpu_worker/server.py", "import grpc\nfrom specpilot import settings\n")
    problems = check(tmp_path)
    assert any(p.startswith("services/gpu_worker/server.py loads pydantic: services/gpu_worker/server.py:2 "
                            "`from specpilot import settings` -> specpilot/settings.py:1 `import pydantic`")
               for p in problems), problems


def test_checker_sees_an_engine_import_in_a_parent_package(tmp_path):
    for pkg in ["specpilot", "services", "services/planner"]:
        _write(tmp_path, f"{pkg}/__init__.py")
    _write(tmp_path, "engine/__init__.py")
    _write(tmp_path, "services/__init__.py", "from specpilot.engine import *\n")
    _write(tmp_path, "services/planner/cost.py", "import math\n")
    problems = check(tmp_path)
    assert any(p.startswith("services/planner/cost.py loads specpilot.engine") for p in problems), problems
