"""Generated gRPC stubs of proto/specpilot/v1/ (`make proto`; do not edit by hand)."""
