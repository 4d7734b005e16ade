"""specpilot.zoo.tokenizer: byte-level BPE training, round trip, save/load, transformers loading."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.zoo import corpus
from specpilot.zoo import tokenizer as T

VOCAB = 4096


@pytest.fixture(scope="module")
def small_corpus():
    return corpus.load_corpus(max_bytes=300_000)


@pytest.fixture(scope="module")
def texts(small_corpus):
    return [d.text for d in small_corpus.train]


@pytest.fixture(scope="module")
def tok(texts):
    return T.train_tokenizer(texts, vocab_size=VOCAB)


def test_vocab_and_special_tokens(tok):
    assert tok.get_vocab_size() == VOCAB
    assert tok.token_to_id(T.EOS_TOKEN) == 0
    assert tok.token_to_id(T.PAD_TOKEN) == 1


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_round_trip_any_text(tok, text):
    assert T.decode(tok, T.encode(tok, text)) == text


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=20), st.sampled_from(T.SPECIAL_TOKENS))).map("".join))
def test_round_trip_with_special_tokens(tok, text):
    assert T.decode(tok, T.encode(tok, text)) == text


def test_special_token_in_text_is_one_id(tok):
    assert T.encode(tok, "a<|endoftext|>b").count(0) == 1
    assert T.decode(tok, [0, 1]) == "<|endoftext|><|pad|>"


def test_round_trip_and_compression_on_real_stdlib_files(tok, small_corpus):
    n_ids = n_bytes = 0
    for doc in small_corpus.heldout + small_corpus.train[:3]:
        ids = T.encode(tok, doc.text)
        assert T.decode(tok, ids) == doc.text, doc.relpath
        assert all(0 <= i < VOCAB for i in ids)
        if doc in small_corpus.heldout:
            n_ids, n_bytes = n_ids + len(ids), n_bytes + len(doc.text.encode("utf-8"))
    assert n_bytes > 100_000
    assert n_ids < n_bytes / 3  # BPE learned code that generalises to held-out modules


def test_training_is_deterministic(tok, texts):
    again = T.train_tokenizer(texts, vocab_size=VOCAB)
    assert again.get_vocab() == tok.get_vocab()
    assert again.to_str() == tok.to_str()


def test_bad_vocab_size(texts):
    with pytest.raises(ValueError, match="vocab_size"):
        T.train_tokenizer(texts[:1], vocab_size=100)


def test_save_and_load(tok, tmp_path, small_corpus):
    folder = T.save(tok, tmp_path / "tok")
    assert (folder / "tokenizer.json").is_file()
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (config["eos_token"], config["pad_token"]) == (T.EOS_TOKEN, T.PAD_TOKEN)
    loaded = T.load(folder)
    text = small_corpus.heldout[0].text
    assert T.encode(loaded, text) == T.encode(tok, text)


def test_transformers_auto_tokenizer_loads_the_folder(tok, tmp_path, small_corpus):
    transformers = pytest.importorskip("transformers")
    folder = T.save(tok, tmp_path / "tok")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert hf.eos_token == T.EOS_TOKEN and hf.eos_token_id == 0
    assert hf.pad_token == T.PAD_TOKEN and hf.pad_token_id == 1
    for text in [small_corpus.heldout[0].text[:5000], "héllo  wörld\n\t🎉 <|endoftext|>"]:
        ids = hf.encode(text, add_special_tokens=False)
        assert ids == T.encode(tok, text)
        assert hf.decode(ids) == text
