"""The GPU worker's teacher-forced scorer (services/gpu_worker/scoring.py) on random engine models."""

import pytest
import torch

from specpilot.engine.checkpoint import save_model
from specpilot.engine.decode import generate
from specpilot.engine.synthetic import random_model, tiny_config
from specpilot.services.controller.forcing import token_stats
from specpilot.services.gpu_worker.scoring import load_scorer, score

PROMPT = [5, 17, 3, 88, 41, 9, 60, 2]
N = 24


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a busy machine two threads can run 50x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_config("llama", vocab=97), seed=1, dtype=torch.float64)


@pytest.mark.parametrize("family", ["llama", "hybrid"])
def test_greedy_ar_output_has_no_mismatch(family):
    m = random_model(tiny_config(family, vocab=97), seed=4, dtype=torch.float64)
    ar = generate(m, PROMPT, N, eos=set()).tokens
    assert len(ar) == N
    s = score(m, PROMPT, ar)
    assert s.argmax_token_ids == ar
    assert s.token_logprob == s.argmax_logprob
    stats = token_stats(s, ar, "r", PROMPT)
    assert not any(t.mismatch for t in stats) and all(t.margin == 0.0 for t in stats)
    assert all(lp <= 0.0 for lp in s.token_logprob)


def biased_greedy(model, prompt, n, token, bias):
    """Greedy decoding with `bias` added to one token's logit; also the unbiased log-probs seen."""
    ids, out, logps = list(prompt), [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].clone()
            logps.append(torch.log_softmax(logits, -1))
            logits[token] += bias
            nxt = int(logits.argmax())
            ids.append(nxt)
            out.append(nxt)
    return out, logps


def test_planted_logit_bias_yields_mismatches_with_the_scorers_gaps(model):
    planted, bias = 26, 1.0
    out, logps = biased_greedy(model, PROMPT, N, planted, bias)
    s = score(model, PROMPT, out)
    stats = token_stats(s, out, "r", PROMPT)
    mism = [t for t in stats if t.mismatch]
    assert 0 < len(mism) < N  # the bias flips some positions, not all
    for t, lp in zip(stats, logps):
        best = int(lp.argmax())
        assert t.argmax == best
        assert t.mismatch == (t.token != best)
        if t.mismatch:
            assert t.token == planted  # only the bias makes the output leave the argmax
            gap = float(lp[best] - lp[planted])
            assert t.margin == pytest.approx(gap, abs=1e-9)
            assert 0 < t.margin < bias  # the bias only overcomes gaps below it
        else:
            assert t.margin == 0.0
    # the scorer's own log-probs match the incremental passes
    assert s.token_logprob == pytest.approx([float(lp[t]) for lp, t in zip(logps, out)], abs=1e-9)
    assert s.argmax_logprob == pytest.approx([float(lp.max()) for lp in logps], abs=1e-9)


def test_float32_head_on_a_bfloat16_model():
    cfg = tiny_config("qwen3", vocab=97)
    m = random_model(cfg, seed=2, dtype=torch.bfloat16)
    out = generate(m, PROMPT, 8, eos=set()).tokens
    s = score(m, PROMPT, out)
    # reference: the final hidden state, FP32 head, FP32 log-softmax
    with torch.no_grad():
        ids = torch.tensor([PROMPT + out[:-1]])
        h = m(ids, feature_layers=(cfg.num_hidden_layers - 1,), logits=False).features[0, len(PROMPT) - 1:]
        logp = torch.log_softmax(torch.nn.functional.linear(m.model.norm(h).float(), m.lm_head_weight.float()), -1)
    assert s.argmax_token_ids == logp.argmax(-1).tolist()
    assert s.argmax_logprob == [float(x) for x in logp.max(-1).values]
    assert all(b >= t for b, t in zip(s.argmax_logprob, s.token_logprob))


def test_edges_and_loading(tmp_path, model):
    assert score(model, PROMPT, []).argmax_token_ids == []
    with pytest.raises(ValueError, match="prompt"):
        score(model, [], [1])
    with pytest.raises(ValueError, match="token ids"):
        score(model, PROMPT, [97])
    save_model(model, tmp_path / "t")
    scorer = load_scorer(tmp_path / "t", "cpu")
    assert scorer.dtype == torch.float32
    out = generate(model, PROMPT, 6, eos=set()).tokens
    assert score(scorer, PROMPT, out).argmax_token_ids == out  # float32 agrees on this random model


# ---- `specpilot force` (specpilot/entrypoints/force_cli.py), before it is registered in specpilot/entrypoints/cli.py -----


def force(*argv):
    import argparse

    from specpilot.entrypoints import force_cli

    parser = argparse.ArgumentParser(prog="specpilot")
    force_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["force", *argv])
    return args.func(args)


def test_force_cli_passes_stock_and_rejects_a_planted_bias(tmp_path, model, capsys):
    import json

    save_model(model, tmp_path / "target")
    prompts = {f"r{i}": PROMPT[i:] + PROMPT[:i] for i in range(3)}

    def write(name, outputs):
        (tmp_path / name).write_text("".join(json.dumps({"id": rid, "prompt_ids": prompts[rid], "tokens": toks}) + "\n"
                                             for rid, toks in outputs.items()))
        return str(tmp_path / name)

    ar = {rid: generate(model, p, 16, eos=set()).tokens for rid, p in prompts.items()}
    biased = {rid: biased_greedy(model, p, 16, 26, 1.0)[0] for rid, p in prompts.items()}
    base, common = write("stock.jsonl", ar), ["--scorer", str(tmp_path / "target")]

    assert force(*common, "--outputs", write("same.jsonl", ar), "--baseline", base, "--ar", base, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and out["delta"] == 0.125 and out["candidate"]["mismatches"] == 0
    assert {"candidate", "baseline", "delta", "passed", "reasons"} == out.keys()

    assert force(*common, "--outputs", write("biased.jsonl", biased), "--baseline", base, "--delta", "0.125") == 1
    text = capsys.readouterr().out
    assert "REJECT: mismatch rate" in text and "worst events" in text

    with pytest.raises(ValueError, match="--delta X, or --ar FILE"):
        force(*common, "--outputs", base, "--baseline", base)
    (tmp_path / "bad.jsonl").write_text('{"id": "r0", "tokens": [1]}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        force(*common, "--outputs", str(tmp_path / "bad.jsonl"), "--baseline", base, "--delta", "0.25")
