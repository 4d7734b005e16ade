"""specpilot.zoo.realism: where a function body ends, what parses, what loops, bits per byte."""

import math

import pytest

from specpilot.zoo import realism as R

PROMPT = 'from typing import List\n\n\ndef add(a: int, b: int) -> int:\n    """Sum of a and b."""\n'


@pytest.mark.parametrize("completion", [
    "    return a + b\n",
    "    return a + b\n\n\ndef other(:\n  garbage ((\n",  # the body ended before the broken code
    "    s = a\n    s += b\n    return s\nprint(add(1, 2)",
    "    if a:\n        return a + b\n    return b\n    x = (1 +",  # budget ran out: the unfinished line goes
])
def test_bodies_that_parse(completion):
    assert R.parses(PROMPT, completion)


@pytest.mark.parametrize("completion", [
    "",  # empty body: the docstring alone is not a completion
    "\n\n",
    "    # nothing here\n",
    "\ndef other():\n    return 1\n",  # no body of its own
    "    return a +\n",  # a complete line that does not parse
    "    return (a,\n            b\n",  # a bracket never closed
    "    if a:\n    return b\n",
])
def test_bodies_that_fail(completion):
    assert not R.parses(PROMPT, completion)


def test_function_text_cuts_at_the_end_of_the_body():
    text, body = R.function_text(PROMPT, "    return a + b\n\nclass X:\n    pass\n")
    assert body == "    return a + b\n\n" and text == PROMPT + body
    method = "class A:\n    def f(self):\n        \"\"\"Doc.\"\"\"\n"
    text, body = R.function_text(method, "        return 1\n    def g(self):\n        return 2\n")
    assert body == "        return 1\n"


@pytest.mark.parametrize("ids, looped", [
    ([5, 5, 5, 5], True),
    ([1, 2, 1, 2, 1, 2, 1, 2], True),
    ([9, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 7], True),
    ([5, 5, 5, 6, 5], False),
    ([1, 2, 1, 2, 1, 2, 3], False),
    ([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5], False),  # n = 5 is not counted
    ([], False),
])
def test_loops(ids, looped):
    assert R.loops(ids) is looped


def test_loop_gram_names_the_shortest_repeated_gram():
    assert R.loop_gram([9, 1, 2, 1, 2, 1, 2, 1, 2, 3, 3, 3, 3]) == [3]
    assert R.loop_gram([9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]) == [1, 2, 3]
    assert R.loop_gram([1, 2, 1, 2, 1, 2, 3]) is None


def test_rates():
    assert R.loop_rate([[1, 1, 1, 1], [1, 2, 3], [4, 4, 4, 4, 4], [7]]) == 0.5
    assert R.parse_rate([PROMPT, PROMPT], ["    return a + b\n", ""]) == 0.5
    with pytest.raises(ValueError):
        R.parse_rate([PROMPT], [])
    with pytest.raises(ValueError):
        R.loop_rate([])


@pytest.mark.parametrize("k,n", [(0, 164), (16, 164), (31, 164), (82, 164), (164, 164), (3, 7)])
def test_wilson_interval_ends_where_the_score_statistic_reaches_z(k, n):
    """Each end inside (0, 1) is a rate p at which |k/n − p| / √(p(1 − p)/n) = 1.96, found here by
    bisection on either side of k/n; a rate of 0 or 1 keeps its own end."""
    lo, hi = R.wilson(k, n)
    p_hat = k / n

    def score(p):
        return abs(p_hat - p) / math.sqrt(p * (1 - p) / n) - 1.96

    def root(a, b):  # score(a) and score(b) of opposite signs
        for _ in range(200):
            m = (a + b) / 2
            a, b = (m, b) if (score(m) > 0) == (score(a) > 0) else (a, m)
        return (a + b) / 2

    inner = min(max(p_hat, 1e-12), 1 - 1e-12)  # the score is undefined at 0 and 1
    assert lo == pytest.approx(root(1e-12, inner) if k else 0.0, abs=1e-9)
    assert hi == pytest.approx(root(inner, 1 - 1e-12) if k < n else 1.0, abs=1e-9)
    assert lo <= p_hat <= hi


def test_wilson_names_a_bad_count():
    with pytest.raises(ValueError, match="k=5, n=4"):
        R.wilson(5, 4)


def test_bits_per_byte():
    assert R.bits_per_byte(math.log(2) * 10, 10) == pytest.approx(1.0)
    assert R.bits_per_byte(math.log(256) * 4, 4) == pytest.approx(8.0)  # a uniform guess over bytes
    with pytest.raises(ValueError):
        R.bits_per_byte(1.0, 0)
