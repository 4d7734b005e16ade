"""Drafters load from their own checkpoint folders and produce well-formed lattices."""

import json

import pytest
import torch

from specpilot.engine.checkpoint import CheckpointError, save_model, write_checkpoint
from specpilot.engine.decode import generate
from specpilot.engine.drafters import (TOP_K, DraftLM, FeatureDrafter, Lattice, NgramDrafter, load_drafter,
                                       save_drafter)
from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config


@pytest.fixture(scope="module")
def target():
    return random_model(tiny_config("qwen3", vocab=97), seed=11)


def primed(drafter, target, prompt):
    """Run the target over a prompt and feed the drafter as decoding would."""
    out = target(torch.tensor([prompt]), feature_layers=drafter.target_layers)
    newest = int(out.logits[0, -1].argmax())
    drafter.reset(64)
    drafter.observe(prompt, prompt[1:] + [newest], out.features[0] if out.features is not None else None)
    return drafter


@pytest.mark.parametrize("kind,lead,norm,copy", [("sequential", False, False, False), ("block", False, False, False),
                                                 ("block_markov", False, False, False), ("block", True, False, False),
                                                 ("block_markov", True, False, False), ("sequential", False, True, False),
                                                 ("block_markov", True, True, False), ("block", True, True, True),
                                                 ("block_markov", True, True, True)])
def test_feature_drafter_round_trip_and_lattice(kind, lead, norm, copy, target, tmp_path):
    net = random_drafter_net(kind, target.cfg, seed=3, block=8, lead_token=lead, input_norm=norm, copy_head=copy)
    save_drafter(net, tmp_path / kind)
    cfg = json.loads((tmp_path / kind / "config.json").read_text())
    assert cfg["drafter_kind"] == kind and cfg["architectures"] == ["SpecPilotDrafter"]
    assert cfg["lead_token"] is lead and cfg["input_norm"] is norm and cfg["copy_head"] is copy
    assert ("emb_norm.weight" in net.state_dict()) is norm and ("copy_gate.bias" in net.state_dict()) is copy
    loaded = load_drafter(str(tmp_path / kind), target=target)
    assert loaded.net.cfg.lead_token is lead and loaded.net.cfg.input_norm is norm and loaded.net.cfg.copy_head is copy
    for a, b in zip(net.state_dict().values(), loaded.net.state_dict().values()):
        assert torch.equal(a, b)
    d = primed(loaded, target, [5, 9, 2, 7, 1])
    base = [d.last_logits.clone()]  # position 1's logits; the mask rows' come from the net's pass
    hook = loaded.net.register_forward_hook(lambda mod, args, out: base.append(out[1][0]))
    lat = d.propose(8)
    hook.remove()
    assert lat.tokens.shape == lat.logp.shape == (8, TOP_K)
    assert torch.all(lat.logp[:, :-1] >= lat.logp[:, 1:])  # sorted, best first
    assert torch.all(lat.logp.exp().sum(-1) <= 1 + 1e-9)  # log-probabilities of distinct tokens
    assert len(lat.chain()) == 8
    if copy:  # transitions of copies given each parent: tests/unit/test_zoo_train.py
        assert lat.trans.shape == (7, TOP_K, TOP_K) and torch.all(lat.trans.exp().sum(-1) <= 1 + 1e-6)
    elif kind == "block_markov":
        assert lat.trans.shape == (7, TOP_K, TOP_K)
        # = log p(child | parent) of the full conditional, up to a constant per parent (trees
        # normalize over the candidates of a parent)
        logits = torch.cat((base[0][None], base[1]))
        full = torch.stack([torch.log_softmax(loaded.net.markov_logits(logits[i + 1], lat.tokens[i], loaded.emb)
                                              .double(), -1).gather(1, lat.tokens[i + 1][None].expand(TOP_K, -1))
                            for i in range(7)])
        shift = lat.trans - full
        assert torch.allclose(shift, shift[..., :1].expand_as(shift), atol=1e-4)
        # the score of a child depends on its parent: rows differ
        assert not torch.allclose(lat.trans[:, 0], lat.trans[:, 1])
    else:
        assert lat.trans is None


def test_block_drafter_with_one_shared_mask_embedding_still_loads(target, tmp_path):
    """Checkpoints written before mask embeddings were per position hold one [H] vector: it is
    used for every mask row, so those drafters draft exactly as they did."""
    net = random_drafter_net("block", target.cfg, seed=4, block=8)
    with torch.no_grad():
        net.mask_embedding.copy_(net.mask_embedding[0].clone())  # every row the same vector
    sd = dict(net.state_dict(), mask_embedding=net.mask_embedding[0].clone())
    write_checkpoint(tmp_path / "old", net.cfg.to_hf(), sd)
    old = load_drafter(str(tmp_path / "old"), target=target)
    assert torch.equal(old.net.mask_embedding, net.mask_embedding)
    a = primed(FeatureDrafter(net, target), target, [5, 9, 2, 7]).propose(8)
    b = primed(old, target, [5, 9, 2, 7]).propose(8)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logp, b.logp)


def test_sequential_drafter_conditions_on_its_own_tokens(target):
    """Step i+1 of a sequential drafter depends on the token drafted at step i."""
    d = primed(FeatureDrafter(random_drafter_net("sequential", target.cfg, seed=4), target), target, [3, 4, 5])
    lat = d.propose(4)
    # re-running gives the same lattice: drafting rolled the drafter's cache back
    assert torch.equal(lat.tokens, d.propose(4).tokens)
    assert d.cache.length == 3


@pytest.mark.parametrize("kind", ["sequential", "draft_lm"])
def test_a_known_continuation_stops_drafting_after_the_first_miss(kind, target):
    """Drafters that draft position by position stop after the first position whose top-1 token is
    not the known one (a chain accepts nothing past it); the positions they did draft are the
    full proposal's, and the cache is rolled back either way."""
    d = primed(FeatureDrafter(random_drafter_net("sequential", target.cfg, seed=4), target) if kind == "sequential"
               else DraftLM(random_model(tiny_config("llama", vocab=97), seed=5)), target, [3, 4, 5])
    full = d.propose(6)
    own = full.tokens[:, 0].tolist()
    for miss in range(6):  # the known tokens agree with the drafter's up to position `miss`
        known = own[:miss] + [(own[miss] + 1) % 97] + own[miss + 1:]
        lat = d.propose(6, known)
        assert lat.positions == miss + 1
        assert torch.equal(lat.tokens, full.tokens[: miss + 1])
    assert d.propose(6, own).positions == 6 and d.propose(6, own[:2]).positions == 3
    assert torch.equal(d.propose(6).tokens, full.tokens)  # the cache was rolled back


def test_block_drafts_at_most_its_block(target):
    d = primed(FeatureDrafter(random_drafter_net("block", target.cfg, seed=4, block=5), target), target, [3, 4, 5])
    assert d.propose(16).positions == 5


def test_ngram_finds_the_latest_longest_match():
    d = NgramDrafter(max_n=3)
    d.reset(32)
    d.observe([1, 2, 3, 9, 1, 2, 3, 8, 4, 1, 2], [0], None)  # history, then newest = 3 → suffix 1 2 3
    d.newest = 3
    assert d.propose(3).chain() == [8, 4, 1]
    d.newest = 77  # nothing matches
    assert d.propose(3).positions == 0


def test_draft_lm_from_folder(target, tmp_path):
    save_model(target, tmp_path / "lm")
    d = load_drafter(str(tmp_path / "lm"))
    assert isinstance(d, DraftLM)
    # the target drafting for itself: every drafted token is accepted
    res = generate(target, [1, 2, 3], 16, d, draft_len=4, eos=set())
    assert [s.tau for s in res.steps] == [5, 5, 5]  # 1 token from prefill + 3 × 5


def test_draft_lm_must_be_attention_only(tmp_path):
    save_model(random_model(tiny_config("hybrid", vocab=97), seed=1), tmp_path / "h")
    with pytest.raises(CheckpointError, match="attention-only"):
        load_drafter(str(tmp_path / "h"))


def test_bad_drafter_kind_is_named(target, tmp_path):
    save_drafter(random_drafter_net("block", target.cfg, seed=1), tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    cfg["drafter_kind"] = "medusa"
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="drafter_kind"):
        load_drafter(str(tmp_path / "d"), target=target)


def test_lattice_chain_stops_at_missing_candidates():
    lat = Lattice(torch.tensor([[4, 1], [-1, -1], [6, 2]]), torch.zeros(3, 2))
    assert lat.chain() == [4]


def test_feature_drafter_needs_its_target(target, tmp_path):
    save_drafter(random_drafter_net("block", target.cfg, seed=1), tmp_path / "d")
    with pytest.raises(CheckpointError, match="together with the target"):
        load_drafter(str(tmp_path / "d"))
    other = random_model(tiny_config("qwen3", vocab=97, hidden=32), seed=1)
    with pytest.raises(CheckpointError, match="does not fit this target"):
        load_drafter(str(tmp_path / "d"), target=other)


def test_lead_token_row_reads_the_drafted_position_1_token(target):
    """With the row, position 2 depends on which token position 1 drafted; without it, it cannot."""
    for lead in (False, True):
        net = random_drafter_net("block", target.cfg, seed=5, block=6, lead_token=lead)
        d = primed(FeatureDrafter(net, target), target, [4, 8, 15, 16])
        rows = [net.block_rows(torch.tensor([t]), 5, target.model.embed_tokens.weight) for t in (3, 11)]
        assert torch.equal(rows[0][:, 1:], rows[1][:, 1:])  # later mask rows never read it
        assert torch.equal(rows[0][:, 0], rows[1][:, 0]) == (not lead)
        lat = d.propose(6)
        base = d.cache.length
        ref = net(net.block_rows(d.last_logits.argmax().view(1), 5, target.model.embed_tokens.weight), d.head,
                  d.cache, tree_mask=torch.ones(5, 5, dtype=torch.bool))[1][0]
        d.cache.truncate(base)
        assert torch.equal(lat.tokens[1:], torch.log_softmax(ref.double(), -1).topk(TOP_K, dim=-1).indices)



def test_input_norms_balance_the_two_halves_of_a_row(target):
    """With input norms a row does not change when the hidden half is scaled (a trained target's
    features are many times the embedding's size); without them the scaled half takes over."""
    tok, hidden = torch.tensor([[3, 8]]), torch.randn(1, 2, target.cfg.hidden_size)
    emb = target.model.embed_tokens.weight
    for norm in (False, True):
        net = random_drafter_net("sequential", target.cfg, seed=2, input_norm=norm)
        a, b = net.rows(tok, hidden, emb), net.rows(tok, 100 * hidden, emb)
        assert torch.allclose(a, b, atol=1e-4) is norm


def test_a_mistyped_input_norm_is_named(target, tmp_path):
    save_drafter(random_drafter_net("block", target.cfg, seed=1, input_norm=True), tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    cfg["input_norm"] = "yes"
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'input_norm' = 'yes': expected true or false"):
        load_drafter(str(tmp_path / "d"), target=target)


def test_a_pointer_head_on_a_sequential_drafter_is_named(target, tmp_path):
    save_drafter(random_drafter_net("sequential", target.cfg, seed=1), tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    cfg["copy_head"] = True
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'copy_head' = true is for the block kinds, not a sequential drafter"):
        load_drafter(str(tmp_path / "d"), target=target)
