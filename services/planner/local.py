"""The planner interface in-process (the embedded mode, and the body of its Celery tasks): the
cost model, the agents and the report, called directly with plain data."""

from __future__ import annotations

from pathlib import Path

from . import costmodel, report
from .agents import Context
from .command_agent import CommandAgent
from .search_agent import SearchAgent


def check_agents(specs: list[str] | None) -> list[str]:
    """Agent specs as given on the command line: `search` | `command:CMD`."""
    for s in specs or ["search"]:
        if s != "search" and not (s.startswith("command:") and s[len("command:"):].strip()):
            raise ValueError(f"--agent {s!r}: expected search or command:CMD")
    return list(specs or ["search"])


def make_agents(specs: list[str], max_candidates: int, repo: str | None, base_rev: str | None,
                timeout: float) -> list:
    agents = []
    for s in check_agents(specs):
        if s == "search":
            agents.append(SearchAgent(max_candidates))
        else:
            if repo is None or base_rev is None:
                raise ValueError("--agent command:CMD needs the engine's git repository (--repo DIR)")
            agents.append(CommandAgent(s[len("command:"):], Path(repo), base_rev, timeout))
    return agents


def propose(context: dict, agents: list) -> dict:
    """Every agent's candidates for the round (`Candidate.to_dict()` each, pruned ones included
    with their reason) and each agent's log."""
    ctx = Context(**{**context, "tried": tuple(context.get("tried", ()))})
    cands, logs = [], {}
    for agent in agents:
        got = agent.propose(ctx)
        logs[agent.name] = getattr(agent, "last_log", {})
        cands += [c.to_dict() | {"pruned": None} for c in got]
        cands += [dict(p) for p in logs[agent.name].get("pruned", [])]
    return {"candidates": cands, "logs": logs}


class LocalPlanner:
    def __init__(self, agents: list | None = None):
        self.agents = agents  # agent objects given directly (tests); otherwise built from the specs

    def analyze(self, measurement: dict, gpu: str) -> dict:
        return costmodel.analyze(measurement, gpu)

    def propose(self, context: dict, agents: list[str], repo: str | None, base_rev: str | None,
                timeout: float) -> dict:
        objs = self.agents if self.agents is not None else make_agents(
            agents, context["deployment"]["max_candidates"], repo, base_rev, timeout)
        return propose(context, objs)

    def report(self, summary: dict, folder: str) -> str:
        return str(report.write_report(summary, Path(folder)))
