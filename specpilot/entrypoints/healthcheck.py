"""A container's health check: exit 0 when the service answers, 1 (with one line) when not.

  python -m specpilot.entrypoints.healthcheck http://127.0.0.1:8700/healthz     # 200 within the timeout
  python -m specpilot.entrypoints.healthcheck grpc://127.0.0.1:50051            # grpc.health.v1 Check: SERVING

Only the standard library, and grpcio with the generated health stubs for grpc:// (the GPU
worker's image has nothing else).
"""

from __future__ import annotations

import sys
import urllib.request

TIMEOUT = 5.0


def check_http(url: str, timeout: float = TIMEOUT) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return None if r.status == 200 else f"{url} answered {r.status}"
    except OSError as e:
        return f"{url} does not answer: {e}"


def check_grpc(address: str, service: str = "", timeout: float = TIMEOUT) -> str | None:
    import grpc

    from specpilot.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=timeout)
        except grpc.RpcError as e:
            return f"grpc.health.v1 at {address}: {e.code().name} {e.details() or ''}".rstrip()
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"grpc.health.v1 at {address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].startswith(("http://", "https://", "grpc://")):
        print("usage: python -m specpilot.entrypoints.healthcheck http://HOST:PORT/PATH | grpc://HOST:PORT", file=sys.stderr)
        return 2
    target = argv[0]
    problem = check_grpc(target[len("grpc://"):]) if target.startswith("grpc://") else check_http(target)
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
