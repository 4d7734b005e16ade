"""Bad input reaches a user as one line naming the culprit — file, field or flag, the value, what is
allowed — with a non-zero exit and no traceback, before any work starts; under --json as one
{"error": ...} object on stdout. One test per category of input, across every command that takes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specpilot.entrypoints.cli import main
from specpilot.engine.checkpoint import save_model
from specpilot.engine.drafters import save_drafter
from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config
from specpilot.systemspec import EngineSystem


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target and its block drafter, a workload, and an output file for force."""
    root = tmp_path_factory.mktemp("pair")
    cfg = tiny_config("llama", vocab=97)
    save_model(random_model(cfg, seed=2), root / "target")
    save_drafter(random_drafter_net("block", cfg, seed=3), root / "drafter")
    (root / "w.jsonl").write_text("\n".join(json.dumps({"id": f"r{i}", "prompt_ids": [1 + i, 2, 3, 4],
                                                        "max_new_tokens": 6}) for i in range(2)) + "\n")
    return root


def broken_copy(src: Path, dst: Path, **fields) -> Path:
    """A copy of a checkpoint folder with config.json fields replaced (a value None: removed)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in fields.items():
        cfg.pop(k) if v is None else cfg.__setitem__(k, v)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def one_line_error(capsys, argv) -> str:
    """Run the CLI; it must fail with exactly one line on stderr and nothing on stdout, and, under
    --json, with exactly one {"error"} object on stdout and nothing on stderr."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, (out, err)
    assert main([*argv, "--json"]) == 2
    out, err = capsys.readouterr()
    assert err == "" and out.count("\n") == 1, (out, err)
    doc = json.loads(out)
    assert isinstance(doc["error"], str) and "\n" not in doc["error"]
    return doc["error"]


# config.json values that are the wrong type, missing, or nonsense, and what the message must name
BAD_FIELDS = [
    ({"hidden_size": "128"}, "hidden_size"),
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"vocab_size": -5}, "vocab_size"),
    ({"num_attention_heads": 2.5}, "num_attention_heads"),
    ({"rms_norm_eps": "tiny"}, "rms_norm_eps"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({"eos_token_id": 10_000}, "eos_token_id"),
    ({"architectures": "LlamaForCausalLM"}, "architectures"),
    ({"layer_types": ["full_attention", "warp"]}, "layer_types"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8}}, "rope_scaling"),
]


@pytest.mark.parametrize("fields,named", BAD_FIELDS, ids=[n for _, n in BAD_FIELDS])
def test_malformed_target_config_in_every_command(pair, tmp_path, capsys, fields, named):
    bad = broken_copy(pair / "target", tmp_path / "bad", **fields)
    sys_cfg = tmp_path / "sys.json"
    sys_cfg.write_text(json.dumps({"target": str(bad), "drafter": str(pair / "drafter"), "mode": "chain"}))
    dep = tmp_path / "dep.json"
    dep.write_text(json.dumps({"name": "x", "target": str(bad), "drafter": str(pair / "drafter"),
                               "workload": str(pair / "w.jsonl")}))
    outputs = tmp_path / "out.jsonl"
    outputs.write_text(json.dumps({"id": "r0", "prompt_ids": [1, 2], "tokens": [3, 4]}) + "\n")
    commands = {
        "generate": ["generate", "--target", str(bad), "--drafter", str(pair / "drafter"), "--prompt", "x"],
        "round": ["round", "--deployment", str(dep), "--run-dir", str(tmp_path / "run")],
        "force": ["force", "--scorer", str(bad), "--outputs", str(outputs), "--baseline", str(outputs),
                  "--delta", "0.5"],
        "pair": ["pair", "--candidate", str(sys_cfg), "--incumbent", str(sys_cfg), "--workload", str(pair / "w.jsonl")],
        "costmodel": ["costmodel", "--target", str(bad), "--drafter", str(pair / "drafter")],
    }
    for name, argv in commands.items():
        msg = one_line_error(capsys, argv)
        assert "config.json" in msg and named in msg, (name, msg)
    assert not (tmp_path / "run" / "rounds.db").exists()  # refused before the round started


def test_malformed_drafter_config_is_named(pair, tmp_path, capsys):
    bad = broken_copy(pair / "drafter", tmp_path / "d", block_size="16", target_layers=[])
    msg = one_line_error(capsys, ["generate", "--target", str(pair / "target"), "--drafter", str(bad),
                                  "--prompt", "x"])
    assert "config.json" in msg and "block_size" in msg and "'16'" in msg


@pytest.mark.parametrize("url,says", [
    ("not a url", "not a database URL"),
    ("mysql://u@localhost/db", "not supported"),
    ("sqlite:////no/such/folder/m.db", "does not exist"),
    ("postgresql+psycopg://u@127.0.0.1:1/db", "cannot reach"),
])
def test_unusable_store_urls(pair, tmp_path, capsys, url, says):
    dep = tmp_path / "dep.json"
    dep.write_text(json.dumps({"name": "x", "target": str(pair / "target"), "drafter": str(pair / "drafter"),
                               "workload": str(pair / "w.jsonl")}))
    for argv in (["memory", "--store", url, "list"], ["memory", "show", "x", "--store", url],
                 ["round", "--deployment", str(dep), "--store", url, "--run-dir", str(tmp_path / "run")],
                 ["serve", "memory-api", "--store", url],
                 ["serve", "controller", "--store", url]):
        msg = one_line_error(capsys, argv)
        assert "--store" in msg and says in msg, (argv, msg)


def test_default_store_from_the_environment_is_named(capsys, monkeypatch):
    monkeypatch.setenv("SPECPILOT_MEMORY_URL", "nonsense")
    msg = one_line_error(capsys, ["memory", "list"])
    assert "SPECPILOT_MEMORY_URL" in msg and "'nonsense'" in msg


def test_deployments_and_workloads_naming_what_does_not_exist(pair, tmp_path, capsys):
    base = {"name": "x", "target": str(pair / "target"), "drafter": str(pair / "drafter")}
    cases = [({"workload": "missing.jsonl"}, "workload"), ({"target": "nowhere"}, "target"),
             ({"drafters": {"block": "nowhere"}}, "drafters.block"), ({"gpu": "h900"}, "gpu"),
             ({"budgets": ["bushy:3"]}, "budgets"), ({"devices": "tpu:0"}, "tpu"), ({"prompts": "3"}, "prompts"),
             ({"drafters": {"block_markov": str(pair / "drafter")}}, "is a block drafter"),
             ({"drafters": {"warp": str(pair / "drafter")}}, "unknown drafter kind"), ({"agent": "x"}, "agent")]
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"id": "a", "prompt_ids": [1, 500]}) + "\n")
    cases += [({"workload": str(big)}, "prompt id 500"), ({"workload": "humaneval"}, "no tokenizer.json")]
    for extra, named in cases:
        dep = tmp_path / "dep.json"
        dep.write_text(json.dumps({**base, **extra}))
        msg = one_line_error(capsys, ["round", "--deployment", str(dep), "--run-dir", str(tmp_path / "run")])
        assert named in msg, (extra, msg)
    sys_cfg = tmp_path / "sys.json"
    sys_cfg.write_text(json.dumps({"target": str(pair / "target"), "drafter": str(pair / "drafter")}))
    for argv in (["generate", "--target", str(pair / "target"), "--mode", "ar", "--workload", "missing.jsonl"],
                 ["pair", "--candidate", str(sys_cfg), "--incumbent", str(sys_cfg), "--workload", "missing.jsonl"],
                 ["pair", "--candidate", str(tmp_path / "none.json"), "--incumbent", str(sys_cfg), "--workload",
                  str(pair / "w.jsonl")],
                 ["pair", "--candidate", str(sys_cfg), "--incumbent", str(sys_cfg), "--workload", str(big)],
                 ["generate", "--target", str(pair / "target"), "--mode", "ar", "--workload", str(big)],
                 ["force", "--scorer", str(pair / "target"), "--outputs", "missing.jsonl", "--baseline",
                  "missing.jsonl", "--delta", "1"]):
        msg = one_line_error(capsys, argv)
        assert "missing.jsonl" in msg or "none.json" in msg or "500" in msg, (argv, msg)


def test_nonsense_flag_combinations_are_refused_with_the_reason(pair, capsys):
    t, d = str(pair / "target"), str(pair / "drafter")
    common = ["generate", "--target", t, "--prompt", "x"]
    for extra, says in [(["--mode", "ar", "--tree", "chain"], "--tree"),
                        (["--drafter", d, "--mode", "chain", "--profile", "p.json"], "--profile"),
                        (["--drafter", d, "--mode", "tree", "--tree", "best-first:8", "--profile", "p.json"], "sequoia"),
                        (["--drafter", d, "--draft-len", "500"], "--draft-len"),
                        (["--drafter", d, "--draft-len", "40"], "block_size"),
                        (["--mode", "ar", "--record", "r.jsonl"], "--record"),
                        (["--mode", "ar", "--max-new-tokens", "0"], "--max-new-tokens")]:
        msg = one_line_error(capsys, common + extra)
        assert says in msg, (extra, msg)
    sys_cfg = pair / "sys.json"
    sys_cfg.write_text(json.dumps({"target": t, "drafter": d}))
    msg = one_line_error(capsys, ["pair", "--candidate", str(sys_cfg), "--incumbent", str(sys_cfg), "--workload",
                                  str(pair / "w.jsonl"), "--repeats", "1"])
    assert "--repeats" in msg


def test_a_drafter_for_another_target_needs_force_drafter(pair, tmp_path, capsys):
    other = tmp_path / "other"
    save_model(random_model(tiny_config("llama", vocab=89), seed=5), other / "lm")  # a draft LM, other vocabulary
    msg = one_line_error(capsys, ["generate", "--target", str(pair / "target"), "--drafter", str(other / "lm"),
                                  "--prompt", "x"])
    assert "vocab_size 89" in msg and "--force-drafter" in msg
    # a zoo manifest beside the drafter that names another target
    zoo = tmp_path / "zoo"
    shutil.copytree(pair / "target", zoo / "t1")
    shutil.copytree(pair / "target", zoo / "t2")
    shutil.copytree(pair / "drafter", zoo / "t1-block")
    (zoo / "zoo.json").write_text(json.dumps({"preset": "x", "models": [
        {"name": "t1", "path": "t1", "role": "target", "target": None},
        {"name": "t2", "path": "t2", "role": "target", "target": None},
        {"name": "t1-block", "path": "t1-block", "role": "drafter", "target": "t1"}]}))
    argv = ["generate", "--target", str(zoo / "t2"), "--drafter", str(zoo / "t1-block"), "--mode", "chain",
            "--workload", str(pair / "w.jsonl"), "--max-new-tokens", "3"]
    msg = one_line_error(capsys, argv)
    assert "t1" in msg and "--force-drafter" in msg
    assert main([*argv, "--force-drafter", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["outputs"]) == 2


def test_a_target_broken_inside_a_worker_is_one_clean_line(pair, tmp_path):
    """What only the system's own process finds (here: a config the CLI never saw) comes back as one
    line naming the file and field, not a traceback cut short."""
    from specpilot.services.gpu_worker.systems import LocalWorkers

    bad = broken_copy(pair / "target", tmp_path / "bad", intermediate_size="wide")
    with pytest.raises(RuntimeError) as e:
        LocalWorkers().start(EngineSystem({"target": str(bad), "mode": "ar"}), "cpu", 120)
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert "config.json" in msg and "intermediate_size" in msg and "'wide'" in msg


def test_usage_errors_under_json_are_json(capsys):
    assert main(["generate", "--json"]) == 2
    out, err = capsys.readouterr()
    assert err == "" and "--target" in json.loads(out)["error"]
    assert main(["serve", "memory-api", "--port", "0", "--json"]) == 2
    assert "--port" in json.loads(capsys.readouterr().out)["error"]


def test_round_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["round", "-h"])
    text = capsys.readouterr().out
    assert "(default: 1)" in text  # --rounds
    for field in ('repeats=6', 'prompts=3', 'max_new_tokens=48', 'budgets=["chain"'):
        assert field in text, field


def test_an_unreadable_tokenizer_is_refused_before_work(pair, tmp_path, capsys):
    bad = tmp_path / "t"
    shutil.copytree(pair / "target", bad)
    (bad / "tokenizer.json").write_text("{broken")
    for argv in (["generate", "--target", str(bad), "--mode", "ar", "--prompt", "x"],
                 ["costmodel", "--target", str(bad), "--drafter", "ngram"]):
        msg = one_line_error(capsys, argv)
        assert "tokenizer.json" in msg, (argv, msg)


@pytest.mark.parametrize("text, culprit", [
    ("{", "not a readable JSON manifest"),
    ('{"preset": "x"}', '"models"'),
    ('{"preset": "x", "models": [{"name": "a", "path": "a", "role": "target", "kind": "qwen3"}]}', "models[0]"),
    ('{"preset": "x", "models": ["a"]}', "models[0]"),
])
def test_broken_zoo_manifest(tmp_path, capsys, text, culprit):
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "zoo.json").write_text(text)
    msg = one_line_error(capsys, ["zoo", "list", "--dir", str(tmp_path)])
    assert "zoo.json" in msg and culprit in msg
