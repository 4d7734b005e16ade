"""Porting the memory to a new deployment: which entries apply, in what order, from what start.

Only versions whose limits allow the deployment are considered. Entries are taken in id order; an
entry is kept when it resolves together with the entries kept before it (highest allowed versions,
see `graph.resolve`), otherwise it is skipped with the reason. Every selected entry is marked as a
reuse (`reuse_of` = its key): porting re-tunes and re-measures, it is not a new discovery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from .entries import Entry, Requirement
from .graph import GraphError, resolve


class PortError(ValueError):
    """The deployment description is malformed."""


@dataclass(frozen=True)
class Skipped:
    id: str
    reason: str

    def to_dict(self) -> dict:
        return {"id": self.id, "reason": self.reason}


@dataclass(frozen=True)
class PortPlan:
    deployment: dict
    order: tuple[Entry, ...]  # apply order, each marked as a reuse
    starting_system: dict
    skipped: tuple[Skipped, ...]

    __hash__ = None

    def to_dict(self) -> dict:
        return {
            "deployment": dict(self.deployment),
            "order": [e.key for e in self.order],
            "starting_system": self.starting_system,
            "skipped": [s.to_dict() for s in self.skipped],
        }


def check_deployment(deployment: Mapping) -> dict:
    if not isinstance(deployment, Mapping):
        raise PortError(f"deployment: expected a mapping, got {deployment!r}")
    for k in ("family", "device"):
        if not isinstance(deployment.get(k), str) or not deployment[k]:
            raise PortError(f"deployment: field {k!r}: expected a non-empty string, got {deployment.get(k)!r}")
    batch = deployment.get("batch")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise PortError(f"deployment: field 'batch': expected an integer >= 1, got {batch!r}")
    return dict(deployment)


def limits_refuse(limits: Mapping, deployment: Mapping) -> str | None:
    """Why these limits exclude the deployment, or None when they allow it."""
    if "families" in limits and deployment["family"] not in limits["families"]:
        return f"family {deployment['family']!r} not in {sorted(limits['families'])}"
    if "devices" in limits and deployment["device"] not in limits["devices"]:
        return f"device {deployment['device']!r} not in {sorted(limits['devices'])}"
    if "batch_min" in limits and deployment["batch"] < limits["batch_min"]:
        return f"batch {deployment['batch']} < batch_min {limits['batch_min']}"
    if "batch_max" in limits and deployment["batch"] > limits["batch_max"]:
        return f"batch {deployment['batch']} > batch_max {limits['batch_max']}"
    return None


def port(deployment: Mapping, catalog: Mapping[str, list[Entry]]) -> PortPlan:
    dep = check_deployment(deployment)
    allowed: dict[str, list[Entry]] = {}
    refused: dict[str, str] = {}  # id -> why its latest version is excluded
    for ident in sorted(catalog):
        versions = sorted(catalog[ident], key=lambda e: e.version)
        allowed[ident] = [e for e in versions if limits_refuse(e.limits, dep) is None]
        if not allowed[ident] and versions:
            refused[ident] = f"limits: {versions[-1].key}: {limits_refuse(versions[-1].limits, dep)}"

    kept: list[Requirement] = []
    skipped: list[Skipped] = []
    for ident in sorted(catalog):
        if ident in refused:
            skipped.append(Skipped(ident, refused[ident]))
            continue
        if not allowed[ident]:
            continue  # an empty version list: nothing to port
        try:
            resolve(kept + [Requirement(ident)], allowed)
        except GraphError as exc:
            note = ""
            if exc.kind == "missing" and exc.ident in refused:
                note = f" (excluded here by {refused[exc.ident]})"
            skipped.append(Skipped(ident, f"requirements: {exc}{note}"))
            continue
        kept.append(Requirement(ident))

    order = tuple(replace(e, reuse_of=e.key) for e in resolve(kept, allowed)) if kept else ()
    starting_system = {
        "stock": True,
        "entries": [e.key for e in order],
        "variants": {e.id: next(iter(e.variants)) for e in order if e.variants},
    }
    return PortPlan(dep, order, starting_system, tuple(skipped))
