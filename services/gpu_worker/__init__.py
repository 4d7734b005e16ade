"""GPU worker service: builds a candidate system (stock + memory entries + patch, in its own
process) and serves Build / Generate / Profile / Score / Health (proto/specpilot/v1/gpu_worker.proto).
"""
