"""The rounds worker: the Celery app that runs queued round records (queue `rounds.<kind>`) against
the remote adapters (gRPC GPU workers, the memory API, the planner's tasks).

  celery -A specpilot.entrypoints.rounds_worker worker -Q rounds.cpu --pool solo

When it starts it sweeps, in a background thread, for records whose runner died (see
`specpilot.services.controller.runner`).
"""

from __future__ import annotations

import threading

from celery.signals import worker_ready

from specpilot.entrypoints import bootstrap
from specpilot.queue import ROUND_TASK, make_celery
from specpilot.services.controller.records import Records
from specpilot.services.controller.remote import CeleryQueue
from specpilot.services.controller.runner import execute, sweep
from specpilot.settings import Settings

app = make_celery()


@app.task(name=ROUND_TASK)
def run_round(ident: str) -> str:
    settings = Settings.from_env()
    records = Records(settings.records_url)
    try:
        return execute(records, ident, settings.repo, lambda: bootstrap.distributed(settings, app))
    finally:
        records.close()


@worker_ready.connect
def _sweep(**_) -> None:
    settings = Settings.from_env()
    queue = CeleryQueue(app, settings.redis_url)
    threading.Thread(target=sweep, args=(settings.records_url, queue), daemon=True, name="specpilot-requeue").start()
