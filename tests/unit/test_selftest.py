"""The controller's self-test on real runs of the shipped micro pair, and the planted defects."""

import pytest

from specpilot.entrypoints.cli import main
from specpilot.engine.engine import EngineConfig, parse_defect
from specpilot.entrypoints.selftest import run_selftest


def test_selftest_catches_planted_defects_and_passes_lossless_systems():
    out = run_selftest(trials=4, prompts=4, new_tokens=24, progress=False, real_runs=0)
    assert all(out["lossless_passed"].values())
    assert out["defect_trials"] >= 3 and out["defect_rejected"] == out["defect_trials"]
    assert all(r["flip_rate"] > 0 for r in out["defect_runs"])
    assert out["no_flip_bias_passed"]
    assert out["slowdown_accepted"] == 0 and out["swap_inverts"]
    assert out["aa_accepted"] <= 0.05 * out["aa_trials"]
    # power at a round's own design (6 repeats × 1 cell) and the assumed CPU noise: a 12 % gain
    # is rarely accepted there, though the reference design (14 × 4) accepts it almost always
    d = out["deployment_design"]
    assert (d["repeats"], d["cells"], d["noise_source"]) == (6, 1, "assumed")
    assert d["speedup_accepted"] < 0.2 * d["trials"] <= out["speedup_accepted"]
    assert d["smallest_gain"] > 0.12 and not d["meets_target"] and d["repeats_for_target"] > 6
    assert d["aa_accepted"] <= 0.05 * d["trials"]


def test_defect_specs():
    assert parse_defect("logit_bias:3,5:2.5") == ({3: 2.5, 5: 2.5}, 0.0)
    assert parse_defect("slowdown:0.03") == ({}, 0.03)
    for bad in ("logit_bias:3", "slowdown:-1", "bias:1:2", "logit_bias:x:1"):
        with pytest.raises(ValueError, match="expected logit_bias"):
            parse_defect(bad)
    with pytest.raises(ValueError, match="defect"):
        EngineConfig(target="t", mode="ar", defect="nonsense").validate()


def test_selftest_cli_json(capsys, monkeypatch):
    import specpilot.entrypoints.selftest as st

    real = st.run_selftest
    monkeypatch.setattr(st, "run_selftest", lambda trials, progress, real_runs, design: real(
        trials=2, prompts=2, new_tokens=16, progress=False, real_runs=0, design=design))
    import json

    assert main(["selftest", "--json", "--real-runs", "0", "--repeats", "12"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("defect_rejected", "defect_trials", "aa_accepted", "aa_trials", "slowdown_accepted",
                "speedup_accepted", "swap_inverts", "reference_design", "deployment_design"):
        assert key in out
    assert out["deployment_design"]["repeats"] == 12
    assert main(["selftest", "--json", "--repeats", "1"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]  # under --json an error is one JSON object on stdout
    assert "--repeats 1" in error and "2 or more" in error


def test_silent_slowdown_keeps_the_output():
    from specpilot.entrypoints.demo import micro_pair
    from specpilot.engine.engine import Engine
    from specpilot.zoo.workloads import Request

    target, drafter, _ = micro_pair()
    req = [Request(id="a", prompt="def f(x):\n")]
    runs = [Engine(EngineConfig(target=str(target), drafter=str(drafter), max_new_tokens=12, defect=d)).run(req)
            for d in (None, "slowdown:0.5")]
    assert runs[0]["outputs"][0]["tokens"] == runs[1]["outputs"][0]["tokens"]
