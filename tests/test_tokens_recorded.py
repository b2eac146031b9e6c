"""Packed sequences recorded with the dataset (NOTE [ Recorded sequences ]): ``pack
--seq-len`` and ``index --seq-len`` count each shard's sequences once, keep best_fit's
bins beside the shards and the counts in the manifest; a plan then counts from the
manifest alone, and readers take the bins from their sidecar, the same sequences as
made on the fly."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

import shardstream
from shardstream.catalog import record_sequences, verify_dataset
from shardstream.cli import main
from shardstream.dataset.sequences import sequence_counts
from shardstream.errors import FormatError, UsageError
from shardstream.manifest import MANIFEST_NAME, sequences_key
from shardstream.tokens import Packing
from tests.test_tokens_dataset import corpus  # noqa: F401  # the fixture


def rows(url, **options):
    return [
        tuple(s["input_ids"].tolist()) for s in shardstream.StreamingDataset(url, shuffle=False, **options)
    ]


def test_recorded_best_fit_counts_and_bins_give_the_sequences_made_on_the_fly(corpus, tmp_path):  # noqa: F811
    url, _ = corpus
    recorded = str(tmp_path / "recorded")
    shutil.copytree(url, recorded)
    assert main(["index", recorded, "--seq-len", "24", "--quiet"]) == 0
    manifest = shardstream.StreamingDataset(recorded).manifest
    key = sequences_key("best_fit", 24)
    assert list(manifest.sequences) == [key]
    for info in manifest.shards:
        assert pathlib.Path(recorded, ".shardstream", f"{info.path}.fit24").is_file()

    def no_sidecars(packing):
        raise AssertionError("counted from sidecars")

    assert sequence_counts(Packing(24, "best_fit"), manifest, no_sidecars).tolist() == list(
        manifest.sequences[key]
    )
    assert rows(recorded, seq_len=24, packing="best_fit") == rows(url, seq_len=24, packing="best_fit")
    assert verify_dataset(recorded).ok  # the bins are the dataset's own files
    record_sequences(recorded, 24, packing="pad")  # another packing is added beside
    again = shardstream.StreamingDataset(recorded).manifest
    assert set(again.sequences) == {key, sequences_key("pad", 24)}
    assert rows(recorded, seq_len=24, packing="pad") == rows(url, seq_len=24, packing="pad")
    assert again.shards == manifest.shards


def test_pack_records_sequences_and_a_changed_bin_sidecar_is_refused_naming_it(corpus, tmp_path):  # noqa: F811
    url, _ = corpus
    copy = str(tmp_path / "copy")
    shutil.copytree(url, copy)
    record_sequences(copy, 16)
    sidecar = pathlib.Path(copy, ".shardstream", "shard-000001.tokens.fit16")
    data = bytearray(sidecar.read_bytes())
    data[-3] ^= 0xFF
    sidecar.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"fit16"):
        list(shardstream.StreamingDataset(copy, seq_len=16, packing="best_fit", shuffle=False))


def test_sequences_are_recorded_for_token_datasets_only_and_checked_when_read(tmp_path, corpus):  # noqa: F811
    url, _ = corpus
    tar = str(tmp_path / "tar")
    with shardstream.ShardWriter(tar, samples_per_shard=4) as writer:
        writer.write({"__key__": "a", "txt": b"x"})
    with pytest.raises(UsageError, match="token dataset"):
        record_sequences(tar, 16)
    copy = tmp_path / "bad"
    shutil.copytree(url, copy)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    manifest["sequences"] = {"best_fit/16": [1, 2]}  # not one count per shard
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(shardstream.ShardstreamError, match="one count per shard"):
        _ = shardstream.StreamingDataset(str(copy)).manifest


def test_index_of_a_megatron_corpus_with_seq_len_indexes_then_records(tmp_path):
    from tests.test_tokens_foreign import megatron  # the public .bin + .idx layout

    folder = tmp_path / "mega"
    folder.mkdir()
    documents = [np.arange(n, dtype=np.uint16) + 7 for n in (5, 40, 3, 17, 29, 1, 64)]
    data, index = megatron(documents, "uint16")
    (folder / "corpus.bin").write_bytes(data)
    (folder / "corpus.idx").write_bytes(index)
    assert main(["index", str(folder), "--seq-len", "16", "--quiet"]) == 0
    dataset = shardstream.StreamingDataset(str(folder), seq_len=16, packing="best_fit", shuffle=False)
    assert dataset.manifest.sequences
    tokens = sorted(t for s in dataset for t in s["input_ids"][s["document_ids"] >= 0].tolist())
    assert tokens == sorted(np.concatenate(documents).tolist())
