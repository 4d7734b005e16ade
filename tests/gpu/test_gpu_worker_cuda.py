"""The gRPC GPU worker on a CUDA device: it names the GPU, and paired runs over gRPC on two
workers (cuda:0, and cuda:1 when there is one) give the tokens of local processes."""

import json
import signal
import subprocess
import sys

import pytest
import torch

from specpilot.entrypoints.demo import micro_pair
from specpilot.services.controller.pairing import run_pair, system
from specpilot.services.controller.remote import GrpcWorkers
from specpilot.services.gpu_worker.systems import LocalWorkers
from specpilot.zoo.workloads import stdlib_completion

TARGET, DRAFTER, _ = micro_pair()
STOCK = {"target": str(TARGET), "drafter": str(DRAFTER), "mode": "chain", "max_new_tokens": 24}
REQS = [{"id": r.id, "prompt": r.prompt} for r in stdlib_completion(limit=2)]


def test_paired_runs_over_grpc_on_cuda():
    devices = [f"cuda:{i}" for i in range(min(2, torch.cuda.device_count()))]
    procs, addresses = [], []
    try:
        for d in devices:
            p = subprocess.Popen([sys.executable, "-m", "specpilot.services.gpu_worker.server", "--device", d,
                                  "--kind", "gpu-test"], stdout=subprocess.PIPE, text=True)
            procs.append(p)
            addresses.append(json.loads(p.stdout.readline())["address"])
        remote = GrpcWorkers(addresses)
        health = remote.health()
        assert all(h["healthy"] and h["kind"] == "gpu-test" for h in health)
        assert health[0]["detail"] == torch.cuda.get_device_name(0)
        stock, ar = system(STOCK), system({**STOCK, "mode": "ar"})
        over_grpc = run_pair(stock, ar, REQS, addresses, repeats=2, warmup=2, workers=remote)
        local = run_pair(stock, ar, REQS, devices, repeats=2, warmup=2, workers=LocalWorkers())
        assert over_grpc["outputs"] == local["outputs"]
        assert all(s.candidate_tps > 0 and s.incumbent_tps > 0 for s in over_grpc["samples"])
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
