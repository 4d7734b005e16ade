"""`specpilot serve engine`: the engine behind SGLang's /generate and OpenAI's /v1/completions, on
the shipped micro pair (CPU, float64): the same tokens as `Engine.generate`, concurrent requests
batched, bad requests refused on one line, an engine failure confined to its request, and the
real command serving over HTTP."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from specpilot.entrypoints.cli import main
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.services.engine_server import protocol
from specpilot.services.engine_server.app import create_app
from specpilot.zoo.workloads import Request

MICRO = Path(__file__).resolve().parents[2] / "zoo" / "checkpoints" / "micro"
TARGET, BLOCK = MICRO / "dense", MICRO / "dense-block"
SYSTEMS = {"ar": dict(mode="ar"), "chain": dict(mode="chain", drafter=str(BLOCK)),
           "tree": dict(mode="tree", drafter=str(BLOCK), tree="best-first:8"),
           "ngram": dict(mode="chain", drafter="ngram", draft_len=4)}
PROMPT_IDS = [[5, 17, 300, 41, 9], [1, 2, 3], [77, 78, 79, 80, 81, 82, 83]]
TEXTS = ["def add(a, b):", "import os\n"]


def engine_for(name: str, target=TARGET, max_new_tokens: int = 64) -> Engine:
    return Engine(EngineConfig(target=str(target), dtype="float64", max_new_tokens=max_new_tokens, **SYSTEMS[name]))


@pytest.fixture(scope="module")
def engines():
    return {name: engine_for(name) for name in SYSTEMS}


@pytest.fixture(scope="module")
def clients(engines):
    with TestClient(create_app(engines["ar"], max_batch=4), raise_server_exceptions=False) as ar, \
            TestClient(create_app(engines["chain"]), raise_server_exceptions=False) as chain, \
            TestClient(create_app(engines["tree"]), raise_server_exceptions=False) as tree, \
            TestClient(create_app(engines["ngram"], max_batch=4), raise_server_exceptions=False) as ngram:
        yield {"ar": ar, "chain": chain, "tree": tree, "ngram": ngram}


def expected(engine: Engine, n: int, ids=None, text=None) -> list[int]:
    return engine.generate(Request(id="x", prompt=text, prompt_ids=ids, max_new_tokens=n)).tokens


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_both_apis_return_the_engines_tokens(name, engines, clients):
    engine, client, ar = engines[name], clients[name], engines["ar"]
    for ids, text in [(PROMPT_IDS[0], None), (None, TEXTS[0])]:
        want = expected(engine, 9, ids, text)
        assert want == expected(ar, 9, ids, text)  # lossless: every mode gives the AR tokens
        r = client.post("/generate", json={("input_ids" if ids else "text"): ids or text,
                                           "sampling_params": {"max_new_tokens": 9, "temperature": 0}})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["output_ids"] == want and out["text"] == engine.decode_text(want)
        meta = out["meta_info"]
        prompt_len = len(ids) if ids else len(engine.encode(Request(id="x", prompt=text)))
        assert meta["prompt_tokens"] == prompt_len and meta["completion_tokens"] == 9
        assert meta["finish_reason"] == {"type": "length", "length": 9}
        res = engine.generate(Request(id="x", prompt=text, prompt_ids=ids, max_new_tokens=9))
        assert meta["spec_verify_ct"] == len(res.steps) and meta["spec_accept_length"] == pytest.approx(res.tau_mean)
        assert meta["e2e_latency"] > 0 and meta["id"]
        if name == "ar":
            assert meta["spec_accept_length"] == 1.0
        r = client.post("/v1/completions", json={"model": "dense", "prompt": ids or text, "max_tokens": 9,
                                                 "temperature": 0})
        assert r.status_code == 200, r.text
        c = r.json()
        assert c["object"] == "text_completion" and c["id"].startswith("cmpl-") and c["model"] == "dense"
        (choice,) = c["choices"]
        assert choice["token_ids"] == want and choice["text"] == engine.decode_text(want)
        assert choice["index"] == 0 and choice["finish_reason"] == "length"
        assert c["usage"] == {"prompt_tokens": prompt_len, "completion_tokens": 9, "total_tokens": prompt_len + 9}


def test_lists_of_prompts_answer_in_order(engines, clients):
    ar, client = engines["ar"], clients["ngram"]
    r = client.post("/generate", json={"input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": 6},
                                       "rid": ["a", "b", "c"]})
    assert r.status_code == 200, r.text
    assert [o["output_ids"] for o in r.json()] == [expected(ar, 6, p) for p in PROMPT_IDS]
    assert [o["meta_info"]["id"] for o in r.json()] == ["a", "b", "c"]
    r = client.post("/generate", json={"text": TEXTS, "sampling_params": {"max_new_tokens": 5}})
    assert [o["output_ids"] for o in r.json()] == [expected(ar, 5, text=t) for t in TEXTS]
    r = client.post("/v1/completions", json={"model": "x", "prompt": TEXTS, "max_tokens": 5})
    assert [ch["token_ids"] for ch in r.json()["choices"]] == [expected(ar, 5, text=t) for t in TEXTS]
    assert [ch["index"] for ch in r.json()["choices"]] == [0, 1]
    r = client.post("/v1/completions", json={"model": "x", "prompt": PROMPT_IDS[:2], "max_tokens": 4})
    assert [ch["token_ids"] for ch in r.json()["choices"]] == [expected(ar, 4, p) for p in PROMPT_IDS[:2]]
    assert [ch["prompt_token_ids"] for ch in r.json()["choices"]] == PROMPT_IDS[:2]


def test_stop_token_ids_end_a_request(engines, clients):
    want = expected(engines["ar"], 10, PROMPT_IDS[2])
    stop = want[3]
    first = want.index(stop)
    r = clients["ar"].post("/generate", json={"input_ids": PROMPT_IDS[2], "sampling_params": {
        "max_new_tokens": 10, "stop_token_ids": [stop]}})
    out = r.json()
    assert out["output_ids"] == want[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    r = clients["ar"].post("/v1/completions", json={"prompt": PROMPT_IDS[2], "max_tokens": 10,
                                                    "stop_token_ids": [stop]})
    (choice,) = r.json()["choices"]
    assert choice["token_ids"] == want[: first + 1] and choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop


class Gated:
    """The engine, with its first engine call held until the test lets it go (so the requests
    sent meanwhile wait in the queue), and requests holding `poison` failing inside the engine."""

    def __init__(self, engine, poison: int | None = None):
        self.engine, self.poison = engine, poison
        self.entered, self.gate = threading.Event(), threading.Event()
        self.batches: list[int] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def _hold(self, requests):
        if requests and not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(30)
        if self.poison is not None and any(self.poison in r.prompt_ids for r in requests):
            raise RuntimeError(f"planted failure\non token {self.poison}")

    def generate_batch(self, requests, batch, progress=None):
        self._hold(requests)
        if requests:
            self.batches.append(len(requests))
        return self.engine.generate_batch(requests, batch, progress)

    def generate(self, req, record=None):
        self._hold([req])
        self.batches.append(1)
        return self.engine.generate(req, record)


def send_concurrently(client, bodies, gated, batcher):
    """The first body starts an engine call that is held; the others queue behind it."""
    answers = [None] * len(bodies)

    def post(i):
        answers[i] = client.post("/generate", json=bodies[i])

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    threads[0].start()
    assert gated.entered.wait(30)
    for t in threads[1:]:
        t.start()
    deadline = time.time() + 30
    while batcher.waiting() < len(bodies) - 1 and time.time() < deadline:
        time.sleep(0.01)
    gated.gate.set()
    for t in threads:
        t.join(60)
    return answers


def test_concurrent_requests_are_batched_and_each_gets_its_tokens(engines):
    gated = Gated(engines["ar"])
    app = create_app(gated, max_batch=4)
    prompts = [PROMPT_IDS[0], PROMPT_IDS[1], PROMPT_IDS[2], [9, 8, 7, 6], [400, 401]]
    lengths = [5, 7, 4, 6, 8]
    bodies = [{"input_ids": p, "sampling_params": {"max_new_tokens": n}} for p, n in zip(prompts, lengths)]
    with TestClient(app) as client:
        answers = send_concurrently(client, bodies, gated, app.state.batcher)
        info = client.get("/server_info").json()
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert [a.json()["output_ids"] for a in answers] == [expected(engines["ar"], n, p) for p, n in zip(prompts,
                                                                                                     lengths)]
    assert gated.batches[0] == 1 and gated.batches[1] == 4  # the four that waited: one engine call
    assert max(a.json()["meta_info"]["engine_batch"] for a in answers) == 4
    assert info["engine_calls"]["largest_batch"] == 4 and info["engine_calls"]["requests"] == 5
    assert info["max_batch"] == 4


def test_an_engine_failure_fails_only_the_requests_it_hit(engines):
    gated = Gated(engines["ar"], poison=4000)
    app = create_app(gated, max_batch=4)
    good = [PROMPT_IDS[0], PROMPT_IDS[1]]
    bodies = [{"input_ids": good[0], "sampling_params": {"max_new_tokens": 4}},
              {"input_ids": [3, 4000, 5], "sampling_params": {"max_new_tokens": 4}},
              {"input_ids": good[1], "sampling_params": {"max_new_tokens": 4}}]
    with TestClient(app, raise_server_exceptions=False) as client:
        answers = send_concurrently(client, bodies, gated, app.state.batcher)
        assert [a.status_code for a in answers] == [200, 500, 200]
        err = answers[1].json()["error"]
        assert "planted failure on token 4000" in err["message"] and "\n" not in err["message"]
        assert err["code"] == 500
        assert [answers[i].json()["output_ids"] for i in (0, 2)] == [expected(engines["ar"], 4, p) for p in good]
        assert client.get("/health").status_code == 200
        r = client.post("/generate", json={"input_ids": PROMPT_IDS[2], "sampling_params": {"max_new_tokens": 3}})
        assert r.status_code == 200 and r.json()["output_ids"] == expected(engines["ar"], 3, PROMPT_IDS[2])
        assert client.get("/server_info").json()["engine_calls"]["failed_calls"] >= 1


BAD = [
    ("/generate", b"{bad", 400, None),
    ("/generate", b"", 400, None),
    ("/generate", b"[1, 2]", 400, None),
    ("/generate", {"sampling_params": {"max_new_tokens": 4}}, 400, "text"),
    ("/generate", {"text": "a", "input_ids": [1]}, 400, "input_ids"),
    ("/generate", {"input_ids": [1, 4096]}, 400, "input_ids[1]"),
    ("/generate", {"input_ids": [1, -1]}, 400, "input_ids[1]"),
    ("/generate", {"input_ids": [1, True]}, 400, "input_ids[1]"),
    ("/generate", {"input_ids": [1, "2"]}, 400, "input_ids[1]"),
    ("/generate", {"input_ids": []}, 400, "input_ids"),
    ("/generate", {"input_ids": [[1, 2], []]}, 400, "input_ids[1]"),
    ("/generate", {"text": ""}, 400, "text"),
    ("/generate", {"text": 5}, 400, "text"),
    ("/generate", {"text": ["a", 3]}, 400, "text[1]"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 0}}, 400, "sampling_params.max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": -3}}, 400, "sampling_params.max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 65}}, 400, "sampling_params.max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": "8"}}, 400, "sampling_params.max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"temperature": 0.7}}, 400, "sampling_params.temperature"),
    ("/generate", {"text": "a", "sampling_params": {"temperature": "0"}}, 400, "sampling_params.temperature"),
    ("/generate", {"text": "a", "sampling_params": {"repetition_penalty": 1.2}}, 400,
     "sampling_params.repetition_penalty"),
    ("/generate", {"text": "a", "sampling_params": {"stop_token_ids": [99999]}}, 400,
     "sampling_params.stop_token_ids[0]"),
    ("/generate", {"text": "a", "sampling_params": {"max_tokens": 4}}, 400, "sampling_params.max_tokens"),
    ("/generate", {"text": "a", "sampling_params": [1]}, 400, "sampling_params"),
    ("/generate", {"text": "a", "stream": True}, 400, "stream"),
    ("/generate", {"text": "a", "rid": 7}, 400, "rid"),
    ("/generate", {"text": ["a", "b"], "rid": ["x"]}, 400, "rid"),
    ("/generate", {"prompt": "a"}, 400, "prompt"),
    ("/generate", {"input_ids": list(range(1, 4090)), "sampling_params": {"max_new_tokens": 10}}, 400, "input_ids"),
    ("/v1/completions", {"model": "dense"}, 400, "prompt"),
    ("/v1/completions", {"prompt": "a", "temperature": 1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 1000}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": {"text": "a"}}, 400, "prompt"),
    ("/v1/completions", {"prompt": [[1, 2], "a"]}, 400, "prompt[1]"),
    ("/v1/completions", {"prompt": [None]}, 400, "prompt[0]"),
    ("/v1/completions", {"prompt": "a", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "a", "stop": ["\n"]}, 400, "stop"),
    ("/v1/completions", {"prompt": "a", "logprobs": 3}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "a", "model": 3}, 400, "model"),
    ("/v1/completions", {"prompt": "a", "max_token": 3}, 400, "max_token"),
]


def test_bad_requests_are_refused_on_one_line_and_the_server_goes_on(engines, clients):
    client = clients["ar"]
    for path, body, status, param in BAD:
        r = client.post(path, content=body) if isinstance(body, bytes) else client.post(path, json=body)
        assert r.status_code == status, (path, body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and err["code"] == status, (body, err)
        assert err["message"] and "\n" not in err["message"] and (param is None or err["message"].startswith(param))
    assert client.get("/generate").status_code == 405
    r = client.get("/nowhere")
    assert r.status_code == 404 and "/v1/completions" in r.json()["error"]["message"]
    r = client.post("/generate", json={"input_ids": PROMPT_IDS[1], "sampling_params": {"max_new_tokens": 3}})
    assert r.status_code == 200 and r.json()["output_ids"] == expected(engines["ar"], 3, PROMPT_IDS[1])
    assert client.get("/health").json() == {"status": "ok"}


def test_text_prompt_on_a_target_without_tokenizer(tmp_path, engines):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(TARGET / f, bare / f)
    engine = engine_for("ar", bare)
    with TestClient(create_app(engine, max_batch=2)) as client:
        for path, body, param in [("/generate", {"text": "def f"}, "text"),
                                  ("/v1/completions", {"prompt": ["def f"]}, "prompt[0]")]:
            r = client.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param
            assert "tokenizer.json" in r.json()["error"]["message"]
        r = client.post("/generate", json={"input_ids": PROMPT_IDS[0], "sampling_params": {"max_new_tokens": 4}})
        assert r.json()["output_ids"] == expected(engines["ar"], 4, PROMPT_IDS[0]) and r.json()["text"] is None
        assert client.get("/server_info").json()["tokenizer"] is False


def test_server_info_and_models(clients):
    info = clients["tree"].get("/server_info").json()
    assert {k: info[k] for k in ("target", "drafter", "mode", "tree", "dtype", "device", "max_batch")} == {
        "target": str(TARGET), "drafter": str(BLOCK), "mode": "tree", "tree": "best-first:8", "dtype": "float64",
        "device": "cpu", "max_batch": 1}
    assert info["version"] and info["max_new_tokens"] == 64 and info["vocab_size"] == 4096
    assert clients["ar"].get("/get_server_info").json()["mode"] == "ar"
    assert clients["ar"].get("/v1/models").json()["data"][0]["id"] == "dense"


def test_create_app_refuses_a_batch_the_engine_cannot_decode():
    eager = Engine(EngineConfig(target=str(TARGET), dtype="float64", driver="eager", **SYSTEMS["chain"]))
    with pytest.raises(ValueError, match="driver 'eager' decodes one request at a time"):
        create_app(eager, max_batch=2)


def test_parsing_is_pure():
    limits = protocol.Limits(vocab_size=10, max_new_tokens=5, context=12, eos=frozenset({0}),
                             encode=lambda s: [len(s) % 10])
    call = protocol.parse_generate({"text": ["ab", "abc"], "sampling_params": {"stop_token_ids": [7]}}, limits,
                                   lambda: "r")
    assert call.listed and [j.prompt_ids for j in call.jobs] == [(2,), (3,)]
    assert all(j.max_new_tokens == 5 and j.stop_ids == {7} for j in call.jobs)
    call = protocol.parse_completion({"prompt": [1, 2, 3], "max_tokens": 2}, limits, "cmpl-x")
    assert not call.listed and call.jobs[0].rid == "cmpl-x-0" and call.jobs[0].prompt_ids == (1, 2, 3)
    with pytest.raises(protocol.BadRequest, match="context of 12 tokens"):
        protocol.parse_generate({"input_ids": list(range(1, 10)), "sampling_params": {"max_new_tokens": 4}}, limits,
                                lambda: "r")
    job = protocol.Job("r", (1,), 4, frozenset({7}))
    assert protocol.finish(job, [3, 7, 0, 2], frozenset({0})) == protocol.Finish([3, 7], "stop", 7)
    assert protocol.finish(job, [3, 4, 5, 0], frozenset({0})) == protocol.Finish([3, 4, 5, 0], "stop", 0)
    assert protocol.finish(job, [3, 4, 5, 6], frozenset({0})) == protocol.Finish([3, 4, 5, 6], "length")


def test_cli_refuses_bad_arguments_on_one_line(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main(["serve", "engine", "--target", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing) in err and "Traceback" not in err
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    shutil.copy(TARGET / "config.json", corrupt / "config.json")
    (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    assert main(["serve", "engine", "--target", str(corrupt), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert "model.safetensors" in out["error"] and out["command"] == "serve"
    for argv, words in [(["--drafter", str(BLOCK), "--driver", "eager", "--max-batch", "2"], "driver 'eager'"),
                        (["--max-batch", "0"], "--max-batch 0"), (["--port", "70000"], "--port 70000"),
                        (["--tree", "best-first:4"], "--tree best-first:4 applies only to --mode tree"),
                        (["--store", "sqlite://"], "--store applies")]:
        assert main(["serve", "engine", "--target", str(TARGET), *argv, "--json"]) == 2
        assert words in json.loads(capsys.readouterr().out)["error"]
    assert main(["serve", "engine", "--json"]) == 2
    assert "needs --target" in json.loads(capsys.readouterr().out)["error"]
    assert main(["serve", "memory-api", "--target", str(TARGET), "--json"]) == 2
    assert "--target applies only to `specpilot serve engine`" in json.loads(capsys.readouterr().out)["error"]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_the_command_serves_over_http(engines):
    proc = subprocess.Popen([sys.executable, "-m", "specpilot.entrypoints.cli", "serve", "engine", "--target", str(TARGET),
                             "--drafter", str(BLOCK), "--mode", "chain", "--dtype", "float64", "--port", "0",
                             "--max-new-tokens", "32", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        ready = json.loads(line)
        url = ready["url"]
        assert ready["mode"] == "chain" and ready["max_batch"] == 8 and ready["drafter"] == str(BLOCK)
        for _ in range(100):
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError("the engine server did not answer /health")
        out = _post(url + "/generate", {"text": TEXTS[1], "sampling_params": {"max_new_tokens": 6}})
        assert out["output_ids"] == expected(engines["chain"], 6, text=TEXTS[1])
        c = _post(url + "/v1/completions", {"model": "dense", "prompt": PROMPT_IDS[0], "max_tokens": 6})
        assert c["choices"][0]["token_ids"] == expected(engines["ar"], 6, PROMPT_IDS[0])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # uvicorn shuts down gracefully, then re-raises SIGTERM: the usual status of a terminated server
    assert proc.returncode in (0, -15) and "Traceback" not in proc.stderr.read()
