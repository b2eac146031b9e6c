"""Helpers of the token tests: read a token dataset back through its manifest and
sidecars (ranged reads, the format's decoders), and a small BPE tokenizer trained here."""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardstream.formats import get_format
from shardstream.formats.tokens import doc_ends, read_tokens
from shardstream.storage import Storage

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "or",
]


def texts(count: int, seed: int = 0) -> list[str]:
    """``count`` documents of varied length (some empty), with non-ASCII text among them."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        n = int(rng.integers(0, 40))
        words = [WORDS[j] for j in rng.integers(0, len(WORDS), n)]
        if i % 7 == 3:
            words.append("naïve café — 東京")
        out.append(" ".join(words))
    return out


def train_tokenizer(path: pathlib.Path, *, vocab_size: int = 300, eos: bool = True) -> pathlib.Path:
    """A byte-level BPE ``tokenizer.json`` trained on ``texts``; ``<eos>`` id 0 and ``<bos>`` id 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<eos>", "<bos>"] if eos else ["<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(texts(500, seed=1), trainer=trainer)
    out = path / "tokenizer.json"
    tokenizer.save(str(out))
    return out


def read_documents(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> list[tuple[str, np.ndarray]]:
    """Every document of a token dataset, in shard order, each shard read by ranged reads of
    runs of documents (a few split points per shard), decoded three ways that must agree."""
    storage = Storage(url, storage_options)
    try:
        manifest = storage.read_manifest()
        fmt = get_format(manifest.format)
        out: list[tuple[str, np.ndarray]] = []
        for shard in manifest.shards:
            index = fmt.load_index(storage.read(shard.index), name=shard.path)
            n = index.num_samples
            assert n == shard.samples
            ends = doc_ends(index)
            assert shard.tokens == (int(ends[-1]) if n else 0)
            cuts = sorted({0, n, n // 3, n // 2, max(n - 1, 0)})
            for start, stop in itertools.pairwise(cuts):
                rng = index.read_range(start, stop)
                data = storage.read(shard.path, rng)
                docs = list(fmt.decode(data, rng, index, start, stop, name=shard.path))
                flat = read_tokens(data, rng, index, start, stop, name=shard.path)
                runs = fmt.decode_runs(
                    data, rng, index, np.array([start], np.int64), np.array([stop], np.int64), name=shard.path
                )
                again = runs if isinstance(runs, list) else runs.samples()
                assert [d["__key__"] for d in again] == [d["__key__"] for d in docs]
                joined = np.concatenate([d["tokens"] for d in docs]) if docs else flat[:0]
                assert np.array_equal(joined, flat)
                for a, b in zip(docs, again, strict=True):
                    assert np.array_equal(a["tokens"], b["tokens"])
                out += [(d["__key__"], d["tokens"]) for d in docs]
        return out
    finally:
        storage.close()
