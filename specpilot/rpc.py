"""Plain data ⇄ the GpuWorker messages (proto/specpilot/v1/gpu_worker.proto), for both sides of
the contract: the gRPC GPU worker (server) and the controller's gRPC adapter (client). Needs only
protobuf."""

from __future__ import annotations

from specpilot.v1 import gpu_worker_pb2 as pb

MAX_MESSAGE = 256 * 1024 * 1024  # bytes; both sides' limit
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)]
PATCH_CHUNK = 1 << 20  # a Build's patch travels in chunks of this many bytes


def request_message(r: dict) -> pb.Request:
    """A workload request ({"id", "prompt" | "prompt_ids", "max_new_tokens", "tags"}) as a message."""
    m = pb.Request(id=str(r["id"]), prompt_ids=list(r.get("prompt_ids") or []),
                   max_new_tokens=int(r.get("max_new_tokens") or 0), tags=list(r.get("tags") or []))
    if r.get("prompt") is not None:
        m.prompt = r["prompt"]
    return m


def request_json(m: pb.Request) -> dict:
    out: dict = {"id": m.id, "tags": list(m.tags)}
    if m.HasField("prompt"):
        out["prompt"] = m.prompt
    if m.prompt_ids:
        out["prompt_ids"] = list(m.prompt_ids)
    if m.max_new_tokens:
        out["max_new_tokens"] = m.max_new_tokens
    return out


def profile_message(m: dict) -> pb.ProfileResponse:
    """A Profile measurement (`gpu_worker.profiling.measure`) as a message."""
    return pb.ProfileResponse(
        current=m["current"], draft_len=m["draft_len"], t_ar_s=m["t_ar_s"], replay=m["replay"], batch=m.get("batch", 1),
        budgets=[pb.BudgetProfile(policy=b["policy"], rows=b["rows"], tau=b["tau"], t_step_s=b["t_step_s"],
                                  profiled_t_step_s=b["profiled_t_step_s"],
                                  kernels={c: pb.KernelClassProfile(seconds=v[0], bytes=v[1], flops=v[2])
                                           for c, v in b["kernels"].items()})
                 for b in m["budgets"]])


def profile_json(m: pb.ProfileResponse) -> dict:
    return {"current": m.current, "draft_len": m.draft_len, "t_ar_s": m.t_ar_s, "replay": dict(m.replay),
            "batch": m.batch or 1,  # unset (an older sender): one request at a time
            "budgets": [{"policy": b.policy, "rows": b.rows, "tau": b.tau, "t_step_s": b.t_step_s,
                         "profiled_t_step_s": b.profiled_t_step_s,
                         "kernels": {c: [k.seconds, k.bytes, k.flops] for c, k in b.kernels.items()}}
                        for b in m.budgets]}


def patch_chunks(spec: pb.BuildSpec, patch: str):
    """The Build stream: the spec, then the patch in chunks."""
    yield pb.BuildChunk(spec=spec)
    data = patch.encode("utf-8")
    for i in range(0, len(data), PATCH_CHUNK):
        yield pb.BuildChunk(patch=data[i:i + PATCH_CHUNK])
