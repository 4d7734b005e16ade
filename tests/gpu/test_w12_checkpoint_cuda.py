"""W12 checkpoints on CUDA: packing on the GPU writes the files packing on the CPU writes, and a W12
folder read onto the GPU gives the bf16 tensors bit for bit, its hashes checked there too."""

from pathlib import Path

import torch

from specpilot.engine.checkpoint import SINGLE, read_tensors
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.w12io import pack_checkpoint, read_w12
from specpilot.kernels.w12.format import unpack
from specpilot.zoo.workloads import Request

MICRO = Path(__file__).resolve().parents[2] / "zoo" / "checkpoints" / "micro"


def test_gpu_packing_writes_the_cpu_files(tmp_path):
    for name in ("hybrid", "dense-block-markov"):
        cpu = pack_checkpoint(MICRO / name, tmp_path / f"{name}-cpu")
        gpu = pack_checkpoint(MICRO / name, tmp_path / f"{name}-gpu", device="cuda")
        assert gpu["roundtrip_bit_exact"] and gpu["tensors"] == cpu["tensors"]
        for f in (SINGLE, "config.json"):
            assert (tmp_path / f"{name}-gpu" / f).read_bytes() == (tmp_path / f"{name}-cpu" / f).read_bytes()


def test_reading_onto_the_gpu_restores_every_tensor(tmp_path):
    pack_checkpoint(MICRO / "dense", tmp_path / "dense")
    src, got = read_tensors(MICRO / "dense"), read_tensors(tmp_path / "dense", "cuda")
    assert src.keys() == got.keys() and all(got[k].is_cuda and torch.equal(got[k].cpu(), src[k]) for k in src)
    packed = read_w12(tmp_path / "dense", "cuda")
    assert all(p.device.type == "cuda" and torch.equal(unpack(p).cpu(), src[k]) for k, p in packed.items())


def test_engine_on_cuda_emits_the_same_tokens_from_w12(tmp_path):
    pack_checkpoint(MICRO / "dense", tmp_path / "dense")
    pack_checkpoint(MICRO / "dense-block-markov", tmp_path / "dense-block-markov")
    req = [Request(id="p", prompt_ids=(5, 17, 3, 99, 42, 7))]

    def run(root):
        e = Engine(EngineConfig(target=str(root / "dense"), drafter=str(root / "dense-block-markov"),
                                dtype="float32", device="cuda", max_new_tokens=16))
        return e.run(req)["outputs"][0]["tokens"]
    assert run(tmp_path) == run(MICRO)
