"""The one thread that owns the engine. HTTP handlers `submit` requests and wait on their
futures; the thread takes up to `max_batch` waiting requests at a time and decodes them in one
engine call (`Engine.generate_batch`, which batches continuously within the list it is given;
`Engine.generate` when max_batch is 1). Requests that arrive during a call wait for the next.

An exception inside the engine fails only the requests it hit: when a call of several requests
raises, each of them is decoded again alone, and only those that raise again fail. The thread
itself never dies of one."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass


class EngineFailure(RuntimeError):
    """The engine raised while decoding this request (the message is one line)."""


class Unavailable(RuntimeError):
    """The server is shutting down and no longer decodes."""


@dataclass(frozen=True)
class Served:
    result: object  # the engine's Result: tokens, steps, tau_mean
    batch: int  # requests in the engine call that decoded it


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class Batcher:
    def __init__(self, engine, max_batch: int = 1):
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise ValueError(f"max_batch {max_batch!r}: expected a positive integer")
        self.engine = engine
        self.max_batch = max_batch
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._stats = {"calls": 0, "requests": 0, "largest_batch": 0, "failed_calls": 0}
        self._thread = threading.Thread(target=self._loop, name="engine-decode", daemon=True)
        self._thread.start()

    # -------------------------------------------------------------------- the handlers' side
    def submit(self, request) -> Future:
        """Queue one engine request (`zoo.workloads.Request`); its future gets a `Served`, or an
        `EngineFailure` / `Unavailable`."""
        fut: Future = Future()
        with self._lock:
            if self._closed:
                fut.set_exception(Unavailable("the server is shutting down"))
            else:
                self._queue.put((request, fut))
        return fut

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    def waiting(self) -> int:
        """Requests queued and not yet taken by the thread."""
        return self._queue.qsize()

    def stats(self) -> dict:
        """Engine calls so far, requests decoded, the most requests one call decoded, calls that raised."""
        with self._lock:
            return dict(self._stats)

    def close(self, timeout: float | None = None) -> None:
        """Take no more requests, finish those queued, and stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout)
        while True:  # left over only when the thread did not finish in time
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None and item[1].set_running_or_notify_cancel():
                item[1].set_exception(Unavailable("the server is shutting down"))

    # -------------------------------------------------------------------- the decode thread
    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            items, last = [item], False
            while len(items) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    last = True
                    break
                items.append(nxt)
            live = [(r, f) for r, f in items if f.set_running_or_notify_cancel()]  # skip the cancelled
            try:
                if live:
                    self._serve(live)
            except BaseException as e:  # a last resort: nothing that happens in a call ends the thread
                for _, f in live:
                    if not f.done():
                        f.set_exception(EngineFailure(f"the server failed on this request: {one_line(e)}"))
            if last:
                return

    def _decode(self, requests: list) -> list:
        if self.max_batch > 1:
            return self.engine.generate_batch(requests, self.max_batch)
        return [self.engine.generate(r) for r in requests]

    def _count(self, n: int, failed: bool = False) -> None:
        with self._lock:
            self._stats["calls"] += 1
            if failed:
                self._stats["failed_calls"] += 1
            else:
                self._stats["requests"] += n
                self._stats["largest_batch"] = max(self._stats["largest_batch"], n)

    def _serve(self, live: list) -> None:
        try:
            results = self._decode([r for r, _ in live])
        except Exception as e:
            self._count(len(live), failed=True)
            if len(live) == 1:
                live[0][1].set_exception(EngineFailure(f"the engine failed on request {live[0][0].id!r}: "
                                                       f"{one_line(e)}"))
                return
            for r, f in live:  # which request did it hit? each alone, and only those fail
                try:
                    (res,) = self._decode([r])
                except Exception as e1:
                    self._count(1, failed=True)
                    f.set_exception(EngineFailure(f"the engine failed on request {r.id!r}: {one_line(e1)}"))
                else:
                    self._count(1)
                    f.set_result(Served(res, 1))
            return
        self._count(len(live))
        for (_, f), res in zip(live, results, strict=True):
            f.set_result(Served(res, len(live)))
