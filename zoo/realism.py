"""Does a target write code? Pure measures of greedy completions of function prompts.

- `function_text(prompt, completion)`: prompt + completion cut where the function body ends — before
  the first non-blank completion line indented no deeper than the prompt's last `def`; when the
  completion ends inside the body (token budget), after its last complete line.
- `parses(prompt, completion)`: that text is accepted by `ast.parse` and the body the completion
  adds has at least one statement line (a docstring alone, an empty or comment-only body fail).
- `loops(ids)`: some n-gram (n ≤ 4) of the token ids repeats ≥ 4 times back to back (`loop_gram`: which).
- `bits_per_byte(nats, n_bytes)`: a loss in nats over a text of n_bytes, in bits per UTF-8 byte (a
  figure that does not depend on the tokenizer).
- `wilson(k, n)`: the 95 % Wilson score interval of a rate k / n (how far 164 prompts pin a rate down).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def function_text(prompt: str, completion: str) -> tuple[str, str]:
    """(prompt + the completion up to where the function's body ends, the body part of the completion)."""
    defs = [ln for ln in prompt.splitlines() if ln.lstrip().startswith(("def ", "async def "))]
    base = _indent(defs[-1]) if defs else 0
    # the completion's first line continues the prompt's last line (usually the prompt ends with "\n")
    head, sep, rest = completion.partition("\n")
    lines = (head + sep + rest).splitlines(keepends=True)
    kept = []
    for i, ln in enumerate(lines):
        at_line_start = i > 0 or prompt.endswith("\n")
        if at_line_start and ln.strip() and _indent(ln) <= base:
            break
        kept.append(ln)
    else:  # the budget ran out inside the body: drop the unfinished last line
        if kept and not kept[-1].endswith("\n"):
            kept.pop()
    body = "".join(kept)
    return prompt + body, body


def _has_statement(body: str) -> bool:
    return any(ln.strip() and not ln.strip().startswith("#") for ln in body.splitlines())


def parses(prompt: str, completion: str) -> bool:
    text, body = function_text(prompt, completion)
    if not _has_statement(body):
        return False
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def loop_gram(ids: Sequence[int], max_n: int = 4, repeats: int = 4) -> list[int] | None:
    """The first n-gram (shortest n ≤ max_n first) that occurs `repeats` times back to back in ids, or None."""
    ids = list(ids)
    for n in range(1, max_n + 1):
        span = n * repeats
        for i in range(len(ids) - span + 1):
            gram = ids[i : i + n]
            if all(ids[i + k * n : i + (k + 1) * n] == gram for k in range(1, repeats)):
                return gram
    return None


def loops(ids: Sequence[int], max_n: int = 4, repeats: int = 4) -> bool:
    """True if some n-gram with n ≤ max_n occurs `repeats` times back to back in ids."""
    return loop_gram(ids, max_n, repeats) is not None


def parse_rate(prompts: Sequence[str], completions: Sequence[str]) -> float:
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"parse_rate needs as many completions as prompts (> 0), got {len(prompts)} / {len(completions)}")
    return sum(parses(p, c) for p, c in zip(prompts, completions)) / len(prompts)


def loop_rate(completions: Sequence[Sequence[int]]) -> float:
    if not completions:
        raise ValueError("loop_rate needs at least one completion")
    return sum(loops(c) for c in completions) / len(completions)


def bits_per_byte(nats: float, n_bytes: int) -> float:
    if n_bytes <= 0:
        raise ValueError(f"bits_per_byte needs a positive byte count, got {n_bytes}")
    return nats / (math.log(2) * n_bytes)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of the rate k / n: the rates p whose score statistic
    |k/n − p| / √(p(1 − p)/n) is at most z."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"wilson needs 0 ≤ k ≤ n and n > 0, got k={k}, n={n}")
    p, z2 = k / n, z * z
    mid, half = p + z2 / (2 * n), z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, (mid - half) / (1 + z2 / n)), min(1.0, (mid + half) / (1 + z2 / n))
