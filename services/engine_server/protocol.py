"""The engine server's two request formats, parsed and answered by pure functions (no server, no
engine: what they need of the target comes in `Limits`).

- SGLang-native `POST /generate`: `text` (a string or a list) or `input_ids` (token ids, or a list
  of lists), `sampling_params` {max_new_tokens, temperature, stop_token_ids, ...}, `rid`; one
  answer {text, output_ids, meta_info}, or a list of them when the prompts came as a list.
- OpenAI-compatible `POST /v1/completions`: `prompt` (text, token ids, or a list of either),
  `max_tokens`, `temperature`, `stop_token_ids`, ...; one answer with a choice per prompt, each
  carrying its exact `token_ids`.

Only greedy decoding is served: temperature 0 (or left out), and every other sampling field at
the value that leaves the greedy tokens unchanged; anything else is a `BadRequest` naming the
field. A field the server does not know is refused too, so a misspelt one is never ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

MAX_PROMPTS = 256  # prompts in one HTTP request
GENERATE_DEFAULT_NEW = 128  # /generate without sampling_params.max_new_tokens
COMPLETIONS_DEFAULT_NEW = 16  # /v1/completions without max_tokens


class BadRequest(ValueError):
    """A request the server refuses, on one line: `param` names the field (None: the body)."""

    def __init__(self, param: str | None, message: str, status: int = 400):
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.status = status


@dataclass(frozen=True)
class Limits:
    """What a request is checked against: the target's vocabulary and context, the server's
    token limit per request, the target's EOS ids, and its tokenizer (None: ids only)."""

    vocab_size: int
    max_new_tokens: int
    context: int
    eos: frozenset[int] = frozenset()
    encode: Callable[[str], list[int]] | None = None


@dataclass(frozen=True)
class Job:
    """One prompt to decode."""

    rid: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    stop_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Call:
    """A parsed HTTP request: its prompts, and whether they came as a list (then /generate
    answers with a list)."""

    jobs: tuple[Job, ...]
    listed: bool


@dataclass(frozen=True)
class Finish:
    """A job's answer: its tokens (up to and including the stop token that ended it) and why it
    ended, "length" or "stop" (`matched`: the stop token)."""

    tokens: list[int]
    reason: str
    matched: int | None = None


# ---------------------------------------------------------------------------------- helpers
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _show(x, n: int = 40) -> str:
    """A value as JSON writes it, cut short."""
    try:
        text = json.dumps(x)
    except (TypeError, ValueError):
        text = repr(x)
    return text if len(text) <= n else text[: n - 3] + "..."


def _check_fields(obj: dict, allowed: tuple[str, ...], prefix: str = "") -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise BadRequest(f"{prefix}{unknown[0]}", f"unknown field; this server reads {', '.join(allowed)}")


# field -> (accepted?, what is served): the values that leave greedy decoding's tokens unchanged
_NEUTRAL: dict[str, tuple[Callable[[object], bool], str]] = {
    "temperature": (lambda v: v is None or (_is_number(v) and v == 0), "only 0 is served (greedy decoding)"),
    "top_p": (lambda v: v is None or (_is_number(v) and 0 < v <= 1),
              "expected a number in (0, 1] (greedy decoding does not read it)"),
    "top_k": (lambda v: v is None or _is_int(v), "expected an integer (greedy decoding does not read it)"),
    "min_p": (lambda v: v is None or (_is_number(v) and 0 <= v <= 1),
              "expected a number in [0, 1] (greedy decoding does not read it)"),
    "seed": (lambda v: v is None or _is_int(v), "expected an integer (greedy decoding does not read it)"),
    "user": (lambda v: v is None or isinstance(v, str), "expected a string"),
    "n": (lambda v: v is None or (_is_int(v) and v == 1), "only 1 is served (greedy decoding has one answer)"),
    "best_of": (lambda v: v is None or (_is_int(v) and v == 1), "only 1 is served (greedy decoding has one answer)"),
    "frequency_penalty": (lambda v: v is None or (_is_number(v) and v == 0),
                          "only 0 is served (a penalty changes the greedy tokens)"),
    "presence_penalty": (lambda v: v is None or (_is_number(v) and v == 0),
                         "only 0 is served (a penalty changes the greedy tokens)"),
    "repetition_penalty": (lambda v: v is None or (_is_number(v) and v == 1),
                           "only 1 is served (a penalty changes the greedy tokens)"),
    "min_new_tokens": (lambda v: v is None or (_is_int(v) and v == 0),
                       "only 0 is served (the engine stops at the target's EOS tokens)"),
    "ignore_eos": (lambda v: v is None or v is False, "only false is served (the engine stops at the target's EOS "
                   "tokens)"),
    "stop": (lambda v: v is None or v == "" or v == [], "stop strings are not served; give stop_token_ids"),
    "stream": (lambda v: v is None or v is False, "streaming is not served; send false or leave it out"),
    "return_logprob": (lambda v: v is None or v is False, "log-probabilities are not served"),
    "logprobs": (lambda v: v is None or v is False, "log-probabilities are not served"),
    "echo": (lambda v: v is None or v is False, "echo is not served; the prompt's ids are in prompt_token_ids"),
    "suffix": (lambda v: v is None or v == "", "suffix is not served"),
    "logit_bias": (lambda v: v is None or v == {}, "logit_bias is not served"),
    "return_token_ids": (lambda v: v is None or isinstance(v, bool), "expected true or false (token_ids are "
                         "always returned)"),
}


def _neutral(obj: dict, fields: tuple[str, ...], prefix: str = "") -> None:
    for name in fields:
        if name in obj:
            ok, served = _NEUTRAL[name]
            if not ok(obj[name]):
                raise BadRequest(f"{prefix}{name}", f"{served}, got {_show(obj[name])}")


def _ids(x, where: str, limits: Limits) -> tuple[int, ...]:
    if not isinstance(x, list) or not x:
        raise BadRequest(where, f"expected a non-empty list of token ids, got {_show(x)}")
    for i, t in enumerate(x):
        if not _is_int(t):
            raise BadRequest(f"{where}[{i}]", f"expected a token id (an integer), got {_show(t)}")
        if not 0 <= t < limits.vocab_size:
            raise BadRequest(f"{where}[{i}]", f"token id {t} lies outside the target's vocabulary "
                             f"(0..{limits.vocab_size - 1})")
    return tuple(x)


def _text(x, where: str, limits: Limits) -> tuple[int, ...]:
    if not isinstance(x, str) or not x:
        raise BadRequest(where, f"expected a non-empty string, got {_show(x)}")
    if limits.encode is None:
        raise BadRequest(where, "a text prompt needs the target's tokenizer.json and this target has none; "
                         "send token ids instead")
    ids = tuple(limits.encode(x))
    if not ids:
        raise BadRequest(where, "the text encodes to no tokens")
    return ids


def _count(x: list, where: str) -> None:
    if not x:
        raise BadRequest(where, "an empty list: give at least one prompt")
    if len(x) > MAX_PROMPTS:
        raise BadRequest(where, f"{len(x)} prompts in one request; at most {MAX_PROMPTS}")


def _max_new(v, where: str, limits: Limits, default: int) -> int:
    if v is None:
        return min(default, limits.max_new_tokens)
    if not _is_int(v) or v < 1:
        raise BadRequest(where, f"expected a positive integer, got {_show(v)}")
    if v > limits.max_new_tokens:
        raise BadRequest(where, f"{v} exceeds this server's limit of {limits.max_new_tokens} new tokens per request")
    return v


def _stop_ids(v, where: str, limits: Limits) -> frozenset[int]:
    if v is None:
        return frozenset()
    if not isinstance(v, list):
        raise BadRequest(where, f"expected a list of token ids, got {_show(v)}")
    return frozenset(_ids(v, where, limits)) if v else frozenset()


def _rids(v, n: int, listed: bool, new_id: Callable[[], str]) -> list[str]:
    if v is None:
        return [new_id() for _ in range(n)]
    if listed:
        if not isinstance(v, list) or len(v) != n or not all(isinstance(r, str) and r for r in v):
            raise BadRequest("rid", f"expected a list of {n} non-empty strings (one per prompt), got {_show(v)}")
        return list(v)
    if not isinstance(v, str) or not v:
        raise BadRequest("rid", f"expected a non-empty string, got {_show(v)}")
    return [v]


def _jobs(prompts, where: list[str], rids: list[str], n: int, n_field: str, stops, limits: Limits) -> tuple[Job, ...]:
    for p, w in zip(prompts, where):
        if len(p) + n > limits.context:
            raise BadRequest(w, f"a prompt of {len(p)} tokens + {n_field} {n} exceeds the target's context of "
                             f"{limits.context} tokens")
    return tuple(Job(r, p, n, stops) for r, p in zip(rids, prompts))


# ---------------------------------------------------------------------------------- parsing
def read_body(raw: bytes) -> dict:
    """The request body as a JSON object."""
    if not raw.strip():
        raise BadRequest(None, "empty body: send one JSON object")
    try:
        body = json.loads(raw)
    except UnicodeDecodeError:
        raise BadRequest(None, "the body is not UTF-8 text: send one JSON object") from None
    except json.JSONDecodeError as e:
        raise BadRequest(None, f"the body is not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(body, dict):
        raise BadRequest(None, f"the body must be one JSON object, got {_show(body)}")
    return body


GENERATE_FIELDS = ("text", "input_ids", "sampling_params", "rid", "stream", "return_logprob")
SAMPLING_FIELDS = ("max_new_tokens", "temperature", "stop_token_ids", "top_p", "top_k", "min_p", "n",
                   "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "ignore_eos",
                   "stop")


def _prompts(value, field: str, listed: bool, check, limits: Limits) -> tuple[list[str], list]:
    """One prompt, or each of a list, checked by `check(prompt, where, limits)`: (where, prompts)."""
    if not listed:
        return [field], [check(value, field, limits)]
    _count(value, field)
    where = [f"{field}[{i}]" for i in range(len(value))]
    return where, [check(p, w, limits) for p, w in zip(value, where)]


def parse_generate(body: dict, limits: Limits, new_id: Callable[[], str]) -> Call:
    """A `/generate` body (SGLang's native API) → its jobs."""
    _check_fields(body, GENERATE_FIELDS)
    _neutral(body, ("stream", "return_logprob"))
    sp = body.get("sampling_params")
    sp = {} if sp is None else sp
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params", f"expected an object, got {_show(sp)}")
    _check_fields(sp, SAMPLING_FIELDS, "sampling_params.")
    _neutral(sp, tuple(f for f in SAMPLING_FIELDS if f in _NEUTRAL), "sampling_params.")
    n = _max_new(sp.get("max_new_tokens"), "sampling_params.max_new_tokens", limits, GENERATE_DEFAULT_NEW)
    stops = _stop_ids(sp.get("stop_token_ids"), "sampling_params.stop_token_ids", limits)

    ids, text = body.get("input_ids"), body.get("text")
    if ids is not None and text is not None:
        raise BadRequest("input_ids", "give input_ids or text, not both")
    if ids is None and text is None:
        raise BadRequest("text", "missing: give text (a string, or a list of strings) or input_ids (a list of "
                         "token ids, or a list of such lists)")
    if ids is not None:
        listed = isinstance(ids, list) and any(isinstance(p, list) for p in ids)
        where, prompts = _prompts(ids, "input_ids", listed, _ids, limits)
    else:
        listed = isinstance(text, list)
        where, prompts = _prompts(text, "text", listed, _text, limits)
    rids = _rids(body.get("rid"), len(prompts), listed, new_id)
    return Call(_jobs(prompts, where, rids, n, "sampling_params.max_new_tokens", stops, limits), listed)


COMPLETION_FIELDS = ("model", "prompt", "max_tokens", "temperature", "stop_token_ids", "top_p", "n", "best_of",
                     "stream", "echo", "logprobs", "stop", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "seed", "user", "suffix", "logit_bias", "return_token_ids")


def parse_completion(body: dict, limits: Limits, rid: str) -> Call:
    """A `/v1/completions` body (the OpenAI API) → its jobs, named `rid-0`, `rid-1`, ..."""
    _check_fields(body, COMPLETION_FIELDS)
    _neutral(body, tuple(f for f in COMPLETION_FIELDS if f in _NEUTRAL))
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise BadRequest("model", f"expected a string, got {_show(body['model'])}")
    n = _max_new(body.get("max_tokens"), "max_tokens", limits, COMPLETIONS_DEFAULT_NEW)
    stops = _stop_ids(body.get("stop_token_ids"), "stop_token_ids", limits)
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("prompt", "missing: give text, a list of token ids, or a list of either")
    if isinstance(prompt, str):
        where, prompts = _prompts(prompt, "prompt", False, _text, limits)
    elif isinstance(prompt, list) and prompt and _is_int(prompt[0]):
        where, prompts = _prompts(prompt, "prompt", False, _ids, limits)
    elif isinstance(prompt, list):
        _count(prompt, "prompt")
        check = _text if isinstance(prompt[0], str) else _ids if isinstance(prompt[0], list) else None
        if check is None:
            raise BadRequest("prompt[0]", f"expected text, a token id or a list of token ids, got {_show(prompt[0])}")
        where, prompts = _prompts(prompt, "prompt", True, check, limits)
    else:
        raise BadRequest("prompt", f"expected text, a list of token ids, or a list of either, got {_show(prompt)}")
    rids = [f"{rid}-{i}" for i in range(len(prompts))]
    return Call(_jobs(prompts, where, rids, n, "max_tokens", stops, limits), isinstance(prompt, list) and
                not _is_int(prompt[0]))


# ---------------------------------------------------------------------------------- answers
def finish(job: Job, tokens: list[int], eos: frozenset[int]) -> Finish:
    """The job's tokens up to and including the first EOS or stop token, and why it ended."""
    stops = job.stop_ids | eos
    for i, t in enumerate(tokens):
        if t in stops:
            return Finish(list(tokens[: i + 1]), "stop", t)
    return Finish(list(tokens), "length" if len(tokens) >= job.max_new_tokens else "stop")


def generate_answer(job: Job, fin: Finish, text: str | None, verify_steps: int, accept_length: float,
                    e2e_latency: float, engine_batch: int) -> dict:
    """One `/generate` answer, SGLang's shape: text, output_ids, meta_info."""
    reason = {"type": "length", "length": len(fin.tokens)} if fin.reason == "length" else \
        {"type": "stop", "matched": fin.matched}
    return {"text": text, "output_ids": fin.tokens,
            "meta_info": {"id": job.rid, "prompt_tokens": len(job.prompt_ids), "completion_tokens": len(fin.tokens),
                          "finish_reason": reason, "spec_verify_ct": verify_steps,
                          "spec_accept_length": round(accept_length, 6), "e2e_latency": round(e2e_latency, 6),
                          "engine_batch": engine_batch}}


def completion_answer(cid: str, created: int, model: str, jobs: tuple[Job, ...], fins: list[Finish],
                      texts: list[str | None]) -> dict:
    """One `/v1/completions` answer, OpenAI's shape, with each choice's exact `token_ids` (and
    `prompt_token_ids`) beside its text."""
    choices = [{"index": i, "text": text, "token_ids": fin.tokens, "prompt_token_ids": list(job.prompt_ids),
                "logprobs": None, "finish_reason": fin.reason, "stop_reason": fin.matched}
               for i, (job, fin, text) in enumerate(zip(jobs, fins, texts))]
    prompt = sum(len(j.prompt_ids) for j in jobs)
    completion = sum(len(f.tokens) for f in fins)
    return {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


def error_body(status: int, message: str, param: str | None = None, kind: str | None = None) -> dict:
    """The error both APIs' clients read: {"error": {"message", "type", "param", "code"}}, the
    message on one line."""
    kind = kind or ("invalid_request_error" if 400 <= status < 500 else "server_error")
    return {"error": {"message": " ".join(str(message).split()), "type": kind, "param": param, "code": status}}
