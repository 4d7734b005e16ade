"""W12 checkpoint folders (engine/w12io.py, `specpilot w12`): packing every shipped micro folder and
loading it back gives the bf16 tensors bit for bit, the engine decodes the same tokens from them,
and every corruption of a W12 folder — a flipped byte, a missing part, a wrong dtype or shape, an
escape index out of range, a config that does not match the files — is one CheckpointError (one
CLI line) naming the file and tensor."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specpilot.entrypoints.cli import main
from specpilot.engine.checkpoint import (
    SINGLE,
    CheckpointError,
    check_model,
    header_shapes,
    load_model,
    read_tensors,
    save_model,
    write_checkpoint,
)
from specpilot.engine.drafters import save_drafter
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config
from specpilot.engine.w12io import checkpoint_stats, pack_checkpoint, read_w12
from specpilot.kernels.w12.format import SUFFIXES, unpack
from specpilot.zoo.workloads import Request

REPO = Path(__file__).resolve().parents[2]
MICRO = REPO / "zoo" / "checkpoints" / "micro"
FOLDERS = sorted(p.name for p in MICRO.iterdir() if p.is_dir())
PROMPTS = [[5, 17, 3, 99, 42, 7, 250, 8], [1, 64, 33, 2, 11, 400, 12]]


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bits, so that NaNs and signed zeros compare too."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def identical(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                        and torch.equal(bits(a[k]), bits(b[k])) for k in a)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """Every shipped micro folder packed once (W12 folders beside each other, as in the zoo)."""
    root = tmp_path_factory.mktemp("w12")
    for name in FOLDERS:
        pack_checkpoint(MICRO / name, root / name)
    return root


def copy(packed: Path, name: str, dst: Path) -> Path:
    shutil.copytree(packed / name, dst)
    return dst


def edit_parts(folder: Path, edit) -> None:
    """Rewrite a single-file W12 folder's tensors through edit(dict)."""
    tensors = load_file(folder / SINGLE)
    edit(tensors)
    save_file(tensors, str(folder / SINGLE), metadata={"format": "pt"})


def edit_config(folder: Path, edit) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def one_error(fn, *needles) -> str:
    """fn() raises exactly one CheckpointError (no chained internal error) naming every needle."""
    with pytest.raises(CheckpointError) as ei:
        fn()
    err = ei.value
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__)
    msg = str(err)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


def cli_error(capsys, argv, *needles) -> str:
    """The CLI exits 2 with one line on stderr (one {"error"} object under --json) naming every needle."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, (out, err)
    assert main([*argv, "--json"]) == 2
    out, err = capsys.readouterr()
    msg = json.loads(out)["error"]
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


def generate_argv(target: Path) -> list[str]:
    return ["generate", "--target", str(target), "--mode", "ar", "--prompt", "def f(", "--max-new-tokens", "2"]


# ---- round trip --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FOLDERS)
def test_every_shipped_folder_loads_back_bit_for_bit(packed, name):
    src, w12 = read_tensors(MICRO / name), read_tensors(packed / name)
    assert identical(src, w12)
    assert header_shapes(packed / name) == header_shapes(MICRO / name)
    # every 2-D tensor is stored as its parts, everything else (norms, conv weights) as it was
    with safe_open(str(packed / name / SINGLE), "pt") as f:
        stored = set(f.keys())
    matrices = {k for k, v in src.items() if v.dim() == 2}
    assert matrices and stored == ({f"{k}.{s}" for k in matrices for s in SUFFIXES} | (set(src) - matrices))
    # the packed form itself (read_w12) unpacks to the same weights
    p = read_w12(packed / name)
    assert set(p) == matrices and all(torch.equal(bits(unpack(p[k])), bits(src[k])) for k in p)


def test_files_beside_the_weights_are_copied(packed):
    for name in FOLDERS:
        others = {f.name for f in (MICRO / name).iterdir()} - {"config.json", SINGLE}
        for f in others:
            assert (packed / name / f).read_bytes() == (MICRO / name / f).read_bytes()
        cfg, src_cfg = (json.loads((d / name / "config.json").read_text()) for d in (packed, MICRO))
        assert cfg.pop("quantization_config")["quant_method"] == "w12" and cfg == src_cfg


@pytest.mark.parametrize("family", ["llama", "qwen3", "sliding", "hybrid"])
def test_random_bf16_models_of_every_family_round_trip(tmp_path, family):
    for seed in range(2):
        save_model(random_model(tiny_config(family, tied=bool(seed)), seed=seed), tmp_path / f"bf16-{seed}",
                   dtype=torch.bfloat16)
        pack_checkpoint(tmp_path / f"bf16-{seed}", tmp_path / f"w12-{seed}")
        a, b = load_model(tmp_path / f"bf16-{seed}", torch.float64), load_model(tmp_path / f"w12-{seed}", torch.float64)
        assert identical(a.state_dict(), b.state_dict())


def test_sharded_source_and_output(tmp_path):
    """Parts of one weight may land in different shards; the index covers them."""
    model = random_model(tiny_config("hybrid"), seed=4)
    save_model(model, tmp_path / "src", max_shard_bytes=40_000, dtype=torch.bfloat16)
    assert (tmp_path / "src" / "model.safetensors.index.json").is_file()
    pack_checkpoint(tmp_path / "src", tmp_path / "w12", max_shard_bytes=30_000)
    wmap = json.loads((tmp_path / "w12" / "model.safetensors.index.json").read_text())["weight_map"]
    shards = {base: {wmap[f"{base}.{s}"] for s in SUFFIXES} for base in {n.rpartition(".")[0] for n in wmap}
              if f"{base}.w12_view" in wmap}
    assert any(len(files) > 1 for files in shards.values()), "no weight's parts span two shards: the case is untested"
    assert identical(read_tensors(tmp_path / "src"), read_tensors(tmp_path / "w12"))
    check_model(tmp_path / "w12")


# ---- the engine on W12 folders -----------------------------------------------------------------------

def tokens(target, drafter, mode) -> list[list[int]]:
    engine = Engine(EngineConfig(target=str(target), drafter=str(drafter) if drafter else None, mode=mode,
                                 dtype="float64", max_new_tokens=12, draft_len=5))
    out = engine.run([Request(id=f"p{i}", prompt_ids=tuple(p)) for i, p in enumerate(PROMPTS)])
    return [o["tokens"] for o in out["outputs"]]


@pytest.mark.parametrize("target,drafter", [("dense", "dense-block-markov"), ("hybrid", "hybrid-sequential"),
                                            ("hybrid", "hybrid-block"), ("dense", "dense-draft-lm")])
def test_engine_generates_the_same_tokens_from_w12_folders(packed, target, drafter):
    for mode in ("ar", "chain"):
        ref = tokens(MICRO / target, MICRO / drafter, mode)
        assert tokens(packed / target, packed / drafter, mode) == ref
        assert all(len(t) == 12 for t in ref)


def test_generate_cli_runs_on_w12_folders(packed, capsys):
    argv = ["generate", "--target", str(packed / "dense"), "--drafter", str(packed / "dense-block"), "--mode",
            "chain", "--prompt", "def add(a, b):", "--max-new-tokens", "6", "--dtype", "float64", "--json"]
    assert main(argv) == 0
    w12 = json.loads(capsys.readouterr().out)["outputs"][0]["tokens"]
    argv[2], argv[4] = str(MICRO / "dense"), str(MICRO / "dense-block")
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["outputs"][0]["tokens"] == w12


# ---- corrupt W12 folders -----------------------------------------------------------------------------

WEIGHT = "model.layers.1.mlp.up_proj.weight"


def flipped_slot(folder: Path, part: str) -> int:
    """The byte offset in model.safetensors of a byte of WEIGHT's `part` that is not an escape's slot
    (an escape's value overwrites its slot, so flipping that one would change nothing)."""
    raw = (folder / SINGLE).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    esc = set(load_file(folder / SINGLE)[f"{WEIGHT}.w12_esc_idx"].tolist())
    k = hdr[f"{WEIGHT}.w12_view"]["shape"][1]
    start = hdr[f"{WEIGHT}.{part}"]["data_offsets"][0]
    per_byte = 1 if part == "w12_view" else 2
    i = next(i for i in range(1000, 10_000) if not {i * per_byte + j for j in range(per_byte)} & esc
             and (i * per_byte) % k + per_byte <= k)
    return 8 + n + start + i


@pytest.mark.parametrize("part", ["w12_view", "w12_low"])
def test_a_flipped_byte_is_a_hash_error_naming_the_tensor(packed, tmp_path, capsys, part):
    folder = copy(packed, "dense", tmp_path / "bad")
    at = flipped_slot(folder, part)
    raw = bytearray((folder / SINGLE).read_bytes())
    raw[at] ^= 0x10
    (folder / SINGLE).write_bytes(bytes(raw))
    want = f"{folder}: tensor '{WEIGHT}' does not match its recorded hash — the W12 file is corrupt"
    assert one_error(lambda: load_model(folder), WEIGHT) == want
    check_model(folder)  # the headers are intact: only reading the weights finds it
    cli_error(capsys, generate_argv(folder), WEIGHT, "recorded hash")


def _missing(t):
    del t[f"{WEIGHT}.w12_low"]


def _dtype(t):
    t[f"{WEIGHT}.w12_lo"] = t[f"{WEIGHT}.w12_lo"].to(torch.int16)


def _shape(t):
    t[f"{WEIGHT}.w12_view"] = t[f"{WEIGHT}.w12_view"][:-1].clone()


def _escapes(t):
    t[f"{WEIGHT}.w12_esc_val"] = t[f"{WEIGHT}.w12_esc_val"][:-1].clone()


HEADER_CASES = [(_missing, [f"{WEIGHT}.w12_low", "is missing"]), (_dtype, [f"{WEIGHT}.w12_lo", "I16", "expected U8"]),
                (_shape, [f"{WEIGHT}.w12_view", "[383, 128]", "expected [384, 128]"]),
                (_escapes, [WEIGHT, "escape"])]


@pytest.mark.parametrize("edit,needles", HEADER_CASES, ids=["missing-part", "dtype", "shape", "escape-lengths"])
def test_malformed_parts_are_found_from_the_headers(packed, tmp_path, capsys, edit, needles):
    folder = copy(packed, "dense", tmp_path / "bad")
    edit_parts(folder, edit)
    for fn in (lambda: check_model(folder), lambda: load_model(folder), lambda: read_w12(folder)):
        one_error(fn, str(folder), *needles)
    cli_error(capsys, generate_argv(folder), *needles)
    cli_error(capsys, ["w12", "stats", "--checkpoint", str(folder)], *needles)


def test_an_escape_index_out_of_range_is_refused_on_reading(packed, tmp_path, capsys):
    folder = copy(packed, "dense", tmp_path / "bad")
    name = next(k for k, p in read_w12(packed / "dense").items() if p.escapes)

    def edit(t):
        idx = t[f"{name}.w12_esc_idx"]
        n, k = t[f"{name}.w12_view"].shape
        idx[-1] = n * k
    edit_parts(folder, edit)
    check_model(folder)
    needles = [str(folder / SINGLE), f"W12 tensor '{name}'", "w12_esc_idx", "ascend"]
    one_error(lambda: load_model(folder), *needles)
    cli_error(capsys, generate_argv(folder), *needles)


def test_the_config_and_the_files_must_agree(packed, tmp_path):
    # a packed weight the config lists but the files lack
    a = copy(packed, "dense", tmp_path / "a")
    edit_parts(a, lambda t: [t.pop(f"{WEIGHT}.{s}") for s in SUFFIXES])
    for fn in (lambda: check_model(a), lambda: load_model(a)):
        one_error(fn, WEIGHT, "none of its parts")
    # parts the config does not list
    b = copy(packed, "dense", tmp_path / "b")
    edit_config(b, lambda c: c["quantization_config"]["packed"].pop(WEIGHT))
    for fn in (lambda: check_model(b), lambda: load_model(b)):
        one_error(fn, f"{WEIGHT}.w12_", "does not list")
    # a weight listed as packed but stored as it was
    c = copy(packed, "dense", tmp_path / "c")
    edit_parts(c, lambda t: t.__setitem__("model.norm.weight.w12_view", t.pop(f"{WEIGHT}.w12_view")))
    one_error(lambda: check_model(c), "model.norm.weight.w12_view", "does not list")
    # an integer tensor that is no W12 part
    h = copy(packed, "dense", tmp_path / "h")
    edit_parts(h, lambda t: t.__setitem__("model.norm.weight", torch.zeros(128, dtype=torch.int32)))
    one_error(lambda: check_model(h), "model.norm.weight", "I32", "floating-point")
    d = copy(packed, "dense", tmp_path / "d")
    edit_config(d, lambda c: c["quantization_config"]["packed"].__setitem__(
        "model.norm.weight", {"shape": [128, 1], "sha256": "0" * 64}))
    for fn in (lambda: check_model(d), lambda: load_model(d)):
        one_error(fn, "model.norm.weight", "stored as it was")
    # a shape in the config that is not the model's
    e = copy(packed, "dense", tmp_path / "e")
    edit_config(e, lambda c: c["quantization_config"]["packed"][WEIGHT].__setitem__("shape", [384, 64]))
    one_error(lambda: check_model(e), f"{WEIGHT}.w12_view", "[384, 128]", "expected [384, 64]")
    # malformed quantization_config fields
    for field, value, needle in (("quant_method", "gptq", "'gptq'"), ("format_version", 2, "format_version 2"),
                                 ("packed", [], "field 'packed'")):
        f = copy(packed, "dense", tmp_path / f"f-{field}")
        edit_config(f, lambda c: c["quantization_config"].__setitem__(field, value))
        one_error(lambda: load_model(f), "quantization_config", needle)
    g = copy(packed, "dense", tmp_path / "g")
    edit_config(g, lambda c: c["quantization_config"]["packed"][WEIGHT].__setitem__("sha256", "xyz"))
    one_error(lambda: check_model(g), WEIGHT, "sha256 'xyz'")


def test_a_wrong_recorded_hash_is_a_hash_error(packed, tmp_path):
    folder = copy(packed, "hybrid-block", tmp_path / "bad")
    name = "fc_in.weight"
    edit_config(folder, lambda c: c["quantization_config"]["packed"][name].__setitem__("sha256", "ab" * 32))
    one_error(lambda: read_tensors(folder), f"tensor '{name}' does not match its recorded hash")


# ---- packing: inputs it refuses ----------------------------------------------------------------------

def float32_folder(folder: Path, exact: bool) -> dict:
    model = random_model(tiny_config("llama"), seed=5)
    sd = {k: (v.to(torch.bfloat16).float() if exact else v) for k, v in model.state_dict().items()}
    write_checkpoint(folder, model.cfg.to_hf(), sd)
    return sd


def test_float32_tensors_must_hold_bf16_values(tmp_path, capsys):
    sd = float32_folder(tmp_path / "f32", exact=False)
    out = tmp_path / "out"
    msg = one_error(lambda: pack_checkpoint(tmp_path / "f32", out), "float32", "not bfloat16 values", "--round-bf16")
    named = re.search(r"tensor '([^']+)'", msg).group(1)
    assert sd[named].dim() == 2
    assert not out.exists()  # nothing written
    cli_error(capsys, ["w12", "pack", "--checkpoint", str(tmp_path / "f32"), "--out", str(out)],
              "not bfloat16 values")
    assert main(["w12", "pack", "--checkpoint", str(tmp_path / "f32"), "--out", str(out), "--round-bf16",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["note"] and "rounding" in report["note"]
    assert "model.embed_tokens.weight" in report["rounded"]
    src = read_tensors(tmp_path / "f32")
    got = read_tensors(out)
    for k, v in src.items():
        want = v.to(torch.bfloat16) if v.dim() == 2 else v
        assert torch.equal(bits(got[k]), bits(want)), k


def test_float32_tensors_of_bf16_values_pack_exactly(tmp_path):
    sd = float32_folder(tmp_path / "f32", exact=True)
    report = pack_checkpoint(tmp_path / "f32", tmp_path / "out")
    assert report["rounded"] == [] and report["note"] is None
    got = read_tensors(tmp_path / "out")
    assert all(torch.equal(got[k].to(v.dtype), v) for k, v in sd.items())


def test_bad_pack_inputs_are_one_line(packed, tmp_path, capsys):
    cli_error(capsys, ["w12", "pack", "--checkpoint", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")],
              "nowhere", "no such directory")
    cli_error(capsys, ["w12", "pack", "--checkpoint", str(packed / "dense"), "--out", str(tmp_path / "o")],
              "already a W12 checkpoint")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    cli_error(capsys, ["w12", "pack", "--checkpoint", str(MICRO / "dense-block"), "--out", str(full)],
              str(full), "not an empty folder")
    cli_error(capsys, ["w12", "pack", "--checkpoint", str(MICRO / "dense-block"), "--out", str(MICRO / "dense-block")],
              "source checkpoint folder itself")
    cli_error(capsys, ["w12", "pack", "--checkpoint", str(MICRO / "dense-block"), "--out", str(tmp_path / "o"),
                       "--device", "tpu"], "--device 'tpu'")
    cli_error(capsys, ["w12", "stats", "--checkpoint", str(packed / "dense"), "--round-bf16"], "W12 checkpoint")
    assert not (tmp_path / "o").exists()


# ---- the report -------------------------------------------------------------------------------------

def part_bytes(folder: Path) -> dict[str, int]:
    """Bytes of each packed weight's parts, read from the safetensors header here."""
    raw = (folder / SINGLE).read_bytes()
    hdr = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    out: dict[str, int] = {}
    for name, info in hdr.items():
        if name != "__metadata__" and name.rpartition(".")[2] in SUFFIXES:
            base = name.rpartition(".")[0]
            out[base] = out.get(base, 0) + info["data_offsets"][1] - info["data_offsets"][0]
    return out


KEYS = {"checkpoint", "format", "out", "device", "packed_tensors", "kept_tensors", "weights", "escapes",
        "bits_per_weight", "escape_rate", "bytes_before", "bytes_after", "roundtrip_bit_exact", "rounded", "note",
        "seconds", "tensors"}


@pytest.mark.parametrize("name", ["hybrid", "dense-block-markov"])
def test_stats_json_schema_and_figures(packed, capsys, name):
    assert main(["w12", "stats", "--checkpoint", str(MICRO / name), "--json"]) == 0
    bf16 = json.loads(capsys.readouterr().out)
    assert main(["w12", "stats", "--checkpoint", str(packed / name), "--json"]) == 0
    w12 = json.loads(capsys.readouterr().out)
    assert set(bf16) == set(w12) == KEYS
    assert (bf16["format"], w12["format"], bf16["out"], bf16["roundtrip_bit_exact"]) == ("bf16", "w12", None, True)
    sizes, src = part_bytes(packed / name), read_tensors(MICRO / name)
    assert set(bf16["tensors"]) == set(w12["tensors"]) == set(sizes) == {k for k, v in src.items() if v.dim() == 2}
    for k, row in bf16["tensors"].items():
        assert set(row) == {"shape", "weights", "bits_per_weight", "escapes", "escape_rate"}
        assert row["weights"] == src[k].numel() and row["bits_per_weight"] == 8 * sizes[k] / row["weights"]
        assert row == w12["tensors"][k]  # packed in memory and read from the files: the same figures
        assert row["escapes"] == read_w12(packed / name)[k].escapes
    total = sum(sizes.values())
    assert bf16["bits_per_weight"] == pytest.approx(8 * total / bf16["weights"])
    assert 12 < bf16["bits_per_weight"] < 12.2
    file_tensor_bytes = sum(v.numel() * v.element_size() for v in load_file(packed / name / SINGLE).values())
    assert bf16["bytes_after"] == w12["bytes_after"] == file_tensor_bytes
    assert bf16["bytes_before"] == w12["bytes_before"] == sum(v.numel() * v.element_size() for v in src.values())
    assert bf16["packed_tensors"] + bf16["kept_tensors"] == len(src)


def test_pack_cli_prints_the_headline(tmp_path, capsys):
    assert main(["w12", "pack", "--checkpoint", str(MICRO / "hybrid"), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "bits per weight" in out and "escape rate" in out and f"wrote {tmp_path / 'o'}" in out


def test_a_w12_feature_drafter_needs_its_parts_too(packed, tmp_path, capsys):
    """check_system reads a feature drafter's shapes through header_shapes as well."""
    folder = copy(packed, "dense-block", tmp_path / "bad")
    edit_parts(folder, lambda t: t.pop("fc_in.weight.w12_view"))
    cli_error(capsys, ["generate", "--target", str(packed / "dense"), "--drafter", str(folder), "--prompt", "x",
                       "--max-new-tokens", "2"], "fc_in.weight.w12_view")


def test_drafter_save_and_w12_load_agree(tmp_path):
    cfg = tiny_config("qwen3")
    save_drafter(random_drafter_net("block_markov", cfg, seed=1), tmp_path / "d", dtype=torch.bfloat16)
    pack_checkpoint(tmp_path / "d", tmp_path / "w")
    assert identical(read_tensors(tmp_path / "d"), read_tensors(tmp_path / "w"))


# ---- the bench script's logic at a tiny size ----------------------------------------------------------

def test_bench_script_at_a_tiny_size(tmp_path):
    out = tmp_path / "w12.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "w12_format.py"), "--micro", str(MICRO / "dense-block"),
                        "--dims", "64,3,4,2,16,96,500", "--samples", "2", "--block-rows", "128", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha", "checkpoints", "synthetic"} <= set(res)
    assert res["checkpoints"]["dense-block"]["roundtrip_bit_exact"] is True
    syn = res["synthetic"]
    want = 3 * (64 * 64 * 2 + 32 * 64 * 2 + 96 * 64 * 3) + 2 * 500 * 64
    assert syn["weights"] == want and syn["roundtrip_bit_exact"] is True
    groups = syn["groups"]
    assert sum(g["count"] * g["weights"] for g in groups.values()) == want
    assert syn["bits_per_weight"] == pytest.approx(
        sum(g["count"] * g["weights"] * g["bits_per_weight"] for g in groups.values()) / want)
    assert all(g["measured"] >= min(2, g["count"]) for g in groups.values())
