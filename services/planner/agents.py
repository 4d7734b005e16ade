"""The agents' one small interface: `propose(context) -> list[Candidate]`.

A candidate is a system to evaluate against the incumbent: option overrides of the engine's
configuration (`EngineConfig` fields) and/or a code patch (a unified diff against the incumbent's
code, touching only `engine/` or `kernels/`). Agents never evaluate anything themselves; the
controller does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Candidate:
    name: str  # unique within a round, e.g. "tree-best-first/n32" or "command-1"
    agent: str  # "search" | "command"
    options: dict = field(default_factory=dict)  # EngineConfig overrides on top of the incumbent's
    patch: str = ""  # unified diff against the incumbent's code; "" = configuration only
    entry: str | None = None  # the memory entry key (id@version) it instantiates (search), None for new code
    variant: str | None = None  # the entry's variant name
    rationale: str = ""
    predicted: dict | None = None  # {"tau", "speedup"} where exact replay and the cost model predict them

    def to_dict(self) -> dict:
        return {"name": self.name, "agent": self.agent, "options": dict(self.options), "patch": self.patch,
                "entry": self.entry, "variant": self.variant, "rationale": self.rationale,
                "predicted": self.predicted}

    @classmethod
    def from_dict(cls, d: dict) -> Candidate:
        return cls(**d)


@dataclass(frozen=True)
class Context:
    round: int  # 1-based
    deployment: dict  # {"target", "drafter", "gpu", "batch", ...}
    incumbent: dict  # the incumbent's EngineConfig fields
    incumbent_patch: str  # the incumbent's code delta against stock ("" = stock code)
    costmodel: dict  # the round's measured cost model (see services/controller/round.py: budgets, ceiling, replay τ)
    direction: str  # what this round attacks: costmodel.direction(): "tree" | "kernel:<class>" | "off-profile"
    memory: list[dict] = field(default_factory=list)  # ported memory entries (Entry.to_dict())
    tried: tuple[str, ...] = ()  # names of candidates earlier rounds already evaluated


class Agent(Protocol):
    name: str

    def propose(self, context: Context) -> list[Candidate]: ...
