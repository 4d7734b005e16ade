"""Server systems end to end on the shipped micro pair, CPU: the GPU worker launches a serving
process (`specpilot serve engine`, which speaks SGLang's and the OpenAI API), its returned ids are
AR's, its process group is gone after close, a server that cannot start is one line; and a round
whose stock and candidates are server systems is judged, forcing included."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from specpilot.entrypoints.demo import SHIPPED, micro_pair
from specpilot.services.controller.pairing import judge, system
from specpilot.services.controller.round import load_deployment
from specpilot.services.gpu_worker.systems import LocalWorkers
from specpilot.services.memory_api.seed import seed_entries
from specpilot.systemspec import EngineSystem, parse_system

from test_round import embedded_round

TARGET, DRAFTER, TRAINED = micro_pair()
pytestmark = pytest.mark.skipif(not TRAINED, reason="needs the shipped micro checkpoints")
MARKOV = SHIPPED / "dense-block-markov"
SPECPILOT = str(Path(sys.executable).parent / "specpilot")
REQS = [{"id": "a", "prompt": "def add(a, b):\n    return", "max_new_tokens": 12},
        {"id": "b", "prompt": "import os\n\ndef list_files(path):\n", "max_new_tokens": 10}]
LOCAL = LocalWorkers()


def served(api="sglang", mode="chain", **args) -> dict:
    launch = [SPECPILOT, "serve", "engine", "--host", "127.0.0.1", "--port", "{port}", "--device", "{device}",
              "--dtype", "float32", "--target", str(TARGET), "--max-new-tokens", "64"]
    if mode != "ar":
        launch += ["--drafter", str(MARKOV), "--mode", mode]
    return {"server": {"url": "http://127.0.0.1:{port}", "api": api, "launch": launch, "target": str(TARGET),
                       "ready_timeout": 120, "args": args}}


def ar_tokens() -> list[list[int]]:
    w = LOCAL.start(EngineSystem({"target": str(TARGET), "mode": "ar", "dtype": "float32"}), "cpu:0", 120)
    try:
        return w.generate(REQS)[0]
    finally:
        w.close()


def test_served_engine_returns_ar_tokens_over_both_apis_and_dies_on_close():
    ar = ar_tokens()
    for api, batch in (("sglang", 1), ("openai", 2)):
        w = LOCAL.start(parse_system(served(api, **{"--draft-len": 4})), "cpu:1", 120)
        try:
            outs, ids = w.generate(REQS, batch)
            assert outs == ar, api
            assert all(ids) and ids == w.prompt_ids(REQS)  # the target's tokenization, sent as ids
            assert w._reference is None  # no second copy of the target while the server is timed
            with pytest.raises(ValueError, match="needs each request's max_new_tokens"):
                w.generate([{"id": "c", "prompt": "x = 1"}])
            scores = w.score(ids[0], outs[0])  # forcing's scorer: the served target in AR
            assert scores.argmax_token_ids == outs[0]
            pid = w.proc.pid
        finally:
            w.close()
        time.sleep(0.2)
        with pytest.raises(ProcessLookupError):  # the whole group is gone
            os.killpg(pid, 0)


def test_a_server_that_cannot_start_is_one_line():
    bad = {"server": {"url": "http://127.0.0.1:{port}", "launch": [sys.executable, "-c", "raise SystemExit('no GPU')"],
                      "ready_timeout": 30}}
    with pytest.raises(RuntimeError) as e:
        LOCAL.start(parse_system(bad), "cpu:0", 30)
    assert "exited" in str(e.value) and "no GPU" in str(e.value) and "\n" not in str(e.value)
    silent = {"server": {"url": "http://127.0.0.1:{port}", "ready_timeout": 1,
                         "launch": [sys.executable, "-c", "import time; time.sleep(30)"]}}
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not answer 200 within 1 s"):
        LOCAL.start(parse_system(silent), "cpu:0", 30)
    assert time.monotonic() - t0 < 15  # and the sleeper was killed, not waited for


def test_a_paired_run_of_a_server_against_an_engine_gives_the_same_verdict_shape():
    engine = system({"target": str(TARGET), "drafter": str(MARKOV), "mode": "chain", "dtype": "float32",
                     "draft_len": 4})
    server = system(served(**{"--draft-len": 4}))
    v_server = judge(server, engine, engine, REQS, ["cpu:0", "cpu:1"], repeats=2, workers=LOCAL)
    v_engine = judge(engine, engine, engine, REQS, ["cpu:0", "cpu:1"], repeats=2, workers=LOCAL)
    assert set(v_server) == set(v_engine)
    assert v_server["forcing"]["passed"] and not v_server["outputs_differ"]  # lossless: the same tokens
    assert v_server["candidate"]["server"]["args"] == {"--draft-len": 4}
    json.dumps(v_server)  # a verdict is plain JSON


def test_a_round_of_server_systems_judges_every_candidate(tmp_path):
    dep = load_deployment({"name": "micro-served", "target": str(TARGET), "prompts": 1, "max_new_tokens": 12,
                           "repeats": 2, "max_candidates": 2, "stock": served(**{"--draft-len": 8})})
    assert dep["stock"]["server"]["target"] == str(Path(TARGET).resolve())
    rnd = embedded_round(dep, tmp_path / "run")
    ids = {e.id for e in seed_entries()}
    assert "server-specpilot-engine" in ids
    summary = rnd.run(1)
    r = summary["rounds"][0]
    assert r["status"] == "done" and r["direction"] == "server" and r["measurement"] is None
    judged = [c for c in r["candidates"] if not c["pruned"]]
    assert len(judged) == 2 and all(c["name"].startswith("server-specpilot-engine/") for c in judged)
    for c in judged:
        assert c["error"] is None and c["verdict"]["forcing_passed"], c
        v = json.loads(Path(c["verdict"]["path"]).read_text())
        assert v["candidate"]["server"]["args"] == {"--draft-len": 8, **c["options"]["server_args"]}
        assert v["stock"]["server"]["args"] == {"--draft-len": 8}
    skipped = {s["name"]: s["reason"] for s in r["agents"]["search"]["skipped"]}
    assert "flags of sglang" in skipped["server-sglang-eagle/steps3-topk1-tokens4"]
    assert "engine setting" in skipped["tree-best-first/n16"]
    over_ar = summary["final"]["speedup_over_ar"]
    assert over_ar["against"]["engine"] == {"target": str(Path(TARGET).resolve()), "mode": "ar"}  # the served target
    assert over_ar["gain"] > 0 and over_ar["lower_bound"] <= over_ar["gain"]
    assert Path(summary["report"]).is_file()


def test_pair_cli_checks_a_server_system_at_the_edge(tmp_path, capsys):
    from specpilot.entrypoints.cli import main

    good, bad, work = tmp_path / "server.json", tmp_path / "bad.json", tmp_path / "w.jsonl"
    good.write_text(json.dumps(served()))
    bad.write_text(json.dumps({"server": {"url": "http://h:1", "api": "grpc"}}))
    work.write_text(json.dumps(REQS[0]) + "\n")
    assert main(["pair", "--candidate", str(good), "--incumbent", str(good), "--workload", str(work)]) == 2
    assert "is a server system: give --stock" in capsys.readouterr().err
    assert main(["pair", "--candidate", str(bad), "--incumbent", str(good), "--stock", str(good),
                 "--workload", str(work)]) == 2
    err = capsys.readouterr().err.strip()
    assert "server field 'api'" in err and str(bad) in err and "\n" not in err
