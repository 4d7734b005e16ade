"""The memory interface in-process (the embedded mode): the store, porting and the reproduce check
called directly, with the same plain-dict answers the REST API gives (`app.py`)."""

from __future__ import annotations

from pathlib import Path

from .entries import Entry, Requirement
from .graph import graph_svg, resolve
from .porting import port
from .reproduce import reproduce
from .seed import seed_entries
from .store import EntryExists, Store


def reproduce_check(repo: Path | str | None, stock_rev: str | None, entry: Entry, expected_tree: str | None):
    """The reproduce check for storing `entry`: needed when it carries a code delta, run whenever
    the accepted system's code (`expected_tree`, a git tree id) is given; None when not run.
    ValueError when it is needed and cannot be run."""
    if not entry.delta.strip() and not expected_tree:
        return None
    if repo is None or stock_rev is None:
        raise ValueError("this memory has no engine repository configured (serve with --repo and --stock-rev): "
                         "an entry with a code delta cannot be reproduce-checked")
    if not expected_tree:
        raise ValueError("an entry with a code delta needs ?expected_tree=<git tree id of the accepted system's "
                         "code> for the reproduce check")
    return lambda e, order: reproduce(Path(repo), stock_rev, order, expected_tree)


class LocalMemory:
    def __init__(self, url: str, repo: Path | str | None = None, stock_rev: str | None = None, seed: bool = True):
        self.store_ = Store(url)
        self.repo, self.stock_rev = repo, stock_rev
        if seed and not self.store_.list():
            for e in seed_entries():
                try:
                    self.store_.add(e)
                except EntryExists:  # another process seeded meanwhile
                    pass

    def entries(self) -> list[dict]:
        return [e.to_dict() for e in self.store_.list()]

    def port(self, deployment: dict) -> list[dict]:
        return [e.to_dict() for e in port(deployment, self.store_.catalog()).order]

    def get(self, ident: str, version: int | None = None) -> dict:
        return self.store_.get(ident, version).to_dict()

    def versions(self, ident: str) -> list[int]:
        return self.store_.versions(ident)

    def graph_svg(self, ident: str) -> str:
        e = self.store_.get(ident)
        return graph_svg(resolve([Requirement(e.id, f"=={e.version}")], self.store_.catalog()))

    def store(self, entry: dict, expected_tree: str | None) -> dict:
        e = Entry.from_dict(entry)
        try:
            return self.store_.add(e, reproduce=reproduce_check(self.repo, self.stock_rev, e, expected_tree)).to_dict()
        except EntryExists:
            return self.store_.get(e.id, e.version).to_dict()

    def close(self) -> None:
        self.store_.close()
