"""The planner's Celery tasks (queue `planner`): the in-process planner behind the queue.

  celery -A specpilot.services.planner.tasks worker -Q planner --pool solo
"""

from __future__ import annotations

from specpilot.queue import make_celery

from .local import LocalPlanner

app = make_celery()


@app.task(name="specpilot.planner.analyze")
def analyze(measurement: dict, gpu: str) -> dict:
    return LocalPlanner().analyze(measurement, gpu)


@app.task(name="specpilot.planner.propose")
def propose(context: dict, agents: list[str], repo: str | None, base_rev: str | None, timeout: float) -> dict:
    return LocalPlanner().propose(context, agents, repo, base_rev, timeout)


@app.task(name="specpilot.planner.report")
def report(summary: dict, folder: str) -> str:
    return LocalPlanner().report(summary, folder)
