"""The `specpilot generate` contract other issues and users script against."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specpilot.entrypoints.cli import main
from specpilot.engine.checkpoint import save_model
from specpilot.engine.drafters import save_drafter
from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    cfg = tiny_config("hybrid", vocab=97)
    save_model(random_model(cfg, seed=2), root / "target")
    save_drafter(random_drafter_net("block_markov", cfg, seed=3), root / "drafter")
    wl = root / "w.jsonl"
    wl.write_text("\n".join(json.dumps({"id": f"r{i}", "prompt_ids": list(range(1 + i, 9 + i)),
                                        "max_new_tokens": 10 + i}) for i in range(3)) + "\n")
    return root


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("drafter", ["drafter", "ngram"])
def test_generate_json_contract(ckpt, capsys, drafter):
    common = ["generate", "--target", str(ckpt / "target"), "--workload", str(ckpt / "w.jsonl"),
              "--dtype", "float64"]
    d = str(ckpt / drafter) if drafter == "drafter" else "ngram"
    ar = run_json(capsys, *common, "--mode", "ar")
    ch = run_json(capsys, *common, "--mode", "chain", "--drafter", d, "--draft-len", "5")
    for out in (ar, ch):
        assert {"outputs", "tau_mean", "tokens_per_s", "steps"} <= out.keys()
        assert [o["id"] for o in out["outputs"]] == ["r0", "r1", "r2"]
        assert [len(o["tokens"]) for o in out["outputs"]] == [10, 11, 12]  # per-request max_new_tokens
        assert all({"id", "tokens", "text"} <= o.keys() for o in out["outputs"])
    assert [o["tokens"] for o in ch["outputs"]] == [o["tokens"] for o in ar["outputs"]]
    assert ar["tau_mean"] == 1.0 and ch["tau_mean"] >= 1.0
    assert ar["steps"] == sum(len(o["tokens"]) - 1 for o in ar["outputs"])


def test_generate_batch_gives_each_request_its_batch_1_tokens(ckpt, capsys):
    common = ["generate", "--target", str(ckpt / "target"), "--workload", str(ckpt / "w.jsonl"),
              "--dtype", "float64", "--mode", "chain", "--drafter", "ngram", "--draft-len", "4"]
    one, two = run_json(capsys, *common), run_json(capsys, *common, "--batch", "2")
    assert [o["tokens"] for o in two["outputs"]] == [o["tokens"] for o in one["outputs"]]
    assert two["batch"] == 2 and all("accepted_per_position" in o for o in two["outputs"])
    for extra, message in ((["--driver", "eager"], "driver 'eager' decodes one request at a time"),
                           (["--record", str(ckpt / "r.json")], "--batch 1")):
        assert main([*common, *extra, "--batch", "2", "--json"]) == 2
        assert message in json.loads(capsys.readouterr().out)["error"]


def test_generate_takes_the_batch_row_selection_rules(ckpt, capsys):
    common = ["generate", "--target", str(ckpt / "target"), "--workload", str(ckpt / "w.jsonl"), "--dtype", "float64"]
    ar = run_json(capsys, *common, "--mode", "ar")
    rules = run_json(capsys, *common, "--drafter", str(ckpt / "drafter"), "--mode", "tree", "--tree", "shared:4:8",
                     "--draft-len", "6", "--draft-lens", "6,3", "--batch", "3", "--driver", "static")
    assert [o["tokens"] for o in rules["outputs"]] == [o["tokens"] for o in ar["outputs"]]
    assert rules["config"]["draft_lens"] == "6,3" and rules["config"]["tree"] == "shared:4:8"
    assert main([*common, "--drafter", "ngram", "--draft-lens", "9,2", "--draft-len", "4", "--json"]) == 2
    assert "draft_lens" in json.loads(capsys.readouterr().out)["error"]


def test_text_prompt_without_tokenizer_says_what_to_do(ckpt, capsys):
    assert main(["generate", "--target", str(ckpt / "target"), "--mode", "ar", "--prompt", "def f("]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json" in err and "prompt_ids" in err


def test_missing_target_folder(tmp_path, capsys):
    assert main(["generate", "--target", str(tmp_path / "nope"), "--mode", "ar", "--prompt", "x"]) == 2
    assert "nope" in capsys.readouterr().err


def test_chain_without_drafter(ckpt, capsys):
    assert main(["generate", "--target", str(ckpt / "target"), "--mode", "chain",
                 "--workload", str(ckpt / "w.jsonl")]) == 2
    assert "needs a drafter" in capsys.readouterr().err


def test_malformed_workload_names_the_line(ckpt, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt_ids": [1, 2]}\n{"id": "b", "prompt_ids": [1, -5]}\n')
    assert main(["generate", "--target", str(ckpt / "target"), "--mode", "ar", "--workload", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "prompt_ids" in err


def test_out_of_vocabulary_prompt_ids(ckpt, tmp_path, capsys):
    bad = tmp_path / "oov.jsonl"
    bad.write_text('{"id": "a", "prompt_ids": [1, 500]}\n')
    assert main(["generate", "--target", str(ckpt / "target"), "--mode", "ar", "--workload", str(bad)]) == 2
    assert "outside the vocabulary" in capsys.readouterr().err


def test_console_script_runs(ckpt):
    r = subprocess.run([sys.executable, "-m", "specpilot.entrypoints.cli", "generate", "--target", str(ckpt / "target"),
                        "--mode", "ar", "--workload", str(ckpt / "w.jsonl"), "--max-new-tokens", "3", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["outputs"]) == 3


def test_demo_quick_runs_a_round_and_prints_its_contract(capsys, tmp_path):
    assert main(["demo", "--quick", "--rounds", "1", "--run-dir", str(tmp_path / "run"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (r,) = out["rounds"]
    assert r["direction"] and r["candidates"]
    assert all(set(a) == {"entry", "gain", "lower_bound"} for a in r["accepted"])
    assert out["speedup_over_stock"] > 0 and Path(out["report"]).is_file()


def test_tree_mode_record_and_replay(ckpt, tmp_path, capsys):
    rec = tmp_path / "rec.jsonl"
    common = ["generate", "--target", str(ckpt / "target"), "--workload", str(ckpt / "w.jsonl"),
              "--drafter", str(ckpt / "drafter"), "--dtype", "float64", "--draft-len", "6"]
    ar = run_json(capsys, *common[:-4], "--dtype", "float64", "--mode", "ar")
    tree = run_json(capsys, *common, "--mode", "tree", "--tree", "best-first:12", "--record", str(rec))
    assert [o["tokens"] for o in tree["outputs"]] == [o["tokens"] for o in ar["outputs"]]
    out = run_json(capsys, "replay", "--record", str(rec), "--policy", "best-first:12", "--policy", "chain",
                   "--policy", "oracle", "--profile-out", str(tmp_path / "prof.json"))
    taus = {r["policy"]: r["tau_mean"] for r in out["policies"]}
    assert taus["best-first:12"] == pytest.approx(out["online_tau_mean"]) == pytest.approx(tree["tau_mean"])
    assert taus["oracle"] >= taus["best-first:12"] and taus["oracle"] >= taus["chain"]
    # the measured profile drives a Sequoia tree online
    seq = run_json(capsys, *common, "--mode", "tree", "--tree", "sequoia:8", "--profile", str(tmp_path / "prof.json"))
    assert [o["tokens"] for o in seq["outputs"]] == [o["tokens"] for o in ar["outputs"]]


def test_bad_tree_policy_and_record(ckpt, tmp_path, capsys):
    assert main(["generate", "--target", str(ckpt / "target"), "--drafter", "ngram", "--mode", "tree",
                 "--tree", "bushy:3", "--prompt", "x"]) == 2
    assert "tree policy" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "steps": [{"lattice": null}]}\n')
    assert main(["replay", "--record", str(bad)]) == 2
    assert "line 1" in capsys.readouterr().err


def test_bad_profile_file(ckpt, tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text('{"nope": 1}')
    assert main(["generate", "--target", str(ckpt / "target"), "--drafter", "ngram", "--mode", "tree",
                 "--tree", "sequoia:4", "--profile", str(bad), "--workload", str(ckpt / "w.jsonl")]) == 2
    assert "not an acceptance profile" in capsys.readouterr().err


def test_pair_rejects_a_bad_system_config(ckpt, tmp_path, capsys):
    bad = tmp_path / "c.json"
    bad.write_text('{"target": "x", "mode": "warp"}')
    assert main(["pair", "--candidate", str(bad), "--incumbent", str(bad), "--workload",
                 str(ckpt / "w.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "c.json" in err and "not a system config" in err


def test_generate_runs_two_level_verification(tmp_path, capsys):
    """--mode tlv on a bf16-valued target (the quick pass reads its W12 view) is AR's output in float64,
    and its flags are refused outside tlv mode."""
    import torch

    cfg = tiny_config("qwen3", vocab=97)
    save_model(random_model(cfg, seed=4).to(torch.bfloat16), tmp_path / "target")
    save_drafter(random_drafter_net("block", cfg, seed=5), tmp_path / "drafter")
    common = ["generate", "--target", str(tmp_path / "target"), "--workload", str(tmp_path / "w.jsonl"),
              "--dtype", "float64", "--max-new-tokens", "24"]
    (tmp_path / "w.jsonl").write_text(json.dumps({"id": "a", "prompt_ids": [3, 1, 4, 1, 5, 9, 2, 6]}) + "\n")
    ar = run_json(capsys, *common, "--mode", "ar")
    tlv = run_json(capsys, *common, "--mode", "tlv", "--drafter", str(tmp_path / "drafter"), "--tlv-nodes", "6",
                   "--tlv-q-depth", "3", "--draft-len", "4")
    assert tlv["outputs"][0]["tokens"] == ar["outputs"][0]["tokens"]
    assert tlv["config"]["mode"] == "tlv" and (tlv["config"]["tlv_nodes"], tlv["config"]["tlv_q_depth"]) == (6, 3)
    assert main([*common, "--mode", "tree", "--drafter", str(tmp_path / "drafter"), "--tlv-nodes", "6", "--json"]) == 2
    assert "--tlv-nodes 6 applies only to --mode tlv" in json.loads(capsys.readouterr().out)["error"]
    assert main([*common, "--mode", "tlv", "--drafter", str(tmp_path / "drafter"), "--tlv-nodes", "99", "--json"]) == 2
    assert "tlv_nodes 99" in json.loads(capsys.readouterr().out)["error"]
