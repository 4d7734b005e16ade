"""The doors the round goes through: one small interface per service it uses.

Each has an in-process adapter (the embedded mode: `specpilot demo`, `specpilot round`, most
tests) and a remote one (`remote.py`: gRPC for the GPU workers, REST for the memory, a Celery task
for the planner). `specpilot/entrypoints/bootstrap.py` picks them; the round (`round.py`) sees only these.
Everything crossing a door is plain JSON-able data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from specpilot.systemspec import SystemSpec


class System(Protocol):
    """One built system on one device, in a process of its own. It reports no time: the
    controller times `generate` around the call."""

    device: str

    def generate(self, requests: list[dict], batch: int = 1) -> tuple[list[list[int]], list[list[int]]]:
        """(output tokens, prompt ids) per request, returned once the device has finished; `batch`
        requests decode at once (continuous batching: a finished request's place goes to the next)."""

    def score(self, prompt_ids: list[int], tokens: list[int]):
        """Teacher-forced scores of one output (argmax_token_ids, token_logprob, argmax_logprob)."""

    def profile(self, spec: dict) -> dict:
        """The cost model's measurements of this system."""

    def close(self) -> None: ...


class GpuWorkers(Protocol):
    """Build, Generate, Profile, Score, Health. A system is a `specpilot.systemspec.SystemSpec`:
    our engine (settings, a code patch against a pinned revision) or a server it launches."""

    kind: str

    def devices(self, deployment: dict) -> list[str]:
        """The one or two devices a deployment's paired runs use."""

    def start(self, system: SystemSpec, device: str, timeout: float) -> System:
        """Build `system` and start it on `device` (every call on it under `timeout`)."""

    def code_tree(self, base_rev: str, patch: str) -> str:
        """The git tree id of the system's code (the memory's reproduce check compares it)."""

    def health(self) -> list[dict]:
        """[{"address", "device", "kind", "healthy"}] per worker."""


class Memory(Protocol):
    """Entries as `Entry.to_dict()` dicts."""

    def entries(self) -> list[dict]:
        """The latest version of every entry."""

    def port(self, deployment: dict) -> list[dict]:
        """The entries that carry to {family, device, batch, name}, in apply order, each a reuse."""

    def get(self, ident: str, version: int | None = None) -> dict: ...

    def versions(self, ident: str) -> list[int]: ...

    def graph_svg(self, ident: str) -> str:
        """The entry's requirement graph as SVG (the dashboard shows it)."""

    def store(self, entry: dict, expected_tree: str | None) -> dict:
        """Store after the reproduce check (when the entry or its requirements carry code,
        `expected_tree` is the accepted system's code); an (id, version) already stored is read
        back. Raises ValueError naming what does not reproduce or validate."""


class Planner(Protocol):
    def analyze(self, measurement: dict, gpu: str) -> dict:
        """The round's cost model: budgets, ceiling factors, direction."""

    def propose(self, context: dict, agents: list[str], repo: str | None, base_rev: str | None,
                timeout: float) -> dict:
        """{"candidates": [Candidate.to_dict()...], "logs": {agent name: its log}}."""

    def report(self, summary: dict, folder: str) -> str:
        """Write the run's HTML report; its index path."""


@dataclass
class Ports:
    """The adapters one round uses, picked by `specpilot/entrypoints/bootstrap.py`."""

    workers: GpuWorkers
    memory: Memory
    planner: Planner
