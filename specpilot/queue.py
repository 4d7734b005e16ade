"""The queues of the distributed mode (Celery over Redis): one queue of rounds per device kind
(`rounds.<kind>`: a round runs where workers of its deployment's kind are) and one for the planner.

Every task is acknowledged only once it has finished (`acks_late`), a worker takes one task at a
time (prefetch 1), and a task whose worker was lost is not acknowledged: a killed worker's round is
delivered again. The tasks are idempotent (keyed by the round's record and its steps), so running
one twice computes nothing twice.
"""

from __future__ import annotations

ROUND_TASK = "specpilot.controller.round"
PLANNER_QUEUE = "planner"
PLANNER_TASKS = ("analyze", "propose", "report")


def rounds_queue(kind: str) -> str:
    return f"rounds.{kind}"


def serve_metrics(port: int, host: str | None = None) -> None:
    """Count this worker's tasks (`specpilot_tasks_total{task,state}`, `specpilot_task_duration_seconds`)
    and serve them on `port` (the stack gives each Celery worker one: SPECPILOT_METRICS_PORT) at
    `host` (SPECPILOT_METRICS_HOST, default 127.0.0.1; a container serves them on 0.0.0.0)."""
    import os
    import time

    from celery.signals import task_postrun, task_prerun
    from prometheus_client import Counter, Histogram, start_http_server

    tasks = Counter("specpilot_tasks", "Celery tasks this worker finished, by task and state", ["task", "state"])
    seconds = Histogram("specpilot_task_duration_seconds", "Time a task ran on this worker", ["task"],
                        buckets=(0.1, 1, 10, 60, 300, 600, 1800, 3600))
    started: dict = {}

    @task_prerun.connect(weak=False)
    def _pre(task_id=None, **_):
        started[task_id] = time.perf_counter()

    @task_postrun.connect(weak=False)
    def _post(task_id=None, task=None, state=None, **_):
        seconds.labels(task.name).observe(time.perf_counter() - started.pop(task_id, time.perf_counter()))
        tasks.labels(task.name, state or "UNKNOWN").inc()

    start_http_server(port, addr=host or os.environ.get("SPECPILOT_METRICS_HOST") or "127.0.0.1")


def make_celery(redis_url: str | None = None):
    from celery import Celery

    from specpilot.settings import Settings

    url = redis_url or Settings.from_env().redis_url
    app = Celery("specpilot", broker=url, backend=url)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json", result_serializer="json", accept_content=["json"],
        result_expires=24 * 3600,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": 3600},  # a lost, unacknowledged task comes back
        worker_hijack_root_logger=False,
        task_default_queue=PLANNER_QUEUE,
    )
    import os

    from celery.signals import worker_ready

    if os.environ.get("SPECPILOT_METRICS_PORT"):
        worker_ready.connect(lambda **_: serve_metrics(int(os.environ["SPECPILOT_METRICS_PORT"])), weak=False)
    return app
