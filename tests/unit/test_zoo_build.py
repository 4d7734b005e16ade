"""The whole zoo pipeline at the `nano` preset: every model is written, loads through the engine's
real loading code, and is described in the manifest that `zoo list` reads."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from specpilot.entrypoints.cli import main
from specpilot.engine.checkpoint import load_model
from specpilot.engine.decode import generate
from specpilot.engine.drafters import DraftLM, FeatureDrafter, load_drafter
from specpilot.zoo import build as B
from specpilot.zoo.build import build


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo") / "nano"
    return out, build("nano", out, log=lambda *a: None)


def test_manifest_records_what_was_built(zoo):
    out, m = zoo
    assert m["preset"] == "nano" and len(m["corpus_sha256"]) == 64 and m["seed"] == 0
    assert m["device_name"] == "cpu" and len(m["date"]) == 10
    # the command that rebuilds it and the commit it was built from (this checkout's HEAD)
    assert m["command"] == "specpilot zoo build --preset nano --device cpu"
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=B.__file__.rsplit("/", 1)[0],
                          capture_output=True, text=True).stdout.strip()
    assert m["git_sha"].split("+")[0] == (head or "unknown")
    names = {e["name"] for e in m["models"]}
    for role in ("dense", "hybrid"):
        assert {role, f"{role}-sequential", f"{role}-block", f"{role}-block-markov", f"{role}-draft-lm"} <= names
    for e in m["models"]:
        assert (out / e["path"] / "config.json").is_file()
        assert e["params"] > 0
        if e["role"] == "drafter":
            assert e["target"] in ("dense", "hybrid") and e["tau"]["humaneval"] >= 1.0
        else:
            assert e["heldout_loss"] > 0 and (out / e["path"] / "tokenizer.json").is_file()
    assert json.loads((out / "zoo.json").read_text()) == m


def test_every_checkpoint_loads_and_decodes_losslessly(zoo):
    out, m = zoo
    for role in ("dense", "hybrid"):
        target = load_model(out / role, torch.float64)
        prompt = list(range(5, 25))
        ar = generate(target, prompt, 20).tokens
        for kind in ("sequential", "block", "block-markov", "draft-lm"):
            d = load_drafter(str(out / f"{role}-{kind}"), torch.float64, target=target)
            assert isinstance(d, DraftLM if kind == "draft-lm" else FeatureDrafter)
            assert generate(target, prompt, 20, d, draft_len=8).tokens == ar


def test_draft_lm_serves_transformers_assisted_generation(zoo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = zoo
    tgt = AutoModelForCausalLM.from_pretrained(out / "dense", dtype=torch.float32)
    asst = AutoModelForCausalLM.from_pretrained(out / "dense-draft-lm", dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(out / "dense")
    ids = tok("def add(a, b):", return_tensors="pt").input_ids
    kw = dict(do_sample=False, max_new_tokens=12)
    assert torch.equal(tgt.generate(ids, assistant_model=asst, **kw), tgt.generate(ids, **kw))


def test_zoo_list_json(zoo, capsys):
    out, m = zoo
    assert main(["zoo", "list", "--dir", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(m["models"])
    for r in rows:
        assert {"name", "path", "role", "kind", "target", "params", "heldout_loss", "tau"} <= r.keys()
        assert r["role"] in ("target", "drafter")


@pytest.mark.parametrize("available, share", [(200, 0.5), (3, 0.5), (200, 1.0), (200, 0.0)])
def test_distillation_prompts_mix_workload_like_prompts_and_corpus_windows(available, share):
    import dataclasses

    from specpilot.zoo.build import PRESETS, distill_prompts

    r = dataclasses.replace(PRESETS["nano"], distill_seqs=40, prompt_len=6, workload_prompts=share)
    stream = torch.arange(1000, 2000)
    fn = [[7] * 3 + [i] * 6 for i in range(available)] + [[5] * 4]  # one too short to use
    got = distill_prompts(r, stream, fn)
    assert got.shape == (40, 6)
    from_prompts = [row for row in got.tolist() if row[0] < 1000]
    assert len(from_prompts) == min(round(40 * share), available)  # the last 6 tokens of each usable prompt, each once
    assert all(row == [row[0]] * 6 for row in from_prompts) and len({row[0] for row in from_prompts}) == len(from_prompts)
    assert torch.equal(got, distill_prompts(r, stream, fn))  # deterministic in the recipe's seed


def test_as_stored_computes_exactly_what_loads(tmp_path):
    """τ is measured on `as_stored` models: they must equal the bf16 checkpoints as loaded (weights
    rounded; RoPE frequencies recomputed in float32, not rounded)."""
    from specpilot.engine.checkpoint import save_model
    from specpilot.engine.drafters import save_drafter
    from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config
    from specpilot.zoo.build import as_stored

    tgt = random_model(tiny_config("qwen3", vocab=61), seed=3)
    save_model(tgt, tmp_path / "t", dtype=torch.bfloat16)
    net = random_drafter_net("block", tgt.cfg, seed=4, block=6, lead_token=True)
    save_drafter(net, tmp_path / "d", dtype=torch.bfloat16)
    tgt, loaded = as_stored(tgt, torch.bfloat16), load_model(tmp_path / "t")
    ids = torch.arange(1, 40)[None]
    assert torch.equal(tgt(ids).logits, loaded(ids).logits)
    prompt = list(range(3, 30))
    d_mem = FeatureDrafter(as_stored(net, torch.bfloat16), tgt)
    d_disk = load_drafter(str(tmp_path / "d"), target=loaded)
    rec = [[], []]
    for d, r in zip((d_mem, d_disk), rec):
        generate(loaded, prompt, 12, d, draft_len=6, record=r)
    logps = [[s.lattice.logp.tolist() for s in r if s.lattice is not None] for r in rec]
    assert logps[0] and logps[0] == logps[1]


def test_recipe_overrides_parse_as_the_field_type_and_name_bad_ones():
    r = B.with_overrides(B.PRESETS["small"], ["target_steps=300", "target_lr=1e-3", "block_lead=false"])
    assert (r.target_steps, r.target_lr, r.block_lead) == (300, 1e-3, False)
    assert r.seq == B.PRESETS["small"].seq
    with pytest.raises(ValueError, match="'target=3'.*FIELD one of"):
        B.with_overrides(r, ["target=3"])  # a Shape, not a scalar
    with pytest.raises(ValueError, match="'seq=x'.*not a int"):
        B.with_overrides(r, ["seq=x"])
    with pytest.raises(ValueError, match="expected FIELD=VALUE"):
        B.with_overrides(r, ["seq"])
    with pytest.raises(ValueError, match="compile_scope 'graph' is not"):
        B.with_overrides(r, ["compile_scope=graph"])
    with pytest.raises(ValueError, match="hybrid_lr 0.0 is not a learning rate > 0"):
        B.with_overrides(r, ["hybrid_lr=0"])
    with pytest.raises(ValueError, match="target_schedule 'step' is not one of"):
        B.with_overrides(r, ["target_schedule=step"])
    with pytest.raises(ValueError, match="drafter_optimizer 'sgd' is not 'adamw' or 'muon'"):
        B.with_overrides(r, ["drafter_optimizer=sgd"])
    with pytest.raises(ValueError, match="context_weight -0.5 is not a weight"):
        B.with_overrides(r, ["context_weight=-0.5"])
    # optional fields take a value or none
    r = B.with_overrides(r, ["dense_block_steps=7", "block_lr=2e-3"])
    assert (r.dense_block_steps, r.block_lr) == (7, 2e-3)
    assert B.with_overrides(r, ["dense_block_steps=None"]).dense_block_steps is None
    with pytest.raises(ValueError, match="'dense_block_steps=x'.*not a int or none"):
        B.with_overrides(r, ["dense_block_steps=x"])


def test_a_manifest_recipe_reads_back_as_the_recipe():
    r = B.PRESETS["small"]
    assert B.recipe_from(json.loads(json.dumps(dataclasses.asdict(r)))) == r
    old = {k: v for k, v in dataclasses.asdict(r).items() if k != "context_weight"} | {"retired_field": 1}
    assert B.recipe_from(old) == dataclasses.replace(r, context_weight=1.0)  # the field's default


def test_roles_built_side_by_side_equal_the_roles_built_in_turn(tmp_path):
    """Forked role processes (as on a GPU) write the same weights as one process building the
    roles in turn: the draft LM's corpus steps, trained once by a third process and handed to both
    role processes, give both roles the start they get in turn. One torch thread, in a fresh
    interpreter: GNU OpenMP's thread pool does not survive a fork, and thread counts change float
    sums."""
    script = (f"import torch; torch.set_num_threads(1)\n"
              f"from specpilot.zoo.build import build\n"
              f"for name, par in (('turn', False), ('side', True)):\n"
              f"    m = build('nano', {str(tmp_path)!r} + '/' + name, log=lambda *a: None, parallel=par)\n"
              f"    assert m['parallel_roles'] == par\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=600)
    assert not (tmp_path / "side" / "draft-lm-corpus.pt").exists()  # the handoff file is removed
    m = json.loads((tmp_path / "turn" / "zoo.json").read_text())
    for e in m["models"]:
        a = (tmp_path / "turn" / e["path"] / "model.safetensors").read_bytes()
        assert (tmp_path / "side" / e["path"] / "model.safetensors").read_bytes() == a, e["name"]


def test_a_handoff_wait_ends_when_the_parent_marks_a_failure(tmp_path):
    import multiprocessing as mp

    h = B.Handoff(mp.get_context("fork"), tmp_path / "base.pt")
    h.failed.set()
    with pytest.raises(RuntimeError, match="draft LM's corpus steps failed"):
        h.get()
    h.put({"w": torch.ones(2)})
    assert torch.equal(h.get()["w"], torch.ones(2))


def test_the_dense_target_trains_its_own_steps_when_the_recipe_gives_them(monkeypatch):
    seen = {}
    monkeypatch.setattr(B.train, "train_lm", lambda model, stream, steps, *a, **k: seen.setdefault(
        model.cfg.family, steps))
    r = dataclasses.replace(B.PRESETS["nano"], target_steps=7, dense_steps=9)
    for hybrid in (False, True):
        B.train_target(r, hybrid, torch.zeros(100, dtype=torch.long), "cpu", None)
    assert seen == {"qwen3": 9, "qwen3_next": 7}
    seen.clear()
    B.train_target(dataclasses.replace(r, dense_steps=None), False, torch.zeros(100, dtype=torch.long), "cpu", None)
    assert seen == {"qwen3": 7}


def test_the_hybrid_target_trains_at_its_own_rate_when_the_recipe_gives_one(monkeypatch):
    seen = {}
    monkeypatch.setattr(B.train, "train_lm", lambda model, stream, steps, batch, seq, lr, *a, **k: seen.setdefault(
        model.cfg.family, lr))
    r = dataclasses.replace(B.PRESETS["nano"], target_lr=1e-3, hybrid_lr=2e-3)
    for hybrid in (False, True):
        B.train_target(r, hybrid, torch.zeros(100, dtype=torch.long), "cpu", None)
    assert seen == {"qwen3": 1e-3, "qwen3_next": 2e-3}
    seen.clear()
    B.train_target(dataclasses.replace(r, hybrid_lr=None), True, torch.zeros(100, dtype=torch.long), "cpu", None)
    assert seen == {"qwen3_next": 1e-3}


def test_the_dense_block_drafter_trains_its_own_steps_when_the_recipe_gives_them():
    r = dataclasses.replace(B.PRESETS["nano"], drafter_steps=5, block_steps=6, dense_block_steps=11)
    assert [r.training("block", role)[0] for role in ("dense", "hybrid")] == [11, 6]
    assert [r.training("sequential", role)[0] for role in ("dense", "hybrid")] == [5, 5]
    r = dataclasses.replace(r, dense_block_steps=None)
    assert [r.training("block", role)[0] for role in ("dense", "hybrid")] == [6, 6]


def test_drafter_depths_come_from_the_recipe():
    r = dataclasses.replace(B.PRESETS["nano"], block_layers=3, sequential_layers=2)
    cfg = B.target_config(r, hybrid=False)
    assert [B.drafter_config(r, k, cfg).num_hidden_layers for k in B.KINDS] == [2, 3, 3]


def test_zoo_build_set_changes_the_recipe_and_records_it(tmp_path, capsys):
    out = tmp_path / "nano"
    assert main(["zoo", "build", "--preset", "nano", "--out", str(out), "--roles", "dense",
                 "--set", "input_norm=false", "--set", "markov_steps=2", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert (m["recipe"]["input_norm"], m["recipe"]["markov_steps"]) == (False, 2)
    assert m["command"].endswith("--set input_norm=false --set markov_steps=2")
    cfg = json.loads((out / "dense-sequential" / "config.json").read_text())
    assert cfg["input_norm"] is False  # the nano recipe's own is true
    assert B.PRESETS["nano"].input_norm is True


def test_zoo_build_names_a_bad_set(tmp_path, capsys):
    assert main(["zoo", "build", "--preset", "nano", "--out", str(tmp_path / "x"), "--set", "input_norm=maybe"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "input_norm=maybe" in err[0] and "not a bool" in err[0]
    assert not (tmp_path / "x").exists()
