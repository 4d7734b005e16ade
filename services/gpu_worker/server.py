"""The GPU worker over gRPC: `GpuWorker` (proto/specpilot/v1/gpu_worker.proto) for one device, with
the standard health service (grpc.health.v1), server reflection (grpc.reflection.v1) and
Prometheus metrics.

  python -m specpilot.services.gpu_worker.server --device cpu:0 --kind cpu [--port 0] [--metrics-port 0]

A thin wiring of `systems.LocalWorkers`: each Build starts the system in a process of its own
(`local.py`) under the hard timeout the caller gives; Generate / Profile / Score forward to it;
Release (or `idle` seconds unused, or the caller going away mid-call) stops it. Errors are status
codes with a one-line message: a refused build → INVALID_ARGUMENT, an unknown system → NOT_FOUND,
a system that died or overran its timeout → ABORTED. It prints one JSON line
{"address", "metrics", "pid"} once it serves.

Imports only the standard library, grpcio, protobuf, prometheus-client and this service (a test
checks it with the other packages blocked): it runs on GPU machines that have nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import threading
import time
import uuid
from concurrent import futures

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from specpilot.rpc import CHANNEL_OPTIONS, profile_message, request_json
from specpilot.systemspec import parse_system
from specpilot.v1 import gpu_worker_pb2 as pb
from specpilot.v1 import gpu_worker_pb2_grpc as pb_grpc
from specpilot.v1 import health_pb2, health_pb2_grpc, reflection_pb2, reflection_pb2_grpc

from .build import BuildError
from .systems import LocalWorkers

SERVICE = "specpilot.v1.GpuWorker"

CALLS = Counter("specpilot_gpu_worker_calls_total", "GpuWorker calls served, by method and status code",
                ["method", "code"])
SECONDS = Histogram("specpilot_gpu_worker_call_seconds", "Time serving a GpuWorker call, by method (the "
                    "worker's clock; verdicts use the controller's)", ["method"],
                    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600))
SYSTEMS = Gauge("specpilot_gpu_worker_systems", "Built systems whose process is running")
UP = Gauge("specpilot_gpu_worker_up", "1 while the worker serves", ["device", "kind"])
STEPS = Counter("specpilot_verify_steps_total", "Target passes of the systems' generations (one per request per step)")
ACCEPTED = Counter("specpilot_accepted_tokens_per_position_total", "Drafted tokens accepted, by position in the draft "
                   "(1 = the first drafted token); over specpilot_verify_steps_total: acceptance per position",
                   ["position"])


class GpuWorkerServicer(pb_grpc.GpuWorkerServicer):
    def __init__(self, workers: LocalWorkers, device: str, kind: str, idle: float = 900.0):
        self.workers, self.device, self.kind, self.idle = workers, device, kind, idle
        self.systems: dict[str, tuple] = {}  # id -> (SystemProcess, last use)
        self.lock = threading.Lock()
        self.detail = device_detail(device)

    # ------------------------------------------------------------------ helpers
    def _get(self, system_id: str, context):
        with self.lock:
            found = self.systems.get(system_id)
            if found:
                self.systems[system_id] = (found[0], time.monotonic())
        if not found:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no system {system_id!r} on this worker (released, or the "
                          "worker restarted): build it again")
        return found[0]

    def release(self, system_id: str) -> None:
        with self.lock:
            found = self.systems.pop(system_id, None)
            SYSTEMS.set(len(self.systems))
        if found:
            found[0].close()

    def reap(self) -> None:
        """Release systems unused for `idle` seconds (their caller went away between calls)."""
        now = time.monotonic()
        with self.lock:
            stale = [k for k, (_, used) in self.systems.items() if now - used > self.idle]
        for k in stale:
            self.release(k)

    def _serve(self, method: str, context, fn, system_id: str = ""):
        """Run `fn()`, mapping the domain's errors to status codes; a caller that goes away
        mid-call releases the system (its process stops)."""
        t0 = time.perf_counter()
        code, finished = "OK", threading.Event()
        if system_id:  # runs when the call ends: before `fn` returned only if the caller went away
            context.add_callback(lambda: finished.is_set() or self.release(system_id))
        try:
            return fn()
        except BuildError as e:
            code = "INVALID_ARGUMENT"
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except ValueError as e:
            code = "INVALID_ARGUMENT"
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except RuntimeError as e:  # the system's process died or overran its timeout
            code = "ABORTED"
            if system_id:
                self.release(system_id)
            context.abort(grpc.StatusCode.ABORTED, str(e))
        finally:
            finished.set()
            CALLS.labels(method, code).inc()
            SECONDS.labels(method).observe(time.perf_counter() - t0)

    # ------------------------------------------------------------------ rpcs
    def Build(self, request_iterator, context):
        chunks = iter(request_iterator)
        first = next(chunks, None)
        if first is None or first.WhichOneof("part") != "spec":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Build: the first message must carry the spec")
        spec = first.spec
        patch = b"".join(c.patch for c in chunks).decode("utf-8", "replace")

        def build():
            if spec.code_tree_only:
                return pb.BuildResponse(code_tree=self.workers.code_tree(spec.base_rev, patch), device=self.device)
            try:
                body = json.loads(spec.system_json)
            except json.JSONDecodeError as e:
                raise ValueError(f"Build: system_json is not JSON ({e})") from None
            if spec.timeout_seconds <= 0:
                raise ValueError("Build: timeout_seconds must be positive")
            if isinstance(body, dict) and "engine" in body:
                body = {**body, "patch": patch, "base_rev": spec.base_rev or None}
            elif patch.strip():
                raise ValueError("Build: a server system carries no patch")
            proc = self.workers.start(parse_system(body, "Build: system_json"), self.device, spec.timeout_seconds)
            system_id = uuid.uuid4().hex
            with self.lock:
                self.systems[system_id] = (proc, time.monotonic())
                SYSTEMS.set(len(self.systems))
            return pb.BuildResponse(system_id=system_id, device=self.device)

        return self._serve("Build", context, build)

    def Generate(self, request, context):
        system = self._get(request.system_id, context)
        outputs, prompt_ids = self._serve("Generate", context,
                                          lambda: system.generate([request_json(r) for r in request.requests],
                                                                  max(1, request.batch)),
                                          request.system_id)
        seen = getattr(system, "acceptance", None) or {"steps": 0, "accepted": []}
        STEPS.inc(seen["steps"])
        for pos, n in enumerate(seen["accepted"], 1):
            ACCEPTED.labels(position=str(pos)).inc(n)
        for i, (out, ids) in enumerate(zip(outputs, prompt_ids)):
            yield pb.Generation(index=i, token_ids=out, prompt_ids=ids)

    def Profile(self, request, context):
        system = self._get(request.system_id, context)
        spec = {"requests": [request_json(r) for r in request.requests], "new_tokens": request.new_tokens,
                "budgets": list(request.budgets), "replay": list(request.replay), "batch": max(1, request.batch)}
        return self._serve("Profile", context, lambda: profile_message(system.profile(spec)), request.system_id)

    def Score(self, request, context):
        system = self._get(request.system_id, context)

        def score():
            return [system.score(s.prompt_token_ids, s.token_ids) for s in request.sequences]

        for i, s in enumerate(self._serve("Score", context, score, request.system_id)):
            yield pb.ScoredSequence(index=i, argmax_token_ids=s.argmax_token_ids, token_logprob=s.token_logprob,
                                    argmax_logprob=s.argmax_logprob)

    def Release(self, request, context):
        self.release(request.system_id)
        CALLS.labels("Release", "OK").inc()
        return pb.ReleaseResponse()

    def Health(self, request, context):
        with self.lock:
            n = len(self.systems)
        return pb.HealthResponse(ok=True, device=self.device, kind=self.kind, detail=self.detail, systems=n,
                                 pid=os.getpid())

    def close(self) -> None:
        for k in list(self.systems):
            self.release(k)


class HealthServicer(health_pb2_grpc.HealthServicer):
    """grpc.health.v1: SERVING for the server ("") and for specpilot.v1.GpuWorker."""

    KNOWN = ("", SERVICE)
    SERVING = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def Check(self, request, context):
        if request.service not in self.KNOWN:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return self.SERVING

    def Watch(self, request, context):
        if request.service not in self.KNOWN:
            yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            return
        yield self.SERVING
        while context.is_active():  # the status never changes while the process serves
            time.sleep(1.0)


class ReflectionServicer(reflection_pb2_grpc.ServerReflectionServicer):
    """grpc.reflection.v1 over the services this server registers (descriptors from protobuf's pool)."""

    def __init__(self, services: list[str]):
        self.services = services
        self.pool = descriptor_pool.Default()

    def _files(self, fd) -> list[bytes]:
        out, seen, todo = [], set(), [fd]
        while todo:
            f = todo.pop()
            if f.name in seen:
                continue
            seen.add(f.name)
            proto = descriptor_pb2.FileDescriptorProto()
            f.CopyToProto(proto)
            out.append(proto.SerializeToString())
            todo += list(f.dependencies)
        return out

    def ServerReflectionInfo(self, request_iterator, context):
        R = reflection_pb2
        for req in request_iterator:
            kind = req.WhichOneof("message_request")
            resp = R.ServerReflectionResponse(valid_host=req.host, original_request=req)
            try:
                if kind == "list_services":
                    resp.list_services_response.CopyFrom(R.ListServiceResponse(
                        service=[R.ServiceResponse(name=s) for s in self.services]))
                elif kind == "file_containing_symbol":
                    files = self._files(self.pool.FindFileContainingSymbol(req.file_containing_symbol))
                    resp.file_descriptor_response.CopyFrom(R.FileDescriptorResponse(file_descriptor_proto=files))
                elif kind == "file_by_filename":
                    files = self._files(self.pool.FindFileByName(req.file_by_filename))
                    resp.file_descriptor_response.CopyFrom(R.FileDescriptorResponse(file_descriptor_proto=files))
                else:
                    resp.error_response.CopyFrom(R.ErrorResponse(error_code=grpc.StatusCode.UNIMPLEMENTED.value[0],
                                                                 error_message=f"{kind} is not supported"))
            except KeyError as e:
                resp.error_response.CopyFrom(R.ErrorResponse(error_code=grpc.StatusCode.NOT_FOUND.value[0],
                                                             error_message=f"not found: {e}"))
            yield resp


def device_detail(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine() or "cpu"


def serve(device: str, kind: str, port: int = 0, host: str = "127.0.0.1", repo: str | None = None,
          idle: float = 900.0, threads: int = 16):
    """Start the server; returns (server, servicer, bound port)."""
    servicer = GpuWorkerServicer(LocalWorkers(repo), device, kind, idle)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=CHANNEL_OPTIONS)
    pb_grpc.add_GpuWorkerServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    names = [SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"]
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(ReflectionServicer(names), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise ValueError(f"cannot listen on {host}:{port} (in use?): pass another --port")
    server.start()
    UP.labels(device, kind).set(1)
    return server, servicer, bound


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specpilot serve gpu-worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu:0", help="cpu:N (one core) | cuda:N")
    p.add_argument("--kind", default=None, help="device kind as deployments name it (default: cpu for cpu:N; "
                   "needed for a GPU: h100-sxm, h200, rtx-pro-6000)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    p.add_argument("--metrics-port", type=int, default=None, help="serve /metrics here (0: any free port)")
    p.add_argument("--repo", default=None, help="the engine's git repository (to build systems with a patch)")
    p.add_argument("--idle", type=float, default=900.0, help="release a system unused this long (s)")
    args = p.parse_args(argv)
    kind = args.kind or ("cpu" if args.device.startswith("cpu") else None)
    if kind is None:
        print("specpilot gpu-worker: error: --kind is needed for a GPU device (h100-sxm, h200, rtx-pro-6000)",
              file=sys.stderr)
        return 2
    try:
        server, servicer, port = serve(args.device, kind, args.port, args.host, args.repo, args.idle)
    except ValueError as e:
        print(f"specpilot gpu-worker: error: {e}", file=sys.stderr)
        return 2
    metrics = None
    if args.metrics_port is not None:
        httpd, _ = start_http_server(args.metrics_port, addr=args.host)
        metrics = f"http://{args.host}:{httpd.server_port}/metrics"
    print(json.dumps({"address": f"{args.host}:{port}", "metrics": metrics, "pid": os.getpid()}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: server.stop(grace=2))
    try:
        while server.wait_for_termination(timeout=30):  # True: timed out, still serving
            servicer.reap()
    except KeyboardInterrupt:
        pass
    finally:
        servicer.close()
        server.stop(grace=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
