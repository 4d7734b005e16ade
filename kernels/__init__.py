"""specpilot.kernels: GPU kernels of the engine, each kept beside a plain-torch reference it is tested against.

Imports neither specpilot.engine nor specpilot.services.
"""
