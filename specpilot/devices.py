"""Device lists of a deployment, shared by the controller and the GPU workers."""

from __future__ import annotations

import re

_DEVICE = re.compile(r"(cpu|cuda)(:\d+)?")


def device_list(spec: str) -> list[str]:
    """'cpu,cpu' → ['cpu:0', 'cpu:1'] (one core each); 'cuda:0,cuda:1' as given; 1 or 2 entries."""
    devs = [d.strip() for d in str(spec).split(",") if d.strip()]
    if len(devs) not in (1, 2):
        raise ValueError(f"--devices {spec!r}: give one or two devices, e.g. cpu,cpu or cuda:0,cuda:1")
    for d in devs:
        if not _DEVICE.fullmatch(d):
            raise ValueError(f"devices {spec!r}: {d!r} is not a device; expected cpu, cpu:N, cuda or cuda:N")
    return [f"cpu:{i}" if d == "cpu" else d for i, d in enumerate(devs)]
