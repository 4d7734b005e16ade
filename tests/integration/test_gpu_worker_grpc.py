"""The gRPC GPU worker, for real: a server process per test module, the controller's gRPC adapter,
the standard health and reflection services, deadlines, a worker killed mid-call, metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import pytest
from google.protobuf import descriptor_pb2

from specpilot.entrypoints.demo import micro_pair
from specpilot.services.controller.pairing import run_pair, system
from specpilot.services.controller.remote import GrpcWorkers
from specpilot.services.gpu_worker.systems import LocalWorkers
from specpilot.v1 import health_pb2, health_pb2_grpc, reflection_pb2, reflection_pb2_grpc
from specpilot.zoo.workloads import stdlib_completion

TARGET, DRAFTER, _ = micro_pair()
STOCK = {"target": str(TARGET), "drafter": str(DRAFTER), "mode": "chain", "max_new_tokens": 12}
REQS = [{"id": r.id, "prompt": r.prompt} for r in stdlib_completion(limit=2)]


def start_worker(device: str = "cpu:0", env: dict | None = None) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", "specpilot.services.gpu_worker.server", "--device", device,
                             "--metrics-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"the worker did not start: {proc.stderr.read()[-2000:]}")
    return proc, json.loads(line)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def worker():
    proc, info = start_worker()
    yield info
    stop(proc)


def test_health_names_the_device_kind_and_the_standard_service_serves(worker):
    (h,) = GrpcWorkers([worker["address"]]).health()
    assert h["healthy"] and h["kind"] == "cpu" and h["device"] == "cpu:0" and h["pid"] > 0
    channel = grpc.insecure_channel(worker["address"])
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "specpilot.v1.GpuWorker"):
        got = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert got.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as e:
        stub.Check(health_pb2.HealthCheckRequest(service="nope.Service"), timeout=5)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_services_and_serves_their_descriptors(worker):
    stub = reflection_pb2_grpc.ServerReflectionStub(grpc.insecure_channel(worker["address"]))
    R = reflection_pb2
    asks = [R.ServerReflectionRequest(list_services=""),
            R.ServerReflectionRequest(file_containing_symbol="specpilot.v1.GpuWorker"),
            R.ServerReflectionRequest(file_containing_symbol="no.such.Symbol")]
    listed, described, missing = list(stub.ServerReflectionInfo(iter(asks), timeout=10))
    names = {s.name for s in listed.list_services_response.service}
    assert {"specpilot.v1.GpuWorker", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} <= names
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in described.file_descriptor_response.file_descriptor_proto]
    (gw,) = [f for f in files if f.package == "specpilot.v1"]
    (svc,) = gw.service
    assert {m.name for m in svc.method} == {"Build", "Generate", "Profile", "Score", "Release", "Health"}
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_paired_runs_over_grpc_give_the_tokens_of_local_processes(worker):
    remote = GrpcWorkers([worker["address"]])
    stock, ar = system(STOCK), system({**STOCK, "mode": "ar"})
    over_grpc = run_pair(stock, ar, REQS, [worker["address"]], repeats=1, workers=remote)
    local = run_pair(stock, ar, REQS, ["cpu:0"], repeats=1, workers=LocalWorkers())
    assert over_grpc["outputs"] == local["outputs"] and over_grpc["prompt_ids"] == local["prompt_ids"]
    assert all(s.candidate_tps > 0 for s in over_grpc["samples"])
    sys_ = remote.start(stock, worker["address"], 120)
    try:
        scores = sys_.score(over_grpc["prompt_ids"][0], over_grpc["outputs"]["candidate"][0][0])
        assert len(scores.argmax_token_ids) == len(over_grpc["outputs"]["candidate"][0][0])
        prof = sys_.profile({"requests": REQS[:1], "new_tokens": 8, "budgets": ["chain"], "replay": ["chain"]})
        assert prof["current"] == "chain" and prof["budgets"][0]["tau"] >= 1 and "oracle" in prof["replay"]
        assert set(prof["budgets"][0]["kernels"]) and all(len(v) == 3 for v in prof["budgets"][0]["kernels"].values())
    finally:
        sys_.close()
    assert remote.health()[0]["systems"] == 0  # released


def test_refusals_and_deadlines_are_one_line_errors(worker):
    remote = GrpcWorkers([worker["address"]])
    with pytest.raises(RuntimeError, match="build failed .*could not load the system: /nonexistent: not a checkpoint"):
        remote.start(system({"target": "/nonexistent", "mode": "ar"}), worker["address"], 60)
    with pytest.raises(ValueError, match="INVALID_ARGUMENT.*patch"):
        remote.start(system(STOCK, "not a patch", "HEAD"), worker["address"], 60)
    sys_ = remote.start(system(STOCK), worker["address"], 120)
    try:
        sys_.timeout = 0.001
        with pytest.raises(RuntimeError, match="DEADLINE_EXCEEDED"):
            sys_.generate(REQS)
    finally:
        sys_.close()
    gone = remote.start(system(STOCK), worker["address"], 120)
    gone.close()
    with pytest.raises(RuntimeError, match="NOT_FOUND"):
        gone.generate(REQS)


def test_batched_generation_over_grpc_equals_batch_1_and_counts_accepted_tokens_per_position(worker):
    remote = GrpcWorkers([worker["address"]])
    sys_ = remote.start(system({**STOCK, "drafter": "ngram", "draft_len": 4}), worker["address"], 120)
    try:
        one, ids = sys_.generate(REQS)
        two, ids2 = sys_.generate(REQS, batch=2)
    finally:
        sys_.close()
    assert two == one and ids2 == ids
    text = urllib.request.urlopen(worker["metrics"], timeout=10).read().decode()
    counts = {ln.split("{")[1].split("}")[0]: float(ln.split()[-1]) for ln in text.splitlines()
              if ln.startswith("specpilot_accepted_tokens_per_position_total{")}
    steps = [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("specpilot_verify_steps_total ")]
    k = len(counts)  # positions 1..k (the module's worker also served draft length 8 systems), each
    assert k >= 1 and set(counts) == {f'position="{i}"' for i in range(1, k + 1)} and steps and steps[0] > 0
    # accepted no more often than the one before it
    assert sorted(counts.values(), reverse=True) == [counts[f'position="{i}"'] for i in range(1, k + 1)]


def test_metrics_are_served(worker):
    text = urllib.request.urlopen(worker["metrics"], timeout=10).read().decode()
    assert 'specpilot_gpu_worker_calls_total{code="OK",method="Build"}' in text
    assert "specpilot_gpu_worker_call_seconds_bucket" in text and "specpilot_gpu_worker_up" in text


def test_a_worker_killed_mid_call_is_an_error_not_a_hang():
    proc, info = start_worker("cpu:1")
    remote = GrpcWorkers([info["address"]])
    sys_ = remote.start(system({**STOCK, "max_new_tokens": 400, "mode": "ar"}), info["address"], 300)
    child = [p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == proc.pid]
    result: dict = {}

    def call():
        try:
            sys_.generate(REQS * 4)
        except Exception as e:  # noqa: BLE001 — examined below
            result["error"] = e

    t = threading.Thread(target=call)
    t.start()
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    t.join(60)
    assert not t.is_alive() and time.monotonic() - t0 < 30
    assert isinstance(result.get("error"), RuntimeError) and "UNAVAILABLE" in str(result["error"])
    assert "the worker is down" in str(result["error"])
    proc.wait()
    for pid in child:  # the system's process ends once its worker is gone (its input closes)
        deadline = time.monotonic() + 120
        while os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z"
    assert not remote.health()[0]["healthy"]


def _parent(pid: str) -> int:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _state(pid: str) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


BLOCKED = ("fastapi", "pydantic", "starlette", "sqlalchemy", "alembic", "celery", "kombu", "redis", "httpx",
           "uvicorn", "psycopg")
BLOCKER = f"""
import sys
BLOCKED = {BLOCKED!r}
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked: the GPU machine does not have it")
        return None
sys.meta_path.insert(0, _Block())
"""


def test_the_worker_runs_with_only_torch_grpc_protobuf_and_prometheus(tmp_path):
    """The GPU machine has no fastapi, pydantic, sqlalchemy, alembic, celery, redis: the server and
    the system processes it starts (they inherit the block through sitecustomize) serve a real
    Build and Generate without them."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    probe = subprocess.run([sys.executable, "-c", "import celery"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "blocked" in probe.stderr  # the block works
    proc, info = start_worker("cpu:0", env)
    try:
        remote = GrpcWorkers([info["address"]])
        sys_ = remote.start(system(STOCK), info["address"], 120)
        try:
            outs, ids = sys_.generate(REQS[:1])
            assert len(outs[0]) == 12 and ids[0]
        finally:
            sys_.close()
    finally:
        stop(proc)
    assert "blocked" not in proc.stderr.read()
