"""Plain data ⇄ GpuWorker messages: requests, profiles and a large patch in chunks."""

from specpilot import rpc
from specpilot.v1 import gpu_worker_pb2 as pb


def test_requests_round_trip():
    for r in ({"id": "a", "prompt": "def f():", "tags": ["x"]},
              {"id": "b", "prompt_ids": [1, 2, 3], "max_new_tokens": 9, "tags": []},
              {"id": "c", "prompt": "", "tags": []}):
        assert rpc.request_json(pb.Request.FromString(rpc.request_message(r).SerializeToString())) == r


def test_a_profile_round_trips():
    m = {"current": "chain", "draft_len": 16, "t_ar_s": 0.01, "replay": {"chain": 2.5, "oracle": 4.0}, "batch": 4,
         "budgets": [{"policy": "chain", "rows": 68.0, "tau": 2.5, "t_step_s": 0.02, "profiled_t_step_s": 0.018,
                      "kernels": {"attention": [0.001, 2048.0, 4096.0]}}]}
    assert rpc.profile_json(pb.ProfileResponse.FromString(rpc.profile_message(m).SerializeToString())) == m
    older = {k: v for k, v in m.items() if k != "batch"}  # a measurement without a batch is one request at a time
    assert rpc.profile_json(rpc.profile_message(older)) == {**older, "batch": 1}


def test_a_large_patch_travels_in_chunks():
    patch = "".join(f"+line {i} é\n" for i in range(300_000))  # ~4 MiB, non-ASCII
    chunks = list(rpc.patch_chunks(pb.BuildSpec(base_rev="HEAD"), patch))
    assert chunks[0].WhichOneof("part") == "spec" and len(chunks) - 1 == -(-len(patch.encode()) // rpc.PATCH_CHUNK)
    assert all(len(c.patch) <= rpc.PATCH_CHUNK for c in chunks[1:])
    assert b"".join(c.patch for c in chunks[1:]).decode() == patch
