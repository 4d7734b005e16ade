"""Memory entries: versioned mechanisms with requirements, variants, contract, evidence and limits.

Pure data: frozen dataclasses, validated on construction, with a JSON round trip
(`to_dict` / `from_dict`). Every validation error is an `EntryError` naming the entry and field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

SLUG = re.compile(r"[a-z0-9][a-z0-9._-]*")
KEY = re.compile(r"([a-z0-9][a-z0-9._-]*)@([1-9][0-9]*)")
CLAUSE = re.compile(r"(==|>=|<=)([1-9][0-9]*)")
MAX_REQUIRES = 12
LIMIT_KEYS = ("families", "devices", "batch_min", "batch_max")


class EntryError(ValueError):
    """An entry (or one of its parts) is malformed; the message names the entry and the field."""


def _fail(owner: str, fld: str, msg: str) -> EntryError:
    return EntryError(f"entry {owner}: field '{fld}': {msg}")


def _json_value(owner: str, fld: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(owner, fld, f"not JSON-serializable ({exc})") from None


def _dict(owner: str, fld: str, value: Any) -> None:
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise _fail(owner, fld, f"expected a dict with non-empty string keys, got {value!r}")
    _json_value(owner, fld, value)


def _str(owner: str, fld: str, value: Any, *, empty: bool = False) -> None:
    if not isinstance(value, str) or (not empty and not value):
        raise _fail(owner, fld, f"expected a {'' if empty else 'non-empty '}string, got {value!r}")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_constraint(text: str) -> tuple[tuple[str, int], ...]:
    """`*` -> (); `>=2,<=4` -> ((">=", 2), ("<=", 4)). Raises ValueError on bad syntax."""
    if text == "*":
        return ()
    if not isinstance(text, str) or not text:
        raise ValueError(f"bad constraint {text!r}: expected '*', '==N', '>=N', '<=N' or a comma-joined conjunction")
    clauses = []
    for part in text.split(","):
        m = CLAUSE.fullmatch(part)
        if not m:
            raise ValueError(
                f"bad constraint {text!r}: clause {part!r} is not '==N', '>=N' or '<=N' (N a positive integer)"
            )
        clauses.append((m.group(1), int(m.group(2))))
    return tuple(clauses)


@dataclass(frozen=True)
class Requirement:
    id: str
    constraint: str = "*"

    def __post_init__(self) -> None:
        owner = repr(self.id)
        if not isinstance(self.id, str) or not SLUG.fullmatch(self.id):
            raise _fail(f"requirement {owner}", "id", "expected a slug [a-z0-9][a-z0-9._-]*")
        try:
            parse_constraint(self.constraint)
        except ValueError as exc:
            raise _fail(f"requirement {owner}", "constraint", str(exc)) from None

    def allows(self, version: int) -> bool:
        ops = {"==": int.__eq__, ">=": int.__ge__, "<=": int.__le__}
        return all(ops[op](version, n) for op, n in parse_constraint(self.constraint))

    def __str__(self) -> str:
        return f"{self.id} {self.constraint}"

    def to_dict(self) -> dict:
        return {"id": self.id, "constraint": self.constraint}

    @classmethod
    def from_dict(cls, data: dict) -> Requirement:
        return cls(**_fields(cls, data, "requirement"))


@dataclass(frozen=True)
class Contract:
    """Which losslessness rule the entry must pass, and its options."""

    rule: str = "token_forcing"
    output_may_differ: bool = False
    options: dict = field(default_factory=dict)

    def check(self, owner: str) -> None:
        _str(owner, "contract.rule", self.rule)
        if not isinstance(self.output_may_differ, bool):
            raise _fail(owner, "contract.output_may_differ", f"expected a bool, got {self.output_may_differ!r}")
        _dict(owner, "contract.options", self.options)

    def to_dict(self) -> dict:
        return {"rule": self.rule, "output_may_differ": self.output_may_differ, "options": dict(self.options)}


@dataclass(frozen=True)
class Evidence:
    """Where the entry was accepted, its measured gain and the CI's lower bound, and the verdict."""

    deployment: dict
    gain: float
    lower_bound: float
    verdict_id: str

    def check(self, owner: str) -> None:
        _dict(owner, "evidence.deployment", self.deployment)
        for name in ("gain", "lower_bound"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise _fail(owner, f"evidence.{name}", f"expected a finite number, got {v!r}")
        if self.lower_bound > self.gain:
            raise _fail(owner, "evidence.lower_bound", f"{self.lower_bound} exceeds the gain {self.gain}")
        _str(owner, "evidence.verdict_id", self.verdict_id)

    def to_dict(self) -> dict:
        return {
            "deployment": dict(self.deployment),
            "gain": self.gain,
            "lower_bound": self.lower_bound,
            "verdict_id": self.verdict_id,
        }


@dataclass(frozen=True)
class Lineage:
    round: str
    candidate: str

    def check(self, owner: str) -> None:
        _str(owner, "lineage.round", self.round)
        _str(owner, "lineage.candidate", self.candidate)

    def to_dict(self) -> dict:
        return {"round": self.round, "candidate": self.candidate}


def _fields(cls: type, data: Any, owner: str) -> dict:
    if not isinstance(data, dict):
        raise _fail(owner, cls.__name__.lower(), f"expected an object, got {data!r}")
    names = set(cls.__dataclass_fields__)
    unknown = sorted(set(data) - names)
    if unknown:
        raise _fail(owner, unknown[0], f"unknown field for {cls.__name__}")
    return dict(data)


@dataclass(frozen=True)
class Entry:
    id: str
    version: int
    title: str
    requires: tuple[Requirement, ...] = ()
    delta: str = ""
    variants: dict = field(default_factory=dict)
    contract: Contract = field(default_factory=Contract)
    evidence: Evidence | None = None
    limits: dict = field(default_factory=dict)
    unverified: tuple[str, ...] = ()
    lineage: Lineage | None = None
    reuse_of: str | None = None

    __hash__ = None  # holds dicts; compare with ==, identify with .key

    @property
    def key(self) -> str:
        return f"{self.id}@{self.version}"

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not SLUG.fullmatch(self.id):
            raise _fail(repr(self.id), "id", "expected a slug [a-z0-9][a-z0-9._-]*")
        if not _int(self.version) or self.version < 1:
            raise _fail(repr(self.id), "version", f"expected an integer >= 1, got {self.version!r}")
        owner = self.key
        _str(owner, "title", self.title)
        # lists are accepted and stored as tuples
        object.__setattr__(self, "requires", tuple(self.requires) if isinstance(self.requires, list) else self.requires)
        object.__setattr__(
            self, "unverified", tuple(self.unverified) if isinstance(self.unverified, list) else self.unverified
        )
        if not isinstance(self.requires, tuple) or not all(isinstance(r, Requirement) for r in self.requires):
            raise _fail(owner, "requires", "expected a tuple of Requirement")
        if len(self.requires) > MAX_REQUIRES:
            raise _fail(owner, "requires", f"{len(self.requires)} requirements, at most {MAX_REQUIRES} allowed")
        ids = [r.id for r in self.requires]
        dups = sorted({i for i in ids if ids.count(i) > 1})
        if dups:
            raise _fail(owner, "requires", f"duplicate requirement {dups[0]!r}")
        if self.id in ids:
            raise _fail(owner, "requires", "an entry cannot require itself")
        _str(owner, "delta", self.delta, empty=True)
        if not isinstance(self.variants, dict) or not all(isinstance(k, str) and k for k in self.variants):
            raise _fail(owner, "variants", f"expected a dict with non-empty string keys, got {self.variants!r}")
        for name, opts in self.variants.items():
            _dict(owner, f"variants.{name}", opts)
        if not isinstance(self.contract, Contract):
            raise _fail(owner, "contract", f"expected a Contract, got {self.contract!r}")
        self.contract.check(owner)
        if self.evidence is not None:
            if not isinstance(self.evidence, Evidence):
                raise _fail(owner, "evidence", f"expected Evidence or None, got {self.evidence!r}")
            self.evidence.check(owner)
        self._check_limits(owner)
        if not isinstance(self.unverified, tuple) or not all(isinstance(u, str) and u for u in self.unverified):
            raise _fail(owner, "unverified", "expected a tuple of non-empty strings")
        if self.lineage is not None:
            if not isinstance(self.lineage, Lineage):
                raise _fail(owner, "lineage", f"expected Lineage or None, got {self.lineage!r}")
            self.lineage.check(owner)
        if self.reuse_of is not None and not (isinstance(self.reuse_of, str) and KEY.fullmatch(self.reuse_of)):
            raise _fail(owner, "reuse_of", f"expected an entry key 'id@version' or None, got {self.reuse_of!r}")

    def _check_limits(self, owner: str) -> None:
        _dict(owner, "limits", self.limits)
        for k, v in self.limits.items():
            if k not in LIMIT_KEYS:
                raise _fail(owner, f"limits.{k}", f"unknown limit; known: {', '.join(LIMIT_KEYS)}")
            if k in ("batch_min", "batch_max"):
                if not _int(v) or v < 1:
                    raise _fail(owner, f"limits.{k}", f"expected an integer >= 1, got {v!r}")
            elif not isinstance(v, list) or not v or not all(isinstance(s, str) and s for s in v):
                raise _fail(owner, f"limits.{k}", f"expected a non-empty list of strings, got {v!r}")
        lo, hi = self.limits.get("batch_min"), self.limits.get("batch_max")
        if lo is not None and hi is not None and lo > hi:
            raise _fail(owner, "limits.batch_min", f"{lo} exceeds batch_max {hi}")

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "version": self.version,
            "title": self.title,
            "requires": [r.to_dict() for r in self.requires],
            "delta": self.delta,
            "variants": {k: dict(v) for k, v in self.variants.items()},
            "contract": self.contract.to_dict(),
            "evidence": None if self.evidence is None else self.evidence.to_dict(),
            "limits": json.loads(json.dumps(self.limits)),
            "unverified": list(self.unverified),
            "lineage": None if self.lineage is None else self.lineage.to_dict(),
            "reuse_of": self.reuse_of,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Entry:
        owner = repr(data.get("id")) if isinstance(data, dict) else "?"
        if isinstance(data, dict) and "version" in data:
            owner = f"{data.get('id')}@{data.get('version')}"
        d = _fields(cls, data, owner)
        for name in ("id", "version", "title"):
            if name not in d:
                raise _fail(owner, name, "missing")
        try:
            if not isinstance(d.get("requires", []), list):
                raise _fail(owner, "requires", "expected a list")
            d["requires"] = tuple(Requirement.from_dict(r) for r in d.get("requires", []))
            if "contract" in d:
                d["contract"] = Contract(**_fields(Contract, d["contract"], owner))
            if d.get("evidence") is not None:
                d["evidence"] = Evidence(**_fields(Evidence, d["evidence"], owner))
            if d.get("lineage") is not None:
                d["lineage"] = Lineage(**_fields(Lineage, d["lineage"], owner))
            if not isinstance(d.get("unverified", []), list):
                raise _fail(owner, "unverified", "expected a list")
            d["unverified"] = tuple(d.get("unverified", []))
        except TypeError as exc:  # missing/extra constructor arguments of a part
            raise EntryError(f"entry {owner}: {exc}") from None
        return cls(**d)

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    def content_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()
