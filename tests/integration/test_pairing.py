"""Real paired runs: systems in worker processes the controller starts and times."""

import json

import pytest

from specpilot.services.controller import stats

from specpilot.entrypoints.demo import micro_pair
from specpilot.devices import device_list
from specpilot.services.controller import pairing
from specpilot.services.controller.pairing import system
from specpilot.services.gpu_worker.systems import LocalWorkers, SystemProcess
from specpilot.zoo.workloads import stdlib_completion

TARGET, DRAFTER, _ = micro_pair()
STOCK = {"target": str(TARGET), "drafter": str(DRAFTER), "mode": "chain", "max_new_tokens": 12}
LOCAL = LocalWorkers()
REQS = [{"id": r.id, "prompt": r.prompt} for r in stdlib_completion(limit=2)]


def test_stock_against_stock_is_not_accepted_and_the_verdict_is_sealed(tmp_path):
    rec = pairing.judge(system(STOCK), system(STOCK), system(STOCK), REQS, ["cpu:0", "cpu:1"], repeats=2, workers=LOCAL)
    assert not rec["accepted"]
    assert len(rec["samples"]) == len(rec["stock_samples"]) == 4  # 2 repeats × 2 swapped slots
    assert {s["slot"] for s in rec["samples"]} == {0, 1}
    assert all(s["candidate_tps"] > 0 and s["incumbent_tps"] > 0 for s in rec["samples"])
    assert rec["outputs_deterministic"] and not rec["outputs_differ"] and rec["forcing"]["passed"]
    assert len(rec["controller_code_sha256"]) == 64
    path = pairing.write_verdict(rec, tmp_path)
    assert json.loads(path.read_text())["samples"] == rec["samples"]
    with pytest.raises(FileExistsError):
        pairing.write_verdict(rec, tmp_path)  # never rewritten


def test_a_candidate_faster_than_a_slowed_incumbent_is_accepted_by_the_rule_on_its_samples():
    """The incumbent is stock slowed by a planted defect (every generation takes 4× as long, the
    same tokens); the candidate is stock. Acceptance is certain; the verdict's figures are what
    the statistics give on its own raw samples."""
    slowed = {**STOCK, "defect": "slowdown:3"}
    rec = pairing.judge(system(STOCK), system(slowed), system(STOCK), REQS, ["cpu:0", "cpu:1"], repeats=3,
                        workers=LOCAL)
    assert rec["accepted"], rec["reasons"]
    assert rec["forcing"]["passed"] and not rec["outputs_differ"] and rec["outputs_deterministic"]
    assert all(s["candidate_tps"] > 2 * s["incumbent_tps"] for s in rec["samples"])
    est = stats.gain([stats.PairedSample(**s) for s in rec["samples"]])
    noise = stats.gain([stats.PairedSample(**s) for s in rec["stock_samples"]])
    d = stats.decide(est, noise, outputs_differ=False)
    assert (est.gain, est.lower, d.threshold, d.accepted) == (rec["gain"], rec["lower_bound"], rec["threshold"], True)
    assert rec["lower_bound"] - 1 > rec["threshold"] and "accepted" in rec["reasons"]


def test_one_device_interleaves_abba():
    out = pairing.run_pair(system(STOCK), system({**STOCK, "mode": "ar"}), REQS, ["cpu:0"], repeats=1, workers=LOCAL)
    assert sorted(s.slot for s in out["samples"]) == [0, 1]
    assert out["outputs"]["candidate"][0] == out["outputs"]["incumbent"][0]  # lossless: same tokens


def test_a_worker_that_cannot_start_is_reported_with_its_output():
    with pytest.raises(RuntimeError, match="worker on cpu:0 could not load the system") as e:
        SystemProcess({"target": "/nonexistent", "mode": "ar"}, "cpu:0", timeout=120)
    assert "nonexistent" in str(e.value)


def test_a_hung_worker_hits_the_timeout():
    with pytest.raises(RuntimeError, match="no answer within"):
        SystemProcess(STOCK, "cpu:0", timeout=0.01)


def test_device_list():
    assert device_list("cpu,cpu") == ["cpu:0", "cpu:1"]
    assert device_list("cuda:0,cuda:1") == ["cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match="one or two"):
        device_list("cpu,cpu,cpu")


def test_a_biased_candidate_is_rejected_by_token_forcing_even_if_fast():
    bad = {**STOCK, "mode": "ar", "defect": "logit_bias:" + ",".join(map(str, range(40, 140))) + ":3"}
    rec = pairing.judge(system(bad), system(STOCK), system(STOCK), REQS, ["cpu:0", "cpu:1"], repeats=2, workers=LOCAL)
    assert not rec["forcing"]["passed"] and not rec["accepted"]
    assert any(r.startswith("token forcing") for r in rec["reasons"])
