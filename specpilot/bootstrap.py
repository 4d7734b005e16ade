"""The composition root: which adapter serves each of the round's interfaces.

- `embedded(...)`: everything in this process tree (the default: `specpilot demo`, `specpilot
  round`, the tests): systems in local processes (`gpu_worker.systems.LocalWorkers`), the memory
  store in-process (SQLite), the planner in-process.
- `distributed(settings)`: the GPU workers over gRPC, the memory API over REST, the planner as
  Celery tasks (the controller's round task and its REST API use this).

This module (with the CLI) is the one place that may import every service.
"""

from __future__ import annotations

from pathlib import Path

from specpilot import gitrun
from specpilot.services.controller.ports import Ports


def find_repo() -> Path | None:
    """The git checkout this package runs from, if any (editable installs)."""
    here = Path(__file__).resolve().parent.parent
    try:
        return Path(gitrun.run(here, "rev-parse", "--show-toplevel", check=True).stdout.strip())
    except (gitrun.GitFailed, FileNotFoundError):
        return None


def stock_rev(repo: Path | None) -> str | None:
    return gitrun.run(repo, "rev-parse", "HEAD", check=True).stdout.strip() if repo else None


def embedded(memory_url: str, repo: Path | None = None, planner=None) -> Ports:
    """Local processes for the systems, the memory store at `memory_url` and the planner in-process
    (`planner` replaces it, e.g. one with agent objects given directly)."""
    from specpilot.services.gpu_worker.systems import LocalWorkers
    from specpilot.services.memory_api.local import LocalMemory
    from specpilot.services.planner.local import LocalPlanner

    return Ports(workers=LocalWorkers(repo), memory=LocalMemory(memory_url, repo, stock_rev(repo)),
                 planner=planner or LocalPlanner())


def distributed(settings, celery_app=None) -> Ports:
    """The remote adapters, at the addresses `settings` (`specpilot.settings.Settings`) names."""
    from specpilot.queue import make_celery
    from specpilot.services.controller.remote import CeleryPlanner, GrpcWorkers, RestMemory

    return Ports(workers=GrpcWorkers(list(settings.workers)), memory=RestMemory(settings.memory_url),
                 planner=CeleryPlanner(celery_app or make_celery(settings.redis_url)))
