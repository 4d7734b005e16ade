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
    here = Path(__file__).resolve().parents[2]
    try:
        return Path(gitrun.run(here, "rev-parse", "--show-toplevel", check=True).stdout.strip())
    except (gitrun.GitFailed, FileNotFoundError):
        return None


def stock_rev(repo: Path | None) -> str | None:
    return gitrun.run(repo, "rev-parse", "HEAD", check=True).stdout.strip() if repo else None


def local_workers(repo: Path | None = None):
    """Systems in processes of this machine (one per device), for paired runs outside a round."""
    from specpilot.services.gpu_worker.systems import LocalWorkers

    return LocalWorkers(repo)


def seed_memory(memory_url: str) -> None:
    """Open (migrate) the memory store at `memory_url`, seeding it when it is empty."""
    from specpilot.services.memory_api.local import LocalMemory

    LocalMemory(memory_url).close()


def embedded(memory_url: str, repo: Path | None = None, planner=None) -> Ports:
    """Local processes for the systems, the memory store at `memory_url` and the planner in-process
    (`planner` replaces it, e.g. one with agent objects given directly)."""
    from specpilot.services.memory_api.local import LocalMemory
    from specpilot.services.planner.local import LocalPlanner

    return Ports(workers=local_workers(repo), memory=LocalMemory(memory_url, repo, stock_rev(repo)),
                 planner=planner or LocalPlanner())


def distributed(settings, celery_app=None) -> Ports:
    """The remote adapters, at the addresses `settings` (`specpilot.settings.Settings`) names."""
    from specpilot.queue import make_celery
    from specpilot.services.controller.remote import CeleryPlanner, GrpcWorkers, RestMemory

    return Ports(workers=GrpcWorkers(list(settings.workers)), memory=RestMemory(settings.memory_url),
                 planner=CeleryPlanner(celery_app or make_celery(settings.redis_url)))


def controller_app(settings, token: str):
    """The controller's REST app over the round records, the rounds queue, the GPU workers and the
    memory API that `settings` names."""
    from specpilot.queue import make_celery
    from specpilot.services.controller.app import create_app
    from specpilot.services.controller.records import Records
    from specpilot.services.controller.remote import CeleryQueue, GrpcWorkers, RestMemory

    return create_app(Records(settings.records_url), CeleryQueue(make_celery(settings.redis_url), settings.redis_url),
                      GrpcWorkers(list(settings.workers)), RestMemory(settings.memory_url), settings.data_dir, token)
