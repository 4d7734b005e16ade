"""Running a queued round record to its final state, against the ports a runner connects to (the
rounds worker, `specpilot.entrypoints.rounds_worker`, connects the remote adapters).

`execute` is idempotent: a record already final is left alone, one another runner holds a valid
lease on is left to it, and a resumed record reads back every step its round already saved (the
profile, the baseline, each sealed verdict). A runner renews its lease while it works; `sweep`
queues again every record whose runner stopped renewing (it was killed), every `SWEEP` seconds.
"""

from __future__ import annotations

import os
import socket
import threading
import traceback
import uuid
from pathlib import Path

from .records import Heartbeat, RecordState, Records
from .round import Cancelled, run_deployment

LEASE = 15.0  # seconds a runner's claim lasts without renewal
SWEEP = 5.0
REQUEUE_HOLD = 600.0  # a record queued again is not queued again for this long


def execute(records: Records, ident: str, repo, connect) -> str:
    """Run the record's rounds to a final state (or leave it to its live runner); its state.
    `connect()` gives the ports, called only when the record is run (they are closed after)."""
    rec = records.find(ident)
    if rec is None or rec["state"] in ("done", "failed", "cancelled"):
        return rec["state"] if rec else "unknown"
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    if not records.claim(ident, owner, LEASE):
        return "running elsewhere"
    beat, ports = Heartbeat(records, ident, owner, LEASE), None
    try:
        if records.cancel_requested(ident):
            raise Cancelled("cancelled before it started")
        records.set_state(ident, "running")
        records.event(ident, "state", {"state": "running", "runner": owner})
        ports = connect()
        run_deployment(rec["deployment"], Path(rec["run_dir"]), ports, RecordState(records, ident), rec["rounds"],
                       agents=rec["agents"], repo=repo, log=None, progress=False,
                       emit=lambda kind, data: records.event(ident, kind, data),
                       cancelled=lambda: records.cancel_requested(ident))
        state, error = "done", None
    except Cancelled:
        state, error = "cancelled", None
    except Exception as e:  # noqa: BLE001 — any failure ends the record with its one-line reason
        traceback.print_exc()
        state, error = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        beat.stop()
        if ports is not None:
            ports.workers.close()
            ports.memory.close()
    records.set_state(ident, state, error)
    records.event(ident, "state", {"state": state, "error": error})
    records.release(ident, owner)
    return state


def requeue_stale(records: Records, queue) -> list[str]:
    """Queue again every record whose runner died (its lease ran out while running)."""
    out = []
    for ident in records.stale():
        if records.requeued(ident, REQUEUE_HOLD):  # one sweeper wins; the others see it held
            queue.submit(ident, records.get(ident)["deployment"]["gpu"])
            records.event(ident, "state", {"state": "running", "requeued": "its runner stopped renewing its lease"})
            out.append(ident)
    return out


def sweep(records_url: str, queue) -> None:
    """Requeue stale records every `SWEEP` seconds, for ever (a runner's background thread)."""
    records = Records(records_url)
    while True:
        try:
            requeue_stale(records, queue)
        except Exception:  # noqa: BLE001 — the database may be briefly away; try again
            traceback.print_exc()
        threading.Event().wait(SWEEP)
