"""Byte-level BPE tokenizer trained with Hugging Face `tokenizers`.

Every byte is in the base alphabet, so any unicode text round-trips:
decode(tok, encode(tok, text)) == text. Special tokens: <|endoftext|> (id 0) and
<|pad|> (id 1). `save` writes a folder that `transformers.AutoTokenizer` can load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE tokenizer (4k-16k is the intended vocab range)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {len(alphabet) + len(SPECIAL_TOKENS)}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOS_TOKEN) == 0 and tok.token_to_id(PAD_TOKEN) == 1
    return tok


def save(tokenizer: Tokenizer, folder: str | Path) -> Path:
    """Write tokenizer.json and a minimal tokenizer_config.json into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder


def load(folder: str | Path) -> Tokenizer:
    return Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def byte_lengths(tokenizer: Tokenizer) -> list[int]:
    """UTF-8 bytes each token id stands for (byte-level BPE: one alphabet character per byte);
    special tokens count 1 (a document separator)."""
    out = [1] * tokenizer.get_vocab_size()
    special = set(SPECIAL_TOKENS)
    for token, i in tokenizer.get_vocab().items():
        if token not in special:
            out[i] = len(token)
    return out


def decode(tokenizer: Tokenizer, ids: Iterable[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)
