"""Outputs feed the next command: `generate --out` / `--json` → `force` (and `pair`), no hand-made files."""

from __future__ import annotations

import json

import pytest

from specpilot.entrypoints.cli import main, read_requests
from specpilot.engine.checkpoint import save_model
from specpilot.engine.drafters import save_drafter
from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("rt")
    cfg = tiny_config("llama", vocab=97)
    save_model(random_model(cfg, seed=2), root / "target")
    save_drafter(random_drafter_net("block", cfg, seed=3), root / "drafter")
    (root / "w.jsonl").write_text("\n".join(json.dumps({"id": f"r{i}", "prompt_ids": [1 + i, 2 + i, 3, 4],
                                                        "max_new_tokens": 8}) for i in range(3)) + "\n")
    return root


def test_generate_then_force(pair, tmp_path, capsys):
    common = ["generate", "--target", str(pair / "target"), "--workload", str(pair / "w.jsonl"), "--dtype", "float64"]
    ar, stock, cand = tmp_path / "ar.jsonl", tmp_path / "stock.jsonl", tmp_path / "cand.json"
    assert main([*common, "--mode", "ar", "--out", str(ar)]) == 0
    assert main([*common, "--mode", "chain", "--drafter", str(pair / "drafter"), "--out", str(stock)]) == 0
    capsys.readouterr()
    assert main([*common, "--mode", "tree", "--drafter", str(pair / "drafter"), "--tree", "best-first:8",
                 "--json"]) == 0
    printed = capsys.readouterr().out
    cand.write_text(printed)  # what `generate --json > cand.json` leaves
    lines = [json.loads(x) for x in stock.read_text().splitlines()]
    doc = json.loads(printed)
    assert [x["id"] for x in lines] == ["r0", "r1", "r2"]
    assert [x["prompt_ids"] for x in lines] == [[1, 2, 3, 4], [2, 3, 3, 4], [3, 4, 3, 4]]
    assert [o["prompt_ids"] for o in doc["outputs"]] == [x["prompt_ids"] for x in lines]
    assert main(["force", "--scorer", str(pair / "target"), "--outputs", str(cand), "--baseline", str(stock),
                 "--ar", str(ar), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and out["candidate"]["tokens"] == sum(len(o["tokens"]) for o in doc["outputs"])


def test_generate_output_is_a_workload_and_a_system_for_pair(pair, tmp_path, capsys):
    gen = tmp_path / "gen.jsonl"
    assert main(["generate", "--target", str(pair / "target"), "--mode", "ar", "--workload", str(pair / "w.jsonl"),
                 "--out", str(gen), "--json"]) == 0
    doc = capsys.readouterr().out
    assert [(r.id, list(r.prompt_ids)) for r in read_requests(gen)] == \
        [(o["id"], o["prompt_ids"]) for o in json.loads(doc)["outputs"]]
    printed = tmp_path / "gen.json"
    printed.write_text(doc)
    # the printed document names its system: pair reads it as a config (and fails only on the workload)
    assert main(["pair", "--candidate", str(printed), "--incumbent", str(printed), "--workload",
                 str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "none.jsonl" in err and "not a system config" not in err
