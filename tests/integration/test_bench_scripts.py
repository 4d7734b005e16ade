"""The committed benchmark commands run end to end (on the seconds-long `nano` preset, CPU) and
write results that carry what BENCHMARKS.md needs: command, device, date, git_sha, figures."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(script, *args):
    r = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def test_zoo_trees_builds_and_measures_every_pair(tmp_path):
    out = tmp_path / "trees.json"
    run("zoo_trees.py", "--preset", "nano", "--workdir", str(tmp_path), "--prompts", "3", "--new-tokens", "8",
        "--out", str(out))
    res = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha", "build_s"} <= set(res)
    assert set(res["pairs"]) == {"dense+block", "dense+block-markov", "hybrid+block", "hybrid+block-markov"}
    for pair in res["pairs"].values():
        assert pair["replay_steps"] > 0
        assert all(tau >= 1.0 for tau in pair["exact"].values())
        assert pair["replay"]["oracle"] >= pair["replay"]["chain"] >= 1.0
    # the same figures from two processes (prompts dealt round-robin), for the one target asked for
    two = tmp_path / "two.json"
    run("zoo_trees.py", "--zoo", str(tmp_path / "zoo-nano"), "--prompts", "3", "--new-tokens", "8", "--jobs", "2",
        "--roles", "hybrid", "--out", str(two))
    split = json.loads(two.read_text())["pairs"]
    assert set(split) == {"hybrid+block", "hybrid+block-markov"}
    for name in split:
        assert (split[name]["exact"], split[name]["replay"]) == (res["pairs"][name]["exact"], res["pairs"][name]["replay"])
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "zoo_trees.py"), "--zoo", str(tmp_path / "zoo-nano"),
                          "--roles", "moe", "--out", str(tmp_path / "x.json")], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "--roles 'moe': expected dense, hybrid" in bad.stderr


def test_block_sweep_trains_one_drafter_per_setting(tmp_path):
    out = tmp_path / "sweep.json"
    run("zoo_block_sweep.py", "--preset", "nano", "--layers", "1,2", "--steps", "3", "--lead", "0,1",
        "--set", "eval_prompts=3", "--out", str(out))
    res = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha"} <= set(res)
    assert [(r["lead_token"], r["layers"], r["steps"]) for r in res["runs"]] == \
        [(False, 1, 3), (False, 2, 3), (True, 1, 3), (True, 2, 3)]
    assert all(r["tau"]["humaneval"] >= 1.0 and r["tau"]["stdlib"] >= 1.0 for r in res["runs"])
    assert res["recipe"]["eval_prompts"] == 3 and all(len(r["tau_per_prompt"]["humaneval"]) == 3 for r in res["runs"])


def test_block_sweep_sweeps_a_built_sets_target_with_its_recipe(tmp_path):
    """--zoo: the drafters are trained on a built target, under the recipe its manifest records
    (with --set on top), and the build's own setting gives the build's drafter."""
    from specpilot.zoo.build import build

    m = build("nano", tmp_path / "nano", log=lambda *a: None, parallel=False)
    out = tmp_path / "sweep.json"
    run("zoo_block_sweep.py", "--zoo", str(tmp_path / "nano"), "--role", "hybrid", "--layers", "2", "--steps", "6",
        "--context-weight", "0,1", "--set", "eval_prompts=2", "--out", str(out))
    res = json.loads(out.read_text())
    assert res["recipe"] == m["recipe"] | {"eval_prompts": 2} and res["zoo"] == str(tmp_path / "nano")
    assert [r["context_weight"] for r in res["runs"]] == [0.0, 1.0]
    built = next(e["tau"] for e in m["models"] if e["name"] == "hybrid-block")
    assert res["runs"][1]["tau"] == built  # float32 on the CPU: the build's drafter, trained again
    assert res["ngram_tau"] == next(e["tau"]["ngram"] for e in m["models"] if e["name"] == "hybrid")
    # the target is the folder's, not one trained again from the recipe: other weights there, another loss
    from specpilot.engine.checkpoint import load_model, save_model
    from specpilot.engine.synthetic import randomize

    save_model(randomize(load_model(tmp_path / "nano" / "hybrid"), 99), tmp_path / "nano" / "hybrid")
    run("zoo_block_sweep.py", "--zoo", str(tmp_path / "nano"), "--role", "hybrid", "--layers", "2", "--steps", "6",
        "--set", "eval_prompts=2", "--out", str(out))
    assert json.loads(out.read_text())["target_heldout_loss"] != res["target_heldout_loss"]
    bad_set = subprocess.run([sys.executable, str(REPO / "bench" / "zoo_block_sweep.py"), "--zoo",
                              str(tmp_path / "nano"), "--set", "seq=x", "--out", str(tmp_path / "x.json")],
                             cwd=REPO, capture_output=True, text=True)
    assert bad_set.returncode == 2 and "recipe override 'seq=x': 'x' is not a int" in bad_set.stderr
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "zoo_block_sweep.py"), "--zoo", str(tmp_path),
                          "--out", str(tmp_path / "x.json")], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and f"--zoo {tmp_path}: not a built set with a dense target" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_zoo_tau_replays_every_drafter_of_a_set(tmp_path):
    out = tmp_path / "tau.json"
    run("zoo_tau.py", "--zoo", "zoo/checkpoints/micro", "--prompts", "3", "--new-tokens", "8", "--online",
        "--out", str(out))
    res = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha"} <= set(res) and res["prompts"] == {"humaneval": 3, "stdlib": 3}
    assert set(res["tau"]) == set(res["manifest_tau"])  # n-gram + every drafter, per target
    for row in (r for by_workload in res["tau"].values() for r in by_workload.values()):
        assert row["steps"] >= 3 and row["ci95"][0] <= row["tau"] <= row["ci95"][1]
        assert row["online_prompts_equal"] == 3 and row["online_tau"] == row["tau"]  # replay == online decoding


def test_zoo_tau_jobs_give_the_figures_of_one_process(tmp_path):
    outs = [tmp_path / "one.json", tmp_path / "two.json"]
    for out, jobs in zip(outs, ("1", "2")):
        run("zoo_tau.py", "--zoo", "zoo/checkpoints/micro", "--prompts", "3", "--new-tokens", "8", "--jobs", jobs,
            "--out", str(out))
    one, two = (json.loads(o.read_text())["tau"] for o in outs)
    assert one.keys() == two.keys()
    for pair in one:
        for w in one[pair]:
            assert (one[pair][w]["tau"], one[pair][w]["ci95"], one[pair][w]["steps"]) == \
                (two[pair][w]["tau"], two[pair][w]["ci95"], two[pair][w]["steps"])


def test_zoo_realism_measures_every_target_of_a_set(tmp_path):
    out = tmp_path / "realism.json"
    run("zoo_realism.py", "--zoo", "zoo/checkpoints/micro", "--baseline", "zoo/checkpoints/micro", "--prompts", "2",
        "--new-tokens", "8", "--heldout-bytes", "20000", "--out", str(out))
    res = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha"} <= set(res)
    manifest = json.loads((REPO / "zoo/checkpoints/micro/zoo.json").read_text())
    keys = {f"micro/{m['name']}" for m in manifest["models"] if m["role"] == "target"}
    assert set(res["targets"]) == set(res["baseline"]) == keys
    for row in res["targets"].values():
        assert row["prompts"] == 2 and 0 <= row["parse_rate"] <= 1 and 0 <= row["loop_rate"] <= 1
        for rate in ("parse_rate", "loop_rate"):
            lo, hi = row[f"{rate}_ci95"]
            assert 0 <= lo <= row[rate] <= hi <= 1 and hi - lo > 0.3  # 2 prompts pin little down
        assert 0 < row["heldout_bpb"] < 8 and row["heldout_nat_per_token"] > 0  # trained: below a uniform byte


def test_gdn_train_step_times_every_chunk_size(tmp_path):
    out = tmp_path / "gdn.json"
    run("gdn_train_step.py", "--device", "cpu", "--batch", "1", "--reps", "1", "--no-compile", "--chunks", "32,64",
        "--out", str(out))
    res = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha"} <= set(res)
    assert set(res["results"]) == {"chunk_32", "chunk_64"}
    for row in res["results"].values():
        assert row["rule_eager_ms"] > 0 and row["layer_eager_ms"] > 0


def test_drafter_rows_sizes_both_halves_of_every_feature_drafter(tmp_path):
    from specpilot.zoo.build import build

    zoo = tmp_path / "nano"
    build("nano", zoo, log=lambda *a: None, roles=("dense",))
    out = tmp_path / "rows.json"
    run("drafter_rows.py", "--zoo", str(zoo), "--prompts", "2", "--out", str(out))
    res = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha"} <= set(res)
    assert set(res["drafters"]) == {"dense-sequential", "dense-block", "dense-block-markov"}
    for row in res["drafters"].values():
        assert row["input_norm"] is True  # the nano recipe's
        assert row["embedding_part_rms"] > 0 and row["hidden_part_rms"] > 0
        assert abs(row["hidden_over_embedding"] - row["hidden_part_rms"] / row["embedding_part_rms"]) < 1e-9


def test_zoo_build_steps_times_the_stages_after_the_targets(tmp_path):
    out = tmp_path / "steps.json"
    run("zoo_build_steps.py", "--preset", "nano", "--role", "hybrid", "--steps", "2", "--seqs", "8", "--profile",
        "--out", str(out))
    res = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha"} <= set(res)
    stages = res["roles"]["hybrid"]
    assert set(stages) == {"decode", "sequential", "block", "block_markov"}
    assert all(row["kernels"] and "step_ms" in row and "stage_estimate_s" in row for row in stages.values())
    assert all(row["step_ms_ci95"][0] <= row["step_ms_ci95"][1] for row in stages.values())


def test_zoo_target_sweep_times_a_step_by_the_slope_of_growing_runs(tmp_path):
    out = tmp_path / "steps.json"
    run("zoo_target_sweep.py", "--preset", "nano", "--role", "dense", "--role", "hybrid", "--time-only",
        "--out", str(out))
    res = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha"} <= set(res)
    for row in res["roles"].values():
        lo, hi = row["step_ms_ci95"]
        assert row["step_ms"] > 0 and lo <= hi and row["warmup_s"] > 0
        assert row["step_tok_per_s"] == pytest.approx(res["recipe"]["target_batch"] * res["recipe"]["seq"] / row["step_ms"] * 1e3)


def test_kernel_resources_compiles_every_launched_kernel_and_an_earlier_file(tmp_path):
    from specpilot.kernels import aot, gdn_chunk

    if not aot.available():
        pytest.skip("this Triton wheel has no ptxas / cuobjdump")
    out = tmp_path / "res.json"
    run("kernel_resources.py", "--warps", "4", "--out", str(out))
    res = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha"} <= set(res)
    assert set(res["kernels"]) == set(gdn_chunk.LAUNCHED)
    for row in res["kernels"].values():
        assert set(row) == {"4_warps"} and row["4_warps"]["shared_bytes"] > 0
    # an earlier version's file by path: a kernel it lacks is a one-line error
    r = subprocess.run([sys.executable, str(REPO / "bench" / "kernel_resources.py"), "--module",
                        str(REPO / "kernels" / "gdn_chunk.py"), "--kernels", "_fwd"], cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"error: {REPO / 'kernels' / 'gdn_chunk.py'} has no kernel _fwd"]
