"""Remote adapters of the round's interfaces (`ports.py`): the GPU workers over gRPC, the memory
over REST, the planner as Celery tasks.

Every gRPC call carries a deadline (the deployment's timeout; health checks a few seconds). A
worker that dies mid-call, refuses a build or overruns the deadline is an exception with one line
naming the worker and the call — RuntimeError (ValueError for a refused request) — never a hang.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import grpc

from specpilot.devices import device_list
from specpilot.rpc import CHANNEL_OPTIONS, patch_chunks, profile_json, request_message
from specpilot.systemspec import SystemSpec
from specpilot.v1 import gpu_worker_pb2 as pb
from specpilot.v1 import gpu_worker_pb2_grpc as pb_grpc

HEALTH_TIMEOUT = 5.0


def rpc_error(address: str, what: str, e: grpc.RpcError) -> Exception:
    code = e.code() if hasattr(e, "code") else None
    name = code.name if code else "UNKNOWN"
    msg = f"gpu worker {address}: {what} failed ({name}: {e.details() if hasattr(e, 'details') else e})"
    if code == grpc.StatusCode.UNAVAILABLE:
        msg += " — the worker is down or unreachable"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        msg += " — no answer within the deadline"
    return ValueError(msg) if code == grpc.StatusCode.INVALID_ARGUMENT else RuntimeError(msg)


class RemoteSystem:
    """A system built on a gRPC GPU worker; every call under `timeout` seconds."""

    def __init__(self, stub, address: str, system_id: str, timeout: float):
        self.stub, self.device, self.system_id, self.timeout = stub, address, system_id, timeout

    def _call(self, what: str, fn):
        try:
            return fn()
        except grpc.RpcError as e:
            raise rpc_error(self.device, what, e) from None

    def generate(self, requests: list[dict], batch: int = 1) -> tuple[list[list[int]], list[list[int]]]:
        req = pb.GenerateRequest(system_id=self.system_id, requests=[request_message(r) for r in requests],
                                 batch=batch)
        gens = self._call("generate", lambda: list(self.stub.Generate(req, timeout=self.timeout)))
        if len(gens) != len(requests):
            raise RuntimeError(f"gpu worker {self.device}: generate answered {len(gens)} of {len(requests)} requests")
        gens.sort(key=lambda g: g.index)
        return [list(g.token_ids) for g in gens], [list(g.prompt_ids) for g in gens]

    def score(self, prompt_ids, tokens) -> SimpleNamespace:
        req = pb.ScoreRequest(system_id=self.system_id,
                              sequences=[pb.ScoreSequence(prompt_token_ids=list(prompt_ids), token_ids=list(tokens))])
        (s,) = self._call("score", lambda: list(self.stub.Score(req, timeout=self.timeout)))
        return SimpleNamespace(argmax_token_ids=list(s.argmax_token_ids), token_logprob=list(s.token_logprob),
                               argmax_logprob=list(s.argmax_logprob))

    def profile(self, spec: dict) -> dict:
        req = pb.ProfileRequest(system_id=self.system_id, requests=[request_message(r) for r in spec["requests"]],
                                new_tokens=int(spec["new_tokens"]), budgets=list(spec.get("budgets", [])),
                                replay=list(spec.get("replay", [])), batch=int(spec.get("batch", 1)))
        return profile_json(self._call("profile", lambda: self.stub.Profile(req, timeout=self.timeout)))

    def close(self) -> None:
        try:
            self.stub.Release(pb.ReleaseRequest(system_id=self.system_id), timeout=HEALTH_TIMEOUT)
        except grpc.RpcError:
            pass  # a worker that is gone has released it already


class GrpcWorkers:
    """The GPU workers at `addresses` (host:port), one device each."""

    kind = "grpc"

    def __init__(self, addresses: list[str]):
        self.addresses = list(addresses)
        self.channels = {a: grpc.insecure_channel(a, options=CHANNEL_OPTIONS) for a in self.addresses}
        self.stubs = {a: pb_grpc.GpuWorkerStub(c) for a, c in self.channels.items()}

    def health(self) -> list[dict]:
        out = []
        for a in self.addresses:
            try:
                h = self.stubs[a].Health(pb.HealthRequest(), timeout=HEALTH_TIMEOUT)
                out.append({"address": a, "device": h.device, "kind": h.kind, "healthy": bool(h.ok),
                            "detail": h.detail, "systems": h.systems, "pid": h.pid})
            except grpc.RpcError as e:
                out.append({"address": a, "device": None, "kind": None, "healthy": False,
                            "detail": str(rpc_error(a, "health", e)), "systems": 0, "pid": None})
        return out

    def devices(self, deployment: dict) -> list[str]:
        """As many healthy workers of the deployment's kind (`gpu`) as it names devices."""
        need, kind = len(device_list(deployment["devices"])), deployment["gpu"]
        health = self.health()
        ok = [h["address"] for h in health if h["healthy"] and h["kind"] == kind]
        if len(ok) < need:
            seen = ", ".join(f"{h['address']} ({h['kind'] or 'down'})" for h in health) or "none"
            raise RuntimeError(f"the deployment needs {need} healthy gpu worker(s) of kind {kind!r}; workers: {seen}. "
                               f"Start them, e.g. `specpilot stack up --workers {','.join([kind] * need)}`")
        return ok[:need]

    def start(self, system: SystemSpec, device: str, timeout: float) -> RemoteSystem:
        body = system.to_json()
        patch = body.pop("patch", "") or ""
        spec = pb.BuildSpec(system_json=json.dumps(body), base_rev=body.pop("base_rev", None) or "",
                            timeout_seconds=timeout)
        stub = self.stubs[device]
        try:
            # wait_for_ready: a worker restarting right now is waited for (within the deadline)
            reply = stub.Build(patch_chunks(spec, patch), timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as e:
            raise rpc_error(device, "build", e) from None
        return RemoteSystem(stub, device, reply.system_id, timeout)

    def code_tree(self, base_rev: str, patch: str) -> str:
        spec = pb.BuildSpec(base_rev=base_rev, code_tree_only=True, timeout_seconds=HEALTH_TIMEOUT)
        address = next((h["address"] for h in self.health() if h["healthy"]), None)
        if address is None:
            raise RuntimeError("no healthy gpu worker to name the system's code")
        try:
            return self.stubs[address].Build(patch_chunks(spec, patch), timeout=600.0).code_tree
        except grpc.RpcError as e:
            raise rpc_error(address, "build (code tree)", e) from None

    def close(self) -> None:
        for c in self.channels.values():
            c.close()


class RestMemory:
    """The memory API over REST (`services/memory_api/app.py`); its 4xx answers become ValueError
    with the API's own message, an unreachable API a RuntimeError."""

    def __init__(self, base_url: str, timeout: float = 600.0):
        import httpx

        self.base = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base, timeout=timeout)

    def _ask(self, method: str, path: str, **kw):
        import httpx

        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise RuntimeError(f"memory API {self.base}: {method} {path} failed ({e}); is it running?") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail")
            except ValueError:
                detail = r.text[:300]
            raise (ValueError if r.status_code < 500 else RuntimeError)(
                f"memory API: {method} {path}: {r.status_code} {detail}")
        return r.json()

    def entries(self) -> list[dict]:
        return self._ask("GET", "/entries")

    def port(self, deployment: dict) -> list[dict]:
        return self._ask("POST", "/port", json=deployment)["entries"]

    def get(self, ident: str, version: int | None = None) -> dict:
        return self._ask("GET", f"/entries/{ident}" + (f"/versions/{version}" if version is not None else ""))

    def versions(self, ident: str) -> list[int]:
        return self._ask("GET", f"/entries/{ident}/versions")["versions"]

    def graph_svg(self, ident: str) -> str:
        import httpx

        try:
            r = self.http.get(f"/entries/{ident}/graph.svg")
        except httpx.HTTPError as e:
            raise RuntimeError(f"memory API {self.base}: graph of {ident} failed ({e})") from None
        if r.status_code != 200:
            raise ValueError(f"memory API: graph of {ident}: {r.status_code}")
        return r.text

    def store(self, entry: dict, expected_tree: str | None) -> dict:
        import httpx

        params = {"expected_tree": expected_tree} if expected_tree else {}
        try:
            r = self.http.post("/entries", json=entry, params=params)
        except httpx.HTTPError as e:
            raise RuntimeError(f"memory API {self.base}: storing {entry.get('id')} failed ({e})") from None
        if r.status_code == 409:  # stored before (a resumed round): read it back
            return self.get(entry["id"], entry["version"])
        if r.status_code >= 400:
            raise ValueError(f"memory API: storing {entry.get('id')}: {r.status_code} {r.json().get('detail')}")
        return r.json()

    def close(self) -> None:
        self.http.close()


class CeleryPlanner:
    """The planner as Celery tasks on its queue; each call waits for its task's answer."""

    def __init__(self, app, timeout: float = 3600.0):
        from specpilot.queue import PLANNER_QUEUE

        self.app, self.queue, self.timeout = app, PLANNER_QUEUE, timeout

    def _run(self, name: str, *args):
        result = self.app.send_task(f"specpilot.planner.{name}", args=list(args), queue=self.queue)
        try:
            return result.get(timeout=self.timeout, disable_sync_subtasks=False)
        finally:
            result.forget()

    def analyze(self, measurement: dict, gpu: str) -> dict:
        return self._run("analyze", measurement, gpu)

    def propose(self, context: dict, agents: list[str], repo: str | None, base_rev: str | None,
                timeout: float) -> dict:
        return self._run("propose", context, agents, repo, base_rev, timeout)

    def report(self, summary: dict, folder: str) -> str:
        return self._run("report", summary, folder)


class CeleryQueue:
    """Queues a round record on `rounds.<kind>` and reports the queues' depth (Redis list lengths)."""

    def __init__(self, celery_app, redis_url: str):
        self.app, self.redis_url = celery_app, redis_url

    def submit(self, ident: str, kind: str) -> None:
        from specpilot.queue import ROUND_TASK, rounds_queue

        self.app.send_task(ROUND_TASK, args=[ident], queue=rounds_queue(kind))

    def depth(self, kinds: list[str]) -> dict[str, int]:
        import redis

        from specpilot.queue import PLANNER_QUEUE, rounds_queue

        names = [rounds_queue(k) for k in sorted(set(kinds))] + [PLANNER_QUEUE]
        try:
            client = redis.Redis.from_url(self.redis_url, socket_timeout=2)
            return {q: int(client.llen(q)) for q in names}
        except redis.RedisError:
            return {}
